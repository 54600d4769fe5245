#!/usr/bin/env python3
"""suffixd's exact f32 pass against Hugging Face transformers, the families' own
reference implementation, on the same weights: a real GGUF file (both dequantize its
weights to f32), or a directory that transformers itself writes for each family.

    tools/transformers-reference.py GGUF... [--suffixd BIN] [--tokens 16] [--long 1200]
    tools/transformers-reference.py --synthetic llama mistral qwen2 qwen3 gemma3_text smollm3 \
        [--legacy-config] [--convert LLAMA_CPP/convert_hf_to_gguf.py] [--long 300]
    tools/transformers-reference.py --synthetic qwen2 qwen3 --yarn [--convert ...]

--synthetic builds each family's published config narrowed to a width of 256 (FAMILIES
below says what each keeps), fills it with seeded random weights that make every norm
and bias count, and saves it with `save_pretrained` (transformers 5 writes RoPE as
`rope_parameters`; --legacy-config rewrites it as the `rope_theta`/`rope_scaling` keys
of transformers 4 and most published checkpoints), with the --tokenizer file's
vocabulary; suffixd serves that directory. With --convert, llama.cpp's own converter turns
the directory into an f32 GGUF file first and suffixd serves that: the GGUF path checked
on files made as the published ones are, for the families with none here. The converter
identifies a BPE tokenizer by hashing its output and knows only the hub's; the
transformers-saved copy of the --tokenizer file's vocabulary is not among them, so the
converted file is given the --tokenizer file's own pre-tokenizer (`tokenizer.ggml.pre`).
The converter also needs `sentencepiece`. llama.cpp's checkout comes inside the PyPI sdist
of llama-cpp-python: `pip download --no-deps --no-binary llama-cpp-python
llama-cpp-python==0.3.36`, untar it, and pass its `vendor/llama.cpp/convert_hf_to_gguf.py`.

It needs PyTorch, transformers, gguf and accelerate, which the test suite does not
install (5.6 GB with PyPI's torch):

    python3 -m venv /tmp/torch-venv
    /tmp/torch-venv/bin/pip install torch transformers gguf accelerate
    /tmp/torch-venv/bin/python tools/transformers-reference.py models/*.gguf

For each model, `suffixd serve --weights f32 --no-spec` answers five short prompts and one
of --long tokens (the agentic workload's text) as raw completions, greedy, --tokens
tokens, with log-probabilities; transformers runs the same text. Printed per prompt: the
prompt's token count on each side, the first position's log-probability difference for
the chosen token and the largest over the top five, and whether the continuations are
the same text. For a model with sliding-window layers (Gemma 3, Mistral), prompts of 0.8 to 2.5
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


def slides(config):
    """Whether some layers attend to a sliding window (Mistral's all, Gemma 3's most)."""
    kinds = getattr(config, "layer_types", None) or []
    return bool(getattr(config, "sliding_window", None)) and (
        "sliding_attention" in kinds or config.model_type == "mistral")


# Each family narrowed from a published checkpoint's config.json (sizes cut to a width
# of 256 and a few layers, everything else as published), with what sets it apart:
# Llama 3.2's RoPE scaling and tied head, Mistral's window on every layer, Qwen 2.5's
# q/k/v biases, Qwen 3's q/k norms and heads wider than width / heads, Gemma 3's
# sandwich norms, GELU, scaled embedding, query_pre_attn_scalar, and sliding layers with
# their own RoPE base between global ones with a linear RoPE scaling (Gemma 3 4B's).
NARROW = dict(hidden_size=256, intermediate_size=768, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, num_hidden_layers=4)
FAMILIES = {
    "llama": dict(rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072,
                  rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192},
                  rope_theta=500000.0),
    "mistral": dict(rms_norm_eps=1e-5, sliding_window=64, rope_theta=1000000.0,
                    max_position_embeddings=32768),
    "qwen2": dict(rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0,
                  max_position_embeddings=32768),
    "qwen3": dict(rms_norm_eps=1e-6, tie_word_embeddings=True, head_dim=128,
                  rope_theta=1000000.0, max_position_embeddings=40960),
    "smollm3": dict(rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=5000000.0,
                    max_position_embeddings=65536, no_rope_layer_interval=4,
                    pad_token_id=None),
    "gemma3_text": dict(rms_norm_eps=1e-6, num_hidden_layers=7, num_key_value_heads=1,
                        sliding_window=64, query_pre_attn_scalar=48,
                        max_position_embeddings=131072, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0,
                        rope_scaling={"rope_type": "linear", "factor": 8.0}),
}
# What a GGUF file cannot say, so that a model to convert must not have it (--convert):
# llama.cpp scales Gemma 3's attention by the head width, not query_pre_attn_scalar
# (apart from the 27B model, by its layer count), and its converter drops Mistral's window
# (llama.cpp runs Mistral with full attention). Gemma's sliding layers get another RoPE
# base than the usual one, to show that the file's `rope.freq_base_swa` is read.
CONVERTIBLE = {
    "gemma3_text": dict(query_pre_attn_scalar=NARROW["head_dim"], rope_local_base_freq=20000.0),
    "mistral": dict(sliding_window=None),
}
# --yarn: Qwen's model cards' setting for texts past 32,768 tokens, on the Qwen families.
YARN = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 32768}}
# transformers 5 writes RoPE as `rope_parameters`; releases before it (and most published
# checkpoints) as these keys, which --legacy-config puts back.
LEGACY_KEYS = ("rope_theta", "rope_scaling", "rope_local_base_freq")


def synthetic(family, folder, tokenizer_gguf, legacy, convertible=False, yarn=False, seed=7):
    """A narrowed model of `family` with seeded random weights, saved by transformers to
    `folder` with the tokenizer of `tokenizer_gguf`; returns (tokenizer, model).
    `convertible`: with CONVERTIBLE's settings; `yarn`: with YARN's (Qwen only)."""
    from transformers import AutoConfig
    gguf_folder, gguf_name = os.path.split(os.path.abspath(tokenizer_gguf))
    tok = AutoTokenizer.from_pretrained(gguf_folder, gguf_file=gguf_name)
    family_settings = dict(FAMILIES[family], **(CONVERTIBLE.get(family, {}) if convertible else {}))
    if yarn and family.startswith("qwen"):
        family_settings.update(YARN)
    settings = dict(NARROW, **family_settings, vocab_size=len(tok),
                    eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    config = AutoConfig.for_model(family, **settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    # Weights that make every part count: matrices of variance 1/fan-in, norms and
    # biases away from their neutral values (transformers starts biases at zero and
    # norms at one, which would hide a missing bias or norm).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
            elif "norm" in name:
                p.copy_((0.0 if family == "gemma3_text" else 1.0) + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    if legacy:
        path = os.path.join(folder, "config.json")
        saved = json.load(open(path))
        saved.pop("rope_parameters", None)
        saved.update({k: v for k, v in family_settings.items() if k in LEGACY_KEYS})
        json.dump(saved, open(path, "w"), indent=2)
    return tok, model


def convert(converter, folder, tokenizer_gguf):
    """`folder` as llama.cpp's converter writes it, f32; returns the file's path."""
    import gguf
    field = gguf.GGUFReader(tokenizer_gguf).get_field("tokenizer.ggml.pre")
    pre = field.contents() if field else "default"
    out = os.path.join(folder, "converted.gguf")
    here = os.path.dirname(os.path.abspath(converter))
    # The converter's modules, its own gguf-py first (as the script itself arranges), with
    # an unrecognised BPE tokenizer given the vocabulary file's pre-tokenizer.
    run = f"""
import runpy, sys
sys.path[:0] = [{here!r}, {os.path.join(here, "gguf-py")!r}]
import conversion.base as base
hashed = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return hashed(self, tokenizer)
    except NotImplementedError:
        return {pre!r}
base.TextModel.get_vocab_base_pre = pre
sys.argv = [{converter!r}, {folder!r}, "--outfile", {out!r}, "--outtype", "f32"]
runpy.run_path({converter!r}, run_name="__main__")
"""
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the converter failed on {folder}:\n{done.stderr[-3000:]}")
    return out


def check_synthetic(a, family, port):
    with tempfile.TemporaryDirectory() as folder:
        tok, model = synthetic(family, folder, a.tokenizer, a.legacy_config, bool(a.convert),
                               a.yarn)
        name = f"synthetic {family}" + (" (legacy config)" if a.legacy_config else "")
        name += " with YaRN" if a.yarn else ""
        served = folder
        if a.convert:
            served = convert(a.convert, folder, a.tokenizer)
            name += " via llama.cpp's converter"
        return check_model(a, name, served, tok, model, port)


def check_file(a, gguf, port):
    folder, name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                 dtype=torch.float32).eval()
    return check_model(a, name, gguf, tok, model, port)


def check_model(a, name, path, tok, model, port):
    """suffixd serving `path` against transformers' `model` of the same weights."""
    workload = open(os.path.join(ROOT, "tools/workloads/agentic.jsonl")).read()
    all_ids = tok(workload)["input_ids"]
    text_of = lambda n: tok.decode(all_ids[:n], skip_special_tokens=True)
    failures = []
    with tempfile.TemporaryDirectory() as store:
        server = start(a.suffixd, path, port, store)
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
            if slides(model.config):
                window = model.config.sliding_window
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
    ap.add_argument("gguf", nargs="*")
    ap.add_argument("--synthetic", nargs="+", default=[], choices=sorted(FAMILIES),
                    metavar="FAMILY", help=f"narrowed random models: {', '.join(FAMILIES)}")
    ap.add_argument("--tokenizer", default=os.path.join(
        ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"), help="the synthetic models' tokenizer")
    ap.add_argument("--legacy-config", action="store_true",
                    help="write the synthetic configs' RoPE as transformers 4 did")
    ap.add_argument("--convert", metavar="CONVERT_HF_TO_GGUF_PY",
                    help="serve the synthetic models as GGUF files that llama.cpp's converter "
                         "(a llama.cpp checkout's convert_hf_to_gguf.py) makes of them")
    ap.add_argument("--yarn", action="store_true",
                    help="give the synthetic Qwen models YaRN RoPE scaling, as Qwen's cards do")
    ap.add_argument("--suffixd", default=os.path.join(ROOT, "target/release/suffixd"))
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--long", type=int, default=1200, help="tokens of the long prompt")
    ap.add_argument("--tolerance", type=float, default=2e-3)
    ap.add_argument("--port", type=int, default=18996)
    a = ap.parse_args()
    failures = []
    for gguf in a.gguf:
        failures += check_file(a, gguf, a.port)
    for family in a.synthetic:
        failures += check_synthetic(a, family, a.port)
    print(json.dumps({"files": len(a.gguf), "synthetic": len(a.synthetic),
                      "failures": len(failures)}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
