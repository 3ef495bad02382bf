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
use std::time::Duration;
use uuid::Uuid;

/// How long a lease lasts unless renewed, by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// This process's name as a lease owner: host, pid and a random part, so a
/// restarted process with the same pid is another owner.
pub fn owner_name(role: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let nonce = Uuid::now_v7().simple().to_string();
    format!("{role}@{host}:{}:{}", std::process::id(), &nonce[24..])
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
    pub fn acquire(
        log: Arc<dyn EventLog>,
        session: Uuid,
        owner: &str,
        ttl: Duration,
    ) -> Result<HeldLease, LogError> {
        let lease = Arc::new(Mutex::new(log.acquire_lease(session, owner, ttl)?));
        let renewer = tokio::spawn(renew(log.clone(), lease.clone(), ttl));
        Ok(HeldLease {
            log,
            lease,
            renewer,
            released: false,
        })
    }

    /// The lease's fencing token.
    pub fn token(&self) -> u64 {
        self.current().token
    }

    /// Gives the lease up: the session is at rest, nobody needs to take it
    /// over.
    pub fn release(mut self) {
        self.renewer.abort();
        self.released = true;
        let lease = self.current();
        if let Err(e) = self.log.release_lease(&lease) {
            eprintln!("mneme: releasing the lease of {}: {e}", lease.session);
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
        match log.renew_lease(&current, ttl) {
            Ok(renewed) => *lease.lock().expect("lease lock") = renewed,
            Err(e @ LogError::Fenced { .. }) => {
                eprintln!("mneme: {e}");
                return;
            }
            // The store is unreachable: try again; if it stays so past the
            // time to live, another process takes over and fences this one.
            Err(e) => eprintln!("mneme: renewing the lease of {}: {e}", current.session),
        }
    }
}

impl Drop for HeldLease {
    /// Unless released: the lease lapses now (a lease already taken over is
    /// left alone, its token no longer matches).
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.renewer.abort();
        let lease = self.current();
        match self.log.renew_lease(&lease, Duration::ZERO) {
            Ok(_) | Err(LogError::Fenced { .. }) => {}
            Err(e) => eprintln!("mneme: handing over the lease of {}: {e}", lease.session),
        }
    }
}
