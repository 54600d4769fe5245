#!/usr/bin/env bash
# Fuzz the snapshot and WAL readers with cargo-fuzz (needs a nightly toolchain).
#   tools/fuzz.sh [RUNS]     (default 1000000 executions per target)
# Seeds: the checked-in version-1 snapshot, and a WAL segment that `suffixd ingest` writes
# from the bundled examples. Crashes, and inputs that run over 10 s (a loop on damaged data),
# land in fuzz/artifacts/<target>/ and fail the script.
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
log=$(mktemp)
for target in snapshot wal; do
  if ! cargo +nightly fuzz run --sanitizer none "$target" -- -runs="$runs" -max_len=65536 -timeout=10 >"$log" 2>&1; then
    # Show the panic, not just libfuzzer's last lines; keep the input as a regression fixture
    # (tests/fixtures/fuzz/<target>/) once it is fixed.
    grep -A12 -m1 "panicked" "$log" || tail -n 40 "$log"
    echo "fuzz target $target crashed; the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  grep -E "^Done|^#[0-9]+ *DONE" "$log" | tail -n 1
  echo "fuzz target $target: $runs runs, no crash"
done
rm -f "$log"
