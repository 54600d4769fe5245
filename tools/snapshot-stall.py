#!/usr/bin/env python3
"""Decoding step latency while snapshots run back to back, against the same server left
alone, in one run.

Starts `BIN serve` on a copy of a store directory, then streams completions one after
another (the first stage of each tools/workloads/agentic.jsonl pipeline) and times the
gap between consecutive streamed chunks: one chunk per decoding step, so the gaps are
the step latencies a client sees. Phase `quiet`: nothing else runs. Phase `snapshots`:
another client asks for a snapshot (POST /admin/snapshot) as soon as the last one is
done. Prints one JSON object: p50/p99/p99.9/max of the gaps per phase, and the
snapshots written.

    tools/snapshot-stall.py --bin target/release/suffixd --store DIR [--seconds 60]

DIR is a store directory to copy (for example one `suffixd serve --warm-logs` built);
the copy is deleted at the end. Run it for two binaries, alternated, to compare them.
"""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

TOKEN = "snapshot-stall"


def percentiles(gaps_s):
    gaps = sorted(gaps_s)
    if not gaps:
        return {}
    at = lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))] * 1e3
    return {"n": len(gaps), "p50_ms": round(at(0.5), 2), "p99_ms": round(at(0.99), 2),
            "p999_ms": round(at(0.999), 2), "max_ms": round(gaps[-1] * 1e3, 2)}


def stream_gaps(port, prompt, max_tokens):
    """Gaps between the streamed chunks of one completion, in seconds."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    gaps, last = [], None
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
        last = now
    conn.close()
    # The last chunk carries the usage only: it follows the last step at once.
    return gaps[:-1]


def admin(port, method, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"})
    resp = conn.getresponse()
    out = json.loads(resp.read())
    conn.close()
    return out


def snapshot_loop(port, stop, done):
    while not stop.is_set():
        job = admin(port, "POST", "/admin/snapshot")
        while True:
            status = admin(port, "GET", job["poll"])
            if status["status"] != "running":
                break
            time.sleep(0.05)
        assert status["status"] == "done", status
        done.append(status["snapshot"]["seconds"])


def phase(port, prompts, seconds, max_tokens):
    gaps, end, i = [], time.time() + seconds, 0
    while time.time() < end:
        gaps += stream_gaps(port, prompts[i % len(prompts)], max_tokens)
        i += 1
    return gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--port", type=int, default=18431)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "workloads/agentic.jsonl")) as f:
        prompts = [json.loads(line)["stages"][0] for line in f if line.strip()]
    tmp = tempfile.mkdtemp()
    store = os.path.join(tmp, "store")
    shutil.copytree(args.store, store)
    env = dict(os.environ, SUFFIXD_ADMIN_TOKEN=TOKEN)
    server = subprocess.Popen(
        [args.bin, "serve", "--snapshot-dir", store, "--addr", f"127.0.0.1:{args.port}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=5)
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline and server.poll() is None, "the server did not start"
            time.sleep(0.5)
        phase(args.port, prompts, 5, args.max_tokens)  # warm-up
        quiet = phase(args.port, prompts, args.seconds, args.max_tokens)
        stop, written = threading.Event(), []
        loop = threading.Thread(target=snapshot_loop, args=(args.port, stop, written))
        loop.start()
        busy = phase(args.port, prompts, args.seconds, args.max_tokens)
        stop.set()
        loop.join()
        print(json.dumps({"bin": args.bin, "quiet": percentiles(quiet),
                          "snapshots": percentiles(busy), "snapshots_written": len(written),
                          "snapshot_s": [round(s, 2) for s in written]}))
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
