#!/usr/bin/env bash
# kill -9 recovery: a writer appends through the WAL (snapshotting every 25 appends) and
# is SIGKILLed at random moments; after each kill the store must reopen with every
# acknowledged append present exactly once. Usage: tools/crash-test.sh [kills, default 100]
set -euo pipefail
cd "$(dirname "$0")/.."
SUFFIXD_CRASH_KILLS="${1:-100}" cargo test --release --test crash -- --nocapture 2>&1 | grep -E "kills recovered|panicked|test result"
