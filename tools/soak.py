#!/usr/bin/env python3
"""A soak of `suffixd serve` under mixed traffic, with its resident memory every minute
(issue 66, item 6; standard library only).

    tools/soak.py [--binary target/release/suffixd] [--minutes 30] [--clients 6]
                  [--out soak.jsonl] [-- EXTRA SERVE FLAGS...]

Starts a server on a fresh snapshot directory (admin API on), then for --minutes keeps
--clients threads sending a mix an agent fleet sends: chat, streamed chat read to the
end, streams dropped after their first event, forced tool calls, JSON-schema answers,
completions with long prompts of their own (which fill the prefix cache), across 20
namespaces, every prompt new (so the learned cache grows to its budget). An admin thread
asks for a snapshot every minute and a compaction every five. Each minute it prints one
JSON line: resident memory (VmRSS), requests by status, the minute's median latency, and
the learned cache's and prefix cache's bytes against their budgets. At the end, a
summary: first, highest and last memory, and the growth over the last third of the run.
A server that exits, or any 5xx, is reported and fails the run (exit status 1).
"""
import argparse
import json
import os
import random
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
ap.add_argument("--minutes", type=float, default=30)
ap.add_argument("--clients", type=int, default=6)
ap.add_argument("--out", default=None, help="also write the minute lines here")
ap.add_argument("serve_flags", nargs="*")
args = ap.parse_args()

TOKEN = "soak-admin-token"
WORDS = ("river stone ledger harbor signal copper meadow lantern orbit canyon ticket "
         "glacier pepper violin socket marble thunder saddle pixel walnut").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


port = free_port()
base = f"http://127.0.0.1:{port}"
store = tempfile.mkdtemp(prefix="suffixd-soak-")
env = dict(os.environ, SUFFIXD_ADMIN_TOKEN=TOKEN)
server = subprocess.Popen(
    [args.binary, "serve", "--snapshot-dir", store, "--addr", f"127.0.0.1:{port}",
     *args.serve_flags],
    env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(store, "serve.log"), "w"))


def request(path, body=None, headers=None, timeout=300, stream_events=None):
    """(status, seconds); with stream_events, read at most that many SSE events."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={
        "content-type": "application/json", **(headers or {})})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if stream_events is None:
                r.read()
            else:
                seen = 0
                for line in r:
                    if line.startswith(b"data: "):
                        seen += 1
                        if seen >= stream_events:
                            break
            status = r.status
    except urllib.error.HTTPError as e:
        e.read()
        status = e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        status = 0
    return status, time.monotonic() - t


for _ in range(600):
    if request("/ready")[0] == 200:
        break
    if server.poll() is not None:
        sys.exit(f"the server exited at start ({server.returncode}); log in {store}")
    time.sleep(0.5)
else:
    sys.exit("the server did not become ready")


def rss_mib():
    with open(f"/proc/{server.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)


def words(n, rng):
    return " ".join(rng.choice(WORDS) for _ in range(n))


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TICKET = {"type": "object", "properties": {"title": {"type": "string"},
                                           "priority": {"enum": ["low", "high"]},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["title", "priority", "tags"], "additionalProperties": False}


def one(rng):
    """One request of a random kind: (kind, status, seconds)."""
    ns = {"x-suffixd-namespace": f"tenant-{rng.randrange(20)}"}
    topic = words(6, rng)
    kind = rng.choice(["chat", "stream", "drop", "tool", "schema", "long"])
    chat = {"messages": [{"role": "user", "content": f"Write two sentences about {topic}."}],
            "max_tokens": rng.choice([16, 64, 160]), "temperature": rng.choice([0, 0.8]),
            "seed": rng.randrange(1 << 30)}
    if kind == "chat":
        return kind, *request("/v1/chat/completions", chat, ns)
    if kind == "stream":
        return kind, *request("/v1/chat/completions", {**chat, "stream": True}, ns,
                              stream_events=10_000)
    if kind == "drop":
        return kind, *request("/v1/chat/completions", {**chat, "stream": True}, ns,
                              stream_events=1)
    if kind == "tool":
        body = {"messages": [{"role": "user", "content": f"Weather near {topic}?"}],
                "tools": [WEATHER], "tool_choice": "required", "max_tokens": 48,
                "temperature": 0}
        return kind, *request("/v1/chat/completions", body, ns)
    if kind == "schema":
        body = {"messages": [{"role": "user", "content": f"File a ticket about {topic}."}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "ticket", "schema": TICKET}},
                "max_tokens": 80, "temperature": 0}
        return kind, *request("/v1/chat/completions", body, ns)
    prompt = f"Context: {words(rng.randrange(200, 700), rng)}\nSummarise the context:"
    return kind, *request("/v1/completions", {"prompt": prompt, "max_tokens": 32,
                                              "temperature": 0}, ns)


stop = threading.Event()
lock = threading.Lock()
minute = {"statuses": {}, "latencies": [], "kinds": {}}
server_errors = []


def client(k):
    rng = random.Random(1000 + k)
    while not stop.is_set():
        kind, status, seconds = one(rng)
        with lock:
            minute["statuses"][status] = minute["statuses"].get(status, 0) + 1
            minute["kinds"][kind] = minute["kinds"].get(kind, 0) + 1
            if status == 200:
                minute["latencies"].append(seconds)
            if status >= 500:
                server_errors.append((kind, status))


def admin():
    auth = {"authorization": f"Bearer {TOKEN}"}
    n = 0
    while not stop.wait(60):
        n += 1
        request("/admin/compact" if n % 5 == 0 else "/admin/snapshot", {}, auth)


threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(args.clients)]
threads.append(threading.Thread(target=admin, daemon=True))
for t in threads:
    t.start()
out = open(args.out, "w") if args.out else None
curve = []
start = time.monotonic()
failed = None
try:
    while time.monotonic() - start < args.minutes * 60:
        time.sleep(60)
        if server.poll() is not None:
            failed = f"the server exited ({server.returncode}); log in {store}/serve.log"
            break
        with lock:
            taken = dict(minute)
            minute.update({"statuses": {}, "latencies": [], "kinds": {}})
        stats = {}
        try:
            with urllib.request.urlopen(urllib.request.Request(
                    base + "/admin/stats", headers={"authorization": f"Bearer {TOKEN}"}),
                    timeout=60) as r:
                stats = json.load(r)
        except (urllib.error.URLError, OSError):
            pass
        prefix = stats.get("serving", {}).get("prefix_cache", {})
        line = {
            "minute": round((time.monotonic() - start) / 60, 1),
            "rss_mib": rss_mib(),
            "statuses": taken["statuses"],
            "kinds": taken["kinds"],
            "median_s": round(statistics.median(taken["latencies"]), 3) if taken["latencies"] else None,
            "cached_tokens": stats.get("cached_tokens"),
            "budget_tokens": stats.get("budget_tokens"),
            "prefix_cache_bytes": prefix.get("bytes"),
            "prefix_cache_budget_bytes": prefix.get("budget_bytes"),
        }
        curve.append(line)
        print(json.dumps(line), flush=True)
        if out:
            out.write(json.dumps(line) + "\n")
            out.flush()
finally:
    stop.set()
    server.terminate()
    try:
        server.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.kill()

rss = [c["rss_mib"] for c in curve if c["rss_mib"] is not None]
summary = {"minutes": len(curve), "clients": args.clients, "server_errors": len(server_errors)}
if rss:
    third = rss[len(rss) * 2 // 3:]
    summary.update({"rss_first_mib": rss[0], "rss_max_mib": max(rss), "rss_last_mib": rss[-1],
                    "rss_growth_last_third_mib": round(third[-1] - third[0], 1)})
print(json.dumps({"summary": summary}))
if failed or server_errors:
    sys.exit(failed or f"server errors: {server_errors[:10]}")
