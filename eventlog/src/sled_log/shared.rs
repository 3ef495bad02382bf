//! What the handle, the writer and blocking reads share: the tree, the
//! heads, the write-ahead file's state, and the checkpoint.

use super::*;

/// What the handle, the writer and blocking reads share.
pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) db: sled::Db,
    /// sled's data file, for the `fdatasync` that sled's own flush omits.
    pub(super) data_file: File,
    /// Records replayed from the write-ahead file when the log was opened.
    pub(super) recovered: u64,
    /// A partial last write found in the write-ahead file on open.
    pub(super) torn_tail: Option<crate::TornTail>,
    /// Cached session metadata; only the writer inserts.
    pub(super) metas: Mutex<HashMap<Uuid, StoredMeta>>,
    /// Records appended since the last checkpoint, by session: the
    /// write-ahead file holds them, the next checkpoint writes them into a
    /// segment. Only the writer (and recovery) changes it.
    pub(super) pending: Mutex<HashMap<Uuid, Pending>>,
    /// The segment files checkpoints write records to.
    pub(super) segments: Segments,
    /// `fdatasync`s of the write-ahead file issued by synced barriers.
    pub(super) syncs: AtomicU64,
    /// The one process that holds the directory is the only writer.
    pub(super) leases: LocalLeases,
    /// Tests: the next this many syncs fail with EIO.
    #[cfg(test)]
    pub(super) fail_syncs: std::sync::atomic::AtomicU32,
    /// Tests: the next this many fsyncs of sled's data file fail with EIO.
    #[cfg(test)]
    pub(super) fail_data_syncs: std::sync::atomic::AtomicU32,
}

impl Shared {
    pub(super) fn writer_stopped(&self) -> LogError {
        LogError::Io {
            path: self.dir.display().to_string(),
            source: std::sync::Arc::new(std::io::Error::other("the log's writer thread stopped")),
        }
    }

    /// Takes back every write-ahead record not stored already, or stored
    /// otherwise (as pending, for the opener's checkpoint to write), and
    /// brings the head of each session concerned up to its last
    /// write-ahead record.
    ///
    /// A different record stored at a frame's seq is one a power cut kept
    /// while it took that record's own frame (never synced, so never
    /// acknowledged); the session went on without it, and the frame, written
    /// after it, is the record. Records stored past a session's last frame
    /// are such records too, and stay past its head.
    pub(super) fn recover(&self, frames: Vec<Frame>) -> Result<u64, LogError> {
        let mut recovered = 0;
        let mut last = std::collections::BTreeMap::new();
        let mut bases = HashMap::new();
        for (key, value) in frames {
            let (session, seq) = parse_seq_key(&key);
            let stored = self.stored_record(session, seq)?;
            let record = Record::open(session, seq, &value)?;
            if let Some(base) = record.envelope.base {
                bases.insert(session, base);
            }
            if stored.as_deref() == Some(&value[..]) {
                last.insert(session, record);
                continue;
            }
            let prev = match (seq, record.envelope.base) {
                (1, _) => Head::EMPTY,
                (_, Some(base)) => self.head_at(base.parent, base.through, &bases)?,
                _ => self.stored_head_at(session, seq - 1)?,
            };
            crate::check_link(session, &prev, &record)?;
            self.keep_pending(session, seq, vec![value.into()]);
            last.insert(session, record);
            recovered += 1;
        }
        for (session, record) in last {
            self.repair_meta(session, &record, bases.get(&session).copied())?;
        }
        Ok(recovered)
    }

    /// Keeps `records` as `session`'s pending records from seq `first` on,
    /// after its pending records before `first` (those at or after it go;
    /// all go if `first` does not follow them).
    pub(super) fn keep_pending(&self, session: Uuid, first: u64, records: Vec<sled::IVec>) {
        let mut pending = self.pending.lock().expect("pending lock poisoned");
        match pending.get_mut(&session) {
            Some(run) if (run.first..=run.end()).contains(&first) => run.put(first, records),
            _ => {
                pending.insert(session, Pending { first, records });
            }
        }
    }

    /// Record `seq` of `session` as a chain head, found where it is stored
    /// (in the session it shares it from, if it does; `recovered` knows the
    /// bases of sessions whose meta sled may not hold yet).
    fn head_at(
        &self,
        mut session: Uuid,
        seq: u64,
        recovered: &HashMap<Uuid, crate::Base>,
    ) -> Result<Head, LogError> {
        loop {
            let base = match recovered.get(&session) {
                Some(base) => Some(*base),
                None => self.load_meta(session)?.and_then(|m| m.base),
            };
            match base {
                Some(base) if seq <= base.through => session = base.parent,
                _ => return self.stored_head_at(session, seq),
            }
        }
    }

    /// The record at `seq` as a chain head; an error if it is missing.
    pub(super) fn stored_head_at(&self, session: Uuid, seq: u64) -> Result<Head, LogError> {
        let Some(bytes) = self.stored_record(session, seq)? else {
            return Err(LogError::Corrupt {
                session,
                seq,
                reason: "missing record: a later record survived a crash without it".into(),
            });
        };
        let record = Record::open(session, seq, &bytes)?;
        Ok(Head {
            seq,
            hash: record.hash,
        })
    }

    /// Moves the session's head in sled up to `last`, its last write-ahead
    /// record, unless it is there already (a checkpoint wrote it and the
    /// emptying of the write-ahead file did not follow).
    pub(super) fn repair_meta(
        &self,
        session: Uuid,
        last: &Record,
        base: Option<crate::Base>,
    ) -> Result<(), LogError> {
        let meta = self.load_meta(session)?;
        if meta
            .as_ref()
            .is_some_and(|m| m.head_seq >= last.envelope.seq)
        {
            return Ok(());
        }
        let mut meta = meta.unwrap_or_else(|| StoredMeta::new(last.envelope.ts_ms));
        meta.base = meta.base.or(base);
        meta.advance(last);
        self.db
            .insert(meta_key(session), encode_meta(&meta))
            .map_err(|e| self.storage(e))?;
        Ok(())
    }

    /// Sessions and the records they store (not those they share), from
    /// the session heads (one key per session).
    pub(super) fn count(&self) -> Result<Totals, LogError> {
        let metas = self.metas()?;
        Ok(Totals {
            sessions: metas.len() as u64,
            records: metas.iter().map(|(_, m)| m.own_records()).sum(),
        })
    }

    /// Refuses a directory whose sled holds fewer sessions or records than
    /// its last checkpoint recorded: sled lost synced data (a torn or
    /// truncated file it recovered a prefix of), and resuming from the rest
    /// would silently drop acknowledged events.
    pub(super) fn check_anchor(&self, now: Totals) -> Result<(), LogError> {
        let path = self.dir.join(ANCHOR_FILE);
        let Some(then) = Totals::load(&path).map_err(|source| LogError::Io {
            path: path.display().to_string(),
            source: std::sync::Arc::new(source),
        })?
        else {
            return Ok(());
        };
        if now.sessions < then.sessions || now.records < then.records {
            return Err(LogError::LostRecords {
                dir: self.dir.display().to_string(),
                expected: then,
                found: now,
            });
        }
        Ok(())
    }

    pub(super) fn keys(&self) -> crate::keys::KeyFiles {
        crate::keys::KeyFiles::new(&self.dir)
    }

    pub(super) fn key_io(&self, source: std::io::Error) -> LogError {
        LogError::Io {
            path: self.dir.join(crate::KEYS_DIR).display().to_string(),
            source: std::sync::Arc::new(source),
        }
    }

    pub(super) fn storage(&self, source: sled::Error) -> LogError {
        LogError::Storage {
            dir: self.dir.display().to_string(),
            source: std::sync::Arc::new(source),
        }
    }

    pub(super) fn load_meta(&self, session: Uuid) -> Result<Option<StoredMeta>, LogError> {
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

impl Shared {
    /// The range stops at the first record over the budget: its bytes are
    /// fetched, no later record's are, and none past the budget is decoded
    /// or hashed.
    pub(super) fn read_bounded(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        let from = from.max(1);
        if from > to {
            return Ok(Vec::new());
        }
        let stored = self.stored_range(session, from, to, Some(max_bytes))?;
        let long = to.saturating_sub(from) >= PARALLEL_OPEN_MIN;
        let records = scan_and_open(session, stored.into_iter().map(Ok), long)?;
        crate::check_run(session, from, &records)?;
        Ok(records)
    }

    /// Records `from..=to` of `session` with their stored bytes.
    pub(super) fn read_sealed(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
    ) -> Result<(Vec<Record>, Vec<Vec<u8>>), LogError> {
        let from = from.max(1);
        let (mut records, mut sealed) = (Vec::new(), Vec::new());
        if from > to {
            return Ok((records, sealed));
        }
        for (seq, bytes) in self.stored_range(session, from, to, None)? {
            records.push(Record::open(session, seq, &bytes)?);
            sealed.push(bytes.to_vec());
        }
        crate::check_run(session, from, &records)?;
        Ok((records, sealed))
    }

    /// Every session's head, ordered by session.
    pub(super) fn sessions(&self) -> Result<Vec<SessionMeta>, LogError> {
        let metas = self.metas()?.into_iter();
        Ok(metas.map(|(id, meta)| session_meta(id, meta)).collect())
    }

    /// Every session's meta, ordered by session: sled's, where the cache
    /// (appends since the last checkpoint) holds no newer one.
    pub(super) fn metas(&self) -> Result<Vec<(Uuid, StoredMeta)>, LogError> {
        let mut heads = self.stored_metas()?;
        let metas = self.metas.lock().expect("meta lock poisoned");
        for (id, head) in &mut heads {
            if let Some(meta) = metas.get(id) {
                *head = meta.clone();
            }
        }
        let known: HashSet<Uuid> = heads.iter().map(|(id, _)| *id).collect();
        let new = metas.iter().filter(|(id, _)| !known.contains(id));
        heads.extend(new.map(|(id, meta)| (*id, meta.clone())));
        heads.sort_by_key(|(id, _)| *id);
        Ok(heads)
    }

    /// Every session's meta as sled holds it.
    pub(super) fn stored_metas(&self) -> Result<Vec<(Uuid, StoredMeta)>, LogError> {
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
            out.push((session, meta));
        }
        Ok(out)
    }
}
