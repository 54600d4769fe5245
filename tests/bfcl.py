"""Run by tests/bfcl.rs: the Berkeley Function Calling Leaderboard's cases (PyPI
`bfcl-eval`, installed without its dependencies by tools/setup.sh for its data
directory and its AST checker) through a running `suffixd serve`, with the official
openai client, a forced call (`tool_choice: "required"`) and greedy decoding.

Each case's functions are mapped to JSON Schema as BFCL maps them for OpenAI-style
models (`_cast_to_openai_type` below is BFCL's, copied because importing its module
pulls in every provider's SDK; dots in names become `_`). For every case it records:

- the HTTP status (a 5xx, or a 400 saying the grammar engine could not run, is a
  failure of suffixd's, reported as such);
- whether every call's arguments parse as JSON and validate against the tool's schema;
- whether the calls match one of BFCL's possible answers, by BFCL's own `ast_checker`.

It writes one JSON line per case to --out and prints a summary line; with --expect it
also compares each case's calls with another run's (for example `--no-spec`'s) and
counts the differences. The checks that must hold are the Rust test's to make.

    target/py/bin/python tests/bfcl.py --base-url http://127.0.0.1:PORT/v1 --out run.jsonl
"""
import argparse
import copy
import json
import re
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bfcl_eval
import jsonschema
from openai import APIStatusError, OpenAI

CATEGORIES = ["live_simple", "live_multiple", "simple_python", "live_parallel"]
MODEL_NAME = "suffixd"

# BFCL's AST checker looks its model up in a table built from every provider's handler;
# the one property it reads is whether the model's names had their dots replaced.
sys.modules["bfcl_eval.constants.model_config"] = types.SimpleNamespace(
    MODEL_CONFIG_MAPPING={MODEL_NAME: types.SimpleNamespace(underscore_to_dot=True)}
)
from bfcl_eval.constants.enums import Language  # noqa: E402
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI  # noqa: E402
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker  # noqa: E402

DATA = Path(bfcl_eval.__file__).parent / "data"


def _cast_to_openai_type(properties, mapping):
    """BFCL's own (bfcl_eval/model_handler/utils.py, 2026.3.23)."""
    for key, value in properties.items():
        if "type" not in value:
            properties[key]["type"] = "string"
        else:
            var_type = value["type"]
            if mapping == GORILLA_TO_OPENAPI and var_type == "float":
                properties[key]["format"] = "float"
                properties[key]["description"] += " This is a float type value."
            if var_type in mapping:
                properties[key]["type"] = mapping[var_type]
            else:
                properties[key]["type"] = "string"
        if properties[key]["type"] == "array" or properties[key]["type"] == "object":
            if "properties" in properties[key]:
                properties[key]["properties"] = _cast_to_openai_type(
                    properties[key]["properties"], mapping
                )
            elif "items" in properties[key]:
                properties[key]["items"]["type"] = mapping[properties[key]["items"]["type"]]
                if (
                    properties[key]["items"]["type"] == "array"
                    and "items" in properties[key]["items"]
                ):
                    properties[key]["items"]["items"]["type"] = mapping[
                        properties[key]["items"]["items"]["type"]
                    ]
                elif (
                    properties[key]["items"]["type"] == "object"
                    and "properties" in properties[key]["items"]
                ):
                    properties[key]["items"]["properties"] = _cast_to_openai_type(
                        properties[key]["items"]["properties"], mapping
                    )
    return properties


def to_tools(functions):
    """BFCL's convert_to_tool for OpenAI chat completions."""
    tools = []
    for item in copy.deepcopy(functions):
        item["name"] = re.sub(r"\.", "_", item["name"])
        item["parameters"]["type"] = "object"
        item["parameters"]["properties"] = _cast_to_openai_type(
            item["parameters"]["properties"], GORILLA_TO_OPENAPI
        )
        tools.append({"type": "function", "function": item})
    return tools


def load(category):
    cases = [json.loads(line) for line in open(DATA / f"BFCL_v4_{category}.json")]
    answers = {
        a["id"]: a["ground_truth"]
        for a in map(json.loads, open(DATA / "possible_answer" / f"BFCL_v4_{category}.json"))
    }
    return [(category, case, answers[case["id"]]) for case in cases]


def run_case(client, model, category, case, answer, max_tokens):
    tools = to_tools(case["function"])
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    row = {"id": case["id"], "category": category}
    start = time.monotonic()
    try:
        response = client.chat.completions.create(
            model=model,
            messages=case["question"][0],
            tools=tools,
            tool_choice="required",
            temperature=0,
            max_tokens=max_tokens,
        )
    except APIStatusError as e:
        row.update(status=e.status_code, error=str(e)[:400], match=False)
        return row
    finally:
        row["seconds"] = round(time.monotonic() - start, 3)
    choice = response.choices[0]
    calls = choice.message.tool_calls or []
    row.update(
        status=200,
        finish=choice.finish_reason,
        content=choice.message.content,
        calls=[{"name": c.function.name, "arguments": c.function.arguments} for c in calls],
    )
    decoded, problems = [], []
    for call in calls:
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError as e:
            problems.append(f"{call.function.name}: arguments do not parse: {e}")
            continue
        schema = schemas.get(call.function.name)
        if schema is None:
            problems.append(f"no tool is named {call.function.name!r}")
            continue
        try:
            jsonschema.validate(arguments, schema)
        except jsonschema.ValidationError as e:
            problems.append(f"{call.function.name}: {e.message}")
        decoded.append({call.function.name: arguments})
    row["schema_problems"] = problems
    # A call cut by max_tokens is not a call (finish_reason "length"); BFCL scores it a miss.
    if decoded and not problems:
        verdict = ast_checker(
            case["function"], decoded, answer, Language.PYTHON, category, MODEL_NAME
        )
        row["match"] = bool(verdict["valid"])
    else:
        row["match"] = False
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--every", type=int, default=1, help="take every Nth case")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--expect", help="another run's --out: count cases whose calls differ")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    cases = [c for cat in args.categories.split(",") for c in load(cat)][:: args.every]
    with ThreadPoolExecutor(args.clients) as pool:
        rows = list(pool.map(lambda c: run_case(client, model, *c, args.max_tokens), cases))
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")

    summary = {"cases": len(rows)}
    for category in args.categories.split(","):
        mine = [r for r in rows if r["category"] == category]
        if mine:
            summary[category] = f"{sum(r['match'] for r in mine)}/{len(mine)}"
    summary["matched"] = sum(r["match"] for r in rows)
    summary["server_errors"] = sum(r["status"] >= 500 for r in rows)
    summary["refused"] = sum(400 <= r["status"] < 500 for r in rows)
    summary["grammar_failures"] = sum("grammar" in r.get("error", "") for r in rows)
    answered = [r for r in rows if r["status"] == 200]
    summary["without_calls"] = sum(not r["calls"] for r in answered)
    summary["cut_by_length"] = sum(r["finish"] == "length" for r in answered)
    summary["schema_problems"] = sum(bool(r["schema_problems"]) for r in answered)
    summary["markup_in_content"] = sum("<tool_call>" in (r["content"] or "") for r in answered)
    summary["seconds_median"] = sorted(r["seconds"] for r in rows)[len(rows) // 2]
    if args.expect:
        other = {r["id"]: r for r in map(json.loads, open(args.expect))}
        differ = [
            r["id"]
            for r in rows
            if (r["status"], r.get("calls"), r.get("content"))
            != (other[r["id"]]["status"], other[r["id"]].get("calls"), other[r["id"]].get("content"))
        ]
        summary["differ_from_expected"] = len(differ)
        summary["differing_ids"] = differ[:10]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
