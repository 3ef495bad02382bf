//! Named crash points for fault tests.
//!
//! `MNEME_CRASH_AT=NAME` (or `NAME:N` for the N-th time the point is
//! reached) makes the process SIGKILL itself at that point: no destructors,
//! no flush, exactly as a power cut looks to the process. Unset, a crash
//! point costs one relaxed load.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Every crash point on the write path, in the order a step reaches them.
pub const POINTS: &[&str] = &[
    "user_message_appended",
    "before_model_call",
    "model_replied_before_append",
    "model_reply_appended",
    "tool_started_appended",
    "tool_started_durable",
    "tool_returned",
    "tool_finished_appended",
    "turn_answered",
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
        std::process::abort();
    }
}
