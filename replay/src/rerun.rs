//! Re-running a recorded session on another spec (`mneme rerun`): which
//! recorded call answers a call of the rerun, and which calls run. Pure:
//! the record is the original's events, the rest is the rerun's state.

use crate::event::{Event, ToolOutcome};
use crate::spec::{Effect, ToolSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// What makes a session a rerun, recorded on its `SessionForked` (a fork
/// at seq 0 of the original).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RerunOf {
    /// The original's last seq the rerun replays (its head when the rerun
    /// started): its messages and recorded calls are taken up to here, so
    /// a resumed rerun decides as the first process did, whatever the
    /// original holds since.
    pub through_seq: u64,
    /// Whether calls no record answers run live, side effects included
    /// (`--live-tools`).
    pub live_tools: bool,
}

/// How a call of a rerun was answered without running, recorded on its
/// `ToolFinished`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RerunAnswer {
    /// From the original's record: a call of the same tool with the same
    /// arguments, whose outcome the event at `seq` of `session` recorded.
    Recorded {
        /// The original session.
        session: uuid::Uuid,
        /// The seq of the event that recorded the outcome used.
        seq: u64,
        /// The original's id of the call.
        call_id: String,
    },
    /// Not run: a side effect (or a call that needs approval) no record
    /// answers, in a rerun without live tools. The model is told.
    NotRun,
}

/// What the model is told of a call a rerun did not run (as an error).
pub const NOT_RUN: &str = "not run: this is a rerun of a recorded session (mneme rerun), no \
recorded call of this tool had these arguments, and side effects run in a rerun only with \
--live-tools";

/// A rerun, as the fold knows it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RerunState {
    /// The original session.
    pub of: uuid::Uuid,
    /// Its last seq replayed, and whether calls run live.
    pub through_seq: u64,
    /// Whether calls no record answers run live, side effects included.
    pub live_tools: bool,
    /// Seqs of the original's outcomes already used to answer a call: each
    /// answers one call only.
    pub used: BTreeSet<u64>,
}

/// One call of the original with its recorded outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    /// The seq of the event that recorded its outcome.
    pub seq: u64,
    /// The original's id of the call.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments, canonical ([`canonical_args`]).
    pub args: String,
    /// What the model was given as its result.
    pub outcome: ToolOutcome,
}

/// The calls of an original session with a recorded outcome, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// The original session.
    pub session: uuid::Uuid,
    /// Its calls with an outcome, in the order the outcomes were recorded.
    pub calls: Vec<RecordedCall>,
}

/// Arguments as compared: JSON with its keys sorted and no spaces, or the
/// text itself where it is not JSON.
pub fn canonical_args(args: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(args) {
        Ok(value) => value.to_string(),
        Err(_) => args.to_string(),
    }
}

impl Record {
    /// The record of session `session`, from its events (seq order), up
    /// to `through_seq`. A call counts once it has an outcome a tool
    /// returned or a person gave (`ToolFinished`, a resolution that skips
    /// or fails it); a denied call never ran, and a call a rerun did not
    /// run has no result to give.
    pub fn from_events(
        session: uuid::Uuid,
        events: impl IntoIterator<Item = (u64, Event)>,
        through_seq: u64,
    ) -> Record {
        let mut open: Vec<(String, String, String)> = Vec::new();
        let mut calls = Vec::new();
        for (seq, event) in events.into_iter().take_while(|(s, _)| *s <= through_seq) {
            let (call_id, outcome) = match event {
                Event::ModelReplied(reply) => {
                    open = match reply.refused {
                        Some(_) => Vec::new(),
                        None => (reply.tool_calls.into_iter())
                            .map(|c| (c.id, c.name, canonical_args(&c.arguments)))
                            .collect(),
                    };
                    continue;
                }
                Event::ToolFinished {
                    rerun: Some(RerunAnswer::NotRun),
                    ..
                } => continue,
                Event::ToolFinished {
                    call_id, outcome, ..
                } => (call_id, outcome),
                Event::ToolResolved {
                    call_id,
                    resolution,
                    ..
                } => match resolution {
                    crate::Resolution::Skip(result) => (call_id, ToolOutcome::Ok(result)),
                    crate::Resolution::Fail(message) => (call_id, ToolOutcome::Err(message)),
                    crate::Resolution::Retry => continue,
                },
                _ => continue,
            };
            if let Some(at) = open.iter().position(|(id, _, _)| *id == call_id) {
                let (call_id, tool, args) = open.remove(at);
                calls.push(RecordedCall {
                    seq,
                    call_id,
                    tool,
                    args,
                    outcome,
                });
            }
        }
        Record { session, calls }
    }

    /// The first recorded call of `tool` with `args` (compared canonical)
    /// not in `used`.
    pub fn find(&self, tool: &str, args: &str, used: &BTreeSet<u64>) -> Option<&RecordedCall> {
        let args = canonical_args(args);
        self.calls
            .iter()
            .find(|c| c.tool == tool && c.args == args && !used.contains(&c.seq))
    }

    /// How a rerun answers a call of `tool` (its spec, if the session has
    /// it) with `args` without running it: from the first unused matching
    /// record (which `used` then holds); else, unless `live_tools`, as not
    /// run if the tool changes anything or needs approval. `None`: run it
    /// as any session would (a read-only tool, live tools, no such tool).
    pub fn answer(
        &self,
        rerun: &RerunState,
        (tool, args): (&str, &str),
        spec: Option<&ToolSpec>,
        used: &mut BTreeSet<u64>,
    ) -> Option<(ToolOutcome, RerunAnswer)> {
        if let Some(recorded) = self.find(tool, args, used) {
            used.insert(recorded.seq);
            let answer = RerunAnswer::Recorded {
                session: self.session,
                seq: recorded.seq,
                call_id: recorded.call_id.clone(),
            };
            return Some((recorded.outcome.clone(), answer));
        }
        let spec = spec?;
        let harmless = spec.effect == Effect::ReadOnly && !spec.requires_approval;
        (!rerun.live_tools && !harmless)
            .then(|| (ToolOutcome::Err(NOT_RUN.to_string()), RerunAnswer::NotRun))
    }
}

/// The user messages of a session's events up to `through_seq`, in order:
/// what a rerun posts, one turn each. A message that arrived mid-turn
/// counts where it was delivered.
pub fn user_messages<'a>(
    events: impl IntoIterator<Item = &'a (u64, Event)>,
    through_seq: u64,
) -> Vec<String> {
    let mut waiting = Waiting::default();
    events
        .into_iter()
        .take_while(|(seq, _)| *seq <= through_seq)
        .filter_map(|(seq, e)| waiting.opens_turn(*seq, e))
        .map(str::to_string)
        .collect()
}

/// Messages that arrived mid-turn, kept by seq until they are delivered.
#[derive(Default)]
pub struct Waiting<'a>(std::collections::HashMap<u64, &'a str>);

impl<'a> Waiting<'a> {
    /// The message event `seq` opens a turn with, if it opens one: a user
    /// message, or the delivery of a message that arrived mid-turn (read
    /// in seq order, so the message is known by then).
    pub fn opens_turn(&mut self, seq: u64, event: &'a Event) -> Option<&'a str> {
        match event {
            Event::UserMessage { text } => Some(text),
            Event::MidTurnMessage { text, .. } => {
                self.0.insert(seq, text);
                None
            }
            Event::MidTurnDelivered { arrived } => self.0.remove(arrived),
            _ => None,
        }
    }
}
