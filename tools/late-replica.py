#!/usr/bin/env python3
"""A late replica at scale (issue 66, item 8; standard library only): how long a replica
that joins a cluster whose stream holds N sequences (default 100,000) takes to answer and
to be warm, and what its requests cost meanwhile.

    tools/late-replica.py [--binary target/release/suffixd] [--sequences 100000]
                          [--tail 10000] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]

On loopback, with a real nats-server (tools/setup.sh installs it):
1. An origin replica's store gets N sequences through `suffixd ingest` (token ids, 20-80
   tokens each, drawn from a seeded generator, so the store holds what the stream holds)
   and serves: its publisher sends all N to the stream. The time for that is reported.
2. Replica A joins with an empty directory and nothing in the object store: it replays
   the N records from the stream.
3. The origin publishes a snapshot (covering the N), takes --tail more sequences and
   publishes them; replica B joins: it starts from the snapshot and replays the tail.

For A and B: seconds from process start to its first answer, and to warm (every origin
record past its starting point applied, nothing left to read); while a replica catches up,
one client keeps asking it for short chat answers (16 tokens) and /health, and as many again
once it is warm: their latencies (p50, p95, max) side by side show whether catching up
blocks requests. Exits non-zero when a replica is not warm within --limit seconds or a request
fails.
"""
import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--binary", default="target/release/suffixd")
ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf",
                help="the served model, also the ingest's tokenizer")
ap.add_argument("--sequences", type=int, default=100_000)
ap.add_argument("--tail", type=int, default=10_000)
ap.add_argument("--limit", type=float, default=600, help="seconds a replica may take to be warm")
ap.add_argument("--keep", action="store_true", help="keep the work directory")
args = ap.parse_args()

TOKEN = "late-replica-token"
work = tempfile.mkdtemp(prefix="suffixd-late-")
procs = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cleanup():
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if not args.keep:
        subprocess.run(["rm", "-rf", work])


def fail(why):
    print(f"FAILED: {why} (logs in {work})", file=sys.stderr)
    args.keep = True
    cleanup()
    sys.exit(1)


nats_port = free_port()
procs.append(subprocess.Popen(
    ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(nats_port), "-sd", f"{work}/nats"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


class Replica:
    def __init__(self, name):
        self.name, self.dir, self.proc = name, f"{work}/{name}", None

    def start(self):
        self.port = free_port()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [args.binary, "serve", "--model", args.model, "--snapshot-dir", self.dir,
             "--addr", f"127.0.0.1:{self.port}", "--replicate", f"nats://127.0.0.1:{nats_port}",
             "--cluster", "late"],
            env=dict(os.environ, SUFFIXD_ADMIN_TOKEN=TOKEN),
            stdout=subprocess.DEVNULL, stderr=open(f"{work}/{self.name}.log", "a"))
        procs.append(self.proc)

    def get(self, path, timeout=30):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     headers={"authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()

    def post(self, path, body, timeout=120):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=json.dumps(body).encode(), headers={
                                         "authorization": f"Bearer {TOKEN}",
                                         "content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()

    def await_answer(self):
        """Seconds from start to the first answer of /health."""
        while time.monotonic() - self.started < args.limit:
            if self.proc.poll() is not None:
                fail(f"{self.name} exited with {self.proc.returncode}")
            try:
                if self.get("/health", timeout=2)[0] == 200:
                    return time.monotonic() - self.started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        fail(f"{self.name} did not answer within {args.limit} s")

    def stats(self):
        return json.loads(self.get("/admin/stats")[1])

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def ingest(replica, first, count):
    """Appends sequences first..first+count to a stopped replica's store; seconds taken."""
    rng = random.Random(first)
    log = f"{work}/log-{first}.jsonl"
    with open(log, "w") as f:
        for _ in range(count):
            n = rng.randint(20, 80)
            f.write(json.dumps({"prompt": [1], "response": [rng.randrange(49152) for _ in range(n)]}))
            f.write("\n")
    t = time.monotonic()
    subprocess.run([args.binary, "ingest", "--dir", replica.dir, "--logs", log,
                    "--tokenizer", args.model], check=True, stderr=subprocess.DEVNULL)
    return time.monotonic() - t


def await_stat(replica, done, what):
    t = time.monotonic()
    while time.monotonic() - t < args.limit:
        s = replica.stats()
        if done(s):
            return time.monotonic() - t, s
        time.sleep(0.1)
    fail(f"{replica.name}: {what} not reached within {args.limit} s: {replica.stats()['replication']}")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def ask(replica, i):
    model = json.loads(replica.get("/v1/models")[1])["data"][0]["id"]
    body = {"model": model, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": f"Name three rivers, number {i}."}]}
    t = time.monotonic()
    status, _ = replica.post("/v1/chat/completions", body)
    chat = time.monotonic() - t
    t = time.monotonic()
    replica.get("/health")
    return status, chat, time.monotonic() - t


def join(name, expected):
    """Starts an empty replica; its answer and warm times (`expected` records applied from
    the stream, none left to read) and its requests' latencies meanwhile and after."""
    late = Replica(name)
    late.start()
    answered = late.await_answer()
    during, warm_at, stop = [], [None], threading.Event()

    def watch():
        while not stop.is_set():
            s = late.stats()
            r = s["replication"]
            if r["applied"] >= expected and r["lag_records"] == 0:
                warm_at[0] = time.monotonic() - late.started
                return
            if time.monotonic() - late.started > args.limit:
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    i = 0
    while watcher.is_alive():
        status, chat, health = ask(late, i)
        if status != 200:
            fail(f"{name} answered {status} while catching up")
        during.append((chat, health))
        i += 1
    if warm_at[0] is None:
        fail(f"{name} was not warm within {args.limit} s: {late.stats()['replication']}")
    after = []
    for j in range(max(len(during), 10)):
        status, chat, health = ask(late, i + j)
        after.append((chat, health))
    s = late.stats()
    late.stop()
    return {
        "replica": name,
        "answered_s": round(answered, 2),
        "warm_s": round(warm_at[0], 2),
        "cached_tokens": s["cached_tokens"],
        "applied": s["replication"]["applied"],
        "snapshot_fetched": s["replication"]["snapshot_fetched"],
        "requests_while_catching_up": len(during),
        "chat_s_while_catching_up": summary([c for c, _ in during]),
        "chat_s_when_warm": summary([c for c, _ in after]),
        "health_ms_while_catching_up": summary([h * 1e3 for _, h in during]),
        "health_ms_when_warm": summary([h * 1e3 for _, h in after]),
    }


def summary(xs):
    if not xs:
        return None
    return {"p50": round(statistics.median(xs), 3), "p95": round(pct(xs, 95), 3),
            "max": round(max(xs), 3)}


try:
    origin = Replica("origin")
    origin.start()  # once, to draw its identity
    origin.await_answer()
    origin.stop()
    took = ingest(origin, 0, args.sequences)
    print(f"ingested {args.sequences} sequences into the origin's store in {took:.1f} s")
    origin.start()
    origin.await_answer()
    took, s = await_stat(origin, lambda s: s["replication"]["published"] >= args.sequences,
                         "publishing")
    print(f"origin published {s['replication']['published']} sequences "
          f"({s['cached_tokens']} tokens) in {took:.1f} s after it answered")

    result_a = join("late-stream", args.sequences)
    print(json.dumps(result_a))

    origin.post("/admin/snapshot", {})
    await_stat(origin, lambda s: s["replication"]["snapshots_published"] >= 1, "a snapshot")
    origin.stop()
    ingest(origin, args.sequences, args.tail)
    origin.start()
    origin.await_answer()
    took, s = await_stat(
        origin, lambda s: s["replication"]["published"] >= args.tail, "publishing the tail")
    print(f"origin published a tail of {args.tail} after a snapshot of {args.sequences}")

    result_b = join("late-snapshot", args.tail)
    print(json.dumps(result_b))
finally:
    cleanup()
