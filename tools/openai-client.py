#!/usr/bin/env python3
"""Talk to a running `suffixd serve` with the official `openai` Python package.

    python3 -m pip install openai
    tools/openai-client.py [--base-url http://127.0.0.1:8080/v1]

Runs a completion, a chat completion and a streamed chat completion, and prints them
with suffixd's speculation figures. Exits non-zero if any call fails.
"""
import argparse

from openai import OpenAI

parser = argparse.ArgumentParser()
parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
args = parser.parse_args()

client = OpenAI(base_url=args.base_url, api_key="unused")
model = client.models.list().data[0].id
print("model:", model)

c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=12, temperature=0)
print("completion:", repr(c.choices[0].text), c.usage)

chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=24, temperature=0
)
print("chat:", repr(chat.choices[0].message.content), "suffixd:", chat.model_extra.get("suffixd"))

streamed = ""
for chunk in client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=24, temperature=0, stream=True
):
    if chunk.choices and chunk.choices[0].delta.content:
        streamed += chunk.choices[0].delta.content
print("streamed:", repr(streamed))
assert streamed == chat.choices[0].message.content, "streamed and plain greedy answers differ"
print("ok")
