#!/usr/bin/env bash
# Side-by-side with the reference implementation (ArcticInference 0.3.0's suffix
# decoding core), in one run on this machine, on the same token streams.
#
#   tools/compare-peer.sh [WARM_SIZES...]        (default: 4000 15266)
#
# Environment: SHARED (default ../shared), TEST (default 1000 test requests),
# SHAPES (default "linear tree"), MODES (default "paper extended"), REPEAT (default 1):
# with REPEAT=N both sides run N times, taking turns, and every figure is the median of
# its N runs (timings on a shared machine drift; a single run can be off by a third).
# It builds the peer with $SHARED/peer/build_arctic.sh (once; about a minute), builds
# suffixd in release mode, runs both with vLLM's defaults, and prints one table of
# figures and ratios. Raw JSON lines go to target/compare-peer/.
#
# Two speculation times are shown against the peer's native figure. "spec us" is
# suffixd's own call as decoding pays for it, on cold caches. The peer's native figure is
# taken by calling its native speculation again right after the same speculation through
# its Python API, so its tree is warm; "replayed" is suffixd timed the same way (the same
# call, replayed from a copy of the speculator's state, see `simulate --replay-timing`).
# On a busy host the cold figure moves with the memory traffic of other tenants and the
# replayed one much less, which is why the first ratio drifts from run to run.
#
# BASE=path/to/suffixd also runs an older binary in the same turns and prints its row
# under the new one's ("base"), so that a change is judged against its baseline measured
# in the same run rather than against figures from another day.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${SHARED:-../shared}"
TEST="${TEST:-1000}"
REPEAT="${REPEAT:-1}"
SHAPES="${SHAPES:-linear tree}"
MODES="${MODES:-paper extended}"
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(4000 15266)
DATA="$SHARED/data/sharegpt"
PEER_HOME="${PEER_HOME:-$HOME/.cache/suffixd-peer}"
PEER_PY="$PEER_HOME/.venv/bin/python"
OUT=target/compare-peer
mkdir -p "$OUT"

if ! "$PEER_PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    echo "== building the peer" >&2
    PEER_HOME="$PEER_HOME" bash "$SHARED/peer/build_arctic.sh" >&2
fi
echo "== building suffixd" >&2
cargo build --release --quiet
BIN=target/release/suffixd
BASE="${BASE:-}"
SIDES=(suffixd)
[ -z "$BASE" ] || SIDES+=(base)

for r in $(seq "$REPEAT"); do
    for n in "${SIZES[@]}"; do
        for shape in $SHAPES; do
            echo "== peer: warm $n, $shape (run $r of $REPEAT)" >&2
            "$PEER_PY" "$SHARED/peer/run_arctic.py" --train-file "$DATA/train.jsonl.zst" \
                --test-file "$DATA/test.jsonl.zst" --train "$n" --test "$TEST" "--$shape" \
                --native-timing 2>/dev/null | tail -n 1 > "$OUT/peer-$n-$shape.$r.json"
            for mode in $MODES; do
                for side in "${SIDES[@]}"; do
                    bin="$BIN"
                    [ "$side" = suffixd ] || bin="$BASE"
                    echo "== $side ($mode): warm $n, $shape (run $r of $REPEAT)" >&2
                    args=(simulate --warm "$DATA/train.jsonl.zst" --warm-limit "$n"
                          --test "$DATA/test.jsonl.zst" --test-limit "$TEST" "--$shape" --mode "$mode" --json)
                    "$bin" "${args[@]}" 2>/dev/null | tail -n 1 > "$OUT/$side-$n-$shape-$mode.$r.json"
                    # The replayed figure comes from a run of its own, so that the replays
                    # cannot warm anything for the cold figure above.
                    "$bin" "${args[@]}" --replay-timing 2>/dev/null | tail -n 1 \
                        > "$OUT/$side-replay-$n-$shape-$mode.$r.json"
                done
            done
        done
    done
done

python3 - "$OUT" "$SHAPES" "$MODES" "$REPEAT" "${SIDES[*]}" "${SIZES[@]}" <<'PY'
import json, statistics, sys
out, shapes, modes, repeat, sides, sizes = (sys.argv[1], sys.argv[2].split(), sys.argv[3].split(),
                                            int(sys.argv[4]), sys.argv[5].split(), sys.argv[6:])

class Median(dict):
    """The runs of one configuration, read as one: each numeric figure is their median."""
    def __missing__(self, key):
        return statistics.median(run[key] for run in self.runs)

def load(name):
    m = Median()
    m.runs = [json.load(open(f"{out}/{name}.{r}.json")) for r in range(1, repeat + 1)]
    return m

if repeat > 1:
    print(f"medians of {repeat} runs each")
print("warm   shape  mode      tok/step (peer)   ratio | spec us (peer native) ratio | replayed ratio | update us/tok (peer) ratio | warm-up s (peer) speedup | B/token (peer)")
for n in sizes:
    for shape in shapes:
        p = load(f"peer-{n}-{shape}")
        for mode, side in ((m, s) for m in modes for s in sides):
            s = load(f"{side}-{n}-{shape}-{mode}")
            replayed = load(f"{side}-replay-{n}-{shape}-{mode}")['spec_replay_us_per_call']
            label = mode if side == "suffixd" else f"{mode[:3]}/base"
            print(f"{n:>6} {shape:<6} {label:<8} "
                  f"{s['tokens_per_step']:.4f} ({p['tokens_per_step']:.4f}) {s['tokens_per_step']/p['tokens_per_step']:6.4f} | "
                  f"{s['spec_us_per_call']:6.2f} ({p['native_spec_us_per_call']:6.2f}) {s['spec_us_per_call']/p['native_spec_us_per_call']:5.2f} | "
                  f"{replayed:6.2f} {replayed/p['native_spec_us_per_call']:5.2f} | "
                  f"{s['update_us_per_token']:6.3f} ({p['update_us_per_token']:6.3f}) {s['update_us_per_token']/p['update_us_per_token']:5.3f} | "
                  f"{s['warmup_s']:6.2f} ({p['warmup_s']:6.2f}) {p['warmup_s']/max(s['warmup_s'],1e-9):5.1f}x | "
                  f"{s['store_bytes_per_token']:5.1f} ({p['rss_bytes_per_cached_token']:5.1f})")
PY
