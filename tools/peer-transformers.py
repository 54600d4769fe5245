#!/usr/bin/env python3
"""The GPU peer: Hugging Face transformers `generate` on the same GGUF weights (dequantized,
bf16), greedy, plain and with prompt lookup decoding (`prompt_lookup_num_tokens`, the
model-free speculation transformers ships), on an `e2e-bench` workload run the way
`suffixd e2e-bench` runs it: each pipeline stage is one user turn through the model's chat
template, `{prev}` replaced by the previous stage's output.

    python3 tools/peer-transformers.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --workload tools/workloads/agentic.jsonl [--max-tokens 128] [--limit N]

Needs torch, transformers and the `gguf` package (transformers reads GGUF through it).
Prints one line per configuration and a JSON object last. tok/s counts generated tokens
over the whole `generate` call (a prompt of ~100 tokens is one forward pass on a GPU).

With --compile the peer runs at its best: a static KV cache, with which `generate`
compiles its decoding step by itself (`torch.compile`, CUDA graphs; transformers'
generation_config.compile_config). The compilation runs in the warm-up, outside the
timings, and its seconds are reported; a configuration that fails under it is reported
as failed. (Wrapping the whole forward in `torch.compile` instead recompiles for every
prompt length: its warm-up did not end within 150 s on an H200.)
"""
import argparse
import json
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def items_of(path, limit):
    items = []
    with open(path) as f:
        for line in f:
            if line.strip():
                items.append(json.loads(line))
    return items[:limit] if limit else items


def run(model, tok, items, max_tokens, lookup):
    tokens, seconds, outputs = 0, 0.0, []
    for item in items:
        if "stages" in item:
            stages = item["stages"]
        elif "messages" in item:
            stages = [None]
        else:
            stages = [item["prompt_text"]]
        prev = ""
        for stage in stages:
            if stage is None:
                text = tok.apply_chat_template(item["messages"], tokenize=False, add_generation_prompt=True)
            elif "stages" in item:
                msgs = [{"role": "user", "content": stage.replace("{prev}", prev)}]
                text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            else:
                text = stage
            ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids.to(model.device)
            kw = dict(max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
            if lookup:
                kw["prompt_lookup_num_tokens"] = lookup
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
            seconds += time.perf_counter() - t0
            new = out[0, ids.shape[1]:].tolist()
            tokens += len(new)
            outputs.append(new)
            prev = tok.decode(new, skip_special_tokens=True)
    return tokens, seconds, outputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--lookup", type=int, default=10, help="prompt_lookup_num_tokens")
    ap.add_argument("--compile", action="store_true", help="static cache and torch.compile")
    a = ap.parse_args()
    folder, name = os.path.split(os.path.abspath(a.model))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16).to("cuda").eval()
    items = items_of(a.workload, a.limit)
    report = {"device": torch.cuda.get_device_name(0), "transformers": __import__("transformers").__version__,
              "compiled": a.compile}
    if a.compile:
        model.generation_config.cache_implementation = "static"
    outs = {}
    for label, lookup in [("plain", 0), ("prompt_lookup", a.lookup)]:
        try:
            # Warm-up: kernels load (and, with --compile, compile) and the allocator
            # settles outside the timings.
            t0 = time.perf_counter()
            run(model, tok, items[:1], a.max_tokens if a.compile else 16, lookup)
            report[label + "_warmup_s"] = round(time.perf_counter() - t0, 1)
            n, s, outs[label] = run(model, tok, items, a.max_tokens, lookup)
        except Exception as e:  # noqa: BLE001 - a configuration the peer cannot run is reported
            report[label + "_error"] = repr(e)[:300]
            print(f"transformers {label}: failed: {e!r}"[:400], flush=True)
            continue
        report[label + "_tokens_per_s"] = n / s
        print(f"transformers {label}: {n} tokens in {s:.2f} s, {n / s:.1f} tok/s", flush=True)
    if "plain" in outs and "prompt_lookup" in outs:
        same = sum(x == y for x, y in zip(outs["plain"], outs["prompt_lookup"]))
        report["identical_outputs"] = f"{same}/{len(outs['plain'])}"
    print(json.dumps(report))


if __name__ == "__main__":
    main()
