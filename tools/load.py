#!/usr/bin/env python3
"""Bounded load on a running `suffixd serve`, loopback only (standard library only).

    tools/load.py [--base http://127.0.0.1:8080] [--requests 64] [--concurrency 32]
                  [--max-tokens 32] [--admin-token $SUFFIXD_ADMIN_TOKEN] [--during-maintenance]

Sends a fixed number of streamed chat requests (an agentic-style prompt mix) with a fixed
concurrency and reports throughput and latency percentiles (time to first token and total).
With --during-maintenance it also starts a snapshot (after a quarter of the requests) and
a compaction (after half) through the admin API while the load runs. With an admin token
it ends with the server's own figures (acceptance, tokens per step, forward-pass widths,
the cost curve as corrected by the steps it ran). Exits non-zero if any request fails.
Run it against a server started with and without --no-spec to compare.
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--base", default="http://127.0.0.1:8080")
ap.add_argument("--requests", type=int, default=64)
ap.add_argument("--concurrency", type=int, default=32)
ap.add_argument("--max-tokens", type=int, default=32)
ap.add_argument("--admin-token", default=None)
ap.add_argument("--during-maintenance", action="store_true")
args = ap.parse_args()
assert args.base.startswith("http://127.0.0.1") or args.base.startswith("http://localhost"), "loopback only"

PROMPTS = [
    'Copy this JSON exactly: {"order": %d, "items": ["apple", "pear"], "status": "shipped"}',
    "Extract the city as JSON with key city. Text: order %d ships to Paris.",
    "Repeat exactly: step %d done; next step: validate the order record.",
]

lock = threading.Lock()
results, errors = [], []
next_req = iter(range(args.requests))


def one(i):
    body = json.dumps({
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] % (i % 8)}],
        "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
    }).encode()
    req = urllib.request.Request(args.base + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    t0 = time.time()
    first, tokens, done = None, 0, False
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if first is None and chunk["choices"] and chunk["choices"][0].get("delta", {}).get("content"):
                first = time.time() - t0
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return first or (time.time() - t0), time.time() - t0, tokens


def worker():
    while True:
        with lock:
            i = next(next_req, None)
        if i is None:
            return
        try:
            r = one(i)
            with lock:
                results.append(r)
        except Exception as e:  # noqa: BLE001 - every failure is counted and reported
            with lock:
                errors.append(repr(e))


def admin(path):
    req = urllib.request.Request(args.base + path, data=b"", method="POST",
                                 headers={"authorization": "Bearer " + (args.admin_token or "")})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


start = time.time()
threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
for t in threads:
    t.start()
jobs = []


def maintenance():
    # A snapshot once a quarter of the requests are done, a compaction at half, so that
    # both have cached responses to write while the rest of the load runs.
    for path, frac in (("/admin/snapshot", 0.25), ("/admin/compact", 0.5)):
        while len(results) + len(errors) < args.requests * frac:
            time.sleep(0.05)
        jobs.append(admin(path))


if args.during_maintenance:
    m = threading.Thread(target=maintenance)
    m.start()
for t in threads:
    t.join()
if args.during_maintenance:
    m.join()
wall = time.time() - start


def poll(job):
    for _ in range(600):
        req = urllib.request.Request(args.base + job["poll"], headers={"authorization": "Bearer " + (args.admin_token or "")})
        with urllib.request.urlopen(req, timeout=60) as r:
            status = json.loads(r.read())
        if status["status"] != "running":
            return status
        time.sleep(0.5)
    return {"status": "timeout"}


jobs = [poll(j) for j in jobs]
failed_jobs = [j for j in jobs if j["status"] != "done"]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


ttft = [r[0] for r in results]
total = [r[1] for r in results]
toks = sum(r[2] for r in results)
server = None
if args.admin_token:
    # What the server saw: acceptance, tokens per step, batch widths, its cost curve now.
    req = urllib.request.Request(args.base + "/admin/stats", headers={"authorization": "Bearer " + args.admin_token})
    with urllib.request.urlopen(req, timeout=60) as r:
        stats = json.loads(r.read())
    curve = stats.get("cost_curve") or {}
    server = {**stats.get("serving", {}), "cost_curve": curve.get("points"),
              "cost_curve_measured": curve.get("measured"), "cost_curve_steps": curve.get("observed_steps")}
print(json.dumps({
    "requests": args.requests, "concurrency": args.concurrency, "ok": len(results), "errors": len(errors),
    "wall_s": round(wall, 2), "requests_per_s": round(len(results) / wall, 3), "tokens_per_s": round(toks / wall, 2),
    "ttft_p50_s": round(pct(ttft, 50), 3), "ttft_p99_s": round(pct(ttft, 99), 3),
    "latency_p50_s": round(pct(total, 50), 3), "latency_p99_s": round(pct(total, 99), 3),
    "maintenance_jobs": jobs, "server": server,
}))
if errors or failed_jobs:
    print("errors:", errors[:5], "failed jobs:", failed_jobs)
    raise SystemExit(1)
