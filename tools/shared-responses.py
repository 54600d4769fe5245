#!/usr/bin/env python3
"""Stored responses behind a load balancer (standard library only): agent conversations
over the Responses API with `previous_response_id`, each turn sent to the next of two
replicas in turn (round robin), on a pair that shares its responses (`--replicate`, a
real nats-server on loopback) and on a pair that does not.

    tools/shared-responses.py [--binary target/release/suffixd] [--conversations 4]
                              [--turns 8] [--rounds 20]
                              [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]

Reported:
1. Turns whose previous response was found, on each pair. A turn that is refused
   (`previous_response_not_found`) is sent again with the whole conversation as `input`,
   the client's fallback, so that the conversation goes on either way.
2. What sharing costs: the median seconds of a one-token turn on a sharing replica and on
   one that does not (the response is published and acknowledged before it returns),
   --rounds each, alternated; and of `GET /v1/responses/{id}` on the replica that made
   the response and, for the first time, on the other (fetched from NATS).
Exits non-zero when a request fails or the sharing pair refuses a turn.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--binary", default="target/release/suffixd")
ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--conversations", type=int, default=4)
ap.add_argument("--turns", type=int, default=8)
ap.add_argument("--rounds", type=int, default=20)
args = ap.parse_args()

work = tempfile.mkdtemp(prefix="suffixd-shared-responses-")
procs = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail(why):
    print(f"FAILED: {why} (logs in {work})", file=sys.stderr)
    for p in procs:
        p.kill()
    sys.exit(1)


nats_port = free_port()
procs.append(subprocess.Popen(
    ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(nats_port), "-sd", f"{work}/nats"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


class Server:
    def __init__(self, name, share):
        self.port = free_port()
        flags = ["--replicate", f"nats://127.0.0.1:{nats_port}", "--cluster", "bench"] if share else []
        procs.append(subprocess.Popen(
            [args.binary, "serve", "--model", args.model, "--snapshot-dir", f"{work}/{name}",
             "--addr", f"127.0.0.1:{self.port}", *flags],
            stdout=subprocess.DEVNULL, stderr=open(f"{work}/{name}.log", "w")))
        self.name = name

    def call(self, method, path, body=None):
        """(status, JSON body, seconds)."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"content-type": "application/json"})
        t = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read()), time.perf_counter() - t
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), time.perf_counter() - t

    def wait_ready(self):
        for _ in range(1200):
            try:
                if self.call("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        fail(f"{self.name} did not start")


def items_of(response):
    return [{k: v for k, v in item.items() if k not in ("id", "status")}
            for item in response["output"]]


def conversation(pair, c):
    """One conversation of --turns turns over `pair`, round robin; turns refused."""
    previous, history, refused = None, [], 0
    for turn in range(args.turns):
        message = {"role": "user", "content": f"Step {turn + 1} of task {c}: name one more city."}
        body = {"input": [message], "max_output_tokens": 8, "temperature": 0,
                "previous_response_id": previous}
        server = pair[turn % 2]
        status, r, _ = server.call("POST", "/v1/responses", body)
        if status == 400 and r["error"].get("code") == "previous_response_not_found":
            refused += 1
            body = {"input": history + [message], "max_output_tokens": 8, "temperature": 0}
            status, r, _ = server.call("POST", "/v1/responses", body)
        if status != 200:
            fail(f"{server.name}: {status} {r}")
        history += [message] + items_of(r)
        previous = r["id"]
    return refused


def median_ms(xs):
    return statistics.median(xs) * 1000


shared = [Server("a", True), Server("b", True)]
alone = [Server("c", False), Server("d", False)]
for s in shared + alone:
    s.wait_ready()

turns = args.conversations * args.turns
found = {}
for label, pair in (("sharing", shared), ("not sharing", alone)):
    refused = sum(conversation(pair, c) for c in range(args.conversations))
    found[label] = turns - args.conversations - refused
    print(f"{label}: {found[label]} of {turns - args.conversations} continued turns found their "
          f"previous response ({refused} refused, resent whole)")
if found["sharing"] != turns - args.conversations:
    fail("the sharing pair refused a turn")

post = {"sharing": [], "not sharing": []}
get_local, get_fetched = [], []
one_token = {"input": "Say yes.", "max_output_tokens": 1, "temperature": 0}
for i in range(args.rounds):
    order = [("sharing", shared[0]), ("not sharing", alone[0])]
    for label, server in order if i % 2 == 0 else order[::-1]:
        status, r, seconds = server.call("POST", "/v1/responses", one_token)
        if status != 200:
            fail(f"{server.name}: {status} {r}")
        post[label].append(seconds)
        if label == "sharing":
            made = r["id"]
    for server, into in ((shared[0], get_local), (shared[1], get_fetched)):
        status, r, seconds = server.call("GET", f"/v1/responses/{made}")
        if status != 200:
            fail(f"{server.name}: GET {made}: {status} {r}")
        into.append(seconds)

print(f"one-token turn, median of {args.rounds}: sharing {median_ms(post['sharing']):.1f} ms, "
      f"not sharing {median_ms(post['not sharing']):.1f} ms "
      f"(+{median_ms(post['sharing']) - median_ms(post['not sharing']):.1f} ms)")
print(f"GET /v1/responses/{{id}}, median of {args.rounds}: on its replica "
      f"{median_ms(get_local):.2f} ms, first time on the other (fetched) {median_ms(get_fetched):.2f} ms")
for p in procs:
    p.terminate()
for p in procs:
    p.wait()
subprocess.run(["rm", "-rf", work])
