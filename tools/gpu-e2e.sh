#!/usr/bin/env bash
# End-to-end speed of a CUDA build on a GPU machine: plain against speculative decoding,
# in one process (`e2e-bench`) and through the server under concurrent load (`serve` with
# and without --no-spec, driven by tools/load.py).
#   tools/gpu-e2e.sh            (after tools/build-cuda.sh; needs nvidia-smi and python3)
# BIN (default target/cuda/release/suffixd) and MODEL (default: the setup model) override
# the paths; CUDA_LIBS names the folder with libcublas/libcurand/libcudart 13 when they
# are not under .cuda-toolkit/ (a PyTorch install's nvidia/cu13/lib works). Every run's
# JSON goes to $RESULTS (default target/gpu-e2e/).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/cuda/release/suffixd}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
RESULTS=${RESULTS:-target/gpu-e2e}
CUDA_LIBS=${CUDA_LIBS:-$PWD/.cuda-toolkit/nvidia/cu13/lib}
PORT=${PORT:-18080}
export LD_LIBRARY_PATH="$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$RESULTS"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

for workload in tools/workloads/agentic.jsonl tools/workloads/chat.jsonl; do
    for weights in q8-0 native f32; do
        name="e2e-$(basename "$workload" .jsonl)-$weights"
        echo "== e2e-bench $workload, weights $weights"
        "$BIN" e2e-bench --model "$MODEL" --workload "$workload" --weights "$weights" \
            --max-tokens 128 --json | tee "$RESULTS/$name.log" | tail -n 4
    done
done

# The server, with and without speculation, under the same load. Each run gets a fresh
# store so that the speculative one learns only from its own load.
serve_load() {
    local label=$1
    shift
    local dir
    dir=$(mktemp -d)
    SUFFIXD_ADMIN_TOKEN=gpu-e2e "$BIN" serve --model "$MODEL" --snapshot-dir "$dir" \
        --addr "127.0.0.1:$PORT" "$@" >"$RESULTS/serve-$label.log" 2>&1 &
    local pid=$!
    for _ in $(seq 120); do
        curl -sf "http://127.0.0.1:$PORT/metrics" >/dev/null && break
        kill -0 "$pid" 2>/dev/null || { echo "serve ($label) exited:"; tail "$RESULTS/serve-$label.log"; return 1; }
        sleep 0.5
    done
    echo "== serve ($label): tools/load.py --requests 128 --concurrency 32 --max-tokens 128"
    python3 tools/load.py --base "http://127.0.0.1:$PORT" --requests 128 --concurrency 32 \
        --max-tokens 128 --admin-token gpu-e2e | tee "$RESULTS/load-$label.log"
    kill "$pid"
    wait "$pid" || true
    rm -rf "$dir"
}
for weights in q8-0 f32; do
    serve_load "spec-$weights" --weights "$weights"
    serve_load "plain-$weights" --weights "$weights" --no-spec
done
