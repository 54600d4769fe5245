#!/usr/bin/env python3
"""Thinking models' answers through suffixd and llama.cpp's llama-server, side by side.

    tools/reasoning-vs-llamacpp.py [--model GGUF] [--prompts 12] [--max-tokens 48]

Both servers get the same GGUF (the default model unless told), the same chat template
file and greedy requests over the OpenAI API; llama-server runs with `--jinja
--reasoning-format deepseek` (its `reasoning_content`), suffixd with its defaults. For
each template and prompt the script compares what each server sends:
  - opened: DeepSeek-R1's distillations' template (tests/fixtures/
    deepseek-r1-distill-qwen.jinja), whose prompt opens the thoughts: the pair
    (`reasoning_content`, `content`), whole and streamed (the deltas joined);
  - qwen3: Qwen 3's template (tests/fixtures/qwen3.jinja): the same pair, and the prompt's
    token count with `chat_template_kwargs: {"enable_thinking": false}`, which closes the
    thoughts in the prompt (both servers render the template, then tokenize).
A pair that differs is reported with whether the joined text differs too (the two
servers' kernels round differently, so their greedy texts part on some prompts: that is
a decoding difference, not a split one). llama-server comes from
../shared/peer/llamacpp (`BIN` names its directory; built by its build.sh if missing).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "..", "shared", "peer", "llamacpp")
TEMPLATES = {
    "opened": "tests/fixtures/deepseek-r1-distill-qwen.jinja",
    "qwen3": "tests/fixtures/qwen3.jinja",
}


def post(port, body, stream=False):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        if not stream:
            return json.load(r)
        thoughts, content = [], []
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                thoughts.append(delta.get("reasoning_content") or "")
                content.append(delta.get("content") or "")
        return "".join(thoughts) or None, "".join(content) or None


def wait_ready(port, proc, limit=300):
    start = time.time()
    while time.time() - start < limit:
        if proc.poll() is not None:
            sys.exit(f"a server on port {port} exited at start")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"the server on port {port} did not come up")


def start(kind, model, template, port, tmp):
    log = open(os.path.join(tmp, f"{kind}-{port}.log"), "w")
    if kind == "suffixd":
        cmd = [os.path.join(ROOT, "target/release/suffixd"), "serve", "--model", model,
               "--chat-template", template, "--addr", f"127.0.0.1:{port}",
               "--snapshot-dir", os.path.join(tmp, f"store-{port}"), "--max-context", "4096"]
    else:
        cmd = ["bash", os.path.join(PEER, "serve.sh"), "plain", "--jinja",
               "--chat-template-file", template, "--reasoning-format", "deepseek"]
    env = dict(os.environ, PORT=str(port), MODEL=model)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    wait_ready(port, proc)
    return proc


def pair(message):
    return message.get("reasoning_content") or None, message.get("content") or None


def prompts(n):
    """User messages: the agentic workload's first stages and the chat workload's."""
    out = []
    for name in ["agentic", "chat"]:
        with open(os.path.join(ROOT, "tools/workloads", f"{name}.jsonl")) as f:
            for line in f:
                item = json.loads(line)
                text = item["stages"][0] if "stages" in item else item["messages"][-1]["content"]
                out.append(text)
    return out[:n]


def answers(port, texts, max_tokens, extra=None):
    """Each prompt's pair whole and streamed, and its prompt tokens."""
    rows = []
    for text in texts:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                "temperature": 0, **(extra or {})}
        whole = post(port, body)
        streamed = post(port, dict(body, stream=True), stream=True)
        rows.append({"whole": pair(whole["choices"][0]["message"]), "streamed": streamed,
                     "prompt_tokens": whole["usage"]["prompt_tokens"]})
    return rows


def joined(p):
    return "".join(x or "" for x in p).replace(" ", "").replace("\n", "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    bin_dir = os.environ.get("BIN", "/tmp/llamacpp-build/bin")
    if not os.path.exists(os.path.join(bin_dir, "llama-server")):
        subprocess.run(["bash", os.path.join(PEER, "build.sh")], check=True)
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    texts = prompts(args.prompts)
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, template in TEMPLATES.items():
            template = os.path.join(ROOT, template)
            rows = {}
            for kind, port in [("suffixd", 18631), ("llama", 18632)]:
                proc = start(kind, args.model, template, port, tmp)
                try:
                    rows[kind] = answers(port, texts, args.max_tokens)
                    if name == "qwen3":
                        closed = answers(port, texts[:3], 4,
                                         {"chat_template_kwargs": {"enable_thinking": False}})
                        rows[kind + "-closed"] = [r["prompt_tokens"] for r in closed]
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
            ours, theirs = rows["suffixd"], rows["llama"]
            same = sum(o["whole"] == t["whole"] for o, t in zip(ours, theirs))
            text_differs = sum(o["whole"] != t["whole"] and joined(o["whole"]) != joined(t["whole"])
                               for o, t in zip(ours, theirs))
            streamed_same = sum(o["streamed"] == o["whole"] for o in ours)
            peer_streamed_same = sum(t["streamed"] == t["whole"] for t in theirs)
            with_thoughts = sum(o["whole"][0] is not None for o in ours)
            entry = {
                "prompts": len(texts),
                "pairs_equal": same,
                "pairs_differing_with_different_text": text_differs,
                "suffixd_streamed_equals_whole": streamed_same,
                "llama_streamed_equals_whole": peer_streamed_same,
                "suffixd_answers_with_thoughts": with_thoughts,
                "prompt_tokens_equal": sum(o["prompt_tokens"] == t["prompt_tokens"]
                                           for o, t in zip(ours, theirs)),
                "differing": [{"prompt": texts[i][:60], "suffixd": o["whole"], "llama": t["whole"]}
                              for i, (o, t) in enumerate(zip(ours, theirs)) if o["whole"] != t["whole"]],
            }
            if name == "qwen3":
                entry["closed_prompt_tokens"] = {"suffixd": rows["suffixd-closed"],
                                                 "llama": rows["llama-closed"]}
            report[name] = entry
    print(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
