//! The PostgreSQL backend of [`EventLog`]: one store that several mneme
//! processes (daemons on several machines) share.
//!
//! Records are the same sealed bytes as on sled (format byte, named-field
//! MessagePack envelope, SHA-256 chain hash), so an export from one backend
//! imports into the other and verifies. What PostgreSQL adds:
//! - an append is one transaction (`mneme_append`), durable once it
//!   commits (connections set `synchronous_commit=on`); a deferred append
//!   (a model reply, which the `ToolStarted` after it makes durable) is
//!   held in the handle and stored in one transaction with the session's
//!   next append (see `holding.rs`): a step costs two commits, not three;
//! - optimistic concurrency on (session, seq): a writer that lost a race
//!   gets [`LogError::Conflict`], as on sled;
//! - leases with fencing tokens: while this handle holds a session's lease,
//!   its appends carry the token and are refused once another owner took
//!   the session over ([`LogError::Fenced`]); a writer without a lease is
//!   refused while another owner's lease is live ([`LogError::LeaseHeld`]);
//! - pause requests, kept in the lease's row (`pause_token`: the token of
//!   the holding asked), so any process sharing the store can ask the one
//!   running a turn to pause;
//! - `follow`: appends by every process, announced after they commit and
//!   heard through LISTEN/NOTIFY (best effort: a follower that missed one
//!   catches up at the next).
//!
//! The schema is migrated on connect, under an advisory lock, by versioned
//! scripts in `migrations/`; a store migrated by a newer mneme is refused.
//!
//! The handle is natively async: every call is tokio-postgres's own future,
//! run on the caller's tokio runtime (no runtime of its own, no blocking).
//! [`PgLog::connect`] spawns the task that announces appends there, and
//! `follow` the task that listens for others' appends; both end when the
//! handle is dropped.

mod holding;
mod schema;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use eventlog::{
    open_sealed, AppendListener, Durability, EventLog, Hash, Head, Lease, Leases, LogError,
    NewEvent, Record, SessionMeta, SideStore,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;
use tokio_postgres::NoTls;
use uuid::Uuid;

/// Sessions whose heads a handle remembers before it starts over.
const HEAD_CACHE_SESSIONS: usize = 100_000;

/// How long a call waits for a free connection before it fails.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// Connections the pool keeps open at most.
const POOL_SIZE: usize = 16;

/// An [`EventLog`] in a PostgreSQL database.
pub struct PgLog {
    /// Where the store is, without credentials: named in every error.
    store: String,
    config: tokio_postgres::Config,
    tls: schema::Tls,
    pool: Pool,
    /// The task listening for other processes' appends, once `follow`
    /// started it; aborted when the handle is dropped.
    listener: Mutex<Option<tokio::task::AbortHandle>>,
    /// Fencing tokens of the leases this handle holds, by session.
    held: Mutex<HashMap<Uuid, u64>>,
    listeners: Arc<Mutex<Vec<AppendListener>>>,
    listening: Once,
    /// Heads this handle wrote or read last, by session: a hint, checked by
    /// the store on every append.
    heads: Mutex<HashMap<Uuid, Head>>,
    /// Bases read or written, by session (`None`: it has none); a base
    /// never changes.
    bases: Mutex<HashMap<Uuid, Option<eventlog::Base>>>,
    /// Deferred appends not yet sent, by session.
    holding: holding::Holding,
    /// Committed appends, (session, last seq), to announce to followers.
    appended: tokio::sync::mpsc::UnboundedSender<(Uuid, u64)>,
    /// How many of this handle's deferred appends committed, and how many
    /// of them are known flushed.
    commits: Commits,
}

/// Counts of a handle's deferred appends: committed, and known flushed
/// (by a durable append or a barrier after them).
#[derive(Default)]
struct Commits {
    deferred: AtomicU64,
    flushed: AtomicU64,
    /// Held by the barrier that is flushing.
    flushing: tokio::sync::Mutex<()>,
}

impl PgLog {
    /// Connects to the store at `url` (`postgres://user:pass@host:port/db`,
    /// optionally `?schema=NAME` to keep mneme's tables in their own
    /// schema) and brings its schema up to this build's version. Call it
    /// on the tokio runtime the handle will be used on: the task that
    /// announces this handle's appends to followers is spawned there.
    pub async fn connect(url: &str) -> Result<PgLog, LogError> {
        let target = schema::Target::parse(url)?;
        let pooling = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &target.tls {
            schema::Tls::Off => Manager::from_config(target.config.clone(), NoTls, pooling),
            schema::Tls::On(tls) => {
                Manager::from_config(target.config.clone(), tls.clone(), pooling)
            }
        };
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(schema::CONNECT_TIMEOUT))
            .recycle_timeout(Some(schema::CONNECT_TIMEOUT))
            .build()
            .expect("a pool with a runtime accepts timeouts");
        let (appended, to_announce) = tokio::sync::mpsc::unbounded_channel();
        // Ends once the handle (the channel's sender) is dropped.
        tokio::spawn(schema::announce(
            pool.clone(),
            target.display.clone(),
            to_announce,
        ));
        let log = PgLog {
            heads: Mutex::default(),
            bases: Mutex::default(),
            appended,
            store: target.display.clone(),
            config: target.config.clone(),
            tls: target.tls.clone(),
            pool,
            listener: Mutex::default(),
            held: Mutex::default(),
            listeners: Arc::default(),
            listening: Once::new(),
            commits: Commits::default(),
            holding: holding::Holding::default(),
        };
        schema::migrate(&log.pool, &log.store, &target).await?;
        Ok(log)
    }

    /// The pool, for a task.
    fn db(&self) -> Db {
        Db {
            pool: self.pool.clone(),
            store: self.store.clone(),
        }
    }

    fn fence(&self, session: Uuid) -> Option<u64> {
        self.held
            .lock()
            .expect("lease lock poisoned")
            .get(&session)
            .copied()
    }

    /// Seals `events` after `head` and stores them: `Err(next)` if the
    /// session's head has moved and the log would accept seq `next`.
    async fn append_after(
        &self,
        session: Uuid,
        head: Head,
        events: &[NewEvent],
    ) -> Result<Result<Vec<Record>, u64>, LogError> {
        let (records, sealed) = eventlog::seal_after(session, head, events.to_vec(), now_ms())?;
        Ok(
            match self
                .store_after(session, head, &records, sealed, false)
                .await?
            {
                Stored::Done => Ok(records),
                Stored::HeadMoved(actual) => Err(actual),
            },
        )
    }

    /// The head this handle last saw for `session`, if a record at
    /// `expected_seq` would follow it.
    fn cached_head(&self, session: Uuid, expected_seq: u64) -> Option<Head> {
        let heads = self.heads.lock().expect("head cache poisoned");
        heads
            .get(&session)
            .copied()
            .filter(|h| h.seq + 1 == expected_seq)
    }

    /// [`EventLog::append`], now: from the head this handle last wrote,
    /// which saves a round trip (the store checks it, and a stale one
    /// costs one retry from the store's head).
    async fn append_now(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        if let Some(head) = self.cached_head(session, expected_seq) {
            if let Ok(records) = self.append_after(session, head, &events).await? {
                return Ok(records);
            }
            self.forget_head(session);
        }
        let head = self.head_before(session, expected_seq).await?;
        let conflict = |actual| LogError::Conflict {
            session,
            expected: expected_seq,
            actual,
        };
        self.append_after(session, head, &events)
            .await?
            .map_err(conflict)
    }

    /// The head a record at `expected_seq` follows: the one this handle
    /// last saw, or the store's; [`LogError::Conflict`] if the store's is
    /// elsewhere (or [`LogError::Fenced`], for a writer taken over).
    async fn head_before(&self, session: Uuid, expected_seq: u64) -> Result<Head, LogError> {
        if let Some(head) = self.cached_head(session, expected_seq) {
            return Ok(head);
        }
        let head = self.head_now(session).await?;
        if expected_seq != head.seq + 1 {
            self.check_fence(session).await?;
            return Err(LogError::Conflict {
                session,
                expected: expected_seq,
                actual: head.seq + 1,
            });
        }
        Ok(head)
    }

    /// The session's head in the store (what it holds here not counted).
    async fn head_now(&self, session: Uuid) -> Result<Head, LogError> {
        let head = self.db().head(session).await?;
        self.remember_head(session, head);
        Ok(head)
    }

    fn remember_head(&self, session: Uuid, head: Head) {
        let mut heads = self.heads.lock().expect("head cache poisoned");
        if heads.len() >= HEAD_CACHE_SESSIONS {
            heads.clear();
        }
        heads.insert(session, head);
    }

    fn remember_base(&self, session: Uuid, base: Option<eventlog::Base>) {
        let mut bases = self.bases.lock().expect("base cache poisoned");
        if bases.len() >= HEAD_CACHE_SESSIONS {
            bases.clear();
        }
        bases.insert(session, base);
    }

    fn forget_head(&self, session: Uuid) {
        self.heads
            .lock()
            .expect("head cache poisoned")
            .remove(&session);
    }

    /// Stores sealed `records` after `head` through `mneme_append`:
    /// `deferred`, committed without waiting for the server's flush (see
    /// [`EventLog::append_deferred`]), else durable when this returns.
    async fn store_after(
        &self,
        session: Uuid,
        head: Head,
        records: &[Record],
        sealed: Vec<Vec<u8>>,
        deferred: bool,
    ) -> Result<Stored, LogError> {
        let (Some(first), Some(last)) = (records.first(), records.last()) else {
            return Ok(Stored::Done);
        };
        let args = AppendArgs {
            base: first.envelope.base,
            session,
            first: first.envelope.seq as i64,
            prev: head.hash.0.to_vec(),
            fence: self.fence(session).map(|t| t as i64),
            records: sealed,
            head: last.hash.0.to_vec(),
            created_ms: first.envelope.ts_ms,
            updated_ms: last.envelope.ts_ms,
            kind: last.envelope.kind.clone(),
        };
        let db = self.db();
        // Every deferred commit before a durable one is in the server's
        // log before it, and flushed with it.
        let deferred_before = self.commits.deferred.load(Ordering::Acquire);
        let code = db.append(args, deferred).await?;
        match code {
            0 => {
                if deferred {
                    self.commits.deferred.fetch_add(1, Ordering::AcqRel);
                } else {
                    self.commits
                        .flushed
                        .fetch_max(deferred_before, Ordering::AcqRel);
                }
                let _ = self.appended.send((session, last.envelope.seq));
                self.remember_head(
                    session,
                    Head {
                        seq: last.envelope.seq,
                        hash: last.hash,
                    },
                );
                Ok(Stored::Done)
            }
            -1 => Err(self.lease_held(session).await?),
            -2 => {
                self.check_fence(session).await?;
                Err(LogError::Fenced {
                    session,
                    token: self.fence(session).unwrap_or(0),
                    current: 0,
                })
            }
            next => Ok(Stored::HeadMoved(next as u64)),
        }
    }

    /// [`LogError::Fenced`] if this handle holds a lease on `session` that
    /// another owner has taken over since.
    async fn check_fence(&self, session: Uuid) -> Result<(), LogError> {
        let Some(token) = self.fence(session) else {
            return Ok(());
        };
        let current = self.current_lease(session).await?.map_or(0, |l| l.token);
        if current == token {
            return Ok(());
        }
        Err(LogError::Fenced {
            session,
            token,
            current,
        })
    }

    async fn current_lease(&self, session: Uuid) -> Result<Option<Lease>, LogError> {
        let db = self.db();
        db.lease(session).await
    }

    /// The lease a grant's `rows` return, now held by this handle (its
    /// appends carry the token); [`LogError::LeaseHeld`] naming the holder
    /// if the grant was refused.
    async fn granted(
        &self,
        session: Uuid,
        rows: &[tokio_postgres::Row],
    ) -> Result<Lease, LogError> {
        let Some(lease) = rows.first().map(lease_of) else {
            return Err(self.lease_held(session).await?);
        };
        self.held
            .lock()
            .expect("lease lock poisoned")
            .insert(session, lease.token);
        Ok(lease)
    }

    async fn lease_held(&self, session: Uuid) -> Result<LogError, LogError> {
        let lease = self.current_lease(session).await?;
        Ok(match lease {
            Some(lease) => LogError::LeaseHeld {
                session,
                owner: lease.owner,
                expires_ms: lease.expires_ms,
            },
            // Released between the refusal and this look: say who asked.
            None => LogError::LeaseHeld {
                session,
                owner: "another owner (now released)".into(),
                expires_ms: 0,
            },
        })
    }

    /// The records of `session` in `from..=to`, checked as
    /// [`EventLog::read`] promises; with a `budget`, only as many as
    /// [`EventLog::read_bounded`] says.
    async fn read_range(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        budget: Option<i64>,
    ) -> Result<Vec<Record>, LogError> {
        let from = from.max(1);
        if from > to {
            return Ok(Vec::new());
        }
        let db = self.db();
        let (lo, hi) = (from as i64, to.min(i64::MAX as u64) as i64);
        let rows = async move {
            match budget {
                None => {
                    db.query(
                        "read records",
                        "SELECT seq, record FROM mneme_events \
                         WHERE session = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq",
                        &[&session, &lo, &hi],
                    )
                    .await
                }
                Some(budget) => {
                    db.query(
                        "read records up to a byte budget",
                        "SELECT seq, record FROM ( \
                           SELECT seq, record, \
                             row_number() OVER w AS n, \
                             sum(octet_length(record)) OVER w AS spent \
                           FROM mneme_events \
                           WHERE session = $1 AND seq BETWEEN $2 AND $3 \
                           WINDOW w AS (ORDER BY seq ROWS UNBOUNDED PRECEDING) \
                         ) AS run WHERE n = 1 OR spent <= $4 ORDER BY seq",
                        &[&session, &lo, &hi, &budget],
                    )
                    .await
                }
            }
        }
        .await?;
        let records = rows
            .iter()
            .map(|row| Record::open(session, row.get::<_, i64>(0) as u64, row.get(1)))
            .collect::<Result<Vec<_>, _>>()?;
        eventlog::check_run(session, from, &records)?;
        Ok(records)
    }

    fn start_listening(&self) {
        let config = self.config.clone();
        let listeners = self.listeners.clone();
        let store = self.store.clone();
        let task = tokio::spawn(schema::listen(config, self.tls.clone(), store, listeners));
        *self.listener.lock().expect("listener lock poisoned") = Some(task.abort_handle());
    }
}

/// What an attempt to store records came to.
enum Stored {
    Done,
    /// The session's head is not where the records follow: the log would
    /// accept this seq next.
    HeadMoved(u64),
}

/// Arguments of `mneme_append`.
struct AppendArgs {
    /// The base its first record names, if the session starts on one.
    base: Option<eventlog::Base>,
    session: Uuid,
    first: i64,
    prev: Vec<u8>,
    fence: Option<i64>,
    records: Vec<Vec<u8>>,
    head: Vec<u8>,
    created_ms: i64,
    updated_ms: i64,
    kind: String,
}

/// The pool as a task sees it: each call takes a connection and names the
/// store in its errors.
struct Db {
    pool: Pool,
    store: String,
}

impl Db {
    fn fail(&self, what: &str) -> impl Fn(tokio_postgres::Error) -> LogError + '_ {
        let what = what.to_string();
        move |source| LogError::Backend {
            store: self.store.clone(),
            what: what.clone(),
            source: std::sync::Arc::new(source),
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, LogError> {
        self.pool.get().await.map_err(|source| LogError::Backend {
            store: self.store.clone(),
            what: "cannot get a connection".into(),
            source: std::sync::Arc::new(source),
        })
    }

    async fn query(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, LogError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await.map_err(self.fail(what))?;
        client
            .query(&statement, params)
            .await
            .map_err(self.fail(what))
    }

    /// Runs `mneme_append` in a transaction of its own, durable when it
    /// commits; or, `deferred`, committed without waiting for the server
    /// to flush its write-ahead log (`synchronous_commit` off for that
    /// transaction alone): visible to every process at once, durable with
    /// the next durable commit or [`Db::flush`]. One round trip either way
    /// (a deferred one's three messages are pipelined). An append refused
    /// inside the function (its return code) stores nothing; one that
    /// fails aborts, and the COMMIT rolls it back.
    async fn append(&self, a: AppendArgs, deferred: bool) -> Result<i64, LogError> {
        let what = "append";
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT mneme_append_based($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .await
            .map_err(self.fail(what))?;
        let base_parent = a.base.map(|b| b.parent);
        let base_through = a.base.map(|b| b.through as i64);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 11] = [
            &a.session,
            &a.first,
            &a.prev,
            &a.fence,
            &a.records,
            &a.head,
            &a.created_ms,
            &a.updated_ms,
            &a.kind,
            &base_parent,
            &base_through,
        ];
        if !deferred {
            let rows = client.query(&statement, &params).await;
            return Ok(rows.map_err(self.fail(what))?[0].get(0));
        }
        let (begun, appended, committed) = futures_util::future::join3(
            client.batch_execute("BEGIN; SET LOCAL synchronous_commit TO off"),
            client.query(&statement, &params),
            client.batch_execute("COMMIT"),
        )
        .await;
        let rows = appended.map_err(self.fail(what))?;
        begun.map_err(self.fail(what))?;
        committed.map_err(self.fail(what))?;
        Ok(rows[0].get(0))
    }

    /// Waits until the server's write-ahead log is on disk up to now: one
    /// synchronous commit of a transaction that takes an id and writes to
    /// the log (an empty logical message, which needs no privilege and no
    /// table): the server flushes such a commit, and everything its log
    /// holds before it, of every session and process, before it answers.
    /// (A transaction that only takes an id writes nothing before its
    /// commit record, and its commit is not waited for.)
    async fn flush(&self) -> Result<(), LogError> {
        self.query(
            "flush the server's write-ahead log",
            "SELECT txid_current(), pg_logical_emit_message(true, 'mneme', '')",
            &[],
        )
        .await
        .map(drop)
    }

    async fn head(&self, session: Uuid) -> Result<Head, LogError> {
        let rows = self
            .query(
                "read head",
                "SELECT head_seq, head_hash FROM mneme_sessions WHERE session = $1",
                &[&session],
            )
            .await?;
        rows.first().map_or(Ok(Head::EMPTY), |row| {
            Ok(Head {
                seq: row.get::<_, i64>(0) as u64,
                hash: hash_of(session, row.get::<_, i64>(0) as u64, row.get(1))?,
            })
        })
    }

    async fn lease(&self, session: Uuid) -> Result<Option<Lease>, LogError> {
        let rows = self
            .query(
                "read lease",
                &format!("SELECT {LEASE_COLUMNS} FROM mneme_leases WHERE session = $1"),
                &[&session],
            )
            .await?;
        Ok(rows.first().map(lease_of))
    }
}

/// Columns that [`meta_of`] reads, in order.
const SESSION_COLUMNS: &str = "session, head_seq, created_ms, updated_ms, last_kind";

fn meta_of(row: &tokio_postgres::Row) -> SessionMeta {
    SessionMeta {
        session: row.get(0),
        events: row.get::<_, i64>(1) as u64,
        created_ms: row.get(2),
        updated_ms: row.get(3),
        last_kind: row.get(4),
    }
}

/// Columns that [`lease_of`] reads, in order.
const LEASE_COLUMNS: &str =
    "session, owner, token, (extract(epoch FROM expires_at) * 1000)::bigint";

fn lease_of(row: &tokio_postgres::Row) -> Lease {
    Lease {
        session: row.get(0),
        owner: row.get(1),
        token: row.get::<_, i64>(2) as u64,
        expires_ms: row.get(3),
    }
}

fn hash_of(session: Uuid, seq: u64, bytes: &[u8]) -> Result<Hash, LogError> {
    let array: [u8; 32] = bytes.try_into().map_err(|_| LogError::Corrupt {
        session,
        seq,
        reason: format!("session head hash has {} bytes, not 32", bytes.len()),
    })?;
    Ok(Hash(array))
}

fn ttl_ms(ttl: Duration) -> i64 {
    ttl.as_millis().min(i64::MAX as u128) as i64
}

impl Drop for PgLog {
    /// Stops listening for others' appends (the announcing task ends by
    /// itself once its channel closes).
    fn drop(&mut self) {
        if let Some(task) = self.listener.lock().ok().and_then(|mut l| l.take()) {
            task.abort();
        }
    }
}

#[async_trait::async_trait]
impl EventLog for PgLog {
    async fn append(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.append_as(session, expected_seq, events, false).await
    }
    /// Held in this handle and stored with the session's next append, in
    /// one transaction (or by a read of the session, or a barrier).
    async fn append_deferred(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.append_as(session, expected_seq, events, true).await
    }
    async fn read_sealed_own(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
    ) -> Result<(Vec<Record>, Vec<Vec<u8>>), LogError> {
        self.settle(session, false, false).await?;
        let from = from.max(1);
        let (lo, hi) = (from as i64, to.min(i64::MAX as u64) as i64);
        let rows = self
            .db()
            .query(
                "read records as stored",
                "SELECT seq, record FROM mneme_events \
                 WHERE session = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq",
                &[&session, &lo, &hi],
            )
            .await?;
        let (mut records, mut sealed) = (Vec::with_capacity(rows.len()), Vec::new());
        for row in &rows {
            let bytes: Vec<u8> = row.get(1);
            records.push(Record::open(session, row.get::<_, i64>(0) as u64, &bytes)?);
            sealed.push(bytes);
        }
        eventlog::check_run(session, from, &records)?;
        Ok((records, sealed))
    }
    /// One query: a running sum of the records' sizes (`octet_length`,
    /// which PostgreSQL answers from a value's header, without fetching or
    /// decompressing it) picks the records that fit; only those are sent.
    async fn read_bounded_own(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        self.settle(session, false, false).await?;
        let budget =
            (max_bytes != usize::MAX).then(|| i64::try_from(max_bytes).unwrap_or(i64::MAX));
        self.read_range(session, from, to, budget).await
    }
    /// From the session's row (kept here once read: a base never changes).
    async fn base(&self, session: Uuid) -> Result<Option<eventlog::Base>, LogError> {
        if let Some(base) = self
            .bases
            .lock()
            .expect("base cache poisoned")
            .get(&session)
        {
            return Ok(*base);
        }
        let rows = self
            .db()
            .query(
                "read base",
                "SELECT base_parent, base_through FROM mneme_sessions WHERE session = $1",
                &[&session],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let parent: Option<Uuid> = row.get(0);
        let through: Option<i64> = row.get(1);
        let base = parent.zip(through).map(|(parent, through)| eventlog::Base {
            parent,
            through: through as u64,
        });
        self.remember_base(session, base);
        Ok(base)
    }
    async fn fork_after(
        &self,
        session: Uuid,
        base: eventlog::Base,
        base_head: Head,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        let (records, sealed) =
            eventlog::seal_after_base(session, base, base_head, events, now_ms())?;
        match self
            .store_after(session, base_head, &records, sealed, false)
            .await?
        {
            Stored::Done => {
                self.remember_base(session, Some(base));
                Ok(records)
            }
            Stored::HeadMoved(actual) => Err(LogError::Conflict {
                session,
                expected: base.through + 1,
                actual,
            }),
        }
    }
    async fn head(&self, session: Uuid) -> Result<Head, LogError> {
        self.settle(session, false, false).await?;
        self.head_now(session).await
    }
    async fn sessions(&self) -> Result<Vec<SessionMeta>, LogError> {
        self.settle_all(false).await?;
        let db = self.db();
        let rows = db
            .query(
                "list sessions",
                &format!("SELECT {SESSION_COLUMNS} FROM mneme_sessions ORDER BY session"),
                &[],
            )
            .await?;
        Ok(rows.iter().map(meta_of).collect())
    }
    async fn meta(&self, session: Uuid) -> Result<Option<SessionMeta>, LogError> {
        self.settle(session, false, false).await?;
        let db = self.db();
        let rows = db
            .query(
                "read session",
                &format!("SELECT {SESSION_COLUMNS} FROM mneme_sessions WHERE session = $1"),
                &[&session],
            )
            .await?;
        Ok(rows.first().map(meta_of))
    }
    /// Stores what this handle holds (committed with the server's flush,
    /// but for [`Durability::Buffered`]). Every append but a deferred one
    /// is durable once it committed; a barrier waits for the server's
    /// flush only if a deferred append came after the last durable one.
    /// Barriers that meet share one flush: the first waits, the others
    /// find their appends flushed by it.
    async fn barrier(&self, durability: Durability) -> Result<(), LogError> {
        self.settle_all(durability != Durability::Buffered).await?;
        if durability == Durability::Buffered {
            return Ok(());
        }
        let wanted = self.commits.deferred.load(Ordering::Acquire);
        if self.commits.flushed.load(Ordering::Acquire) >= wanted {
            return Ok(());
        }
        let _one_flush = self.commits.flushing.lock().await;
        if self.commits.flushed.load(Ordering::Acquire) >= wanted {
            return Ok(());
        }
        let upto = self.commits.deferred.load(Ordering::Acquire);
        self.db().flush().await?;
        self.commits.flushed.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }
    /// Stores what `session` holds first, its refusal the caller's error.
    async fn barrier_of(&self, session: Uuid, durability: Durability) -> Result<(), LogError> {
        self.settle(session, durability != Durability::Buffered, true)
            .await?;
        self.barrier(durability).await
    }
    async fn import_own(
        &self,
        session: Uuid,
        start: Head,
        sealed: Vec<Vec<u8>>,
    ) -> Result<Head, LogError> {
        let head = self.head(session).await?;
        let new = head == Head::EMPTY;
        let head = if new { start } else { head };
        if head != start {
            return Err(LogError::Conflict {
                session,
                expected: start.seq + 1,
                actual: head.seq + 1,
            });
        }
        let records = open_sealed(session, head, new, &sealed)?;
        let Some(last) = records.last() else {
            return Ok(head);
        };
        let new_head = Head {
            seq: last.envelope.seq,
            hash: last.hash,
        };
        match self
            .store_after(session, head, &records, sealed, false)
            .await?
        {
            Stored::Done => Ok(new_head),
            Stored::HeadMoved(actual) => Err(LogError::Conflict {
                session,
                expected: head.seq + 1,
                actual,
            }),
        }
    }
    fn follow(&self, listener: AppendListener) {
        self.listeners
            .lock()
            .expect("listener lock poisoned")
            .push(listener);
        self.listening.call_once(|| self.start_listening());
    }

    fn leases(&self) -> &dyn Leases {
        self
    }

    fn side_store(&self) -> &dyn SideStore {
        self
    }
}

#[async_trait::async_trait]
impl Leases for PgLog {
    async fn acquire_lease(
        &self,
        session: Uuid,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, LogError> {
        let db = self.db();
        let (owner, ttl) = (owner.to_string(), ttl_ms(ttl));
        let rows = db.query(
                "acquire lease",
                &format!(
                    "INSERT INTO mneme_leases AS l (session, owner, token, expires_at, released) \
                     VALUES ($1, $2, 1, clock_timestamp() + $3 * interval '1 millisecond', false) \
                     ON CONFLICT (session) DO UPDATE SET \
                       token = l.token + 1, \
                       owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, released = false \
                     WHERE l.released OR l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner \
                     RETURNING {LEASE_COLUMNS}"
                ),
                &[&session, &owner, &(ttl as f64)],
            )
            .await?;
        self.granted(session, &rows).await
    }
    async fn take_over_lease(
        &self,
        held: &Lease,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease, LogError> {
        let db = self.db();
        let (session, token, ttl) = (held.session, held.token as i64, ttl_ms(ttl));
        let rows = db
            .query(
                "take over lease",
                &format!(
                    "UPDATE mneme_leases SET token = token + 1, owner = $3, \
                       expires_at = clock_timestamp() + $4 * interval '1 millisecond', released = false \
                     WHERE session = $1 AND token = $2 AND owner = $5 \
                     RETURNING {LEASE_COLUMNS}"
                ),
                &[&session, &token, &owner, &(ttl as f64), &held.owner],
            )
            .await?;
        self.granted(session, &rows).await
    }
    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LogError> {
        let db = self.db();
        let (session, token, ttl) = (lease.session, lease.token as i64, ttl_ms(ttl));
        let rows = db
            .query(
                "renew lease",
                &format!(
                    "UPDATE mneme_leases \
                     SET expires_at = clock_timestamp() + $3 * interval '1 millisecond' \
                     WHERE session = $1 AND token = $2 AND NOT released \
                     RETURNING {LEASE_COLUMNS}"
                ),
                &[&session, &token, &(ttl as f64)],
            )
            .await?;
        match rows.first().map(lease_of) {
            Some(renewed) => Ok(renewed),
            // The stale token stays in `held`: this handle's appends to the
            // session go on being refused as fenced until it releases.
            None => {
                let current = self.current_lease(session).await?.map_or(0, |l| l.token);
                Err(LogError::Fenced {
                    session,
                    token: lease.token,
                    current,
                })
            }
        }
    }
    /// Stores what the session holds first; released whether or not
    /// that was kept (the error, if it was not, is the caller's).
    async fn release_lease(&self, lease: &Lease) -> Result<(), LogError> {
        let stored = self.settle(lease.session, false, true).await;
        {
            let mut held = self.held.lock().expect("lease lock poisoned");
            if held.get(&lease.session) == Some(&lease.token) {
                held.remove(&lease.session);
            }
        }
        let db = self.db();
        let (session, token) = (lease.session, lease.token as i64);
        db.query(
            "release lease",
            "UPDATE mneme_leases SET released = true WHERE session = $1 AND token = $2",
            &[&session, &token],
        )
        .await?;
        stored
    }
    async fn expired_leases(&self) -> Result<Vec<Lease>, LogError> {
        let db = self.db();
        let rows = db
            .query(
                "list lapsed leases",
                &format!(
                    "SELECT {LEASE_COLUMNS} FROM mneme_leases \
                     WHERE NOT released AND expires_at <= clock_timestamp() ORDER BY session"
                ),
                &[],
            )
            .await?;
        Ok(rows.iter().map(lease_of).collect())
    }
    async fn lease(&self, session: Uuid) -> Result<Option<Lease>, LogError> {
        let db = self.db();
        let rows = db
            .query(
                "read live lease",
                &format!(
                    "SELECT {LEASE_COLUMNS} FROM mneme_leases \
                     WHERE session = $1 AND NOT released AND expires_at > clock_timestamp()"
                ),
                &[&session],
            )
            .await?;
        Ok(rows.first().map(lease_of))
    }
    async fn request_pause(&self, session: Uuid) -> Result<Option<Lease>, LogError> {
        let db = self.db();
        let rows = db
            .query(
                "ask for a pause",
                &format!(
                    "UPDATE mneme_leases SET pause_token = token \
                     WHERE session = $1 AND NOT released AND expires_at > clock_timestamp() \
                     RETURNING {LEASE_COLUMNS}"
                ),
                &[&session],
            )
            .await?;
        Ok(rows.first().map(lease_of))
    }
    /// One statement, which writes only when a request is there: the turn
    /// asks once a second.
    async fn take_pause_request(&self, session: Uuid, token: u64) -> Result<bool, LogError> {
        let db = self.db();
        let token = token as i64;
        let rows = db
            .query(
                "take a pause request",
                "UPDATE mneme_leases SET pause_token = NULL \
                 WHERE session = $1 AND token = $2 AND pause_token = $2 RETURNING 1",
                &[&session, &token],
            )
            .await?;
        Ok(!rows.is_empty())
    }
}

#[async_trait::async_trait]
impl SideStore for PgLog {
    async fn put_derived(&self, session: Uuid, name: &str, bytes: &[u8]) -> Result<(), LogError> {
        let db = self.db();
        let (name, bytes) = (name.to_string(), bytes.to_vec());
        db.query(
            "store derived data",
            "INSERT INTO mneme_derived (session, name, bytes) VALUES ($1, $2, $3) \
                 ON CONFLICT (session, name) DO UPDATE SET bytes = EXCLUDED.bytes",
            &[&session, &name, &bytes],
        )
        .await
        .map(drop)
    }
    async fn get_key(&self, session: Uuid) -> Result<Option<Vec<u8>>, LogError> {
        let rows = self
            .db()
            .query(
                "read a session key",
                "SELECT wrapped FROM mneme_session_keys WHERE session = $1",
                &[&session],
            )
            .await?;
        Ok(rows.first().map(|row| row.get(0)))
    }
    /// One statement: an insert that finds a key returns it. One that lost
    /// a race to a transaction its snapshot does not see reads again.
    async fn put_key(&self, session: Uuid, key: &[u8]) -> Result<Vec<u8>, LogError> {
        let key = key.to_vec();
        let rows = self
            .db()
            .query(
                "store a session key",
                "WITH new AS (INSERT INTO mneme_session_keys (session, wrapped) VALUES ($1, $2) \
                     ON CONFLICT (session) DO NOTHING RETURNING wrapped) \
                 SELECT wrapped FROM new UNION ALL \
                 SELECT wrapped FROM mneme_session_keys WHERE session = $1",
                &[&session, &key],
            )
            .await?;
        match rows.first() {
            Some(row) => Ok(row.get(0)),
            None => Ok(self.side_store().get_key(session).await?.unwrap_or(key)),
        }
    }
    /// Deletes the row, then vacuums the table so the dead row's bytes are
    /// reclaimed in the table's pages (the server's write-ahead segments
    /// keep it until recycled).
    async fn destroy_key(&self, session: Uuid) -> Result<(), LogError> {
        let db = self.db();
        db.query(
            "destroy a session key",
            "DELETE FROM mneme_session_keys WHERE session = $1",
            &[&session],
        )
        .await?;
        let client = db.client().await?;
        client
            .batch_execute("VACUUM mneme_session_keys")
            .await
            .map_err(db.fail("vacuum the session keys"))
    }
    async fn get_derived(&self, session: Uuid, name: &str) -> Result<Option<Vec<u8>>, LogError> {
        let db = self.db();
        let name = name.to_string();
        let rows = db
            .query(
                "read derived data",
                "SELECT bytes FROM mneme_derived WHERE session = $1 AND name = $2",
                &[&session, &name],
            )
            .await?;
        Ok(rows.first().map(|row| row.get(0)))
    }
    /// One query for all of `sessions`.
    async fn get_derived_many(
        &self,
        name: &str,
        sessions: &[Uuid],
    ) -> Result<Vec<Option<Vec<u8>>>, LogError> {
        let db = self.db();
        let (name, wanted) = (name.to_string(), sessions.to_vec());
        let rows = db
            .query(
                "read derived data",
                "SELECT session, bytes FROM mneme_derived WHERE name = $1 AND session = ANY($2)",
                &[&name, &wanted],
            )
            .await?;
        let mut found: HashMap<Uuid, Vec<u8>> =
            rows.iter().map(|row| (row.get(0), row.get(1))).collect();
        Ok(sessions.iter().map(|s| found.remove(s)).collect())
    }
}

#[cfg(test)]
mod tests;

/// Milliseconds since the Unix epoch, now: what a record is stamped with.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
