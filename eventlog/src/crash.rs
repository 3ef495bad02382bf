//! Named crash points for fault tests, usable by any crate on the write path.
//!
//! `MNEME_CRASH_AT=NAME` (or `NAME:N` for the N-th time the point is
//! reached) makes the process SIGKILL itself at that point: no destructors,
//! no flush, no buffered write reaches the kernel, exactly as an abrupt death
//! looks to the files. Unset, a crash point costs one atomic load after the
//! first call. Each crate lists its own points; this one lists the log's.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The log's crash points.
pub const POINTS: &[&str] = &[
    // An append is in the write-ahead file but not yet in sled.
    "log_wal_written",
    // A checkpoint made sled durable but has not emptied the write-ahead file.
    "log_checkpoint_synced",
];

struct Armed {
    name: String,
    occurrence: u32,
    seen: AtomicU32,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("MNEME_CRASH_AT").ok()?;
            let (name, occurrence) = match spec.split_once(':') {
                Some((name, n)) => (name.to_string(), n.parse().unwrap_or(1)),
                None => (spec, 1),
            };
            Some(Armed {
                name,
                occurrence,
                seen: AtomicU32::new(0),
            })
        })
        .as_ref()
}

/// Kills the process here if this point is armed and due.
pub fn point(name: &str) {
    let Some(armed) = armed() else { return };
    if armed.name != name {
        return;
    }
    if armed.seen.fetch_add(1, Ordering::Relaxed) + 1 == armed.occurrence {
        eprintln!("mneme: crash point {name} reached: killing this process");
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        std::process::abort(); // not reached: SIGKILL cannot be caught
    }
}
