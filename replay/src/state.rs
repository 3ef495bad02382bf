//! The fold: a session's state is a function of its events, nothing else.

use crate::event::{
    Event, ModelReply, Resolution, SessionOutcome, ToolCall, ToolOutcome, Usage, EXPIRED,
};
use crate::spec::AgentSpec;
use serde::{Deserialize, Serialize};

/// Where one tool call of a reply stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallPhase {
    /// Not started.
    Pending,
    /// Started, no outcome recorded.
    Started,
    /// Outcome recorded (or decided by a person).
    Finished(ToolOutcome),
    /// Outcome unknown and unsafe to re-run; waits for a person.
    InDoubt(String),
    /// A person chose to run it again.
    RetryApproved,
    /// Waits for a person to approve it.
    AwaitingApproval,
    /// Its check answered: not applied (it runs again with its key), or
    /// could not tell (why; it goes in doubt).
    Checked(crate::event::CheckAnswer),
    /// A call of a tool of kind `sleep`: the session sleeps until this
    /// wake.
    Sleeping(Wake),
}

/// When, or on what, a sleeping call wakes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wake {
    /// Its time (milliseconds since the Unix epoch), for a timer.
    pub at_ms: Option<i64>,
    /// The event it waits for.
    pub event: Option<String>,
    /// When a wait for an event ends without it.
    pub deadline_ms: Option<i64>,
}

impl Wake {
    /// The time it wakes on its own (its timer or its deadline), if any.
    pub fn due_at_ms(&self) -> Option<i64> {
        self.at_ms.or(self.deadline_ms)
    }

    /// What wakes it at or before `now_ms`, if it is due then: its timer,
    /// or the deadline of its wait for an event.
    pub fn due(&self, now_ms: i64) -> Option<crate::event::WokenBy> {
        use crate::event::WokenBy;
        match (self.at_ms, self.deadline_ms) {
            (Some(at), _) if at <= now_ms => Some(WokenBy::Timer),
            (None, Some(deadline)) if deadline <= now_ms => Some(WokenBy::Deadline),
            _ => None,
        }
    }
}

/// One tool call of a reply, with its history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallState {
    /// The call as the model made it.
    pub call: ToolCall,
    /// Idempotency key recorded when it started.
    pub idempotency_key: Option<String>,
    /// How many times it started.
    pub attempts: u32,
    /// Whether a person approved it (for tools that require approval).
    pub approved: bool,
    /// Where it stands.
    pub phase: CallPhase,
    /// The arguments a person approved it with in place of the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited: Option<EditedArgs>,
    /// When its wait for approval ends (milliseconds since the Unix epoch),
    /// if its tool sets `approval_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_expires_at_ms: Option<i64>,
}

/// Arguments a person gave a call when approving it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditedArgs {
    /// The arguments (a JSON text) the tool runs with.
    pub arguments: String,
    /// Who gave them.
    pub by: String,
}

impl CallState {
    /// The arguments the tool runs with: a person's, where they edited the
    /// call when approving it, else the model's.
    pub fn arguments(&self) -> &str {
        match &self.edited {
            Some(edited) => &edited.arguments,
            None => &self.call.arguments,
        }
    }

    /// Whether it waits for approval and its deadline is at or before
    /// `now_ms` (milliseconds since the Unix epoch).
    pub fn approval_expired(&self, now_ms: i64) -> bool {
        self.phase == CallPhase::AwaitingApproval
            && self.approval_expires_at_ms.is_some_and(|at| at <= now_ms)
    }
}

/// One entry of the conversation, in prompt order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Entry {
    /// A user message.
    User(String),
    /// A model reply and its tool calls, in the model's order.
    Reply {
        /// Seq of the ModelReplied event.
        seq: u64,
        /// The reply.
        reply: Box<ModelReply>,
        /// Its calls, in the same order as `reply.tool_calls`.
        calls: Vec<CallState>,
    },
}

/// Coarse status of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// No SessionStarted yet.
    Empty,
    /// Work is pending: the model or a tool must run.
    Running,
    /// The last turn was answered; waiting for a user message.
    Idle,
    /// Stopped until someone resumes or resolves it.
    Paused,
    /// A call of a tool of kind `sleep` waits for its time or its event;
    /// nothing runs it until then.
    Sleeping,
    /// The last turn failed; `resume` may try again.
    Failed,
    /// Cancelled; a new user message reopens it.
    Cancelled,
    /// Its content was erased; nothing runs in it again.
    Erased,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Empty => "empty",
            Status::Running => "running",
            Status::Idle => "idle",
            Status::Paused => "paused",
            Status::Sleeping => "sleeping",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Erased => "erased",
        })
    }
}

impl Status {
    /// Whether a session of this status has pending work that no person
    /// has to decide on (`waits_for_a_person`, see
    /// [`SessionState::waits_for_a_person`]): it is running, failed, or
    /// paused with nothing waiting for a person. The one answer to
    /// "resumable", for a state and for a stored summary alike.
    pub fn resumable(self, waits_for_a_person: bool) -> bool {
        match self {
            Status::Running | Status::Failed => true,
            Status::Paused => !waits_for_a_person,
            Status::Empty
            | Status::Idle
            | Status::Sleeping
            | Status::Cancelled
            | Status::Erased => false,
        }
    }
}

impl std::str::FromStr for Status {
    type Err = String;

    /// The status its [`Display`](std::fmt::Display) names.
    fn from_str(s: &str) -> Result<Status, String> {
        [
            Status::Empty,
            Status::Running,
            Status::Idle,
            Status::Paused,
            Status::Sleeping,
            Status::Failed,
            Status::Cancelled,
            Status::Erased,
        ]
        .into_iter()
        .find(|status| status.to_string() == s)
        .ok_or_else(|| format!("unknown status {s:?}"))
    }
}

/// Sums across every model request of the session, all attempts included.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Totals {
    /// Model requests answered.
    pub model_calls: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Prompt tokens served from the server's prefix cache.
    pub cached_tokens: u64,
    /// Completion tokens spent reasoning, where the server said (also in
    /// `completion_tokens`). Left out of the encoding when 0, so a child's
    /// totals on its parent's `ToolFinished` are written as before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
    /// Cost in the spec's currency, where the spec gives prices.
    pub cost: f64,
}

/// Cost of one request's `usage` at the spec's prices (0 without prices).
pub fn cost(usage: &Usage, spec: Option<&AgentSpec>) -> f64 {
    spec.map_or(0.0, |spec| {
        crate::spend::Prices::of(&spec.model).cost(usage)
    })
}

/// What the current turn has spent, against the spec's `[limits]`: since
/// the last user message, or the last resume that extended the budget.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct TurnSpend {
    /// Model replies.
    pub steps: u64,
    /// Tool calls the model made (in replies acted on).
    pub tool_calls: u64,
    /// Cost of the replies.
    pub cost: f64,
    /// Messages that arrived mid-turn and were rejected (recorded, never
    /// delivered: `mid_turn_messages = "reject"`).
    #[serde(default)]
    pub rejected_messages: u64,
}

/// Whether `event` is one only a process driving a turn records.
fn drives_a_turn(event: &Event) -> bool {
    matches!(
        event,
        Event::ModelReplied(_)
            | Event::ToolStarted { .. }
            | Event::ToolFinished { .. }
            | Event::ToolInDoubt { .. }
            | Event::ToolChecked { .. }
            | Event::ContextCompacted { .. }
            | Event::MidTurnDelivered { .. }
            | Event::SessionResumed {
                after_crash: true,
                ..
            }
    )
}

/// A call of the latest reply that waits for a person: in doubt (a person
/// decides whether it ran), or awaiting approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The model's id of the call.
    pub call_id: String,
    /// The tool it calls.
    pub tool: String,
    /// Why it waits: why it is in doubt, or [`APPROVAL_REQUIRED`].
    pub reason: String,
    /// Its arguments, as the model gave them (or as a person edited them).
    pub arguments: String,
    /// Its tool's description as the session pinned it: what the model was
    /// told of the tool (empty if the spec gives none).
    pub description: String,
}

/// Why a call awaiting approval waits.
pub const APPROVAL_REQUIRED: &str = "requires approval";

impl Waiting {
    fn on(call: &CallState, reason: &str, spec: Option<&AgentSpec>) -> Waiting {
        let tool = spec.and_then(|spec| spec.tool(&call.call.name));
        Waiting {
            call_id: call.call.id.clone(),
            tool: call.call.name.clone(),
            reason: reason.to_string(),
            arguments: call.arguments().to_string(),
            description: tool.map(|t| t.description.clone()).unwrap_or_default(),
        }
    }
}

/// The events that opened the current turn and the turn before it: a
/// user's message, or a resume (`SessionResumed`: after a pause, a failure,
/// a person's decision). A turn resumed after a crash has no event of its
/// own: it continues the turn its crashed process was in. (Traces are named
/// after these seqs, so a later process can point at an earlier turn's.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TurnOpened {
    /// Seq of the event that opened the current turn (0: none yet).
    pub seq: u64,
    /// Whether it was a `SessionResumed` (else a `UserMessage`).
    pub resumed: bool,
    /// Seq of the event that opened the turn before (0: none).
    pub previous: u64,
}

impl TurnOpened {
    fn next(self, seq: u64, resumed: bool) -> TurnOpened {
        TurnOpened {
            seq,
            resumed,
            previous: self.seq,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Totals {
    /// Counts a reply. A server reports its usage: counts it made huge stop
    /// at the largest number rather than overflow the fold.
    fn add(&mut self, usage: &Usage, spec: Option<&AgentSpec>) {
        self.count(usage, cost(usage, spec));
    }

    /// Counts a reply whose `usage` cost `cost` (counts stop at the
    /// largest number rather than overflow).
    pub fn count(&mut self, usage: &Usage, cost: f64) {
        self.model_calls = self.model_calls.saturating_add(1);
        self.prompt_tokens = self.prompt_tokens.saturating_add(usage.prompt_tokens);
        self.completion_tokens = (self.completion_tokens).saturating_add(usage.completion_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(usage.cached_tokens);
        self.reasoning_tokens = (self.reasoning_tokens).saturating_add(usage.reasoning_tokens);
        self.cost += cost;
    }

    /// Adds `other`'s counts to these (stopping at the largest number).
    pub fn merge(&mut self, other: &Totals) {
        self.model_calls = self.model_calls.saturating_add(other.model_calls);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = (self.completion_tokens).saturating_add(other.completion_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.reasoning_tokens = (self.reasoning_tokens).saturating_add(other.reasoning_tokens);
        self.cost += other.cost;
    }

    /// Share of prompt tokens served from the prefix cache (0 when none).
    pub fn cache_hit_ratio(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.cached_tokens as f64 / self.prompt_tokens as f64
        }
    }
}

/// Bytes a token is taken to be before the server has reported a count:
/// fewer than most tokenizers give for English (about 4), so estimates err
/// on the large side.
pub const FALLBACK_BYTES_PER_TOKEN: u64 = 3;

/// Version of the encoded state in snapshots; a snapshot of another version
/// is ignored (the log is folded instead). 8 added the mailbox of messages
/// that arrived mid-turn, and `rerun`: an older build must fold such a log
/// (and refuse its version-3 events) rather than take a snapshot that
/// hides them and drop a message or run a rerun's side effects live. 9
/// added sub-agents' links and their trees' totals; 10 the schedule firing
/// that started a session or messaged it; 11 the reasoning tokens in the
/// totals (an older build's snapshot would count none); 12 the session's
/// tenant (an older build's snapshot would send no `cache_salt`).
pub const STATE_FORMAT: u16 = 12;

/// A link between a parent session and a child (a sub-agent): the other
/// session, the seq of the parent's `ToolStarted` that started the child,
/// and the parent's call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLink {
    /// The other session (the parent, seen from a child; a child, seen
    /// from its parent).
    pub session: uuid::Uuid,
    /// Seq of the parent's `ToolStarted` of the call.
    pub seq: u64,
    /// The parent's call.
    pub call_id: String,
}

/// A call of an agent tool, as the fold saw it start: enough to name its
/// child (see [`SessionState::children`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCall {
    /// Seq of its first `ToolStarted`.
    pub seq: u64,
    /// The call.
    pub call_id: String,
    /// Its idempotency key, from which its child's id derives.
    pub idempotency_key: String,
}

/// The folded state of a session.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SessionState {
    /// The spec from SessionStarted.
    pub spec: Option<AgentSpec>,
    /// Seq of the last event folded.
    pub last_seq: u64,
    /// The conversation, in prompt order.
    pub entries: Vec<Entry>,
    /// Seq of the event that began each entry (parallel to `entries`).
    #[serde(default)]
    pub entry_seqs: Vec<u64>,
    /// Set by SessionPaused, cleared by SessionResumed or a new user message.
    pub paused: Option<String>,
    /// Whether the pause is a spent budget (only an extending resume ends it).
    #[serde(default)]
    pub budget_paused: bool,
    /// What the current turn has spent.
    #[serde(default)]
    pub turn: TurnSpend,
    /// Which events opened the current turn and the one before it.
    #[serde(default)]
    pub turn_opened: TurnOpened,
    /// Whether a process drove the current turn since it opened (recorded
    /// a reply, a call's start or end, a check, a compaction, a delivered
    /// message; a fork's copied history does not count): a turn that is
    /// running with nothing running it was then interrupted by a crash,
    /// else it was never started.
    #[serde(default)]
    pub turn_driven: bool,
    /// Replies in a row refused because the token limit cut them off in
    /// the middle of their tool calls (the next request allows twice the
    /// tokens once; a second in a row fails the turn).
    #[serde(default)]
    pub cut_off_in_a_row: u32,
    /// Set by a failed SessionFinished, cleared by SessionResumed or a new user message.
    pub failed: Option<String>,
    /// Who cancelled the session; cleared by a new user message.
    pub cancelled: Option<String>,
    /// Who erased the session's content, and why: for good.
    #[serde(default)]
    pub erased: Option<(String, String)>,
    /// The session and seq this one was forked from.
    pub forked_from: Option<(uuid::Uuid, u64)>,
    /// The session this one re-runs on another spec (`mneme rerun`), and
    /// which of its recorded calls answered calls here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun: Option<crate::rerun::RerunState>,
    /// How many entries (from the start of the conversation) a summary
    /// replaces, and the summary.
    #[serde(default)]
    pub compacted: Option<(usize, String)>,
    /// Entries compacted away: `entries` holds the conversation after them.
    #[serde(default)]
    pub dropped: usize,
    /// Usage and cost totals.
    pub totals: Totals,
    /// Events the fold could not place (a tool event for an unknown call):
    /// `(seq, what)`. A healthy log has none.
    pub anomalies: Vec<(u64, String)>,
    /// Per MCP server, how its current list differs from the pinned one,
    /// as last recorded (absent or empty: no difference known).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub mcp_changes: std::collections::BTreeMap<String, Vec<String>>,
    /// The parent's call that started this session, if it is a sub-agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<SessionLink>,
    /// The calls of agent tools started, in order: each ran a child.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_calls: Vec<AgentCall>,
    /// What finished children spent (each counted once, when its call
    /// finished): kept apart from `totals`, which counts this session's
    /// own model requests.
    #[serde(default)]
    pub subagents: Totals,
    /// Messages that arrived mid-turn and wait to be delivered, in the
    /// order they arrived (none of them is in the prompt yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mailbox: Vec<WaitingMessage>,
    /// The last schedule firing that started this session or sent it a
    /// message (`ScheduledBy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_by: Option<crate::schedule::ScheduledBy>,
    /// The tenant the session belongs to, from its (first) start: a fork
    /// keeps its parent's, a sub-agent its parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<crate::event::Tenancy>,
}

/// A message that arrived mid-turn and waits in the mailbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingMessage {
    /// The seq of its `MidTurnMessage`.
    pub seq: u64,
    /// What was said.
    pub text: String,
    /// Whether it interrupts the running turn (else it waits for the
    /// turn's answer).
    pub interrupt: bool,
}

impl SessionState {
    /// The state as MessagePack with named fields (for snapshots).
    pub fn encode(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("states always encode")
    }

    /// A state [`SessionState::encode`] wrote; `None` if the bytes are not one.
    pub fn decode(bytes: &[u8]) -> Option<SessionState> {
        rmp_serde::from_slice(bytes).ok()
    }

    /// Folds `events` (seq and event, in seq order) from the empty state.
    pub fn fold(events: impl IntoIterator<Item = (u64, Event)>) -> SessionState {
        let mut state = SessionState::default();
        for (seq, event) in events {
            state.apply(seq, event);
        }
        state
    }

    /// Folds one more event. Never panics, whatever the event.
    pub fn apply(&mut self, seq: u64, event: Event) {
        self.last_seq = seq;
        // A fork's copy of its parent's history was driven in the parent.
        let copied = self.forked_from.is_some_and(|(_, at)| seq <= at + 1);
        if drives_a_turn(&event) && !copied {
            self.turn_driven = true;
        }
        match event {
            // A fork that shares its parent's history comes after it: the
            // links that history held (its parent's own: a fork of a fork,
            // of a rerun, of a sub-agent) are not this session's.
            Event::SessionForked {
                parent,
                at_seq,
                shared: true,
                ..
            } => {
                self.forked_from = Some((parent, at_seq));
                self.turn_driven = false;
                self.rerun = None;
                self.parent = None;
            }
            // A fork that copied its parent's history names its links
            // first: the copy's own are not this session's.
            Event::SessionForked { .. } | Event::SpawnedBy { .. } if self.forked_from.is_some() => {
            }
            Event::SessionForked {
                parent,
                at_seq,
                rerun,
                shared: false,
            } => {
                self.forked_from = Some((parent, at_seq));
                self.turn_driven = false;
                self.rerun = rerun.map(|r| crate::rerun::RerunState {
                    of: parent,
                    through_seq: r.through_seq,
                    live_tools: r.live_tools,
                    used: Default::default(),
                });
            }
            Event::SessionStarted { spec, tenant } => {
                self.spec = Some(*spec);
                if self.tenant.is_none() {
                    self.tenant = tenant;
                }
            }
            Event::SpecChanged { spec, .. } => self.spec = Some(*spec),
            Event::UserMessage { text } => self.open_turn_with(seq, text),
            Event::MidTurnMessage { text, policy } => match policy {
                crate::spec::MidTurn::Reject => self.turn.rejected_messages += 1,
                _ => self.mailbox.push(WaitingMessage {
                    seq,
                    text,
                    interrupt: policy == crate::spec::MidTurn::Interrupt,
                }),
            },
            Event::MidTurnDelivered { arrived } => {
                match self.mailbox.iter().position(|m| m.seq == arrived) {
                    Some(at) => {
                        let waiting = self.mailbox.remove(at);
                        self.open_turn_with(seq, waiting.text);
                    }
                    None => self.anomalies.push((
                        seq,
                        format!("delivers the message of seq {arrived}, which does not wait"),
                    )),
                }
            }
            Event::ModelReplied(reply) => {
                self.totals.add(&reply.usage, self.spec.as_ref());
                self.turn.steps = self.turn.steps.saturating_add(1);
                self.turn.cost += cost(&reply.usage, self.spec.as_ref());
                // A refused reply's calls never run.
                let acted_on = match reply.refused {
                    None => reply.tool_calls.as_slice(),
                    Some(_) => &[],
                };
                self.turn.tool_calls += acted_on.len() as u64;
                self.cut_off_in_a_row = match reply.cut_off_refused() {
                    true => self.cut_off_in_a_row + 1,
                    false => 0,
                };
                let calls = acted_on
                    .iter()
                    .map(|call| CallState {
                        call: call.clone(),
                        idempotency_key: None,
                        attempts: 0,
                        approved: false,
                        phase: CallPhase::Pending,
                        edited: None,
                        approval_expires_at_ms: None,
                    })
                    .collect();
                self.entries.push(Entry::Reply {
                    seq,
                    reply: Box::new(reply),
                    calls,
                });
                self.entry_seqs.push(seq);
            }
            Event::ToolStarted {
                call_id,
                idempotency_key,
                tool,
                ..
            } => {
                self.note_agent_call(seq, &tool, &call_id, &idempotency_key);
                self.update_call(seq, &call_id, |c| {
                    c.idempotency_key = Some(idempotency_key);
                    c.attempts += 1;
                    c.phase = CallPhase::Started;
                })
            }
            Event::ToolFinished {
                call_id,
                outcome,
                rerun,
                child,
                ..
            } => {
                if let (Some(state), Some(crate::rerun::RerunAnswer::Recorded { seq: at, .. })) =
                    (&mut self.rerun, rerun)
                {
                    state.used.insert(at);
                }
                if let Some(child) = child {
                    self.count_child(&child.totals);
                }
                self.update_call(seq, &call_id, |c| c.phase = CallPhase::Finished(outcome))
            }
            Event::SpawnedBy {
                parent,
                seq: at,
                call_id,
            } => {
                self.parent = Some(SessionLink {
                    session: parent,
                    seq: at,
                    call_id,
                })
            }
            Event::ToolChecked {
                call_id, answer, ..
            } => self.update_call(seq, &call_id, |c| c.phase = CallPhase::Checked(answer)),
            Event::ToolInDoubt { call_id, reason } => {
                self.update_call(seq, &call_id, |c| c.phase = CallPhase::InDoubt(reason))
            }
            Event::ToolResolved {
                call_id,
                resolution,
                ..
            } => self.update_call(seq, &call_id, |c| {
                c.phase = match resolution {
                    Resolution::Retry => CallPhase::RetryApproved,
                    Resolution::Skip(result) => CallPhase::Finished(ToolOutcome::Ok(result)),
                    Resolution::Fail(message) => CallPhase::Finished(ToolOutcome::Err(message)),
                }
            }),
            Event::ApprovalRequested {
                call_id,
                expires_at_ms,
            } => self.update_call(seq, &call_id, |c| {
                c.phase = CallPhase::AwaitingApproval;
                c.approval_expires_at_ms = expires_at_ms;
            }),
            Event::ApprovalDecided {
                call_id,
                approved,
                by,
                reason,
                args,
            } => {
                let denial = self.denial(&call_id, &by, reason.as_deref());
                self.update_call(seq, &call_id, |c| {
                    c.approved = approved;
                    c.phase = match approved {
                        true => CallPhase::Pending,
                        false => CallPhase::Finished(ToolOutcome::Err(denial)),
                    };
                    c.edited = match (approved, args) {
                        (true, Some(arguments)) => Some(EditedArgs { arguments, by }),
                        _ => None,
                    };
                })
            }
            Event::ContextCompacted {
                entries, summary, ..
            } => {
                // Compacted entries leave memory: a long session's state stays
                // as small as its prompt. The log keeps them.
                let last_kept = self.dropped + self.entries.len().saturating_sub(1);
                let upto = (entries as usize).clamp(self.dropped, last_kept);
                let gone = upto - self.dropped;
                self.entries.drain(..gone);
                self.entry_seqs.drain(..gone.min(self.entry_seqs.len()));
                self.dropped = upto;
                self.compacted = Some((upto, summary));
            }
            Event::SessionPaused { reason, budget } => {
                self.paused = Some(reason);
                self.budget_paused = budget;
            }
            // The crashed process's turn goes on: nothing changes.
            Event::SessionResumed {
                after_crash: true, ..
            } => {}
            Event::SessionResumed { extend_budget, .. } => {
                self.turn_driven = false;
                self.paused = None;
                self.budget_paused = false;
                self.failed = None;
                self.cut_off_in_a_row = 0;
                self.turn_opened = self.turn_opened.next(seq, true);
                if extend_budget {
                    self.turn = TurnSpend::default();
                }
            }
            Event::SessionFinished {
                outcome: SessionOutcome::Failed(error),
            } => self.failed = Some(error),
            Event::SessionFinished {
                outcome: SessionOutcome::Cancelled { by },
            } => {
                self.paused = None;
                self.failed = None;
                self.cancelled = Some(by);
                // Nothing runs until a new message: the waiting ones are
                // dropped (the log keeps them).
                self.mailbox.clear();
            }
            Event::WakeScheduled {
                call_id,
                at_ms,
                event,
                deadline_ms,
            } => self.update_call(seq, &call_id, |c| {
                c.phase = CallPhase::Sleeping(Wake {
                    at_ms,
                    event,
                    deadline_ms,
                })
            }),
            // Its ToolFinished, in the same append, finishes the call.
            Event::Woken { .. } => {}
            Event::McpToolsChanged { server, changes } => {
                self.mcp_changes.insert(server, changes);
            }
            Event::SessionErased { reason, by } => self.erased = Some((by, reason)),
            // A signature vouches for the log; it changes no state.
            Event::HeadSigned { .. } => {}
            Event::ScheduledBy { schedule, tick_ms } => {
                self.scheduled_by = Some(crate::schedule::ScheduledBy { schedule, tick_ms })
            }
            // A schedule's, the registry of tenants' or a ledger's own
            // log; no session holds these.
            Event::ScheduleCreated { .. }
            | Event::ScheduleFired { .. }
            | Event::ScheduleSkipped { .. }
            | Event::ScheduleRemoved { .. }
            | Event::TenantAdded { .. }
            | Event::TenantTokenIssued { .. }
            | Event::TenantTokensRevoked { .. }
            | Event::TenantLimitsSet { .. }
            | Event::TenantErased { .. }
            | Event::SpendReserved { .. }
            | Event::SpendSettled { .. } => {}
            Event::McpToolsRefreshed { server, tools, .. } => {
                self.spec = self
                    .spec
                    .take()
                    .map(|spec| spec.with_mcp_tools(&server, &tools));
                self.mcp_changes.remove(&server);
            }
        }
    }

    /// Remembers the first start of a call of an agent tool (its child's
    /// id derives from its key).
    fn note_agent_call(&mut self, seq: u64, tool: &str, call_id: &str, key: &str) {
        let is_agent = (self.spec.as_ref())
            .and_then(|spec| spec.tool(tool))
            .is_some_and(|t| t.kind == crate::spec::ToolKind::Agent);
        let known = self.agent_calls.iter().any(|c| c.idempotency_key == key);
        if is_agent && !known {
            self.agent_calls.push(AgentCall {
                seq,
                call_id: call_id.to_string(),
                idempotency_key: key.to_string(),
            });
        }
    }

    /// Counts a finished child's spending: into the tree's totals, and
    /// into the turn's budgets (model requests and cost), so a parent's
    /// limits hold for the tree.
    fn count_child(&mut self, child: &Totals) {
        self.subagents.merge(child);
        self.turn.steps = self.turn.steps.saturating_add(child.model_calls);
        self.turn.cost += child.cost;
    }

    /// This session's children, in the order their calls started, given
    /// this session's id (ids derive from it: see
    /// [`crate::event::child_session_id`]).
    pub fn children(&self, id: uuid::Uuid) -> Vec<SessionLink> {
        (self.agent_calls.iter())
            .map(|c| SessionLink {
                session: crate::event::child_session_id(id, &c.idempotency_key),
                seq: c.seq,
                call_id: c.call_id.clone(),
            })
            .collect()
    }

    /// What the session and every finished child under it spent.
    pub fn tree_totals(&self) -> Totals {
        let mut totals = self.totals;
        totals.merge(&self.subagents);
        totals
    }

    /// What the model is told of a denied call: who denied it, or that its
    /// approval expired (after the tool's `approval_timeout`).
    fn denial(&self, call_id: &str, by: &str, reason: Option<&str>) -> String {
        match reason {
            None => format!("denied by {by}"),
            Some(EXPIRED) => {
                let tool = (self.open_calls().iter())
                    .find(|c| c.call.id == call_id)
                    .and_then(|c| self.spec.as_ref()?.tool(&c.call.name));
                match tool.and_then(|t| t.approval_timeout()) {
                    Some(timeout) => format!(
                        "denied ({EXPIRED} after {}: nobody approved it in time)",
                        crate::spec::window(timeout)
                    ),
                    None => format!("denied ({EXPIRED}: nobody approved it in time)"),
                }
            }
            Some(reason) => format!("denied by {by} ({reason})"),
        }
    }

    /// Tool events always belong to the latest reply: a new model request is
    /// only made once every call of the previous reply has an outcome.
    fn update_call(&mut self, seq: u64, call_id: &str, change: impl FnOnce(&mut CallState)) {
        let call = match self.entries.last_mut() {
            Some(Entry::Reply { calls, .. }) => calls.iter_mut().find(|c| c.call.id == call_id),
            _ => None,
        };
        match call {
            Some(call) => change(call),
            None => self
                .anomalies
                .push((seq, format!("tool event for unknown call {call_id:?}"))),
        }
    }

    /// The calls of the latest reply, if the latest entry is a reply.
    pub fn open_calls(&self) -> &[CallState] {
        match self.entries.last() {
            Some(Entry::Reply { calls, .. }) => calls,
            _ => &[],
        }
    }

    /// Calls of the latest reply in doubt, waiting for a person's
    /// decision.
    pub fn calls_in_doubt(&self) -> Vec<Waiting> {
        self.open_calls()
            .iter()
            .filter_map(|c| match &c.phase {
                CallPhase::InDoubt(reason) => Some(Waiting::on(c, reason, self.spec.as_ref())),
                _ => None,
            })
            .collect()
    }

    /// Calls of the latest reply waiting for a person's approval.
    pub fn calls_awaiting_approval(&self) -> Vec<Waiting> {
        self.open_calls()
            .iter()
            .filter(|c| c.phase == CallPhase::AwaitingApproval)
            .map(|c| Waiting::on(c, APPROVAL_REQUIRED, self.spec.as_ref()))
            .collect()
    }

    /// Calls of the latest reply waiting for approval whose deadline is at
    /// or before `now_ms` (milliseconds since the Unix epoch): what an
    /// expiry denies.
    pub fn approvals_expired(&self, now_ms: i64) -> Vec<String> {
        self.open_calls()
            .iter()
            .filter(|c| c.approval_expired(now_ms))
            .map(|c| c.call.id.clone())
            .collect()
    }

    /// The earliest deadline of the calls waiting for approval, if any has
    /// one (milliseconds since the Unix epoch).
    pub fn approval_deadline_ms(&self) -> Option<i64> {
        self.open_calls()
            .iter()
            .filter(|c| c.phase == CallPhase::AwaitingApproval)
            .filter_map(|c| c.approval_expires_at_ms)
            .min()
    }

    /// The sleeping calls of the latest reply, with their wakes.
    pub fn sleeping_calls(&self) -> Vec<(&str, &Wake)> {
        (self.open_calls().iter())
            .filter_map(|c| match &c.phase {
                CallPhase::Sleeping(wake) => Some((c.call.id.as_str(), wake)),
                _ => None,
            })
            .collect()
    }

    /// Whether the turn sleeps: a call sleeps and every other call of the
    /// reply has finished (or sleeps too). Messages that arrive meanwhile
    /// wait for it to wake.
    pub fn sleeps(&self) -> bool {
        let calls = self.open_calls();
        calls
            .iter()
            .any(|c| matches!(c.phase, CallPhase::Sleeping(_)))
            && (calls.iter())
                .all(|c| matches!(c.phase, CallPhase::Sleeping(_) | CallPhase::Finished(_)))
    }

    /// The event a sleeping call waits for, if one does.
    pub fn awaited_event(&self) -> Option<&str> {
        (self.sleeping_calls().into_iter()).find_map(|(_, wake)| wake.event.as_deref())
    }

    /// The earliest time a sleeping call wakes on its own (its timer or
    /// its deadline), while the session sleeps (not while a person's pause,
    /// a cancel or an erasure holds it).
    pub fn next_wake_ms(&self) -> Option<i64> {
        if self.status() != Status::Sleeping {
            return None;
        }
        (self.sleeping_calls().iter())
            .filter_map(|(_, wake)| wake.due_at_ms())
            .min()
    }

    /// The earliest time something of the session falls due on its own: a
    /// wait for approval's deadline, or a sleeping call's wake.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        [self.approval_deadline_ms(), self.next_wake_ms()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether a call waits for a person: one in doubt (a decision) or one
    /// waiting for an approval. The one answer to "which calls wait for a
    /// person"; [`SessionState::calls_in_doubt`] and
    /// [`SessionState::calls_awaiting_approval`] list them.
    pub fn a_call_waits_for_a_person(&self) -> bool {
        self.open_calls()
            .iter()
            .any(|c| matches!(c.phase, CallPhase::InDoubt(_) | CallPhase::AwaitingApproval))
    }

    /// Whether the session waits for a person: it is paused and a call waits
    /// for one, or it spent a budget (only a resume that extends it
    /// continues it, never recovery or a resume of every session).
    pub fn waits_for_a_person(&self) -> bool {
        self.status() == Status::Paused && (self.budget_paused || self.a_call_waits_for_a_person())
    }

    /// Whether the session has pending work that no person has to decide
    /// on, so a resume of every session takes it up: see
    /// [`Status::resumable`].
    pub fn resumable(&self) -> bool {
        self.status().resumable(self.waits_for_a_person())
    }

    /// Seq of the latest reply, if the latest entry is a reply.
    pub fn latest_reply_seq(&self) -> Option<u64> {
        match self.entries.last() {
            Some(Entry::Reply { seq, .. }) => Some(*seq),
            _ => None,
        }
    }

    /// Entries a compaction could replace by a summary now: all but the last
    /// two (the exchange under way stays verbatim), and the seqs of the
    /// events they span. `None` when there is nothing new to compact.
    pub fn compactable(&self) -> Option<(usize, (u64, u64))> {
        self.compactable_keeping(2)
    }

    /// Entries a compaction could replace by a summary keeping only the
    /// newest `keep` verbatim (after a server said the prompt exceeds its
    /// context, the newest but one go too), and the seqs they span.
    pub fn compactable_keeping(&self, keep: usize) -> Option<(usize, (u64, u64))> {
        let kept = self.entries.len().checked_sub(keep).filter(|&k| k > 0)?;
        let first = *self.entry_seqs.first()?;
        let last = self.entry_seqs.get(kept)?.saturating_sub(1);
        Some((self.dropped + kept, (first, last)))
    }

    /// The latest request size the server counted: (its bytes, its prompt
    /// tokens).
    fn counted_request(&self) -> Option<(u64, u64)> {
        self.entries.iter().rev().find_map(|e| match e {
            Entry::Reply { reply, .. }
                if reply.request_bytes > 0 && reply.usage.prompt_tokens > 0 =>
            {
                Some((reply.request_bytes, reply.usage.prompt_tokens))
            }
            _ => None,
        })
    }

    /// Bytes a token is for this session's model and template, as the
    /// server last counted; [`FALLBACK_BYTES_PER_TOKEN`] before it has.
    pub fn bytes_per_token(&self) -> f64 {
        self.counted_request()
            .map_or(FALLBACK_BYTES_PER_TOKEN as f64, |(bytes, tokens)| {
                bytes as f64 / tokens as f64
            })
    }

    /// How many tokens a request body of `bytes` bytes is: the prompt
    /// tokens the server counted for the latest request it counted, plus
    /// the bytes since at [`SessionState::bytes_per_token`] (a smaller
    /// request, after a compaction, is all at that rate).
    pub fn estimate_tokens(&self, bytes: u64) -> u64 {
        let per_token = self.bytes_per_token();
        match self.counted_request() {
            Some((seen_bytes, seen_tokens)) if bytes >= seen_bytes => {
                seen_tokens.saturating_add(((bytes - seen_bytes) as f64 / per_token).ceil() as u64)
            }
            _ => (bytes as f64 / per_token).ceil() as u64,
        }
    }

    /// The answer of the last turn, if the last entry is a reply without
    /// calls that mneme did not refuse.
    pub fn answer(&self) -> Option<&str> {
        match self.entries.last() {
            Some(Entry::Reply { reply, calls, .. })
                if calls.is_empty() && reply.refused.is_none() =>
            {
                Some(reply.content.as_deref().unwrap_or(""))
            }
            _ => None,
        }
    }

    /// Whether the current turn was opened by a record this fork copied
    /// from its parent (a fork at a user message): nobody asked this
    /// session for that turn, so only a person's resume starts it.
    pub fn turn_opened_in_its_copy(&self) -> bool {
        let opened = self.turn_opened.seq;
        // A fork at `at` holds its parent's records 1..=at as its 2..=at+1.
        self.forked_from
            .is_some_and(|(_, at)| opened != 0 && opened <= at + 1)
    }

    /// Whether the token limit cut the last reply off.
    pub fn last_reply_cut_off(&self) -> bool {
        matches!(self.entries.last(), Some(Entry::Reply { reply, .. }) if reply.cut_off())
    }

    /// Why a message of `text` cannot be taken, if it alone would not fit
    /// in the model's context window (at [`SessionState::bytes_per_token`]):
    /// the newest entries are never compacted, so once recorded it would
    /// make every later request fail.
    pub fn past_the_window(&self, text: &str) -> Option<String> {
        let window = self.spec.as_ref().and_then(|s| s.model.context_window)?;
        let bytes = serde_json::to_string(text).map_or(text.len(), |t| t.len()) as u64;
        let tokens = (bytes as f64 / self.bytes_per_token()).ceil() as u64;
        (tokens > window).then(|| {
            format!(
                "the message is {} bytes, about {tokens} tokens, more than the model's context \
                 window of {window} tokens (context_window): it was not recorded; send it in parts",
                text.len()
            )
        })
    }

    /// A user's message opens a turn: whatever stopped the last one is
    /// over, and the budgets of a turn start again.
    fn open_turn_with(&mut self, seq: u64, text: String) {
        self.paused = None;
        self.budget_paused = false;
        self.failed = None;
        self.cancelled = None;
        self.turn = TurnSpend::default();
        self.turn_opened = self.turn_opened.next(seq, false);
        self.turn_driven = false;
        self.cut_off_in_a_row = 0;
        self.entries.push(Entry::User(text));
        self.entry_seqs.push(seq);
    }

    /// Whether messages that arrived mid-turn are due now: the turn is
    /// answered, or one of them interrupts and no call of the last reply
    /// is still open.
    pub fn delivery_due(&self) -> bool {
        if self.mailbox.is_empty() {
            return false;
        }
        let interrupts = self.mailbox.iter().any(|m| m.interrupt);
        self.answer().is_some()
            || (interrupts
                && self
                    .open_calls()
                    .iter()
                    .all(|c| matches!(c.phase, CallPhase::Finished(_))))
    }

    /// Coarse status, derived from the state.
    pub fn status(&self) -> Status {
        if self.spec.is_none() {
            return Status::Empty;
        }
        if self.erased.is_some() {
            return Status::Erased;
        }
        if self.cancelled.is_some() {
            return Status::Cancelled;
        }
        if self.failed.is_some() {
            return Status::Failed;
        }
        if self.paused.is_some() || self.a_call_waits_for_a_person() {
            return Status::Paused;
        }
        if self.sleeps() {
            return Status::Sleeping;
        }
        match self.entries.last() {
            _ if !self.mailbox.is_empty() => Status::Running,
            None => Status::Idle,
            Some(_) if self.answer().is_some() => Status::Idle,
            Some(_) => Status::Running,
        }
    }
}
