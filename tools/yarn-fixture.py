#!/usr/bin/env python3
"""Writes tests/fixtures/yarn_transformers.json: Hugging Face transformers' logits for
tests/families.rs' tiny Qwen 2 model under YaRN RoPE scaling, the reference that
`tests/families/rope.rs` holds suffixd's pass to (the test suite installs no PyTorch).

    /tmp/torch-venv/bin/python tools/yarn-fixture.py [OUT.json]

The weights are the test's own: `Tiny::new(Fam::Qwen2)`'s deterministic generator,
reproduced here value for value in float32. For each variant, the config patch the test
applies to the tiny model's config.json, the inverse frequencies and attention factor
transformers derives from it (printed, for the record), and the logits of every prefix
of the test's prompt (transformers' eager attention, float32).
"""
import json
import sys

import numpy as np
import torch
import transformers

VOCAB, WIDTH, FFN, CONTEXT = 96, 64, 128, 64
LAYERS, HEADS, KV_HEADS, HEAD_DIM = 3, 4, 2, 16
PROMPT = [5, 17, 3, 88, 41, 41, 9, 70, 12, 63, 2, 30]
MASK = (1 << 64) - 1
MUL, ADD = 6364136223846793005, 1442695040888963407

VARIANTS = {
    # Qwen's model cards: how users turn on YaRN for long texts (transformers 4 keys).
    "qwen_card": {"rope_scaling": {"type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 16}},
    # A base and trained context whose band of blended frequencies is wide at this head
    # width (transformers 5 keys).
    "wide_band": {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0,
        "original_max_position_embeddings": 64}},
    # Every optional number: the band's turns, its ends unrounded, DeepSeek's two mscales.
    "every_option": {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0,
        "original_max_position_embeddings": 16, "beta_fast": 4.0, "beta_slow": 0.25,
        "mscale": 2.0, "mscale_all_dim": 1.0, "truncate": False}},
    # An attention factor given outright.
    "attention_factor": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 16,
                                          "attention_factor": 1.5}},
}


def values(n, seed, scale):
    """tests/families.rs' `values`, in float32."""
    state = (seed * MUL + ADD) & MASK
    out = np.empty(n, dtype=np.float32)
    for i in range(n):
        state = (state * MUL + ADD) & MASK
        unit = np.float32(state >> 40) / np.float32(1 << 24) * np.float32(2) - np.float32(1)
        out[i] = unit * np.float32(scale)
    return out


def tiny_qwen2():
    """`Tiny::new(Fam::Qwen2)`'s weights, in its order of seeds."""
    weights, seed = {}, 1

    def put(name, shape, scale, offset):
        nonlocal seed
        seed += 1
        v = values(int(np.prod(shape)), seed, scale) + np.float32(offset)
        weights[name] = torch.from_numpy(v.astype(np.float32).reshape(shape))

    put("model.embed_tokens.weight", [VOCAB, WIDTH], 1.0, 0.0)
    put("model.norm.weight", [WIDTH], 0.2, 1.0)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        put(p + "input_layernorm.weight", [WIDTH], 0.2, 1.0)
        put(p + "post_attention_layernorm.weight", [WIDTH], 0.2, 1.0)
        put(p + "self_attn.q_proj.weight", [q, WIDTH], 0.25, 0.0)
        put(p + "self_attn.k_proj.weight", [kv, WIDTH], 0.25, 0.0)
        put(p + "self_attn.v_proj.weight", [kv, WIDTH], 0.25, 0.0)
        put(p + "self_attn.o_proj.weight", [WIDTH, q], 0.2, 0.0)
        put(p + "mlp.gate_proj.weight", [FFN, WIDTH], 0.2, 0.0)
        put(p + "mlp.up_proj.weight", [FFN, WIDTH], 0.2, 0.0)
        put(p + "mlp.down_proj.weight", [WIDTH, FFN], 0.15, 0.0)
        put(p + "self_attn.q_proj.bias", [q], 0.5, 0.0)
        put(p + "self_attn.k_proj.bias", [kv], 0.5, 0.0)
        put(p + "self_attn.v_proj.bias", [kv], 0.5, 0.0)
    return weights


def config(patch):
    c = {"model_type": "qwen2", "hidden_size": WIDTH, "intermediate_size": FFN,
         "vocab_size": VOCAB, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
         "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "max_position_embeddings": CONTEXT, "hidden_act": "silu",
         "tie_word_embeddings": True}
    c.update(json.loads(json.dumps(patch)))
    if "rope_parameters" in patch:
        del c["rope_theta"]
    return c


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/yarn_transformers.json"
    weights = tiny_qwen2()
    fixture = {"transformers": transformers.__version__, "prompt": PROMPT, "variants": {}}
    for name, patch in VARIANTS.items():
        cfg = transformers.Qwen2Config(**config(patch))
        cfg._attn_implementation = "eager"
        model = transformers.Qwen2ForCausalLM(cfg).eval()
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
        model.tie_weights()
        rotary = model.model.rotary_emb
        print(name, "attention factor", rotary.attention_scaling)
        print(name, "inverse frequencies", rotary.inv_freq.tolist())
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT])).logits[0]
        fixture["variants"][name] = {
            "patch": patch,
            "attention_factor": float(rotary.attention_scaling),
            "inverse_frequencies": [float(x) for x in rotary.inv_freq],
            "logits": [[float(f"{x:.7g}") for x in row] for row in logits.tolist()],
        }
    with open(out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
