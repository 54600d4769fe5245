#!/usr/bin/env bash
# Plain decoding speed with and without one competing busy process, alternated.
#
#   tools/contention.sh [ROUNDS] [BINARY]
#
# Runs `suffixd generate --no-spec` (greedy, 256 tokens, the default model, threads as
# CANDLE_NUM_THREADS or the machine's cores) ROUNDS times idle and ROUNDS times beside
# `sh -c 'while :; do :; done'` at normal priority, alternating, and prints every figure
# and the medians. A server on a shared host should keep at least half its idle speed
# when one core is taken.
set -euo pipefail
rounds="${1:-3}"
binary="${2:-target/release/suffixd}"
prompt='Write a short story about a lighthouse keeper who finds a message in a bottle.'
speed() {
  "$binary" generate --no-spec --chat "$prompt" --max-tokens 256 --cost flat --json 2>/dev/null |
    tail -1 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["tokens_per_s"], 1))'
}
idle=(); busy=()
for ((r = 1; r <= rounds; r++)); do
  idle+=("$(speed)")
  sh -c 'while :; do :; done' &
  spinner=$!
  sleep 0.5
  busy+=("$(speed)")
  kill "$spinner"; wait "$spinner" 2>/dev/null || true
  echo "round $r: idle ${idle[-1]} tok/s, one busy process ${busy[-1]} tok/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mi=$(median "${idle[@]}"); mb=$(median "${busy[@]}")
echo "median: idle $mi tok/s, one busy process $mb tok/s ($(python3 -c "print(round($mb / $mi * 100))")% kept)"
