use super::*;
use crate::conformance::event;
use crate::{Base, Envelope};
use std::sync::Arc;

/// sled as the conformance suite sees it: one directory per store.
struct Sled;

#[async_trait::async_trait]
impl crate::conformance::Backend for Sled {
    type Store = tempfile::TempDir;

    async fn create(&self) -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    /// sled may hold its lock a moment after the last handle dropped.
    async fn open(&self, dir: &tempfile::TempDir) -> Result<Arc<dyn EventLog>, LogError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match SledLog::open(dir.path()) {
                Err(LogError::Locked { .. }) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await
                }
                opened => return opened.map(|log| Arc::new(log) as Arc<dyn EventLog>),
            }
        }
    }

    async fn tamper(&self, dir: &tempfile::TempDir, session: Uuid, seq: u64) {
        let log = reopen(dir.path());
        let flip = |mut bytes: Vec<u8>| {
            let n = bytes.len();
            bytes[n - 40] ^= 1;
            Some(bytes)
        };
        log.rewrite_stored(session, seq, flip).unwrap();
    }

    async fn remove(&self, dir: &tempfile::TempDir, session: Uuid, seq: u64) {
        let log = reopen(dir.path());
        log.rewrite_stored(session, seq, |_| None).unwrap();
    }

    fn shared(&self) -> bool {
        false
    }
}

crate::conformance_tests!(Sled);

/// Opens `dir` again; sled may hold its lock a moment after the last
/// handle dropped.
fn reopen(dir: &Path) -> SledLog {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match SledLog::open(dir) {
            Err(LogError::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            opened => return opened.unwrap(),
        }
    }
}

/// Bytes of the files under `dir`, as `du -b` counts them.
fn bytes_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            match entry.metadata().unwrap() {
                m if m.is_dir() => bytes_under(&entry.path()),
                m => m.len(),
            }
        })
        .sum()
}

/// Text of `len` bytes from a small vocabulary, as compressible as
/// prose (not a run of one letter).
fn prose(seed: &mut u64, len: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "the", "invoice", "customer", "charged", "amount", "refund", "total", "order", "of",
        "account", "pending", "was", "and", "billing", "for", "status",
    ];
    let mut text = String::new();
    while text.len() < len {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let word = WORDS[(*seed >> 60) as usize];
        text.push_str(word);
        text.push_str(if *seed & 0xff < 20 { ". " } else { " " });
        if *seed & 0xff00 < 0x0a00 {
            text.push_str(&(*seed % 100_000).to_string());
            text.push(' ');
        }
    }
    text.truncate(len);
    text.into_bytes()
}

/// A 1,000-turn session (user message, tool call, tool started, tool
/// result, answer; a summary written at the end of each turn, as the
/// runtime does) takes less room on disk than its sealed records,
/// write-ahead file included: runs are compressed (0.51 times; with every
/// record a key in sled, 1.2 times; sled uncompressed, with 512 KiB
/// segments and the write-ahead file emptied every 64 MiB, 4.6 times).
#[tokio::test]
async fn a_long_session_takes_less_room_than_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let log = reopen(dir.path());
    let s = Uuid::now_v7();
    let mut seed = 1;
    let mut seq = 0;
    for turn in 0..1000 {
        for (kind, len) in [
            ("UserMessage", 200),
            ("ModelReplied", 120),
            ("ToolStarted", 60),
            ("ToolFinished", 400),
            ("ModelReplied", 300),
        ] {
            seq += 1;
            let event = NewEvent {
                kind: kind.into(),
                schema: 1,
                caused_by: None,
                payload: prose(&mut seed, len),
            };
            log.append(s, seq, vec![event]).await.unwrap();
            log.barrier(Durability::Flushed).await.unwrap();
        }
        let summary = format!("{{\"seq\":{seq},\"turn\":{turn},\"status\":\"done\"}}");
        log.side_store()
            .put_derived(s, "summary", &prose(&mut seed, 250))
            .await
            .unwrap();
        log.side_store()
            .put_derived(s, "status", summary.as_bytes())
            .await
            .unwrap();
    }
    let sealed: u64 = (log.shared.stored_range(s, 1, seq, None).unwrap().iter())
        .map(|(_, bytes)| bytes.len() as u64)
        .sum();
    let on_disk = bytes_under(dir.path());
    let ratio = on_disk as f64 / sealed as f64;
    eprintln!("{seq} records, {sealed} sealed bytes, {on_disk} on disk: {ratio:.2}x");
    assert!(
        ratio <= 0.8,
        "{on_disk} bytes on disk for {sealed} sealed: {ratio:.2}x"
    );
    drop(log);
    let log = reopen(dir.path());
    assert_eq!(log.verify(s).await.unwrap(), seq);
}

#[tokio::test]
async fn a_data_directory_keeps_the_sled_settings_it_was_created_with() {
    let dir = tempfile::tempdir().unwrap();
    let s = Uuid::now_v7();
    {
        // What mneme created before compression.
        let db = sled::Config::new()
            .path(dir.path())
            .flush_every_ms(None)
            .open()
            .unwrap();
        db.flush().unwrap();
    }
    assert_eq!(created_with(dir.path()), Some((false, 512 << 10)));
    let log = reopen(dir.path());
    log.append(s, 1, vec![event(1)]).await.unwrap();
    drop(log);
    let log = reopen(dir.path());
    assert_eq!(log.verify(s).await.unwrap(), 1);
    let fresh = tempfile::tempdir().unwrap();
    drop(reopen(fresh.path()));
    assert_eq!(created_with(fresh.path()), Some((true, SEGMENT_BYTES)));
}

#[tokio::test]
async fn second_opener_is_told_who_holds_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _log = SledLog::open_as(dir.path(), "mneme run").unwrap();
    let note = format!("pid {}: mneme run", std::process::id());
    assert_eq!(
        std::fs::read_to_string(dir.path().join(HOLDER_FILE)).unwrap(),
        note,
        "the pid and what the holder is, nothing else"
    );
    // sled's lock is per process (flock on a separate open file description);
    // within one process the second open must also fail, naming the holder.
    let err = SledLog::open(dir.path())
        .err()
        .expect("second open must fail");
    let text = err.to_string();
    assert!(matches!(err, LogError::Locked { .. }), "{text}");
    assert!(text.contains(&note), "{text}");
}

#[tokio::test]
async fn a_directory_this_process_closed_opens_once_sled_lets_go_of_it() {
    let dir = tempfile::tempdir().unwrap();
    // sled still locked by this process, with no handle of the log open.
    let lingering = sled_config(dir.path()).open().unwrap();
    write_holder(dir.path(), "a handle just dropped");
    let released = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(lingering);
    });
    let log = SledLog::open(dir.path()).expect("waited for sled to let go");
    released.join().unwrap();
    // While a handle is open, a second open is refused at once.
    let started = std::time::Instant::now();
    assert!(matches!(
        SledLog::open(dir.path()),
        Err(LogError::Locked { .. })
    ));
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    drop(log);
}

#[tokio::test]
async fn the_directory_and_the_files_of_the_log_are_its_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let s = Uuid::now_v7();
    {
        let log = reopen(&dir);
        log.append(s, 1, vec![event(1)]).await.unwrap();
    } // checkpointed: the anchor is written
    assert_eq!(mode(&dir), 0o700);
    for file in [WAL_FILE, HOLDER_FILE, ANCHOR_FILE] {
        assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let log = reopen(&dir);
    assert_eq!(mode(&dir), 0o700, "a loose directory is tightened");
    assert_eq!(log.verify(s).await.unwrap(), 1);
}

#[tokio::test]
async fn records_sled_lost_are_replayed_from_the_write_ahead_file() {
    let s = Uuid::now_v7();
    let source = tempfile::tempdir().unwrap();
    let wal = {
        let log = reopen(source.path());
        log.append(s, 1, vec![event(1), event(2)]).await.unwrap();
        log.append(s, 3, vec![event(3)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        std::fs::read(source.path().join(WAL_FILE)).unwrap()
    };
    // A sled directory that never got the records, with the write-ahead
    // file that did: what a crash before sled's own flush leaves behind.
    let target = tempfile::tempdir().unwrap();
    drop(reopen(target.path()));
    std::fs::write(target.path().join(WAL_FILE), wal).unwrap();
    let log = reopen(target.path());
    assert_eq!(log.recovered(), 3);
    assert_eq!(log.verify(s).await.unwrap(), 3);
    assert_eq!(
        std::fs::metadata(target.path().join(WAL_FILE))
            .unwrap()
            .len(),
        crate::wal::FILE_HEADER as u64,
        "checkpointed: the header alone"
    );
    drop(log);
    let log = reopen(target.path());
    assert_eq!(log.recovered(), 0, "nothing left to replay");
    assert_eq!(log.read(s, 3, 3).await.unwrap()[0].envelope.kind, "K3");
}

#[tokio::test]
async fn a_data_directory_with_a_version_1_write_ahead_file_opens_and_moves_to_the_newest() {
    let s = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001);
    let dir = tempfile::tempdir().unwrap();
    drop(reopen(dir.path()));
    let path = dir.path().join(WAL_FILE);
    std::fs::write(&path, crate::wal::v1_file()).unwrap();
    let log = reopen(dir.path());
    assert_eq!(log.recovered(), 3);
    assert_eq!(log.verify(s).await.unwrap(), 3);
    let emptied = std::fs::read(&path).unwrap();
    assert_eq!(
        emptied.len(),
        crate::wal::FILE_HEADER,
        "checkpointed: a version 3 header alone"
    );
    assert_eq!(emptied[..8], *b"MWAL\x03\0\0\0");
    log.append(s, 4, vec![event(4)]).await.unwrap();
    log.barrier(Durability::Synced).await.unwrap();
    let wal = std::fs::read(&path).unwrap();
    drop(log);
    // The new record replays from the version 2 file into a sled that
    // lost it.
    let target = tempfile::tempdir().unwrap();
    drop(reopen(target.path()));
    std::fs::write(target.path().join(WAL_FILE), crate::wal::v1_file()).unwrap();
    drop(reopen(target.path()));
    std::fs::write(target.path().join(WAL_FILE), wal).unwrap();
    let log = reopen(target.path());
    assert_eq!(log.recovered(), 1);
    assert_eq!(log.read(s, 4, 4).await.unwrap()[0].envelope.kind, "K4");
    assert_eq!(log.verify(s).await.unwrap(), 4);
}

#[tokio::test]
async fn records_sled_loses_after_a_checkpoint_are_caught_by_the_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let s = Uuid::now_v7();
    {
        let log = reopen(dir.path());
        log.append(s, 1, vec![event(1), event(2), event(3)])
            .await
            .unwrap();
    } // checkpointed on close: the anchor says 1 session, 3 records
    {
        // sled recovers a shorter prefix: the last record and its head are
        // gone, and what is left is a valid, shorter chain.
        let log = reopen(dir.path());
        let mut meta = log.shared.load_meta(s).unwrap().unwrap();
        let second = log.read(s, 2, 2).await.unwrap().remove(0);
        meta.head_seq = 2;
        meta.head_hash = second.hash;
        log.rewrite_stored(s, 3, |_| None).unwrap();
        log.shared
            .db
            .insert(meta_key(s), encode_meta(&meta))
            .unwrap();
        log.shared.db.flush().unwrap();
        // Nothing went through the write-ahead file, so closing does not
        // checkpoint: the anchor keeps saying 3.
    }
    let err = SledLog::open(dir.path())
        .err()
        .expect("a shortened log must be refused");
    let text = err.to_string();
    assert!(matches!(err, LogError::LostRecords { .. }), "{text}");
    assert!(
        text.contains("3 records") && text.contains("now holds 1 and 2"),
        "{text}"
    );
}

#[tokio::test]
async fn a_head_reaches_sled_at_the_checkpoint_and_is_served_from_the_cache_before() {
    let dir = tempfile::tempdir().unwrap();
    let s = Uuid::now_v7();
    {
        let log = reopen(dir.path());
        log.append(s, 1, vec![event(1), event(2)]).await.unwrap();
        assert_eq!(
            log.shared.db.get(meta_key(s)).unwrap(),
            None,
            "one insert an append"
        );
        let listed = log.sessions().await.unwrap();
        assert_eq!((listed[0].session, listed[0].events), (s, 2));
        assert_eq!(log.head(s).await.unwrap().seq, 2);
    }
    // Closing checkpoints: the head is in sled, and the log opens with
    // nothing to replay.
    let log = reopen(dir.path());
    assert_eq!(log.recovered(), 0);
    assert!(log.shared.db.get(meta_key(s)).unwrap().is_some());
    assert_eq!(log.sessions().await.unwrap()[0].events, 2);
}

/// A session's head goes into sled only at checkpoints; a crash after
/// sled wrote a later record leaves the head behind it, and opening
/// moves it up from the write-ahead file.
#[tokio::test]
async fn a_head_that_lags_its_records_is_repaired_on_open() {
    let (dir, crashed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let s = Uuid::now_v7();
    {
        let log = reopen(dir.path());
        log.append(s, 1, vec![event(1)]).await.unwrap();
        log.writer.lock().await.checkpoint().unwrap();
        log.append(s, 2, vec![event(2)]).await.unwrap();
        // A checkpoint writes record 2 into a segment and its index entry
        // reaches sled's file; the head would next. The crash comes first.
        log.writer.lock().await.store_runs().unwrap();
        log.shared.db.flush().unwrap();
        copy_dir(dir.path(), crashed.path());
    }
    let log = reopen(crashed.path());
    assert_eq!(log.recovered(), 0, "a segment held the record already");
    assert_eq!(log.head(s).await.unwrap().seq, 2);
    assert_eq!(log.verify(s).await.unwrap(), 2);
    log.append(s, 3, vec![event(3)]).await.unwrap();
}

/// A fork made since the last checkpoint (its parent too, and a fork of
/// it), lost from sled's file with its meta by a crash, comes back from
/// the write-ahead file: its records, linked to its parent's, and its base.
#[tokio::test]
async fn a_fork_in_the_write_ahead_file_alone_is_recovered_with_its_base() {
    let (dir, crashed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (p, c, d) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let before = {
        let log = reopen(dir.path());
        log.append(p, 1, (1..=3).map(event).collect())
            .await
            .unwrap();
        log.fork(c, p, 2, vec![event(4)]).await.unwrap();
        log.fork(d, c, 3, vec![event(5), event(6)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        // sled's file holds none of it; the write-ahead file all of it.
        copy_dir(dir.path(), crashed.path());
        log.read(d, 1, u64::MAX).await.unwrap()
    };
    let log = reopen(crashed.path());
    assert_eq!(log.recovered(), 6);
    assert_eq!(
        log.base(d).await.unwrap(),
        Some(Base {
            parent: c,
            through: 3
        })
    );
    assert_eq!(log.read(d, 1, u64::MAX).await.unwrap(), before);
    assert_eq!(log.verify(d).await.unwrap(), 5);
    log.append(d, 6, vec![event(7)]).await.unwrap();
    drop(log);
    // The checkpoint counted what each stores, not what it shares.
    let log = reopen(crashed.path());
    assert_eq!(log.verify(c).await.unwrap(), 3);
    assert_eq!(log.head(d).await.unwrap().seq, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_synced_barriers_share_fdatasyncs() {
    const TASKS: usize = 8;
    const APPENDS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(reopen(dir.path()));
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(
        log.syncs(),
        0,
        "nothing appended since the open's checkpoint"
    );
    let start = Arc::new(tokio::sync::Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (log, start) = (log.clone(), start.clone());
            tokio::spawn(async move {
                let s = Uuid::now_v7();
                start.wait().await;
                for seq in 1..=APPENDS {
                    log.append(s, seq, vec![event(seq as u8)]).await.unwrap();
                    log.barrier(Durability::Synced).await.unwrap();
                }
                s
            })
        })
        .collect();
    for task in tasks {
        let s = task.await.unwrap();
        assert_eq!(log.verify(s).await.unwrap(), APPENDS);
    }
    let syncs = log.syncs();
    let barriers = TASKS as u64 * APPENDS;
    assert!(
        (1..barriers).contains(&syncs),
        "{syncs} fdatasyncs for {barriers} barriers"
    );
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(log.syncs(), syncs, "everything is covered already");
    log.append(Uuid::now_v7(), 1, vec![event(1)]).await.unwrap();
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(log.syncs(), syncs + 1);
}

#[tokio::test]
async fn an_append_dropped_before_it_returns_happened_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let log = reopen(dir.path());
    let s = Uuid::now_v7();
    log.append(s, 1, vec![event(1)]).await.unwrap();
    // While another holds the writer, an append waits for it; dropped
    // then, it never happened.
    let held = log.writer.lock().await;
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(20),
        log.append(s, 2, vec![event(2), event(3)]),
    )
    .await;
    assert!(waited.is_err(), "the append waited for the writer");
    drop(held);
    assert_eq!(log.head(s).await.unwrap().seq, 1, "nothing of it stored");
    // Once it has the writer it runs to its end without waiting again.
    log.append(s, 2, vec![event(2), event(3)]).await.unwrap();
    assert_eq!(log.verify(s).await.unwrap(), 3);
    drop(log);
    assert_eq!(reopen(dir.path()).verify(s).await.unwrap(), 3);
}

#[tokio::test]
async fn a_failed_sync_fails_its_waiters_and_a_checkpoint_covers_its_range() {
    let is_eio = |r: Result<(), LogError>| matches!(r, Err(LogError::Io { source, .. }) if source.raw_os_error() == Some(libc::EIO));
    let dir = tempfile::tempdir().unwrap();
    let log = reopen(dir.path());
    let s = Uuid::now_v7();
    log.append(s, 1, vec![event(1)]).await.unwrap();
    log.shared.fail_syncs.store(1, Ordering::Relaxed);
    // The barrier the failed sync answers hears of it; one enqueued at
    // the same moment is either in its batch (and hears of it too) or
    // in the next, which a checkpoint covers.
    let (a, b) = tokio::join!(
        log.barrier(Durability::Synced),
        log.barrier(Durability::Synced)
    );
    assert!(is_eio(a), "the first barrier's sync failed");
    assert!(b.is_ok() || is_eio(b));
    assert_eq!(log.syncs(), 1);
    // The pages may be gone: the next barrier checkpoints, not syncs.
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(log.syncs(), 1, "covered by a checkpoint");
    assert_eq!(
        std::fs::metadata(dir.path().join(WAL_FILE)).unwrap().len(),
        crate::wal::FILE_HEADER as u64,
        "checkpointed: the header alone"
    );
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(log.syncs(), 1, "already durable");
    log.append(s, 2, vec![event(2)]).await.unwrap();
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(log.syncs(), 2, "syncing again once covered");
    assert_eq!(log.verify(s).await.unwrap(), 2);
}

/// One session's barriers, one after another on a multi-thread runtime,
/// run their `fdatasync`s on their own threads once a streak of them met no
/// other; a failed one there is covered by a checkpoint as on the sync
/// thread, and what they made durable survives a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_barrier_syncs_on_its_own_thread_and_a_failed_one_is_covered() {
    let is_eio = |r: Result<(), LogError>| matches!(r, Err(LogError::Io { source, .. }) if source.raw_os_error() == Some(libc::EIO));
    let dir = tempfile::tempdir().unwrap();
    let log = reopen(dir.path());
    let s = Uuid::now_v7();
    let streak = u64::from(super::lone::LONE_STREAK);
    for seq in 1..=streak + 2 {
        log.append(s, seq, vec![event(seq as u8)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap();
    }
    assert_eq!(log.syncs(), streak + 2, "one fdatasync a barrier");
    assert_eq!(log.barriers.lone.load(Ordering::Relaxed), 2);
    log.append(s, streak + 3, vec![event(0)]).await.unwrap();
    log.shared.fail_syncs.store(1, Ordering::Relaxed);
    assert!(is_eio(log.barrier(Durability::Synced).await));
    assert_eq!(log.barriers.lone.load(Ordering::Relaxed), 3);
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(log.syncs(), streak + 3, "covered by a checkpoint");
    assert_eq!(
        std::fs::metadata(dir.path().join(WAL_FILE)).unwrap().len(),
        crate::wal::FILE_HEADER as u64,
        "checkpointed: the header alone"
    );
    log.append(s, streak + 4, vec![event(1)]).await.unwrap();
    log.barrier(Durability::Synced).await.unwrap();
    assert_eq!(log.syncs(), streak + 4, "syncing again once covered");
    drop(log);
    assert_eq!(reopen(dir.path()).verify(s).await.unwrap(), streak + 4);
}

/// Copies the files under `from` into `to` (a closed data directory).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.metadata().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A power cut kept a checkpoint's run of record 5 (never acknowledged)
/// and its index entry, and took its head and its write-ahead frame; the
/// session had no other frame, so its head stays 4 and record 5 sits in a
/// segment past it.
/// The session goes on: another record 5 is appended and acknowledged
/// by a synced barrier, then a crash before the next checkpoint. On
/// open the acknowledged frame replaces what sled held at its key.
#[tokio::test]
async fn a_frame_replaces_the_unacknowledged_record_sled_kept_at_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let s = Uuid::now_v7();
    {
        let log = reopen(dir.path());
        log.append(s, 1, vec![event(1), event(2), event(3), event(4)])
            .await
            .unwrap();
    } // checkpointed: head 4 in sled, anchor 4 records
    {
        // A run of an unacknowledged record 5 (the frame was lost).
        let log = reopen(dir.path());
        let four = log.read(s, 4, 4).await.unwrap().remove(0);
        let (_, orphan) = Record::seal(Envelope {
            session: s,
            seq: 5,
            event_id: Uuid::now_v7(),
            ts_ms: now_ms(),
            caused_by: None,
            schema: 1,
            kind: "ORPHAN".into(),
            prev_hash: four.hash,
            payload: b"never acknowledged".to_vec(),
            base: None,
        })
        .unwrap();
        log.put_run(s, 5, &[orphan.into()]).unwrap();
        log.shared.db.flush().unwrap();
    }
    let before = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), before.path());
    let wal = {
        let log = reopen(dir.path());
        assert_eq!(log.head(s).await.unwrap().seq, 4);
        log.append(s, 5, vec![event(5)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap(); // acknowledged
        std::fs::read(dir.path().join(WAL_FILE)).unwrap()
    };
    // The crash: sled's disk and the segments as before (record 5 was
    // pending), the write-ahead file holding the synced frame.
    std::fs::write(before.path().join(WAL_FILE), wal).unwrap();
    let log = reopen(before.path());
    let five = log.read(s, 5, 5).await.unwrap().remove(0);
    assert_eq!(
        five.envelope.kind, "K5",
        "the acknowledged record 5 is lost"
    );
}

/// After an fsync of sled's data file failed (EIO: the kernel may have
/// dropped the pages, and sled will not write them again), no later
/// checkpoint may trust its own fsync: the write-ahead file is never
/// emptied again, a barrier that needs a checkpoint fails, and appends
/// are refused, by name, until the log is opened again, which replays
/// the write-ahead file and has every record.
#[tokio::test]
async fn after_a_failed_fsync_of_sled_no_checkpoint_empties_the_write_ahead_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = reopen(dir.path());
    let s = Uuid::now_v7();
    log.append(s, 1, vec![event(1)]).await.unwrap();
    log.shared.fail_syncs.store(1, Ordering::Relaxed);
    assert!(
        log.barrier(Durability::Synced).await.is_err(),
        "wal sync failed"
    );
    log.shared.fail_data_syncs.store(1, Ordering::Relaxed);
    assert!(
        log.barrier(Durability::Synced).await.is_err(),
        "sled fsync failed"
    );
    let third = log.barrier(Durability::Synced).await;
    let wal = std::fs::metadata(dir.path().join(WAL_FILE)).unwrap().len();
    assert!(
        third.is_err(),
        "barrier Ok; write-ahead file emptied to {wal} bytes; record 1's bytes were \
         last fsynced by nothing that succeeded"
    );
    assert!(
        wal > crate::wal::FILE_HEADER as u64,
        "the write-ahead file keeps the record"
    );
    let refused = log.append(s, 2, vec![event(2)]).await.unwrap_err();
    assert!(
        std::error::Error::source(&refused)
            .is_some_and(|e| e.to_string().contains("open the log again")),
        "{refused}: {:?}",
        std::error::Error::source(&refused)
    );
    drop(log);
    assert_eq!(reopen(dir.path()).verify(s).await.unwrap(), 1);
}

/// The same when only sled's fsync failed: the next checkpoint, whose
/// own fsync succeeds, must not empty the write-ahead file either.
#[tokio::test]
async fn after_a_failed_fsync_of_sled_alone_the_next_checkpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = reopen(dir.path());
    let s = Uuid::now_v7();
    log.append(s, 1, vec![event(1)]).await.unwrap();
    log.shared.fail_data_syncs.store(1, Ordering::Relaxed);
    let failed = log.writer.lock().await.checkpoint();
    assert!(failed.is_err(), "the data file's fsync failed");
    assert!(
        log.writer.lock().await.checkpoint().is_err(),
        "a later one is refused"
    );
    let wal = std::fs::metadata(dir.path().join(WAL_FILE)).unwrap().len();
    assert!(
        wal > crate::wal::FILE_HEADER as u64,
        "the write-ahead file keeps the record"
    );
    log.barrier(Durability::Synced).await.unwrap();
    drop(log);
    assert_eq!(reopen(dir.path()).verify(s).await.unwrap(), 1);
}

/// The anchor is compared before the write-ahead file is replayed:
/// records appended since the checkpoint (another session's) must not
/// make up for checkpointed ones sled lost.
#[tokio::test]
async fn records_replayed_since_a_checkpoint_do_not_hide_what_sled_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    {
        let log = reopen(dir.path());
        log.append(a, 1, vec![event(1), event(2), event(3)])
            .await
            .unwrap();
    } // checkpointed: anchor 1 session, 3 records
    let crashed = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), crashed.path());
    let wal = {
        let log = reopen(dir.path());
        log.append(b, 1, vec![event(1)]).await.unwrap();
        log.barrier(Durability::Synced).await.unwrap();
        std::fs::read(dir.path().join(WAL_FILE)).unwrap()
    };
    {
        // sled lost the end of what the checkpoint synced: A's record 3
        // and the head that named it (as in the anchor test above).
        let log = reopen(crashed.path());
        let two = log.read(a, 2, 2).await.unwrap().remove(0);
        let mut meta = log.shared.load_meta(a).unwrap().unwrap();
        meta.head_seq = 2;
        meta.head_hash = two.hash;
        log.rewrite_stored(a, 3, |_| None).unwrap();
        log.shared
            .db
            .insert(meta_key(a), encode_meta(&meta))
            .unwrap();
        log.shared.db.flush().unwrap();
    }
    std::fs::write(crashed.path().join(WAL_FILE), wal).unwrap();
    let opened = SledLog::open(crashed.path());
    let verified = match &opened {
        Ok(log) => Some(log.verify(a).await.unwrap()),
        Err(_) => None,
    };
    assert!(
        matches!(opened, Err(LogError::LostRecords { .. })),
        "opened; session A verifies to {verified:?} records of the 3 acknowledged"
    );
}
