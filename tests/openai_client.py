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

# Bias and penalties as the client sends them: one token biased by +100 is the whole
# greedy answer; a frequency penalty and vLLM's repetition_penalty (extra_body) change a
# listing answer; a penalty out of range is BadRequestError naming the field.
forced = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0, logit_bias={"1000": 100}, logprobs=True
)
tokens = [t.token for t in forced.choices[0].logprobs.content]
assert len(tokens) == 12 and len(set(tokens)) == 1, tokens
listing = [{"role": "user", "content": "List ten colors, one per line, numbered."}]
plain = client.chat.completions.create(model=model, messages=listing, max_tokens=48, temperature=0)
for extra in [{"frequency_penalty": 1.5}, {"extra_body": {"repetition_penalty": 1.5}}]:
    penalised = client.chat.completions.create(model=model, messages=listing, max_tokens=48, temperature=0, **extra)
    assert penalised.choices[0].message.content != plain.choices[0].message.content, (extra, penalised)
try:
    client.chat.completions.create(model=model, messages=messages, frequency_penalty=3)
    raise AssertionError("frequency_penalty 3 was accepted")
except openai.BadRequestError as e:
    assert "frequency_penalty" in str(e), e

# A malformed request is the client's BadRequestError, naming the field.
try:
    client.chat.completions.create(model=model, messages=messages, top_logprobs=2)
    raise AssertionError("top_logprobs without logprobs was accepted")
except openai.BadRequestError as e:
    assert "top_logprobs" in str(e), e

# Tools: a named choice and `required` hold decoding to a valid call, which the client
# reads as tool_calls; streamed, the call arrives as tool-call deltas.
import json

from pydantic import BaseModel, Field

weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
for choice in [{"type": "function", "function": {"name": "get_weather"}}, "required"]:
    r = client.chat.completions.create(
        model=model, messages=ask, tools=[weather, clock], tool_choice=choice, max_tokens=64, temperature=0,
        parallel_tool_calls=False,
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", r
    assert len(msg.tool_calls) == 1, msg
    call = msg.tool_calls[0]
    assert isinstance(call.id, str) and call.id and call.type == "function", call
    args = json.loads(call.function.arguments)
    if choice != "required":
        assert call.function.name == "get_weather", call
    if call.function.name == "get_weather":
        assert isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit"), args

deltas = [
    c.choices[0].delta.tool_calls
    for c in client.chat.completions.create(
        model=model, messages=ask, tools=[weather], tool_choice="required", max_tokens=64, temperature=0,
        parallel_tool_calls=False, stream=True,
    )
    if c.choices and c.choices[0].delta.tool_calls
]
# As OpenAI streams a call: its id and name first (arguments ""), then the arguments
# in fragments that add up to the whole answer's arguments.
flat = [tc for chunk in deltas for tc in chunk]
head = flat[0]
assert isinstance(head.id, str) and head.id and head.function.name == "get_weather", flat
assert head.function.arguments == "" and len(flat) >= 2, flat
assert all(tc.index == 0 and tc.id is None and tc.function.name is None for tc in flat[1:]), flat
whole = client.chat.completions.create(
    model=model, messages=ask, tools=[weather], tool_choice="required", max_tokens=64, temperature=0,
    parallel_tool_calls=False,
)
streamed_args = "".join(tc.function.arguments for tc in flat[1:])
assert streamed_args == whole.choices[0].message.tool_calls[0].function.arguments, (flat, whole)
assert json.loads(streamed_args)["city"], streamed_args

# `auto`: the model may answer or call; either is well-formed.
r = client.chat.completions.create(model=model, messages=ask, tools=[weather], max_tokens=48, temperature=0)
msg = r.choices[0].message
assert (msg.content is not None) or msg.tool_calls, msg
for call in msg.tool_calls or []:
    json.loads(call.function.arguments)

# A tool-result turn: the earlier call and its result go back through the template.
first = client.chat.completions.create(
    model=model, messages=ask, tools=[weather], tool_choice="required", max_tokens=64, temperature=0,
    parallel_tool_calls=False,
)
call = first.choices[0].message.tool_calls[0]
turn = ask + [
    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
]
answer = client.chat.completions.create(model=model, messages=turn, tools=[weather], tool_choice="none", max_tokens=32, temperature=0)
assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls, answer
alone = client.chat.completions.create(model=model, messages=ask, tools=[weather], tool_choice="none", max_tokens=1)
assert answer.usage.prompt_tokens > alone.usage.prompt_tokens + 20, (answer.usage, alone.usage)

# Structured outputs: a Pydantic model through `parse`, and a strict json_schema.
class City(BaseModel):
    # Bounds keep a small model's strings from running to max_tokens.
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population: int = Field(ge=0, le=10**9)

parsed = client.chat.completions.parse(
    model=model, messages=[{"role": "user", "content": "Give me facts about Paris as JSON."}],
    response_format=City, max_tokens=96, temperature=0,
)
city = parsed.choices[0].message.parsed
assert isinstance(city, City) and city.name, parsed
strict = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "List two fruits."}], max_tokens=64, temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "fruits", "strict": True, "schema": {
        "type": "object", "properties": {"fruits": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}},
        "required": ["fruits"], "additionalProperties": False}}},
)
fruits = json.loads(strict.choices[0].message.content)
assert set(fruits) == {"fruits"} and len(fruits["fruits"]) == 2, fruits
obj = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Describe a cat."}], max_tokens=48, temperature=0,
    response_format={"type": "json_object"}, stream=True,
)
text = "".join(c.choices[0].delta.content or "" for c in obj if c.choices)
assert isinstance(json.loads(text), dict), text

# Tools as Pydantic writes them: a nested model and an Enum under `$defs`, through
# `openai.pydantic_function_tool` (strict), and a hand-written object without
# `additionalProperties` (closed by the server), with a forced call: one call that
# validates, no markup in the content.
from enum import Enum
from typing import Literal, Union


class Priority(str, Enum):
    low = "low"
    high = "high"


class Assignee(BaseModel):
    name: str = Field(max_length=20)


class CreateTicket(BaseModel):
    title: str = Field(max_length=40)
    priority: Priority
    assignee: Assignee


ticket_tool = openai.pydantic_function_tool(CreateTicket)
assert "$defs" in json.dumps(ticket_tool), ticket_tool
ticket_ask = [{"role": "user", "content": "Open a high-priority ticket for Ana: the printer is broken."}]
r = client.chat.completions.parse(
    model=model, messages=ticket_ask, tools=[ticket_tool], tool_choice="required", max_tokens=96, temperature=0,
)
msg = r.choices[0].message
assert r.choices[0].finish_reason == "tool_calls" and len(msg.tool_calls) == 1, r
assert isinstance(msg.tool_calls[0].function.parsed_arguments, CreateTicket), msg
assert not msg.content, msg
loose = {"type": "function", "function": {"name": "add_note", "parameters": {
    "type": "object", "properties": {"note": {"type": "string", "maxLength": 40}}, "required": ["note"]}}}
# The README's example: parallel calls allowed (the default), one call comes back.
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Note that the printer is broken."}], tools=[loose],
    tool_choice="required", max_tokens=128, temperature=0,
)
calls = r.choices[0].message.tool_calls
assert len(calls) == 1 and set(json.loads(calls[0].function.arguments)) == {"note"}, r
# A call cut off by max_tokens: finish_reason "length", and no markup in the content.
for stream in (False, True):
    if stream:
        chunks = list(client.chat.completions.create(
            model=model, messages=ticket_ask, tools=[ticket_tool], tool_choice="required", max_tokens=12,
            temperature=0, stream=True,
        ))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["length"], chunks
    else:
        r = client.chat.completions.create(
            model=model, messages=ticket_ask, tools=[ticket_tool], tool_choice="required", max_tokens=12,
            temperature=0,
        )
        content = r.choices[0].message.content or ""
        assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls, r
    assert "tool_call" not in content, content


# A discriminated union (Pydantic writes `oneOf` with a discriminator) as a response format.
class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    breed: str = Field(max_length=20)


class Pet(BaseModel):
    pet: Union[Cat, Dog] = Field(discriminator="kind")


assert "oneOf" in json.dumps(Pet.model_json_schema()), Pet.model_json_schema()
pet = client.chat.completions.parse(
    model=model, messages=[{"role": "user", "content": "Describe a pet as JSON."}], response_format=Pet,
    max_tokens=64, temperature=0,
)
assert isinstance(pet.choices[0].message.parsed, Pet), pet

# A schema the engine cannot use is a BadRequestError that names it.
try:
    client.chat.completions.create(
        model=model, messages=messages, max_tokens=8,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "colour"}}},
    )
    raise AssertionError("an invalid schema was accepted")
except openai.BadRequestError as e:
    assert "colour" in str(e), e

# Predicted Outputs: the prediction is drafted from, never forced. Each request has a
# namespace of its own (`user`), so the learned cache cannot draft the answer instead.
poem = [{"role": "user", "content": "Write a short poem about the sea."}]
plain = client.chat.completions.create(model=model, messages=poem, max_tokens=48, temperature=0, user="predict-a")
answer = plain.choices[0].message.content
assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0, plain.usage
predicted = client.chat.completions.create(
    model=model, messages=poem, max_tokens=48, temperature=0, user="predict-b",
    prediction={"type": "content", "content": answer},
)
assert predicted.choices[0].message.content == answer, (predicted, answer)
details = predicted.usage.completion_tokens_details
assert details.accepted_prediction_tokens >= predicted.usage.completion_tokens // 2, predicted.usage
assert predicted.model_extra["suffixd"]["steps"] < plain.model_extra["suffixd"]["steps"], (predicted, plain)
# A wrong prediction costs verification rows, never the answer.
wrong = client.chat.completions.create(
    model=model, messages=poem, max_tokens=48, temperature=0, user="predict-c",
    prediction={"type": "content", "content": [{"type": "text", "text": "Quarterly tax forms, filed in triplicate."}]},
)
assert wrong.choices[0].message.content == answer, (wrong, answer)
try:
    client.chat.completions.create(model=model, messages=poem, max_tokens=8, prediction={"type": "text"})
    raise AssertionError("a malformed prediction was accepted")
except openai.BadRequestError as e:
    assert e.param == "prediction", e
print("all checks passed")
