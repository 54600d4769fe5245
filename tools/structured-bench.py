#!/usr/bin/env python3
"""A structured-output workload against a running `suffixd serve`: extraction and triage
requests, each held to a JSON schema (`response_format: json_schema`), run one after
another as a pipeline stage runs them. Prints tokens per verification step (what
speculation saves), drafted and accepted tokens, and decoding speed, as JSON.

The inputs are generated here from word lists (a seed picks them), so the workload is
not a file in this repository, and no two requests share their input text.

    tools/structured-bench.py --base-url http://127.0.0.1:8080 [--requests 40] [--seed 1]

tools/structured-bench.sh runs it against servers with and without grammar drafting.
"""
import argparse
import json
import random
import time
import urllib.request

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "maxLength": 30},
            "occupation": {"type": "string", "maxLength": 30},
        },
        "required": ["name", "age", "city", "occupation"],
        "additionalProperties": False,
    },
    "review": {
        "type": "object",
        "properties": {
            "product": {"type": "string", "maxLength": 30},
            "sentiment": {"enum": ["positive", "negative", "mixed"]},
            "rating": {"type": "integer", "minimum": 1, "maximum": 5},
            "issues": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
        },
        "required": ["product", "sentiment", "rating", "issues"],
        "additionalProperties": False,
    },
    "ticket": {
        "type": "object",
        "properties": {
            "category": {"enum": ["billing", "login", "shipping", "bug", "other"]},
            "priority": {"enum": ["low", "medium", "high"]},
            "summary": {"type": "string", "maxLength": 60},
            "needs_human": {"type": "boolean"},
        },
        "required": ["category", "priority", "summary", "needs_human"],
        "additionalProperties": False,
    },
}

NAMES = ["Maria Lopez", "Kenji Sato", "Amina Diallo", "Tom Becker", "Priya Nair", "Lucas Silva", "Ewa Nowak", "Omar Haddad"]
CITIES = ["Lisbon", "Osaka", "Dakar", "Hamburg", "Chennai", "Recife", "Krakow", "Amman"]
JOBS = ["nurse", "carpenter", "data analyst", "teacher", "pilot", "chef", "architect", "farmer"]
PRODUCTS = ["wireless earbuds", "a coffee grinder", "hiking boots", "a standing desk", "an e-reader", "a rice cooker"]
PROBLEMS = ["the battery dies fast", "it arrived scratched", "the app keeps crashing", "it is too loud", "the strap broke"]
PRAISE = ["it is easy to set up", "the sound is great", "it feels solid", "it was cheap", "delivery was quick"]
TICKETS = [
    "I was charged twice for my subscription this month",
    "I cannot log in since I reset my password",
    "My parcel has been stuck in transit for nine days",
    "The export button does nothing when I click it",
    "How do I change the email on my account?",
    "The invoice shows the wrong company address",
]


def make_requests(n, rng):
    out = []
    for i in range(n):
        kind = ["person", "review", "ticket"][i % 3]
        if kind == "person":
            text = f"{rng.choice(NAMES)} is {rng.randint(19, 80)} and works as a {rng.choice(JOBS)} in {rng.choice(CITIES)}."
            task = "Extract the person's details as JSON."
        elif kind == "review":
            text = f"I bought {rng.choice(PRODUCTS)}. {rng.choice(PRAISE).capitalize()}, but {rng.choice(PROBLEMS)}."
            task = "Analyse this product review as JSON."
        else:
            text = rng.choice(TICKETS) + f" (order {rng.randint(10000, 99999)})"
            task = "Triage this support ticket as JSON."
        out.append((kind, [{"role": "system", "content": task}, {"role": "user", "content": text}]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--answers", help="write the answers here (JSON list), to compare servers")
    args = ap.parse_args()
    totals = {"requests": 0, "completion_tokens": 0, "steps": 0, "drafted_tokens": 0, "accepted_tokens": 0, "valid_json": 0}
    answers = []
    started = time.time()
    for kind, messages in make_requests(args.requests, random.Random(args.seed)):
        body = {
            "messages": messages, "temperature": 0, "max_tokens": args.max_tokens,
            "response_format": {"type": "json_schema", "json_schema": {"name": kind, "strict": True, "schema": SCHEMAS[kind]}},
        }
        req = urllib.request.Request(args.base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        r = json.load(urllib.request.urlopen(req))
        totals["requests"] += 1
        totals["completion_tokens"] += r["usage"]["completion_tokens"]
        # Another server (llama-server, side by side) has no suffixd figures.
        for k in ("steps", "drafted_tokens", "accepted_tokens"):
            if totals[k] is not None and "suffixd" in r:
                totals[k] += r["suffixd"][k]
            else:
                totals[k] = None
        answers.append(r["choices"][0]["message"]["content"])
        try:
            json.loads(r["choices"][0]["message"]["content"])
            totals["valid_json"] += 1
        except ValueError:
            pass
    totals["wall_s"] = round(time.time() - started, 2)
    if totals["steps"]:
        totals["tokens_per_step"] = round(totals["completion_tokens"] / totals["steps"], 3)
    if args.answers:
        with open(args.answers, "w") as f:
            json.dump(answers, f)
    totals["tokens_per_s"] = round(totals["completion_tokens"] / totals["wall_s"], 1)
    print(json.dumps(totals))


if __name__ == "__main__":
    main()
