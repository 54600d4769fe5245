"""Run by tests/openai_client.rs: LangChain's ChatOpenAI (an agent framework from PyPI,
pinned in tools/requirements-tests.txt) drives a two-step tool loop against a running
`suffixd serve`: the model calls a tool, the tool's result goes back, the model answers.
Every check raises on failure; the last line printed is "all checks passed".

    target/py/bin/python tests/agent_framework.py --base-url http://127.0.0.1:PORT/v1
"""
import argparse
import json

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import OpenAI

parser = argparse.ArgumentParser()
parser.add_argument("--base-url", required=True)
args = parser.parse_args()
model = OpenAI(base_url=args.base_url, api_key="unused").models.list().data[0].id

calls = []


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    calls.append(city)
    return json.dumps({"city": city, "temperature_c": 18, "sky": "clear"})


llm = ChatOpenAI(base_url=args.base_url, api_key="unused", model=model, temperature=0, max_tokens=64, max_retries=0)
messages = [HumanMessage("What is the weather in Paris?")]

# Step 1: the model must call the tool (LangChain's bind_tools with a named choice).
ai = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
assert ai.tool_calls, ai
assert ai.tool_calls[0]["name"] == "get_weather", ai.tool_calls
assert isinstance(ai.tool_calls[0]["args"]["city"], str), ai.tool_calls
messages.append(ai)
for call in ai.tool_calls:
    messages.append(get_weather.invoke(call))
assert calls, "the tool ran"

# Step 2: with the result in the conversation, the model answers in text.
final = llm.bind_tools([get_weather], tool_choice="none").invoke(messages)
assert isinstance(final.content, str) and final.content.strip(), final
assert not final.tool_calls, final

# The same loop streamed: LangChain assembles the call from the deltas.
chunks = list(llm.bind_tools([get_weather], tool_choice="required").stream(messages[:1]))
merged = chunks[0]
for c in chunks[1:]:
    merged = merged + c
assert merged.tool_calls and merged.tool_calls[0]["name"] == "get_weather", merged
print("all checks passed")
