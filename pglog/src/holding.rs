//! Deferred appends held back: a model reply is sent in one transaction
//! with the session's next append (its calls' `ToolStarted`), so a step
//! costs two commits, not three.
//!
//! A deferred append ([`eventlog::EventLog::append_deferred`]) is sealed after the
//! session's head and kept in this handle. The session's next append
//! stores both in one call of `mneme_append`; a read of the session
//! through this handle, a barrier (of any session) or the lease's release
//! stores what is held first. Until then no other process sees the held
//! records, and a crash loses them, which the contract allows: nothing
//! acts on a deferred append before a later append or a barrier makes it
//! durable.
//!
//! Every store of a holding session's records takes the session's slot
//! lock, so a read's store and the runner's next append never race. When
//! records are stored for someone else (a read, another session's
//! barrier) and refused (the session's writer was fenced meanwhile), the
//! refusal is kept for the session: its next append or `barrier_of` is
//! told, and the other caller goes on.

use crate::{now_ms, PgLog, Stored};
use eventlog::{Head, LogError, NewEvent, Record};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::OwnedMutexGuard;
use uuid::Uuid;

/// Records sealed after a session's head, not yet sent.
pub(crate) struct Held {
    /// The head the held records follow.
    after: Head,
    records: Vec<Record>,
    sealed: Vec<Vec<u8>>,
}

impl Held {
    /// The head after the held records.
    fn head(&self) -> Head {
        self.records.last().map_or(self.after, |r| Head {
            seq: r.envelope.seq,
            hash: r.hash,
        })
    }
}

/// What a session has that its writer has not heard the end of.
#[derive(Default)]
pub(crate) enum Pending {
    #[default]
    Nothing,
    /// Records not sent yet.
    Held(Held),
    /// Why held records stored for someone else were not kept.
    Refused(LogError),
}

type Slot = Arc<tokio::sync::Mutex<Pending>>;

/// Each holding session's slot: what it holds, behind the lock its stores
/// take. A session with nothing pending has no slot.
#[derive(Default)]
pub(crate) struct Holding {
    slots: Mutex<HashMap<Uuid, Slot>>,
}

impl Holding {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Slot>> {
        self.slots.lock().expect("holding lock poisoned")
    }

    /// Whether `session` may hold records (its slot exists).
    fn has(&self, session: Uuid) -> bool {
        self.slots().contains_key(&session)
    }

    /// Sessions that may hold records.
    fn sessions(&self) -> Vec<Uuid> {
        self.slots().keys().copied().collect()
    }

    /// `session`'s slot, locked: the one in the map once the lock is had
    /// (a slot removed meanwhile is not used).
    async fn lock(&self, session: Uuid) -> OwnedMutexGuard<Pending> {
        loop {
            let slot = self.slots().entry(session).or_default().clone();
            let guard = slot.clone().lock_owned().await;
            if self
                .slots()
                .get(&session)
                .is_some_and(|current| Arc::ptr_eq(current, &slot))
            {
                return guard;
            }
        }
    }

    /// Unlocks `guard`, removing the slot if nothing is pending.
    fn unlock(&self, session: Uuid, guard: OwnedMutexGuard<Pending>) {
        if matches!(*guard, Pending::Nothing) {
            self.slots().remove(&session);
        }
    }
}

impl PgLog {
    /// [`eventlog::EventLog::append`] (`deferred`: `append_deferred`)
    /// through what `session` holds: a deferred append is held; an append
    /// after held records stores them with it, in one transaction.
    pub(crate) async fn append_as(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
        deferred: bool,
    ) -> Result<Vec<Record>, LogError> {
        if !deferred && !self.holding.has(session) {
            return self.append_now(session, expected_seq, events).await;
        }
        let mut slot = self.holding.lock(session).await;
        let appended = self
            .append_holding(&mut slot, session, expected_seq, events, deferred)
            .await;
        self.holding.unlock(session, slot);
        appended
    }

    async fn append_holding(
        &self,
        slot: &mut Pending,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
        deferred: bool,
    ) -> Result<Vec<Record>, LogError> {
        let held = match std::mem::take(slot) {
            Pending::Refused(error) => return Err(error),
            Pending::Held(held) if held.head().seq + 1 == expected_seq => Some(held),
            // Not where the held records end: they go first, and the
            // store's head decides.
            Pending::Held(held) => {
                self.store_held(session, held, true).await?;
                None
            }
            Pending::Nothing => None,
        };
        let after = match &held {
            Some(held) => held.head(),
            None if deferred => self.head_before(session, expected_seq).await?,
            None => return self.append_now(session, expected_seq, events).await,
        };
        let (records, sealed) = eventlog::seal_after(session, after, events, now_ms())?;
        let mut held = held.unwrap_or(Held {
            after,
            records: Vec::new(),
            sealed: Vec::new(),
        });
        held.records.extend(records.iter().cloned());
        held.sealed.extend(sealed);
        if deferred {
            *slot = Pending::Held(held);
        } else {
            self.store_held(session, held, false).await?;
        }
        Ok(records)
    }

    /// Stores `held` (`deferred`: without waiting for the server's flush):
    /// [`LogError::Conflict`] if the session's head moved past where they
    /// follow, and they are dropped.
    async fn store_held(&self, session: Uuid, held: Held, deferred: bool) -> Result<(), LogError> {
        let expected = held.after.seq + 1;
        match (self.store_after(session, held.after, &held.records, held.sealed, deferred)).await? {
            Stored::Done => Ok(()),
            Stored::HeadMoved(actual) => Err(LogError::Conflict {
                session,
                expected,
                actual,
            }),
        }
    }

    /// Stores what `session` holds, if anything (`durable`: committed with
    /// the server's flush). For the session's writer (`own`), a refusal
    /// kept from earlier is the error; for anyone else, a refusal now is
    /// kept for the writer, and only a failure to reach the store is the
    /// caller's too.
    pub(crate) async fn settle(
        &self,
        session: Uuid,
        durable: bool,
        own: bool,
    ) -> Result<(), LogError> {
        if !self.holding.has(session) {
            return Ok(());
        }
        let mut slot = self.holding.lock(session).await;
        let stored = match std::mem::take(&mut *slot) {
            Pending::Held(held) => self.store_held(session, held, !durable).await,
            Pending::Refused(error) if !own => {
                *slot = Pending::Refused(error);
                Ok(())
            }
            Pending::Refused(error) => Err(error),
            Pending::Nothing => Ok(()),
        };
        let told = match stored {
            Err(error) if !own => {
                let theirs = !matches!(error, LogError::Backend { .. });
                *slot = Pending::Refused(error.clone());
                if theirs {
                    Ok(())
                } else {
                    Err(error)
                }
            }
            stored => stored,
        };
        self.holding.unlock(session, slot);
        told
    }

    /// Stores what every session holds, for someone else than their
    /// writers (see [`PgLog::settle`]).
    pub(crate) async fn settle_all(&self, durable: bool) -> Result<(), LogError> {
        for session in self.holding.sessions() {
            self.settle(session, durable, false).await?;
        }
        Ok(())
    }
}
