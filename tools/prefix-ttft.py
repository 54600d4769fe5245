#!/usr/bin/env python3
"""Time to first token of a long prompt sent again against a cold one, through a running
`suffixd serve` (loopback only, standard library only): what the prefix cache saves.

    tools/prefix-ttft.py [--base http://127.0.0.1:8080] [--tokens 2000] [--rounds 5]

Each round sends a prompt of about --tokens tokens (an agent's stage prompt: tool
descriptions and records) that no earlier request began with (a nonce opens it after the
chat template's first 32 tokens), then the same prompt again. Both ask for one token, not streamed, so a request's time is its
prefill and one step: its time to first token. Prints each round and the medians, with
the tokens the server says it reused (`usage.prompt_tokens_details.cached_tokens`), and
exits non-zero when a repeat reused nothing (the cache is off or failed).
"""
import argparse
import json
import statistics
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--base", default="http://127.0.0.1:8080")
ap.add_argument("--tokens", type=int, default=2000)
ap.add_argument("--rounds", type=int, default=5)
args = ap.parse_args()
assert args.base.startswith("http://127.0.0.1") or args.base.startswith("http://localhost"), "loopback only"

TOOLS = ["search_orders", "refund_order", "update_address", "escalate_ticket", "send_email"]


def prompt(nonce, tokens):
    """A stage prompt of about `tokens` tokens (these records run about 2.4 characters a
    token with the default model's tokenizer), opened by `nonce` so that no earlier
    prompt shares more than the chat template's opening (two blocks) with it."""
    lines = [f"Session {nonce}. You are the support pipeline's triage stage. Tools:"]
    i = 0
    while sum(len(l) for l in lines) < 2.4 * tokens:
        tool = TOOLS[i % len(TOOLS)]
        lines.append(f'- {tool}_{i}: {{"order_id": "A{1000 + 7 * i}", "reason": '
                     f'"customer {i % 13} reported item {i % 29} late", "priority": {i % 4}}}')
        i += 1
    lines.append("Answer with the tool to call first, as JSON.")
    return "\n".join(lines)


def once(text):
    """(seconds, prompt tokens, cached tokens) of one request for a single token."""
    body = json.dumps({
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1, "temperature": 0,
    }).encode()
    req = urllib.request.Request(args.base + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            answer = json.load(r)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"the server refused the prompt ({e.code}): {e.read().decode()[:400]}")
    seconds = time.perf_counter() - t0
    usage = answer["usage"]
    return seconds, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


cold, warm = [], []
for round_ in range(args.rounds):
    text = prompt(f"{time.time_ns()}-{round_}", args.tokens)
    c_s, c_tokens, c_cached = once(text)
    w_s, w_tokens, w_cached = once(text)
    cold.append(c_s)
    warm.append(w_s)
    print(f"round {round_ + 1}: {c_tokens} prompt tokens; cold {1000 * c_s:.1f} ms "
          f"({c_cached} reused), again {1000 * w_s:.1f} ms ({w_cached} reused)")
    if w_cached == 0:
        raise SystemExit("the repeat reused nothing: is the prefix cache on?")
c, w = statistics.median(cold), statistics.median(warm)
print(f"median time to first token: cold {1000 * c:.1f} ms, repeated {1000 * w:.1f} ms, "
      f"{c / w:.1f}x")
