//! Snapshots and summaries: data derived from a session's log, kept to make
//! resume and listing fast, never trusted without a check against the log.
//!
//! A snapshot is the folded state at some seq, with that record's hash and a
//! CRC-32 of the encoded state (it guards against damage; tampering with the
//! log itself is caught by the hash chain). Loading one checks the format, the digest,
//! and that the log's record at that seq still has that hash; anything else
//! is ignored and the log is folded instead. Deleting every snapshot changes
//! nothing but speed.
//!
//! A summary is what a listing shows (status, agent, usage) as of some seq;
//! it is used only while the session's head is still that seq.

use eventlog::{EventLog, Hash};
use replay::{SessionState, Status, Totals, STATE_FORMAT};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

const SNAPSHOT: &str = "snapshot";
const SUMMARY: &str = "summary";

/// Snapshot setting that picks for itself: every [`BOUNDED_EVERY`] events
/// when the agent has a context window (compaction keeps its state as small
/// as its prompt, and a snapshot then makes resume constant-time), never
/// otherwise (a snapshot of an uncompacted session holds the whole
/// transcript, and loading it costs about as much as folding the log).
pub(crate) const AUTO: u64 = u64::MAX;

/// Events between snapshots under [`AUTO`] for agents with a context window.
pub(crate) const BOUNDED_EVERY: u64 = 1000;

/// Default setting: picks for itself (every 1,000 events when the agent
/// has a context window, never otherwise).
pub const DEFAULT_EVERY: u64 = AUTO;

#[derive(Serialize, Deserialize)]
struct Stored {
    format: u16,
    seq: u64,
    hash: String,
    crc: u32,
    #[serde(with = "serde_bytes")]
    state: Vec<u8>,
}

/// Snapshot writers run in their own tasks; this keeps an older snapshot
/// from overwriting a newer one that finished first.
static STORE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Writes a snapshot of `state`, whose last record has `hash`, unless a newer
/// one is already stored.
pub async fn store(
    log: &dyn EventLog,
    session: Uuid,
    hash: Hash,
    state: &SessionState,
) -> Result<(), eventlog::LogError> {
    let _one_at_a_time = STORE.lock().await;
    let stored_seq = log
        .side_store()
        .get_derived(session, SNAPSHOT)
        .await?
        .and_then(|bytes| rmp_serde::from_slice::<Stored>(&bytes).ok())
        .map_or(0, |s| s.seq);
    if stored_seq > state.last_seq {
        return Ok(());
    }
    let encoded = state.encode();
    let stored = Stored {
        format: STATE_FORMAT,
        seq: state.last_seq,
        hash: hash.to_hex(),
        crc: crc32fast::hash(&encoded),
        state: encoded,
    };
    let bytes = rmp_serde::to_vec_named(&stored).expect("snapshots always encode");
    log.side_store()
        .put_derived(session, SNAPSHOT, &bytes)
        .await
}

/// The newest snapshot of `session` that checks out against the log, or
/// why there is none to use.
pub(crate) async fn load(log: &dyn EventLog, session: Uuid) -> Result<SessionState, String> {
    let bytes = log
        .side_store()
        .get_derived(session, SNAPSHOT)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no snapshot")?;
    let stored: Stored =
        rmp_serde::from_slice(&bytes).map_err(|e| format!("snapshot does not decode: {e}"))?;
    if stored.format != STATE_FORMAT {
        return Err(format!(
            "snapshot format {} is not {STATE_FORMAT}",
            stored.format
        ));
    }
    if crc32fast::hash(&stored.state) != stored.crc {
        return Err("snapshot damaged: its checksum does not match".into());
    }
    let record = log
        .read(session, stored.seq, stored.seq)
        .await
        .map_err(|e| e.to_string())?;
    match record.first() {
        Some(r) if r.hash.to_hex() == stored.hash => {}
        _ => {
            return Err(format!(
                "snapshot stale: the log's record {} is not the one it was taken at",
                stored.seq
            ))
        }
    }
    let state = SessionState::decode(&stored.state).ok_or("snapshot state does not decode")?;
    if state.last_seq != stored.seq {
        return Err("snapshot state does not match its seq".into());
    }
    Ok(state)
}

/// What a listing shows of a session, as of `seq`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// The seq it describes.
    pub seq: u64,
    /// The agent's name.
    pub agent: String,
    /// Its tenant's name (absent: the operator's session). A summary
    /// stored before tenants existed has none, rightly: every session of
    /// then was the operator's.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Status at `seq`.
    pub status: String,
    /// Why it is paused, if it is.
    pub paused: Option<String>,
    /// Whether a call waits for a person (a decision or an approval).
    pub waits_for_a_person: bool,
    /// Usage totals.
    pub totals: Totals,
    /// Prompt tokens of the latest model request.
    #[serde(default)]
    pub prompt_tokens_last: u64,
    /// KV-cache bytes that prompt occupies, where the spec gives the shape.
    #[serde(default)]
    pub kv_bytes_last: Option<u64>,
    /// The model's context window, where the spec gives it.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// Whether the token limit cut the last answer off.
    #[serde(default)]
    pub answer_cut_off: bool,
    /// The earliest deadline of the calls waiting for approval
    /// (milliseconds since the Unix epoch), if any has one.
    #[serde(default)]
    pub approval_expires_ms: Option<i64>,
    /// When a sleeping call wakes on its own (its timer or its deadline;
    /// milliseconds since the Unix epoch), if one sleeps.
    #[serde(default)]
    pub wakes_at_ms: Option<i64>,
    /// The event a sleeping call waits for, if one does.
    #[serde(default)]
    pub waits_for: Option<String>,
    /// The session whose call started this one, if it is a sub-agent.
    #[serde(default)]
    pub parent: Option<uuid::Uuid>,
    /// Its first user message, clipped to 120 characters: what the
    /// conversation is about. (No default: a summary stored before titles
    /// does not decode, and is rebuilt from the log.)
    pub title: String,
    /// The session it was forked from, if it is a fork.
    #[serde(default)]
    pub forked_from: Option<uuid::Uuid>,
    /// The session it re-runs on another agent, if it is a rerun.
    #[serde(default)]
    pub rerun_of: Option<uuid::Uuid>,
    /// Whether a process drove its current turn ([`SessionState::turn_driven`]).
    #[serde(default)]
    pub turn_driven: bool,
    /// Whether its current turn was opened in a fork's copy of its
    /// parent's history ([`SessionState::turn_opened_in_its_copy`]).
    #[serde(default)]
    pub turn_opened_in_its_copy: bool,
}

/// Characters of a session's first message kept as its title.
pub(crate) const TITLE_CHARS: usize = 120;

impl Summary {
    /// The summary of `state`.
    pub fn of(state: &SessionState) -> Summary {
        let prompt_tokens_last = state
            .entries
            .iter()
            .rev()
            .find_map(|e| match e {
                replay::Entry::Reply { reply, .. } => Some(reply.usage.prompt_tokens),
                replay::Entry::User(_) => None,
            })
            .unwrap_or(0);
        let model = state.spec.as_ref().map(|s| &s.model);
        Summary {
            prompt_tokens_last,
            kv_bytes_last: model
                .and_then(|m| m.kv)
                .map(|kv| kv.bytes_per_token().saturating_mul(prompt_tokens_last)),
            context_window: model.and_then(|m| m.context_window),
            seq: state.last_seq,
            agent: state
                .spec
                .as_ref()
                .map_or(String::new(), |s| s.name.clone()),
            tenant: state.tenant.as_ref().map(|t| t.name.clone()),
            status: state.status().to_string(),
            paused: state.paused.clone(),
            waits_for_a_person: state.waits_for_a_person(),
            // A sub-agent's spending counts in its parent's totals.
            totals: state.tree_totals(),
            parent: state.parent.as_ref().map(|link| link.session),
            answer_cut_off: state.answer().is_some() && state.last_reply_cut_off(),
            approval_expires_ms: state.approval_deadline_ms(),
            wakes_at_ms: state.next_wake_ms(),
            waits_for: state.awaited_event().map(String::from),
            title: title_of(state),
            forked_from: state.forked_from.map(|(session, _)| session),
            rerun_of: state.rerun.as_ref().map(|rerun| rerun.of),
            turn_driven: state.turn_driven,
            turn_opened_in_its_copy: state.turn_opened_in_its_copy(),
        }
    }
}

/// The first user message of `state`, on one line, clipped.
fn title_of(state: &SessionState) -> String {
    let first = state.entries.iter().find_map(|entry| match entry {
        replay::Entry::User(text) => Some(text.as_str()),
        replay::Entry::Reply { .. } => None,
    });
    let words = first.unwrap_or_default().split_whitespace();
    let mut title = words.collect::<Vec<_>>().join(" ");
    if let Some((cut, _)) = title.char_indices().nth(TITLE_CHARS) {
        title.truncate(cut);
        title.push('…');
    }
    title
}

impl Summary {
    /// Whether the session has pending work that no person has to decide
    /// on ([`replay::Status::resumable`]), or a call whose approval expired
    /// (a resume records it as denied and goes on).
    /// A sub-agent never is: its parent's turn resumes it (two drivers
    /// would race for its lease).
    /// An imported session at rest is not, nor a fork whose turn nobody
    /// started ([`Summary::never_started_fork`]): only a person resumes
    /// them, by id.
    pub fn resumable(&self) -> bool {
        let pending = self
            .status
            .parse::<Status>()
            .is_ok_and(|status| status.resumable(self.waits_for_a_person))
            || self.approval_expired(crate::text::now_ms());
        let imported = (self.paused.as_deref()).is_some_and(crate::transfer::at_rest_after_import);
        pending && self.parent.is_none() && !imported && !self.never_started_fork()
    }

    /// Whether it is a fork whose current turn was opened in the history it
    /// copied and never driven: nobody asked this session for that turn.
    pub fn never_started_fork(&self) -> bool {
        self.turn_opened_in_its_copy && !self.turn_driven
    }

    /// The earliest time something of the session falls due on its own:
    /// an approval's deadline, or a sleeping call's wake.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        [self.approval_expires_ms, self.wakes_at_ms]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether a call's wait for approval ended at or before `now_ms`.
    pub fn approval_expired(&self, now_ms: i64) -> bool {
        self.approval_expires_ms.is_some_and(|at| at <= now_ms)
    }
}

/// Writes the summary of `state`.
pub(crate) async fn store_summary(
    log: &dyn EventLog,
    session: Uuid,
    state: &SessionState,
) -> Result<(), eventlog::LogError> {
    let bytes = rmp_serde::to_vec_named(&Summary::of(state)).expect("summaries always encode");
    log.side_store().put_derived(session, SUMMARY, &bytes).await
}

/// The stored summary of `session`, if it describes seq `head`.
pub(crate) async fn fresh_summary(log: &dyn EventLog, session: Uuid, head: u64) -> Option<Summary> {
    let bytes = log
        .side_store()
        .get_derived(session, SUMMARY)
        .await
        .ok()??;
    summary_at(&bytes, head)
}

/// The stored summaries of `sessions` (id, head), each if it describes that
/// head, read together.
pub(crate) async fn fresh_summaries(
    log: &dyn EventLog,
    sessions: &[(Uuid, u64)],
) -> Vec<Option<Summary>> {
    let ids: Vec<Uuid> = sessions.iter().map(|(id, _)| *id).collect();
    let Ok(stored) = log.side_store().get_derived_many(SUMMARY, &ids).await else {
        return vec![None; sessions.len()];
    };
    stored
        .iter()
        .zip(sessions)
        .map(|(bytes, (_, head))| summary_at(bytes.as_deref()?, *head))
        .collect()
}

fn summary_at(bytes: &[u8], head: u64) -> Option<Summary> {
    let summary: Summary = rmp_serde::from_slice(bytes).ok()?;
    (summary.seq == head).then_some(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Session;
    use eventlog::SledLog;
    use replay::Event;
    use std::sync::Arc;

    fn spec() -> replay::AgentSpec {
        toml::from_str("name = \"t\"\n[model]\nprovider = \"scripted\"\nscript = \"s.json\"\n")
            .unwrap()
    }

    /// A session of `n` user messages, snapshotted every 4 events.
    async fn session(log: &Arc<dyn EventLog>, n: usize) -> Session {
        let mut s = Session::create(log.clone(), spec())
            .await
            .unwrap()
            .snapshot_every(4);
        for i in 0..n {
            s.append(
                vec![Event::UserMessage {
                    text: format!("m{i}"),
                }],
                None,
            )
            .await
            .unwrap();
        }
        s
    }

    async fn wait_for_snapshot(log: &dyn EventLog, id: Uuid, seq: u64) {
        for _ in 0..500 {
            if load(log, id).await.is_ok_and(|s| s.last_seq >= seq) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("no snapshot at seq {seq}");
    }

    #[tokio::test]
    async fn resume_from_a_snapshot_equals_a_full_fold_and_bad_ones_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path()).unwrap());
        let s = session(&log, 10).await; // 11 events: snapshots at 4 and 8
        let id = s.id();
        wait_for_snapshot(log.as_ref(), id, 8).await;
        let full = replay::SessionState::fold(
            crate::session::read_events(log.as_ref(), id)
                .await
                .unwrap()
                .into_iter()
                .map(|(r, e)| (r.envelope.seq, e)),
        );
        let loaded = Session::load(log.clone(), id).await.unwrap();
        assert_eq!(loaded.snapshot_seq(), 8, "loaded from the snapshot");
        assert_eq!(loaded.state(), &full);

        // A damaged snapshot is ignored: the log is folded instead.
        let mut bytes = log
            .side_store()
            .get_derived(id, SNAPSHOT)
            .await
            .unwrap()
            .unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 0xff;
        log.side_store()
            .put_derived(id, SNAPSHOT, &bytes)
            .await
            .unwrap();
        assert!(load(log.as_ref(), id)
            .await
            .unwrap_err()
            .contains("damaged"));
        let loaded = Session::load(log.clone(), id).await.unwrap();
        assert_eq!((loaded.snapshot_seq(), loaded.state()), (0, &full));

        // A snapshot of another history (same seq, another hash) is stale.
        let other_dir = tempfile::tempdir().unwrap();
        let other_log: Arc<dyn EventLog> = Arc::new(SledLog::open(other_dir.path()).unwrap());
        let other = session(&other_log, 10).await;
        let hash = other_log.head(other.id()).await.unwrap().hash;
        store(log.as_ref(), id, hash, other.state()).await.unwrap();
        assert!(load(log.as_ref(), id).await.unwrap_err().contains("stale"));
        assert_eq!(Session::load(log.clone(), id).await.unwrap().state(), &full);
    }

    #[tokio::test]
    async fn a_summary_is_used_only_while_it_describes_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path()).unwrap());
        let mut s = session(&log, 2).await;
        s.barrier(eventlog::Durability::Flushed).await.unwrap();
        let id = s.id();
        assert!(
            fresh_summary(log.as_ref(), id, 3).await.is_none(),
            "not written mid-turn"
        );
        let reason = "a person".to_string();
        s.append(
            vec![Event::SessionPaused {
                reason,
                budget: false,
            }],
            None,
        )
        .await
        .unwrap();
        s.barrier(eventlog::Durability::Flushed).await.unwrap();
        assert!(
            fresh_summary(log.as_ref(), id, 4).await.is_none(),
            "a barrier only makes things durable (the end of a turn writes it)"
        );
        store_summary(log.as_ref(), id, s.state()).await.unwrap();
        let summary = fresh_summary(log.as_ref(), id, 4)
            .await
            .expect("describes the head");
        assert_eq!(
            (summary.status.as_str(), summary.agent.as_str()),
            ("paused", "t")
        );
        s.append(
            vec![Event::UserMessage {
                text: "more".into(),
            }],
            None,
        )
        .await
        .unwrap();
        assert!(
            fresh_summary(log.as_ref(), id, 5).await.is_none(),
            "stale after an append"
        );
    }

    /// A snapshot task queued behind another session's (the one lock
    /// snapshots are stored under) runs after the session was erased: it
    /// holds the state from before, erased text and all, and must store
    /// nothing, neither in the clear on disk nor for a load to trust.
    #[tokio::test]
    async fn a_snapshot_queued_before_an_erasure_is_not_stored_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let keys = tempfile::tempdir().unwrap();
        let raw: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path()).unwrap());
        let master = crate::privacy::MasterKey::generate(&keys.path().join("master.key")).unwrap();
        let log: Arc<dyn EventLog> =
            Arc::new(crate::privacy::SealedLog::new(raw.clone(), Some(master)));
        let mut s = session(&log, 2).await;
        let id = s.id();
        let busy = STORE.lock().await;
        let paused = Event::SessionPaused {
            reason: "a person".into(),
            budget: false,
        };
        // A pause snapshots in the background: the task waits for the lock.
        s.append(vec![paused], None).await.unwrap();
        crate::service::Service::new(log.clone(), eventlog::Durability::Flushed)
            .erase(&mut s, "asked to", "test")
            .await
            .unwrap();
        drop(busy);
        // The lock is fair: once it is ours again, the queued task is done.
        drop(STORE.lock().await);
        let stored = raw.side_store().get_derived(id, SNAPSHOT).await.unwrap();
        assert!(
            stored.is_none_or(|bytes| !String::from_utf8_lossy(&bytes).contains("m1")),
            "the erased text was stored in the clear"
        );
        let full = replay::SessionState::fold(
            (crate::session::read_events(log.as_ref(), id).await.unwrap())
                .into_iter()
                .map(|(r, e)| (r.envelope.seq, e)),
        );
        let loaded = Session::load(log.clone(), id).await.unwrap();
        assert_eq!(
            (loaded.snapshot_seq(), &loaded.state().entries),
            (0, &full.entries)
        );
    }
}
