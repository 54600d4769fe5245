#!/usr/bin/env python3
"""A busy tenant's burst beside a quiet tenant's requests, against `suffixd serve`
binaries started here on loopback, alternated (standard library only).

    tools/tenant-burst.py --bin target/release/suffixd [--bin OTHER] [--rounds 3]
        [--burst 48] [--max-tokens 48] [--quiet 4] [--max-batch 4] [--max-queued N]

Each round, for each binary: start `serve` (fresh store, `--max-batch`), send the busy
namespace's `--burst` completions at once, and 0.5 s later the quiet namespace's
`--quiet` requests at once; report the quiet requests' median latency and the burst's
total time. With first-come-first-served admission the quiet requests wait
behind the burst; with turns by namespace they take the next free slot. With
`--max-queued` below the burst, requests refused with 429 are counted per namespace (a
bound shared by all namespaces refuses the quiet tenant too). Medians over the rounds
(latency over the requests served); ratios of the second binary's figures over the
first's.
"""
import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--bin", action="append", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--burst", type=int, default=48)
ap.add_argument("--quiet", type=int, default=4)
ap.add_argument("--max-tokens", type=int, default=48)
ap.add_argument("--max-batch", type=int, default=4)
ap.add_argument("--max-queued", type=int)
args = ap.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(base, namespace, prompt, max_tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(
        base + "/v1/completions",
        data=body,
        headers={"content-type": "application/json", "x-suffixd-namespace": namespace},
    )
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=600) as r:
            json.load(r)
    except urllib.error.HTTPError as e:
        if e.code != 429:
            raise
        return None
    return time.monotonic() - start


def one_round(binary):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as store:
        server = subprocess.Popen(
            [binary, "serve", "--addr", f"127.0.0.1:{port}", "--snapshot-dir", store,
             "--max-batch", str(args.max_batch), "--cost", "flat"]
            + (["--max-queued", str(args.max_queued)] if args.max_queued else []),
            stderr=subprocess.DEVNULL,
            env={**os.environ, "SUFFIXD_ADMIN_TOKEN": ""},
        )
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(base + "/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            start = time.monotonic()
            busy_refused = []
            busy = [
                threading.Thread(
                    target=lambda i=i: busy_refused.append(
                        complete(base, "busy", f"Ticket {i}: the printer on floor {i} jams when",
                                 args.max_tokens) is None
                    )
                )
                for i in range(args.burst)
            ]
            for t in busy:
                t.start()
            time.sleep(0.5)
            quiet = []
            asks = [
                threading.Thread(
                    target=lambda i=i: quiet.append(
                        complete(base, "quiet", f"Question {i}: the capital of France is", args.max_tokens)
                    )
                )
                for i in range(args.quiet)
            ]
            for t in asks:
                t.start()
            for t in asks + busy:
                t.join()
            assert len(quiet) == args.quiet, "a quiet request failed"
            served = [q for q in quiet if q is not None]
            latency = statistics.median(served) if served else float("nan")
            refused = (args.quiet - len(served), sum(busy_refused))
            return latency, time.monotonic() - start, refused
        finally:
            server.terminate()
            server.wait()


results = {b: [] for b in args.bin}
for r in range(args.rounds):
    for b in args.bin:
        quiet, burst, (quiet_refused, busy_refused) = one_round(b)
        results[b].append((quiet, burst, quiet_refused, busy_refused))
        print(f"round {r + 1} {b}: quiet median {quiet:.2f} s, burst {burst:.2f} s, "
              f"refused: quiet {quiet_refused} of {args.quiet}, busy {busy_refused} of {args.burst}",
              flush=True)
first = None
for b in args.bin:
    # Rounds whose quiet requests were all refused have no latency (NaN).
    served_rounds = [q for q, *_ in results[b] if not math.isnan(q)]
    quiet = statistics.median(served_rounds) if served_rounds else float("nan")
    burst = statistics.median(t for _, t, *_ in results[b])
    refused = [sum(r[i] for r in results[b]) for i in (2, 3)]
    line = (f"{b}: quiet request median {quiet:.2f} s, burst {burst:.2f} s; refused in all "
            f"rounds: quiet {refused[0]} of {args.quiet * args.rounds}, busy {refused[1]} of "
            f"{args.burst * args.rounds}")
    if first is None:
        first = (quiet, burst)
    else:
        line += f" ({quiet / first[0]:.2f}× and {burst / first[1]:.2f}× the first's)"
    print(line)
