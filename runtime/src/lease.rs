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
/// time to live. Dropping it releases the lease; [`HeldLease::abandon`]
/// leaves it to lapse, so that another process takes the session over.
pub struct HeldLease {
    log: Arc<dyn EventLog>,
    lease: Arc<Mutex<Lease>>,
    renewer: tokio::task::JoinHandle<()>,
    release: bool,
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
            release: true,
        })
    }

    /// Stops renewing without releasing: the lease lapses after its time to
    /// live and another process may take the session over.
    pub fn abandon(mut self) {
        self.release = false;
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
    fn drop(&mut self) {
        self.renewer.abort();
        if self.release {
            let lease = self.lease.lock().expect("lease lock").clone();
            if let Err(e) = self.log.release_lease(&lease) {
                eprintln!("mneme: releasing the lease of {}: {e}", lease.session);
            }
        }
    }
}
