//! The PostgreSQL backend against the test server (`MNEME_TEST_PG`): the
//! conformance suite, plain and over TLS, and what only this backend does.

use super::*;
use eventlog::conformance::Backend;
use std::sync::atomic::{AtomicU64, Ordering};

/// The server the tests use: `MNEME_TEST_PG`, which
/// `scripts/with-postgres.sh` starts and sets.
fn server() -> String {
    std::env::var("MNEME_TEST_PG").expect(
        "MNEME_TEST_PG is not set: run the tests as `scripts/with-postgres.sh cargo test --workspace`",
    )
}

/// PostgreSQL as the conformance suite sees it: each store is a fresh
/// schema on the test server.
struct Postgres;

static STORES: AtomicU64 = AtomicU64::new(0);

#[async_trait::async_trait]
impl eventlog::conformance::Backend for Postgres {
    type Store = String;

    async fn create(&self) -> String {
        let n = STORES.fetch_add(1, Ordering::SeqCst);
        let schema = format!("t{}_{}_{n}", std::process::id(), Uuid::now_v7().simple());
        format!("{}?schema={schema}", server())
    }

    async fn open(&self, url: &String) -> Result<Arc<dyn EventLog>, LogError> {
        Ok(Arc::new(PgLog::connect(url).await?))
    }

    async fn tamper(&self, url: &String, session: Uuid, seq: u64) {
        behind_the_logs_back(
            url,
            "UPDATE mneme_events SET record = set_byte(record, length(record) - 40, \
             get_byte(record, length(record) - 40) # 1) WHERE session = $1 AND seq = $2",
            session,
            seq,
        )
        .await;
    }

    async fn remove(&self, url: &String, session: Uuid, seq: u64) {
        behind_the_logs_back(
            url,
            "DELETE FROM mneme_events WHERE session = $1 AND seq = $2",
            session,
            seq,
        )
        .await;
    }

    fn shared(&self) -> bool {
        true
    }
}

/// Runs `sql` on the record at (`session` = $1, `seq` = $2) of the
/// store at `url`, as someone with access to the database could.
async fn behind_the_logs_back(url: &str, sql: &'static str, session: Uuid, seq: u64) {
    let log = PgLog::connect(url).await.unwrap();
    let db = log.db();
    let seq = seq as i64;
    db.query("change a record", sql, &[&session, &seq])
        .await
        .map(drop)
        .unwrap();
}

eventlog::conformance_tests!(Postgres);

/// The same suite over TLS: `sslmode=require`, the server's certificate
/// checked against the throwaway CA (`MNEME_TEST_PG_CA`).
mod over_tls {
    use super::*;

    pub(super) fn tls_url(url: String) -> String {
        let ca = std::env::var("MNEME_TEST_PG_CA").expect(
            "MNEME_TEST_PG_CA is not set: run the tests as `scripts/with-postgres.sh cargo test --workspace`",
        );
        format!("{url}&sslmode=require&sslrootcert={ca}")
    }

    struct PostgresTls;

    #[async_trait::async_trait]
    impl eventlog::conformance::Backend for PostgresTls {
        type Store = String;

        async fn create(&self) -> String {
            tls_url(Postgres.create().await)
        }

        async fn open(&self, url: &String) -> Result<Arc<dyn EventLog>, LogError> {
            Postgres.open(url).await
        }

        async fn tamper(&self, url: &String, session: Uuid, seq: u64) {
            Postgres.tamper(url, session, seq).await
        }

        async fn remove(&self, url: &String, session: Uuid, seq: u64) {
            Postgres.remove(url, session, seq).await
        }

        fn shared(&self) -> bool {
            true
        }
    }

    eventlog::conformance_tests!(PostgresTls);
}

#[tokio::test]
async fn connections_with_sslmode_require_are_encrypted_and_checked() {
    let url = over_tls::tls_url(eventlog::conformance::Backend::create(&Postgres).await);
    let log = PgLog::connect(&url).await.unwrap();
    let db = log.db();
    let rows = db
        .query(
            "read ssl",
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(rows[0].get::<_, bool>(0), "the connection is encrypted");
    // Without the throwaway CA, the self-signed certificate is refused.
    let untrusted = url.split("&sslrootcert=").next().unwrap();
    let err = PgLog::connect(untrusted).await.err().unwrap();
    assert!(
        format!("{err:?}").to_lowercase().contains("certificate"),
        "{err:?}"
    );
}

#[tokio::test]
async fn migrations_run_once_and_a_newer_schema_is_refused() {
    let url = Postgres.create().await;
    let log = PgLog::connect(&url).await.unwrap();
    drop(PgLog::connect(&url).await.unwrap());
    let db = log.db();
    let versions = db
        .query("read", "SELECT version FROM mneme_schema_version", &[])
        .await
        .unwrap();
    assert_eq!(versions.len(), schema::MIGRATIONS.len());
    let db = log.db();
    db.query(
        "bump",
        "INSERT INTO mneme_schema_version (version) VALUES (999)",
        &[],
    )
    .await
    .unwrap();
    let err = PgLog::connect(&url).await.err().unwrap();
    assert!(
        matches!(err, LogError::SchemaTooNew { found: 999, .. }),
        "{err}"
    );
}

/// A store of version 1 (no pause requests) with a lease held and
/// appended under: the next connect adds the column, the holder goes on
/// appending (its connections ran `mneme_append` before the change) and
/// can be asked to pause.
#[tokio::test]
async fn a_version_1_store_migrates_with_its_leases_held() {
    let url = Postgres.create().await;
    let log = PgLog::connect(&url).await.unwrap();
    let s = Uuid::now_v7();
    let lease = log
        .leases()
        .acquire_lease(s, "old", Duration::from_secs(60))
        .await
        .unwrap();
    log.append(s, 1, vec![eventlog::conformance::event(1)])
        .await
        .unwrap();
    log.db()
        .query(
            "back to version 1",
            "ALTER TABLE mneme_leases DROP COLUMN pause_token",
            &[],
        )
        .await
        .unwrap();
    log.db()
        .query("back to version 1", "DROP TABLE mneme_session_keys", &[])
        .await
        .unwrap();
    for undo in [
        "ALTER TABLE mneme_sessions DROP COLUMN base_parent, DROP COLUMN base_through",
        "DROP FUNCTION mneme_append_based",
    ] {
        log.db()
            .query("back to version 1", undo, &[])
            .await
            .unwrap();
    }
    log.db()
        .query(
            "back to version 1",
            "DELETE FROM mneme_schema_version WHERE version >= 2",
            &[],
        )
        .await
        .unwrap();
    let newer = PgLog::connect(&url).await.unwrap();
    let versions = newer
        .db()
        .query("read", "SELECT version FROM mneme_schema_version", &[])
        .await
        .unwrap();
    assert_eq!(versions.len(), schema::MIGRATIONS.len());
    log.append(s, 2, vec![eventlog::conformance::event(2)])
        .await
        .unwrap();
    let asked = newer.leases().request_pause(s).await.unwrap().unwrap();
    assert_eq!(asked.token, lease.token);
    assert!(log
        .leases()
        .take_pause_request(s, lease.token)
        .await
        .unwrap());
    log.append(s, 3, vec![eventlog::conformance::event(3)])
        .await
        .unwrap();
    assert_eq!(newer.verify(s).await.unwrap(), 3);
}

#[tokio::test]
async fn connections_commit_synchronously_whatever_the_server_default() {
    let url = Postgres.create().await;
    let log = PgLog::connect(&url).await.unwrap();
    let db = log.db();
    let settings = db
        .query(
            "read settings",
            "SELECT current_setting('synchronous_commit'), current_setting('statement_timeout')",
            &[],
        )
        .await
        .unwrap();
    let (commit, timeout): (String, String) = (settings[0].get(0), settings[0].get(1));
    assert_eq!((commit.as_str(), timeout.as_str()), ("on", "1min"));
}

/// `(seq, xmin)` of each of `session`'s records: the transaction that
/// stored it.
async fn transactions(log: &PgLog, session: Uuid) -> Vec<(i64, String)> {
    let rows = (log.db())
        .query(
            "read transactions",
            "SELECT seq, xmin::text FROM mneme_events WHERE session = $1 ORDER BY seq",
            &[&session],
        )
        .await
        .unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

fn event(seq: u64) -> Vec<NewEvent> {
    vec![eventlog::conformance::event(seq as u8)]
}

/// A deferred append (a model reply) is held in the handle: no other
/// process sees it, and the session's next append (its `ToolStarted`)
/// stores both in one transaction.
#[tokio::test]
async fn a_deferred_append_is_stored_in_one_transaction_with_the_next() {
    let url = Postgres.create().await;
    let (log, other) = (
        PgLog::connect(&url).await.unwrap(),
        PgLog::connect(&url).await.unwrap(),
    );
    let session = Uuid::now_v7();
    log.append(session, 1, event(1)).await.unwrap();
    let reply = log.append_deferred(session, 2, event(2)).await.unwrap();
    assert_eq!(other.head(session).await.unwrap().seq, 1);
    let started = log.append(session, 3, event(3)).await.unwrap();
    assert_eq!(reply[0].hash, started[0].envelope.prev_hash);
    assert_eq!(other.head(session).await.unwrap().seq, 3);
    let stored = transactions(&log, session).await;
    assert_eq!(stored.len(), 3);
    assert_eq!(stored[1].1, stored[2].1, "{stored:?}");
    assert_ne!(stored[0].1, stored[1].1, "{stored:?}");
    assert_eq!(other.verify(session).await.unwrap(), 3);
}

/// What a handle holds, it reads back itself (storing it without waiting
/// for the server's flush, so other processes see it too), and a barrier
/// after that returns once the server's write-ahead log is on disk past
/// it; a barrier stores what is held, a buffered one too; and the
/// connections' own setting stays synchronous.
#[tokio::test]
async fn held_records_are_stored_by_a_read_or_a_barrier() {
    let url = Postgres.create().await;
    let (log, other) = (
        PgLog::connect(&url).await.unwrap(),
        PgLog::connect(&url).await.unwrap(),
    );
    let db = log.db();
    let lsn = |sql: &'static str| {
        let db = &db;
        async move {
            let rows = db.query("read an lsn", sql, &[]).await.unwrap();
            rows[0].get::<_, i64>(0)
        }
    };
    const INSERTED: &str = "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint";
    const FLUSHED: &str = "SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint";
    let session = Uuid::now_v7();
    for seq in (1..=60).step_by(3) {
        log.append_deferred(session, seq, event(seq)).await.unwrap();
        let read = log.read(session, seq, seq).await.unwrap();
        assert_eq!(read.len(), 1, "seq {seq}: read back by its handle");
        assert_eq!(other.head(session).await.unwrap().seq, seq);
        let stored = lsn(INSERTED).await;
        log.barrier(Durability::Synced).await.unwrap();
        let flushed = lsn(FLUSHED).await;
        assert!(
            flushed >= stored,
            "seq {seq}: flushed to {flushed}, stored to {stored}"
        );
        log.append_deferred(session, seq + 1, event(seq + 1))
            .await
            .unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        assert_eq!(other.head(session).await.unwrap().seq, seq + 1);
        log.append_deferred(session, seq + 2, event(seq + 2))
            .await
            .unwrap();
        log.barrier(Durability::Buffered).await.unwrap();
        assert_eq!(other.head(session).await.unwrap().seq, seq + 2);
    }
    assert_eq!(log.head(session).await.unwrap().seq, 60);
    let setting = db
        .query(
            "read a setting",
            "SELECT current_setting('synchronous_commit')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(setting[0].get::<_, String>(0), "on");
}

/// A handle dropped while it holds a deferred append loses that append
/// and nothing before it, as a crash would; and when another writer took
/// the seq meanwhile, the next append is refused as a conflict and the
/// held records are not stored.
#[tokio::test]
async fn held_records_are_lost_with_their_handle_or_refused_after_another_write() {
    let url = Postgres.create().await;
    let other = PgLog::connect(&url).await.unwrap();
    let session = Uuid::now_v7();
    {
        let log = PgLog::connect(&url).await.unwrap();
        log.append(session, 1, event(1)).await.unwrap();
        log.append_deferred(session, 2, event(2)).await.unwrap();
    }
    assert_eq!(other.head(session).await.unwrap().seq, 1);
    let log = PgLog::connect(&url).await.unwrap();
    log.append_deferred(session, 2, event(2)).await.unwrap();
    let theirs = other.append(session, 2, event(20)).await.unwrap();
    let refused = log.append(session, 3, event(3)).await.unwrap_err();
    assert!(
        matches!(
            refused,
            LogError::Conflict {
                expected: 2,
                actual: 3,
                ..
            }
        ),
        "{refused}"
    );
    let stored = log.read(session, 1, u64::MAX).await.unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].hash, theirs[0].hash);
}

/// A writer fenced out while it holds a reply: others' listings, reads
/// and barriers through its handle go on (the reply is not kept), and the
/// writer hears it at its next append, or at its own `barrier_of`.
#[tokio::test]
async fn a_refused_held_reply_is_its_writers_error_not_the_readers() {
    let url = Postgres.create().await;
    let (log, other) = (
        PgLog::connect(&url).await.unwrap(),
        PgLog::connect(&url).await.unwrap(),
    );
    let fenced = |e: LogError| matches!(e, LogError::Fenced { .. });
    for by_barrier in [false, true] {
        let s = Uuid::now_v7();
        let ttl = Duration::from_secs(60);
        let lease = log.leases().acquire_lease(s, "old", ttl).await.unwrap();
        log.append(s, 1, event(1)).await.unwrap();
        log.append_deferred(s, 2, event(2)).await.unwrap();
        other
            .leases()
            .take_over_lease(&lease, "new", ttl)
            .await
            .unwrap();
        let listed = log.sessions().await.unwrap();
        assert_eq!(listed.iter().find(|m| m.session == s).unwrap().events, 1);
        log.barrier(Durability::Synced).await.unwrap();
        assert_eq!(log.read(s, 1, u64::MAX).await.unwrap().len(), 1);
        let told = match by_barrier {
            true => log.barrier_of(s, Durability::Synced).await.unwrap_err(),
            false => log.append(s, 2, event(3)).await.unwrap_err(),
        };
        assert!(fenced(told.clone()), "{told}");
        assert_eq!(other.head(s).await.unwrap().seq, 1);
    }
}

/// Readers of a session that holds records (a web view following a turn)
/// store them as they read, behind the same lock as the session's next
/// append: the appender never sees a conflict of its own making.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_while_a_session_holds_records_never_break_its_appends() {
    let url = Postgres.create().await;
    let log = Arc::new(PgLog::connect(&url).await.unwrap());
    let session = Uuid::now_v7();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (log, done) = (log.clone(), done.clone());
            tokio::spawn(async move {
                let mut reads = 0;
                while !done.load(Ordering::Relaxed) {
                    let head = log.head(session).await.unwrap();
                    log.read(session, 1, head.seq).await.unwrap();
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for seq in (1..=200).step_by(2) {
        log.append_deferred(session, seq, event(seq)).await.unwrap();
        log.append(session, seq + 1, event(seq + 1)).await.unwrap();
    }
    done.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.await.unwrap() > 0);
    }
    assert_eq!(log.verify(session).await.unwrap(), 200);
}

#[tokio::test]
async fn an_unreachable_store_is_named_without_its_password() {
    let err = PgLog::connect("postgres://me:hunter2@127.0.0.1:1/mneme")
        .await
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}
