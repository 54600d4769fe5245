//! Arbitrary bytes as a WAL segment.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| suffixd::store::fuzzing::wal_bytes(data));
