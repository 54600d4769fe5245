#!/usr/bin/env bash
# Every GPU check of the CUDA build in one run, for a lent GPU machine where device time is
# short: the exactness tests on the GPU, then speed (e2e-bench: the device kernels in bf16
# and f32 against candle's path with host attention, agentic, chat and an unseen pipeline
# workload), the transformers peer on the same GPU and prompts, the server under load
# with speculation on and off, and a kernel profile of plain decoding. Each stage has its
# own time limit and writes its log under $RESULTS; a summary is printed last. The prefix
# cache's time to first token on a repeated 2,000-token prompt runs before the load.
#
#   tools/gpu-check.sh
#
# BIN (default target/cuda/release/suffixd), TEST_BIN (the `verify` test binary of the
# CUDA build: `CARGO_COMMAND=test tools/build-cuda.sh --no-run --test verify`), MODEL
# (default: the setup model), UNSEEN (a workload not in this repository; skipped when
# unset), RESULTS (default target/gpu-check) and CUDA_LIBS (the CUDA 13 libraries; default:
# those of the machine's PyTorch install, else .cuda-toolkit/) override the defaults.
# QUICK=1 runs only the suffixd stages of this build (no candle path, peer or profiles);
# CANDLE=0 leaves out only the candle path and the run without graphs; NCU=0 the kernel
# profiles; F32=0 the f32 run. LOAD_REQUESTS (default 128) sets the requests of each run
# under load, and LOAD_LONG=N adds a run of N requests each way (speculation on and off),
# where the cold first wave weighs less. PEER_FLAGS (say --compile: static cache and
# torch.compile) and PEER_SECS (default 120) shape the peer's run.
# BASE (a binary of an earlier commit) runs plain decoding and the agentic workload through
# it too, alternated with BIN, so that a change is judged on the same card in the same run;
# BASE_ENV (say SUFFIXD_CUDA_MMA=off) runs the base with those variables set (BASE defaults
# to BIN then: a path of this build against another). The server under load runs the base
# too.
# VARIANT_ENV (say SUFFIXD_CUDA_PERSISTENT=on) runs BIN with those variables against BIN
# as it is: plain decoding alternated at both contexts, the answers compared, and the
# `verify` tests (TEST_BIN) again with them.
# TUNE=1 times plain decoding at a long context for each launch shape the kernels take
# (SUFFIXD_CUDA_WARPS x SUFFIXD_CUDA_ATTN_SPLITS) and runs the later stages with the
# fastest. TUNE_MMA=1 does the same for the tensor-core projections' shapes
# (SUFFIXD_CUDA_MMA_KSPLIT and _HEAD_KSPLIT), timing plain decoding at a short
# context, where the projections take most of a step, and reruns the tests with the best.
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/cuda/release/suffixd}
TEST_BIN=${TEST_BIN:-}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
RESULTS=${RESULTS:-target/gpu-check}
UNSEEN=${UNSEEN:-}
PORT=${PORT:-18080}
mkdir -p "$RESULTS"
if [ -z "${CUDA_LIBS:-}" ]; then
    CUDA_LIBS=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
    [ -d "$CUDA_LIBS" ] || CUDA_LIBS=$PWD/.cuda-toolkit/nvidia/cu13/lib
fi
export LD_LIBRARY_PATH="$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary=()
BASE_ENV=${BASE_ENV:-}
[ -n "$BASE_ENV" ] && BASE=${BASE:-$BIN}
note() { summary+=("$*"); echo "== $*"; }
# Every stage fits inside DEADLINE seconds from the start (a lease's command limit);
# limit N prints the seconds a stage of N may take, 0 when too few are left to start it.
DEADLINE=${DEADLINE:-540}
limit() { local rest=$((DEADLINE - SECONDS)); [ "$rest" -gt 15 ] || rest=0; echo $((rest < $1 ? rest : $1)); }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$RESULTS/gpu.txt"
# The SM clock and load through the run (the card's own power management sets the clock;
# it is read, never changed).
nvidia-smi --query-gpu=timestamp,clocks.sm,utilization.gpu --format=csv,noheader,nounits \
    -lms 250 >"$RESULTS/clocks.csv" 2>/dev/null &
clocks_pid=$!

# A first pass through the device kernels: if the model cannot generate, nothing after
# this can run, and the device time is better given back.
if ! timeout 120 "$BIN" generate --model "$MODEL" --max-tokens 48 --no-spec --cost flat \
    --chat "Write a haiku about rain." >"$RESULTS/smoke.log" 2>&1; then
    note "smoke: generate failed"; tail -30 "$RESULTS/smoke.log"; exit 1
fi
note "smoke: $(tail -3 "$RESULTS/smoke.log" | tr '\n' ' ')"

# Plain decoding, one stream, at a long context: tok/s of `generate` (its own count).
LONG_PROMPT=$(python3 -c '
import json, sys
stages = [json.loads(l)["stages"][0] for l in open(sys.argv[1])]
print("\n\n".join(stages * 3) + "\n\nSummarise every order above as one JSON list.")' tools/workloads/agentic.jsonl)
# One plain greedy run of `generate`: its text to $RESULTS/text-LABEL, its tok/s printed.
plain_run() {  # label, binary, prompt, then env assignments
    local label=$1 bin=$2 prompt=$3
    shift 3
    env "$@" timeout 60 "$bin" generate --model "$MODEL" --max-tokens 256 --no-spec --cost flat \
        --chat "$prompt" >"$RESULTS/text-$label" 2>"$RESULTS/stats-$label"
    grep -oE '[0-9.]+ tokens/s' "$RESULTS/stats-$label" | cut -d' ' -f1
}
# A short context too, where a step is the projections' and launches' time (the 135M
# model's single-stream step, issue 63's item 6).
SHORT_PROMPT="Write a haiku about rain."
# Plain decoding alternated, three rounds at both contexts: LABEL_A's binary and
# environment against LABEL_B's; tok/s to $RESULTS/decode-NAME.txt, then whether the last
# round's greedy answers are the same text (a change of speed only keeps the bits). If B
# fails or hangs, one run is lost, not six.
ab_decode() {  # name, label A, binary A, env A, label B, binary B, env B
    local name=$1 la=$2 ba=$3 ea=$4 lb=$5 bb=$6 eb=$7 round x y xs ys same=0 context
    for round in 1 2 3; do
        [ "$(limit 20)" -gt 0 ] || break
        x=$(plain_run "$la-long" "$ba" "$LONG_PROMPT" $ea) y=$(plain_run "$lb-long" "$bb" "$LONG_PROMPT" $eb)
        if [ -z "$y" ]; then
            note "$lb ($eb): generate failed: $(tail -3 "$RESULTS/stats-$lb-long" | tr '\n' ' ')"
            break
        fi
        xs=$(plain_run "$la-short" "$ba" "$SHORT_PROMPT" $ea) ys=$(plain_run "$lb-short" "$bb" "$SHORT_PROMPT" $eb)
        echo "round $round: long prompt $la $x $lb $y, short $la $xs $lb $ys" >>"$RESULTS/decode-$name.txt"
    done
    note "plain decoding, tok/s ($la $lb, alternated): $(cut -d: -f2- "$RESULTS/decode-$name.txt" 2>/dev/null | tr '\n' ';')"
    for context in long short; do
        [ -s "$RESULTS/text-$lb-$context" ] && cmp -s "$RESULTS/text-$la-$context" "$RESULTS/text-$lb-$context" && same=$((same + 1))
    done
    note "$la and $lb greedy answers: $same of 2 the same text"
}
if [ -n "${BASE:-}" ] && [ "$(limit 90)" -gt 0 ]; then
    ab_decode base base "$BASE" "$BASE_ENV" new "$BIN" ""
fi
if [ -n "$TEST_BIN" ]; then
    SUFFIXD_TEST_DEVICE=cuda SUFFIXD_MODEL="$MODEL" timeout "$(limit 200)" "$TEST_BIN" --test-threads 2 \
        >"$RESULTS/tests.log" 2>&1
    note "tests (rc $?): $(grep -E '^test result|FAILED|panicked|relative difference' "$RESULTS/tests.log" | tr '\n' ' ')"
fi
if [ -n "${VARIANT_ENV:-}" ] && [ "$(limit 60)" -gt 0 ]; then
    ab_decode variant plain "$BIN" "" variant "$BIN" "$VARIANT_ENV"
    if [ -n "$TEST_BIN" ] && [ -s "$RESULTS/decode-variant.txt" ] && [ "$(limit 40)" -gt 0 ]; then
        env $VARIANT_ENV SUFFIXD_TEST_DEVICE=cuda SUFFIXD_MODEL="$MODEL" timeout "$(limit 150)" "$TEST_BIN" \
            --test-threads 2 >"$RESULTS/tests-variant.log" 2>&1
        note "tests with $VARIANT_ENV (rc $?): $(grep -E '^test result|FAILED|panicked|relative difference' "$RESULTS/tests-variant.log" | tr '\n' ' ')"
    fi
fi

if [ "${TUNE:-0}" = 1 ] && [ "$(limit 120)" -gt 0 ]; then
    best=0 best_env=""
    for w in 2 4 8; do
        for s in 4 8 16; do
            [ "$(limit 20)" -gt 0 ] || break 2
            r=$(plain_run tune "$BIN" "$LONG_PROMPT" SUFFIXD_CUDA_WARPS=$w SUFFIXD_CUDA_ATTN_SPLITS=$s)
            echo "warps $w splits $s: $r tok/s" >>"$RESULTS/tune.txt"
            if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1] or 0) > float(sys.argv[2]) else 1)' "${r:-0}" "$best"; then
                best=$r best_env="SUFFIXD_CUDA_WARPS=$w SUFFIXD_CUDA_ATTN_SPLITS=$s"
            fi
        done
    done
    note "tuning: $(tr '\n' ';' <"$RESULTS/tune.txt") best: $best_env ($best tok/s)"
    if [ -n "$best_env" ]; then
        export $best_env
        # The tests above ran with the default shapes; row invariance with these too.
        if [ -n "$TEST_BIN" ] && [ "$(limit 60)" -gt 0 ]; then
            SUFFIXD_TEST_DEVICE=cuda SUFFIXD_MODEL="$MODEL" timeout "$(limit 60)" "$TEST_BIN" \
                a_token_gets_the_same_logits >"$RESULTS/tests-tuned.log" 2>&1
            note "row invariance with $best_env (rc $?): $(grep -E '^test result|FAILED|panicked' "$RESULTS/tests-tuned.log" | tr '\n' ' ')"
        fi
    fi
fi

if [ "${TUNE_MMA:-0}" = 1 ] && [ "$(limit 60)" -gt 0 ]; then
    best=0 best_env=""
    for ks in 4 8 16; do
        for head in 1 4; do
            [ "$(limit 15)" -gt 0 ] || break 2
            shape="SUFFIXD_CUDA_MMA_KSPLIT=$ks SUFFIXD_CUDA_MMA_HEAD_KSPLIT=$head"
            r=$(plain_run tune-mma "$BIN" "$SHORT_PROMPT" $shape)
            echo "$shape: $r tok/s" >>"$RESULTS/tune-mma.txt"
            if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1] or 0) > float(sys.argv[2]) else 1)' "${r:-0}" "$best"; then
                best=$r best_env=$shape
            fi
        done
    done
    note "tensor-core tuning, short context: $(tr '\n' ';' <"$RESULTS/tune-mma.txt") best: $best_env ($best tok/s)"
    if [ -n "$best_env" ]; then
        export $best_env
        if [ -n "$TEST_BIN" ] && [ "$(limit 60)" -gt 0 ]; then
            SUFFIXD_TEST_DEVICE=cuda SUFFIXD_MODEL="$MODEL" timeout "$(limit 60)" "$TEST_BIN" \
                --test-threads 2 >"$RESULTS/tests-tuned-mma.log" 2>&1
            note "tests with $best_env (rc $?): $(grep -E '^test result|FAILED|panicked' "$RESULTS/tests-tuned-mma.log" | tr '\n' ' ')"
        fi
    fi
fi

bench() {  # label, time limit, then e2e-bench flags
    local label=$1 secs
    secs=$(limit "$2")
    shift 2
    [ "$secs" -gt 0 ] || { note "e2e $label: skipped (out of time)"; return; }
    env ${BENCH_ENV:-} timeout "$secs" "$BIN" e2e-bench --model "$MODEL" --max-tokens 128 --json "$@" \
        >"$RESULTS/e2e-$label.log" 2>&1
    note "e2e $label (rc $?): $(grep -E '^plain ' "$RESULTS/e2e-$label.log")"
    grep -o '"cost_curve":.*' "$RESULTS/e2e-$label.log" | head -c 400; echo
}
bench agentic-bf16 90 --workload tools/workloads/agentic.jsonl --weights bf16
if [ -n "${BASE:-}" ]; then
    BIN_NEW=$BIN BIN=$BASE BENCH_ENV=$BASE_ENV
    bench agentic-bf16-base 90 --workload tools/workloads/agentic.jsonl --weights bf16
    BIN=$BIN_NEW BENCH_ENV=
    bench agentic-bf16-again 90 --workload tools/workloads/agentic.jsonl --weights bf16
fi
QUICK=${QUICK:-0}
if [ "$QUICK" = 0 ] && [ "${CANDLE:-1}" = 1 ]; then
    SUFFIXD_CUDA_GRAPHS=off bench agentic-bf16-nographs 90 \
        --workload tools/workloads/agentic.jsonl --weights bf16
    # Before: candle's operations with attention on the host (the path these kernels
    # replace), on the first 4 pipelines, and the kernels on the same 4.
    SUFFIXD_DEVICE_KERNELS=off bench agentic4-f32-candle 90 \
        --workload tools/workloads/agentic.jsonl --weights f32 --limit 4
    bench agentic4-f32 45 --workload tools/workloads/agentic.jsonl --weights f32 --limit 4
fi

[ -n "$UNSEEN" ] && bench unseen-bf16 90 --workload "$UNSEEN" --weights bf16
bench chat-bf16 60 --workload tools/workloads/chat.jsonl --weights bf16

start_server() {  # label, then serve flags; sets server_pid and server_dir
    server_dir=$(mktemp -d)
    env ${SERVE_ENV:-} SUFFIXD_ADMIN_TOKEN=gpu-check "$BIN" serve --model "$MODEL" --snapshot-dir "$server_dir" \
        --addr "127.0.0.1:$PORT" "${@:2}" >"$RESULTS/serve-$1.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 120); do
        python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
            "http://127.0.0.1:$PORT/metrics" 2>/dev/null && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.5
    done
}
stop_server() {
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    rm -rf "$server_dir"
}
serve_load() {  # label, then serve flags
    local label=$1
    [ "$(limit 60)" -gt 0 ] || { note "load $label: skipped (out of time)"; return; }
    start_server "$@"
    timeout "$(limit 90)" python3 tools/load.py --base "http://127.0.0.1:$PORT" \
        --requests "${REQUESTS:-${LOAD_REQUESTS:-128}}" --concurrency 32 --max-tokens 128 \
        --admin-token gpu-check >"$RESULTS/load-$label.log" 2>&1
    note "load $label (rc $?): $(tail -4 "$RESULTS/load-$label.log" | tr '\n' ' ')"
    # The server's own time in forward passes, against the run's wall time.
    python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
        "http://127.0.0.1:$PORT/metrics" 2>/dev/null | grep -E '^suffixd_verification_seconds_(sum|count)' \
        | tr '\n' ' ' >>"$RESULTS/load-$label.log"
    note "load $label metrics: $(tail -1 "$RESULTS/load-$label.log")"
    stop_server
}
# The prefix cache on the device: a repeated 2,000-token prompt against a cold one
# (PREFIX_TOKENS sets the length; the server's --max-context holds it).
prefix_ttft() {
    [ "$(limit 60)" -gt 0 ] || { note "prefix cache TTFT: skipped (out of time)"; return; }
    local tokens=${PREFIX_TOKENS:-2000}
    start_server prefix --max-context $((tokens + 1024))
    timeout "$(limit 60)" python3 tools/prefix-ttft.py --base "http://127.0.0.1:$PORT" \
        --tokens "$tokens" --rounds 5 >"$RESULTS/prefix-ttft.log" 2>&1
    note "prefix cache TTFT (rc $?): $(tail -2 "$RESULTS/prefix-ttft.log" | tr '\n' ' ')"
    stop_server
}
# Where a plain decoding step's time goes: every kernel of a few steps, timed by ncu.
NCU=${NCU:-1}
if [ "$QUICK" = 0 ] && [ "$NCU" = 1 ] && command -v ncu >/dev/null && [ "$(limit 60)" -gt 0 ]; then
    timeout "$(limit 90)" ncu --clock-control none --launch-skip 1000 --launch-count 320 \
        --metrics gpu__time_duration.sum --csv \
        "$BIN" generate --model "$MODEL" --max-tokens 64 --no-spec --cost flat \
        --chat "Write a haiku about rain." >"$RESULTS/ncu.csv" 2>"$RESULTS/ncu.err"
    note "ncu (rc $?): $(python3 tools/ncu-summary.py "$RESULTS/ncu.csv" 2>&1 | tr '\n' ' ')"
fi
if [ -n "${BASE:-}" ] && [ "$QUICK" = 0 ] && [ "$NCU" = 1 ] && command -v ncu >/dev/null && [ "$(limit 60)" -gt 0 ]; then
    env $BASE_ENV timeout "$(limit 60)" ncu --clock-control none --launch-skip 1000 --launch-count 320 \
        --metrics gpu__time_duration.sum --csv \
        "$BASE" generate --model "$MODEL" --max-tokens 64 --no-spec --cost flat \
        --chat "Write a haiku about rain." >"$RESULTS/ncu-base.csv" 2>"$RESULTS/ncu-base.err"
    note "ncu base (rc $?): $(python3 tools/ncu-summary.py "$RESULTS/ncu-base.csv" 2>&1 | tr '\n' ' ')"
fi

prefix_ttft
serve_load spec
serve_load plain --no-spec
if [ -n "${BASE:-}" ]; then
    BIN_NEW=$BIN BIN=$BASE SERVE_ENV=$BASE_ENV
    serve_load spec-base
    serve_load plain-base --no-spec
    BIN=$BIN_NEW SERVE_ENV=
fi
if [ -n "${LOAD_LONG:-}" ]; then
    REQUESTS=$LOAD_LONG serve_load "spec-$LOAD_LONG"
    REQUESTS=$LOAD_LONG serve_load "plain-$LOAD_LONG" --no-spec
fi
[ "${F32:-1}" = 1 ] && bench agentic-f32 90 --workload tools/workloads/agentic.jsonl --weights f32

# The peer on the same GPU and the same first 4 pipelines.
PEER_SECS=${PEER_SECS:-120}
if [ "$QUICK" = 0 ] && python3 -c 'import gguf' 2>/dev/null && [ "$(limit "$PEER_SECS")" -gt 0 ]; then
    PYTHONUNBUFFERED=1 timeout "$(limit "$PEER_SECS")" python3 tools/peer-transformers.py --model "$MODEL" \
        --workload tools/workloads/agentic.jsonl --limit 4 ${PEER_FLAGS:-} >"$RESULTS/peer.log" 2>&1
    note "peer (rc $?): $(grep -E '^transformers|^\{' "$RESULTS/peer.log" | tr '\n' ' ')"
else
    note "peer: skipped (no gguf package for transformers, or out of time)"
fi
# The same for candle's path (attention on the host: its time is not in these kernels).
if [ "$QUICK" = 0 ] && [ "${CANDLE:-1}" = 1 ] && [ "$NCU" = 1 ] && command -v ncu >/dev/null && [ "$(limit 45)" -gt 0 ]; then
    SUFFIXD_DEVICE_KERNELS=off timeout "$(limit 60)" ncu --clock-control none \
        --launch-skip 3000 --launch-count 1500 --metrics gpu__time_duration.sum --csv \
        "$BIN" generate --model "$MODEL" --max-tokens 64 --no-spec --cost flat --weights f32 \
        --chat "Write a haiku about rain." >"$RESULTS/ncu-candle.csv" 2>"$RESULTS/ncu-candle.err"
    note "ncu candle (rc $?): $(python3 tools/ncu-summary.py "$RESULTS/ncu-candle.csv" fast_argmax 2>&1 | head -8 | tr '\n' ' ')"
fi

kill "$clocks_pid" 2>/dev/null
note "SM clock (MHz) while the GPU was busy: $(python3 -c '
import sys, statistics
rows = [l.split(",") for l in open(sys.argv[1]) if l.count(",") == 2]
busy = sorted(int(r[1]) for r in rows if r[2].strip().isdigit() and int(r[2]) >= 10)
print(f"{len(busy)} samples, min {busy[0]}, median {statistics.median(busy)}, max {busy[-1]}" if busy else "no busy samples")
' "$RESULTS/clocks.csv" 2>&1)"
printf '%s\n' "${summary[@]}" | tee "$RESULTS/summary.txt"
