//! Memory the daemon's allocator holds but no longer uses.

/// Hands the allocator's free memory back to the system. glibc's malloc
/// keeps what a large piece of work freed (a fork reads and writes its
/// parent's whole history) in its per-thread arenas, where it counts in
/// the process's RSS until the same thread allocates as much again: 20
/// forks of a 48 MB session left an idle daemon at ~1 GB.
pub(crate) fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim(3) has no preconditions; it only releases free
    // memory.
    unsafe {
        libc::malloc_trim(0);
    }
}
