//! A lone barrier syncs on its own thread.
//!
//! When one session is at work, each of its synced barriers finds no other
//! in flight, and handing the `fdatasync` to the sync thread costs two
//! thread wake-ups for nothing to share: the request wakes the sync
//! thread, its answer wakes the caller. Such a barrier runs the
//! `fdatasync` itself instead, on the caller's tokio worker (a multi-thread
//! runtime's: the other workers take its tasks meanwhile). A barrier is
//! lone when none other is in flight and the last [`LONE_STREAK`] were
//! lone too, so that many sessions at once keep sharing the sync thread's
//! `fdatasync`s and no worker waits on the disk while others queue.
//! Measured: one session's step half the context switches, a fifth faster
//! (docs/dev/performance.md).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Barriers in a row that met no other before one syncs on its own
/// thread.
pub(super) const LONE_STREAK: u32 = 4;

/// Synced barriers in flight, and how many in a row met no other.
#[derive(Default)]
pub(super) struct Barriers {
    in_flight: AtomicUsize,
    streak: AtomicU32,
    /// Tests: barriers found lone so far.
    #[cfg(test)]
    pub(super) lone: std::sync::atomic::AtomicU64,
}

/// A barrier in flight, counted until dropped (also when its future is).
pub(super) struct InFlight<'a> {
    barriers: &'a Barriers,
    /// Whether this barrier may run its `fdatasync` on its own thread.
    pub(super) lone: bool,
}

impl Barriers {
    /// Counts a barrier in: lone if none other is in flight after a streak
    /// of such barriers, and the caller runs on a multi-thread runtime.
    pub(super) fn enter(&self) -> InFlight<'_> {
        let alone = self.in_flight.fetch_add(1, Ordering::AcqRel) == 0;
        let streak = match alone {
            true => self.streak.fetch_add(1, Ordering::AcqRel).saturating_add(1),
            false => {
                self.streak.store(0, Ordering::Release);
                0
            }
        };
        let lone = streak > LONE_STREAK && on_many_workers();
        #[cfg(test)]
        self.lone.fetch_add(u64::from(lone), Ordering::Relaxed);
        InFlight {
            barriers: self,
            lone,
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.barriers.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether the caller runs on a tokio runtime with several workers (a
/// current-thread runtime would stop everything while its one thread waits
/// on the disk).
fn on_many_workers() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_barrier_is_lone_after_a_streak_of_barriers_that_met_no_other() {
        let barriers = Barriers::default();
        for _ in 0..LONE_STREAK {
            assert!(!barriers.enter().lone);
        }
        assert!(barriers.enter().lone);
        let first = barriers.enter();
        assert!(first.lone);
        let second = barriers.enter();
        assert!(!second.lone, "another was in flight");
        drop((first, second));
        for _ in 0..LONE_STREAK {
            assert!(!barriers.enter().lone, "the streak starts again");
        }
        assert!(barriers.enter().lone);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_current_thread_runtime_never_syncs_on_its_thread() {
        let barriers = Barriers::default();
        for _ in 0..3 * LONE_STREAK {
            assert!(!barriers.enter().lone);
        }
    }
}
