#!/usr/bin/env bash
# Work per speculation call, counted instead of timed: instructions, L1 data misses and
# last-level cache misses per speculation call (`simulate::cache::Cache::speculate`, the call
# `suffixd simulate` times), under valgrind's callgrind with a fixed cache model.
#
#   tools/spec-cost.sh [BINARY...]      (default: target/release/suffixd)
#
# Wall-clock timings on a shared machine drift by a third from minute to minute; these
# counts do not, so two builds can be compared exactly on one run each. They are a
# proxy: the cost of a call is roughly its instructions plus ~100 cycles per
# last-level miss. Environment: SHARED (default ../shared), WARM (default 15266), TEST
# (default 150 requests; callgrind runs about 50 times slower than native), MODE
# (default extended), SHAPE (default linear), LL (default 8388608,16,64: an 8 MiB
# 16-way cache, about one core's share of a server's L3), TEST_FILE and WARM_FILE (default
# ShareGPT's test and train streams; e.g. TEST_FILE=target/spec-adversarial/period-3.jsonl.zst
# WARM=4000 counts one of `tools/spec-adversarial.sh`'s streams). Needs valgrind (apt
# install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${SHARED:-../shared}"
WARM="${WARM:-15266}"
TEST="${TEST:-150}"
MODE="${MODE:-extended}"
SHAPE="${SHAPE:-linear}"
LL="${LL:-8388608,16,64}"
DATA="$SHARED/data/sharegpt"
TEST_FILE="${TEST_FILE:-$DATA/test.jsonl.zst}"
WARM_FILE="${WARM_FILE:-$DATA/train.jsonl.zst}"
command -v valgrind >/dev/null || { echo "valgrind is needed: apt install valgrind" >&2; exit 1; }
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then
    cargo build --release --quiet
    BINS=(target/release/suffixd)
fi
OUT=target/spec-cost
mkdir -p "$OUT"
ARGS=(simulate --warm "$WARM_FILE" --warm-limit "$WARM" --test "$TEST_FILE"
      --test-limit "$TEST" "--$SHAPE" --mode "$MODE" --json)

echo "binary  steps  instructions/call  L1d misses/call  LL misses/call  tokens/step"
for bin in "${BINS[@]}"; do
    report=$("$bin" "${ARGS[@]}" 2>/dev/null | tail -n 1)
    profile="$OUT/$(basename "$bin").callgrind"
    valgrind --tool=callgrind --cache-sim=yes --D1=49152,12,64 --LL="$LL" \
        --toggle-collect='*simulate::*Cache::speculate*' --callgrind-out-file="$profile" \
        "$bin" "${ARGS[@]}" >/dev/null 2>&1
    totals=$(callgrind_annotate "$profile" 2>/dev/null | grep "PROGRAM TOTALS")
    python3 - "$bin" "$report" "$totals" <<'PY'
import json, re, sys
bin, report, totals = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
# Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
n = [int(x.replace(",", "")) for x in re.findall(r"([0-9][0-9,]*) \(", totals)]
if len(n) < 9:
    sys.exit(f"{bin}: no simulate Cache::speculate calls were recorded")
steps = report["steps"]
print(f"{bin}  {steps}  {n[0] / steps:.0f}  {(n[4] + n[5]) / steps:.2f}  "
      f"{(n[7] + n[8]) / steps:.2f}  {report['tokens_per_step']:.4f}")
PY
done
