#!/usr/bin/env python3
"""The peer at the sizes people deploy: Hugging Face transformers running a shape's
`config.json` (the published checkpoint's, as `shape_cost --write-config` writes it) with
random bf16 weights made on the GPU, plain greedy decoding, beside `shape_cost`'s figures
for suffixd on the same shape and card (tools/gpu-shapes.sh runs both).

    shape_cost --write-config llama-3.1-8b /tmp/llama-3.1-8b.json
    python3 tools/peer-shapes.py /tmp/llama-3.1-8b.json [--tokens 128] [--prompt 64]
        [--rounds 3] [--compile] [--device cuda]

A decoding step's time is (t(N tokens) − t(1 token)) / (N − 1) of `generate` calls on a
random prompt (medians of --rounds), so the prompt's prefill is not in it; its weight
traffic is set against a device copy of a buffer of the weights' size in the same run
(a copy reads and writes each byte, a step reads each weight once), as `shape_cost`
reports it. With --compile the peer runs at its best: a static KV cache, with which
`generate` compiles its step (torch.compile, CUDA graphs); the compilation runs in the
warm-up and its seconds are reported. Prints one JSON object.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def timed(device, fn):
    """Seconds `fn` takes, the device drained before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="static cache and torch.compile")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    device = torch.device(a.device)
    fields = json.load(open(a.config))
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.perf_counter()
    with device:
        model = AutoModelForCausalLM.from_config(config).eval()
    made_s = time.perf_counter() - t0
    # Random weights choose any token: no end token may cut a run short.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    if a.compile:
        model.generation_config.cache_implementation = "static"
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    prompt = torch.randint(100, config.vocab_size - 1, (1, a.prompt), device=device)

    def generate(n):
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=n, do_sample=False)
        assert out.shape[1] == a.prompt + n, f"{out.shape[1] - a.prompt} of {n} tokens"

    warmup_s = timed(device, lambda: (generate(a.tokens), generate(1)))
    one, many = [], []
    for _ in range(a.rounds):
        one.append(timed(device, lambda: generate(1)))
        many.append(timed(device, lambda: generate(a.tokens)))
    step_s = (statistics.median(many) - statistics.median(one)) / (a.tokens - 1)

    source = torch.empty(weight_bytes // 2, dtype=torch.bfloat16, device=device)
    target = torch.ones_like(source)
    copies = [timed(device, lambda: target.copy_(source)) for _ in range(6)][1:]
    copy_bandwidth = 2 * weight_bytes / statistics.median(copies)
    print(json.dumps({
        "peer": "transformers " + __import__("transformers").__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else a.device,
        "model_type": config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        "compiled": a.compile,
        "made_s": round(made_s, 1),
        "warmup_s": round(warmup_s, 1),
        "step_ms": 1e3 * step_s,
        "plain_tokens_per_s": 1 / step_s,
        "weights_read_gb_per_s": weight_bytes / step_s / 1e9,
        "copy_gb_per_s": copy_bandwidth / 1e9,
        "share_of_copy_bandwidth": weight_bytes / step_s / copy_bandwidth,
    }))


if __name__ == "__main__":
    main()
