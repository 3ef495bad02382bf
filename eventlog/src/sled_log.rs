//! The sled backend of [`EventLog`].
//!
//! One sled tree holds two kinds of keys:
//! - `e ‖ session (16 bytes) ‖ seq (u64 big-endian)` → a stored record;
//! - `s ‖ session` → the session's [`StoredMeta`] (head and timestamps).
//!
//! A record and its session's meta are written in one atomic sled batch, so
//! the head never disagrees with the records after a crash.

use crate::{
    now_ms, Durability, Envelope, EventLog, Hash, Head, LogError, NewEvent, Record, SessionMeta,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use uuid::Uuid;

const EVENT_PREFIX: u8 = b'e';
const META_PREFIX: u8 = b's';
const HOLDER_FILE: &str = "mneme.holder";

/// An [`EventLog`] in a sled database in one directory.
///
/// Only one process can hold a directory; a second gets [`LogError::Locked`]
/// naming the holder.
pub struct SledLog {
    dir: PathBuf,
    db: sled::Db,
    /// sled's data file, for the `fdatasync` that sled's own flush omits.
    data_file: File,
    /// Cached session metadata; the lock also serializes appends.
    metas: Mutex<HashMap<Uuid, StoredMeta>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredMeta {
    head_seq: u64,
    head_hash: Hash,
    created_ms: i64,
    updated_ms: i64,
    last_kind: String,
}

impl SledLog {
    /// Opens (creating if needed) the log in `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<SledLog, LogError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|source| LogError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let db = sled::Config::new()
            .path(&dir)
            .open()
            .map_err(|source| open_error(&dir, source))?;
        let data_path = dir.join("db");
        let data_file = File::open(&data_path).map_err(|source| LogError::Io {
            path: data_path.display().to_string(),
            source,
        })?;
        write_holder(&dir);
        Ok(SledLog {
            dir,
            db,
            data_file,
            metas: Mutex::new(HashMap::new()),
        })
    }

    /// The directory this log lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn storage(&self, source: sled::Error) -> LogError {
        LogError::Storage {
            dir: self.dir.display().to_string(),
            source,
        }
    }

    fn load_meta(&self, session: Uuid) -> Result<Option<StoredMeta>, LogError> {
        let Some(bytes) = self
            .db
            .get(meta_key(session))
            .map_err(|e| self.storage(e))?
        else {
            return Ok(None);
        };
        rmp_serde::from_slice(&bytes)
            .map(Some)
            .map_err(|e| LogError::Corrupt {
                session,
                seq: 0,
                reason: format!("session metadata does not decode: {e}"),
            })
    }
}

fn open_error(dir: &Path, source: sled::Error) -> LogError {
    let text = source.to_string();
    let locked = match &source {
        sled::Error::Io(e) => e.kind() == std::io::ErrorKind::WouldBlock || text.contains("lock"),
        _ => false,
    };
    if locked {
        let holder = std::fs::read_to_string(dir.join(HOLDER_FILE))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "holder unknown".into());
        return LogError::Locked {
            dir: dir.display().to_string(),
            holder,
        };
    }
    let dir = dir.display().to_string();
    match source {
        sled::Error::Corruption { .. } => LogError::CorruptStore { dir, source },
        source => LogError::Storage { dir, source },
    }
}

/// Leaves a note naming this process, for the error a second opener gets.
/// Best effort: the note is advice, the lock is sled's.
fn write_holder(dir: &Path) {
    let command: Vec<String> = std::env::args().collect();
    let note = format!("pid {}: {}", std::process::id(), command.join(" "));
    let _ = std::fs::write(dir.join(HOLDER_FILE), note);
}

fn event_key(session: Uuid, seq: u64) -> [u8; 25] {
    let mut key = [0u8; 25];
    key[0] = EVENT_PREFIX;
    key[1..17].copy_from_slice(session.as_bytes());
    key[17..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn meta_key(session: Uuid) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[0] = META_PREFIX;
    key[1..].copy_from_slice(session.as_bytes());
    key
}

fn encode_meta(meta: &StoredMeta) -> Vec<u8> {
    rmp_serde::to_vec_named(meta).expect("session metadata always encodes")
}

impl EventLog for SledLog {
    fn append(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        let mut metas = self.metas.lock().expect("log lock poisoned");
        let cached = metas.get(&session).cloned();
        let meta = match cached {
            Some(meta) => Some(meta),
            None => self.load_meta(session)?,
        };
        let head_seq = meta.as_ref().map_or(0, |m| m.head_seq);
        if expected_seq != head_seq + 1 {
            return Err(LogError::Conflict {
                session,
                expected: expected_seq,
                actual: head_seq + 1,
            });
        }
        let now = now_ms();
        let mut meta = meta.unwrap_or(StoredMeta {
            head_seq: 0,
            head_hash: Hash::ZERO,
            created_ms: now,
            updated_ms: now,
            last_kind: String::new(),
        });
        let mut batch = sled::Batch::default();
        let mut records = Vec::with_capacity(events.len());
        for event in events {
            let envelope = Envelope {
                session,
                seq: meta.head_seq + 1,
                event_id: Uuid::now_v7(),
                ts_ms: now,
                caused_by: event.caused_by,
                schema: event.schema,
                kind: event.kind,
                prev_hash: meta.head_hash,
                payload: event.payload,
            };
            let (record, bytes) = Record::seal(envelope)?;
            batch.insert(&event_key(session, record.envelope.seq), bytes);
            meta.head_seq = record.envelope.seq;
            meta.head_hash = record.hash;
            meta.last_kind.clone_from(&record.envelope.kind);
            records.push(record);
        }
        meta.updated_ms = now;
        batch.insert(&meta_key(session), encode_meta(&meta));
        self.db.apply_batch(batch).map_err(|e| self.storage(e))?;
        metas.insert(session, meta);
        Ok(records)
    }

    fn read(&self, session: Uuid, from: u64, to: u64) -> Result<Vec<Record>, LogError> {
        let from = from.max(1);
        if from > to {
            return Ok(Vec::new());
        }
        let mut records: Vec<Record> = Vec::new();
        for item in self
            .db
            .range(event_key(session, from)..=event_key(session, to))
        {
            let (key, value) = item.map_err(|e| self.storage(e))?;
            let seq = u64::from_be_bytes(key[17..25].try_into().expect("event key is 25 bytes"));
            let record = Record::open(session, seq, &value)?;
            if let Some(prev) = records.last() {
                let prev = Head {
                    seq: prev.envelope.seq,
                    hash: prev.hash,
                };
                crate::check_link(session, &prev, &record)?;
            }
            records.push(record);
        }
        Ok(records)
    }

    fn head(&self, session: Uuid) -> Result<Head, LogError> {
        if let Some(meta) = self.metas.lock().expect("log lock poisoned").get(&session) {
            return Ok(Head {
                seq: meta.head_seq,
                hash: meta.head_hash,
            });
        }
        Ok(self.load_meta(session)?.map_or(Head::EMPTY, |m| Head {
            seq: m.head_seq,
            hash: m.head_hash,
        }))
    }

    fn sessions(&self) -> Result<Vec<SessionMeta>, LogError> {
        let mut out = Vec::new();
        for item in self.db.scan_prefix([META_PREFIX]) {
            let (key, value) = item.map_err(|e| self.storage(e))?;
            let session = Uuid::from_slice(&key[1..]).map_err(|e| LogError::Corrupt {
                session: Uuid::nil(),
                seq: 0,
                reason: format!("bad session key: {e}"),
            })?;
            let meta: StoredMeta =
                rmp_serde::from_slice(&value).map_err(|e| LogError::Corrupt {
                    session,
                    seq: 0,
                    reason: format!("session metadata does not decode: {e}"),
                })?;
            out.push(SessionMeta {
                session,
                events: meta.head_seq,
                created_ms: meta.created_ms,
                updated_ms: meta.updated_ms,
                last_kind: meta.last_kind,
            });
        }
        Ok(out)
    }

    fn barrier(&self, durability: Durability) -> Result<(), LogError> {
        if durability == Durability::Buffered {
            return Ok(());
        }
        self.db.flush().map_err(|e| self.storage(e))?;
        if durability == Durability::Synced {
            self.data_file.sync_data().map_err(|source| LogError::Io {
                path: self.dir.join("db").display().to_string(),
                source,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(n: u8) -> NewEvent {
        NewEvent {
            kind: format!("K{n}"),
            schema: 1,
            caused_by: None,
            payload: vec![n; n as usize],
        }
    }

    #[test]
    fn appends_are_gapless_and_read_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = SledLog::open(dir.path()).unwrap();
        let s = Uuid::now_v7();
        log.append(s, 1, vec![event(1), event(2)]).unwrap();
        log.append(s, 3, vec![event(3)]).unwrap();
        let records = log.read(s, 1, u64::MAX).unwrap();
        let seqs: Vec<u64> = records.iter().map(|r| r.envelope.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert_eq!(records[2].envelope.payload, vec![3, 3, 3]);
        assert_eq!(log.verify(s).unwrap(), 3);
    }

    #[test]
    fn stale_writer_gets_conflict_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = SledLog::open(dir.path()).unwrap();
        let s = Uuid::now_v7();
        log.append(s, 1, vec![event(1)]).unwrap();
        let err = log.append(s, 1, vec![event(9)]).unwrap_err();
        assert!(matches!(
            err,
            LogError::Conflict {
                expected: 1,
                actual: 2,
                ..
            }
        ));
        let err = log.append(s, 3, vec![event(9)]).unwrap_err();
        assert!(matches!(err, LogError::Conflict { actual: 2, .. }));
        assert_eq!(log.read(s, 1, 10).unwrap().len(), 1);
        assert_eq!(log.read(s, 1, 1).unwrap()[0].envelope.kind, "K1");
    }

    #[test]
    fn racing_threads_never_leave_gaps_or_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let log = std::sync::Arc::new(SledLog::open(dir.path()).unwrap());
        let s = Uuid::now_v7();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut won = 0;
                    for _ in 0..200 {
                        let next = log.head(s).unwrap().seq + 1;
                        if log.append(s, next, vec![event(1)]).is_ok() {
                            won += 1;
                        }
                    }
                    won
                })
            })
            .collect();
        let won: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(log.verify(s).unwrap(), won);
    }

    #[test]
    fn survives_reopen_with_heads_intact() {
        let dir = tempfile::tempdir().unwrap();
        let s = Uuid::now_v7();
        {
            let log = SledLog::open(dir.path()).unwrap();
            log.append(s, 1, vec![event(1), event(2)]).unwrap();
            log.barrier(Durability::Synced).unwrap();
        }
        let log = SledLog::open(dir.path()).unwrap();
        assert_eq!(log.head(s).unwrap().seq, 2);
        log.append(s, 3, vec![event(3)]).unwrap();
        assert_eq!(log.verify(s).unwrap(), 3);
        let sessions = log.sessions().unwrap();
        assert_eq!(sessions.len(), 1);
        assert_eq!(sessions[0].events, 3);
        assert_eq!(sessions[0].last_kind, "K3");
    }

    #[test]
    fn second_opener_is_told_who_holds_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let _log = SledLog::open(dir.path()).unwrap();
        // sled's lock is per process (flock on a separate open file description);
        // within one process the second open must also fail, naming the holder.
        let err = SledLog::open(dir.path())
            .err()
            .expect("second open must fail");
        let text = err.to_string();
        assert!(matches!(err, LogError::Locked { .. }), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
    }

    #[test]
    fn tampered_record_is_refused_by_read_and_verify() {
        let dir = tempfile::tempdir().unwrap();
        let log = SledLog::open(dir.path()).unwrap();
        let s = Uuid::now_v7();
        log.append(s, 1, vec![event(1), event(2), event(3)])
            .unwrap();
        let key = event_key(s, 2);
        let mut bytes = log.db.get(key).unwrap().unwrap().to_vec();
        let n = bytes.len();
        bytes[n - 40] ^= 1;
        log.db.insert(key, bytes).unwrap();
        let err = log.read(s, 1, 3).unwrap_err();
        assert!(matches!(err, LogError::Corrupt { seq: 2, .. }), "{err}");
        let err = log.verify(s).unwrap_err();
        assert!(err.to_string().contains("seq 2"), "{err}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any interleaving of good and stale appends leaves a gapless,
        /// verifiable chain holding exactly the accepted events.
        #[test]
        fn log_holds_exactly_the_accepted_appends(
            ops in proptest::collection::vec((0u64..3, 1usize..4), 1..30)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let log = SledLog::open(dir.path()).unwrap();
            let s = Uuid::now_v7();
            let mut accepted = Vec::new();
            for (i, (skew, count)) in ops.into_iter().enumerate() {
                let head = log.head(s).unwrap().seq;
                let expected = head + 1 + skew;
                let events: Vec<NewEvent> = (0..count).map(|_| event(i as u8)).collect();
                match log.append(s, expected, events) {
                    Ok(records) => {
                        prop_assert_eq!(skew, 0);
                        accepted.extend(records.into_iter().map(|r| r.envelope.kind));
                    }
                    Err(LogError::Conflict { .. }) => prop_assert!(skew != 0),
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            prop_assert_eq!(log.verify(s).unwrap(), accepted.len() as u64);
            let kinds: Vec<String> = log.read(s, 1, u64::MAX).unwrap()
                .into_iter().map(|r| r.envelope.kind).collect();
            prop_assert_eq!(kinds, accepted);
        }
    }
}
