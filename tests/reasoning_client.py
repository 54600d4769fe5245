"""Run by tests/openai_client.rs: the official `openai` package against a `suffixd serve`
whose chat template is a thinking model's. Every check raises on failure; the last line
printed is "all checks passed".

    --template opened: DeepSeek-R1's distillations' template (the prompt opens the
        thoughts): the answer starts inside them, and goes out as `reasoning_content`,
        whole and streamed alike.
    --template inline: the same, served with `--reasoning-format none`: the thoughts
        are content.
    --template qwen3: Qwen 3's (the model may open them): `chat_template_kwargs`
        reaches the template (`enable_thinking`), a tool loop's thoughts go back into
        the prompt, and an answer without thoughts is all content.

    target/py/bin/python tests/reasoning_client.py --base-url URL --template opened
"""
import argparse

import openai
from openai import OpenAI

parser = argparse.ArgumentParser()
parser.add_argument("--base-url", required=True)
parser.add_argument("--template", choices=["opened", "inline", "qwen3"], required=True)
args = parser.parse_args()

client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "Name three colors."}]


def reasoning(message_or_delta):
    """The thoughts a message or delta carries (an extra field to the openai package)."""
    return (message_or_delta.model_extra or {}).get("reasoning_content")


if args.template == "opened":
    # The 135M model never closes thoughts it did not learn: cut off by max_tokens, the
    # whole answer is thoughts, and there is no content.
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0
    )
    message = whole.choices[0].message
    thoughts = reasoning(message)
    assert thoughts and thoughts == thoughts.strip(), message
    assert "<think>" not in thoughts and "</think>" not in thoughts, thoughts
    assert message.content is None, message
    assert whole.choices[0].finish_reason == "length", whole.choices[0]
    # All of the answer's tokens are thoughts, and the usage says so.
    usage = whole.usage
    assert 0 < usage.completion_tokens_details.reasoning_tokens <= usage.completion_tokens, usage
    # Streamed: the same thoughts, in pieces, and no content; the same usage.
    pieces, content, streamed_usage = [], [], None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ):
        streamed_usage = chunk.usage or streamed_usage
        if chunk.choices:
            delta = chunk.choices[0].delta
            pieces.append(reasoning(delta) or "")
            content.append(delta.content or "")
    assert "".join(pieces) == thoughts, (pieces, thoughts)
    details = lambda u: (u.completion_tokens, u.completion_tokens_details.reasoning_tokens)
    assert details(streamed_usage) == details(usage), (streamed_usage, usage)
    assert len([p for p in pieces if p]) > 1, pieces
    assert "".join(content) == "", content
elif args.template == "inline":
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0
    )
    message = whole.choices[0].message
    assert message.content and reasoning(message) is None, message
    # Thoughts served as content are not counted as reasoning.
    assert whole.usage.completion_tokens_details.reasoning_tokens == 0, whole.usage
else:
    # `enable_thinking: false` closes the thoughts in the prompt, which grows by them.
    base = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0
    )
    closed = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert closed.usage.prompt_tokens > base.usage.prompt_tokens, (closed.usage, base.usage)
    # `reasoning_effort: "none"` (OpenAI's "do not reason") closes them alike; other
    # efforts leave the template's default; the request's own variable wins.
    def prompt_tokens(**extra):
        return client.chat.completions.create(
            model=model, messages=messages, max_tokens=1, temperature=0, **extra
        ).usage.prompt_tokens
    assert prompt_tokens(reasoning_effort="none") == closed.usage.prompt_tokens
    assert prompt_tokens(reasoning_effort="high") == base.usage.prompt_tokens
    opened = {"chat_template_kwargs": {"enable_thinking": True}}
    assert prompt_tokens(reasoning_effort="none", extra_body=opened) == base.usage.prompt_tokens
    # The Responses API's `reasoning.effort` is the same setting.
    for effort, expected in [("none", closed), ("low", base)]:
        r = client.responses.create(model=model, input=messages[0]["content"], reasoning={"effort": effort},
                                    max_output_tokens=1, temperature=0, store=False)
        assert r.usage.input_tokens == expected.usage.prompt_tokens, (effort, r.usage, expected.usage)
    for bad in [dict(reasoning_effort="extreme"), dict(extra_body={"reasoning_effort": 3})]:
        try:
            prompt_tokens(**bad)
            raise AssertionError(f"{bad} was accepted")
        except openai.BadRequestError as e:
            assert e.param == "reasoning_effort", e
    # The model answered without thoughts: all of it is content.
    assert base.choices[0].message.content, base.choices[0].message
    assert reasoning(base.choices[0].message) is None, base.choices[0].message
    assert base.usage.completion_tokens_details.reasoning_tokens == 0, base.usage
    # A tool loop's thoughts go back into the prompt (Qwen 3 shows those since the last
    # user message), as the answers' `reasoning_content`.
    call = {"id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
    loop = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
    ]
    plain = client.chat.completions.create(model=model, messages=loop, max_tokens=4)
    loop[1]["reasoning_content"] = "I should add them with the tool."
    thought = client.chat.completions.create(model=model, messages=loop, max_tokens=4)
    assert thought.usage.prompt_tokens > plain.usage.prompt_tokens + 4, thought.usage
    # A call asked for may follow thoughts: read from after them, never content.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    for stream in [False, True]:
        asked = dict(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                     tools=tools, tool_choice="required", max_tokens=96, temperature=0)
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **asked))
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            names = [t.function.name for c in chunks if c.choices
                     for t in c.choices[0].delta.tool_calls or [] if t.function.name]
        else:
            choice = client.chat.completions.create(**asked).choices[0]
            finish, content = choice.finish_reason, choice.message.content or ""
            names = [t.function.name for t in choice.message.tool_calls or []]
        assert "<tool_call>" not in content and "<think>" not in content, content
        assert (finish, names) in [("tool_calls", ["get_weather"]), ("length", [])], (finish, names)
    # Variables the server sets cannot be replaced.
    try:
        client.chat.completions.create(
            model=model, messages=messages, max_tokens=4,
            extra_body={"chat_template_kwargs": {"add_generation_prompt": False}},
        )
        raise AssertionError("a reserved template variable was accepted")
    except openai.BadRequestError as e:
        assert "add_generation_prompt" in str(e), e

print("all checks passed")
