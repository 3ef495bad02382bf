//! Leases: who may write a session, for how long, fenced by a token.
//!
//! A lease names its owner (a daemon) and carries a token that grows every
//! time the session changes hands. A backend that several processes share
//! refuses an append whose writer's token is not the session's current one,
//! so an owner that was paused or cut off past its lease's expiry cannot
//! write after another took over.

use crate::{now_ms, LogError};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use uuid::Uuid;

/// A claim on a session's writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The session.
    pub session: Uuid,
    /// Who holds it (a daemon's name).
    pub owner: String,
    /// Fencing token: strictly greater than every earlier holder's.
    pub token: u64,
    /// When it lapses unless renewed, milliseconds since the Unix epoch (by
    /// the store's clock).
    pub expires_ms: i64,
}

/// Leases kept in the memory of the one process that owns a store (sled):
/// the same rules as a shared store's, with nobody else to fence.
#[derive(Default)]
pub struct LocalLeases {
    leases: Mutex<HashMap<Uuid, LocalLease>>,
}

struct LocalLease {
    owner: String,
    token: u64,
    expires_ms: i64,
    released: bool,
    /// A pause was asked of this holding (its token) and not yet taken.
    pause: bool,
}

impl LocalLeases {
    /// Grants `owner` the lease of `session`, with a new token, if nobody
    /// else holds a live one.
    pub fn acquire(&self, session: Uuid, owner: &str, ttl: Duration) -> Result<Lease, LogError> {
        let now = now_ms();
        let mut leases = self.leases.lock().expect("lease lock poisoned");
        let entry = leases.entry(session).or_insert(LocalLease {
            owner: String::new(),
            token: 0,
            expires_ms: 0,
            released: true,
            pause: false,
        });
        let live = !entry.released && entry.expires_ms > now;
        if live && entry.owner != owner {
            return Err(LogError::LeaseHeld {
                session,
                owner: entry.owner.clone(),
                expires_ms: entry.expires_ms,
            });
        }
        entry.token += 1;
        entry.owner = owner.to_string();
        entry.expires_ms = now + ttl.as_millis() as i64;
        entry.released = false;
        entry.pause = false;
        Ok(lease_of(session, entry))
    }

    /// Grants `owner` the lease `held` names if it is still that holding
    /// (see [`crate::Leases::take_over_lease`]).
    pub fn take_over(&self, held: &Lease, owner: &str, ttl: Duration) -> Result<Lease, LogError> {
        let mut leases = self.leases.lock().expect("lease lock poisoned");
        match leases.get_mut(&held.session) {
            Some(entry) if entry.token == held.token && entry.owner == held.owner => {
                entry.token += 1;
                entry.owner = owner.to_string();
                entry.expires_ms = now_ms() + ttl.as_millis() as i64;
                entry.released = false;
                entry.pause = false;
                Ok(lease_of(held.session, entry))
            }
            entry => {
                let (owner, expires_ms) =
                    entry.map_or((String::new(), 0), |e| (e.owner.clone(), e.expires_ms));
                Err(LogError::LeaseHeld {
                    session: held.session,
                    owner,
                    expires_ms,
                })
            }
        }
    }

    /// Extends `lease` if it is still the session's current one.
    pub fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LogError> {
        let mut leases = self.leases.lock().expect("lease lock poisoned");
        match leases.get_mut(&lease.session) {
            Some(entry) if entry.token == lease.token && !entry.released => {
                entry.expires_ms = now_ms() + ttl.as_millis() as i64;
                Ok(lease_of(lease.session, entry))
            }
            entry => Err(LogError::Fenced {
                session: lease.session,
                token: lease.token,
                current: entry.map_or(0, |e| e.token),
            }),
        }
    }

    /// Gives `lease` up; a lease already taken over is left alone.
    pub fn release(&self, lease: &Lease) {
        let mut leases = self.leases.lock().expect("lease lock poisoned");
        if let Some(entry) = leases.get_mut(&lease.session) {
            if entry.token == lease.token {
                entry.released = true;
            }
        }
    }

    /// The live lease of `session`, if any.
    pub fn live(&self, session: Uuid) -> Option<Lease> {
        let leases = self.leases.lock().expect("lease lock poisoned");
        leases
            .get(&session)
            .filter(|e| !e.released && e.expires_ms > now_ms())
            .map(|e| lease_of(session, e))
    }

    /// Asks the live holding of `session`'s lease to pause; returns that
    /// lease, or `None` if nobody holds a live one.
    pub fn request_pause(&self, session: Uuid) -> Option<Lease> {
        let now = now_ms();
        let mut leases = self.leases.lock().expect("lease lock poisoned");
        let entry = leases
            .get_mut(&session)
            .filter(|e| !e.released && e.expires_ms > now)?;
        entry.pause = true;
        Some(lease_of(session, entry))
    }

    /// Whether a pause was asked of the holding of `session`'s lease with
    /// `token`; takes the request.
    pub fn take_pause_request(&self, session: Uuid, token: u64) -> bool {
        let mut leases = self.leases.lock().expect("lease lock poisoned");
        match leases.get_mut(&session) {
            Some(entry) if entry.token == token && entry.pause => {
                entry.pause = false;
                true
            }
            _ => false,
        }
    }

    /// Leases that lapsed without being released.
    pub fn expired(&self) -> Vec<Lease> {
        let now = now_ms();
        let leases = self.leases.lock().expect("lease lock poisoned");
        let mut out: Vec<Lease> = leases
            .iter()
            .filter(|(_, e)| !e.released && e.expires_ms <= now)
            .map(|(session, e)| lease_of(*session, e))
            .collect();
        out.sort_by_key(|l| l.session);
        out
    }
}

fn lease_of(session: Uuid, entry: &LocalLease) -> Lease {
    Lease {
        session,
        owner: entry.owner.clone(),
        token: entry.token,
        expires_ms: entry.expires_ms,
    }
}
