//! Arbitrary bytes as a WAL segment.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| suffixd::fuzzing::wal_bytes(data));
