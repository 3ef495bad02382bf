//! Where a session's records are, and reading them from there: appended
//! since the last checkpoint (pending, in memory; the write-ahead file
//! holds them), in runs of segment files (what checkpoints wrote), or under
//! a key of their own in sled (what builds before segment files wrote, read
//! in place, never rewritten).
//!
//! Each place is newer than the one before it, and a newer one wins where
//! two hold the same seq: sled's own keys hold a session's records below
//! its first run; a run's records stop below the next run's first seq;
//! pending records override everything from their first seq on. Records
//! past a head a crash left behind (never acknowledged) are thus never
//! read once the session has gone on past them.

use super::*;

/// Stored records of one session: (seq, sealed bytes), in seq order.
pub(super) type Found = Vec<(u64, sled::IVec)>;

/// A budget of bytes for a read: the read stops at the first record over
/// it (the first record is always read).
struct Budget {
    left: Option<usize>,
    spent_any: bool,
}

impl Budget {
    /// Whether a record of `len` bytes fits, spending it if so.
    fn take(&mut self, len: usize) -> bool {
        let fits = match self.left {
            None => true,
            Some(left) => !self.spent_any || len <= left,
        };
        if fits {
            self.left = self.left.map(|left| left.saturating_sub(len));
            self.spent_any = true;
        }
        fits
    }
}

impl Shared {
    /// Records `from..=to` of `session` as stored (each from the newest
    /// place that holds it), stopping at the first record past `max_bytes`
    /// if given. Pending records are looked at first: a checkpoint moving
    /// them into a run meanwhile shows them in both, never in neither.
    pub(super) fn stored_range(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        max_bytes: Option<usize>,
    ) -> Result<Found, LogError> {
        let (pending_first, pending) = self.pending_range(session, from, to);
        let mut budget = Budget {
            left: max_bytes,
            spent_any: false,
        };
        let mut found = Found::new();
        let before_pending = to.min(pending_first.saturating_sub(1));
        if from <= before_pending
            && self.read_before_pending(session, from, before_pending, &mut budget, &mut found)?
        {
            return Ok(found);
        }
        for (seq, bytes) in pending {
            if !budget.take(bytes.len()) {
                break;
            }
            found.push((seq, bytes));
        }
        Ok(found)
    }

    /// The first seq `session` has pending (`u64::MAX` if none) and its
    /// pending records in `from..=to`.
    fn pending_range(&self, session: Uuid, from: u64, to: u64) -> (u64, Found) {
        let pending = self.pending.lock().expect("pending lock poisoned");
        let Some(run) = pending.get(&session) else {
            return (u64::MAX, Found::new());
        };
        let records = (from.max(run.first)..=to.min(run.end().saturating_sub(1)))
            .map(|seq| (seq, run.records[(seq - run.first) as usize].clone()))
            .collect();
        (run.first, records)
    }

    /// Reads `from..=to` from sled's keys and the runs into `found`;
    /// whether the budget ran out.
    fn read_before_pending(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        budget: &mut Budget,
        found: &mut Found,
    ) -> Result<bool, LogError> {
        let runs = self.runs_over(session, from, to)?;
        // Records under keys of their own are older than every run.
        let own_keys_to = match runs.first() {
            Some((first, _)) if *first <= from => None,
            Some((first, _)) => Some(first - 1),
            None => Some(to),
        };
        if let Some(own_to) = own_keys_to {
            for item in self
                .db
                .range(event_key(session, from)..=event_key(session, own_to))
            {
                let (key, value) = item.map_err(|e| self.storage(e))?;
                if !budget.take(value.len()) {
                    return Ok(true);
                }
                found.push((parse_seq_key(&key).1, value));
            }
        }
        for (i, (first, entry)) in runs.iter().enumerate() {
            let next = runs.get(i + 1).map_or(u64::MAX, |(next, _)| *next);
            let last = entry.last.min(next.saturating_sub(1)).min(to);
            let records = self.run_records(session, *first, entry)?;
            for seq in from.max(*first)..=last {
                let Some(bytes) = records.get((seq - first) as usize) else {
                    break;
                };
                if !budget.take(bytes.len()) {
                    return Ok(true);
                }
                found.push((seq, bytes.clone()));
            }
        }
        Ok(false)
    }

    /// The session's runs that may hold seqs `from..=to`: the last one
    /// starting at or before `from`, and every one starting after it up
    /// to `to`, in order.
    pub(super) fn runs_over(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, RunEntry)>, LogError> {
        let holding_from = self
            .db
            .range(run_key(session, 0)..=run_key(session, from))
            .next_back();
        let after = (to > from).then(|| {
            self.db
                .range(run_key(session, from + 1)..=run_key(session, to))
        });
        let mut runs = Vec::new();
        for item in holding_from.into_iter().chain(after.into_iter().flatten()) {
            let (key, value) = item.map_err(|e| self.storage(e))?;
            let first = parse_seq_key(&key).1;
            let entry = RunEntry::decode(&value, first).map_err(|reason| LogError::Corrupt {
                session,
                seq: first,
                reason,
            })?;
            runs.push((first, entry));
        }
        Ok(runs)
    }

    /// The records of the run of `session` starting at `first`.
    pub(super) fn run_records(
        &self,
        session: Uuid,
        first: u64,
        entry: &RunEntry,
    ) -> Result<Vec<sled::IVec>, LogError> {
        let frame = self.segments.read(entry).map_err(|source| LogError::Io {
            path: self.segments.dir().display().to_string(),
            source: Arc::new(source),
        })?;
        let records = decompress(&frame, entry).map_err(|reason| LogError::Corrupt {
            session,
            seq: first,
            reason: format!(
                "segment {} at byte {}: {reason}",
                entry.segment, entry.offset
            ),
        })?;
        if records.len() as u64 != entry.records(first) {
            return Err(LogError::Corrupt {
                session,
                seq: first,
                reason: format!(
                    "run holds {} records, its index entry says {}",
                    records.len(),
                    entry.records(first)
                ),
            });
        }
        Ok(records)
    }

    /// The stored bytes of record `seq`, if any place holds it.
    pub(super) fn stored_record(
        &self,
        session: Uuid,
        seq: u64,
    ) -> Result<Option<sled::IVec>, LogError> {
        let found = self.stored_range(session, seq, seq, None)?;
        Ok(found.into_iter().next().map(|(_, bytes)| bytes))
    }
}

/// For fault tests (the builds with crash points): damage to stored
/// records, as someone with access to the files could do it.
#[cfg(any(test, feature = "crash-points"))]
impl SledLog {
    /// Changes checkpointed record `seq` of `session` to what `change`
    /// makes of its bytes, or removes it (`None`): its run is written again
    /// with the change (or cut in two around it) and indexed there, and
    /// sled is flushed. A record under a key of its own is changed in
    /// place.
    #[doc(hidden)]
    pub fn rewrite_stored(
        &self,
        session: Uuid,
        seq: u64,
        change: impl FnOnce(Vec<u8>) -> Option<Vec<u8>>,
    ) -> Result<(), LogError> {
        let shared = &self.shared;
        let storage = |e| shared.storage(e);
        match shared.runs_over(session, seq, seq)?.first() {
            Some((first, entry)) if entry.last >= seq => {
                let mut records = shared.run_records(session, *first, entry)?;
                let at = (seq - first) as usize;
                let mut after = records.split_off(at + 1);
                let old = records.pop().expect("the record is in its run").to_vec();
                match change(old) {
                    Some(new) => {
                        records.push(new.into());
                        records.append(&mut after);
                    }
                    None => self.put_run(session, seq + 1, &after)?,
                }
                match records.is_empty() {
                    true => shared
                        .db
                        .remove(run_key(session, *first))
                        .map(drop)
                        .map_err(storage)?,
                    false => self.put_run(session, *first, &records)?,
                }
            }
            _ => {
                let key = event_key(session, seq);
                let old = shared.db.get(key).map_err(storage)?;
                let old = old.ok_or_else(|| LogError::Corrupt {
                    session,
                    seq,
                    reason: "no stored record to rewrite".into(),
                })?;
                match change(old.to_vec()) {
                    Some(new) => shared.db.insert(key, new).map(drop),
                    None => shared.db.remove(key).map(drop),
                }
                .map_err(storage)?;
            }
        }
        shared.db.flush().map(drop).map_err(storage)
    }

    /// Every value sled holds (named by its key, in hex) and every run's
    /// records decompressed (named by the run's key): the bytes at rest,
    /// for tests that search them.
    #[doc(hidden)]
    pub fn every_stored_value(&self) -> Result<Vec<(String, Vec<u8>)>, LogError> {
        let shared = &self.shared;
        let mut found = Vec::new();
        for item in shared.db.iter() {
            let (key, value) = item.map_err(|e| shared.storage(e))?;
            let name = hex::encode(&key);
            if key.first() == Some(&RUN_PREFIX) {
                let (session, first) = parse_seq_key(&key);
                let entry = RunEntry::decode(&value, first).expect("a run's index entry");
                let records = shared.run_records(session, first, &entry)?;
                found.push((format!("run {name}"), records.concat()));
            }
            found.push((format!("sled value {name}"), value.to_vec()));
        }
        Ok(found)
    }

    /// Writes `records` as a run of `session` from seq `first` into a
    /// segment and indexes it there (nothing if there are none).
    #[doc(hidden)]
    pub fn put_run(
        &self,
        session: Uuid,
        first: u64,
        records: &[sled::IVec],
    ) -> Result<(), LogError> {
        if records.is_empty() {
            return Ok(());
        }
        let shared = &self.shared;
        let placed = shared
            .segments
            .append(&[(session, first, records)])
            .map_err(|source| LogError::Io {
                path: shared.segments.dir().display().to_string(),
                source: Arc::new(source),
            })?;
        shared
            .db
            .insert(run_key(session, first), &placed[0].encode()[..])
            .map(drop)
            .map_err(|e| shared.storage(e))
    }
}
