//! Waiting for a condition instead of sleeping: [`eventually`] polls a
//! check until it holds and fails naming what it waited for and what it
//! saw last.
//!
//! A test that waits for the daemon (or a tool, a server, a file) to have
//! done something polls for it with [`eventually`]. A sleep stays only
//! where the point is that time passes (an approval's expiry, a lease's
//! time to live, "nothing happens within 2 s"), and says so in a comment.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// The first wait between two polls; each wait after it is twice the one
/// before, up to [`MAX_INTERVAL`]: quick to see a condition that holds
/// soon, light on a daemon when it takes seconds.
const FIRST_INTERVAL: Duration = Duration::from_millis(5);
/// The longest wait between two polls.
const MAX_INTERVAL: Duration = Duration::from_millis(50);

/// What a check says: done (with what the wait returns), or not yet (with
/// what it saw, for the failure message).
///
/// `bool` (true: done), `Option<T>` (`Some(t)`: done with `t`) and
/// `Result<T, E>` (`Ok(t)`: done with `t`; `Err(e)`: not yet, having seen
/// `e`) are checks. A check whose last observation helps the failure
/// message returns a `Result` with what it saw as the error.
pub trait Check {
    /// What [`eventually`] returns once the check holds.
    type Output;
    /// `Ok` when done, else what was seen.
    fn outcome(self) -> Result<Self::Output, String>;
}

impl Check for bool {
    type Output = ();
    fn outcome(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("false".into())
        }
    }
}

impl<T> Check for Option<T> {
    type Output = T;
    fn outcome(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

impl<T, E: Display> Check for Result<T, E> {
    type Output = T;
    fn outcome(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Polls `check` (every 5 ms at first, then less often, at most every
/// 50 ms) until it holds, and returns what it returned; panics naming
/// `what` and the last observation once `timeout` has passed, also when a
/// check is still running then.
pub async fn eventually<C, F, Fut>(what: impl Display, timeout: Duration, mut check: F) -> C::Output
where
    C: Check,
    F: FnMut() -> Fut,
    Fut: Future<Output = C>,
{
    let started = Instant::now();
    let mut interval = FIRST_INTERVAL;
    let mut last = String::from("no check finished");
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, check()).await {
            Ok(outcome) => match outcome.outcome() {
                Ok(done) => return done,
                Err(seen) => last = seen,
            },
            Err(_) => last = format!("a check still running at the deadline (before it: {last})"),
        }
        if started.elapsed() >= timeout {
            panic!("waited {timeout:?} for {what}; last seen: {last}");
        }
        tokio::time::sleep(interval.min(timeout.saturating_sub(started.elapsed()))).await;
        interval = (interval * 2).min(MAX_INTERVAL);
    }
}

/// [`eventually`] for code without an async runtime (benchmarks, a
/// blocking helper): blocks the thread between polls.
pub fn eventually_blocking<C, F>(what: impl Display, timeout: Duration, mut check: F) -> C::Output
where
    C: Check,
    F: FnMut() -> C,
{
    let started = Instant::now();
    let mut interval = FIRST_INTERVAL;
    loop {
        let last = match check().outcome() {
            Ok(done) => return done,
            Err(seen) => seen,
        };
        if started.elapsed() >= timeout {
            panic!("waited {timeout:?} for {what}; last seen: {last}");
        }
        std::thread::sleep(interval.min(timeout.saturating_sub(started.elapsed())));
        interval = (interval * 2).min(MAX_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn returns_what_the_check_found_once_it_holds() {
        let polls = AtomicU32::new(0);
        let found = eventually("the third poll", Duration::from_secs(5), || async {
            let n = polls.fetch_add(1, Ordering::Relaxed) + 1;
            (n >= 3).then_some(n)
        })
        .await;
        assert_eq!(found, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "waited 50ms for the impossible; last seen: saw 1")]
    async fn panics_naming_what_and_the_last_observation() {
        eventually("the impossible", Duration::from_millis(50), || async {
            Err::<(), _>("saw 1")
        })
        .await;
    }

    #[tokio::test]
    #[should_panic(expected = "a check still running at the deadline")]
    async fn a_hung_check_fails_at_the_deadline() {
        eventually("an answer", Duration::from_millis(50), || async {
            std::future::pending::<bool>().await
        })
        .await;
    }

    #[test]
    fn blocking_polls_too() {
        let mut n = 0;
        eventually_blocking("the second poll", Duration::from_secs(5), || {
            n += 1;
            n >= 2
        });
        assert_eq!(n, 2);
    }
}
