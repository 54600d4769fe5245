//! Fault points for the store's file operations, so that tests can make a write, an
//! fsync or a rename fail at any step of append, snapshot and compaction
//! (`tests/faults.rs`). They are the `fail` crate's points: compiled in only when its
//! `failpoints` feature is on, which the test build turns on and a release build does
//! not, so they cost nothing in production.
//!
//! A point configured with `return` fails with ENOSPC, the error a full disk gives;
//! `return(N)` on a write point first writes N bytes, as a write cut short by a full
//! disk does.

use std::io::Write;

/// The injected error: what a full disk returns.
fn no_space(point: &str) -> std::io::Error {
    let os = std::io::Error::from_raw_os_error(28);
    std::io::Error::new(os.kind(), format!("{os} (injected at fault point {point})"))
}

/// Fail here if the test configured `point`.
#[allow(
    unused_variables,
    reason = "read only when the fault points are compiled in"
)]
pub(crate) fn check(point: &str) -> std::io::Result<()> {
    fail::fail_point!(point, |_| Err(no_space(point)));
    Ok(())
}

/// Bytes to write before failing, when the test configured `point`.
#[allow(
    unused_variables,
    reason = "read only when the fault points are compiled in"
)]
fn partial(point: &str) -> Option<usize> {
    fail::fail_point!(point, |arg: Option<String>| Some(
        arg.and_then(|a| a.parse().ok()).unwrap_or(0)
    ));
    None
}

/// `file.write_all(bytes)`, or, when the test configured `point`, a write cut short
/// after the configured number of bytes and an error.
pub(crate) fn write_all(point: &str, file: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(n) = partial(point) {
        file.write_all(&bytes[..n.min(bytes.len())])?;
        return Err(no_space(point));
    }
    file.write_all(bytes)
}
