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

/// How many times a lease that keeps changing hands is looked at again
/// before giving up.
const TAKE_OVER_TRIES: usize = 20;

/// This process's name as a lease owner: host, pid, a random part, this
/// boot's id and the process's start time, so that a process of this host
/// can tell that the owner is gone, even when its pid was given to a
/// process started later.
pub fn owner_name(role: &str) -> String {
    let nonce = Uuid::now_v7().simple().to_string();
    let pid = std::process::id();
    format!(
        "{role}@{}:{pid}:{}:{}:{}",
        host_name(),
        &nonce[24..],
        boot_id(),
        start_ticks(&pid.to_string()).unwrap_or(0)
    )
}

/// True only when `owner` (an [`owner_name`]) names a process of this host,
/// since this boot, that is no longer running (gone, a zombie, or its pid
/// now a later process's): its lease can only lapse, never be renewed.
/// False whenever that cannot be told (another host or boot, a foreign
/// name).
pub(crate) fn owner_has_exited(owner: &str) -> bool {
    let parts: Vec<&str> = owner
        .split_once('@')
        .map_or("", |(_, at)| at)
        .split(':')
        .collect();
    let (host, pid, started) = match parts.as_slice() {
        [host, pid, _nonce] => (*host, *pid, None),
        [host, pid, _nonce, boot, started] if *boot == boot_id() => (*host, *pid, Some(*started)),
        _ => return false,
    };
    host == host_name()
        && pid.parse::<u32>().is_ok_and(|pid| pid > 0)
        && std::path::Path::new("/proc/self").exists()
        && (process_has_exited(pid)
            || started.is_some_and(|s| start_ticks(pid).is_some_and(|now| now.to_string() != s)))
}

/// Whether process `pid` is gone, or dead and waiting to be reaped.
fn process_has_exited(pid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    matches!(stat_fields(&stat).first(), Some(&("Z" | "X")))
}

/// When process `pid` started, in clock ticks since boot (`/proc`'s
/// `starttime`).
fn start_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields(&stat).get(19)?.parse().ok()
}

/// The fields of a `/proc/PID/stat` line after the command's name, from
/// the state on: `PID (NAME) STATE …`, where NAME may hold spaces and
/// parentheses.
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect())
}

/// The first part of this boot's id (`/proc/sys/kernel/random/boot_id`).
fn boot_id() -> String {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    id.trim().chars().take(8).collect()
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
        let lease = log.leases().acquire_lease(session, owner, ttl).await?;
        Ok(HeldLease::holding(log, lease, ttl))
    }

    /// Holds `lease`, renewing it in the background.
    fn holding(log: Arc<dyn EventLog>, lease: Lease, ttl: Duration) -> HeldLease {
        let lease = Arc::new(Mutex::new(lease));
        let renewer = tokio::spawn(renew(log.clone(), lease.clone(), ttl));
        HeldLease {
            log,
            lease,
            renewer,
            released: false,
        }
    }

    /// Like [`HeldLease::acquire`], except that a lease held by a process of
    /// this host that has exited (see `owner_has_exited`) is taken over at
    /// once: it could only lapse. Its new token fences that holding.
    pub async fn acquire_taking_over_exited(
        log: Arc<dyn EventLog>,
        session: Uuid,
        owner: &str,
        ttl: Duration,
    ) -> Result<HeldLease, LogError> {
        let mut refusal = None;
        for _ in 0..TAKE_OVER_TRIES {
            match HeldLease::acquire(log.clone(), session, owner, ttl).await {
                Err(LogError::LeaseHeld {
                    owner: holder,
                    expires_ms,
                    ..
                }) if owner_has_exited(&holder) => {
                    let held_by = |owner: &str| LogError::LeaseHeld {
                        session,
                        owner: owner.to_string(),
                        expires_ms,
                    };
                    // Taken over only while it is still the exited holder's.
                    let Some(held) = log.leases().lease(session).await? else {
                        continue; // released meanwhile
                    };
                    if held.owner != holder {
                        refusal = Some(held_by(&held.owner));
                        continue;
                    }
                    match log.leases().take_over_lease(&held, owner, ttl).await {
                        Ok(lease) => {
                            crate::log_line!(
                                "mneme: session {session} was leased to {holder}, which has exited: taken over"
                            );
                            return Ok(HeldLease::holding(log, lease, ttl));
                        }
                        Err(e @ LogError::LeaseHeld { .. }) => refusal = Some(e),
                        Err(e) => return Err(e),
                    }
                }
                acquired => return acquired,
            }
        }
        Err(refusal.unwrap_or(LogError::LeaseHeld {
            session,
            owner: "owners that keep changing".into(),
            expires_ms: 0,
        }))
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
        if let Err(e) = self.log.leases().release_lease(&lease).await {
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
        match self.log.leases().renew_lease(&lease, Duration::ZERO).await {
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
        match log.leases().renew_lease(&current, ttl).await {
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
            match log.leases().renew_lease(&lease, Duration::ZERO).await {
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
    fn a_pid_given_to_a_later_process_has_exited() {
        let me = owner_name("cli");
        let (head, started) = me.rsplit_once(':').unwrap();
        assert!(!owner_has_exited(&me));
        assert!(
            owner_has_exited(&format!("{head}:{}", started.parse::<u64>().unwrap() - 1)),
            "this pid, started at another time: another process"
        );
        let (_, boot) = head.rsplit_once(':').unwrap();
        let other_boot = me.replace(&format!(":{boot}:"), ":00000000:");
        assert!(!owner_has_exited(&other_boot), "another boot: cannot tell");
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
