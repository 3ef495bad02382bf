//! Export and import of logs as JSON lines, between any two stores (the
//! way from sled to PostgreSQL, and back).
//!
//! Each line is one record: its envelope's fields for people and tools to
//! read, and `sealed`, the record's exact stored bytes in hex, which are
//! what an import trusts. The import checks every record's hash and its link
//! to the one before, and refuses a line whose readable fields disagree with
//! its sealed bytes, naming the line. Records the target already holds,
//! identical, are skipped, so an interrupted import can simply run again.
//! The chain proves a file's records belong together, not who wrote them:
//! records past the head of a session the target held before the import
//! are refused unless asked for ([`Policy::append`]), and then listed.
//!
//! A session encrypted at rest ([`crate::privacy`]) exports as it is
//! stored: records with encrypted fields, and a line with its key as the
//! store keeps it (wrapped by the master key) before its records. So the
//! target reads it with the same master key, and erasing it there works.
//! An erased session has no key left: it exports as its shape.
//!
//! A fork that shares its parent's records exports them as its parent
//! stores them (lines of the parent's session, with the parent's key
//! line), then its own: an import stores them as the parent's (or finds
//! them held) and the fork's after them. One export writes each record
//! once, whichever of a parent and its forks comes first.

use eventlog::{EventLog, LogError, Record};
use replay::Event;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use uuid::Uuid;

/// Records read or written per call to the log.
const BATCH: u64 = 4096;
/// Sealed bytes a run holds before it is stored.
const BATCH_BYTES: usize = 64 << 20;
/// The longest line an import reads: a record of the largest size, in hex,
/// with its readable fields.
const MAX_LINE_BYTES: usize = 2 * eventlog::MAX_RECORD_BYTES + (64 << 10);

/// One exported record.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Line {
    /// The session.
    pub session: Uuid,
    /// Its place in the session.
    pub seq: u64,
    /// The event's id.
    pub event_id: Uuid,
    /// When it was appended, ms since the Unix epoch.
    pub ts_ms: i64,
    /// The event kind.
    pub kind: String,
    /// The event's schema version.
    pub schema: u16,
    /// The seq it answers, if any.
    pub caused_by: Option<u64>,
    /// Hash of the record before it (hex).
    pub prev_hash: String,
    /// This record's chain hash (hex).
    pub hash: String,
    /// The stored bytes (hex): format byte, envelope, hash.
    pub sealed: String,
}

/// One exported session key, wrapped by the store's master key.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeyLine {
    /// The session.
    pub session: Uuid,
    /// Its key as the store keeps it (hex).
    pub wrapped_key: String,
}

/// Everything that can go wrong in a transfer, naming where.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The log refused or failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A line of the input is not an exported record.
    #[error("line {line}: {reason}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// Reading the input or writing the output failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes every record of `sessions` as JSON lines; returns how many.
pub async fn export(
    log: &dyn EventLog,
    sessions: &[Uuid],
    out: &mut (dyn Write + Send),
) -> Result<u64, TransferError> {
    let mut written = 0;
    let mut keyed = std::collections::HashSet::new();
    // The last seq written of each session: a parent's records shared by
    // a fork exported before it (or by several forks) are written once.
    let mut through = std::collections::HashMap::<Uuid, u64>::new();
    for &session in sessions {
        write_key(log, session, &mut keyed, out).await?;
        let head = log.head(session).await?.seq;
        let mut from = 1;
        while from <= head {
            let to = head.min(from + BATCH - 1);
            let (records, sealed) = log.read_sealed(session, from, to).await?;
            for (record, bytes) in records.iter().zip(sealed) {
                let (owner, seq) = (record.envelope.session, record.envelope.seq);
                let done = through.entry(owner).or_default();
                if seq <= *done {
                    continue;
                }
                *done = seq;
                // A fork's first records are its parent's, under its key.
                write_key(log, owner, &mut keyed, out).await?;
                serde_json::to_writer(&mut *out, &line_of(record, &bytes))
                    .map_err(std::io::Error::from)?;
                out.write_all(b"\n")?;
                written += 1;
            }
            from = to + 1;
        }
    }
    out.flush()?;
    Ok(written)
}

/// The key line of `session`, once an export (if it has a key), before its
/// first record.
async fn write_key(
    log: &dyn EventLog,
    session: Uuid,
    keyed: &mut std::collections::HashSet<Uuid>,
    out: &mut (dyn Write + Send),
) -> Result<(), TransferError> {
    if !keyed.insert(session) {
        return Ok(());
    }
    let Some(wrapped) = log.side_store().get_key(session).await? else {
        return Ok(());
    };
    // A tenant's session: its key is wrapped by the tenant's, which goes
    // first (once), so the target reads it with the master key.
    let slot = crate::privacy::tenant_slot_of(&wrapped).filter(|s| keyed.insert(*s));
    if let Some(slot) = slot {
        if let Some(tenant_key) = log.side_store().get_key(slot).await? {
            write_key_line(slot, &tenant_key, out)?;
        }
    }
    write_key_line(session, &wrapped, out)
}

/// One key line: `session`'s key as the store keeps it.
fn write_key_line(
    session: Uuid,
    wrapped: &[u8],
    out: &mut (dyn Write + Send),
) -> Result<(), TransferError> {
    let line = KeyLine {
        session,
        wrapped_key: hex::encode(wrapped),
    };
    serde_json::to_writer(&mut *out, &line).map_err(std::io::Error::from)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// The export line of `record`, whose stored bytes are `sealed`.
fn line_of(record: &Record, sealed: &[u8]) -> Line {
    let e = &record.envelope;
    Line {
        session: e.session,
        seq: e.seq,
        event_id: e.event_id,
        ts_ms: e.ts_ms,
        kind: e.kind.clone(),
        schema: e.schema,
        caused_by: e.caused_by,
        prev_hash: e.prev_hash.to_hex(),
        hash: record.hash.to_hex(),
        sealed: hex::encode(sealed),
    }
}

/// What an import stored.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// Sessions written to or found complete, in the order first seen.
    pub sessions: Vec<Uuid>,
    /// Sessions this import stored records of (new, or added to).
    pub changed: Vec<Uuid>,
    /// Records stored.
    pub records: u64,
    /// Records skipped because the store already held them, identical.
    pub already_held: u64,
    /// Records added to sessions the store held before the import: the
    /// session and the seqs, first and last (only with [`Policy::append`]).
    pub appended: Vec<(Uuid, u64, u64)>,
}

/// The derived data that marks a session an import created and has not
/// finished: a run of the import again may go on with it, and nothing
/// resumes it meanwhile (see [`importing`]).
const IMPORTING: &str = "importing";

/// Whether an import created `session` and did not finish it (it stopped,
/// or the process died): nothing may run it until an import finishes it.
pub async fn importing(log: &dyn EventLog, session: Uuid) -> Result<bool, LogError> {
    let marker = log.side_store().get_derived(session, IMPORTING).await?;
    Ok(marker.is_some_and(|m| !m.is_empty()))
}

/// How the pause that keeps an imported session at rest begins.
pub(crate) const IMPORTED: &str = "imported";

/// Whether a pause's `reason` is the one an import records.
pub(crate) fn at_rest_after_import(reason: &str) -> bool {
    reason.starts_with(IMPORTED)
}

/// What an import may do besides creating sessions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Policy {
    /// Add records past the head of a session the store already holds
    /// (else such records are refused, naming the session and the seqs).
    pub append: bool,
}

/// A checked line waiting to be stored.
struct Pending {
    /// The line it came from.
    line: usize,
    seq: u64,
    hash: eventlog::Hash,
    sealed: Vec<u8>,
}

/// Reads JSON lines written by [`export`] into `log`, each session's
/// records after its head there, checking every hash and link; records the
/// store already holds must be identical and are skipped. Stops at the
/// first bad line; what came before it is stored and verified.
pub async fn import(
    log: &dyn EventLog,
    input: &mut (dyn BufRead + Send),
    policy: Policy,
) -> Result<Imported, TransferError> {
    let mut imported = Imported::default();
    let mut target = Target {
        log,
        policy,
        held_before: std::collections::HashMap::new(),
    };
    let mut batch: Vec<Pending> = Vec::new();
    let mut current: Option<Run> = None;
    let mut bytes = Vec::new();
    for line_no in 1.. {
        let text = match read_line(input, &mut bytes, line_no) {
            Ok(Some(text)) => text,
            Ok(None) => break,
            Err(e) => {
                target.flush(current, &mut batch, &mut imported).await?;
                return Err(e);
            }
        };
        if text.trim().is_empty() {
            continue;
        }
        if let Ok(key) = serde_json::from_str::<KeyLine>(text) {
            let wrapped = hex::decode(&key.wrapped_key).map_err(|_| TransferError::BadLine {
                line: line_no,
                reason: "`wrapped_key` is not hex".into(),
            })?;
            // A session this store holds without a key was written in the
            // clear or erased (its key destroyed): a key from a file would
            // make it look encrypted, or bring the erased content back.
            if log.head(key.session).await?.seq > 0
                && log.side_store().get_key(key.session).await?.is_none()
            {
                return Err(TransferError::BadLine {
                    line: line_no,
                    reason: format!(
                        "session {}: this store holds it without a key (written in the clear, \
                         or erased), and an import does not give it one",
                        key.session
                    ),
                });
            }
            if log.side_store().put_key(key.session, &wrapped).await? != wrapped {
                return Err(TransferError::BadLine {
                    line: line_no,
                    reason: format!(
                        "session {}: this store keeps another key for it",
                        key.session
                    ),
                });
            }
            continue;
        }
        let (session, pending) = match parse_line(line_no, text) {
            Ok(parsed) => parsed,
            Err(e) => {
                target.flush(current, &mut batch, &mut imported).await?;
                return Err(e);
            }
        };
        let held: usize = batch.iter().map(|p| p.sealed.len()).sum();
        if current.is_some_and(|run| run.session != session)
            || batch.len() as u64 >= BATCH
            || held >= BATCH_BYTES
        {
            target.flush(current, &mut batch, &mut imported).await?;
        }
        if batch.is_empty() {
            current = Some(Run {
                session,
                line: line_no,
                seq: pending.seq,
            });
        }
        batch.push(pending);
    }
    target.flush(current, &mut batch, &mut imported).await?;
    // Durable before the marks go: a crash now leaves them marked.
    log.barrier(eventlog::Durability::Synced).await?;
    for session in target.held_before.keys() {
        log.side_store()
            .put_derived(*session, IMPORTING, b"")
            .await?;
    }
    Ok(imported)
}

/// The next line of `input` (without its newline) in `bytes`, `None` at
/// the end; a line longer than [`MAX_LINE_BYTES`], one that is not UTF-8,
/// or a read that fails is refused with its line number.
fn read_line<'a>(
    input: &mut (dyn BufRead + Send),
    bytes: &'a mut Vec<u8>,
    line: usize,
) -> Result<Option<&'a str>, TransferError> {
    let bad = |reason: String| TransferError::BadLine { line, reason };
    bytes.clear();
    let limit = (MAX_LINE_BYTES + 1) as u64;
    let read = std::io::Read::take(&mut *input, limit).read_until(b'\n', bytes);
    match read.map_err(|e| bad(format!("cannot be read: {e}")))? {
        0 => return Ok(None),
        n if n > MAX_LINE_BYTES => {
            return Err(bad(format!(
                "longer than {MAX_LINE_BYTES} bytes, which no exported record is"
            )))
        }
        _ => {}
    }
    if bytes.ends_with(b"\n") {
        bytes.pop();
    }
    std::str::from_utf8(bytes)
        .map(Some)
        .map_err(|e| bad(format!("not UTF-8: {e}")))
}

/// Where a run of consecutive lines of one session starts.
#[derive(Clone, Copy)]
struct Run {
    session: Uuid,
    /// Its first line's number.
    line: usize,
    /// Its first record's seq.
    seq: u64,
}

/// The store an import writes to, and what it knew before the import.
struct Target<'a> {
    log: &'a dyn EventLog,
    policy: Policy,
    /// Each session's head when the import first met it.
    held_before: std::collections::HashMap<Uuid, u64>,
}

impl Target<'_> {
    /// Stores one session's run of lines, after skipping those the store
    /// already holds (each must be identical to the held record); records
    /// past the head of a session held before the import only as the
    /// policy allows.
    async fn flush(
        &mut self,
        current: Option<Run>,
        batch: &mut Vec<Pending>,
        imported: &mut Imported,
    ) -> Result<(), TransferError> {
        let Some(run) = current else {
            return Ok(());
        };
        if batch.is_empty() {
            return Ok(());
        }
        let (log, session) = (self.log, run.session);
        // The line of the record at `seq`'s place in the run (its own seq
        // may be another: that is what was wrong with it).
        let lines: Vec<usize> = batch.iter().map(|p| p.line).collect();
        let line_of = |seq: u64| {
            let at = usize::try_from(seq.saturating_sub(run.seq)).unwrap_or(usize::MAX);
            lines.get(at).copied().unwrap_or(run.line)
        };
        let head = log.head(session).await?.seq;
        let before = match self.held_before.get(&session) {
            Some(before) => *before,
            None => {
                // A session an earlier run of an import created and did
                // not finish is its to go on with; a new one is marked so.
                let before = match importing(log, session).await? {
                    true => 0,
                    false => head,
                };
                if before == 0 {
                    log.side_store()
                        .put_derived(session, IMPORTING, b"1")
                        .await?;
                }
                self.held_before.insert(session, before);
                before
            }
        };
        let held = batch.iter().take_while(|p| p.seq <= head).count();
        if held > 0 {
            let stored = log.read(session, run.seq, batch[held - 1].seq).await?;
            for (i, pending) in batch[..held].iter().enumerate() {
                let same = stored
                    .get(i)
                    .is_some_and(|r| r.envelope.seq == pending.seq && r.hash == pending.hash);
                if !same {
                    return Err(TransferError::BadLine {
                        line: line_of(pending.seq),
                        reason: format!(
                            "session {session} seq {}: differs from the record this store already holds",
                            pending.seq
                        ),
                    });
                }
            }
        }
        let added = (batch.get(held).map(|p| p.seq), batch.last().map(|p| p.seq));
        if let (true, (Some(first), Some(last))) = (before > 0, added) {
            if !self.policy.append {
                return Err(TransferError::BadLine {
                    line: line_of(first),
                    reason: format!(
                        "session {session}: this store holds it up to seq {head}, and the file adds seq {first}–{last}; \
                         an import does not add to a session it holds (anyone can extend a chain): \
                         `mneme import --append` adds them, naming each session it adds to"
                    ),
                });
            }
            if let Some(reason) = unvouched_append(log, session, head, &batch[held..]).await? {
                return Err(TransferError::BadLine {
                    line: line_of(first),
                    reason,
                });
            }
            match imported.appended.iter_mut().find(|(s, ..)| *s == session) {
                Some((_, _, to)) => *to = last,
                None => imported.appended.push((session, first, last)),
            }
        }
        let fresh: Vec<Vec<u8>> = batch.drain(..).skip(held).map(|p| p.sealed).collect();
        let count = fresh.len() as u64;
        if !fresh.is_empty() {
            log.import(session, fresh).await.map_err(|e| match e {
                LogError::Corrupt { seq, reason, .. } => TransferError::BadLine {
                    line: line_of(seq),
                    reason: format!("session {session} seq {seq}: {reason}"),
                },
                other => other.into(),
            })?;
            if !imported.changed.contains(&session) {
                imported.changed.push(session);
            }
        }
        if !imported.sessions.contains(&session) {
            imported.sessions.push(session);
        }
        imported.records += count;
        imported.already_held += held as u64;
        Ok(())
    }
}

/// Why records `appended` to `session` (held up to `head`) may not be
/// added, if its held history carries signed heads: each appended record
/// must be covered by a head signed with the key that signed them (anyone
/// can compute a chain; only the key's holder can vouch for one), checked
/// within this run of the file's lines.
async fn unvouched_append(
    log: &dyn EventLog,
    session: Uuid,
    head: u64,
    appended: &[Pending],
) -> Result<Option<String>, TransferError> {
    let held = log.read(session, 1, head).await?;
    let as_checked = |record: &Record| {
        // A record sealed at rest does not decode here (a head never is
        // sealed): it counts as content, which is what it is.
        let content = || Event::UserMessage {
            text: String::new(),
        };
        let event = crate::session::decode(record).unwrap_or_else(|_| content());
        (record.envelope.seq, record.hash.to_hex(), event)
    };
    let mut records: Vec<(u64, String, Event)> = held.iter().map(as_checked).collect();
    let key = records.iter().rev().find_map(|(_, _, event)| match event {
        Event::HeadSigned { key, .. } => Some(key.clone()),
        _ => None,
    });
    let Some(key) = key else {
        return Ok(None); // nothing signed: nothing to keep vouched for
    };
    for pending in appended {
        let record =
            Record::open(session, pending.seq, &pending.sealed).map_err(|e| LogError::Corrupt {
                session,
                seq: pending.seq,
                reason: e.to_string(),
            })?;
        records.push(as_checked(&record));
    }
    let refused = |why: String| {
        Some(format!(
            "session {session}: the file appends seq {}–{} to a history whose heads are signed by key {key}, \
             and {why}: an appended history must be vouched for by that key",
            appended[0].seq,
            appended[appended.len() - 1].seq
        ))
    };
    let signer = crate::signing::HeadKey::parse(&key).map_err(|e| LogError::Corrupt {
        session,
        seq: head,
        reason: e.to_string(),
    })?;
    Ok(match signer.check(session, &records) {
        Err(why) => refused(why),
        Ok(vouched) => match vouched.unvouched {
            Some((from, to)) if to >= appended[0].seq => refused(format!(
                "seq {from}–{to} are not covered by a head it signed"
            )),
            _ => None,
        },
    })
}

/// The session and sealed bytes of one line, after checking that its
/// readable fields say what the sealed bytes say.
fn parse_line(line: usize, text: &str) -> Result<(Uuid, Pending), TransferError> {
    let bad = |reason: String| TransferError::BadLine { line, reason };
    let parsed: Line =
        serde_json::from_str(text).map_err(|e| bad(format!("not an exported record: {e}")))?;
    let sealed = hex::decode(&parsed.sealed)
        .ok()
        .ok_or_else(|| bad("`sealed` is not hex".into()))?;
    let record = Record::open(parsed.session, parsed.seq, &sealed)
        .map_err(|e| bad(format!("the sealed record does not open: {e}")))?;
    let e = &record.envelope;
    let agrees = record.hash.to_hex() == parsed.hash
        && e.prev_hash.to_hex() == parsed.prev_hash
        && e.kind == parsed.kind
        && e.event_id == parsed.event_id
        && e.ts_ms == parsed.ts_ms
        && e.schema == parsed.schema
        && e.caused_by == parsed.caused_by;
    if !agrees {
        return Err(bad(format!(
            "session {} seq {}: the readable fields disagree with the sealed record",
            parsed.session, parsed.seq
        )));
    }
    let pending = Pending {
        line,
        seq: parsed.seq,
        hash: record.hash,
        sealed,
    };
    Ok((parsed.session, pending))
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventlog::{NewEvent, SledLog};

    async fn log_with(sessions: &[(Uuid, u8)]) -> (tempfile::TempDir, SledLog) {
        let dir = tempfile::tempdir().unwrap();
        let log = SledLog::open(dir.path()).unwrap();
        for &(id, n) in sessions {
            let events = (0..n)
                .map(|i| NewEvent {
                    kind: format!("K{i}"),
                    schema: 1,
                    caused_by: None,
                    payload: vec![i; 3],
                })
                .collect();
            log.append(id, 1, events).await.unwrap();
        }
        (dir, log)
    }

    async fn exported(log: &dyn EventLog, ids: &[Uuid]) -> String {
        let mut out = Vec::new();
        export(log, ids, &mut out).await.unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn an_export_imports_into_another_store_record_for_record() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let (_dir, source) = log_with(&[(a, 3), (b, 2)]).await;
        let text = exported(&source, &[a, b]).await;
        assert_eq!(text.lines().count(), 5);
        let (_dir2, target) = log_with(&[]).await;
        let done = import(&target, &mut text.as_bytes(), Policy::default())
            .await
            .unwrap();
        assert_eq!(
            done,
            Imported {
                sessions: vec![a, b],
                changed: vec![a, b],
                records: 5,
                already_held: 0,
                appended: Vec::new(),
            }
        );
        for id in [a, b] {
            assert_eq!(
                target.read(id, 1, 10).await.unwrap(),
                source.read(id, 1, 10).await.unwrap()
            );
        }
        assert_eq!(exported(&target, &[a, b]).await, text);
    }

    #[tokio::test]
    async fn a_parent_and_its_forks_export_each_record_once_in_any_order() {
        let parent = Uuid::now_v7();
        let (_dir, source) = log_with(&[(parent, 4)]).await;
        let forks = [Uuid::now_v7(), Uuid::now_v7()];
        for fork in forks {
            let own = vec![user_message("own")];
            source.fork(fork, parent, 3, own).await.unwrap();
        }
        for order in [[parent, forks[0], forks[1]], [forks[1], parent, forks[0]]] {
            let text = exported(&source, &order).await;
            assert_eq!(text.lines().count(), 4 + 2, "{order:?}: {text}");
            let (_dir2, target) = log_with(&[]).await;
            import(&target, &mut text.as_bytes(), Policy::default())
                .await
                .unwrap();
            for id in [parent, forks[0], forks[1]] {
                assert_eq!(
                    target.read(id, 1, 10).await.unwrap(),
                    source.read(id, 1, 10).await.unwrap(),
                    "{order:?}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_line_that_lies_or_breaks_the_chain_is_named() {
        let a = Uuid::now_v7();
        let (_dir, source) = log_with(&[(a, 3)]).await;
        let text = exported(&source, &[a]).await;
        let lines: Vec<&str> = text.lines().collect();
        let cases = [
            (format!("{}\n{}\n", lines[0], lines[2]), "line 2", "seq 2"),
            (
                text.replacen("\"kind\":\"K1\"", "\"kind\":\"K9\"", 1),
                "line 2",
                "disagree",
            ),
            (
                format!("{}\nnot json\n", lines[0]),
                "line 2",
                "not an exported record",
            ),
        ];
        for (input, line, what) in cases {
            let (_dir2, target) = log_with(&[]).await;
            let err = import(&target, &mut input.as_bytes(), Policy::default())
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains(line) && err.contains(what), "{err}");
        }
    }

    #[tokio::test]
    async fn an_interrupted_import_runs_again_skipping_what_is_held() {
        let a = Uuid::now_v7();
        let (_dir, source) = log_with(&[(a, 3)]).await;
        let text = exported(&source, &[a]).await;
        let (_dir2, target) = log_with(&[]).await;
        let first_two: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
        // A run that stops after two lines, as a killed process does.
        let mut partial = Target {
            log: &target,
            policy: Policy::default(),
            held_before: Default::default(),
        };
        let mut pending: Vec<Pending> = (first_two.lines().enumerate())
            .map(|(i, line)| parse_line(i + 1, line).unwrap().1)
            .collect();
        let run = Run {
            session: a,
            line: 1,
            seq: 1,
        };
        partial
            .flush(Some(run), &mut pending, &mut Imported::default())
            .await
            .unwrap();
        assert!(
            importing(&target, a).await.unwrap(),
            "marked while unfinished"
        );
        let done = import(&target, &mut text.as_bytes(), Policy::default())
            .await
            .unwrap();
        assert_eq!((done.records, done.already_held), (1, 2));
        assert_eq!(
            target.read(a, 1, 3).await.unwrap(),
            source.read(a, 1, 3).await.unwrap()
        );
        assert!(!importing(&target, a).await.unwrap(), "finished");
        let again = import(&target, &mut text.as_bytes(), Policy::default())
            .await
            .unwrap();
        assert_eq!((again.records, again.already_held), (0, 3));

        // A held seq whose record differs is refused, naming its line.
        let (_dir3, other) = log_with(&[(a, 3)]).await;
        let err = import(&other, &mut text.as_bytes(), Policy::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1") && err.contains("differs"), "{err}");
    }

    #[tokio::test]
    async fn records_past_a_held_sessions_head_are_refused_unless_appended() {
        let a = Uuid::now_v7();
        let (_dir, source) = log_with(&[(a, 4)]).await;
        let text = exported(&source, &[a]).await;
        let first_two: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
        let (_dir2, target) = log_with(&[]).await;
        import(&target, &mut first_two.as_bytes(), Policy::default())
            .await
            .unwrap();
        // Held up to seq 2 and finished: the file's seq 3–4 would extend it.
        let err = import(&target, &mut text.as_bytes(), Policy::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 3") && err.contains("holds it up to seq 2"),
            "{err}"
        );
        assert!(
            err.contains("adds seq 3–4") && err.contains("--append"),
            "{err}"
        );
        assert_eq!(target.head(a).await.unwrap().seq, 2, "nothing was added");
        let append = Policy { append: true };
        let done = import(&target, &mut text.as_bytes(), append).await.unwrap();
        assert_eq!(done.appended, vec![(a, 3, 4)]);
        assert_eq!(target.head(a).await.unwrap(), source.head(a).await.unwrap());
    }

    use crate::privacy::{MasterKey, SealedLog};
    use std::sync::Arc;

    fn user_message(text: &str) -> NewEvent {
        let e = replay::Event::UserMessage { text: text.into() };
        NewEvent {
            kind: e.kind().into(),
            schema: replay::EVENT_SCHEMA,
            caused_by: None,
            payload: e.encode(),
        }
    }

    /// An export taken before an erasure, imported back into the same
    /// store, must not put the destroyed key back (the erased content
    /// would read again).
    #[tokio::test]
    async fn an_old_export_does_not_revive_an_erased_session() {
        let dir = tempfile::tempdir().unwrap();
        let keydir = tempfile::tempdir().unwrap();
        let raw: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path()).unwrap());
        let master = || MasterKey::load(&keydir.path().join("m.key"), None).unwrap();
        MasterKey::generate(&keydir.path().join("m.key")).unwrap();
        let log = SealedLog::new(raw.clone(), Some(master()));
        let id = Uuid::now_v7();
        log.append(id, 1, vec![user_message("SECRET-TEXT")])
            .await
            .unwrap();
        let old_export = exported(raw.as_ref(), &[id]).await;
        // erase: record, then destroy the key (as Service::erase does)
        log.side_store().destroy_key(id).await.unwrap();
        assert_eq!(raw.side_store().get_key(id).await.unwrap(), None);

        let result = import(raw.as_ref(), &mut old_export.as_bytes(), Policy::default()).await;
        let fresh = SealedLog::new(raw.clone(), Some(master()));
        let text =
            String::from_utf8_lossy(&fresh.read(id, 1, 1).await.unwrap()[0].envelope.payload)
                .to_string();
        assert!(
            result.is_err() && !text.contains("SECRET-TEXT"),
            "import: {result:?}; key back: {}; content reads: {text:?}",
            raw.side_store().get_key(id).await.unwrap().is_some()
        );
    }

    /// A key line for a session this store keeps without a key (written
    /// in the clear) is refused: installed, `erase` would go through while
    /// the content stayed in the clear.
    #[tokio::test]
    async fn a_key_line_cannot_give_a_key_to_a_session_written_in_the_clear() {
        let a = Uuid::now_v7();
        let (_dir, target) = log_with(&[(a, 2)]).await;
        let line = format!("{{\"session\":\"{a}\",\"wrapped_key\":\"01\"}}\n");
        let result = import(&target, &mut line.as_bytes(), Policy::default()).await;
        assert!(
            result.is_err() && target.side_store().get_key(a).await.unwrap().is_none(),
            "import: {result:?}; key now kept: {:?}",
            target.side_store().get_key(a).await.unwrap()
        );
    }

    /// A line is read up to the longest an exported record can be, not
    /// whole however long it is.
    #[tokio::test]
    async fn one_huge_line_is_not_read_whole() {
        struct Endless {
            left: usize,
            read: Arc<std::sync::atomic::AtomicUsize>,
        }
        impl std::io::Read for Endless {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(self.left);
                buf[..n].fill(b'a');
                self.left -= n;
                self.read.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                Ok(n)
            }
        }
        let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut input = std::io::BufReader::new(Endless {
            left: 256 << 20,
            read: read.clone(),
        });
        let (_dir, target) = log_with(&[]).await;
        let err = import(&target, &mut input, Policy::default())
            .await
            .unwrap_err();
        let consumed = read.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            consumed <= 40 << 20,
            "read {} MiB of one line before refusing it: {err}",
            consumed >> 20
        );
    }

    /// A line that is not UTF-8 is refused with its number, and the
    /// records read before it are stored.
    #[tokio::test]
    async fn a_line_not_utf8_is_named_and_what_came_before_is_stored() {
        let a = Uuid::now_v7();
        let (_dir, source) = log_with(&[]).await;
        let events: Vec<NewEvent> = (0..20)
            .map(|i| NewEvent {
                kind: format!("K{i}"),
                schema: 1,
                caused_by: None,
                payload: vec![i as u8; 1 << 20],
            })
            .collect();
        source.append(a, 1, events).await.unwrap();
        let mut input = exported(&source, &[a]).await.into_bytes();
        input.extend_from_slice(b"\xff\n");
        let (_dir2, target) = log_with(&[]).await;
        let err = import(&target, &mut input.as_slice(), Policy::default())
            .await
            .unwrap_err()
            .to_string();
        let head = target.head(a).await.unwrap().seq;
        assert!(
            err.contains("line 21") && head == 20,
            "error: {err:?}; records stored: {head} of the 20 (20 MiB) read before it"
        );
    }

    /// A blank line (or another session's key line) inside a run does not
    /// shift the line an error names.
    #[tokio::test]
    async fn the_line_named_is_the_line_at_fault() {
        let a = Uuid::now_v7();
        let (_dir, source) = log_with(&[(a, 3)]).await;
        let text = exported(&source, &[a]).await;
        let lines: Vec<&str> = text.lines().collect();
        let (_dir2, target) = log_with(&[]).await;
        import(
            &target,
            &mut format!("{}\n", lines[0]).as_bytes(),
            Policy::default(),
        )
        .await
        .unwrap();
        target
            .append(
                a,
                2,
                vec![NewEvent {
                    kind: "other".into(),
                    schema: 1,
                    caused_by: None,
                    payload: vec![],
                }],
            )
            .await
            .unwrap();
        // line 1: seq 1, line 2: blank, line 3: seq 2 (differs), line 4: seq 3
        let input = format!("{}\n\n{}\n{}\n", lines[0], lines[1], lines[2]);
        let err = import(&target, &mut input.as_bytes(), Policy::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3:"), "{err}");
    }
}
