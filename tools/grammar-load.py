#!/usr/bin/env python3
"""A bystander's latency while other clients send heavy (valid) schemas (issue 66, item 2).

Against a running `suffixd serve` at --base: a bystander sends short plain completions
one after another, first with the server idle, then while --clients threads each send
chat requests whose `response_format` is one of three heavy schemas (a 2,000-way
`anyOf` of constants, an object of 1,900 required properties, a 119,000-character
`const`: each near a limit the server enforces). With
--vary every heavy request carries a fresh salt in its schema (nothing can be reused);
without it the clients repeat the same three schemas. With --plain they send the same
chat requests without a schema: the load of eight clients alone, to judge the grammars'
share of the bystander's wait against. Prints the bystander's median and
p95 latency idle and under load, the heavy requests' statuses, and the server's resident
memory (--pid) before, at the end of the load, and --settle seconds after.

    tools/grammar-load.py --base http://127.0.0.1:8080 --pid PID [--vary] [--clients 8]
"""
import argparse
import json
import random
import statistics
import threading
import time
import urllib.error
import urllib.request


def post(base, path, body, timeout=600):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        e.read()
        status = e.code
    return status, time.monotonic() - t


def rss_mib(pid):
    if not pid:
        return None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024


def heavy_schema(kind, salt):
    if kind == 0:
        return {"type": "object", "properties": {"v": {"anyOf": [
            {"const": f"option-{i}-{salt}"} for i in range(2000)]}}, "required": ["v"],
            "additionalProperties": False}
    if kind == 1:
        props = {f"p{i}_{salt}": {"type": "integer"} for i in range(1900)}
        return {"type": "object", "properties": props, "required": list(props),
                "additionalProperties": False}
    # The longest `const` the server compiles (120,000 characters of literals in all).
    return {"type": "object", "properties": {"v": {"const": ("x" * 119_000) + salt}},
            "required": ["v"], "additionalProperties": False}


def bystander(base, n, gap):
    times = []
    for _ in range(n):
        status, dt = post(base, "/v1/completions",
                          {"prompt": "Hello", "max_tokens": 8, "temperature": 0})
        if status == 200:
            times.append(dt)
        time.sleep(gap)
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--vary", action="store_true")
    ap.add_argument("--plain", action="store_true", help="the same requests without a schema")
    ap.add_argument("--kinds", default="0,1,2",
                    help="the heavy schemas sent: 0 anyOf, 1 required properties, 2 const")
    ap.add_argument("--requests", type=int, default=20, help="bystander requests per phase")
    ap.add_argument("--gap", type=float, default=0.2)
    ap.add_argument("--settle", type=float, default=20)
    a = ap.parse_args()
    kinds = [int(k) for k in a.kinds.split(",")]
    before = rss_mib(a.pid)
    idle = bystander(a.base, a.requests, a.gap)
    stop = threading.Event()
    statuses = {}
    lock = threading.Lock()

    def client(k):
        i = 0
        while not stop.is_set():
            salt = f"{k}-{i}-{random.random()}" if a.vary else "fixed"
            body = {"messages": [{"role": "user", "content": "Fill it in."}], "max_tokens": 8,
                    "temperature": 0}
            if not a.plain:
                body["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": "heavy", "schema": heavy_schema(kinds[(k + i) % len(kinds)], salt)}}
            status, _ = post(a.base, "/v1/chat/completions", body)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
            i += 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(a.clients)]
    for t in threads:
        t.start()
    time.sleep(2)
    loaded = bystander(a.base, a.requests, a.gap)
    peak = rss_mib(a.pid)
    stop.set()
    for t in threads:
        t.join(timeout=600)
    time.sleep(a.settle)
    after = rss_mib(a.pid)
    print(json.dumps({
        "clients": a.clients, "vary": a.vary, "plain": a.plain, "kinds": a.kinds,
        "idle_median_s": round(idle[0], 3), "idle_p95_s": round(idle[1], 3),
        "loaded_median_s": round(loaded[0], 3), "loaded_p95_s": round(loaded[1], 3),
        "p95_ratio": round(loaded[1] / idle[1], 2),
        "heavy_statuses": statuses,
        "rss_mib_before": before, "rss_mib_loaded": peak, "rss_mib_after": after,
    }))


if __name__ == "__main__":
    main()
