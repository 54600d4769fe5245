#!/usr/bin/env bash
# The verifier's cost curve, t(K)/t(1) for K = 1..64, at several context lengths, for each
# weight format, and prefill tokens/s: this checkout against an older commit, built from
# the same examples/verify_cost.rs and run alternately (new, old, new, old, ...) so that
# both see the same machine. Prints each run's JSON lines, then the medians per side.
#
# Usage: tools/verify-cost.sh [--base REV] [--rounds N] [--weights q8-0,native,f32]
#          [--contexts 64,1024,4096] [--repeats 3]
# REV defaults to HEAD~1 (the previous commit); --base none measures this checkout only.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh >/dev/null

base=HEAD~1 rounds=3 weights=q8-0,native,f32 contexts=64,1024,4096 repeats=3
while [ $# -gt 0 ]; do
    case "$1" in
        --base) base=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --weights) weights=$2; shift 2 ;;
        --contexts) contexts=$2; shift 2 ;;
        --repeats) repeats=$2; shift 2 ;;
        *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
export CANDLE_NUM_THREADS="${CANDLE_NUM_THREADS:-2}"
model=$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

sides=(new)
if [ "$base" != none ]; then
    # The old commit in a worktree of its own, with this checkout's measuring example
    # (it uses only Engine::load and measure_cost_curve, which older commits have). It
    # shares target/, so only suffixd itself is compiled again; it is built first, so
    # that target/release/examples/verify_cost is this checkout's at the end.
    rev=$(git rev-parse "$base")
    tree=target/verify-cost-base
    if [ ! -d "$tree" ]; then git worktree add --detach "$tree" "$rev" >/dev/null; fi
    git -C "$tree" checkout --quiet --force --detach "$rev"
    mkdir -p "$tree/examples"
    cp examples/verify_cost.rs "$tree/examples/"
    # Both checkouts give suffixd the same artifact names in target/, and cargo's
    # freshness check reads the source paths of whichever was built last: without a
    # clean of suffixd (its own artifacts only) before each build, the second build
    # would reuse the first one's library.
    cargo clean --release --quiet -p suffixd
    CARGO_TARGET_DIR=$PWD/target cargo build --release --quiet \
        --manifest-path "$tree/Cargo.toml" --example verify_cost
    cp target/release/examples/verify_cost "$out/old"
    cargo clean --release --quiet -p suffixd
    sides=(new old)
fi
rm -f target/release/examples/verify_cost
cargo build --release --quiet --example verify_cost
cp target/release/examples/verify_cost "$out/new"
if [ -f "$out/old" ] && cmp -s "$out/old" "$out/new"; then
    echo "warning: the old and new binaries are identical; the runs compare nothing" >&2
fi

for round in $(seq "$rounds"); do
    for side in "${sides[@]}"; do
        "$out/$side" "$model" --weights "$weights" --contexts "$contexts" --repeats "$repeats" \
            | sed -u "s/^{/{\"side\":\"$side\",\"round\":$round,/" | tee -a "$out/all.jsonl"
    done
done

python3 - "$out/all.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
curves, prefill = {}, {}
for r in rows:
    if "curve" in r:
        curves.setdefault((r["weights"], r["context"], r["side"]), []).append(r)
    else:
        prefill.setdefault((r["weights"], r["side"]), []).append(r["prefill_tokens_per_s"])
print("\nmedians over rounds: t(1) in ms, then t(K)/t(1)")
for (w, c, side), runs in sorted(curves.items()):
    ks = [k for k, _ in runs[0]["curve"]]
    med = [statistics.median(dict(r["curve"])[k] for r in runs) for k in ks]
    t1 = statistics.median(r["t1_ms"] for r in runs)
    pts = " ".join(f"{k}:{v:.2f}" for k, v in zip(ks, med))
    print(f"{w:>6} ctx {c:>5} {side}: t1 {t1:6.1f} ms | {pts}")
print("\nprefill tokens/s (median)")
for (w, side), v in sorted(prefill.items()):
    print(f"{w:>6} {side}: {statistics.median(v):.1f}")
PY
