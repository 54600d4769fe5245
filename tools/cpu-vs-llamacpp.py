#!/usr/bin/env python3
"""Plain decoding and prefill on the CPU, suffixd against llama.cpp, on the same GGUF files
(issue 67): what a user comparing the two would run.

    tools/cpu-vs-llamacpp.py [--rounds 5] [--threads 2] [--depth N] FILE...

For each file and round, in turn: `llama-bench -p 512 -n 128` (llama.cpp's pp512 and
tg128, one repetition), then `suffixd generate --no-spec` twice: a chat answer of 128
tokens (decoding tokens per second) and a 512-token raw prompt with one token out
(prefill tokens per second). Each round also reads the machine's bandwidth over a
buffer of the file's size (`examples/read_bandwidth`, same threads) just before
llama.cpp's run and just before suffixd's decode, so that each program's share of it
(the file's bytes × tokens per second: every weight is read once a token) is taken
against a reading from the same moment: this host's bandwidth drifts by half from one
minute to the next. Prints each file's medians, suffixd's ratio to llama.cpp, the
median reading, and the median of each program's per-round shares. Make other formats
of the default model with tools/gguf-convert.py. `--depth N` measures both after N
tokens of context (llama-bench's `-d N`; suffixd decodes after a raw prompt of about N
tokens, and its prefill is the 512 tokens' share of prefilling context and them): what
an agent with a long prompt gets. Build
llama.cpp with ../shared/peer/llamacpp/build.sh (LLAMA_BENCH overrides its path); on a
CPU with AMX that build's llama-bench dies of SIGILL in ggml's AMX kernels, so rebuild it
with `-mno-amx-tile -mno-amx-int8 -mno-amx-bf16` in CMAKE_C_FLAGS and CMAKE_CXX_FLAGS
(docs/cpu-kernels.md, session 61). Run it on a quiet machine: both programs' threads
spin.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CHAT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
# About 512 tokens of plain English for the default tokenizer (checked: the run prints
# the prompt's token count).
PARAGRAPH = ("The keeper climbed the stairs of the lighthouse every evening, counted the "
             "steps, cleaned the lamp and wrote the weather into the log before dark. ")


def llama_bench(binary, path, threads, depth):
    """pp512 and tg128, each after `depth` tokens of context (llama-bench's `-d`)."""
    out = subprocess.run([binary, "-m", path, "-t", str(threads), "-p", "512", "-n", "128",
                          "-d", str(depth), "-r", "1", "-o", "json"], check=True,
                         capture_output=True, text=True).stdout
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return pp, tg


def suffixd(binary, path, threads, args):
    env = dict(os.environ, CANDLE_NUM_THREADS=str(threads))
    run = subprocess.run([binary, "generate", "--model", path, "--no-spec", "--json", *args],
                         capture_output=True, text=True, env=env)
    if run.returncode != 0 and "no chat template" in run.stderr and args[0] == "--chat":
        # A base model (Gemma 3 270M's GGUF has no template): the same text, raw.
        return suffixd(binary, path, threads, ["--prompt", *args[1:]])
    if run.returncode != 0:
        sys.exit(f"suffixd generate failed on {path}: {run.stderr.strip()}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def read_bandwidth(binary, path, threads):
    """The machine's read bandwidth, GB/s (median of its rounds), over the file's size."""
    out = subprocess.run([binary, path, str(threads), "9"], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["gb_per_s"]


def prefill(a, path, prompt):
    """suffixd's prompt tokens and prefill seconds for a raw prompt, one token out."""
    g = suffixd(a.suffixd, path, a.threads, ["--prompt", prompt, "--max-tokens", "1"])
    return g["prompt_tokens"], g["prefill_s"]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=0,
                    help="tokens of context before decoding and prefill (llama-bench -d); "
                    "suffixd then decodes after a raw prompt of about that many tokens "
                    "instead of the chat prompt, and prefills its 512 tokens after them")
    ap.add_argument("--suffixd", default=os.path.join(root, "target/release/suffixd"))
    ap.add_argument("--read-bandwidth", default=os.path.join(
        root, "target/release/examples/read_bandwidth"),
        help="cargo build --release --example read_bandwidth")
    ap.add_argument("--llama-bench", default=os.environ.get(
        "LLAMA_BENCH", "/tmp/llamacpp-build/bin/llama-bench"))
    a = ap.parse_args()
    long_prompt = PARAGRAPH * 18
    # PARAGRAPH is 28 tokens of the default tokenizer.
    context = PARAGRAPH * round(a.depth / 28)
    decode_args = (["--prompt", context, "--max-tokens", "128"] if a.depth
                   else ["--chat", CHAT, "--max-tokens", "128"])
    print("| file | llama.cpp tg128 | suffixd decode | ratio | llama.cpp pp512 | "
          "suffixd prefill | ratio | read GB/s | llama.cpp share | suffixd share |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in a.files:
        theirs_pp, theirs_tg, ours_tg, ours_pp = [], [], [], []
        readings, theirs_share, ours_share = [], [], []
        gb = os.path.getsize(path) / 1e9
        prompt_tokens = generated = context_tokens = 0
        for _ in range(a.rounds):
            bandwidth = read_bandwidth(a.read_bandwidth, path, a.threads)
            readings.append(bandwidth)
            pp, tg = llama_bench(a.llama_bench, path, a.threads, a.depth)
            theirs_pp.append(pp)
            theirs_tg.append(tg)
            theirs_share.append(gb * tg / bandwidth)
            bandwidth = read_bandwidth(a.read_bandwidth, path, a.threads)
            readings.append(bandwidth)
            g = suffixd(a.suffixd, path, a.threads, decode_args)
            generated, context_tokens = len(g["tokens"]), g["prompt_tokens"]
            ours_tg.append(g["tokens_per_s"])
            ours_share.append(gb * g["tokens_per_s"] / bandwidth)
            prompt_tokens, seconds = prefill(a, path, context + long_prompt)
            if a.depth:
                # The 512 tokens' share: the whole prompt less the context alone.
                context_only, context_seconds = prefill(a, path, context)
                prompt_tokens -= context_only
                seconds -= context_seconds
            ours_pp.append(prompt_tokens / seconds)
        m = statistics.median
        print(f"| {os.path.basename(path)} | {m(theirs_tg):.1f} | {m(ours_tg):.1f} | "
              f"{m(ours_tg) / m(theirs_tg):.2f}× | {m(theirs_pp):.1f} | {m(ours_pp):.1f} | "
              f"{m(ours_pp) / m(theirs_pp):.2f}× | {m(readings):.1f} | "
              f"{m(theirs_share):.0%} | {m(ours_share):.0%} |")
        print(f"  ({a.rounds} rounds, depth {a.depth}; suffixd decoded {generated} tokens "
              f"after {context_tokens} of context, prefilled "
              f"{prompt_tokens}; readings {', '.join(f'{r:.1f}' for r in readings)} GB/s; "
              f"suffixd's shares {', '.join(f'{s:.0%}' for s in ours_share)})",
              file=sys.stderr)


if __name__ == "__main__":
    main()
