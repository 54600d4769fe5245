#!/usr/bin/env python3
"""How often a quantized model's greedy tokens agree with the exact forward pass, suffixd's
and llama.cpp's on the same quantized file (issue 67, item 3).

    tools/argmax-vs-reference.py --reference F32.gguf --quantized Q.gguf [--tokens 16]
                                 [--prompts FILE.json]...

The reference is suffixd with no speculation on an F32 file of the same weights (for
the default model: `tools/gguf-convert.py models/SmolLM2-135M-Instruct.Q4_1.gguf F32.gguf
--to f32`, the quantized weights dequantized exactly, so only the arithmetic differs);
llama.cpp's `llama-server` on that F32 file is run too, as a check that the two exact
passes agree with each other. Then suffixd and llama-server on the quantized file. Each
server is started alone (2 threads), sent every prompt as a raw completion (greedy,
--tokens tokens), and stopped. Per side: the prompts whose first token is the
reference's (the argmax of the first position), and those whose whole answer is.
Prompts: JSON lists of strings (default: tests/fixtures/gemma_prompts.json, 20 prompts
where the likeliest answer is a near tie) and the user messages of
tools/workloads/chat.jsonl, as raw text.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "..", "shared", "peer", "llamacpp")
LLAMA_BIN = os.environ.get("LLAMA_BIN", "/tmp/llamacpp-build/bin")
SUFFIXD = os.environ.get("SUFFIXD", os.path.join(ROOT, "target", "release", "suffixd"))
PORT = 18672


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def answers(kind, model, prompts, tokens, tmp):
    """The greedy answers of one server on `model`, started and stopped here."""
    bench = __import__("pipeline-bench")
    log = open(os.path.join(tmp, f"{kind}.log"), "w")
    if kind == "suffixd":
        cmd = [SUFFIXD, "serve", "--addr", f"127.0.0.1:{PORT}", "--no-spec",
               "--snapshot-dir", tempfile.mkdtemp(dir=tmp), "--model", model]
        env = dict(os.environ, RUST_LOG="warn", CANDLE_NUM_THREADS="2")
    else:
        cmd = ["bash", os.path.join(PEER, "serve.sh"), "plain"]
        env = dict(os.environ, PORT=str(PORT), MODEL=model, BIN=LLAMA_BIN, THREADS="2")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        bench.wait_ready(PORT, proc)
        url = f"http://127.0.0.1:{PORT}"

        def complete(prompt, n):
            if kind == "suffixd":
                r = post(url + "/v1/completions", {"prompt": prompt, "max_tokens": n,
                                                   "temperature": 0})
                return r["choices"][0]["text"]
            r = post(url + "/completion", {"prompt": prompt, "n_predict": n, "temperature": 0,
                                           "top_k": 1, "samplers": ["top_k"],
                                           "cache_prompt": False})
            return r["content"]

        # The first token alone too: its text names the argmax of the first position.
        return [complete(p, tokens) for p in prompts], [complete(p, 1) for p in prompts]
    finally:
        bench.stop(proc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", required=True, help="an F32 GGUF of the same weights")
    ap.add_argument("--quantized", required=True)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--prompts", action="append")
    a = ap.parse_args()
    prompts = []
    for path in a.prompts or [os.path.join(ROOT, "tests", "fixtures", "gemma_prompts.json")]:
        prompts += json.load(open(path))
    with open(os.path.join(ROOT, "tools", "workloads", "chat.jsonl")) as f:
        prompts += [json.loads(line)["messages"][-1]["content"] for line in f if line.strip()]
    if not os.path.exists(os.path.join(LLAMA_BIN, "llama-server")):
        subprocess.run(["bash", os.path.join(PEER, "build.sh")], check=True)
    tmp = tempfile.mkdtemp(prefix="argmax-")
    sides = [("suffixd", a.reference, "suffixd, f32 (the reference)"),
             ("llama", a.reference, "llama.cpp, f32"),
             ("suffixd", a.quantized, f"suffixd, {os.path.basename(a.quantized)}"),
             ("llama", a.quantized, f"llama.cpp, {os.path.basename(a.quantized)}")]
    results = [answers(kind, os.path.abspath(model), prompts, a.tokens, tmp)
               for kind, model, _ in sides]
    ref_whole, ref_first = results[0]
    print(f"{len(prompts)} prompts, {a.tokens} tokens each, against suffixd's f32 pass")
    for (_, _, name), (whole, first) in zip(sides[1:], results[1:]):
        same_first = sum(x == y for x, y in zip(first, ref_first))
        same_whole = sum(x == y for x, y in zip(whole, ref_whole))
        print(f"  {name:45} first token {same_first}/{len(prompts)}, "
              f"whole answer {same_whole}/{len(prompts)}")


if __name__ == "__main__":
    main()
