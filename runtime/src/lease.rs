//! Holding a session's lease while a turn runs: acquired before the turn's
//! first append, renewed in the background, released when the turn ends.
//!
//! On a store that several processes share, the lease is what makes one
//! process the session's only writer; its token fences the log's appends, so
//! a holder that stopped renewing (paused, partitioned) and was taken over
//! cannot write again. On sled, one process holds the whole store and the
//! lease is granted at once.

use eventlog::{EventLog, Lease, LogError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long a lease lasts unless renewed, by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// How long past its expiry a lapsing lease is still waited for: the
/// store's clock may run behind this host's.
const LAPSE_MARGIN: Duration = Duration::from_secs(2);

/// This process's name as a lease owner: host, pid and a random part, so a
/// restarted process with the same pid is another owner.
pub fn owner_name(role: &str) -> String {
    let nonce = Uuid::now_v7().simple().to_string();
    format!(
        "{role}@{}:{}:{}",
        host_name(),
        std::process::id(),
        &nonce[24..]
    )
}

/// True only when `owner` (an [`owner_name`]) names a process on this host
/// that is no longer running: its lease can only lapse, never be renewed.
/// False whenever that cannot be told (another host, a foreign name).
pub fn owner_has_exited(owner: &str) -> bool {
    let mut parts = owner.split_once('@').map_or("", |(_, at)| at).split(':');
    let (Some(host), Some(pid), Some(_nonce), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    host == host_name()
        && pid.parse::<u32>().is_ok_and(|pid| pid > 0)
        && std::path::Path::new("/proc/self").exists()
        && process_has_exited(pid)
}

/// Whether process `pid` is gone, or dead and waiting to be reaped.
fn process_has_exited(pid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // `PID (NAME) STATE …`; NAME may hold spaces and parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z' | 'X'))
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// A lease held for as long as this value lives, renewed every third of its
/// time to live. [`HeldLease::release`] gives it up once the session is at
/// rest; dropping it otherwise (the turn failed, was paused by a shutdown,
/// or never finished) lets it lapse at once, so that any daemon sharing the
/// store takes the session over on its next look.
pub struct HeldLease {
    log: Arc<dyn EventLog>,
    lease: Arc<Mutex<Lease>>,
    renewer: tokio::task::JoinHandle<()>,
    released: bool,
}

impl HeldLease {
    /// Takes `session`'s lease for `owner`; [`LogError::LeaseHeld`] if
    /// another owner holds a live one. Must be called within a tokio runtime.
    pub async fn acquire(
        log: Arc<dyn EventLog>,
        session: Uuid,
        owner: &str,
        ttl: Duration,
    ) -> Result<HeldLease, LogError> {
        let lease = Arc::new(Mutex::new(log.acquire_lease(session, owner, ttl).await?));
        let renewer = tokio::spawn(renew(log.clone(), lease.clone(), ttl));
        Ok(HeldLease {
            log,
            lease,
            renewer,
            released: false,
        })
    }

    /// Like [`HeldLease::acquire`], except that a lease held by a process of
    /// this host that has exited (see [`owner_has_exited`]) is waited out: it
    /// can only lapse. Gives up with [`LogError::LeaseHeld`] if it has not
    /// lapsed by its expiry (or one `ttl`, whichever is later: the store's
    /// clock may be behind this host's) and a little more.
    pub async fn acquire_after_exited(
        log: Arc<dyn EventLog>,
        session: Uuid,
        owner: &str,
        ttl: Duration,
    ) -> Result<HeldLease, LogError> {
        let mut waiting_until = None;
        loop {
            let (holder, expires_ms) =
                match HeldLease::acquire(log.clone(), session, owner, ttl).await {
                    Err(LogError::LeaseHeld {
                        owner, expires_ms, ..
                    }) if owner_has_exited(&owner) => (owner, expires_ms),
                    acquired => return acquired,
                };
            let left = eventlog::time_left(expires_ms);
            let until = *waiting_until.get_or_insert_with(|| {
                crate::log_line!("mneme: session {session} is leased to {holder}, which has exited; waiting {left:.1?} for the lease to lapse");
                Instant::now() + left.max(ttl) + LAPSE_MARGIN
            });
            if Instant::now() > until {
                return Err(LogError::LeaseHeld {
                    session,
                    owner: holder,
                    expires_ms,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The lease's fencing token.
    pub fn token(&self) -> u64 {
        self.current().token
    }

    /// Gives the lease up: the session is at rest, nobody needs to take it
    /// over.
    pub async fn release(mut self) {
        self.renewer.abort();
        self.released = true;
        let lease = self.current();
        if let Err(e) = self.log.release_lease(&lease).await {
            crate::warn_line!("mneme: releasing the lease of {}: {e}", lease.session);
        }
    }

    /// Lets the lease lapse now, as dropping it does, but waits until the
    /// store has it: for a holder about to exit, whose runtime may not run
    /// the task a drop leaves.
    pub async fn lapse(mut self) {
        self.renewer.abort();
        self.released = true;
        let lease = self.current();
        match self.log.renew_lease(&lease, Duration::ZERO).await {
            Ok(_) | Err(LogError::Fenced { .. }) => {}
            Err(e) => crate::warn_line!("mneme: handing over the lease of {}: {e}", lease.session),
        }
    }

    fn current(&self) -> Lease {
        self.lease.lock().expect("lease lock").clone()
    }
}

/// Renews until the lease is lost or the holder is dropped. A lost lease
/// needs no action here: the log refuses the old holder's next append.
async fn renew(log: Arc<dyn EventLog>, lease: Arc<Mutex<Lease>>, ttl: Duration) {
    let mut every = tokio::time::interval(ttl / 3);
    every.tick().await;
    loop {
        every.tick().await;
        let current = lease.lock().expect("lease lock").clone();
        match log.renew_lease(&current, ttl).await {
            Ok(renewed) => *lease.lock().expect("lease lock") = renewed,
            Err(e @ LogError::Fenced { .. }) => {
                crate::warn_line!("mneme: {e}");
                return;
            }
            // The store is unreachable: try again; if it stays so past the
            // time to live, another process takes over and fences this one.
            Err(e) => crate::warn_line!("mneme: renewing the lease of {}: {e}", current.session),
        }
    }
}

impl Drop for HeldLease {
    /// Unless released: the lease lapses now (a lease already taken over is
    /// left alone, its token no longer matches), in a task of the runtime
    /// the holder was dropped in (a drop cannot wait for the store).
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.renewer.abort();
        let (log, lease) = (self.log.clone(), self.current());
        let lapse = async move {
            match log.renew_lease(&lease, Duration::ZERO).await {
                Ok(_) | Err(LogError::Fenced { .. }) => {}
                Err(e) => {
                    crate::warn_line!("mneme: handing over the lease of {}: {e}", lease.session)
                }
            }
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(lapse);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_has_not_exited() {
        assert!(!owner_has_exited(&owner_name("cli")));
    }

    #[test]
    fn a_reaped_process_on_this_host_has_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(owner_has_exited(&format!(
            "cli@{}:{pid}:0a1b2c3d",
            host_name()
        )));
    }

    #[test]
    fn a_dead_process_not_yet_reaped_has_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let owner = format!("cli@{}:{}:0a1b2c3d", host_name(), child.id());
        let started = std::time::Instant::now();
        while !owner_has_exited(&owner) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never seen dead"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            child.try_wait().unwrap().is_some(),
            "it was a zombie until now"
        );
    }

    #[test]
    fn owners_elsewhere_or_unknown_are_never_called_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        for owner in [
            format!("cli@another-host-{}:{pid}:0a1b2c3d", host_name()),
            format!("cli@{}:{pid}", host_name()),
            format!("cli@{}:x{pid}:0a1b2c3d", host_name()),
            "someone else".to_string(),
        ] {
            assert!(!owner_has_exited(&owner), "{owner}");
        }
    }
}
