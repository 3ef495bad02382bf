//! The event log: append-only, gapless, hash-chained streams of opaque events,
//! one stream per session.
//!
//! This crate knows nothing of agents. An event is a `kind` string, a schema
//! version and an opaque payload; the log gives it a place (`seq`), an identity,
//! a timestamp and a link in its session's hash chain, and hands the exact
//! stored bytes back on read, after checking them.
//!
//! Guarantees of every [`EventLog`]:
//! - `seq` starts at 1 and is gapless per session; an append names the seq it
//!   expects to write, and a writer that lost a race gets [`LogError::Conflict`],
//!   never a gap or an overwrite.
//! - A record is never rewritten. A record whose stored bytes changed is
//!   refused on read with [`LogError::Corrupt`] naming the session and seq.
//! - An append is durable only after a [`EventLog::barrier`] of the wanted
//!   [`Durability`] returned.

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod crash;
mod envelope;
#[cfg(feature = "sled")]
mod keys;
mod lease;
#[cfg(feature = "sled")]
mod sled_log;
#[cfg(feature = "sled")]
mod wal;

pub use envelope::{
    seal_after, seal_after_base, Base, Envelope, Hash, NewEvent, Record, MAX_RECORD_BYTES,
    RECORD_FORMAT, RECORD_FORMAT_BASED,
};
#[cfg(feature = "sled")]
pub use keys::KEYS_DIR;
pub use lease::{Lease, LocalLeases};
#[cfg(feature = "sled")]
pub use sled_log::{sled_config, SledLog, DEFAULT_CACHE_BYTES};
#[cfg(feature = "sled")]
pub use wal::{TornTail, MIN_FREE_BYTES};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Called with (session, seq) when another process appended to `session`
/// up to `seq`.
pub type AppendListener = Arc<dyn Fn(Uuid, u64) + Send + Sync>;

/// How durable appended records are once a barrier returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Durability {
    /// No wait at all. What survives then depends on the backend: with
    /// sled, every append is already in the write-ahead file (as `Flushed`).
    Buffered,
    /// Handed to the operating system: survives the death of the process,
    /// not a power loss or kernel crash.
    Flushed,
    /// On stable storage (`fdatasync`): survives a power loss.
    Synced,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "buffered" => Ok(Self::Buffered),
            "flushed" => Ok(Self::Flushed),
            "synced" => Ok(Self::Synced),
            other => Err(format!(
                "unknown durability {other:?}: expected buffered, flushed or synced"
            )),
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Buffered => "buffered",
            Self::Flushed => "flushed",
            Self::Synced => "synced",
        })
    }
}

/// The last record of a session: where the next append goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Seq of the last record (0 for a session without records).
    pub seq: u64,
    /// Hash of the last record (all zeros for a session without records).
    pub hash: Hash,
}

impl Head {
    /// The head of a session that has no records yet.
    pub const EMPTY: Head = Head {
        seq: 0,
        hash: Hash::ZERO,
    };
}

/// Small per-session metadata, readable without touching the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMeta {
    /// The session.
    pub session: Uuid,
    /// Number of records (equal to the seq of the last one).
    pub events: u64,
    /// Time of the first record, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Time of the last record, milliseconds since the Unix epoch.
    pub updated_ms: i64,
    /// Kind of the last record.
    pub last_kind: String,
}

/// How much a log holds: sessions, and records over all sessions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Sessions.
    pub sessions: u64,
    /// Records, over all sessions.
    pub records: u64,
}

/// An error below the log (the storage engine's, the database driver's),
/// shared: a [`LogError`] may be handed to every waiter of a barrier.
pub type Cause = std::sync::Arc<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong in the log, each naming what and where;
/// the same whatever the backend, and cheap to clone.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// Another writer appended first: the caller's view of the session is stale.
    #[error("append conflict in session {session}: expected to write seq {expected}, but the log's next seq is {actual}")]
    Conflict {
        /// The session.
        session: Uuid,
        /// The seq the caller tried to write.
        expected: u64,
        /// The seq the log would have accepted.
        actual: u64,
    },
    /// A stored record failed its checks (hash, chain, seq, decoding).
    #[error("corrupt record in session {session} at seq {seq}: {reason}")]
    Corrupt {
        /// The session.
        session: Uuid,
        /// The first bad seq.
        seq: u64,
        /// What check failed.
        reason: String,
    },
    /// A record was written by a newer mneme than this one.
    #[error("record in session {session} at seq {seq} has unknown format version {version} (this build reads versions {RECORD_FORMAT} and {RECORD_FORMAT_BASED})")]
    UnknownVersion {
        /// The session.
        session: Uuid,
        /// The seq.
        seq: u64,
        /// The version byte found.
        version: u8,
    },
    /// The data directory is held by another process.
    #[error("data directory {dir} is in use by another process ({holder}); stop it or talk to it through its API")]
    Locked {
        /// The data directory.
        dir: String,
        /// What is known of the holder.
        holder: String,
    },
    /// The storage engine refused its own files: a page failed its checksum.
    #[error("data directory {dir} is corrupt: the storage engine found a damaged page and refuses to open it; nothing was changed")]
    CorruptStore {
        /// The data directory.
        dir: String,
        /// The engine's error.
        #[source]
        source: Cause,
    },
    /// sled holds less than its last checkpoint made durable.
    #[error("data directory {dir} lost records: its last checkpoint held {} sessions and {} records, the storage engine now holds {} and {}; refusing to continue from a shortened log", expected.sessions, expected.records, found.sessions, found.records)]
    LostRecords {
        /// The data directory.
        dir: String,
        /// What the last checkpoint recorded.
        expected: Totals,
        /// What is there now.
        found: Totals,
    },
    /// This process cannot write the data directory (its permissions, a
    /// read-only mount). Opening writes even to read: it replays the
    /// write-ahead file into the storage engine and checkpoints.
    #[error("data directory {dir} is not writable: mneme opens a data directory read-write even to read it (opening replays its write-ahead file into the storage engine and checkpoints it); copy it somewhere writable (e.g. `cp -a {dir} /tmp/mneme-copy`) and open the copy")]
    NotWritable {
        /// The data directory.
        dir: String,
        /// Why it cannot be written.
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    /// The storage engine failed.
    #[error("storage engine failed in {dir}")]
    Storage {
        /// The data directory.
        dir: String,
        /// The engine's error.
        #[source]
        source: Cause,
    },
    /// A file system operation failed.
    #[error("i/o error on {path}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    /// Another owner holds a live lease on the session: it runs there.
    #[error("session {session} is leased to {owner} for another {:.1?} unless renewed; it runs there", time_left(*expires_ms))]
    LeaseHeld {
        /// The session.
        session: Uuid,
        /// Who holds the lease.
        owner: String,
        /// When it lapses unless renewed.
        expires_ms: i64,
    },
    /// This writer's lease was taken over: it may no longer append.
    #[error("session {session}: this writer's lease (token {token}) was taken over (the session's token is now {current}); append refused")]
    Fenced {
        /// The session.
        session: Uuid,
        /// The token this writer held.
        token: u64,
        /// The session's current token.
        current: u64,
    },
    /// The database server failed or refused a statement.
    #[error("store {store}: {what}")]
    Backend {
        /// The store (its address, without credentials).
        store: String,
        /// What was being done.
        what: String,
        /// The server's or driver's error.
        #[source]
        source: Cause,
    },
    /// The store's schema is newer than this build knows.
    #[error("store {store} has schema version {found}, this build knows versions up to {known}; upgrade mneme")]
    SchemaTooNew {
        /// The store.
        store: String,
        /// Its schema version.
        found: i32,
        /// The newest this build knows.
        known: i32,
    },
    /// A record is bigger than [`MAX_RECORD_BYTES`]; the append or import
    /// that carried it stored nothing.
    #[error("session {session} seq {seq}: the record is {size} bytes, over the limit of {limit} bytes for one record; nothing was stored")]
    RecordTooLarge {
        /// The session.
        session: Uuid,
        /// The seq the record would have had.
        seq: u64,
        /// Its size in stored bytes.
        size: u64,
        /// [`MAX_RECORD_BYTES`].
        limit: u64,
    },
    /// A session's records are encrypted at rest and cannot be read here.
    #[error("session {session}: its records are encrypted at rest, and {reason}")]
    Encrypted {
        /// The session.
        session: Uuid,
        /// Why they cannot be read (no master key, the wrong one).
        reason: String,
    },
    /// An event could not be encoded.
    #[error("cannot encode event of kind {kind}: {reason}")]
    Encode {
        /// The kind of the event.
        kind: String,
        /// Why.
        reason: String,
    },
}

/// An append-only store of per-session event streams.
///
/// Implementations are shared between threads and tasks; appends to one
/// session are serialized by the expected-seq check.
///
/// The trait is async: a call that must wait for a disk or a server
/// returns a future instead of blocking the caller's thread. A store does
/// its blocking work on threads of its own (sled's sync thread, tokio's
/// blocking pool) or natively async (PostgreSQL), not on the caller's
/// runtime workers (but for sled's lone barrier: one session at work, on
/// a multi-thread runtime, syncs on its own worker), and never runs a
/// runtime of its own.
#[async_trait::async_trait]
pub trait EventLog: Send + Sync {
    /// Appends `events` atomically to `session` at seqs `expected_seq..`:
    /// either all are stored or none. Fails with [`LogError::Conflict`] if the
    /// session's next seq is not `expected_seq`. Not durable until a barrier.
    async fn append(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError>;

    /// [`EventLog::append`] of records nothing acts on before a later
    /// append of the session that a barrier makes durable (or a barrier):
    /// a backend whose every append is durable as it commits (PostgreSQL)
    /// may commit this one without waiting for its flush, as the next
    /// durable commit or barrier covers it. By default, `append`.
    async fn append_deferred(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.append(session, expected_seq, events).await
    }

    /// Records of `session` with `from <= seq <= to`, in seq order, each
    /// checked (hash, seq, session, and the chain link between neighbours).
    /// Where `session` shares another's records ([`EventLog::base`]), those
    /// up to its base's `through` are that session's (each naming the
    /// session that stores it), linked to its own.
    async fn read(&self, session: Uuid, from: u64, to: u64) -> Result<Vec<Record>, LogError> {
        self.read_bounded(session, from, to, usize::MAX).await
    }

    /// [`EventLog::read`] of `from..=to` up to a budget of `max_bytes`
    /// stored bytes (each record counted by the size of its sealed bytes,
    /// as an export carries them): the longest run of records from `from`
    /// whose sizes add up to at most `max_bytes`, but never less than the
    /// first record, however big, so that a reader paging through a
    /// session always advances. So it returns at most `max_bytes` plus one
    /// record. Each record returned is checked as [`EventLog::read`] checks
    /// it (hash, seq, the link to its neighbour, a gapless run from
    /// `from`). A backend stops at the budget: it does not fetch the bytes
    /// of the whole range and drop the rest.
    async fn read_bounded(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        let from = from.max(1);
        let Some(base) = self.shared_in(session, from, to).await? else {
            return self.read_bounded_own(session, from, to, max_bytes).await;
        };
        let mut records = self
            .read_bounded(base.parent, from, to.min(base.through), max_bytes)
            .await?;
        let spent: usize = match max_bytes {
            usize::MAX => 0,
            _ => records.iter().map(Record::stored_len).sum(),
        };
        let whole = records.len() as u64 == to.min(base.through) + 1 - from;
        if to > base.through && whole && spent < max_bytes {
            let budget = max_bytes - spent;
            let own = (self.read_bounded_own(session, base.through + 1, to, budget)).await?;
            join_base(session, &records, &own)?;
            // The first record of its own comes even over the budget only
            // when the range starts there.
            let over = own.first().is_some_and(|r| r.stored_len() > budget);
            records.extend(own.into_iter().take(if over { 0 } else { usize::MAX }));
        }
        Ok(records)
    }

    /// [`EventLog::read_bounded`] of records `session` stores as its own
    /// (`from` past its base's `through`, if it has a base): what a backend
    /// implements.
    async fn read_bounded_own(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError>;

    /// The base of `session` if it shares records with `from..=to`.
    async fn shared_in(&self, session: Uuid, from: u64, to: u64) -> Result<Option<Base>, LogError> {
        if from > to {
            return Ok(None);
        }
        Ok(self.base(session).await?.filter(|b| from <= b.through))
    }

    /// Where `session`'s history begins if it shares another's records (see
    /// [`Base`]): named by its first record of its own, never changed.
    async fn base(&self, session: Uuid) -> Result<Option<Base>, LogError>;

    /// [`EventLog::read`], each record with its bytes exactly as stored
    /// (what an export carries): the records `session` shares are its
    /// base's, as that session stores them.
    async fn read_sealed(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
    ) -> Result<(Vec<Record>, Vec<Vec<u8>>), LogError> {
        let from = from.max(1);
        let Some(base) = self.shared_in(session, from, to).await? else {
            return self.read_sealed_own(session, from, to).await;
        };
        let (mut records, mut sealed) = self
            .read_sealed(base.parent, from, to.min(base.through))
            .await?;
        if to > base.through {
            let (own, own_sealed) = self.read_sealed_own(session, base.through + 1, to).await?;
            join_base(session, &records, &own)?;
            records.extend(own);
            sealed.extend(own_sealed);
        }
        Ok((records, sealed))
    }

    /// [`EventLog::read_sealed`] of records `session` stores as its own. By
    /// default the records are sealed again and refused if that does not
    /// give their stored hash; a backend that keeps the bytes gives them
    /// as they are.
    async fn read_sealed_own(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
    ) -> Result<(Vec<Record>, Vec<Vec<u8>>), LogError> {
        let records = self.read_bounded_own(session, from, to, usize::MAX).await?;
        let mut sealed = Vec::with_capacity(records.len());
        for record in &records {
            let (resealed, bytes) = Record::seal(record.envelope.clone())?;
            if resealed.hash != record.hash {
                return Err(LogError::Corrupt {
                    session,
                    seq: record.envelope.seq,
                    reason: "this build cannot re-encode the record to its stored bytes (written by another encoder); export it with the mneme that wrote it".into(),
                });
            }
            sealed.push(bytes);
        }
        Ok((records, sealed))
    }

    /// The head of `session` ([`Head::EMPTY`] if it has no records).
    async fn head(&self, session: Uuid) -> Result<Head, LogError>;

    /// Record `seq` of `session` as a chain head; corrupt if it has none.
    async fn head_at(&self, session: Uuid, seq: u64) -> Result<Head, LogError> {
        let record = self.read(session, seq, seq).await?.pop();
        record
            .map(|r| Head { seq, hash: r.hash })
            .ok_or_else(|| LogError::Corrupt {
                session,
                seq,
                reason: "missing record: the session does not reach this seq".into(),
            })
    }

    /// Starts `session`, which has no records, sharing `parent`'s records
    /// 1..=`through` (see [`Base`]): `events` follow them as its own, all
    /// stored or none, the first naming the base. Costs what `events` cost,
    /// whatever `parent` holds. [`LogError::Conflict`] if `session` has
    /// records; corrupt if `parent` does not reach `through`.
    async fn fork(
        &self,
        session: Uuid,
        parent: Uuid,
        through: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        if through == 0 {
            return Err(LogError::Corrupt {
                session: parent,
                seq: 0,
                reason: "a fork shares at least its parent's first record".into(),
            });
        }
        let base_head = self.head_at(parent, through).await?;
        let base = Base { parent, through };
        self.fork_after(session, base, base_head, events).await
    }

    /// [`EventLog::fork`] with the parent's record at `base.through`
    /// already read (`base_head`): what a backend implements. Records
    /// never change, so the head read before stays the one to link to.
    async fn fork_after(
        &self,
        session: Uuid,
        base: Base,
        base_head: Head,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError>;

    /// Metadata of every session, ordered by session id (UUID v7: by creation).
    async fn sessions(&self) -> Result<Vec<SessionMeta>, LogError>;

    /// Metadata of `session`, if it has records.
    async fn meta(&self, session: Uuid) -> Result<Option<SessionMeta>, LogError> {
        Ok(self
            .sessions()
            .await?
            .into_iter()
            .find(|m| m.session == session))
    }

    /// Returns once everything appended before the call is at least as
    /// durable as `durability` says.
    ///
    /// An append or import is all or nothing; one whose future is dropped
    /// before it returns may have happened or not (the head says which).
    /// A deferred append the store could not keep (its writer was fenced
    /// meanwhile) is that session's error, told to its next append or
    /// [`EventLog::barrier_of`], not to this barrier.
    async fn barrier(&self, durability: Durability) -> Result<(), LogError>;

    /// [`EventLog::barrier`] for a caller that appended to `session`:
    /// whatever kept that session's appends from being stored is its
    /// error. By default, `barrier`.
    async fn barrier_of(&self, session: Uuid, durability: Durability) -> Result<(), LogError> {
        let _ = session;
        self.barrier(durability).await
    }

    /// Appends records sealed elsewhere (an export), byte for byte, after
    /// `session`'s head: each must open (hash, format) under its seq and
    /// link to its predecessor, else nothing is stored and the error names
    /// the first bad record. Into a session with no records, the first may
    /// name a base, which this store must hold (it links to that record).
    /// Returns the new head.
    async fn import(&self, session: Uuid, sealed: Vec<Vec<u8>>) -> Result<Head, LogError> {
        let head = self.head(session).await?;
        let first_base = sealed.first().and_then(|bytes| Record::peek_base(bytes));
        let start = match first_base {
            Some(base) if head == Head::EMPTY => self.head_at(base.parent, base.through).await?,
            _ => head,
        };
        self.import_own(session, start, sealed).await
    }

    /// [`EventLog::import`] after `start`: the session's head, or (a
    /// session with no records whose first sealed record names a base) the
    /// base's record the caller read. What a backend implements; it
    /// refuses with [`LogError::Conflict`] if the session's head moved
    /// from `start` meanwhile.
    async fn import_own(
        &self,
        session: Uuid,
        start: Head,
        sealed: Vec<Vec<u8>>,
    ) -> Result<Head, LogError>;

    /// Who may write each session, and the pause requests kept with it.
    fn leases(&self) -> &dyn Leases;

    /// What is kept beside the chain: derived data and session keys.
    fn side_store(&self) -> &dyn SideStore;

    /// Asks to be told of appends made by other processes sharing this
    /// store. A store that one process owns has none to tell.
    fn follow(&self, _listener: AppendListener) {}

    /// Checks the whole chain of `session`: every record's hash, the link to
    /// its predecessor, gapless seqs, and that the head matches the last record.
    /// Returns the number of records checked.
    async fn verify(&self, session: Uuid) -> Result<u64, LogError> {
        let head = self.head(session).await?;
        let mut prev = Head::EMPTY;
        let mut from = 1;
        while from <= head.seq {
            let to = head.seq.min(from + 4095);
            for record in self.read(session, from, to).await? {
                check_link(session, &prev, &record)?;
                prev = Head {
                    seq: record.envelope.seq,
                    hash: record.hash,
                };
            }
            from = to + 1;
        }
        if prev != head {
            return Err(LogError::Corrupt {
                session,
                seq: prev.seq + 1,
                reason: format!(
                    "session head says seq {} but the chain ends at seq {}",
                    head.seq, prev.seq
                ),
            });
        }
        Ok(head.seq)
    }
}

/// Who may write a session, for how long, fenced by a token; and the pause
/// requests kept with a holding. One per store, whatever wraps its records
/// (see [`EventLog::leases`]).
#[async_trait::async_trait]
pub trait Leases: Send + Sync {
    /// Grants `owner` the lease of `session` for `ttl`, unless another owner
    /// holds a live one ([`LogError::LeaseHeld`]). Every grant, even of an
    /// owner's own live lease, has a new token greater than all before it,
    /// so an earlier holding is fenced. From then on, until the lease is
    /// released or taken over, this log's appends to `session` are fenced by
    /// the lease's token.
    async fn acquire_lease(
        &self,
        session: Uuid,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, LogError>;

    /// Grants `owner` the lease of `session` that `held` names, live or not,
    /// provided it is still exactly that holding (same owner, same token):
    /// for a holder known to be gone (a process of this host that exited),
    /// whose lease need not be waited out. The new token fences `held`.
    /// [`LogError::LeaseHeld`] if the lease changed hands meanwhile.
    async fn take_over_lease(
        &self,
        held: &Lease,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, LogError>;

    /// Extends `lease` by `ttl` from now; [`LogError::Fenced`] if it was
    /// taken over meanwhile.
    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LogError>;

    /// Gives `lease` up (a lease already taken over is left alone).
    async fn release_lease(&self, lease: &Lease) -> Result<(), LogError>;

    /// Leases that lapsed without being released: sessions whose owner
    /// stopped, to be taken over.
    async fn expired_leases(&self) -> Result<Vec<Lease>, LogError>;

    /// The live lease of `session` (held, not lapsed), if any: who runs it.
    async fn lease(&self, session: Uuid) -> Result<Option<Lease>, LogError>;

    /// Asks whoever holds the live lease of `session` to pause its turn. The
    /// request is kept with the lease and names that one holding of it (its
    /// token): once the lease is released and granted again, or taken over,
    /// it asks nothing of the new holder. Returns the lease asked, or `None`
    /// (nothing kept) if nobody holds a live one.
    async fn request_pause(&self, session: Uuid) -> Result<Option<Lease>, LogError>;

    /// Whether a pause was asked of the holding of `session`'s lease whose
    /// token is `token`. A request is taken by the call that sees it: the
    /// next call answers false until another is made.
    async fn take_pause_request(&self, session: Uuid, token: u64) -> Result<bool, LogError>;
}

/// What a store keeps beside the chain, outside its records and barriers:
/// data derived from a session's events (checked against the log by whoever
/// reads it) and each session's key (see [`EventLog::side_store`]).
#[async_trait::async_trait]
pub trait SideStore: Send + Sync {
    /// Stores data derived from `session`'s events (a snapshot, a summary)
    /// under `name`, replacing what was there. Derived data is not part of
    /// the chain and not covered by barriers: it may be lost or stale after a
    /// crash, and whoever reads it must check it against the log.
    async fn put_derived(&self, session: Uuid, name: &str, bytes: &[u8]) -> Result<(), LogError>;

    /// What [`SideStore::put_derived`] stored under `name`, if anything.
    async fn get_derived(&self, session: Uuid, name: &str) -> Result<Option<Vec<u8>>, LogError>;

    /// [`SideStore::get_derived`] of `name` for each of `sessions`, in order.
    async fn get_derived_many(
        &self,
        name: &str,
        sessions: &[Uuid],
    ) -> Result<Vec<Option<Vec<u8>>>, LogError> {
        let mut out = Vec::with_capacity(sessions.len());
        for session in sessions {
            out.push(self.get_derived(*session, name).await?);
        }
        Ok(out)
    }

    /// The key kept for `session` by [`SideStore::put_key`], unless it was
    /// destroyed. Keys are opaque bytes to the log (the caller wraps
    /// them); they live beside the chain, not in it.
    async fn get_key(&self, session: Uuid) -> Result<Option<Vec<u8>>, LogError>;

    /// Keeps `key` for `session` unless a key is kept for it already, and
    /// returns the key kept (of two racing callers, both get the winner's).
    /// Durable when it returns, whatever the barriers: records written
    /// under a key must never outlive it by accident.
    async fn put_key(&self, session: Uuid, key: &[u8]) -> Result<Vec<u8>, LogError>;

    /// Destroys the key of `session` for good: after it returns, no file
    /// this store controls holds it (sled: the key file is overwritten
    /// with zeros, synced and removed; PostgreSQL: the row is deleted and
    /// the table vacuumed, though the server's write-ahead segments keep it
    /// until they are recycled). Destroying a key not kept does nothing.
    async fn destroy_key(&self, session: Uuid) -> Result<(), LogError>;
}

/// Checks that `record` directly follows `prev` in `session`'s chain.
pub fn check_link(session: Uuid, prev: &Head, record: &Record) -> Result<(), LogError> {
    let seq = record.envelope.seq;
    if seq != prev.seq + 1 {
        return Err(LogError::Corrupt {
            session,
            seq: prev.seq + 1,
            reason: format!("missing record: next stored seq is {seq}"),
        });
    }
    if record.envelope.prev_hash != prev.hash {
        return Err(LogError::Corrupt {
            session,
            seq,
            reason: "chain broken: prev_hash does not match the hash of the previous record".into(),
        });
    }
    Ok(())
}

/// Checks that `records`, read for a range starting at `from`, start there
/// and link up one to the next.
pub fn check_run(session: Uuid, from: u64, records: &[Record]) -> Result<(), LogError> {
    if let Some(first) = records.first().filter(|r| r.envelope.seq != from) {
        return Err(LogError::Corrupt {
            session,
            seq: from,
            reason: format!("missing record: next stored seq is {}", first.envelope.seq),
        });
    }
    for pair in records.windows(2) {
        let prev = Head {
            seq: pair[0].envelope.seq,
            hash: pair[0].hash,
        };
        check_link(session, &prev, &pair[1])?;
    }
    Ok(())
}

/// Checks that `own`, the first records `session` stores as its own after
/// `shared` (read from its base), link to the last of them.
fn join_base(session: Uuid, shared: &[Record], own: &[Record]) -> Result<(), LogError> {
    match (shared.last(), own.first()) {
        (Some(last), Some(first)) => {
            let prev = Head {
                seq: last.envelope.seq,
                hash: last.hash,
            };
            check_link(session, &prev, first)
        }
        _ => Ok(()),
    }
}

/// Opens `sealed` as the records that follow `head` in `session`, checking
/// each one's size ([`MAX_RECORD_BYTES`]), bytes and link to the one before.
/// Only a first record of the session (`new`: the session holds none) may
/// name a base, which must end at `head`.
pub fn open_sealed(
    session: Uuid,
    head: Head,
    new: bool,
    sealed: &[Vec<u8>],
) -> Result<Vec<Record>, LogError> {
    let mut prev = head;
    let mut records = Vec::with_capacity(sealed.len());
    for bytes in sealed {
        envelope::check_size(session, prev.seq + 1, bytes.len())?;
        let record = Record::open(session, prev.seq + 1, bytes)?;
        let first = new && records.is_empty();
        if record.envelope.base.is_some() != (first && head != Head::EMPTY) {
            return Err(LogError::Corrupt {
                session,
                seq: prev.seq + 1,
                reason: match record.envelope.base {
                    Some(_) => "names a base, and is not the session's first record".into(),
                    None => "the session's first record must name its base".into(),
                },
            });
        }
        check_link(session, &prev, &record)?;
        prev = Head {
            seq: record.envelope.seq,
            hash: record.hash,
        };
        records.push(record);
    }
    Ok(records)
}

/// How long until a lease expiring at `expires_ms` lapses, by this host's
/// clock (zero once past).
pub fn time_left(expires_ms: i64) -> std::time::Duration {
    std::time::Duration::from_millis((expires_ms - now_ms()).max(0) as u64)
}

/// Creates (or empties) the file at `path`; a file it creates is readable
/// and writable by its owner only (0600): the log holds whatever the model
/// and the tools said.
#[cfg(feature = "sled")]
pub(crate) fn create_private(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
