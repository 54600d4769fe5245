#!/usr/bin/env bash
# Every case of the Berkeley Function Calling Leaderboard's live_simple, live_multiple,
# simple_python and live_parallel categories (1,727; PyPI bfcl-eval, installed by
# tools/setup.sh) through suffixd serve, a speculating server and a --no-spec one side
# by side (tests/bfcl.py: a forced call, greedy, 128 tokens at most), then compared.
# The README's test command runs every fourth case (tests/bfcl.rs); this is the whole
# set, about 45 minutes on two cores. Figures: docs/agents.md.
#
#   tools/bfcl.sh [OUT_DIR]        (default target/bfcl; needs target/release/suffixd)
#
# With LLAMA_SERVER=path/to/llama-server it also runs llama.cpp's server (--jinja, the
# same model and cases; `tool_choice: required`, 2 threads) afterwards, for reference.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/bfcl}
BIN=target/release/suffixd
PY=target/py/bin/python
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$OUT"
export CANDLE_NUM_THREADS=${CANDLE_NUM_THREADS:-1}

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_up() {
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null && return
        sleep 0.5
    done
    echo "bfcl: the server on port $1 did not come up" >&2
    exit 1
}

start_suffixd() { # port store-dir extra-flags...
    local port=$1 dir=$2
    shift 2
    rm -rf "$dir" && mkdir -p "$dir"
    "$BIN" serve --addr "127.0.0.1:$port" --snapshot-dir "$dir" --cost flat \
        --max-context 8192 --max-tokens-limit 256 "$@" >"$dir.log" 2>&1 &
    pids+=($!)
    wait_up "$port"
}

start_suffixd 18601 "$OUT/spec-store"
start_suffixd 18602 "$OUT/plain-store" --no-spec
"$PY" tests/bfcl.py --base-url http://127.0.0.1:18601/v1 --out "$OUT/spec.jsonl" \
    --max-tokens 128 --clients 2 >"$OUT/spec.summary" &
spec=$!
"$PY" tests/bfcl.py --base-url http://127.0.0.1:18602/v1 --out "$OUT/plain.jsonl" \
    --max-tokens 128 --clients 2 >"$OUT/plain.summary"
wait $spec
cleanup
pids=()
echo "suffixd, speculating:"; cat "$OUT/spec.summary"
echo "suffixd, --no-spec:"; cat "$OUT/plain.summary"
"$PY" - "$OUT/spec.jsonl" "$OUT/plain.jsonl" <<'PYEOF'
import json, sys
a, b = ({r["id"]: r for r in map(json.loads, open(p))} for p in sys.argv[1:])
key = lambda r: (r["status"], r.get("calls"), r.get("content"), r.get("finish"))
differ = [i for i in a if key(a[i]) != key(b[i])]
print(f"speculating vs --no-spec: {len(a) - len(differ)} of {len(a)} answers identical; differing: {differ[:10]}")
PYEOF

if [ -n "${LLAMA_SERVER:-}" ]; then
    "$LLAMA_SERVER" -m "$MODEL" -t 2 -tb 2 -c 8192 --host 127.0.0.1 --port 18603 \
        --no-webui --jinja --temp 0 >"$OUT/llama-server.log" 2>&1 &
    pids+=($!)
    wait_up 18603
    "$PY" tests/bfcl.py --base-url http://127.0.0.1:18603/v1 --out "$OUT/llama.jsonl" \
        --max-tokens 128 --clients 1 >"$OUT/llama.summary"
    echo "llama.cpp llama-server --jinja:"; cat "$OUT/llama.summary"
fi
