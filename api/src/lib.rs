//! The daemon's HTTP API as types: every request and response body the
//! daemon's handlers take and give, shared with the CLI's client of a
//! daemon. The OpenAPI document served at `/openapi.json` is generated from
//! these types and the handlers' annotations (`daemon::api`); nothing else
//! describes the API. Also what both faces show people: how a turn ended
//! ([`TurnEnd`]) and events described in a line ([`describe`]).
//!
//! Architecture invariant: this crate knows the events (`replay`) and
//! nothing of how sessions run or are stored; it does no I/O.

pub mod describe;
mod schedules;
mod tenants;
mod turn_end;

pub use schedules::{CreateSchedule, LastFiring, ScheduleCreated, ScheduleView, ScheduledByView};
pub use tenants::{
    CreateTenant, EraseTenant, NotErased, SetTenant, SpendBy, SpendQuery, SpendReport, SpendRow,
    TenantErased, TenantToken, TenantView, TokensRevoked,
};
pub use turn_end::TurnEnd;

/// A time (milliseconds since the Unix epoch) as the API and the CLI show
/// it: RFC 3339, UTC, milliseconds.
pub fn format_time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| format!("{ms}ms"))
}
use replay::{AgentSpec, Waiting};
use serde::{Deserialize, Serialize};
use serde_json::Value;
#[cfg(feature = "openapi")]
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// Every error the API answers, whatever its status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ApiError {
    /// What went wrong, naming what was asked.
    pub error: String,
}

/// A session's status, as the API and `--json` output name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    /// Nothing recorded yet.
    Empty,
    /// Work is pending: the model or a tool must run.
    Running,
    /// The last turn was answered; waiting for a user message.
    Idle,
    /// Stopped until someone resumes it or decides on a call.
    Paused,
    /// The last turn failed; resuming tries again.
    Failed,
    /// Cancelled; a new user message reopens it.
    Cancelled,
    /// A call sleeps until its time or its event; nothing runs it until
    /// then.
    Sleeping,
    /// Its content was erased; nothing runs in it again.
    Erased,
    /// Its log could not be read (only in a listing, with the error).
    Unreadable,
}

impl SessionStatus {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Empty => "empty",
            SessionStatus::Running => "running",
            SessionStatus::Idle => "idle",
            SessionStatus::Paused => "paused",
            SessionStatus::Failed => "failed",
            SessionStatus::Cancelled => "cancelled",
            SessionStatus::Sleeping => "sleeping",
            SessionStatus::Erased => "erased",
            SessionStatus::Unreadable => "unreadable",
        }
    }
}

impl std::fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SessionStatus {
    type Err = String;

    fn from_str(text: &str) -> Result<SessionStatus, String> {
        serde_json::from_value(Value::String(text.into()))
            .map_err(|_| format!("unknown session status {text:?}"))
    }
}

impl From<replay::Status> for SessionStatus {
    fn from(status: replay::Status) -> SessionStatus {
        match status {
            replay::Status::Empty => SessionStatus::Empty,
            replay::Status::Running => SessionStatus::Running,
            replay::Status::Idle => SessionStatus::Idle,
            replay::Status::Paused => SessionStatus::Paused,
            replay::Status::Failed => SessionStatus::Failed,
            replay::Status::Cancelled => SessionStatus::Cancelled,
            replay::Status::Sleeping => SessionStatus::Sleeping,
            replay::Status::Erased => SessionStatus::Erased,
        }
    }
}

/// `/health`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Health {
    /// Always `ok`.
    pub status: String,
}

/// `/`'s answer: where to go from here.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Index {
    /// `mneme`, and its version.
    pub service: String,
    /// The API's OpenAPI document (needs the token).
    pub openapi: String,
    /// The web view (`mneme ui` signs a browser in).
    pub web_view: String,
    /// Liveness, without a token.
    pub health: String,
}

/// Which sessions a listing shows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct ListQuery {
    /// Only sessions with this status.
    pub status: Option<SessionStatus>,
    /// Only sessions of this agent.
    pub agent: Option<String>,
    /// Only sessions of this tenant (a tenant's token sees only its own
    /// anyway).
    pub tenant: Option<String>,
}

/// A new session, from a named agent file of the daemon's agents directory
/// or from a spec: exactly one of the two. (An agent file may also be sent
/// as the body itself, with `Content-Type: application/toml`.)
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// The name of a file (`NAME.toml`) in the daemon's agents directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// An agent spec, as an agent file's TOML would read as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub spec: Option<AgentSpec>,
    /// The first user message, recorded in the same append as the start (a
    /// crash leaves both or neither). Its turn runs on
    /// `POST /sessions/{id}/resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_message: Option<String>,
}

/// A session just created.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Created {
    /// Its id.
    pub session: Uuid,
}

/// A user message.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PostMessage {
    /// The message.
    pub text: String,
    /// Answer when the turn ends (200, its outcome) rather than once the
    /// message is recorded (202).
    #[serde(default)]
    pub wait: bool,
    /// First adopt the tools each MCP server lists now (recorded, with what
    /// changed); without it the session keeps the tools it pinned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refresh_tools: bool,
}

/// A message recorded; its turn runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct MessageAccepted {
    /// The session.
    pub session: Uuid,
    /// The seq of the recorded message.
    pub seq: u64,
    /// Set when it arrived while a turn ran: what the agent does with it
    /// (`queue`: it opens a turn once the running one is answered;
    /// `interrupt`: the running turn takes it at its next step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mid_turn: Option<String>,
}

/// How to resume a session (the body is optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// Answer when the turn ends.
    #[serde(default)]
    pub wait: bool,
    /// Start the turn's spent budget again (recorded).
    #[serde(default)]
    pub extend: bool,
}

/// A resume started.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Resuming {
    /// The session.
    pub session: Uuid,
    /// Always true.
    pub resuming: bool,
}

/// An event for a sleeping session (`POST /sessions/{id}/wake`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Wake {
    /// The event's name: the call sleeping until it wakes.
    pub event: String,
    /// What the event carries (any JSON, within the sleeping tool's
    /// `max_output_bytes`): recorded, and given to the model in the call's
    /// result.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub payload: Value,
    /// Answer when the turn that goes on ends.
    #[serde(default)]
    pub wait: bool,
}

/// A sleeping call woken by an event; its turn goes on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Woke {
    /// The session.
    pub session: Uuid,
    /// The call it woke.
    pub woke: String,
}

/// A pause asked for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PauseRequested {
    /// The session.
    pub session: Uuid,
    /// Always true.
    pub pause_requested: bool,
    /// The daemon running the turn, when it is another one sharing the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_on: Option<String>,
}

/// Who cancels a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Cancel {
    /// Who decides (recorded).
    pub by: String,
}

/// `DELETE /sessions/{id}`'s body: erase the session's content, and by
/// default every session derived from it (its forks, reruns and
/// sub-agents, and theirs), each of which holds a copy under its own key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Erase {
    /// Why (recorded): a person's request, a retention window.
    pub reason: String,
    /// Who asks (recorded).
    pub by: String,
    /// Erase the sessions derived from it too (default). `false` erases
    /// only this one; the answer then names the derived sessions that
    /// still hold copies of its content.
    #[serde(default = "cascade_by_default")]
    #[cfg_attr(feature = "openapi", schema(default = true))]
    pub cascade: bool,
}

fn cascade_by_default() -> bool {
    true
}

/// A session whose content was erased, and what became of the sessions
/// derived from it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Erased {
    /// The session.
    pub session: Uuid,
    /// Always `erased`.
    pub status: SessionStatus,
    /// Every session this request erased: `session` first, then the
    /// derived sessions it erased with it.
    #[serde(default)]
    pub erased: Vec<Uuid>,
    /// Every session derived from `session`, transitively (a fork of its
    /// fork too), nearest first, each with what became of it.
    #[serde(default)]
    pub derived: Vec<DerivedSession>,
}

/// A session derived from an erased one, holding a copy of (part of) its
/// content under a key of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DerivedSession {
    /// The derived session.
    pub session: Uuid,
    /// The session it was derived from (the erased one, or another
    /// derived session).
    pub from: Uuid,
    /// How it was derived.
    pub link: Derivation,
    /// What this request did with it.
    pub outcome: DerivedOutcome,
    /// Why it could not be erased (`outcome` `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a session was derived from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Derivation {
    /// `mneme fork`: it began as a copy of the other's history.
    Fork,
    /// `mneme rerun`: it re-runs the other's user messages.
    Rerun,
    /// A call of the other's agent tool started it.
    SubAgent,
}

impl Derivation {
    /// How people read it: "fork", "rerun", "sub-agent".
    pub fn as_str(self) -> &'static str {
        match self {
            Derivation::Fork => "fork",
            Derivation::Rerun => "rerun",
            Derivation::SubAgent => "sub-agent",
        }
    }
}

impl std::fmt::Display for Derivation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an erasure did with a derived session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DerivedOutcome {
    /// Erased with the named session, recorded in its own `SessionErased`.
    Erased,
    /// It was erased before: skipped (a key a crash left is destroyed).
    AlreadyErased,
    /// Not erased (`cascade` `false`): it still holds a copy.
    Kept,
    /// It could not be erased (`error` says why): it still holds a copy.
    Failed,
}

/// A session cancelled.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Cancelled {
    /// The session.
    pub session: Uuid,
    /// Always `cancelled`.
    pub status: SessionStatus,
}

/// Where to fork a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Fork {
    /// How many of the parent's events the fork holds.
    pub at: u64,
    /// Run the fork with this agent spec from there on (another model,
    /// say), as an agent file's TOML would read as JSON; recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub spec: Option<AgentSpec>,
}

/// How to re-run a session (`POST /sessions/{id}/rerun`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Rerun {
    /// The agent spec to re-run it with (another model, say), as an agent
    /// file's TOML would read as JSON; recorded.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub spec: AgentSpec,
    /// Run calls no record answers even when they have side effects
    /// (default: only read-only tools run).
    #[serde(default)]
    pub live_tools: bool,
}

/// A fork made.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Forked {
    /// The new session.
    pub session: Uuid,
    /// The session it was forked from.
    pub parent: Uuid,
    /// How many of the parent's events it holds.
    pub at: u64,
}

fn yes() -> bool {
    true
}

/// A decision on a call in doubt: exactly one of `retry`, `skip` (the
/// result to record) or `fail` (a message).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Resolve {
    /// Run the call again.
    #[serde(default)]
    pub retry: bool,
    /// Record this as the call's result without running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub skip: Option<Value>,
    /// Record the call as failed with this message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail: Option<String>,
    /// Who decides (recorded).
    pub by: String,
    /// Answer when the continued turn ends.
    #[serde(default)]
    pub wait: bool,
    /// Continue the session after recording the decision.
    #[serde(default = "yes", rename = "continue")]
    #[cfg_attr(feature = "openapi", schema(default = true))]
    pub proceed: bool,
}

/// A decision on a call that waits for approval.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Approve {
    /// Approved (true) or denied (false).
    pub approved: bool,
    /// Who decides (recorded).
    pub by: String,
    /// With an approval: the arguments the tool runs with instead of the
    /// model's, as a JSON text (e.g. `"{\"cents\": 100}"`). Recorded with
    /// who gave them; the model's reply keeps its own, and the call's
    /// result tells the model. Must be JSON, no longer than the model's
    /// `max_response_bytes` (else 400, nothing recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
    /// Answer when the continued turn ends.
    #[serde(default)]
    pub wait: bool,
    /// Continue the session after recording the decision.
    #[serde(default = "yes", rename = "continue")]
    #[cfg_attr(feature = "openapi", schema(default = true))]
    pub proceed: bool,
}

/// A decision recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Decided {
    /// The session.
    pub session: Uuid,
    /// The call decided on.
    pub decided: String,
    /// Whether the session goes on (false while other calls still wait, or
    /// when asked not to continue).
    pub continuing: bool,
}

/// What a decision answers with 200: the decision recorded and the session
/// not continued, or (with `wait`) the continued turn's end.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum DecisionAnswer {
    /// The continued turn's end.
    Ended(TurnOutcome),
    /// Recorded, not continued.
    Decided(Decided),
}

/// A call that waits for a person's decision, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct InDoubtCall {
    /// The call.
    pub call_id: String,
    /// Why it is in doubt.
    pub reason: String,
    /// Its tool (empty from daemons older than this field).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool: String,
    /// Its arguments as the model gave them (empty from older daemons).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub arguments: String,
}

impl From<&Waiting> for InDoubtCall {
    fn from(w: &Waiting) -> InDoubtCall {
        InDoubtCall {
            call_id: w.call_id.clone(),
            reason: w.reason.clone(),
            tool: w.tool.clone(),
            arguments: w.arguments.clone(),
        }
    }
}

/// A call that waits for a person's approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct AwaitingCall {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool: String,
    /// Its arguments as the model gave them (empty from older daemons):
    /// what an approval lets the tool run with.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub arguments: String,
    /// Its tool's pinned description: what the model was told of the tool.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// How a turn (or a resume) ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TurnOutcome {
    /// The session.
    pub session: Uuid,
    /// `idle` (answered), `paused`, `failed` or `cancelled`.
    pub status: SessionStatus,
    /// The answer, when idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The token limit cut the answer off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_off: Option<bool>,
    /// Calls waiting for a decision (`resolve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_doubt: Option<Vec<InDoubtCall>>,
    /// Calls waiting for approval (`approve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_approval: Option<Vec<AwaitingCall>>,
    /// Why it paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The pause is a spent budget (`resume` with `extend` continues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<bool>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Who cancelled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When a sleeping session wakes on its own (UTC, milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wakes_at: Option<String>,
    /// The event a sleeping session waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_for: Option<String>,
}

impl TurnOutcome {
    /// How `end` is told.
    pub fn new(session: Uuid, end: &TurnEnd) -> TurnOutcome {
        let mut outcome = TurnOutcome {
            session,
            status: SessionStatus::Paused,
            answer: None,
            cut_off: None,
            in_doubt: None,
            awaiting_approval: None,
            reason: None,
            budget: None,
            error: None,
            by: None,
            wakes_at: None,
            waits_for: None,
        };
        match end {
            TurnEnd::Answered(answer) => {
                outcome.status = SessionStatus::Idle;
                outcome.answer = Some(answer.clone());
            }
            TurnEnd::CutOffAnswer(answer) => {
                outcome.status = SessionStatus::Idle;
                outcome.answer = Some(answer.clone());
                outcome.cut_off = Some(true);
            }
            TurnEnd::NeedsDecision(calls) => {
                outcome.in_doubt = Some(calls.iter().map(InDoubtCall::from).collect());
            }
            TurnEnd::NeedsApproval(calls) => {
                let calls = calls.iter().map(|w| AwaitingCall {
                    call_id: w.call_id.clone(),
                    tool: w.tool.clone(),
                    arguments: w.arguments.clone(),
                    description: w.description.clone(),
                });
                outcome.awaiting_approval = Some(calls.collect());
            }
            TurnEnd::Paused(reason) => outcome.reason = Some(reason.clone()),
            TurnEnd::BudgetSpent(reason) => {
                outcome.reason = Some(reason.clone());
                outcome.budget = Some(true);
            }
            TurnEnd::Failed(error) => {
                outcome.status = SessionStatus::Failed;
                outcome.error = Some(error.clone());
            }
            TurnEnd::Cancelled(by) => {
                outcome.status = SessionStatus::Cancelled;
                outcome.by = Some(by.clone());
            }
            TurnEnd::Sleeping { wakes_at_ms, event } => {
                outcome.status = SessionStatus::Sleeping;
                outcome.wakes_at = wakes_at_ms.map(format_time);
                outcome.waits_for = event.clone();
            }
        }
        outcome
    }

    /// The end it tells, if it tells one.
    pub fn end(&self) -> Option<TurnEnd> {
        let flag = |f: Option<bool>| f == Some(true);
        match self.status {
            SessionStatus::Idle if flag(self.cut_off) => {
                Some(TurnEnd::CutOffAnswer(self.answer.clone()?))
            }
            SessionStatus::Idle => Some(TurnEnd::Answered(self.answer.clone()?)),
            SessionStatus::Failed => Some(TurnEnd::Failed(self.error.clone()?)),
            SessionStatus::Cancelled => Some(TurnEnd::Cancelled(self.by.clone()?)),
            SessionStatus::Sleeping => Some(TurnEnd::Sleeping {
                wakes_at_ms: (self.wakes_at.as_deref())
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.timestamp_millis()),
                event: self.waits_for.clone(),
            }),
            SessionStatus::Paused => Some(if let Some(calls) = &self.in_doubt {
                TurnEnd::NeedsDecision(
                    (calls.iter())
                        .map(|c| Waiting {
                            call_id: c.call_id.clone(),
                            tool: c.tool.clone(),
                            reason: c.reason.clone(),
                            arguments: c.arguments.clone(),
                            description: String::new(),
                        })
                        .collect(),
                )
            } else if let Some(calls) = &self.awaiting_approval {
                TurnEnd::NeedsApproval(
                    (calls.iter())
                        .map(|c| Waiting {
                            call_id: c.call_id.clone(),
                            tool: c.tool.clone(),
                            reason: replay::APPROVAL_REQUIRED.into(),
                            arguments: c.arguments.clone(),
                            description: c.description.clone(),
                        })
                        .collect(),
                )
            } else if flag(self.budget) {
                TurnEnd::BudgetSpent(self.reason.clone()?)
            } else {
                TurnEnd::Paused(self.reason.clone()?)
            }),
            _ => None,
        }
    }
}

/// A session in a listing: status, size, activity, usage. A session whose
/// log cannot be read is listed with status `unreadable` and its `error`,
/// without the fields that need its log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionSummary {
    /// The session.
    pub session: Uuid,
    /// The tenant it belongs to (absent: the operator's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The session whose call started this one, if it is a sub-agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
    /// The session it was forked from, if it is a fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<Uuid>,
    /// The session it re-runs on another agent, if it is a rerun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<Uuid>,
    /// Its first user message (on one line, clipped): what it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its agent's name (empty when unreadable).
    pub agent: String,
    /// Its status.
    pub status: SessionStatus,
    /// For a `running` session: true when nothing runs it and a process
    /// did, and died in the middle of its turn (`mneme resume` continues
    /// it; a daemon does on its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    /// For a `running` session: true when nothing runs it and no process
    /// has recorded a step of its turn (a fork, a session created with its
    /// first message, or one whose process died before its first step was
    /// recorded): `mneme resume` (or `POST /sessions/{id}/resume`) runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<bool>,
    /// Why it could not be read, when unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Events in its log.
    pub events: u64,
    /// When it was created (UTC, milliseconds).
    pub created: String,
    /// When it last changed (UTC, milliseconds).
    pub last_activity: String,
    /// Whether a call waits for a person (a decision or an approval), or a
    /// spent budget for `resume` with `extend`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_for_a_person: Option<bool>,
    /// Whether it has pending work that no person has to decide on: what a
    /// resume of every session takes up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumable: Option<bool>,
    /// Whether the token limit cut the last answer off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_cut_off: Option<bool>,
    /// When the first wait for approval ends (UTC, RFC 3339 with
    /// milliseconds), if a call waits for approval of a tool with
    /// `approval_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_expires_at: Option<String>,
    /// When a sleeping session wakes on its own (UTC, milliseconds): its
    /// timer, or the deadline of its wait for an event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wakes_at: Option<String>,
    /// The event a sleeping session waits for (`POST /sessions/{id}/wake`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_for: Option<String>,
    /// Prompt tokens of the latest model request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_last: Option<u64>,
    /// KV-cache bytes that prompt occupies, where the spec gives the shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_bytes_last: Option<u64>,
    /// The model's context window, where the spec gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// Model requests answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_calls: Option<u64>,
    /// Prompt tokens, all requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// Completion tokens, all requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    /// Prompt tokens served from the model server's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Completion tokens spent reasoning (also in `completion_tokens`),
    /// where the model server reported any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    /// `cached_tokens / prompt_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_hit_ratio: Option<f64>,
    /// Cost, where the spec gives prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// One session: its summary, answer, calls in doubt and where it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionView {
    /// Status, size, activity, usage.
    #[serde(flatten)]
    pub summary: SessionSummary,
    /// The last turn's answer, if it was answered.
    pub answer: Option<String>,
    /// The owner of its live lease (the daemon running a turn of it), or null.
    pub running_on: Option<String>,
    /// Calls in doubt, waiting for a person's decision.
    pub in_doubt: Vec<InDoubtCall>,
    /// Every call that waits for a person, with what the model asked for.
    #[serde(default)]
    pub waiting: Vec<WaitingCall>,
    /// The call of another session that started this one (a sub-agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned_by: Option<SessionLinkView>,
    /// The sub-agent sessions its calls started, in the order they started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<SessionLinkView>,
    /// The schedule firing that started the session, or sent its latest
    /// scheduled message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_by: Option<ScheduledByView>,
}

/// A parent session's call and the child session it runs (a sub-agent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionLinkView {
    /// The other session: the parent, seen from a child; a child, seen
    /// from its parent.
    pub session: Uuid,
    /// The seq of the parent's `ToolStarted` that started the child.
    pub seq: u64,
    /// The parent's call.
    pub call_id: String,
}

impl From<replay::SessionLink> for SessionLinkView {
    fn from(link: replay::SessionLink) -> SessionLinkView {
        SessionLinkView {
            session: link.session,
            seq: link.seq,
            call_id: link.call_id,
        }
    }
}

/// A call that waits for a person: an approval, or a decision on a call in
/// doubt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WaitingCall {
    /// The call (the model's id for it).
    pub call_id: String,
    /// Its tool.
    pub tool: String,
    /// Its arguments, exactly as the model sent them.
    pub arguments: String,
    /// The tool's description as the session pinned it, which the model
    /// was shown (an MCP server's own words, for its tools): shown beside
    /// the call, so a person sees what the model was told about it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// `approval` or `decision`.
    pub waits_for: String,
    /// Why.
    pub reason: String,
    /// When an approval's wait ends (UTC, RFC 3339 with milliseconds), if
    /// its tool sets `approval_timeout`: past it, the call is denied as
    /// expired and the model told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// Which events to read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct EventsQuery {
    /// Only events of these kinds (comma-separated, e.g. `UserMessage,ModelReplied`).
    pub kind: Option<String>,
    /// Only events after this seq.
    pub after: Option<u64>,
    /// Only events up to this seq (without `follow`): with `after`, one
    /// page of a long session.
    pub until: Option<u64>,
    /// Keep the stream open as Server-Sent Events: history, then each new
    /// event once it is durable.
    #[serde(default)]
    pub follow: bool,
}

/// A stored event with its envelope and hashes. As a Server-Sent Event,
/// the event's name is its `kind` and its data this object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct EventRecord {
    /// The session.
    pub session: Uuid,
    /// Its place in the session's log, from 1.
    pub seq: u64,
    /// Its id.
    pub event_id: Uuid,
    /// When it was recorded (UTC, milliseconds).
    pub ts: String,
    /// The seq of the event that caused it.
    pub caused_by: Option<u64>,
    /// The event schema's version.
    pub schema: u16,
    /// The event's kind.
    pub kind: String,
    /// What happened, in one line for people (long texts clipped).
    #[serde(default)]
    pub summary: String,
    /// The previous record's hash (hex).
    pub prev_hash: String,
    /// This record's hash (hex).
    pub hash: String,
    /// The event.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub event: Value,
}

/// Who a web view sign-in code is for.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UiCodeRequest {
    /// The name the signed-in browser acts as (recorded as `by` of what it
    /// decides): letters, digits, spaces and `.-_@`, at most 64 characters.
    pub name: String,
}

/// A one-time code that signs a browser in to the web view.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct UiCode {
    /// Where to send the browser: `/ui/login?code=…` on this daemon.
    pub login: String,
    /// Seconds the code stays valid; it works once.
    pub expires_in_secs: u64,
}

/// Two sessions compared: how many events of history they hold alike,
/// then each side from where it parts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionDiff {
    /// Events of history both hold alike, from the first (a fork's
    /// `SessionForked` not counted).
    pub common_events: u64,
    /// The first session.
    pub a: DiffSide,
    /// The second session.
    pub b: DiffSide,
}

/// One session of a diff.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DiffSide {
    /// The session.
    pub session: Uuid,
    /// Events in its log.
    pub events: u64,
    /// The seq of its first event after the common ones (none: nothing after).
    pub diverges_at_seq: Option<u64>,
    /// Its events after the common ones.
    pub after: Vec<DiffEvent>,
    /// Its answer, if its last reply is one.
    pub answer: Option<String>,
    /// Its tool calls after the common events: `tool args`.
    pub tool_calls: Vec<String>,
    /// Prompt tokens, whole session.
    pub prompt_tokens: u64,
    /// Completion tokens, whole session.
    pub completion_tokens: u64,
    /// Cost, whole session.
    pub cost: f64,
}

/// An event of one side of a diff.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DiffEvent {
    /// Its seq.
    pub seq: u64,
    /// Its kind.
    pub kind: String,
    /// What happened, in one line.
    pub summary: String,
}

/// A recorded session re-run on another spec (`mneme rerun`): the rerun's
/// answers next to the original's, where their requests first part, and
/// what each spent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RerunReport {
    /// The recorded session.
    pub original: RerunSide,
    /// The rerun (a new session linked to the original).
    pub rerun: RerunSide,
    /// Whether calls no record answered ran live, side effects included.
    pub live_tools: bool,
    /// The first model request whose messages differ (none: every request
    /// of both holds the same messages, and both made as many).
    pub first_difference: Option<RequestDifference>,
    /// Each of the original's user messages with both answers.
    pub turns: Vec<RerunTurn>,
    /// The rerun's tool calls, by how they were answered.
    pub calls: RerunCalls,
    /// Why the rerun stopped before its last message had an answer (a turn
    /// that failed, or waits for a person): `mneme resume` continues that
    /// turn. None: every message was answered.
    pub stopped: Option<String>,
}

/// One session of a rerun's report: what it spent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RerunSide {
    /// The session.
    pub session: Uuid,
    /// Its model (as its spec names it).
    pub model: String,
    /// Model requests answered.
    pub requests: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Prompt tokens served from the server's prefix cache.
    pub cached_tokens: u64,
    /// Cached prompt tokens over prompt tokens (0 with none).
    pub cache_hit_ratio: f64,
    /// Cost in its spec's currency.
    pub cost: f64,
}

/// Where the two sessions' model requests first part. Requests are
/// compared by their messages (as chat completions carry them): the model's
/// name, limits and the session's cache key differ by design.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RequestDifference {
    /// Which request of each session, from 1.
    pub request: u64,
    /// The seq of the original's reply to it (none: it made fewer).
    pub original_seq: Option<u64>,
    /// The seq of the rerun's reply to it (none: it made fewer).
    pub rerun_seq: Option<u64>,
    /// The first message that differs, from 0 (the system prompt first).
    pub message: u64,
    /// The byte of the messages (as JSON) where they part.
    pub offset: u64,
    /// The original's messages from a little before that byte.
    pub original_bytes: String,
    /// The rerun's messages from a little before that byte.
    pub rerun_bytes: String,
}

/// One user message of a rerun, with each session's answer to it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RerunTurn {
    /// The user's message.
    pub message: String,
    /// The original's answer (none: its turn ended without one).
    pub original: Option<String>,
    /// The rerun's answer (none: its turn ended without one, or never ran).
    pub rerun: Option<String>,
}

/// A rerun's tool calls, by how they were answered.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RerunCalls {
    /// Answered from the original's record (same tool, same arguments).
    pub answered_from_record: u64,
    /// Run (read-only, or with `--live-tools`).
    pub run_live: u64,
    /// Not run: side effects with no record, in a rerun without live tools.
    pub not_run: u64,
}

/// The result of checking a session's hash chain.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Verified {
    /// The session.
    pub session: Uuid,
    /// Whether the chain holds and every event decodes.
    pub ok: bool,
    /// Events checked, when ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<u64>,
    /// The head's hash (hex), when ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// What the signed heads say, when checked against a key
    /// (`mneme verify --key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed: Option<String>,
    /// What is wrong, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What resuming would do with an open call.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PlannedCall {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool: String,
    /// `reuse`, `run`, `rerun`, `in_doubt`, `awaiting_decision`,
    /// `needs_approval` or `awaiting_approval`.
    pub decision: String,
    /// Why.
    pub reason: String,
}

/// The dry run: the next request exactly as it would be sent, its digest,
/// and what resuming would do with each open call.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ReplayView {
    /// The session.
    pub session: Uuid,
    /// Its agent's name.
    pub agent: String,
    /// Events in its log.
    pub events: u64,
    /// Its status.
    pub status: SessionStatus,
    /// For a `running` session, as its listing says: true when nothing
    /// runs it and a process did, and died in the middle of its turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    /// For a `running` session, as its listing says: true when nothing
    /// runs it and no process has recorded a step of its turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<bool>,
    /// What resuming does next, in words: which calls run, which are
    /// recorded in doubt and wait for a person, and the command a person
    /// runs then.
    pub next: String,
    /// The open calls.
    pub calls: Vec<PlannedCall>,
    /// Bytes of the next model request (0: none).
    pub request_bytes: u64,
    /// SHA-256 of the next model request (hex).
    pub request_digest: Option<String>,
    /// The next model request, if there is one.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub request: Value,
    /// The tools the session offers, with their effects and where each
    /// effect came from.
    #[serde(default)]
    pub tools: Vec<ToolView>,
    /// Per MCP server, what its list now differs in from the tools the
    /// session pinned (recorded when a turn last started it); not adopted.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub mcp_changes: std::collections::BTreeMap<String, Vec<String>>,
}

/// A session's prefix-cache misses, each explained (`mneme replay --cache`;
/// see [`replay::cache::cache_misses`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct CacheReport {
    /// The session.
    pub session: Uuid,
    /// Each reply whose cached prompt tokens fell short of what the request
    /// before it made cacheable: `seq`, `cacheable_tokens`,
    /// `cached_tokens`, `first_difference` (a byte offset) and `cause`.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub misses: Vec<replay::cache::CacheMiss>,
}

/// One tool of a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ToolView {
    /// The name the model calls it by.
    pub name: String,
    /// `http`, `command`, `native` or `mcp`.
    pub kind: String,
    /// `read_only`, `idempotent` or `side_effect`.
    pub effect: String,
    /// What decided the effect: `agent file` (its `[[tools]]` entry), or
    /// for an MCP tool `policy`, `annotation` or `server default`.
    pub effect_from: String,
    /// Whether a call interrupted mid-way may run again.
    pub safe_to_rerun: bool,
    /// Whether each call waits for a person's approval (`requires_approval`,
    /// or for an MCP tool a trusted `destructiveHint` no policy overrides).
    #[serde(default)]
    pub requires_approval: bool,
    /// How long a call waits for approval before it is denied as expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout: Option<String>,
    /// The MCP server it comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<String>,
    /// The MCP server's annotations of it, as listed (shown, not obeyed
    /// unless the server is trusted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub annotations: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_named_on_the_wire_as_before() {
        for status in [
            replay::Status::Empty,
            replay::Status::Running,
            replay::Status::Idle,
            replay::Status::Paused,
            replay::Status::Failed,
            replay::Status::Cancelled,
        ] {
            let ours = SessionStatus::from(status);
            assert_eq!(ours.to_string(), status.to_string());
            assert_eq!(serde_json::to_value(ours).unwrap(), status.to_string());
            assert_eq!(status.to_string().parse::<SessionStatus>(), Ok(ours));
        }
        assert!("lost".parse::<SessionStatus>().is_err());
    }

    #[test]
    fn every_turn_end_reads_back() {
        let waiting = |reason: &str| {
            vec![Waiting {
                call_id: "call_1".into(),
                tool: "charge".into(),
                reason: reason.into(),
                arguments: r#"{"cents":100}"#.into(),
                description: String::new(),
            }]
        };
        for end in [
            TurnEnd::Answered("a".into()),
            TurnEnd::CutOffAnswer("a".into()),
            TurnEnd::NeedsDecision(waiting("why")),
            TurnEnd::NeedsApproval(waiting(replay::APPROVAL_REQUIRED)),
            TurnEnd::Paused("p".into()),
            TurnEnd::BudgetSpent("b".into()),
            TurnEnd::Failed("f".into()),
            TurnEnd::Cancelled("c".into()),
        ] {
            let outcome = TurnOutcome::new(Uuid::nil(), &end);
            let wire = serde_json::to_string(&outcome).unwrap();
            let back: TurnOutcome = serde_json::from_str(&wire).unwrap();
            assert_eq!(back.end(), Some(end), "{wire}");
        }
    }
}
