//! The process's resident memory: reading it and giving freed heap pages back to the
//! operating system (glibc keeps them otherwise, per thread arena, and a process that
//! freed a gigabyte goes on showing it as resident).

/// Resident set size of this process, in bytes (0 where /proc is absent).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// How many malloc arenas `serve` lets glibc keep (unless `MALLOC_ARENA_MAX` says
/// otherwise). glibc's default is eight per core, and a thread keeps the arena it first
/// allocated in: after heavy grammars on tokio's workers and the compile threads, those
/// arenas held freed pages that `malloc_trim` could not give back (292 MiB settled from
/// 229 at start; with two arenas 236, docs/structured.md). Two arenas cost no speed under load (tools/load.py,
/// 8 clients, 6 alternated runs each: median 736 tok/s against 708 uncapped).
pub const SERVER_ARENAS: i32 = 2;

/// Cap glibc's malloc arenas at `arenas`, unless the operator set `MALLOC_ARENA_MAX`
/// (glibc reads it itself, and an explicit choice wins). Call it before threads start:
/// arenas already made are kept.
pub fn limit_arenas(arenas: i32) {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a tuning parameter of glibc's allocator.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas.max(1));
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// Give freed heap pages back to the OS, every thread's arena: measurements call it so
/// that freed pages do not hide growth, the server when its model thread goes idle.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: malloc_trim only releases free memory held by glibc's allocator.
        unsafe {
            malloc_trim(0);
        }
    }
}
