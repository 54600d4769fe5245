#!/usr/bin/env bash
# Fuzz the snapshot and WAL readers with cargo-fuzz (needs a nightly toolchain).
#   tools/fuzz.sh [RUNS]     (default 1000000 executions per target)
# Seeds: the checked-in version-1 snapshot, and a WAL segment that `suffixd ingest` writes
# from the bundled examples. Crashes land in fuzz/artifacts/<target>/ and fail the script.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-1000000}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p fuzz/corpus/snapshot fuzz/corpus/wal
cp tests/fixtures/v1/store/*.sfxd fuzz/corpus/snapshot/ 2>/dev/null || true
seed=$(mktemp -d)
cargo run --release --quiet -- ingest --dir "$seed" --logs examples/data/test.jsonl.zst >/dev/null
cp "$seed"/wal-*.log fuzz/corpus/wal/
rm -rf "$seed"
for target in snapshot wal; do
  cargo +nightly fuzz run --sanitizer none "$target" -- -runs="$runs" -max_len=65536 2>&1 | tail -n 3
done
