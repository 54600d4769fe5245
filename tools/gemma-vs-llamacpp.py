#!/usr/bin/env python3
"""Greedy output of suffixd against llama.cpp's on the same GGUF file (issue 46).

Both servers must be running on the same model, for example Gemma 3 270M
(tools/setup.sh --model gemma3-270m):

    suffixd serve --model models/gemma-3-270m-q4_k_m.gguf --addr 127.0.0.1:8098 --no-spec &
    ../shared/peer/llamacpp/serve.sh plain   # MODEL=models/gemma-3-270m-q4_k_m.gguf PORT=8099

For each prompt of tests/fixtures/gemma_prompts.json, both generate 16 tokens greedily
(raw completion, BOS added by each); the answers are tokenized by llama.cpp's /tokenize
and compared token by token. Prints one line per prompt and the count that agree on all
16. Standard library only.
"""
import argparse
import json
import pathlib
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suffixd", default="http://127.0.0.1:8098")
    ap.add_argument("--llamacpp", default="http://127.0.0.1:8099")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--prompts", default=str(root / "tests/fixtures/gemma_prompts.json"))
    a = ap.parse_args()
    prompts = json.loads(pathlib.Path(a.prompts).read_text())
    tokenize = lambda text: post(a.llamacpp + "/tokenize",
                                 {"content": text, "add_special": False})["tokens"]
    with urllib.request.urlopen(a.suffixd + "/v1/models") as r:
        model = json.load(r)["data"][0]["id"]
    whole = 0
    for i, prompt in enumerate(prompts):
        ours = post(a.suffixd + "/v1/completions",
                    {"model": model, "prompt": prompt, "max_tokens": a.tokens,
                     "temperature": 0})["choices"][0]["text"]
        theirs = post(a.llamacpp + "/completion",
                      {"prompt": prompt, "n_predict": a.tokens, "temperature": 0,
                       "top_k": 1, "samplers": ["top_k"], "cache_prompt": False})["content"]
        t_ours, t_theirs = tokenize(ours), tokenize(theirs)
        same = 0
        while same < min(len(t_ours), len(t_theirs)) and t_ours[same] == t_theirs[same]:
            same += 1
        agree = t_ours == t_theirs
        whole += agree
        note = "" if agree else f"  first difference at token {same}: {ours!r} vs {theirs!r}"
        print(f"prompt {i:2}: {same:2}/{max(len(t_ours), len(t_theirs))} tokens agree{note}")
    print(f"{whole} of {len(prompts)} prompts agree on all {a.tokens} tokens")


if __name__ == "__main__":
    main()
