#!/usr/bin/env python3
"""Agent workloads through real servers, side by side: suffixd and llama.cpp's llama-server.

    tools/pipeline-bench.py [--configs suffixd,suffixd-no-spec,suffixd-no-prefix,llama-plain,llama-ngram-mod,llama-ngram-map-k]
                            [--workload pipeline|multi-turn|chat] [--items 8] [--max-tokens 160]
                            [--rounds 1] [--contention] [--json FILE] [--extra JSON]
                            [--model GGUF] [--draft-model GGUF] [--chat-file JSONL]

Every server starts cold (suffixd with an empty store directory, llama-server freshly
started), serves the whole workload one request at a time over the OpenAI API (streamed
chat completions, greedy), and stops. The figures per configuration:
  - end-to-end completion tok/s: completion tokens over the wall time of the workload,
    prefill included, as a user of the pipeline sees it;
  - time to first token, median, for requests whose prompt prefix the server has seen
    before (the same stage's instructions) and for those it has not;
  - prompt tokens, and those the server reports reused (suffixd: usage
    .prompt_tokens_details.cached_tokens; llama-server: prompt tokens it did not evaluate,
    from `timings.prompt_n`).
With --rounds N every configuration runs N times, the order reversed every other round,
and each figure is the median of its runs. With --contention a busy loop
(`sh -c 'while :; do :; done'`, normal priority) runs beside each server. --extra JSON
merges a JSON object into every chat request of the configs named with `+extra` (such
as `suffixd+extra`, beside a plain `suffixd` in the same run), for example
'{"frequency_penalty": 0.3}' (both servers take OpenAI's penalties; llama-server counts
the last 64 tokens, prompt included, where suffixd counts the answer's, so their
answers differ).

Workloads (generated here, deterministic; not in the repository's other files):
  - pipeline: a 5-stage data-operations agent (triage, extract, SQL, review, report) over
    --items tickets, in pipeline order; each stage has its own long instructions with a
    worked example, and stages 2-5 read the previous stage's output;
  - multi-turn: --items conversations of 5 turns with a coding assistant; every turn
    resends the whole conversation so far (system prompt, earlier turns and answers);
  - chat: the first --items requests of --chat-file (`tools/workloads/chat.jsonl` unless
    told: one {"messages": [...]} per line), open chat where the trees have little to
    draft from: the workload of draft-model speculation.

The configs suffixd-responses and suffixd-responses-no-spec send the same requests
through the Responses API (`/v1/responses`, streamed; a system message as
`instructions`), as the OpenAI Agents SDK does by default.

Draft-model speculation, side by side: `--model` a target (for example the default
model's F32 conversion), `--draft-model` a smaller or quantized draft with its tokenizer,
and the configs suffixd-hybrid (`serve --draft-model`, its defaults) against llama-draft
(llama-server `--spec-type draft-simple -md`, its defaults: 3 draft tokens) and
llama-draft-n16 (16 draft tokens).

llama-server comes from ../shared/peer/llamacpp (build.sh builds it from the
llama-cpp-python source package on PyPI, about 10 minutes; this script runs it when the
binary is missing). Both servers get 2 threads and a 4096-token context.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "..", "shared", "peer", "llamacpp")
LLAMA_BIN = os.environ.get("LLAMA_BIN", "/tmp/llamacpp-build/bin")
SUFFIXD = os.path.join(ROOT, "target", "release", "suffixd")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PORT = 18671

STAGES = [
    ("triage",
     "You are the triage stage of a data-operations agent. Read the support ticket and "
     "classify it. Answer with exactly four lines: SYSTEM: the affected system, one of "
     "billing, warehouse, reporting, auth. SEVERITY: low, medium or high. OWNER: the team "
     "that owns the system (billing-team, warehouse-team, data-team, identity-team). "
     "SUMMARY: one sentence that restates the problem without names of people.\n"
     "Rules: high severity means customers cannot pay, ship or log in; medium means a "
     "report or export is wrong; low means a cosmetic or documentation problem. Never "
     "invent a system that is not in the list. Do not apologise and do not add advice.\n"
     "Example ticket: The nightly revenue export for region EU shows every amount twice "
     "since Monday; finance noticed it while closing the month.\n"
     "Example answer:\nSYSTEM: reporting\nSEVERITY: medium\nOWNER: data-team\n"
     "SUMMARY: The nightly EU revenue export duplicates every amount since Monday."),
    ("extract",
     "You are the extraction stage of a data-operations agent. The previous stage "
     "classified a ticket. Turn its answer into one JSON object with the keys system, "
     "severity, owner, table and symptom. The table is the database table most likely "
     "involved: billing uses invoices, warehouse uses shipments, reporting uses "
     "revenue_daily, auth uses sessions. The symptom is the summary, shortened to at most "
     "ten words, lower case.\nRules: answer with the JSON object only, on one line, with "
     "the keys in the order given, double quotes, no trailing text.\n"
     "Example input:\nSYSTEM: reporting\nSEVERITY: medium\nOWNER: data-team\n"
     "SUMMARY: The nightly EU revenue export duplicates every amount since Monday.\n"
     "Example answer:\n{\"system\": \"reporting\", \"severity\": \"medium\", \"owner\": "
     "\"data-team\", \"table\": \"revenue_daily\", \"symptom\": \"nightly eu revenue export "
     "duplicates amounts\"}"),
    ("sql",
     "You are the query stage of a data-operations agent. Given the JSON record of a "
     "ticket, write one read-only SQL query that an engineer can run to confirm the "
     "symptom. Use the table named in the record. Select at most five columns, filter on "
     "the last seven days with created_at >= now() - interval '7 days', and order by "
     "created_at descending. Limit the result to 50 rows.\nRules: answer with the query "
     "only, in one code block marked sql, keywords in upper case, one clause per line.\n"
     "Example input:\n{\"system\": \"reporting\", \"severity\": \"medium\", \"owner\": "
     "\"data-team\", \"table\": \"revenue_daily\", \"symptom\": \"nightly eu revenue export "
     "duplicates amounts\"}\nExample answer:\n```sql\nSELECT id, region, amount, created_at\n"
     "FROM revenue_daily\nWHERE created_at >= now() - interval '7 days'\n"
     "ORDER BY created_at DESC\nLIMIT 50;\n```"),
    ("review",
     "You are the review stage of a data-operations agent. Check the SQL query from the "
     "previous stage. It must be read-only, use one table, filter on the last seven days, "
     "order by created_at descending and limit to 50 rows. Answer with exactly three "
     "lines: VERDICT: approve or reject. REASON: one sentence. QUERY: the query on one "
     "line, corrected if you rejected it, unchanged if you approved it.\nRules: reject any "
     "query that writes (INSERT, UPDATE, DELETE, DROP, ALTER) or has no LIMIT.\n"
     "Example input:\n```sql\nSELECT id, region, amount, created_at\nFROM revenue_daily\n"
     "WHERE created_at >= now() - interval '7 days'\nORDER BY created_at DESC\nLIMIT 50;\n```\n"
     "Example answer:\nVERDICT: approve\nREASON: The query is read-only, filtered and "
     "limited.\nQUERY: SELECT id, region, amount, created_at FROM revenue_daily WHERE "
     "created_at >= now() - interval '7 days' ORDER BY created_at DESC LIMIT 50;"),
    ("report",
     "You are the reporting stage of a data-operations agent. Write the status update "
     "that goes back on the ticket, from the review stage's answer. Use this template and "
     "nothing else:\nStatus: investigating\nQuery to run: the query from the review\n"
     "Approved: yes or no\nNext step: one sentence for the owning team.\n"
     "Example input:\nVERDICT: approve\nREASON: The query is read-only, filtered and "
     "limited.\nQUERY: SELECT id, region, amount, created_at FROM revenue_daily WHERE "
     "created_at >= now() - interval '7 days' ORDER BY created_at DESC LIMIT 50;\n"
     "Example answer:\nStatus: investigating\nQuery to run: SELECT id, region, amount, "
     "created_at FROM revenue_daily WHERE created_at >= now() - interval '7 days' ORDER BY "
     "created_at DESC LIMIT 50;\nApproved: yes\nNext step: The data team compares the "
     "export with the source rows of the last seven days."),
]

TICKETS = [
    "Card payments fail with error 502 at checkout for every customer since the deploy at 09:10.",
    "The warehouse dashboard lists yesterday's shipments twice, so pickers pack orders again.",
    "Users are logged out after one minute and must sign in again; sessions do not persist.",
    "The weekly churn report is empty for the APAC region although customers cancelled.",
    "Invoices for annual plans show the monthly price; three customers complained by email.",
    "The shipping label printer gets no jobs from the new warehouse in Lyon since Friday.",
    "Password reset emails arrive after two hours, so customers cannot log in on time.",
    "The revenue dashboard total differs from the sum of its rows by exactly one day of sales.",
    "Refunds are issued twice when support clicks the refund button on a slow connection.",
    "Stock counts for the Berlin warehouse go negative after returns are scanned.",
    "Single sign-on with the customer's identity provider rejects every login since the certificate rotated.",
    "The monthly export for the tax office misses every invoice paid by bank transfer.",
]

MULTI_TURN_SYSTEM = (
    "You are a careful Python assistant inside a code editor. Answer with a short "
    "explanation and one code block. Keep functions small, add type hints, and handle "
    "empty input. When asked to change earlier code, repeat the whole function with the "
    "change applied, so that the user can paste it."
)
MULTI_TURN_TASKS = [
    ["Write a function that returns the median of a list of numbers.",
     "Make it raise ValueError on an empty list.", "Add a docstring with an example.",
     "Now make it accept any iterable, not only lists.", "Write two pytest tests for it."],
    ["Write a function that counts the words in a text.",
     "Make it ignore case.", "Make it ignore punctuation too.",
     "Return the three most common words instead.", "Write two pytest tests for it."],
    ["Write a function that merges two sorted lists into one sorted list.",
     "Make it work for any number of sorted lists.", "Add type hints for generic items.",
     "Make it a generator.", "Write two pytest tests for it."],
    ["Write a function that parses 'key=value' lines into a dict.",
     "Skip blank lines and lines starting with #.", "Strip whitespace around keys and values.",
     "Raise ValueError with the line number on a malformed line.", "Write two pytest tests for it."],
    ["Write a function that checks whether a string is a palindrome.",
     "Ignore spaces and case.", "Ignore punctuation too.",
     "Return the longest palindromic substring instead.", "Write two pytest tests for it."],
    ["Write a function that flattens a nested list.",
     "Limit the depth with a parameter.", "Keep strings whole instead of splitting them.",
     "Make it a generator.", "Write two pytest tests for it."],
]


def respond(port, messages, max_tokens):
    """The same request through the Responses API (`/v1/responses`, streamed): a leading
    system message as `instructions`, the rest as `input` items. Returns what chat does."""
    request = {"input": messages, "max_output_tokens": max_tokens, "temperature": 0, "stream": True}
    if messages and messages[0]["role"] == "system":
        request["instructions"], request["input"] = messages[0]["content"], messages[1:]
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/responses", json.dumps(request), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    text, first, usage = "", None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        event = json.loads(line[5:].strip())
        if event["type"] == "response.output_text.delta":
            if first is None:
                first = time.perf_counter() - t0
            text += event["delta"]
        elif event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            usage = event["response"].get("usage")
            break
    total = time.perf_counter() - t0
    conn.close()
    if usage is None:
        raise RuntimeError("the server sent no usage")
    reused = usage["input_tokens_details"]["cached_tokens"]
    return text, usage["output_tokens"], usage["input_tokens"], reused, first if first is not None else total, total


def chat(port, messages, max_tokens, namespace=None):
    """One streamed chat completion: (text, completion tokens, prompt tokens, reused prompt
    tokens, seconds to the first token, seconds in all)."""
    if CURRENT.startswith("suffixd-responses"):
        return respond(port, messages, max_tokens)
    request = {
        "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if CURRENT.endswith("+extra"):
        request.update(EXTRA)
    if CURRENT.startswith("llama"):
        request["cache_prompt"] = True  # its default; said so that it is clear
    body = json.dumps(request)
    headers = {"Content-Type": "application/json"}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body, headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    text, first, usage, timings = "", None, None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        for c in chunk.get("choices", []):
            piece = (c.get("delta") or {}).get("content") or ""
            if piece and first is None:
                first = time.perf_counter() - t0
            text += piece
        usage = chunk.get("usage") or usage
        timings = chunk.get("timings") or timings
    total = time.perf_counter() - t0
    conn.close()
    if usage is None:
        raise RuntimeError("the server sent no usage")
    prompt = usage["prompt_tokens"]
    if timings is not None:  # llama-server: prompt_n is what it evaluated
        reused = prompt - timings.get("prompt_n", prompt)
        DRAFTED[0] += timings.get("draft_n", 0)
        DRAFTED[1] += timings.get("draft_n_accepted", 0)
    else:
        reused = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return text, usage["completion_tokens"], prompt, reused, first if first is not None else total, total


# Fields merged into the chat requests of the configs named with "+extra" (--extra).
EXTRA = {}

# llama-server's draft tokens and the accepted ones (its replies' timings), per run.
DRAFTED = [0, 0]


def run_chat(port, items, max_tokens, chat_file):
    records = []
    with open(chat_file) as f:
        requests = [json.loads(line) for line in f if line.strip()][:items]
    for i, request in enumerate(requests):
        text, n, p, reused, ttft, total = chat(port, request["messages"], max_tokens)
        records.append({"stage": f"chat {i + 1}", "seen": False, "completion": n, "prompt": p,
                        "reused": reused, "ttft": ttft, "total": total, "text": text})
    return records


def pipeline_workload(items):
    """Requests in pipeline order: (stage name, messages-builder) per call."""
    calls = []
    for t in range(items):
        ticket = TICKETS[t % len(TICKETS)]
        for s, (name, system) in enumerate(STAGES):
            calls.append((t, s, name, system, ticket))
    return calls


def run_pipeline(port, items, max_tokens):
    records, seen = [], set()
    prev = None
    for t, s, name, system, ticket in pipeline_workload(items):
        user = f"Ticket: {ticket}" if s == 0 else f"Input:\n{prev}"
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        text, n, p, reused, ttft, total = chat(port, msgs, max_tokens)
        records.append({"stage": name, "seen": name in seen, "completion": n, "prompt": p,
                        "reused": reused, "ttft": ttft, "total": total, "text": text})
        seen.add(name)
        prev = text
    return records


def run_multi_turn(port, items, max_tokens):
    records = []
    for c in range(items):
        task = MULTI_TURN_TASKS[c % len(MULTI_TURN_TASKS)]
        msgs = [{"role": "system", "content": MULTI_TURN_SYSTEM}]
        for turn, question in enumerate(task):
            msgs.append({"role": "user", "content": question})
            text, n, p, reused, ttft, total = chat(port, msgs, max_tokens)
            records.append({"stage": f"turn {turn + 1}", "seen": turn > 0, "completion": n,
                            "prompt": p, "reused": reused, "ttft": ttft, "total": total,
                            "text": text})
            msgs.append({"role": "assistant", "content": text})
    return records


CONFIGS = {
    "suffixd": ("suffixd", []),
    "suffixd-no-spec": ("suffixd", ["--no-spec"]),
    "suffixd-no-prefix": ("suffixd", ["--prefix-cache-bytes", "0"]),
    "suffixd-no-spec-no-prefix": ("suffixd", ["--no-spec", "--prefix-cache-bytes", "0"]),
    # The same server, asked through the Responses API (the Agents SDK's default).
    "suffixd-responses": ("suffixd", []),
    "suffixd-responses-no-spec": ("suffixd", ["--no-spec"]),
    "llama-plain": ("llama", ["plain"]),
    "llama-ngram-mod": ("llama", ["ngram-mod"]),
    "llama-ngram-map-k": ("llama", ["ngram-map-k"]),
    "llama-ngram-simple": ("llama", ["ngram-simple"]),
    # Draft-model speculation: DRAFT is --draft-model.
    "suffixd-hybrid": ("suffixd", ["--draft-model", "{draft}"]),
    "llama-draft": ("llama", ["draft"]),
    "llama-draft-n16": ("llama", ["draft", "--spec-draft-n-max", "16"]),
}
DRAFT = None
CURRENT = ""


def base_config(config):
    """The configuration a name stands for, without its "+extra" (see --extra)."""
    return config.removesuffix("+extra")


def wait_ready(port, proc, limit=300):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v1/models")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the server did not become ready")


def start(config, port, tmp):
    kind, extra = CONFIGS[base_config(config)]
    if "{draft}" in extra or config.startswith("llama-draft"):
        if DRAFT is None:
            sys.exit(f"{config} needs --draft-model")
        extra = [DRAFT if e == "{draft}" else e for e in extra]
    log = open(os.path.join(tmp, f"{config}.log"), "w")
    if kind == "suffixd":
        store = tempfile.mkdtemp(dir=tmp)
        cmd = [SUFFIXD, "serve", "--addr", f"127.0.0.1:{port}", "--snapshot-dir", store,
               "--max-context", "4096", "--model", MODEL] + extra
        env = dict(os.environ, RUST_LOG="warn")
    else:
        cmd = ["bash", os.path.join(PEER, "serve.sh")] + extra
        env = dict(os.environ, PORT=str(port), MODEL=MODEL, BIN=LLAMA_BIN, THREADS="2",
                   CTX="4096", DRAFT=DRAFT or MODEL)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    wait_ready(port, proc)
    return proc


def stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def summarise(records, wall):
    comp = sum(r["completion"] for r in records)
    seen = [r["ttft"] for r in records if r["seen"]]
    unseen = [r["ttft"] for r in records if not r["seen"]]
    med = lambda v: statistics.median(v) if v else float("nan")
    return {
        "tok_per_s": comp / wall, "wall_s": wall, "completion_tokens": comp,
        "prompt_tokens": sum(r["prompt"] for r in records),
        "reused_prompt_tokens": sum(r["reused"] for r in records),
        "ttft_seen_s": med(seen), "ttft_unseen_s": med(unseen),
    }


def main():
    global CURRENT, MODEL, DRAFT, EXTRA
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="suffixd,suffixd-no-spec,suffixd-no-prefix,llama-plain,llama-ngram-mod,llama-ngram-map-k")
    ap.add_argument("--workload", choices=["pipeline", "multi-turn", "chat"], default="pipeline")
    ap.add_argument("--model", default=MODEL, help="the target GGUF both servers load")
    ap.add_argument("--draft-model", help="the draft GGUF of suffixd-hybrid and llama-draft*")
    ap.add_argument("--chat-file", default=os.path.join(ROOT, "tools", "workloads", "chat.jsonl"))
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--contention", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--extra", default="{}", help="a JSON object merged into the chat requests of configs named NAME+extra")
    a = ap.parse_args()
    EXTRA = json.loads(a.extra)
    if not isinstance(EXTRA, dict):
        sys.exit("--extra must be a JSON object")
    if any(c.startswith("suffixd-responses") and c.endswith("+extra") for c in a.configs.split(",")):
        sys.exit("--extra goes into chat requests; the suffixd-responses configs send none")
    configs = a.configs.split(",")
    MODEL = os.path.abspath(a.model)
    DRAFT = os.path.abspath(a.draft_model) if a.draft_model else None
    for c in configs:
        if base_config(c) not in CONFIGS:
            sys.exit(f"unknown config {c}; known: {', '.join(CONFIGS)}")
    if any(CONFIGS[base_config(c)][0] == "llama" for c in configs) and not os.path.exists(os.path.join(LLAMA_BIN, "llama-server")):
        print("== building llama-server (about 10 minutes)", file=sys.stderr)
        subprocess.run(["bash", os.path.join(PEER, "build.sh")], check=True)
    if any(CONFIGS[base_config(c)][0] == "suffixd" for c in configs):
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    tmp = tempfile.mkdtemp(prefix="pipeline-bench-")
    runs = {c: [] for c in configs}
    outputs = {c: None for c in configs}
    busy = None
    try:
        for r in range(a.rounds):
            order = configs if r % 2 == 0 else list(reversed(configs))
            for c in order:
                CURRENT = c
                DRAFTED[:] = [0, 0]
                proc = start(c, PORT, tmp)
                if a.contention:
                    busy = subprocess.Popen(["sh", "-c", "while :; do :; done"])
                try:
                    t0 = time.perf_counter()
                    if a.workload == "pipeline":
                        records = run_pipeline(PORT, a.items, a.max_tokens)
                    elif a.workload == "chat":
                        records = run_chat(PORT, a.items, a.max_tokens, a.chat_file)
                    else:
                        records = run_multi_turn(PORT, a.items, a.max_tokens)
                    wall = time.perf_counter() - t0
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
                        busy = None
                    stop(proc)
                s = summarise(records, wall)
                runs[c].append(s)
                outputs[c] = [r["text"] for r in records]
                print(f"== {c} (round {r + 1}): {s['tok_per_s']:.1f} tok/s, {s['wall_s']:.1f} s, "
                      f"ttft seen {s['ttft_seen_s'] * 1000:.0f} ms / unseen {s['ttft_unseen_s'] * 1000:.0f} ms, "
                      f"{s['reused_prompt_tokens']}/{s['prompt_tokens']} prompt tokens reused"
                      + (f", {DRAFTED[1]}/{DRAFTED[0]} draft tokens accepted" if DRAFTED[0] else ""),
                      file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {c: {k: statistics.median(run[k] for run in runs[c]) for k in runs[c][0]} for c in configs}
    llama = [c for c in configs if c.startswith("llama")]
    best = max(llama, key=lambda c: med[c]["tok_per_s"]) if llama else None
    print(f"\n{a.workload}, {a.items} items, max_tokens {a.max_tokens}, {a.rounds} round(s), "
          + (f"with {json.dumps(EXTRA)}, " if EXTRA else "")
          + f"model {os.path.basename(MODEL)}" + (f", draft {os.path.basename(DRAFT)}" if DRAFT else "")
          + (", with one busy process beside" if a.contention else ""))
    print(f"{'config':28} {'tok/s':>7} {'wall s':>7} {'ttft seen':>10} {'unseen':>8} {'reused/prompt':>15}" + ("  vs best llama" if best else ""))
    for c in configs:
        m = med[c]
        line = (f"{c:28} {m['tok_per_s']:7.1f} {m['wall_s']:7.1f} {m['ttft_seen_s'] * 1000:8.0f}ms "
                f"{m['ttft_unseen_s'] * 1000:6.0f}ms {int(m['reused_prompt_tokens']):>7}/{int(m['prompt_tokens']):<7}")
        if best:
            line += f"  {m['tok_per_s'] / med[best]['tok_per_s']:.2f}x"
        print(line)
    suffixd = [c for c in configs if c.startswith("suffixd")]
    if len(suffixd) > 1:
        base = outputs[suffixd[0]]
        for c in suffixd[1:]:
            same = sum(x == y for x, y in zip(base, outputs[c]))
            print(f"outputs of {c} identical to {suffixd[0]}: {same}/{len(base)}")
    for c in llama:
        if suffixd:
            same = sum(x == y for x, y in zip(outputs[suffixd[0]], outputs[c]))
            print(f"outputs of {c} equal to {suffixd[0]}'s (different kernels round differently): {same}/{len(outputs[c])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"workload": a.workload, "items": a.items, "max_tokens": a.max_tokens,
                       "contention": a.contention, "medians": med, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
