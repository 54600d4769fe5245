#!/usr/bin/env python3
"""Writes a synthetic agentic workload as token streams (JSONL, {"prompt", "response"}).

A three-stage pipeline over many tasks, the shape SuffixDecoding targets:
  1. extract: the prompt holds a document; the response is a JSON-like record whose
     keys and punctuation follow a fixed template and whose values are copied spans of
     the document;
  2. plan: the prompt embeds stage 1's output; the response restates fields from it and
     adds steps drawn from a small phrase book;
  3. answer: the prompt embeds stages 1 and 2; the response quotes the plan and the record.
Token ids are arbitrary integers (no tokenizer), so this measures the speculation core
only. Deterministic for a given --seed.

  tools/make-agentic-workload.py --tasks 400 --out warm.jsonl --seed 1
  tools/make-agentic-workload.py --tasks 100 --out test.jsonl --seed 2
"""
import argparse
import json
import random

VOCAB = 30000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    # Shared across seeds: the pipeline's fixed parts (templates, phrase book).
    fixed = random.Random(12345)
    word = lambda r, n: [r.randrange(1000, VOCAB) for _ in range(n)]
    keys = [word(fixed, fixed.randint(1, 3)) for _ in range(12)]
    punct = {"open": [1, 2], "sep": [3], "colon": [4, 5], "close": [6, 7], "nl": [8]}
    phrases = [word(fixed, fixed.randint(4, 12)) for _ in range(40)]
    instr = {s: word(fixed, 30) for s in ("extract", "plan", "answer")}
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for _ in range(a.tasks):
            doc = word(rng, rng.randint(150, 400))
            record = list(punct["open"])
            fields = rng.sample(range(len(keys)), rng.randint(5, 9))
            values = {}
            for k in fields:
                start = rng.randrange(0, len(doc) - 12)
                values[k] = doc[start:start + rng.randint(2, 10)]
                record += keys[k] + punct["colon"] + values[k] + punct["sep"]
            record += punct["close"]
            f.write(json.dumps({"prompt": instr["extract"] + doc, "response": record}) + "\n")
            plan = []
            for k in rng.sample(fields, min(4, len(fields))):
                plan += rng.choice(phrases) + keys[k] + values[k] + punct["nl"]
            plan += rng.choice(phrases) + punct["nl"]
            f.write(json.dumps({"prompt": instr["plan"] + record, "response": plan}) + "\n")
            answer = rng.choice(phrases) + plan[: len(plan) // 2] + record[: len(record) // 2] + rng.choice(phrases)
            f.write(json.dumps({"prompt": instr["answer"] + record + plan, "response": answer}) + "\n")


if __name__ == "__main__":
    main()
