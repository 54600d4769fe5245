"""Run by tests/openai_client.rs: the Responses API (`/v1/responses`) through the
official `openai` package (its typed responses and its `responses.stream()` helper,
which checks the events' order and identities) and through the OpenAI Agents SDK on
its default path (a model named by string: the Responses API). Every check raises on
failure; the last line printed is "all checks passed".

    --template plain (the default model's template): text, instructions, the stream,
        log-probabilities, a tool loop whole and streamed, a typed output, stored
        responses continued by `previous_response_id`, read and deleted, refusals,
        and the Agents SDK's runs (one chaining its turns by response id).
    --template opened (DeepSeek-R1's distillations' template, whose prompt opens the
        thoughts): the thoughts come out as a reasoning item, whole and streamed alike,
        counted as reasoning tokens.

    target/py/bin/python tests/responses_client.py --base-url URL --template plain
"""
import argparse
import asyncio
import json

import openai
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel, Field

parser = argparse.ArgumentParser()
parser.add_argument("--base-url", required=True)
parser.add_argument("--template", choices=["plain", "opened"], default="plain")
args = parser.parse_args()

client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
model = client.models.list().data[0].id
ASK = "Name three colors."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def streamed(**request):
    """A streamed response through the SDK's helper: its events and final response."""
    with client.responses.stream(model=model, **request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events))), numbers
    assert events[0].type == "response.created", events[0]
    assert events[1].type == "response.in_progress", events[1]
    assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    return events, final


def same_output(a, b):
    """Two responses' output items, ids and call ids aside (calls get fresh ids), and
    what the stream helper adds (`parsed`, `parsed_arguments`) aside."""
    strip = lambda r: [
        {k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "call_id", "parsed_arguments")}
        for item in r.output
    ]
    assert strip(a) == strip(b), (strip(a), strip(b))


if args.template == "opened":
    whole = client.responses.create(model=model, input=ASK, max_output_tokens=48, temperature=0)
    kinds = [item.type for item in whole.output]
    assert kinds[0] == "reasoning", kinds
    thoughts = whole.output[0].content[0].text
    assert thoughts and "<think>" not in thoughts and "</think>" not in thoughts, thoughts
    usage = whole.usage
    assert 0 < usage.output_tokens_details.reasoning_tokens <= usage.output_tokens, usage
    # The chat endpoint gives the same thoughts as `reasoning_content`.
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": ASK}], max_tokens=48, temperature=0
    )
    assert chat.choices[0].message.reasoning_content == thoughts, chat
    # Cut while thinking, the stream ends with `response.incomplete`, which the SDK's
    # helper does not finish on: the raw stream, then.
    events = list(client.responses.create(model=model, input=ASK, max_output_tokens=48, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == ("response.incomplete" if whole.status == "incomplete" else "response.completed")
    final = events[-1].response
    # The same counts (the prefix cache serves the repeated prompt's start now).
    counts = lambda u: (u.input_tokens, u.output_tokens, u.output_tokens_details.reasoning_tokens)
    assert counts(final.usage) == counts(whole.usage), (final.usage, whole.usage)
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == thoughts, (deltas, thoughts)
    same_output(final, whole)
    print("all checks passed")
    raise SystemExit(0)

# Text: the same answer as the chat endpoint gives the same conversation.
whole = client.responses.create(
    model=model, instructions="Answer briefly.", input=ASK, max_output_tokens=24, temperature=0
)
chat = client.chat.completions.create(
    model=model,
    messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": ASK}],
    max_tokens=24,
    temperature=0,
)
assert whole.output_text and whole.output_text == chat.choices[0].message.content, (whole, chat)
cut = chat.choices[0].finish_reason == "length"
assert whole.status == ("incomplete" if cut else "completed"), whole
assert whole.output[-1].status == whole.status, whole.output
assert (whole.incomplete_details is not None) == cut, whole
assert whole.usage.input_tokens == chat.usage.prompt_tokens, (whole.usage, chat.usage)
assert whole.usage.output_tokens == chat.usage.completion_tokens, (whole.usage, chat.usage)
assert whole.instructions == "Answer briefly." and whole.store is True, whole

# The stream: deltas that make the text, and the whole response's output at the end.
events, final = streamed(instructions="Answer briefly.", input=ASK, max_output_tokens=24, temperature=0)
text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
assert text == whole.output_text == final.output_text, (text, whole.output_text)
same_output(final, whole)
kinds = [e.type for e in events]
for kind in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
             "response.content_part.done", "response.output_item.done"):
    assert kind in kinds, (kind, kinds)

# Log-probabilities: one per token, with the alternatives asked for.
with_logprobs = client.responses.create(
    model=model, input=ASK, max_output_tokens=12, temperature=0,
    include=["message.output_text.logprobs"], top_logprobs=2,
)
logprobs = with_logprobs.output[0].content[0].logprobs
assert len(logprobs) == with_logprobs.usage.output_tokens, (len(logprobs), with_logprobs.usage)
assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in logprobs), logprobs

# A tool loop: a forced call, its output sent back with the call, then a text answer.
question = [{"role": "user", "content": "What is the weather in Paris?"}]
called = client.responses.create(
    model=model, input=question, tools=[WEATHER], tool_choice="required", max_output_tokens=64, temperature=0
)
calls = [item for item in called.output if item.type == "function_call"]
assert calls and calls[0].name == "get_weather", called.output
assert isinstance(json.loads(calls[0].arguments)["city"], str), calls[0].arguments
assert called.status == "completed", called
loop = question + [item.model_dump() for item in called.output] + [
    {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"temperature_c": 18})}
]
answered = client.responses.create(
    model=model, input=loop, tools=[WEATHER], tool_choice="none", max_output_tokens=32, temperature=0
)
assert answered.output_text and not any(i.type == "function_call" for i in answered.output), answered.output

# The same call streamed: its arguments as deltas, the same items at the end.
events, final = streamed(input=question, tools=[WEATHER], tool_choice="required", max_output_tokens=64, temperature=0)
arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
assert arguments == calls[0].arguments, (arguments, calls[0].arguments)
same_output(final, called)


# A typed output: the SDK sends the model's JSON schema and parses the answer.
class Colors(BaseModel):
    colors: list[str] = Field(max_length=3)


parsed = client.responses.parse(model=model, input=ASK, text_format=Colors, max_output_tokens=64, temperature=0)
assert isinstance(parsed.output_parsed, Colors), parsed

# Stored responses: continued by id, the same answer as the whole conversation sent
# again (instructions are not carried over, as at OpenAI); read back, deleted.
first = client.responses.create(
    model=model, instructions="Answer briefly.", input="My name is Ada. Say hi.", max_output_tokens=16, temperature=0
)
follow = client.responses.create(
    model=model, previous_response_id=first.id, input="What is my name?", max_output_tokens=16, temperature=0
)
resent = client.responses.create(
    model=model,
    store=False,
    input=[{"role": "user", "content": "My name is Ada. Say hi."}]
    + [item.model_dump(exclude_none=True) for item in first.output]
    + [{"role": "user", "content": "What is my name?"}],
    max_output_tokens=16,
    temperature=0,
)
assert follow.previous_response_id == first.id and follow.store and not resent.store, (follow, resent)
assert follow.output_text == resent.output_text, (follow.output_text, resent.output_text)
assert follow.usage.input_tokens == resent.usage.input_tokens, (follow.usage, resent.usage)
assert client.responses.retrieve(first.id).output_text == first.output_text
# Kept items by reference (as the Vercel AI SDK and Codex send earlier items): the same.
referenced = client.responses.create(
    model=model,
    store=False,
    input=[{"role": "user", "content": "My name is Ada. Say hi."}]
    + [{"type": "item_reference", "id": item.id} for item in first.output]
    + [{"role": "user", "content": "What is my name?"}],
    max_output_tokens=16,
    temperature=0,
)
assert referenced.output_text == resent.output_text, (referenced.output_text, resent.output_text)
# A streamed response is kept by the time its last event arrives.
events = list(client.responses.create(
    model=model, previous_response_id=follow.id, input="Thanks.", max_output_tokens=8, temperature=0, stream=True
))
final = events[-1].response
assert final.previous_response_id == follow.id and final.store, final
assert client.responses.retrieve(final.id).output == final.output, final
# Its input items: the conversation before it, then its own input, read through the
# client's pager (two at a time: the pages follow each other by the last item's id).
oldest = list(client.responses.input_items.list(final.id, order="asc", limit=2))
newest = list(client.responses.input_items.list(final.id))
assert [i.id for i in newest] == [i.id for i in reversed(oldest)], (oldest, newest)
assert len({i.id for i in oldest}) == len(oldest) == 3 + len(first.output) + len(follow.output), oldest
said = [i.content[0].text for i in oldest if i.type == "message" and i.role == "user"]
assert said == ["My name is Ada. Say hi.", "What is my name?", "Thanks."], said
assert [i.id for i in oldest[1 : 1 + len(first.output)]] == [i.id for i in first.output], oldest
before = [i.id for i in client.responses.input_items.list(follow.id, order="asc")]
assert before == [i.id for i in oldest[: len(before)]], (before, oldest)
# A listed item by reference is the item (the first user turn, sent without an id).
asked = dict(model=model, store=False, max_output_tokens=8, temperature=0)
by_reference = client.responses.create(input=[{"type": "item_reference", "id": oldest[0].id}], **asked)
direct = client.responses.create(input="My name is Ada. Say hi.", **asked)
assert by_reference.usage.input_tokens == direct.usage.input_tokens, (by_reference.usage, direct.usage)
assert by_reference.output_text == direct.output_text, (by_reference.output_text, direct.output_text)
client.responses.delete(first.id)
try:
    client.responses.retrieve(first.id)
except openai.NotFoundError:
    pass
else:
    raise AssertionError("a deleted response was read back")
try:
    client.responses.create(model=model, previous_response_id=first.id, input="x")
except openai.BadRequestError as e:
    assert e.code == "previous_response_not_found" and e.param == "previous_response_id", e
else:
    raise AssertionError("a deleted response was continued")
# Deleting the first leaves the conversations that continued it whole.
assert client.responses.create(model=model, previous_response_id=follow.id, input="x", max_output_tokens=4).status

# What cannot be served is refused, by name.
for bad, needle in [
    ({"conversation": "conv_1"}, "conversation"),
    ({"input": [{"type": "item_reference", "id": "msg_unknown_0"}]}, "does not keep"),
    ({"tools": [{"type": "web_search"}]}, "web_search"),
    ({"extra_body": {"temprature": 0}}, "temprature"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]}, "input_image"),
]:
    request = {"model": model, "input": ASK, **bad}
    try:
        client.responses.create(**request)
    except openai.BadRequestError as e:
        assert needle in str(e), (needle, str(e))
    else:
        raise AssertionError(f"{bad} was not refused")

# The OpenAI Agents SDK on its default path: a model named by string, served through
# the Responses API by the default client.
from agents import Agent, ModelSettings, RunConfig, Runner, ToolsToFinalOutputResult, function_tool
from agents import set_default_openai_client, set_tracing_disabled

set_tracing_disabled(True)
set_default_openai_client(AsyncOpenAI(base_url=args.base_url, api_key="unused", max_retries=0))
asked = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    asked.append(city)
    return json.dumps({"city": city, "temperature_c": 18})


class Summary(BaseModel):
    sentence: str = Field(max_length=60)


settings = dict(temperature=0, max_tokens=64)
tool_agent = Agent(
    name="weather",
    instructions="You report the weather.",
    model=model,
    tools=[get_weather],
    model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, **settings),
    tool_use_behavior="stop_on_first_tool",
)
summary_agent = Agent(name="summary", model=model, output_type=Summary, model_settings=ModelSettings(**settings))
config = RunConfig(tracing_disabled=True)


def second_call_ends(context, results):
    """Ends the run at its second tool call: two model calls, the second chained."""
    done = len(asked) >= 4
    return ToolsToFinalOutputResult(is_final_output=done, final_output=results[-1].output if done else None)


chaining_agent = tool_agent.clone(tool_use_behavior=second_call_ends, reset_tool_choice=False)


async def sdk_runs():
    called = await Runner.run(tool_agent, "Weather in Paris?", max_turns=2, run_config=config)
    summarised = await Runner.run(summary_agent, "Summarise: the printer is broken.", max_turns=1, run_config=config)
    streamed_run = Runner.run_streamed(tool_agent, "Weather in Rome?", max_turns=2, run_config=config)
    async for _ in streamed_run.stream_events():
        pass
    # The SDK's response chaining: the second model call sends only the tool's output,
    # after `previous_response_id`.
    chained = await Runner.run(
        chaining_agent, "Weather in Oslo?", max_turns=3, auto_previous_response_id=True, run_config=config
    )
    return called, summarised, streamed_run, chained


called, summarised, streamed_run, chained = asyncio.run(sdk_runs())
assert len(asked) == 4, asked
first_call, second_call = chained.raw_responses
assert client.responses.retrieve(second_call.response_id).previous_response_id == first_call.response_id
assert second_call.usage.input_tokens > first_call.usage.input_tokens, (first_call.usage, second_call.usage)
assert json.loads(called.final_output)["temperature_c"] == 18, called.final_output
assert json.loads(streamed_run.final_output)["temperature_c"] == 18, streamed_run.final_output
assert isinstance(summarised.final_output, Summary), summarised.final_output
print(f"the Agents SDK called get_weather({asked[0]!r}), ({asked[1]!r}); summary: {summarised.final_output!r}")
print("all checks passed")
