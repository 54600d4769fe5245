"""Run by tests/openai_client.rs: the official `openai` package against a running
`suffixd serve`, as an agent framework calls it. Every check raises on failure; the last
line printed is "all checks passed".

    target/py/bin/python tests/openai_client.py --base-url http://127.0.0.1:PORT/v1
"""
import argparse

import openai
from openai import OpenAI

parser = argparse.ArgumentParser()
parser.add_argument("--base-url", required=True)
args = parser.parse_args()

client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "Name three colors."}]

# Chat, plain and streamed: the same greedy text, with suffixd's figures as extra fields.
chat = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
text = chat.choices[0].message.content
assert text, chat
assert chat.usage.completion_tokens > 0, chat.usage
assert chat.model_extra["suffixd"]["steps"] > 0, chat.model_extra
streamed = "".join(
    c.choices[0].delta.content or ""
    for c in client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0, stream=True
    )
    if c.choices
)
assert streamed == text, (streamed, text)

# Log-probabilities, plain and streamed: one entry per token, the same either way; greedy
# tokens are their own most likely alternative.
lp = client.chat.completions.create(
    model=model, messages=messages, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2
)
content = lp.choices[0].logprobs.content
assert len(content) == lp.usage.completion_tokens, (len(content), lp.usage)
assert "".join(t.token for t in content) == lp.choices[0].message.content
for t in content:
    assert t.logprob <= 0 and len(t.top_logprobs) == 2, t
    assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob), t
streamed = [
    (t.token, t.logprob)
    for c in client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0, logprobs=True,
        top_logprobs=2, stream=True,
    )
    if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
    for t in c.choices[0].logprobs.content
]
assert streamed == [(t.token, t.logprob) for t in content], streamed

# Completions, with the legacy log-probabilities.
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2)
assert "".join(c.choices[0].logprobs.tokens) == c.choices[0].text, c.choices[0]
assert len(c.choices[0].logprobs.token_logprobs) == len(c.choices[0].logprobs.tokens)

# Several choices in one request.
several = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0.8, seed=5, n=2)
assert [c.index for c in several.choices] == [0, 1], several.choices

# A malformed request is the client's BadRequestError, naming the field.
try:
    client.chat.completions.create(model=model, messages=messages, top_logprobs=2)
    raise AssertionError("top_logprobs without logprobs was accepted")
except openai.BadRequestError as e:
    assert "top_logprobs" in str(e), e
print("all checks passed")
