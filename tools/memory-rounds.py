#!/usr/bin/env python3
"""Resident memory of `suffixd serve` over rounds of long generations (standard library only).

    tools/memory-rounds.py [--binary target/release/suffixd] [--rounds 4] [--concurrency 16]
                           [--max-tokens 1024] [--prompt-words 0] [-- EXTRA SERVE FLAGS...]

Starts a server on a fresh snapshot directory with its default settings (plus any flags
after `--`), sends `rounds` rounds of `concurrency` concurrent chat requests of up to
`max-tokens` sampled tokens each (every request a different prompt and seed, so every
response is new to the cache), and prints after each round the server's resident memory
(VmRSS), the tokens its cache holds and its budget. Resident memory should level off once
the cache reaches its budget. With --prompt-words N every prompt also carries N words of
its own (a long prompt no other request shares), which fills the prefix cache; the rounds
then print the prefix cache's bytes and budget too, and resident memory should level off
once it reaches its budget (`--prefix-cache-bytes`).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--binary", default="target/release/suffixd")
ap.add_argument("--rounds", type=int, default=4)
ap.add_argument("--concurrency", type=int, default=16)
ap.add_argument("--max-tokens", type=int, default=1024)
ap.add_argument("--prompt-words", type=int, default=0)
ap.add_argument("serve_flags", nargs="*")
args = ap.parse_args()

TOPICS = ["a lighthouse keeper", "a database migration", "a chess tournament", "a rainy city",
          "a robot learning to cook", "an old map", "a compiler bug", "a mountain village"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def get(url, token):
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


WORDS = ["river", "ledger", "copper", "signal", "harbor", "orchard", "lantern", "quarry",
         "meadow", "engine", "canvas", "timber", "glacier", "market", "archive", "compass"]


def long_text(i):
    """`--prompt-words` words that start differently for every request."""
    return " ".join(f"{WORDS[(i * 7 + k * 3) % len(WORDS)]}{(i * 31 + k) % 97}"
                    for k in range(args.prompt_words))


def one(base, i, tokens_out):
    body = json.dumps({
        "messages": [{"role": "user", "content":
                      f"Request {i}. {long_text(i)}\nWrite a long, detailed story about {TOPICS[i % len(TOPICS)]} (number {i})."}],
        "max_tokens": args.max_tokens, "temperature": 0.9, "seed": i,
    }).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        tokens_out.append(json.load(r)["usage"]["completion_tokens"])


def main():
    port, token = free_port(), "memory-rounds"
    with tempfile.TemporaryDirectory() as snap:
        env = dict(os.environ, SUFFIXD_ADMIN_TOKEN=token)
        server = subprocess.Popen([args.binary, "serve", "--addr", f"127.0.0.1:{port}",
                                   "--snapshot-dir", snap, *args.serve_flags],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    get(base + "/admin/stats", token)
                    break
                except Exception:
                    if server.poll() is not None:
                        sys.exit("the server exited at start")
                    time.sleep(0.5)
            print(f"start: rss {rss_mib(server.pid):.0f} MiB")
            for r in range(args.rounds):
                t0, tokens = time.time(), []
                threads = [threading.Thread(target=one, args=(base, r * args.concurrency + k, tokens))
                           for k in range(args.concurrency)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                stats = get(base + "/admin/stats", token)
                print(f"round {r + 1}: {sum(tokens)} tokens generated in {time.time() - t0:.0f} s; "
                      f"rss {rss_mib(server.pid):.0f} MiB; cache {stats['cached_tokens']} tokens "
                      f"(budget {stats.get('budget_tokens')}); prefix cache "
                      f"{stats['serving']['prefix_cache']['bytes'] / 2**20:.0f} MiB "
                      f"(budget {stats['serving']['prefix_cache']['budget_bytes'] / 2**20:.0f})", flush=True)
        finally:
            server.terminate()
            server.wait()


main()
