//! The conformance suite every [`EventLog`] backend passes, so that no
//! backend drifts from the contract: appends, conflicts, range reads,
//! listing, durability across a reopen, corruption detection, chain
//! verification, derived data, import, the record size limit, leases,
//! pause requests and fencing.
//!
//! A backend's tests implement [`Backend`] and call
//! [`conformance_tests!`](crate::conformance_tests) once, which writes one
//! `#[tokio::test]` per check (the backend's crate needs tokio with
//! its `macros` and `rt-multi-thread` features).

use crate::{Base, Durability, EventLog, Head, LogError, NewEvent, Record, MAX_RECORD_BYTES};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// What the suite needs of a backend under test.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Keeps one empty store alive for a test (a directory, a schema).
    type Store: Send + Sync;
    /// A new, empty store.
    async fn create(&self) -> Self::Store;
    /// Opens `store`. The suite drops every handle before opening again,
    /// unless [`Backend::shared`] says several may be open at once.
    async fn open(&self, store: &Self::Store) -> Result<Arc<dyn EventLog>, LogError>;
    /// Alters one byte inside the stored record at (`session`, `seq`),
    /// behind the log's back, while no handle is open.
    async fn tamper(&self, store: &Self::Store, session: Uuid, seq: u64);
    /// Deletes the stored record at (`session`, `seq`), behind the log's
    /// back (its session's head left as it was), while no handle is open.
    async fn remove(&self, store: &Self::Store, session: Uuid, seq: u64);
    /// Whether several processes may hold the store at once (each handle
    /// from [`Backend::open`] stands for one).
    fn shared(&self) -> bool;
}

/// Writes one `#[test]` per conformance check against `$backend`.
#[macro_export]
macro_rules! conformance_tests {
    ($backend:expr) => {
        $crate::conformance_tests!(@each $backend;
            appends_are_gapless_and_read_back_in_order,
            stale_and_future_writers_get_conflicts_and_change_nothing,
            racing_writers_never_leave_gaps_or_overwrites,
            range_reads_return_exactly_the_range,
            bounded_reads_stop_at_the_byte_budget_and_check_what_they_return,
            listing_names_every_session_in_id_order,
            synced_records_and_heads_survive_a_reopen,
            a_tampered_record_is_refused_by_read_and_verify,
            a_missing_record_is_refused_by_read_bounded_read_and_verify,
            derived_data_is_kept_per_session_and_name,
            a_key_is_kept_once_per_session_until_destroyed,
            import_copies_records_byte_for_byte,
            sealed_reads_give_each_record_with_its_stored_bytes,
            import_refuses_a_broken_chain_and_stores_nothing,
            a_record_over_the_size_limit_is_refused_and_nothing_is_stored,
            leases_exclude_other_owners_until_released_or_expired,
            a_pause_request_is_for_one_holding_of_the_lease,
            a_taken_over_owner_is_fenced,
            a_live_lease_of_a_gone_holder_is_taken_over_at_once,
            appends_are_followed_across_handles,
            handles_sharing_a_store_see_each_others_appends,
            any_mix_of_good_and_stale_appends_keeps_exactly_the_accepted,
            a_fork_shares_its_parents_records_and_stores_only_its_own,
            a_fork_of_a_fork_reads_through_both_and_survives_a_reopen,
            a_fork_exports_and_imports_after_its_parent,
        );
    };
    (@each $backend:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::conformance::$name(&$backend).await;
            }
        )*
    };
}

/// A small event of kind `K<n>` whose payload is `n` bytes of `n`.
pub fn event(n: u8) -> NewEvent {
    NewEvent {
        kind: format!("K{n}"),
        schema: 1,
        caused_by: None,
        payload: vec![n; n as usize],
    }
}

async fn kinds(log: &dyn EventLog, session: Uuid) -> Vec<String> {
    log.read(session, 1, u64::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.envelope.kind)
        .collect()
}

fn sealed(records: &[Record]) -> Vec<Vec<u8>> {
    records
        .iter()
        .map(|r| Record::seal(r.envelope.clone()).unwrap().1)
        .collect()
}

/// Appends get seqs 1, 2, 3… and read back in order, payloads intact.
pub async fn appends_are_gapless_and_read_back_in_order<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let s = Uuid::now_v7();
    let first = log.append(s, 1, vec![event(1), event(2)]).await.unwrap();
    assert_eq!(first[1].envelope.seq, 2);
    log.append(s, 3, vec![event(3)]).await.unwrap();
    let records = log.read(s, 1, u64::MAX).await.unwrap();
    let seqs: Vec<u64> = records.iter().map(|r| r.envelope.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(records[2].envelope.payload, vec![3, 3, 3]);
    assert_eq!(records[1].envelope.prev_hash, records[0].hash);
    assert_eq!(log.verify(s).await.unwrap(), 3);
    let head = log.head(s).await.unwrap();
    assert_eq!((head.seq, head.hash), (3, records[2].hash));
    assert_eq!(log.head(Uuid::now_v7()).await.unwrap(), Head::EMPTY);
}

/// A writer with a stale or future expected seq gets `Conflict` naming the
/// seq the log would accept, and nothing changes.
pub async fn stale_and_future_writers_get_conflicts_and_change_nothing<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let s = Uuid::now_v7();
    log.append(s, 1, vec![event(1)]).await.unwrap();
    for expected in [1, 3, 0] {
        let err = log.append(s, expected, vec![event(9)]).await.unwrap_err();
        assert!(
            matches!(err, LogError::Conflict { actual: 2, .. }),
            "expected {expected}: {err}"
        );
    }
    let err = log
        .append(Uuid::now_v7(), 2, vec![event(9)])
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::Conflict { actual: 1, .. }), "{err}");
    assert_eq!(kinds(log.as_ref(), s).await, vec!["K1"]);
    assert_eq!(log.sessions().await.unwrap().len(), 1);
}

/// Threads racing on one session: each append lands whole or gets a
/// conflict; the chain is gapless and holds exactly the winners.
pub async fn racing_writers_never_leave_gaps_or_overwrites<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let s = Uuid::now_v7();
    let won = Arc::new(Mutex::new(0u64));
    let writers: Vec<_> = (0..4u8)
        .map(|t| {
            let (log, won) = (log.clone(), won.clone());
            tokio::spawn(async move {
                for _ in 0..15 {
                    let next = log.head(s).await.unwrap().seq + 1;
                    match log.append(s, next, vec![event(t), event(t)]).await {
                        Ok(records) => *won.lock().unwrap() += records.len() as u64,
                        Err(LogError::Conflict { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let won = *won.lock().unwrap();
    assert!(won >= 30, "at least one writer wins each round: {won}");
    assert_eq!(log.verify(s).await.unwrap(), won);
    let kinds = kinds(log.as_ref(), s).await;
    for pair in kinds.chunks(2) {
        assert_eq!(pair[0], pair[1], "an append's records stay together");
    }
}

/// `read(from, to)` returns exactly the stored records in `from..=to`.
pub async fn range_reads_return_exactly_the_range<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let s = Uuid::now_v7();
    log.append(s, 1, (1..=10).map(event).collect())
        .await
        .unwrap();
    let seqs = |from, to| {
        let log = log.clone();
        async move {
            log.read(s, from, to)
                .await
                .unwrap()
                .iter()
                .map(|r| r.envelope.seq)
                .collect::<Vec<u64>>()
        }
    };
    assert_eq!(seqs(3, 5).await, vec![3, 4, 5]);
    assert_eq!(seqs(0, 2).await, vec![1, 2]);
    assert_eq!(seqs(9, 100).await, vec![9, 10]);
    assert_eq!(seqs(7, 7).await, vec![7]);
    assert!(seqs(6, 5).await.is_empty());
    assert!(seqs(11, 20).await.is_empty());
    assert!(log.read(Uuid::now_v7(), 1, 10).await.unwrap().is_empty());
}

/// `read_bounded(from, to, max_bytes)` returns the longest run from `from`
/// (within `to`) whose sealed sizes fit in `max_bytes`, or the first record
/// alone when even it does not fit, exactly as `read` returns them; a
/// tampered record it would return is refused.
pub async fn bounded_reads_stop_at_the_byte_budget_and_check_what_they_return<B: Backend>(b: &B) {
    let store = b.create().await;
    let s = Uuid::now_v7();
    let sized = |n: u8, payload: usize| NewEvent {
        payload: vec![n; payload],
        ..event(n)
    };
    let (all, sizes) = {
        let log = b.open(&store).await.unwrap();
        let events = [(1, 10), (2, 40_000), (3, 5), (4, 20), (5, 200_000), (6, 1)];
        log.append(s, 1, events.map(|(n, len)| sized(n, len)).into())
            .await
            .unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        let all = log.read(s, 1, u64::MAX).await.unwrap();
        let sizes: Vec<usize> = sealed(&all).iter().map(Vec::len).collect();
        let total: usize = sizes.iter().sum();
        // What the contract says, for every start, end and budget tried.
        let expected = |from: usize, to: usize, max: usize| -> Vec<Record> {
            let mut spent = 0;
            let mut run = Vec::new();
            for (record, size) in all.iter().zip(&sizes).take(to).skip(from - 1) {
                if !run.is_empty() && spent + size > max {
                    break;
                }
                spent += size;
                run.push(record.clone());
            }
            run
        };
        let mut budgets = vec![0, 1, usize::MAX, total, total - 1];
        for i in 0..sizes.len() {
            let upto: usize = sizes[..=i].iter().sum();
            budgets.extend([upto - 1, upto, upto + 1]);
        }
        for from in 1..=all.len() {
            for to in from..=all.len() {
                for &max in &budgets {
                    let got = log
                        .read_bounded(s, from as u64, to as u64, max)
                        .await
                        .unwrap();
                    assert_eq!(got, expected(from, to, max), "{from}..={to} in {max} bytes");
                    assert!(!got.is_empty(), "a stream always advances");
                }
            }
        }
        let seqs =
            |records: Vec<Record>| -> Vec<u64> { records.iter().map(|r| r.envelope.seq).collect() };
        let small = sizes[0] + sizes[1] - 1;
        assert_eq!(seqs(log.read_bounded(s, 1, 6, small).await.unwrap()), [1]);
        assert_eq!(
            seqs(log.read_bounded(s, 5, 6, 0).await.unwrap()),
            [5],
            "one over the budget"
        );
        assert_eq!(
            seqs(log.read_bounded(s, 0, 2, usize::MAX).await.unwrap()),
            [1, 2]
        );
        assert!(log
            .read_bounded(s, 4, 3, usize::MAX)
            .await
            .unwrap()
            .is_empty());
        assert!(log
            .read_bounded(s, 7, 9, usize::MAX)
            .await
            .unwrap()
            .is_empty());
        assert!(log
            .read_bounded(Uuid::now_v7(), 1, 9, 0)
            .await
            .unwrap()
            .is_empty());
        (all, sizes)
    };
    b.tamper(&store, s, 3).await;
    let log = b.open(&store).await.unwrap();
    for (from, max) in [(1, usize::MAX), (3, 0), (2, sizes[1] + sizes[2])] {
        let err = log.read_bounded(s, from, 6, max).await.unwrap_err();
        assert!(matches!(err, LogError::Corrupt { seq: 3, .. }), "{err}");
    }
    let before = log
        .read_bounded(s, 1, 6, sizes[0] + sizes[1])
        .await
        .unwrap();
    assert_eq!(
        before,
        all[..2],
        "the budget ends before the tampered record"
    );
}

/// `sessions()` lists every session once, by id, with its count and last kind.
pub async fn listing_names_every_session_in_id_order<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let ids: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    for (i, id) in ids.iter().enumerate().rev() {
        let events: Vec<NewEvent> = (1..=i as u8 + 1).map(event).collect();
        log.append(*id, 1, events).await.unwrap();
    }
    let metas = log.sessions().await.unwrap();
    let listed: Vec<Uuid> = metas.iter().map(|m| m.session).collect();
    assert_eq!(listed, ids);
    assert_eq!(log.meta(ids[2]).await.unwrap().as_ref(), Some(&metas[2]));
    assert_eq!(log.meta(Uuid::now_v7()).await.unwrap(), None);
    for (i, meta) in metas.iter().enumerate() {
        assert_eq!(meta.events, i as u64 + 1);
        assert_eq!(meta.last_kind, format!("K{}", i + 1));
        assert!(meta.created_ms <= meta.updated_ms);
        assert!(meta.created_ms > 1_600_000_000_000, "{}", meta.created_ms);
    }
}

/// After a synced barrier, records and heads survive closing and reopening.
pub async fn synced_records_and_heads_survive_a_reopen<B: Backend>(b: &B) {
    let store = b.create().await;
    let s = Uuid::now_v7();
    let before = {
        let log = b.open(&store).await.unwrap();
        let records = log.append(s, 1, vec![event(1), event(2)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        records
    };
    let log = b.open(&store).await.unwrap();
    assert_eq!(log.head(s).await.unwrap().hash, before[1].hash);
    log.append(s, 3, vec![event(3)]).await.unwrap();
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(log.verify(s).await.unwrap(), 3);
    assert_eq!(log.read(s, 1, 2).await.unwrap(), before);
    assert_eq!(log.sessions().await.unwrap()[0].events, 3);
}

/// A record whose stored bytes changed is refused by `read` and `verify`,
/// naming its seq.
pub async fn a_tampered_record_is_refused_by_read_and_verify<B: Backend>(b: &B) {
    let store = b.create().await;
    let s = Uuid::now_v7();
    {
        let log = b.open(&store).await.unwrap();
        log.append(s, 1, vec![event(1), event(2), event(3)])
            .await
            .unwrap();
        log.barrier(Durability::Synced).await.unwrap();
    }
    b.tamper(&store, s, 2).await;
    let log = b.open(&store).await.unwrap();
    let err = log.read(s, 1, 3).await.unwrap_err();
    assert!(matches!(err, LogError::Corrupt { seq: 2, .. }), "{err}");
    let err = log.verify(s).await.unwrap_err();
    assert!(err.to_string().contains("seq 2"), "{err}");
    assert_eq!(
        log.read(s, 1, 1).await.unwrap().len(),
        1,
        "seq 1 still reads"
    );
}

/// A record missing from the middle of a session is refused by `read`,
/// `read_bounded` (in the middle of what it returns, or where it starts)
/// and `verify`, naming its seq; a read that stops before it succeeds.
pub async fn a_missing_record_is_refused_by_read_bounded_read_and_verify<B: Backend>(b: &B) {
    let store = b.create().await;
    let s = Uuid::now_v7();
    {
        let log = b.open(&store).await.unwrap();
        log.append(s, 1, (1..=4).map(event).collect())
            .await
            .unwrap();
        log.barrier(Durability::Synced).await.unwrap();
    }
    b.remove(&store, s, 2).await;
    let log = b.open(&store).await.unwrap();
    let missing = |result: Result<Vec<Record>, LogError>| match result {
        Err(err @ LogError::Corrupt { seq: 2, .. }) => {
            assert!(err.to_string().contains("missing record"), "{err}")
        }
        other => panic!("seq 2 must be refused as missing: {other:?}"),
    };
    missing(log.read(s, 1, 4).await);
    missing(log.read_bounded(s, 1, 4, usize::MAX).await);
    missing(log.read_bounded(s, 2, 4, 0).await);
    let err = log.verify(s).await.unwrap_err();
    assert!(err.to_string().contains("seq 2"), "{err}");
    assert_eq!(log.read_bounded(s, 1, 4, 0).await.unwrap().len(), 1);
}

/// Derived data is stored per (session, name) and replaced on put.
pub async fn derived_data_is_kept_per_session_and_name<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let (s, t) = (Uuid::now_v7(), Uuid::now_v7());
    assert_eq!(
        log.side_store().get_derived(s, "snapshot").await.unwrap(),
        None
    );
    log.side_store()
        .put_derived(s, "snapshot", b"one")
        .await
        .unwrap();
    log.side_store()
        .put_derived(s, "summary", b"two")
        .await
        .unwrap();
    log.side_store()
        .put_derived(s, "snapshot", b"three")
        .await
        .unwrap();
    assert_eq!(
        log.side_store()
            .get_derived(s, "snapshot")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"three"[..])
    );
    assert_eq!(
        log.side_store()
            .get_derived(s, "summary")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"two"[..])
    );
    assert_eq!(
        log.side_store().get_derived(t, "snapshot").await.unwrap(),
        None
    );
    assert_eq!(
        log.side_store()
            .get_derived_many("snapshot", &[t, s, t])
            .await
            .unwrap(),
        vec![None, Some(b"three".to_vec()), None]
    );
}

/// The first key put for a session is the one kept, across handles, until
/// it is destroyed; destroying it again, or another session's, is harmless.
pub async fn a_key_is_kept_once_per_session_until_destroyed<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let (s, t) = (Uuid::now_v7(), Uuid::now_v7());
    assert_eq!(log.side_store().get_key(s).await.unwrap(), None);
    assert_eq!(
        log.side_store().put_key(s, b"first").await.unwrap(),
        b"first"
    );
    assert_eq!(
        log.side_store().put_key(s, b"second").await.unwrap(),
        b"first"
    );
    assert_eq!(
        log.side_store().put_key(t, b"other").await.unwrap(),
        b"other"
    );
    drop(log);
    let log = b.open(&store).await.unwrap();
    assert_eq!(
        log.side_store().get_key(s).await.unwrap().as_deref(),
        Some(&b"first"[..])
    );
    log.side_store().destroy_key(s).await.unwrap();
    log.side_store().destroy_key(s).await.unwrap();
    assert_eq!(log.side_store().get_key(s).await.unwrap(), None);
    assert_eq!(
        log.side_store().get_key(t).await.unwrap().as_deref(),
        Some(&b"other"[..])
    );
}

/// Records imported from another store read back identical (same hashes,
/// same ids, same timestamps) and extend the chain.
pub async fn import_copies_records_byte_for_byte<B: Backend>(b: &B) {
    let (from, to) = (b.create().await, b.create().await);
    let s = Uuid::now_v7();
    let records = {
        let source = b.open(&from).await.unwrap();
        source.append(s, 1, vec![event(1), event(2)]).await.unwrap();
        source.append(s, 3, vec![event(3)]).await.unwrap();
        source.read(s, 1, u64::MAX).await.unwrap()
    };
    let target = b.open(&to).await.unwrap();
    let head = target.import(s, sealed(&records[..2])).await.unwrap();
    assert_eq!(head.seq, 2);
    let head = target.import(s, sealed(&records[2..])).await.unwrap();
    assert_eq!((head.seq, head.hash), (3, records[2].hash));
    assert_eq!(target.read(s, 1, u64::MAX).await.unwrap(), records);
    assert_eq!(target.verify(s).await.unwrap(), 3);
    let appended = target.append(s, 4, vec![event(4)]).await.unwrap();
    assert_eq!(appended[0].envelope.prev_hash, records[2].hash);
    assert_eq!(target.sessions().await.unwrap()[0].events, 4);
}

/// `read_sealed` gives the records `read` gives, each with bytes that open
/// to it and that an import takes: what an export carries.
pub async fn sealed_reads_give_each_record_with_its_stored_bytes<B: Backend>(b: &B) {
    let (from, to) = (b.create().await, b.create().await);
    let s = Uuid::now_v7();
    let source = b.open(&from).await.unwrap();
    source
        .append(s, 1, (1..=5).map(event).collect())
        .await
        .unwrap();
    let (records, bytes) = source.read_sealed(s, 2, 4).await.unwrap();
    assert_eq!(records, source.read(s, 2, 4).await.unwrap());
    assert_eq!(bytes.len(), 3);
    for (record, bytes) in records.iter().zip(&bytes) {
        let seq = record.envelope.seq;
        assert_eq!(&Record::open(s, seq, bytes).unwrap(), record);
    }
    assert_eq!(bytes, sealed(&records), "the bytes a seal of each gives");
    let (all, all_bytes) = source.read_sealed(s, 1, u64::MAX).await.unwrap();
    assert_eq!(all.len(), 5);
    let target = b.open(&to).await.unwrap();
    assert_eq!(target.import(s, all_bytes).await.unwrap().hash, all[4].hash);
    assert_eq!(source.read_sealed(s, 6, 9).await.unwrap().0, Vec::new());
}

/// An import with a gap, an altered byte, or records that do not follow
/// the target's head is refused whole.
pub async fn import_refuses_a_broken_chain_and_stores_nothing<B: Backend>(b: &B) {
    let (from, to) = (b.create().await, b.create().await);
    let s = Uuid::now_v7();
    let records = {
        let source = b.open(&from).await.unwrap();
        source
            .append(s, 1, (1..=4).map(event).collect())
            .await
            .unwrap();
        source.read(s, 1, u64::MAX).await.unwrap()
    };
    let target = b.open(&to).await.unwrap();
    let all = sealed(&records);
    let gap = vec![all[0].clone(), all[2].clone()];
    let err = target.import(s, gap).await.unwrap_err();
    assert!(matches!(err, LogError::Corrupt { seq: 2, .. }), "{err}");
    let mut altered = all.clone();
    let n = altered[1].len();
    altered[1][n - 40] ^= 1;
    let err = target.import(s, altered).await.unwrap_err();
    assert!(matches!(err, LogError::Corrupt { seq: 2, .. }), "{err}");
    let err = target.import(s, all[1..].to_vec()).await.unwrap_err();
    assert!(matches!(err, LogError::Corrupt { seq: 1, .. }), "{err}");
    assert_eq!(target.head(s).await.unwrap(), Head::EMPTY);
    assert!(target.sessions().await.unwrap().is_empty());
    target.import(s, all).await.unwrap();
    assert_eq!(target.verify(s).await.unwrap(), 4);
}

/// A record over [`MAX_RECORD_BYTES`] is refused, by append (even after a
/// small record of the same append) and by import, naming the session, the
/// seq, the size and the limit; nothing of either is stored. A record just
/// under the limit is stored and reads back.
pub async fn a_record_over_the_size_limit_is_refused_and_nothing_is_stored<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let (s, t) = (Uuid::now_v7(), Uuid::now_v7());
    let big = |payload: usize| NewEvent {
        kind: "Big".into(),
        schema: 1,
        caused_by: None,
        payload: vec![7; payload],
    };
    log.append(s, 1, vec![event(1)]).await.unwrap();
    let err = log
        .append(s, 2, vec![event(2), big(MAX_RECORD_BYTES)])
        .await
        .unwrap_err();
    let text = err.to_string();
    match err {
        LogError::RecordTooLarge {
            session,
            seq,
            size,
            limit,
        } => {
            assert_eq!((session, seq, limit), (s, 3, MAX_RECORD_BYTES as u64));
            assert!(size > limit, "{text}");
            assert!(
                text.contains(&s.to_string())
                    && text.contains("seq 3")
                    && text.contains(&format!("{size} bytes"))
                    && text.contains(&format!("limit of {limit} bytes")),
                "{text}"
            );
        }
        other => panic!("{other}"),
    }
    assert_eq!(kinds(log.as_ref(), s).await, vec!["K1"]);
    let err = log
        .import(t, vec![vec![1; MAX_RECORD_BYTES + 1]])
        .await
        .unwrap_err();
    assert!(
        matches!(err, LogError::RecordTooLarge { session, seq: 1, size, .. }
            if session == t && size == MAX_RECORD_BYTES as u64 + 1),
        "{err}"
    );
    assert_eq!(log.head(t).await.unwrap(), Head::EMPTY);
    let under = MAX_RECORD_BYTES - 1024;
    log.append(s, 2, vec![big(under)]).await.unwrap();
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(
        log.read(s, 2, 2).await.unwrap()[0].envelope.payload.len(),
        under
    );
    assert_eq!(log.verify(s).await.unwrap(), 2);
    assert_eq!(log.sessions().await.unwrap().len(), 1);
}

/// A live lease excludes other owners; release or expiry lets another take
/// it with a greater token, and the old lease can no longer be renewed.
pub async fn leases_exclude_other_owners_until_released_or_expired<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let s = Uuid::now_v7();
    let long = Duration::from_secs(60);
    assert_eq!(log.leases().lease(s).await.unwrap(), None);
    let a = log.leases().acquire_lease(s, "a", long).await.unwrap();
    assert_eq!(
        log.leases().lease(s).await.unwrap().map(|l| l.owner),
        Some("a".into())
    );
    match log.leases().acquire_lease(s, "b", long).await.unwrap_err() {
        LogError::LeaseHeld { owner, .. } => assert_eq!(owner, "a"),
        other => panic!("{other}"),
    }
    let renewed = log.leases().renew_lease(&a, long).await.unwrap();
    assert!(renewed.expires_ms >= a.expires_ms);
    let again = log.leases().acquire_lease(s, "a", long).await.unwrap();
    assert!(
        again.token > a.token,
        "every acquisition is a new holding, even by the same owner"
    );
    assert!(matches!(
        log.leases().renew_lease(&a, long).await,
        Err(LogError::Fenced { .. })
    ));
    let a = again;
    log.leases().release_lease(&a).await.unwrap();
    let b1 = log
        .leases()
        .acquire_lease(s, "b", Duration::from_millis(300))
        .await
        .unwrap();
    assert!(b1.token > a.token);
    assert!(log.leases().expired_leases().await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        log.leases().lease(s).await.unwrap(),
        None,
        "a lapsed lease is not live"
    );
    let expired = log.leases().expired_leases().await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(
        (expired[0].session, &expired[0].owner),
        (s, &"b".to_string())
    );
    let c = log.leases().acquire_lease(s, "c", long).await.unwrap();
    assert!(c.token > b1.token);
    assert!(matches!(
        log.leases().renew_lease(&b1, long).await.unwrap_err(),
        LogError::Fenced { .. }
    ));
    log.leases().release_lease(&b1).await.unwrap();
    assert!(
        matches!(
            log.leases().acquire_lease(s, "d", long).await,
            Err(LogError::LeaseHeld { .. })
        ),
        "releasing a lease that was taken over leaves the new owner's alone"
    );
    assert!(log.leases().expired_leases().await.unwrap().is_empty());
}

/// A pause request is kept with the live lease and heard once, by the
/// holding it was made of: not by a later holding, even of the same owner,
/// nor through another session's lease; without a live lease nothing is
/// kept. On a shared store, any handle may ask.
pub async fn a_pause_request_is_for_one_holding_of_the_lease<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let asker = if b.shared() {
        b.open(&store).await.unwrap()
    } else {
        log.clone()
    };
    let (s, other) = (Uuid::now_v7(), Uuid::now_v7());
    let long = Duration::from_secs(60);
    assert_eq!(
        asker.leases().request_pause(s).await.unwrap(),
        None,
        "nobody runs it"
    );
    let a = log.leases().acquire_lease(s, "a", long).await.unwrap();
    assert!(!log.leases().take_pause_request(s, a.token).await.unwrap());
    let asked = asker.leases().request_pause(s).await.unwrap().unwrap();
    assert_eq!((asked.owner.as_str(), asked.token), ("a", a.token));
    assert!(!log
        .leases()
        .take_pause_request(s, a.token + 1)
        .await
        .unwrap());
    assert!(!log
        .leases()
        .take_pause_request(other, a.token)
        .await
        .unwrap());
    assert!(log.leases().take_pause_request(s, a.token).await.unwrap());
    assert!(
        !log.leases().take_pause_request(s, a.token).await.unwrap(),
        "a request is heard once"
    );

    // One left over never pauses a later holding, even of the same owner.
    asker.leases().request_pause(s).await.unwrap().unwrap();
    let again = log.leases().acquire_lease(s, "a", long).await.unwrap();
    assert!(!log
        .leases()
        .take_pause_request(s, again.token)
        .await
        .unwrap());
    asker.leases().request_pause(s).await.unwrap().unwrap();
    log.leases().release_lease(&again).await.unwrap();
    assert_eq!(
        asker.leases().request_pause(s).await.unwrap(),
        None,
        "released"
    );
    let b1 = log.leases().acquire_lease(s, "b", long).await.unwrap();
    assert!(!log.leases().take_pause_request(s, b1.token).await.unwrap());

    // A lapsed lease is asked nothing.
    log.leases().release_lease(&b1).await.unwrap();
    let short = log
        .leases()
        .acquire_lease(s, "c", Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        asker.leases().request_pause(s).await.unwrap(),
        None,
        "lapsed"
    );
    assert!(!log
        .leases()
        .take_pause_request(s, short.token)
        .await
        .unwrap());
}

/// A writer whose lease was taken over cannot append; the new owner can; a
/// writer without a lease cannot append while another holds a live one.
/// A store that one process owns refuses a second opener instead.
pub async fn a_taken_over_owner_is_fenced<B: Backend>(b: &B) {
    let store = b.create().await;
    let old = b.open(&store).await.unwrap();
    if !b.shared() {
        return assert_second_opener_refused(b, &store).await;
    }
    let new = b.open(&store).await.unwrap();
    let third = b.open(&store).await.unwrap();
    let s = Uuid::now_v7();
    old.leases()
        .acquire_lease(s, "old", Duration::from_millis(200))
        .await
        .unwrap();
    old.append(s, 1, vec![event(1)]).await.unwrap();
    assert!(matches!(
        third.append(s, 2, vec![event(7)]).await.unwrap_err(),
        LogError::LeaseHeld { .. }
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let lease = new
        .leases()
        .acquire_lease(s, "new", Duration::from_secs(60))
        .await
        .unwrap();
    let err = old.append(s, 2, vec![event(2)]).await.unwrap_err();
    match err {
        LogError::Fenced { token, current, .. } => {
            assert!(token < current && current == lease.token)
        }
        other => panic!("{other}"),
    }
    new.append(s, 2, vec![event(3)]).await.unwrap();
    assert!(
        matches!(
            old.append(s, 2, vec![event(2)]).await.unwrap_err(),
            LogError::Fenced { .. }
        ),
        "a taken-over writer with a stale seq hears that it was fenced"
    );
    assert!(matches!(
        third.append(s, 3, vec![event(7)]).await.unwrap_err(),
        LogError::LeaseHeld { .. }
    ));
    new.leases().release_lease(&lease).await.unwrap();
    third.append(s, 3, vec![event(4)]).await.unwrap();
    assert_eq!(kinds(new.as_ref(), s).await, vec!["K1", "K3", "K4"]);
}

/// A live lease is taken over at once when named exactly (owner and
/// token), with a greater token that fences the old holding; a take-over
/// naming a holding that changed meanwhile is refused.
pub async fn a_live_lease_of_a_gone_holder_is_taken_over_at_once<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let s = Uuid::now_v7();
    let long = Duration::from_secs(60);
    let gone = log.leases().acquire_lease(s, "gone", long).await.unwrap();
    log.append(s, 1, vec![event(1)]).await.unwrap();
    let taken = log
        .leases()
        .take_over_lease(&gone, "heir", long)
        .await
        .unwrap();
    assert_eq!(taken.owner, "heir");
    assert!(taken.token > gone.token);
    assert_eq!(log.leases().lease(s).await.unwrap(), Some(taken.clone()));
    assert!(matches!(
        log.leases().renew_lease(&gone, long).await.unwrap_err(),
        LogError::Fenced { .. }
    ));
    // The holding named is no longer the lease: refused, the heir keeps it.
    match log
        .leases()
        .take_over_lease(&gone, "late", long)
        .await
        .unwrap_err()
    {
        LogError::LeaseHeld { owner, .. } => assert_eq!(owner, "heir"),
        other => panic!("{other}"),
    }
    log.append(s, 2, vec![event(2)]).await.unwrap();
    assert_eq!(kinds(log.as_ref(), s).await, vec!["K1", "K2"]);
}

/// A handle told to follow hears of appends made through another handle.
pub async fn appends_are_followed_across_handles<B: Backend>(b: &B) {
    let store = b.create().await;
    if !b.shared() {
        let _only = b.open(&store).await.unwrap();
        return assert_second_opener_refused(b, &store).await;
    }
    let (writer, reader) = (b.open(&store).await.unwrap(), b.open(&store).await.unwrap());
    let heard: Arc<Mutex<Vec<(Uuid, u64)>>> = Arc::default();
    let sink = heard.clone();
    reader.follow(Arc::new(move |s, seq| sink.lock().unwrap().push((s, seq))));
    let s = Uuid::now_v7();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut next = 1;
    // The follower may start listening a moment after `follow` returns:
    // append until it hears one, then check it hears the next exactly.
    while heard.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no append was heard");
        writer.append(s, next, vec![event(1)]).await.unwrap();
        next += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writer
        .append(s, next, vec![event(2), event(3)])
        .await
        .unwrap();
    let last = next + 1;
    while !heard.lock().unwrap().contains(&(s, last)) {
        assert!(Instant::now() < deadline, "append up to {last} not heard");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two handles on one store (two processes) append to one session in turn:
/// each sees the other's records, and a writer whose view is stale gets a
/// conflict, whatever it remembered.
pub async fn handles_sharing_a_store_see_each_others_appends<B: Backend>(b: &B) {
    let store = b.create().await;
    let one = b.open(&store).await.unwrap();
    if !b.shared() {
        return assert_second_opener_refused(b, &store).await;
    }
    let two = b.open(&store).await.unwrap();
    let s = Uuid::now_v7();
    one.append(s, 1, vec![event(1)]).await.unwrap();
    two.append(s, 2, vec![event(2)]).await.unwrap();
    let err = one.append(s, 2, vec![event(9)]).await.unwrap_err();
    assert!(matches!(err, LogError::Conflict { actual: 3, .. }), "{err}");
    one.append(s, 3, vec![event(3)]).await.unwrap();
    assert_eq!(two.head(s).await.unwrap(), one.head(s).await.unwrap());
    assert_eq!(kinds(two.as_ref(), s).await, vec!["K1", "K2", "K3"]);
    assert_eq!(two.verify(s).await.unwrap(), 3);
}

/// Property: any interleaving of good and stale appends leaves a gapless,
/// verifiable chain holding exactly the accepted events (a fresh session
/// per case, one store for all).
pub async fn any_mix_of_good_and_stale_appends_keeps_exactly_the_accepted<B: Backend>(b: &B) {
    use proptest::prelude::*;
    use proptest::test_runner::{TestCaseError, TestRunner};
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let ops = proptest::collection::vec((0u64..3, 1usize..4), 1..30);
    // The runner's cases are synchronous: run it on the blocking pool,
    // where each case may block on the log's futures.
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(ProptestConfig::with_cases(24));
        runner
            .run(&ops, |ops| {
                handle.block_on(async {
                    let s = Uuid::now_v7();
                    let mut accepted = Vec::new();
                    for (i, (skew, count)) in ops.into_iter().enumerate() {
                        let expected = log.head(s).await.unwrap().seq + 1 + skew;
                        let events: Vec<NewEvent> = (0..count).map(|_| event(i as u8)).collect();
                        match log.append(s, expected, events).await {
                            Ok(records) => {
                                prop_assert_eq!(skew, 0);
                                accepted.extend(records.into_iter().map(|r| r.envelope.kind));
                            }
                            Err(LogError::Conflict { .. }) => prop_assert!(skew != 0),
                            Err(e) => return Err(TestCaseError::fail(e.to_string())),
                        }
                    }
                    prop_assert_eq!(log.verify(s).await.unwrap(), accepted.len() as u64);
                    prop_assert_eq!(kinds(log.as_ref(), s).await, accepted);
                    Ok(())
                })
            })
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap();
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Nobody else can append to a store one process owns: a second opener is
/// refused.
/// A session `s` with events 1..=`n`, made durable.
async fn session_of(log: &dyn EventLog, n: u8) -> Uuid {
    let s = Uuid::now_v7();
    log.append(s, 1, (1..=n).map(event).collect())
        .await
        .unwrap();
    log.barrier(Durability::Synced).await.unwrap();
    s
}

/// A fork reads its parent's records up to its base, as they are stored
/// (each naming the parent), then its own, the first linked to the
/// parent's record at the base; it stores only its own, goes on by
/// itself, and is checked like any session.
pub async fn a_fork_shares_its_parents_records_and_stores_only_its_own<B: Backend>(b: &B) {
    let store = b.create().await;
    let log = b.open(&store).await.unwrap();
    let p = session_of(log.as_ref(), 5).await;
    let parent = log.read(p, 1, u64::MAX).await.unwrap();
    let c = Uuid::now_v7();
    let own = log.fork(c, p, 3, vec![event(7), event(8)]).await.unwrap();
    let base = Base {
        parent: p,
        through: 3,
    };
    assert_eq!(
        own.iter().map(|r| r.envelope.seq).collect::<Vec<_>>(),
        [4, 5]
    );
    assert_eq!(own[0].envelope.base, Some(base));
    assert_eq!(own[1].envelope.base, None);
    assert_eq!(own[0].envelope.prev_hash, parent[2].hash);
    assert_eq!(log.base(c).await.unwrap(), Some(base));
    assert_eq!(log.base(p).await.unwrap(), None);
    let read = log.read(c, 1, u64::MAX).await.unwrap();
    assert_eq!(read[..3], parent[..3], "the parent's, as stored");
    assert_eq!(read[3..], own[..]);
    assert_eq!(log.read(c, 2, 4).await.unwrap(), read[1..4]);
    assert_eq!(log.read(c, 5, 5).await.unwrap(), read[4..]);
    assert_eq!(log.verify(c).await.unwrap(), 5);
    assert_eq!(log.head(c).await.unwrap().hash, own[1].hash);
    // Each goes on by itself.
    log.append(p, 6, vec![event(6)]).await.unwrap();
    log.append(c, 6, vec![event(9)]).await.unwrap();
    assert_eq!(
        kinds(log.as_ref(), c).await,
        ["K1", "K2", "K3", "K7", "K8", "K9"]
    );
    assert_eq!(log.verify(p).await.unwrap(), 6);
    let listed = log.meta(c).await.unwrap().unwrap();
    assert_eq!(listed.events, 6);
    // A budget spans the base: the run stops where the bytes run out.
    let sizes: Vec<usize> = read.iter().map(Record::stored_len).collect();
    let budget = sizes[1] + sizes[2] + sizes[3];
    let bounded = log.read_bounded(c, 2, 6, budget).await.unwrap();
    assert_eq!(bounded, read[1..4]);
    let bounded = log.read_bounded(c, 3, 6, sizes[2] - 1).await.unwrap();
    assert_eq!(bounded, read[2..3], "never less than the first record");
    // Only a session with no records forks, and only where its parent reaches.
    let err = log.fork(c, p, 2, vec![event(1)]).await.unwrap_err();
    assert!(matches!(err, LogError::Conflict { .. }), "{err}");
    let err = log
        .fork(Uuid::now_v7(), p, 7, vec![event(1)])
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::Corrupt { seq: 7, .. }), "{err}");
    let err = log
        .fork(Uuid::now_v7(), p, 0, vec![event(1)])
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::Corrupt { .. }), "{err}");
    // Sealed reads give the parent's bytes for the records it shares.
    let (records, bytes) = log.read_sealed(c, 1, u64::MAX).await.unwrap();
    assert_eq!(records, log.read(c, 1, u64::MAX).await.unwrap());
    assert_eq!(Record::open(p, 2, &bytes[1]).unwrap(), parent[1]);
    assert_eq!(Record::peek_base(&bytes[3]), Some(base));
}

/// A fork of a fork shares through both; a fork, its base and its own
/// records survive a reopen.
pub async fn a_fork_of_a_fork_reads_through_both_and_survives_a_reopen<B: Backend>(b: &B) {
    let store = b.create().await;
    let (p, c, d) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let before = {
        let log = b.open(&store).await.unwrap();
        log.append(p, 1, (1..=4).map(event).collect())
            .await
            .unwrap();
        log.fork(c, p, 2, vec![event(5), event(6)]).await.unwrap();
        log.fork(d, c, 3, vec![event(7)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        log.read(d, 1, u64::MAX).await.unwrap()
    };
    assert_eq!(
        before
            .iter()
            .map(|r| r.envelope.session)
            .collect::<Vec<_>>(),
        [p, p, c, d]
    );
    let log = b.open(&store).await.unwrap();
    assert_eq!(log.read(d, 1, u64::MAX).await.unwrap(), before);
    assert_eq!(log.verify(d).await.unwrap(), 4);
    assert_eq!(log.verify(c).await.unwrap(), 4);
    assert_eq!(
        log.base(d).await.unwrap(),
        Some(Base {
            parent: c,
            through: 3
        })
    );
    log.append(d, 5, vec![event(8)]).await.unwrap();
    assert_eq!(kinds(log.as_ref(), d).await, ["K1", "K2", "K5", "K7", "K8"]);
    let listed = log.sessions().await.unwrap();
    assert_eq!(listed.len(), 3);
}

/// A fork's records exported (its parent's as the parent stores them,
/// then its own) import into another store after its parent's; into a
/// store without its parent, its own are refused and nothing is stored.
pub async fn a_fork_exports_and_imports_after_its_parent<B: Backend>(b: &B) {
    let (from, to) = (b.create().await, b.create().await);
    let (p, c) = (Uuid::now_v7(), Uuid::now_v7());
    let (records, bytes) = {
        let source = b.open(&from).await.unwrap();
        source
            .append(p, 1, (1..=3).map(event).collect())
            .await
            .unwrap();
        source
            .fork(c, p, 2, vec![event(4), event(5)])
            .await
            .unwrap();
        source.read_sealed(c, 1, u64::MAX).await.unwrap()
    };
    let target = b.open(&to).await.unwrap();
    let err = target.import(c, bytes[2..].to_vec()).await.unwrap_err();
    assert!(matches!(err, LogError::Corrupt { .. }), "{err}");
    assert_eq!(target.head(c).await.unwrap(), Head::EMPTY);
    // A first record that should name a base and does not, or one that
    // names one past the first: refused.
    let err = target.import(c, bytes[..2].to_vec()).await.unwrap_err();
    assert!(matches!(err, LogError::Corrupt { .. }), "{err}");
    target.import(p, bytes[..2].to_vec()).await.unwrap();
    let head = target.import(c, bytes[2..].to_vec()).await.unwrap();
    assert_eq!((head.seq, head.hash), (4, records[3].hash));
    assert_eq!(target.read(c, 1, u64::MAX).await.unwrap(), records);
    assert_eq!(target.verify(c).await.unwrap(), 4);
    assert_eq!(
        target.base(c).await.unwrap(),
        Some(Base {
            parent: p,
            through: 2
        })
    );
    let err = target.import(c, bytes[2..3].to_vec()).await.unwrap_err();
    assert!(matches!(err, LogError::Corrupt { seq: 5, .. }), "{err}");
}

async fn assert_second_opener_refused<B: Backend>(b: &B, store: &B::Store) {
    match b.open(store).await {
        Err(LogError::Locked { .. }) => {}
        Err(other) => panic!("a second opener must be told the store is locked: {other}"),
        Ok(_) => panic!("a second opener must be refused"),
    }
}
