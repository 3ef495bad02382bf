//! Named crash points for fault tests, usable by any crate on the write path.
//!
//! `MNEME_CRASH_AT=NAME` (or `NAME:N` for the N-th time the point is
//! reached) makes the process SIGKILL itself at that point: no destructors,
//! no flush, no buffered write reaches the kernel, exactly as an abrupt death
//! looks to the files. Unset, a crash point costs one atomic load after the
//! first call. Only a build with the `crash-points` feature (the one the
//! fault tests drive) arms them: in any other, a point is nothing and
//! `MNEME_CRASH_AT` is ignored. Each crate lists its own points; this one
//! lists the log's.

use std::sync::atomic::{AtomicU32, Ordering};

/// A place on the write path where a fault test may kill the process, by
/// its name in `MNEME_CRASH_AT`. Points are constants of the crate that
/// reaches them, so a call site cannot name a point nobody lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CrashPoint(&'static str);

impl CrashPoint {
    /// The point called `name` (lowercase, `_`-separated).
    pub const fn named(name: &'static str) -> CrashPoint {
        CrashPoint(name)
    }

    /// Its name, as `MNEME_CRASH_AT` takes it.
    pub const fn name(self) -> &'static str {
        self.0
    }
}

impl std::fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// An append is in the write-ahead file but not yet checkpointed.
pub const LOG_WAL_WRITTEN: CrashPoint = CrashPoint::named("log_wal_written");
/// A checkpoint synced its records into a segment but has not indexed them.
pub const LOG_SEGMENT_SYNCED: CrashPoint = CrashPoint::named("log_segment_synced");
/// A checkpoint made sled durable but has not emptied the write-ahead file.
pub const LOG_CHECKPOINT_SYNCED: CrashPoint = CrashPoint::named("log_checkpoint_synced");

/// The log's crash points.
pub const POINTS: &[CrashPoint] = &[LOG_WAL_WRITTEN, LOG_SEGMENT_SYNCED, LOG_CHECKPOINT_SYNCED];

/// What a process killed at a crash point says on stderr, before the name.
pub const REACHED: &str = "mneme: crash point ";

struct Armed {
    name: String,
    occurrence: u32,
    seen: AtomicU32,
}

#[cfg(not(feature = "crash-points"))]
fn armed() -> Option<&'static Armed> {
    None
}

#[cfg(feature = "crash-points")]
fn armed() -> Option<&'static Armed> {
    use std::sync::OnceLock;
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

/// Kills the process here if this point is armed and due, saying so on
/// stderr first (`mneme: crash point NAME reached: …`).
pub fn point(point: CrashPoint) {
    let Some(armed) = armed() else { return };
    if armed.name != point.name() {
        return;
    }
    if armed.seen.fetch_add(1, Ordering::Relaxed) + 1 == armed.occurrence {
        eprintln!("{REACHED}{point} reached: killing this process");
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        std::process::abort(); // not reached: SIGKILL cannot be caught
    }
}
