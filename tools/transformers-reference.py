#!/usr/bin/env python3
"""suffixd's exact f32 pass against Hugging Face transformers, the families' own
reference implementation, on the same real GGUF file: both dequantize its weights to
f32 and run the same text.

    tools/transformers-reference.py GGUF... [--suffixd BIN] [--tokens 16] [--long 1200]

It needs PyTorch, transformers, gguf and accelerate, which the test suite does not
install (5.6 GB with PyPI's torch):

    python3 -m venv /tmp/torch-venv
    /tmp/torch-venv/bin/pip install torch transformers gguf accelerate
    /tmp/torch-venv/bin/python tools/transformers-reference.py models/*.gguf

For each file, `suffixd serve --weights f32 --no-spec` answers five short prompts and one
of --long tokens (the agentic workload's text) as raw completions, greedy, --tokens
tokens, with log-probabilities; transformers runs the same text. Printed per prompt: the
prompt's token count on each side, the first position's log-probability difference for
the chosen token and the largest over the top five, and whether the continuations are
the same text. For a model with sliding-window layers (Gemma 3), prompts of 0.8 to 2.5
windows are also compared against transformers with the window one shorter and one
longer, which shows that suffixd's windows are transformers' own: the right one is
closest by orders of magnitude.

Exit status 1 if a continuation differs, a prompt tokenizes differently, a
log-probability is off by more than --tolerance, or a wrong window fits better.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "Q: What is 17 times 23?\nA:",
    "The three primary colors are",
]


def complete(port, text, tokens):
    body = {"prompt": text, "max_tokens": tokens, "temperature": 0, "logprobs": 5}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def start(binary, gguf, port, store):
    env = dict(os.environ, SUFFIXD_ADMIN_TOKEN="reference")
    server = subprocess.Popen(
        [binary, "serve", "--model", gguf, "--weights", "f32", "--no-spec",
         "--addr", f"127.0.0.1:{port}", "--snapshot-dir", store],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return server
        except Exception:
            if server.poll() is not None:
                raise SystemExit(f"suffixd serve exited with {server.returncode}")
            time.sleep(0.5)
    server.kill()
    raise SystemExit("suffixd serve did not come up in 10 minutes")


def set_window(model, window):
    """transformers reads a layer's window from the config (its masks) and the layer."""
    model.config.sliding_window = window
    for layer in model.model.layers:
        if getattr(layer.self_attn, "sliding_window", None):
            layer.self_attn.sliding_window = window


def log_probs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], -1)


def top_difference(tok, lp, top):
    """The largest difference over suffixd's top alternatives that transformers' top
    eight also hold (by their text)."""
    ours = {tok.decode([int(i)]): float(lp[i]) for i in torch.topk(lp, 8).indices}
    common = [k for k in top if k in ours]
    return max(abs(top[k] - ours[k]) for k in common) if common else float("inf")


def check_file(a, gguf, port):
    folder, name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                 dtype=torch.float32).eval()
    workload = open(os.path.join(ROOT, "tools/workloads/agentic.jsonl")).read()
    all_ids = tok(workload)["input_ids"]
    text_of = lambda n: tok.decode(all_ids[:n], skip_special_tokens=True)
    failures = []
    with tempfile.TemporaryDirectory() as store:
        server = start(a.suffixd, gguf, port, store)
        try:
            for text in TEXTS + [text_of(a.long)]:
                ids = tok(text)["input_ids"]
                answer = complete(port, text, a.tokens)
                choice = answer["choices"][0]
                lp = log_probs(model, ids)
                with torch.no_grad():
                    out = model.generate(torch.tensor([ids]), max_new_tokens=a.tokens,
                                         do_sample=False,
                                         attention_mask=torch.ones(1, len(ids), dtype=torch.long))
                theirs = tok.decode(out[0, len(ids):], skip_special_tokens=False)
                first = abs(choice["logprobs"]["token_logprobs"][0] - float(lp[int(lp.argmax())]))
                top = top_difference(tok, lp, choice["logprobs"]["top_logprobs"][0])
                row = {"file": name, "prompt_tokens": len(ids),
                       "suffixd_prompt_tokens": answer["usage"]["prompt_tokens"],
                       "first_logprob_diff": first, "top5_max_diff": top,
                       "same_text": choice["text"] == theirs,
                       "suffixd": choice["text"][:48], "transformers": theirs[:48]}
                print(json.dumps(row), flush=True)
                if (not row["same_text"] or len(ids) != row["suffixd_prompt_tokens"]
                        or max(first, top) > a.tolerance):
                    failures.append(row)
            window = getattr(model.config, "sliding_window", None)
            if window and getattr(model.config, "layer_types", None) and \
                    "sliding_attention" in model.config.layer_types:
                for scale in (0.8, 1.4, 2.0, 2.5):
                    text = text_of(int(window * scale))
                    ids = tok(text)["input_ids"]
                    top = complete(port, text, 1)["choices"][0]["logprobs"]["top_logprobs"][0]
                    row = {"file": name, "prompt_tokens": len(ids), "window": window}
                    for w in (window - 1, window, window + 1):
                        set_window(model, w)
                        row[f"diff_at_window_{w}"] = top_difference(tok, log_probs(model, ids), top)
                    set_window(model, window)
                    print(json.dumps(row), flush=True)
                    ours = row[f"diff_at_window_{window}"]
                    others = [row[f"diff_at_window_{w}"] for w in (window - 1, window + 1)]
                    if ours > a.tolerance or (len(ids) > window + 1 and min(others) <= ours):
                        failures.append(row)
        finally:
            server.terminate()
            server.wait()
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", nargs="+")
    ap.add_argument("--suffixd", default=os.path.join(ROOT, "target/release/suffixd"))
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--long", type=int, default=1200, help="tokens of the long prompt")
    ap.add_argument("--tolerance", type=float, default=2e-3)
    ap.add_argument("--port", type=int, default=18996)
    a = ap.parse_args()
    failures = []
    for gguf in a.gguf:
        failures += check_file(a, gguf, a.port)
    print(json.dumps({"files": len(a.gguf), "failures": len(failures)}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
