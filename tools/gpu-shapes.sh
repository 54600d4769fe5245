#!/usr/bin/env bash
# The GPU at the sizes people deploy, without their weights (issue 63): for each shape, a
# model with seeded random bf16 weights made on the GPU (`--model synthetic:NAME`), its
# verifier cost curve t(K)/t(1) for K up to 64 at two contexts, and one plain decoding
# step's weight traffic against the card's copy bandwidth measured in the same run.
# Every family runs on the device kernels. With TEST_BIN (the `families` test binary of
# the CUDA build) it first checks each family on the GPU against the CPU and for the
# same bits alone, in a chain and in a tree; a shape that fails is logged, not hidden.
# Where the machine's Python has torch and transformers, the peer runs the shapes in
# PEER_SHAPES (default llama-3.2-1b llama-3.1-8b) after suffixd (tools/peer-shapes.py:
# the same config.json, random bf16 weights, plain greedy decoding; PEER_FLAGS, default
# --compile; PEER=0 leaves it out), and the summary says whether vLLM or SGLang is
# installed there.
#
# Here (no GPU needed):
#   tools/build-cuda.sh --example shape_cost
#   CARGO_COMMAND=test tools/build-cuda.sh --no-run --test families   (TEST_BIN)
#   target/release/examples/shape_cost --write-vocabulary \
#       models/SmolLM2-135M-Instruct.Q4_1.gguf target/vocab.gguf
# There, with the binary and the vocabulary carried:
#   tools/gpu-shapes.sh
# BIN (default target/cuda/release/examples/shape_cost), VOCAB (default target/vocab.gguf),
# SHAPES (default: every shape), RESULTS (default $OUT,
# else target/gpu-shapes) and DEADLINE (seconds for all of it, default 480) override.
# TUNE=1 adds, after every shape, plain steps and short curves (K to 8, 64 positions) of
# TUNE_SHAPES (default llama-3.1-8b) with each tensor-core split of TUNE_KSPLITS (default
# 4 16; the default 8 was tuned on the 135M model, whose layers are 576 wide): the share
# of the copy bandwidth each reaches, in RESULTS/SHAPE.tune-K.jsonl. A split changes the
# order of a projection's sums, so it is a setting for a whole process, never a per-pass
# choice.
# VARIANT_ENV (say SUFFIXD_CUDA_PERSISTENT=on) runs the families' test again with those
# variables, and after the shapes, plain steps and curves to K = 16 of VARIANT_SHAPES
# (default llama-3.2-1b llama-3.1-8b) with them, in RESULTS/SHAPE.variant.jsonl.
# Afterwards, anywhere: `suffixd e2e-bench --workload tools/workloads/agentic.jsonl
# --cost-curve RESULTS/llama-3.1-8b.jsonl` projects the agentic speed-up at 8B (the real
# small model's drafts, priced by the 8B curve; docs/gpu.md).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/cuda/release/examples/shape_cost}
VOCAB=${VOCAB:-target/vocab.gguf}
SHAPES=${SHAPES:-llama-3.2-1b llama-3.1-8b qwen3-8b qwen2.5-7b gemma-3-4b mistral-7b}
TEST_BIN=${TEST_BIN:-}
RESULTS=${RESULTS:-${OUT:-target/gpu-shapes}}
DEADLINE=${DEADLINE:-480}
mkdir -p "$RESULTS"
if [ -z "${CUDA_LIBS:-}" ]; then
    CUDA_LIBS=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
    [ -d "$CUDA_LIBS" ] || CUDA_LIBS=$PWD/.cuda-toolkit/nvidia/cu13/lib
fi
export LD_LIBRARY_PATH="$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader \
    | tee "$RESULTS/gpu.txt"
if [ -n "$TEST_BIN" ]; then
    SUFFIXD_TEST_DEVICE=cuda timeout 120 "$TEST_BIN" on_a_gpu --test-threads 1 --nocapture \
        >"$RESULTS/families.log" 2>&1
    echo "== families on the GPU: rc $?" | tee -a "$RESULTS/summary.txt"
    grep -E 'relative difference|^test |panicked' "$RESULTS/families.log" | tee -a "$RESULTS/summary.txt"
    if [ -n "${VARIANT_ENV:-}" ]; then
        env $VARIANT_ENV SUFFIXD_TEST_DEVICE=cuda timeout 120 "$TEST_BIN" on_a_gpu --test-threads 1 \
            --nocapture >"$RESULTS/families-variant.log" 2>&1
        echo "== families on the GPU with $VARIANT_ENV: rc $?" | tee -a "$RESULTS/summary.txt"
        grep -E '^test |panicked' "$RESULTS/families-variant.log" | tee -a "$RESULTS/summary.txt"
    fi
fi
PEER=${PEER:-1}
PEER_SHAPES=${PEER_SHAPES:-llama-3.2-1b llama-3.1-8b}
python3 -c 'import torch, transformers' 2>/dev/null || PEER=0
echo "== serving peers installed: $(python3 -m pip list 2>/dev/null | grep -iE '^(vllm|sglang|torch|transformers) ' | tr -s ' ' | tr '\n' ';')" \
    | tee -a "$RESULTS/summary.txt"
for shape in $SHAPES; do
    rest=$((DEADLINE - SECONDS))
    if [ "$rest" -lt 30 ]; then
        echo "== $shape: skipped, ${rest}s left" | tee -a "$RESULTS/summary.txt"
        continue
    fi
    timeout "$rest" "$BIN" "$shape" --vocabulary "$VOCAB" --weights bf16 \
        --contexts 64,1024 --max-k 64 --repeats 5 \
        >"$RESULTS/$shape.jsonl" 2>"$RESULTS/$shape.log"
    rc=$?
    echo "== $shape: rc $rc, $(wc -l <"$RESULTS/$shape.jsonl") lines, $((DEADLINE - SECONDS))s left" \
        | tee -a "$RESULTS/summary.txt"
    cat "$RESULTS/$shape.jsonl"
    [ "$rc" -eq 0 ] || tail -3 "$RESULTS/$shape.log"
    rest=$((DEADLINE - SECONDS))
    if [ "$PEER" = 1 ] && [ "$rest" -gt 60 ] && [[ " $PEER_SHAPES " == *" $shape "* ]]; then
        "$BIN" --write-config "$shape" "$RESULTS/$shape.config.json"
        timeout "$((rest < 240 ? rest : 240))" python3 tools/peer-shapes.py "$RESULTS/$shape.config.json" \
            ${PEER_FLAGS:---compile} >"$RESULTS/$shape.peer.json" 2>"$RESULTS/$shape.peer.log"
        echo "== $shape peer: rc $?, $(tail -1 "$RESULTS/$shape.peer.json")" | tee -a "$RESULTS/summary.txt"
    fi
done
# One shape's plain step and short curve with `env` settings: the share of the copy
# bandwidth and t(K)/t(1), printed.
curve_figures() {
    python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    k, ratio = r["curve"][-1]
    print("t1 %.3f ms, %.0f%% of the copy bandwidth, t(%d)/t(1) %.2f" % (r["t1_ms"],
          100 * r["share_of_copy_bandwidth"], k, ratio))' "$1" 2>&1
}
if [ -n "${VARIANT_ENV:-}" ]; then
    for shape in ${VARIANT_SHAPES:-llama-3.2-1b llama-3.1-8b}; do
        rest=$((DEADLINE - SECONDS))
        if [ "$rest" -lt 40 ]; then
            echo "== $shape with $VARIANT_ENV: skipped, ${rest}s left" | tee -a "$RESULTS/summary.txt"
            continue
        fi
        # At most 90 s: a variant that hangs must not take the stages after it.
        env $VARIANT_ENV timeout "$((rest < 90 ? rest : 90))" "$BIN" "$shape" --vocabulary "$VOCAB" --weights bf16 \
            --contexts 64 --max-k 16 --repeats 5 \
            >"$RESULTS/$shape.variant.jsonl" 2>"$RESULTS/$shape.variant.log"
        echo "== $shape with $VARIANT_ENV: rc $?, $(curve_figures "$RESULTS/$shape.variant.jsonl")" \
            | tee -a "$RESULTS/summary.txt"
    done
fi
if [ "${TUNE:-0}" = 1 ]; then
    for shape in ${TUNE_SHAPES:-llama-3.1-8b}; do
        for ksplit in ${TUNE_KSPLITS:-4 16}; do
            rest=$((DEADLINE - SECONDS))
            if [ "$rest" -lt 40 ]; then
                echo "== $shape ksplit $ksplit: skipped, ${rest}s left" | tee -a "$RESULTS/summary.txt"
                continue
            fi
            SUFFIXD_CUDA_MMA_KSPLIT=$ksplit timeout "$rest" "$BIN" "$shape" --vocabulary "$VOCAB" \
                --weights bf16 --contexts 64 --max-k 8 --repeats 5 \
                >"$RESULTS/$shape.tune-$ksplit.jsonl" 2>"$RESULTS/$shape.tune-$ksplit.log"
            rc=$?
            echo "== $shape ksplit $ksplit: rc $rc, $(curve_figures "$RESULTS/$shape.tune-$ksplit.jsonl")" \
                | tee -a "$RESULTS/summary.txt"
        done
    done
fi
