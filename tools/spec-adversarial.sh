#!/usr/bin/env bash
# Speculation cost on repetitive text (issue 21), against the reference in one run:
# runs of one token, a short period repeated (7 distinct tokens; 9 tokens drawn from 3,
# so that tokens repeat within the period; 3 tokens drawn from 2), replies that fall
# into a loop, a synthetic agentic pipeline, and text drawn at random from 4 tokens
# (no period, every token thousands of times). Prints, per stream, suffixd's mean, p50, p99 and slowest
# speculation call and tokens/step for each BINARY (default: this checkout's release
# build), and the peer's native speculation time and tokens/step.
#
#   tools/spec-adversarial.sh [BINARY...]        (SHAPE=linear|tree, MODE=extended|paper, ROUNDS=3)
#
# Each stream is run ROUNDS times (the peer, then every binary in turn); the table gives
# the median over rounds of each figure, and each round's mean. Some streams have only
# a few dozen calls, where one hiccup of this shared machine moves the mean by a third.
#
# Streams are written once to target/spec-adversarial/ (tools/make-repetitive-streams.py
# with ShareGPT test prompts for the loops, tools/make-agentic-workload.py); all but the
# agentic one use 4,000 ShareGPT responses as the warm cache, the agentic one its own 1,200.
# The peer is built as tools/compare-peer.sh builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${SHARED:-../shared}"
SHAPE="${SHAPE:-linear}"
MODE="${MODE:-extended}"
ROUNDS="${ROUNDS:-3}"
DATA="$SHARED/data/sharegpt"
PEER_HOME="${PEER_HOME:-$HOME/.cache/suffixd-peer}"
PEER_PY="$PEER_HOME/.venv/bin/python"
OUT=target/spec-adversarial
mkdir -p "$OUT"
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then
    cargo build --release --quiet
    BINS=(target/release/suffixd)
fi
if ! "$PEER_PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    echo "== building the peer" >&2
    PEER_HOME="$PEER_HOME" bash "$SHARED/peer/build_arctic.sh" >&2
fi
zst() { "$PEER_PY" -c "import sys, zstandard; open(sys.argv[2], 'wb').write(zstandard.ZstdCompressor().compress(open(sys.argv[1], 'rb').read()))" "$1" "$2"; }
if [ ! -f "$OUT/agentic-warm.jsonl.zst" ]; then
    "$PEER_PY" -c "import sys, zstandard; sys.stdout.buffer.write(zstandard.ZstdDecompressor().stream_reader(open(sys.argv[1], 'rb')).read())" \
        "$DATA/test.jsonl.zst" > "$OUT/sharegpt-test.jsonl"
    python3 tools/make-repetitive-streams.py --kind runs --out "$OUT/runs.jsonl"
    python3 tools/make-repetitive-streams.py --kind periods --out "$OUT/periods.jsonl"
    python3 tools/make-repetitive-streams.py --kind loops --base "$OUT/sharegpt-test.jsonl" --out "$OUT/loops.jsonl"
    python3 tools/make-agentic-workload.py --tasks 100 --out "$OUT/agentic.jsonl" --seed 2
    python3 tools/make-agentic-workload.py --tasks 400 --out "$OUT/agentic-warm.jsonl" --seed 1
    for f in runs periods loops agentic agentic-warm; do zst "$OUT/$f.jsonl" "$OUT/$f.jsonl.zst"; done
fi
if [ ! -f "$OUT/periods-repeating.jsonl.zst" ]; then
    python3 tools/make-repetitive-streams.py --kind periods --period 9 --alphabet 3 \
        --sizes 1000,2000,4000,8000,16000,32000 --out "$OUT/periods-repeating.jsonl"
    zst "$OUT/periods-repeating.jsonl" "$OUT/periods-repeating.jsonl.zst"
fi
if [ ! -f "$OUT/random.jsonl.zst" ]; then
    python3 tools/make-repetitive-streams.py --kind periods --period 3 --alphabet 2 \
        --sizes 1000,4000,16000,32000 --out "$OUT/period-3.jsonl"
    python3 tools/make-repetitive-streams.py --kind random --reply 64 \
        --sizes 1000,4000,16000,32000 --out "$OUT/random.jsonl"
    for f in period-3 random; do zst "$OUT/$f.jsonl" "$OUT/$f.jsonl.zst"; done
fi
for s in runs periods periods-repeating period-3 loops agentic random; do
    if [ "$s" = agentic ]; then warm="$OUT/agentic-warm.jsonl.zst"; n=1200; else warm="$DATA/train.jsonl.zst"; n=4000; fi
    for r in $(seq 1 "$ROUNDS"); do
        "$PEER_PY" "$SHARED/peer/run_arctic.py" --train-file "$warm" --test-file "$OUT/$s.jsonl.zst" \
            --train "$n" --test 1000 "--$SHAPE" --native-timing 2>/dev/null | tail -n 1 > "$OUT/peer-$s.$r.json"
        i=0
        for bin in "${BINS[@]}"; do
            "$bin" simulate --warm "$warm" --warm-limit "$n" --test "$OUT/$s.jsonl.zst" "--$SHAPE" \
                --mode "$MODE" --json 2>/dev/null | tail -n 1 > "$OUT/suffixd-$s.$i.$r.json"
            i=$((i + 1))
        done
    done
done
python3 - "$OUT" "$ROUNDS" "${BINS[@]}" <<'PY'
import json, statistics, sys
out, rounds, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = lambda xs: statistics.median(xs)
print(f"medians of {rounds} round(s); 'means' lists each round's mean")
print(f"{'stream':17} {'binary':28} {'mean us':>8} {'p50':>7} {'p99':>8} {'max':>8} {'tok/step':>8} | {'peer us':>7} {'tok/step':>8} | {'ratio':>6} | means")
for s in ["runs", "periods", "periods-repeating", "period-3", "loops", "agentic", "random"]:
    peer = [json.load(open(f"{out}/peer-{s}.{r}.json")) for r in range(1, rounds + 1)]
    pn = med([p["native_spec_us_per_call"] for p in peer])
    for i, b in enumerate(bins):
        runs = [json.load(open(f"{out}/suffixd-{s}.{i}.{r}.json")) for r in range(1, rounds + 1)]
        m = {k: med([a[k] for a in runs]) for k in ["spec_us_per_call", "spec_us_p50", "spec_us_p99", "spec_us_max", "tokens_per_step"]}
        means = " ".join(f"{a['spec_us_per_call']:.1f}" for a in runs)
        print(f"{s:17} {b[-28:]:28} {m['spec_us_per_call']:8.1f} {m['spec_us_p50']:7.1f} {m['spec_us_p99']:8.1f} {m['spec_us_max']:8.1f} {m['tokens_per_step']:8.3f} | {pn:7.1f} {peer[0]['tokens_per_step']:8.3f} | {m['spec_us_per_call'] / pn:6.2f} | {means}")
PY
