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
