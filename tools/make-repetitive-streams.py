#!/usr/bin/env python3
"""Writes the adversarial test streams of issue 21 as token streams (JSONL,
{"prompt", "response"}; pipe through `zstd` for the peer, which reads .zst only):

  runs     prompts of N copies of one token, the reply the same token
  periods  prompts of a short pattern (period 7; --period, --alphabet) repeated to N
           tokens, the reply the pattern from its start
  loops    ordinary prompts (--base, a token-stream file) cut to 800 tokens, whose replies
           start as the recorded reply and fall into an 11-token loop halfway
  random   prompts of N tokens drawn at random from a few (--alphabet, default 4), the
           reply drawn alike: no period, and every token thousands of times

N runs over --sizes (default 1000,2000,4000,8000,16000). Deterministic for a --seed.

  tools/make-repetitive-streams.py --kind runs --out runs.jsonl
  tools/make-repetitive-streams.py --kind loops --base test.jsonl --out loops.jsonl
"""
import argparse
import json
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=["runs", "periods", "loops", "random"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="1000,2000,4000,8000,16000")
    ap.add_argument("--per-size", type=int, default=2)
    ap.add_argument("--reply", type=int, default=128, help="reply tokens (runs, periods)")
    ap.add_argument("--period", type=int, default=7, help="pattern length (periods)")
    ap.add_argument(
        "--alphabet",
        type=int,
        default=0,
        help="distinct tokens the pattern is drawn from (periods; default: as many as --period, "
        "so no token repeats within it), or the text (random; default 4)",
    )
    ap.add_argument("--base", help="token-stream JSONL of ordinary examples (loops)")
    ap.add_argument("--count", type=int, default=60, help="examples (loops)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    out = []
    if a.kind == "random":
        letters = [rng.randrange(100, 49000) for _ in range(a.alphabet or 4)]
        for n in [int(s) for s in a.sizes.split(",")]:
            for _ in range(a.per_size):
                prompt = [rng.choice(letters) for _ in range(n)]
                reply = [rng.choice(letters) for _ in range(a.reply)]
                out.append({"prompt": prompt, "response": reply})
    elif a.kind in ("runs", "periods"):
        for n in [int(s) for s in a.sizes.split(",")]:
            for _ in range(a.per_size):
                if a.kind == "runs":
                    pattern = [rng.randrange(100, 49000)]
                elif a.alphabet:
                    letters = [rng.randrange(100, 49000) for _ in range(a.alphabet)]
                    pattern = [rng.choice(letters) for _ in range(a.period)]
                else:
                    pattern = [rng.randrange(100, 49000) for _ in range(a.period)]
                prompt = (pattern * (n // len(pattern) + 1))[:n]
                reply = (pattern * (a.reply // len(pattern) + 1))[: a.reply]
                out.append({"prompt": prompt, "response": reply})
    else:
        if not a.base:
            sys.exit("--kind loops needs --base")
        with open(a.base) as f:
            for line in f:
                ex = json.loads(line)
                prompt, resp = ex["prompt"][:800], ex["response"]
                if len(resp) < 40:
                    continue
                half = resp[: len(resp) // 2]
                loop = resp[len(half) : len(half) + 11]
                if len(loop) < 11:
                    continue
                reply = half + loop * ((len(resp) - len(half)) // 11 + 8)
                out.append({"prompt": prompt, "response": reply})
                if len(out) == a.count:
                    break
    with open(a.out, "w") as f:
        for ex in out:
            f.write(json.dumps(ex) + "\n")
    print(f"{len(out)} examples -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
