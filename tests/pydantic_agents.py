"""Run by tests/openai_client.rs: two more agent frameworks from PyPI (pinned in
tools/requirements-tests.txt) against a running `suffixd serve`, each on its default
path with a tool whose arguments are a nested Pydantic model (an Enum and a sub-model
under `$defs`) and a structured output type:

- pydantic-ai's Agent over its OpenAI chat model;
- the OpenAI Agents SDK's Runner over its chat-completions model.

Every check raises on failure; the last line printed is "all checks passed".

    target/py/bin/python tests/pydantic_agents.py --base-url http://127.0.0.1:PORT/v1
"""
import argparse
import asyncio
from enum import Enum

from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel, Field

parser = argparse.ArgumentParser()
parser.add_argument("--base-url", required=True)
args = parser.parse_args()
model_id = OpenAI(base_url=args.base_url, api_key="unused").models.list().data[0].id


class Priority(str, Enum):
    low = "low"
    high = "high"


class Assignee(BaseModel):
    name: str = Field(max_length=20)


class Ticket(BaseModel):
    title: str = Field(max_length=40)
    priority: Priority
    assignee: Assignee


class Summary(BaseModel):
    """What was done: a short sentence and the ticket's title."""

    sentence: str = Field(max_length=60)
    ticket_title: str = Field(max_length=40)


opened: list[Ticket] = []


def open_ticket(ticket: Ticket) -> str:
    """Open a support ticket."""
    opened.append(ticket)
    return f"ticket #{len(opened)} opened"


ASK = "Open a high-priority ticket for Ana: the printer is broken. Then summarise."

# pydantic-ai: the agent calls the tool (its arguments validated as a Ticket by the
# framework), gets the result, and ends with a Summary (its output tool).
from pydantic_ai import Agent, ModelSettings
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

model = OpenAIChatModel(model_id, provider=OpenAIProvider(base_url=args.base_url, api_key="unused"))
agent = Agent(
    model,
    output_type=Summary,
    tools=[open_ticket],
    model_settings=ModelSettings(temperature=0, max_tokens=128),
    retries=2,
)
result = agent.run_sync(ASK)
assert isinstance(result.output, Summary), result
# A 135M model may skip the tool and go straight to the output; each call it makes
# validates (a failed validation would have been retried, then raised).
assert all(isinstance(t, Ticket) for t in opened), opened
pydantic_ai_calls = len(opened)

# The OpenAI Agents SDK over chat completions: the same tool, forced, with the tool's
# result as the run's answer; then the output type alone (the SDK sends it as a strict
# json_schema response format). A 135M model offered both at once keeps calling the
# tool, so each path runs on its own.
from agents import Agent as SdkAgent
from agents import ModelSettings as SdkSettings
from agents import OpenAIChatCompletionsModel, RunConfig, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)
sdk_model = OpenAIChatCompletionsModel(model_id, AsyncOpenAI(base_url=args.base_url, api_key="unused"))
settings = SdkSettings(temperature=0, max_tokens=128)
tool_agent = SdkAgent(
    name="support",
    instructions="You open support tickets.",
    model=sdk_model,
    tools=[function_tool(open_ticket)],
    model_settings=SdkSettings(temperature=0, max_tokens=128, tool_choice="required", parallel_tool_calls=False),
    tool_use_behavior="stop_on_first_tool",
)
summary_agent = SdkAgent(name="summary", model=sdk_model, output_type=Summary, model_settings=settings)
config = RunConfig(tracing_disabled=True)


async def sdk_runs():
    # One event loop for both runs: the client's connections belong to it.
    called = await Runner.run(tool_agent, ASK, max_turns=2, run_config=config)
    summarised = await Runner.run(summary_agent, ASK, max_turns=1, run_config=config)
    return called, summarised


before = len(opened)
called, summarised = asyncio.run(sdk_runs())
assert len(opened) == before + 1 and isinstance(opened[-1], Ticket), opened
assert called.final_output == f"ticket #{len(opened)} opened", called.final_output
assert isinstance(summarised.final_output, Summary), summarised.final_output
print(f"pydantic-ai made {pydantic_ai_calls} call(s); the Agents SDK made 1: {opened[-1]!r}")
print("all checks passed")
