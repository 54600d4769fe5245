#!/usr/bin/env python3
"""Predicted Outputs on a running `suffixd serve`: the same edit requests with and without
`prediction`, alternated, loopback only (standard library only).

    tools/prediction-bench.py [--base http://127.0.0.1:8080] [--tasks 6] [--rounds 3]
                              [--max-tokens 300] [--layout plain|numbered|both]

Each task is a service's JSON configuration and an edit ("change `port` to 9090, answer
with the whole file"), the way an agent asks for a rewrite. `prediction` is the file as it
was, which is what such agents send (OpenAI's Predicted Outputs). Two layouts of the
prompt: `plain` shows the file as it is (the file is then in the prompt too, so the
request's own tree drafts the same copy), `numbered` shows it as agents' read tools do,
a line number before each line (the prompt's copy then breaks at every line, the
prediction does not).

Every request runs in a namespace of its own, so neither side drafts from answers the
other cached, and greedy, so both must give the same text (checked: a difference exits
non-zero). Reported per layout: the medians of decoding tok/s (the server's own figure)
and of verification steps per request, each side's, and the ratio of the medians; and
the prediction's accepted and rejected tokens from `usage`. With --rounds R each task
runs R times a side, the side that goes first alternating. With --wrong the prediction
is another task's file. With --peer the server is
llama.cpp's (`../shared/peer/llamacpp/serve.sh MODE`), which has no `prediction`: the
same requests once each, its decoding tok/s and its steps (tokens less accepted drafts).
"""
import argparse
import json
import random
import statistics
import sys
import urllib.request
import uuid

ap = argparse.ArgumentParser()
ap.add_argument("--base", default="http://127.0.0.1:8080")
ap.add_argument("--tasks", type=int, default=6)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--max-tokens", type=int, default=300)
ap.add_argument("--layout", choices=["plain", "numbered", "both"], default="both")
ap.add_argument("--seed", type=int, default=7)
ap.add_argument("--wrong", action="store_true",
                help="predict another task's file (same keys, other values): what a stale or "
                     "mistaken prediction costs")
ap.add_argument("--peer", action="store_true",
                help="the server is llama.cpp's llama-server: the same requests without a "
                     "prediction (it has none), cold prompts, its own decoding tok/s")
args = ap.parse_args()
assert args.base.startswith(("http://127.0.0.1", "http://localhost")), "loopback only"

SERVICES = ["orders", "billing", "shipping", "invoices", "routing", "tickets", "reports", "intake"]
QUEUES = ["intake", "billing", "shipping", "refunds", "audit", "exports", "alerts"]


def config_file(rng):
    """A service's JSON configuration, different for every task."""
    service = rng.choice(SERVICES)
    config = {
        "service": service,
        "port": rng.choice([8080, 8000, 5000, 3000, 9000]),
        "host": "0.0.0.0",
        "workers": rng.randint(2, 16),
        "timeout_s": rng.choice([10, 30, 60, 120]),
        "database": {"url": f"postgres://db:5432/{service}", "pool": rng.randint(4, 32),
                     "retries": rng.randint(1, 5)},
        "queues": rng.sample(QUEUES, 3),
        "log_level": rng.choice(["debug", "info", "warning"]),
        "features": {"invoices": rng.random() < 0.5, "refunds": rng.random() < 0.5},
    }
    return config


def task(rng):
    """The file, and the edit asked for: one value changed."""
    config = config_file(rng)
    key, value = rng.choice([("port", 9090), ("workers", 24), ("log_level", "error"),
                             ("timeout_s", 45)])
    edit = f"Change `{key}` to {json.dumps(value)}."
    return json.dumps(config, indent=2) + "\n", edit


def prompt(text, edit, layout):
    if layout == "numbered":
        shown = "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), 1))
    else:
        shown = text
    return (f"Here is config.json:\n```json\n{shown}```\n{edit} Answer with the whole "
            "updated file in a json code block, nothing else.")


def ask(content, prediction):
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": args.max_tokens, "temperature": 0,
        "user": "prediction-bench-" + uuid.uuid4().hex,
    }
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    if args.peer:
        body["cache_prompt"] = False
    req = urllib.request.Request(args.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        answer = json.loads(r.read())
    details = answer["usage"].get("completion_tokens_details") or {}
    if args.peer:
        timings = answer["timings"]
        return {
            "text": answer["choices"][0]["message"]["content"],
            "tokens": answer["usage"]["completion_tokens"],
            "tok_s": timings["predicted_per_second"],
            "steps": timings["predicted_n"] - timings.get("draft_n_accepted", 0),
        }
    return {
        "text": answer["choices"][0]["message"]["content"],
        "tokens": answer["usage"]["completion_tokens"],
        "tok_s": answer["suffixd"]["tokens_per_s"],
        "steps": answer["suffixd"]["steps"],
        "accepted": details.get("accepted_prediction_tokens", 0),
        "rejected": details.get("rejected_prediction_tokens", 0),
    }


rng = random.Random(args.seed)
tasks = [task(rng) for _ in range(args.tasks)]
layouts = ["plain", "numbered"] if args.layout == "both" else [args.layout]
failed = False
for layout in layouts:
    if args.peer:
        runs = [ask(prompt(text, edit, layout), None) for _ in range(args.rounds) for text, edit in tasks]
        tok_s = statistics.median(x["tok_s"] for x in runs)
        steps = statistics.median(x["steps"] for x in runs)
        tokens = statistics.median(x["tokens"] for x in runs)
        print(f"{layout} (peer): {len(runs)} requests, median answer {tokens:.0f} tokens, "
              f"decoding tok/s (median) {tok_s:.1f}, steps per request (median) {steps:.0f}")
        continue
    sides = {"without": [], "with": []}
    for r in range(args.rounds):
        for i, (text, edit) in enumerate(tasks):
            content = prompt(text, edit, layout)
            order = ["without", "with"] if (r + i) % 2 == 0 else ["with", "without"]
            predicted = tasks[(i + 1) % len(tasks)][0] if args.wrong else text
            got = {side: ask(content, predicted if side == "with" else None) for side in order}
            if got["with"]["text"] != got["without"]["text"]:
                print(f"{layout} task {i}: the answers differ with and without the prediction",
                      file=sys.stderr)
                failed = True
            for side in sides:
                sides[side].append(got[side])
    med = {side: {k: statistics.median(x[k] for x in runs) for k in ("tok_s", "steps", "tokens")}
           for side, runs in sides.items()}
    accepted = sum(x["accepted"] for x in sides["with"])
    rejected = sum(x["rejected"] for x in sides["with"])
    answered = sum(x["tokens"] for x in sides["with"])
    print(f"{layout}: {len(sides['with'])} requests a side, median answer {med['with']['tokens']:.0f} tokens")
    print(f"  decoding tok/s (median): without {med['without']['tok_s']:.1f}, "
          f"with {med['with']['tok_s']:.1f}: {med['with']['tok_s'] / med['without']['tok_s']:.2f}x")
    print(f"  steps per request (median): without {med['without']['steps']:.0f}, "
          f"with {med['with']['steps']:.0f}: {med['without']['steps'] / max(med['with']['steps'], 1):.2f}x fewer")
    print(f"  prediction tokens: {accepted} accepted of {answered} answered, {rejected} rejected")
sys.exit(1 if failed else 0)
