//! The writer (appends: the write-ahead file, then the pending records in
//! memory, on the caller's task) and the sync thread (every fdatasync and checkpoint,
//! group commit of synced barriers).

use super::*;

/// What callers ask of the sync thread.
pub(super) enum Request {
    /// A synced barrier: answered once everything appended before it was
    /// enqueued is on stable storage.
    Sync(oneshot::Sender<Result<(), LogError>>),
    /// The write-ahead file grew past [`CHECKPOINT_BYTES`]: empty it.
    Checkpoint,
}

/// The writer: the only owner of the write-ahead file.
///
/// Positions are values of `appended`. A failed sync fails every waiter of
/// its batch; after one, the kernel may have dropped the file's dirty pages,
/// so a later `fdatasync` proves nothing about them: until a checkpoint
/// (sled flush and fsync, from sled's copy in memory) covers the failed
/// range, syncs checkpoint instead.
pub(super) struct Writer {
    pub(super) shared: Arc<Shared>,
    pub(super) wal: Wal,
    /// Sessions and records in the log, kept for the checkpoint anchor.
    pub(super) totals: Totals,
    /// Bytes ever appended to the write-ahead file by appends that
    /// succeeded, since the log was opened. Never decreases (the file itself
    /// is emptied at checkpoints).
    pub(super) appended: u64,
    /// sled's blob files synced by a checkpoint already.
    pub(super) synced_blobs: HashSet<(std::ffi::OsString, u64)>,
    /// Everything up to this position is on stable storage.
    pub(super) durable: u64,
    /// A sync failed and no checkpoint has covered its range since.
    pub(super) suspect: bool,
    /// What failed when an fsync of sled's files did, if one has. The
    /// kernel may have dropped the pages it could not write, and sled will
    /// not write them again, so no later fsync proves them durable: the
    /// write-ahead file, which still holds every record since the last
    /// checkpoint, is never emptied again by this process, and appends are
    /// refused until the log is opened again (which replays it into sled).
    pub(super) sled_unsynced: Option<String>,
    /// Sessions whose head in sled lags the cached one: appended to since
    /// the last checkpoint, which writes their heads (until then the
    /// write-ahead file holds their records, and recovery repairs a head
    /// from the records).
    pub(super) stale_heads: HashSet<Uuid>,
    /// A checkpoint was asked of the sync thread and has not run yet.
    pub(super) checkpoint_asked: bool,
}

/// The sync thread: `fdatasync`s of the write-ahead file for synced
/// barriers, and checkpoints.
pub(super) struct Syncer {
    pub(super) writer: Arc<tokio::sync::Mutex<Writer>>,
    pub(super) shared: Arc<Shared>,
    /// The write-ahead file's descriptor, for the barriers' `fdatasync`.
    pub(super) wal_sync: File,
}

/// Tests: EIO while `failures` (then counted down) is above zero.
#[cfg(test)]
pub(super) fn injected_eio(failures: &std::sync::atomic::AtomicU32) -> std::io::Result<()> {
    match failures.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)) {
        Ok(_) => Err(std::io::Error::from_raw_os_error(libc::EIO)),
        Err(_) => Ok(()),
    }
}

impl Syncer {
    /// Serves requests until every handle is gone, then checkpoints.
    pub(super) fn run(self, queue: mpsc::Receiver<Request>) {
        while let Ok(first) = queue.recv() {
            let mut waiters = Vec::new();
            let mut checkpoint = false;
            for request in std::iter::once(first).chain(queue.try_iter()) {
                match request {
                    Request::Sync(reply) => waiters.push(reply),
                    Request::Checkpoint => checkpoint = true,
                }
            }
            if checkpoint {
                let mut writer = self.writer.blocking_lock();
                writer.checkpoint_asked = false;
                // A failed checkpoint is asked again by the next append;
                // the write-ahead file keeps the records meanwhile.
                let _ = writer.checkpoint();
            }
            if !waiters.is_empty() {
                let result = self.sync();
                for waiter in waiters {
                    let _ = waiter.send(result.as_ref().map(|_| ()).map_err(Clone::clone));
                }
            }
        }
        // A clean close checkpoints, so the next open has nothing to replay.
        // If it fails, the write-ahead file still holds every record.
        let _ = self.writer.blocking_lock().checkpoint();
    }

    /// Makes everything appended so far durable: one `fdatasync` of the
    /// write-ahead file (appends go on meanwhile), or a checkpoint while a
    /// failed sync's range is not covered yet; nothing if nothing was
    /// appended since.
    pub(super) fn sync(&self) -> Result<(), LogError> {
        let upto = {
            let mut writer = self.writer.blocking_lock();
            match writer.sync_target() {
                SyncTarget::Durable => return Ok(()),
                SyncTarget::Suspect => return writer.checkpoint(),
                SyncTarget::Upto(upto) => upto,
            }
        };
        let result = self.shared.sync_wal(&self.wal_sync);
        self.writer.blocking_lock().synced(upto, &result);
        result
    }
}

/// What a sync of the write-ahead file has to do.
pub(super) enum SyncTarget {
    /// Nothing: everything appended is durable.
    Durable,
    /// A failed sync's range is not covered yet: only a checkpoint makes
    /// it durable.
    Suspect,
    /// An `fdatasync` makes everything appended up to here durable.
    Upto(u64),
}

impl Shared {
    /// One `fdatasync` of the write-ahead file through `file`, counted.
    pub(super) fn sync_wal(&self, file: &File) -> Result<(), LogError> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        #[cfg(test)]
        let injected = injected_eio(&self.fail_syncs);
        #[cfg(not(test))]
        let injected = Ok(());
        injected
            .and_then(|()| file.sync_data())
            .map_err(|source| LogError::Io {
                path: self.dir.join(WAL_FILE).display().to_string(),
                source: std::sync::Arc::new(source),
            })
    }
}

impl Writer {
    /// Writes the pending records into a segment, indexes them in sled and
    /// makes sled durable, records the anchor, then empties the write-ahead
    /// file. Everything appended is then durable.
    pub(super) fn checkpoint(&mut self) -> Result<(), LogError> {
        self.checkpoint_files()?;
        self.durable = self.appended;
        self.suspect = false;
        Ok(())
    }

    pub(super) fn checkpoint_files(&mut self) -> Result<(), LogError> {
        if self.wal.is_empty() {
            return Ok(());
        }
        self.refuse_if_sled_unsynced()?;
        self.store_runs()?;
        self.store_heads()?;
        let shared = &self.shared;
        shared.db.flush().map_err(|e| shared.storage(e))?;
        let io = |path: PathBuf| {
            move |source| LogError::Io {
                path: path.display().to_string(),
                source: std::sync::Arc::new(source),
            }
        };
        let synced = self
            .sync_data_file()
            .map_err(io(shared.dir.join("db")))
            .and_then(|()| {
                sync_blobs(&shared.dir.join("blobs"), &mut self.synced_blobs)
                    .map_err(io(shared.dir.join("blobs")))
            });
        if let Err(error) = &synced {
            self.sled_unsynced = Some(error.to_string());
        }
        synced?;
        let shared = &self.shared;
        let anchor = shared.dir.join(ANCHOR_FILE);
        self.totals.store(&anchor).map_err(io(anchor))?;
        // Durable in a segment and indexed: the memory can go.
        shared
            .pending
            .lock()
            .expect("pending lock poisoned")
            .clear();
        crate::crash::point(crate::crash::LOG_CHECKPOINT_SYNCED);
        self.wal
            .truncate()
            .map_err(io(self.wal.path().to_path_buf()))
    }

    /// Writes every session's pending records into a segment (one write,
    /// synced), then indexes them in sled, after removing the session's
    /// index entries from the first of them on: runs a checkpoint wrote
    /// before a crash, of records past the head the session went on from.
    pub(super) fn store_runs(&mut self) -> Result<(), LogError> {
        let shared = &self.shared;
        let pending: Vec<(Uuid, Pending)> = {
            let pending = shared.pending.lock().expect("pending lock poisoned");
            pending.iter().map(|(id, run)| (*id, run.clone())).collect()
        };
        let runs: Vec<(Uuid, u64, &[sled::IVec])> = pending
            .iter()
            .flat_map(|(id, run)| {
                run.runs()
                    .into_iter()
                    .map(|(first, records)| (*id, first, records))
            })
            .collect();
        if runs.is_empty() {
            return Ok(());
        }
        let placed = shared
            .segments
            .append(&runs)
            .map_err(|source| LogError::Io {
                path: shared.segments.dir().display().to_string(),
                source: std::sync::Arc::new(source),
            })?;
        crate::crash::point(crate::crash::LOG_SEGMENT_SYNCED);
        for (session, run) in &pending {
            let stale = shared
                .db
                .range(run_key(*session, run.first)..=run_key(*session, u64::MAX));
            for item in stale {
                let (key, _) = item.map_err(|e| shared.storage(e))?;
                shared.db.remove(key).map_err(|e| shared.storage(e))?;
            }
        }
        for ((session, first, _), entry) in runs.iter().zip(placed) {
            (shared
                .db
                .insert(run_key(*session, *first), &entry.encode()[..]))
            .map_err(|e| shared.storage(e))?;
        }
        Ok(())
    }

    /// Writes into sled the cached head of every session appended to
    /// since the last checkpoint.
    pub(super) fn store_heads(&mut self) -> Result<(), LogError> {
        let shared = &self.shared;
        let heads: Vec<(Uuid, Vec<u8>)> = {
            let metas = shared.metas.lock().expect("meta lock poisoned");
            (self.stale_heads.iter())
                .filter_map(|id| metas.get(id).map(|meta| (*id, encode_meta(meta))))
                .collect()
        };
        for (session, meta) in heads {
            (shared.db.insert(meta_key(session), meta)).map_err(|e| shared.storage(e))?;
        }
        self.stale_heads.clear();
        Ok(())
    }

    /// The session's meta, from the cache or from sled.
    pub(super) fn meta_of(&self, session: Uuid) -> Result<Option<StoredMeta>, LogError> {
        let cached = self
            .shared
            .metas
            .lock()
            .expect("meta lock poisoned")
            .get(&session)
            .cloned();
        match cached {
            Some(meta) => Ok(Some(meta)),
            None => self.shared.load_meta(session),
        }
    }

    pub(super) fn append(
        &mut self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.refuse_if_sled_unsynced()?;
        let meta = self.meta_of(session)?;
        let head_seq = meta.as_ref().map_or(0, |m| m.head_seq);
        if expected_seq != head_seq + 1 {
            return Err(LogError::Conflict {
                session,
                expected: expected_seq,
                actual: head_seq + 1,
            });
        }
        let now = now_ms();
        let mut meta = meta.unwrap_or_else(|| StoredMeta::new(now));
        let head = Head {
            seq: meta.head_seq,
            hash: meta.head_hash,
        };
        let (records, sealed) = crate::seal_after(session, head, events, now)?;
        for record in &records {
            meta.advance(record);
        }
        self.store(session, meta, &records, sealed)?;
        Ok(records)
    }

    /// Starts `session`, which must have no records, sharing `base` (whose
    /// record at `base.through` is `base_head`), with `events`.
    pub(super) fn fork_after(
        &mut self,
        session: Uuid,
        base: crate::Base,
        base_head: Head,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.refuse_if_sled_unsynced()?;
        if let Some(meta) = self.meta_of(session)? {
            return Err(LogError::Conflict {
                session,
                expected: base.through + 1,
                actual: meta.head_seq + 1,
            });
        }
        let now = now_ms();
        let (records, sealed) = crate::seal_after_base(session, base, base_head, events, now)?;
        let mut meta = StoredMeta::new(now);
        for record in &records {
            meta.advance(record);
        }
        self.store(session, meta, &records, sealed)?;
        Ok(records)
    }

    pub(super) fn import(
        &mut self,
        session: Uuid,
        start: Head,
        sealed: Vec<Vec<u8>>,
    ) -> Result<Head, LogError> {
        self.refuse_if_sled_unsynced()?;
        let meta = self.meta_of(session)?;
        let head = meta.as_ref().map_or(start, |m| Head {
            seq: m.head_seq,
            hash: m.head_hash,
        });
        if head != start {
            return Err(LogError::Conflict {
                session,
                expected: start.seq + 1,
                actual: head.seq + 1,
            });
        }
        let records = crate::open_sealed(session, head, meta.is_none(), &sealed)?;
        let Some(first) = records.first() else {
            return Ok(head);
        };
        let mut meta = meta.unwrap_or_else(|| StoredMeta::new(first.envelope.ts_ms));
        for record in &records {
            meta.advance(record);
        }
        let head = Head {
            seq: meta.head_seq,
            hash: meta.head_hash,
        };
        self.store(session, meta, &records, sealed)?;
        Ok(head)
    }

    /// Stores checked, sealed records that follow the session's head: first
    /// in the write-ahead file, then as pending records (which reads see
    /// and the next checkpoint writes into a segment); `meta` is the head
    /// after them.
    pub(super) fn store(
        &mut self,
        session: Uuid,
        meta: StoredMeta,
        records: &[Record],
        sealed: Vec<Vec<u8>>,
    ) -> Result<(), LogError> {
        let new_session =
            (records.first()).is_some_and(|r| r.envelope.seq == 1 || r.envelope.base.is_some());
        let frames: Vec<Frame> = records
            .iter()
            .zip(sealed)
            .map(|(r, bytes)| (event_key(session, r.envelope.seq).to_vec(), bytes))
            .collect();
        let appended = self.wal.append(&frames).map_err(|source| LogError::Io {
            path: self.wal.path().display().to_string(),
            source: std::sync::Arc::new(source),
        })?;
        crate::crash::point(crate::crash::LOG_WAL_WRITTEN);
        // The session's head goes into sled at the next checkpoint; until
        // then it is served from the cache, and recovery repairs it from
        // the records the write-ahead file holds.
        if let Some(first) = records.first() {
            let sealed = frames.into_iter().map(|(_, bytes)| bytes.into()).collect();
            self.shared
                .keep_pending(session, first.envelope.seq, sealed);
        }
        self.stale_heads.insert(session);
        self.appended += appended.bytes;
        self.totals.records += records.len() as u64;
        self.totals.sessions += u64::from(new_session);
        self.shared
            .metas
            .lock()
            .expect("meta lock poisoned")
            .insert(session, meta);
        Ok(())
    }

    /// The error of a log whose sled failed an fsync (see
    /// [`Writer::sled_unsynced`]), if it did.
    pub(super) fn refuse_if_sled_unsynced(&self) -> Result<(), LogError> {
        match &self.sled_unsynced {
            None => Ok(()),
            Some(failed) => Err(LogError::Io {
                path: self.shared.dir.display().to_string(),
                source: std::sync::Arc::new(std::io::Error::other(format!(
                    "an fsync of sled's files failed earlier ({failed}); after a failed fsync \
                     no later one proves those pages durable, so this process takes no more \
                     appends and keeps the write-ahead file; open the log again (restart \
                     mneme) to replay it into sled"
                ))),
            }),
        }
    }

    /// `fdatasync` of sled's data file.
    pub(super) fn sync_data_file(&self) -> std::io::Result<()> {
        #[cfg(test)]
        injected_eio(&self.shared.fail_data_syncs)?;
        self.shared.data_file.sync_data()
    }

    /// Whether everything appended is durable already.
    pub(super) fn all_durable(&self) -> bool {
        self.durable >= self.appended
    }

    /// What a sync has to do now.
    pub(super) fn sync_target(&self) -> SyncTarget {
        if self.all_durable() {
            SyncTarget::Durable
        } else if self.suspect {
            SyncTarget::Suspect
        } else {
            SyncTarget::Upto(self.appended)
        }
    }

    /// Notes how a sync that set out to reach `upto` ended: after a failed
    /// one, only a checkpoint proves the range durable.
    pub(super) fn synced(&mut self, upto: u64, result: &Result<(), LogError>) {
        match result {
            Ok(()) => self.durable = self.durable.max(upto),
            Err(_) => self.suspect = true,
        }
    }

    /// Whether the write-ahead file is due to be emptied and no checkpoint
    /// was asked for yet (once this answers yes, it is asked for).
    pub(super) fn checkpoint_due(&mut self) -> bool {
        let due = self.wal.len() > CHECKPOINT_BYTES && !self.checkpoint_asked;
        self.checkpoint_asked |= due;
        due
    }
}
