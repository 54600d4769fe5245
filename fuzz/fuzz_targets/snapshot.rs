//! Arbitrary bytes as a snapshot file: open, read, draft, check, verify.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| suffixd::fuzzing::snapshot_bytes(data));
