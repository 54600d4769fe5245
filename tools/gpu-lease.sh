#!/usr/bin/env bash
# A lent GPU's checks in three calls (issue 63; docs/gpu.md, "Running the checks on a
# lent machine"). A call carries at most 64 MiB, the tree included, and a lease keeps
# nothing between leases, so everything is built and packed here first and the device's
# minutes go to running it.
#
# Here (no GPU needed; 21 minutes on two cores after a source change, with target/cuda
# kept from an earlier build; a minute and a half when nothing changed):
#   tools/gpu-lease.sh pack
# builds the CUDA binaries (suffixd, shape_cost, the `verify` and `families` test
# binaries), checks that NVRTC compiles every kernel (`--lib cuda` tests) and that the
# families' GPU test passes on the CPU through tools/cuda-on-cpu (PREFLIGHT=0 skips
# it), writes the default model's vocabulary, strips and compresses the binaries, cuts
# the model in two, and leaves three folders, each under the limit with the tree:
#   target/lease/1  the model's first part, suffixd and verify (call 1)
#   target/lease/2  the model's other part (and UNSEEN, when set at pack time) (call 2)
#   target/lease/3  shape_cost, families and the vocabulary (call 3)
# then prints the three calls. There, on one warm machine, one after another (a machine
# idles back after some 30 s, and /tmp is kept only while it is warm):
#   call 1, carrying target/lease/1:  tools/gpu-lease.sh stash
#   call 2, carrying target/lease/2:  [gpu-check.sh's settings] tools/gpu-lease.sh check
#   call 3, carrying target/lease/3:  [gpu-shapes.sh's settings] tools/gpu-lease.sh shapes
# `check` joins the model (its SHA-256 checked against pack's), unpacks the binaries and
# runs tools/gpu-check.sh with whatever settings its environment has (QUICK, BASE_ENV,
# DEADLINE, ...); `shapes` runs tools/gpu-shapes.sh. Each puts its results' folder as one
# tarball, and its summary beside it, under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

LEASE=target/lease
STASH=/tmp/stash
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
# What a call may carry, the tree included.
CALL_LIMIT=$((64 * 1024 * 1024))

tree_bytes() {
    git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1
}

# The path of a test binary of the CUDA build, built if it is not (cargo prints it).
test_binary() {
    CARGO_COMMAND=test tools/build-cuda.sh --no-run --message-format=json --test "$1" \
        | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1" | tail -1
}

unpack_binary() {  # source (.xz), destination
    xz -dc "$1" >"$2"
    chmod +x "$2"
}

pack_binary() {  # source, destination (.xz)
    local stripped
    stripped=$(mktemp)
    strip -o "$stripped" "$1"
    xz -6 -T0 -c "$stripped" >"$2"
    rm -f "$stripped"
}

pack() {
    [ -f "$MODEL" ] || { echo "no $MODEL: run tools/setup.sh first" >&2; exit 1; }
    tools/build-cuda.sh
    tools/build-cuda.sh --example shape_cost
    echo "checking that NVRTC compiles every kernel" >&2
    CARGO_COMMAND=test tools/build-cuda.sh --lib cuda
    local verify families
    verify=$(test_binary verify)
    families=$(test_binary families)
    [ -x "$verify" ] && [ -x "$families" ] || { echo "test binaries not found" >&2; exit 1; }
    # The families' GPU test on the CPU through the emulated driver (tools/cuda-on-cpu,
    # two minutes): a kernel or launch that computes the wrong thing fails here, not on
    # the lease's minutes. PREFLIGHT=0 skips it.
    if [ "${PREFLIGHT:-1}" != 0 ]; then
        echo "the families' GPU test on the emulated driver" >&2
        tools/cuda-on-cpu/check.sh
    fi

    rm -rf "$LEASE"
    mkdir -p "$LEASE/1" "$LEASE/2" "$LEASE/3"
    pack_binary target/cuda/release/suffixd "$LEASE/1/suffixd.xz"
    pack_binary "$verify" "$LEASE/1/verify.xz"
    pack_binary target/cuda/release/examples/shape_cost "$LEASE/3/shape_cost.xz"
    pack_binary "$families" "$LEASE/3/families.xz"
    # The CPU build writes the vocabulary (the CUDA one would need a driver to start).
    cargo build --release --example shape_cost
    target/release/examples/shape_cost --write-vocabulary "$MODEL" "$LEASE/3/vocab.gguf"

    local tree model first
    tree=$(tree_bytes)
    model=$(stat -c %s "$MODEL")
    # Calls 1 and 2 carry about as much: the model's first part beside the binaries,
    # the rest alone.
    first=$(((model - $(du -cb "$LEASE/1" | tail -1 | cut -f1)) / 2))
    [ "$first" -gt 0 ] || first=0
    head -c "$first" "$MODEL" >"$LEASE/1/model.a"
    tail -c +"$((first + 1))" "$MODEL" >"$LEASE/2/model.b"
    sha256sum <"$MODEL" | cut -d' ' -f1 >"$LEASE/2/model.sha256"
    if [ -n "${UNSEEN:-}" ]; then cp "$UNSEEN" "$LEASE/2/unseen.jsonl"; fi

    local part bytes failed=0
    for part in 1 2 3; do
        bytes=$(($(du -cb "$LEASE/$part" | tail -1 | cut -f1) + tree))
        echo "call $part carries $((bytes / 1048576)) MiB with the tree ($((tree / 1048576)) MiB)" >&2
        [ "$bytes" -le "$CALL_LIMIT" ] || { echo "call $part is over the 64 MiB limit" >&2; failed=1; }
    done
    [ "$failed" = 0 ] || exit 1
    cat <<EOF
Packed. On a lent machine, one call after another:
  1. carry ["$LEASE/1"]: tools/gpu-lease.sh stash
  2. carry ["$LEASE/2"]: QUICK=1 NCU=0 F32=0 BASE_ENV=SUFFIXD_CUDA_PDL=off VARIANT_ENV=SUFFIXD_CUDA_PERSISTENT=on DEADLINE=300 tools/gpu-lease.sh check
  3. carry ["$LEASE/3"]: TUNE=1 VARIANT_ENV=SUFFIXD_CUDA_PERSISTENT=on DEADLINE=300 tools/gpu-lease.sh shapes
(timeout_s a minute above DEADLINE; results come back as \$OUT/*.tar.gz and *.txt)
EOF
}

stash() {
    [ -f "$LEASE/1/model.a" ] || { echo "no $LEASE/1: carry it (pack first)" >&2; exit 1; }
    mkdir -p "$STASH"
    cp "$LEASE/1/model.a" "$STASH/"
    unpack_binary "$LEASE/1/suffixd.xz" "$STASH/suffixd"
    unpack_binary "$LEASE/1/verify.xz" "$STASH/verify"
    ls -l "$STASH"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
}

# Results' folder $1 to $OUT as one tarball, its summary beside it (a call brings back
# a handful of files).
bring_back() {
    local out=${OUT:-target/lease/out}
    mkdir -p "$out"
    tar -C "$(dirname "$1")" -czf "$out/$(basename "$1").tar.gz" "$(basename "$1")"
    [ -f "$1/summary.txt" ] && cp "$1/summary.txt" "$out/$(basename "$1")-summary.txt"
    ls -l "$out"
}

check() {
    [ -f "$STASH/model.a" ] || { echo "no $STASH/model.a: call 1 (stash) must run first on this warm machine" >&2; exit 1; }
    [ -f "$LEASE/2/model.b" ] || { echo "no $LEASE/2: carry it" >&2; exit 1; }
    cat "$STASH/model.a" "$LEASE/2/model.b" >/tmp/model.gguf
    if [ "$(sha256sum </tmp/model.gguf | cut -d' ' -f1)" != "$(cat "$LEASE/2/model.sha256")" ]; then
        echo "the joined model's SHA-256 is not pack's: the parts are of different packs" >&2
        exit 1
    fi
    local unseen=""
    [ -f "$LEASE/2/unseen.jsonl" ] && unseen=$PWD/$LEASE/2/unseen.jsonl
    mkdir -p /tmp/gpu-check
    local rc=0
    BIN=$STASH/suffixd TEST_BIN=$STASH/verify MODEL=/tmp/model.gguf UNSEEN=${UNSEEN:-$unseen} \
        RESULTS=/tmp/gpu-check tools/gpu-check.sh >/tmp/gpu-check/run.log 2>&1 || rc=$?
    tail -60 /tmp/gpu-check/run.log
    echo "gpu-check.sh: rc $rc"
    bring_back /tmp/gpu-check
}

shapes() {
    [ -f "$LEASE/3/shape_cost.xz" ] || { echo "no $LEASE/3: carry it (pack first)" >&2; exit 1; }
    unpack_binary "$LEASE/3/shape_cost.xz" /tmp/shape_cost
    unpack_binary "$LEASE/3/families.xz" /tmp/families
    mkdir -p /tmp/gpu-shapes
    local rc=0
    BIN=/tmp/shape_cost TEST_BIN=/tmp/families VOCAB=$LEASE/3/vocab.gguf RESULTS=/tmp/gpu-shapes \
        tools/gpu-shapes.sh >/tmp/gpu-shapes/run.log 2>&1 || rc=$?
    tail -60 /tmp/gpu-shapes/run.log
    echo "gpu-shapes.sh: rc $rc"
    bring_back /tmp/gpu-shapes
}

case "${1:-}" in
    pack | stash | check | shapes) "$1" ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
