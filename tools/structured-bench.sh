#!/usr/bin/env bash
# A structured-output workload (tools/structured-bench.py: extraction and triage held to
# JSON schemas, one request after another) on fresh servers in turn, side by side:
#   - suffixd plain decoding (--no-spec);
#   - suffixd speculating with drafts only cut to the grammar (--no-grammar-drafts);
#   - suffixd speculating with the grammar's forced tokens drafted too (the default);
#   - llama.cpp's llama-server, plain and with its n-gram speculation (ngram-map-k),
#     when LLAMA_BIN holds it (../shared/peer/llamacpp/build.sh builds it).
# Each line: tokens per step (suffixd), decoding speed end to end, and whether the
# greedy answers equal plain suffixd's.
#
#   tools/structured-bench.sh [BINARY] [REQUESTS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-target/release/suffixd}"
N="${2:-40}"
ROUNDS="${3:-1}"
PORT="${PORT:-8397}"
LLAMA_BIN="${LLAMA_BIN:-/tmp/llamacpp-build/bin}"
MODEL="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
out=$(mktemp -d)
configs=("suffixd --no-spec" "suffixd --no-grammar-drafts" "suffixd")
[ -x "$LLAMA_BIN/llama-server" ] && configs+=("llama plain" "llama ngram-map-k")
for round in $(seq "$ROUNDS"); do
    for config in "${configs[@]}"; do
        read -r kind mode <<<"$config"
        dir=$(mktemp -d)
        if [ "$kind" = suffixd ]; then
            # shellcheck disable=SC2086
            "$BIN" serve --snapshot-dir "$dir" --addr "127.0.0.1:$PORT" --model "$MODEL" $mode >"$dir/log" 2>&1 &
        else
            PORT=$PORT MODEL=$MODEL BIN=$LLAMA_BIN THREADS=2 \
                setsid bash ../shared/peer/llamacpp/serve.sh "$mode" >"$dir/log" 2>&1 &
        fi
        pid=$!
        for _ in $(seq 240); do
            curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break
            sleep 0.5
        done
        name="${config// /_}"
        result=$(python3 tools/structured-bench.py --base-url "http://127.0.0.1:$PORT" \
            --requests "$N" --answers "$out/$name.json")
        same=$(python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); print(sum(x==y for x,y in zip(a,b)), "/", len(a))' \
            "$out/$name.json" "$out/suffixd_--no-spec.json")
        echo "round $round, $config: $result; answers equal to plain suffixd's: $same"
        if [ "$kind" = suffixd ]; then kill "$pid"; else kill -- -"$pid" 2>/dev/null || kill "$pid"; fi
        wait "$pid" 2>/dev/null || true
        rm -rf "$dir"
    done
done
rm -rf "$out"
