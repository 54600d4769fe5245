#!/usr/bin/env python3
"""Predicted Outputs on a running `suffixd serve`: the same edit requests with and without
`prediction`, alternated, loopback only (standard library only).

    tools/prediction-bench.py [--base http://127.0.0.1:8080] [--tasks 6] [--rounds 3]
                              [--max-tokens 400] [--layout plain|numbered|both]

Each task is a small Python file and an edit ("rename function f to g, answer with the
whole file"), the way a coding agent asks for a rewrite. `prediction` is the file as it
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
runs R times a side, the side that goes first alternating.
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
ap.add_argument("--max-tokens", type=int, default=400)
ap.add_argument("--layout", choices=["plain", "numbered", "both"], default="both")
ap.add_argument("--seed", type=int, default=7)
args = ap.parse_args()
assert args.base.startswith(("http://127.0.0.1", "http://localhost")), "loopback only"

NOUNS = ["order", "invoice", "customer", "parcel", "route", "ticket", "report", "batch"]
VERBS = ["load", "check", "format", "total", "merge", "ship", "close", "count"]


def source_file(rng):
    """A small Python module of a few functions, different for every task."""
    names = rng.sample([f"{v}_{n}" for v in VERBS for n in NOUNS], 5)
    lines = ['"""Helpers for the %s desk."""' % rng.choice(NOUNS), "", "import json", ""]
    for name in names:
        arg = name.split("_")[1]
        field = rng.choice(["id", "total", "status", "city", "weight"])
        lines += [
            "",
            f"def {name}({arg}, limit={rng.randint(2, 90)}):",
            f'    """{name.replace("_", " ").capitalize()} for one {arg}."""',
            f"    value = {arg}.get(\"{field}\")",
            "    if value is None:",
            f"        raise ValueError(\"{arg} has no {field}\")",
            f"    return json.dumps({{\"{field}\": value, \"limit\": limit}})",
        ]
    return "\n".join(lines) + "\n", names


def task(rng):
    text, names = source_file(rng)
    old = names[rng.randrange(len(names))]
    new = old.split("_")[0] + "_each_" + old.split("_")[1]
    return text, old, new


def prompt(text, old, new, layout):
    if layout == "numbered":
        shown = "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), 1))
        where = "(each line after its number and a tab)"
    else:
        shown, where = text, ""
    return (f"Here is helpers.py {where}:\n```python\n{shown}```\n"
            f"Rename the function `{old}` to `{new}`. Answer with the whole updated file "
            "in a python code block, nothing else.")


def ask(content, prediction):
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": args.max_tokens, "temperature": 0,
        "user": "prediction-bench-" + uuid.uuid4().hex,
    }
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    req = urllib.request.Request(args.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        answer = json.loads(r.read())
    details = answer["usage"].get("completion_tokens_details", {})
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
    sides = {"without": [], "with": []}
    for r in range(args.rounds):
        for i, (text, old, new) in enumerate(tasks):
            content = prompt(text, old, new, layout)
            order = ["without", "with"] if (r + i) % 2 == 0 else ["with", "without"]
            got = {side: ask(content, text if side == "with" else None) for side in order}
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
