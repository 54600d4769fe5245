#!/usr/bin/env bash
# Open vs rebuild, in one run: the peer rebuilds its cache of the ShareGPT warm examples
# (`run_arctic.py`, warmup_s); suffixd opens a snapshot of the same responses, ready to
# speculate (`simulate --snapshot`, warmup_s). Also prints open time for several
# snapshot sizes, which should not grow with size.
#   tools/open-vs-rebuild.sh [WARM, default 15266]
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${SHARED:-../shared}"
DATA="$SHARED/data/sharegpt"
WARM="${1:-15266}"
PEER_HOME="${PEER_HOME:-$HOME/.cache/suffixd-peer}"
PEER_PY="$PEER_HOME/.venv/bin/python"
if ! "$PEER_PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    PEER_HOME="$PEER_HOME" bash "$SHARED/peer/build_arctic.sh" >&2
fi
cargo build --release --quiet
BIN=target/release/suffixd
OUT=target/open-vs-rebuild
rm -rf "$OUT" && mkdir -p "$OUT"
for n in 1000 4000 "$WARM"; do
    { zstd -dc "$DATA/train.jsonl.zst" 2>/dev/null || true; } | head -n "$n" > "$OUT/warm-$n.jsonl"
    $BIN build --logs "$OUT/warm-$n.jsonl" --out "$OUT/store-$n" --keep-last 20000 >/dev/null
    ms=$($BIN inspect "$OUT/store-$n" --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(f\"{d['open_ms']:.3f} ms for {d['file_bytes']} bytes, {d['header']['tokens']} tokens\")")
    echo "open: $ms"
done
ours=$($BIN simulate --snapshot "$OUT/store-$WARM" --test "$DATA/test.jsonl.zst" --test-limit 1 \
    --max-cached-requests 20000 --json 2>/dev/null | tail -1 | python3 -c "import json,sys; print(json.load(sys.stdin)['warmup_s'])")
peer=$(cd "$SHARED/peer" && "$PEER_PY" run_arctic.py --train "$WARM" --test 1 --linear --max-cached-requests 20000 2>/dev/null | tail -1 \
    | python3 -c "import json,sys; print(json.load(sys.stdin)['warmup_s'])")
python3 -c "print(f'peer rebuild {float($peer):.2f} s, suffixd open (ready to speculate) {float($ours)*1e3:.2f} ms: {float($peer)/float($ours):.0f}x')"
