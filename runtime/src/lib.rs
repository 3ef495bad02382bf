//! The mneme runtime: wires the log, the fold and the tools into an agent
//! loop that can be killed at any instant and continued from its log.

pub mod agent;
pub mod crash;
pub mod daemon;
pub mod error;
pub mod lease;
pub mod model;
pub mod pause;
pub mod runner;
pub mod service;
pub mod session;
pub mod sink;
pub mod snapshot;
pub mod transfer;
pub mod views;

pub use error::RuntimeError;
pub use runner::{Runner, TurnEnd};
pub use session::Session;

static ORIGINAL_UMASK: std::sync::OnceLock<libc::mode_t> = std::sync::OnceLock::new();

/// Makes every file this process creates from then on readable by its user
/// only: sets the file-creation mask to 0o077 (files 0600, directories
/// 0700, sled's own included), and keeps the mask it replaced for
/// [`original_umask`] (a second call keeps the first one). The `mneme`
/// binary calls it first thing, before any thread starts.
pub fn restrict_umask() {
    // SAFETY: umask(2) has no memory-safety preconditions.
    let original = unsafe { libc::umask(0o077) };
    let _ = ORIGINAL_UMASK.set(original);
}

/// The file-creation mask the process started with, if [`restrict_umask`]
/// replaced it; `None` if it never ran (children then inherit the
/// process's own mask, nothing to restore).
///
/// NOTE for tools: restore umask. A command tool's child must not inherit
/// mneme's 0o077: set this mask in the child before it execs (`libc::umask`
/// in `pre_exec`), so the files a tool creates get the permissions its user
/// expects.
pub fn original_umask() -> Option<libc::mode_t> {
    ORIGINAL_UMASK.get().copied()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_restricted_umask_makes_private_files_and_keeps_the_original() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: umask(2) has no memory-safety preconditions.
        let before = unsafe { libc::umask(0o022) };
        unsafe { libc::umask(before) };
        super::restrict_umask();
        super::restrict_umask();
        assert_eq!(super::original_umask(), Some(before));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "secret").unwrap();
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
