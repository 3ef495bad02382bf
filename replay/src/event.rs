//! The events of an agent session, and their encoding in the log.

use crate::spec::{AgentSpec, Effect};
use serde::{Deserialize, Serialize};

/// The newest version of the event schema this build writes (each event
/// is written with the version it needs: [`Event::schema`]). Older
/// versions are read; newer ones are refused with
/// [`DecodeError::UnknownSchema`].
pub const EVENT_SCHEMA: u16 = 11;

/// One thing that happened in a session. Immutable once appended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// A signed statement that this session's record `seq` had hash `hash`
    /// at `at_ms`: made with a key kept outside the store, so a history
    /// rewritten and chained again no longer matches it.
    HeadSigned {
        /// The seq of the record signed for.
        seq: u64,
        /// Its hash (hex).
        hash: String,
        /// When it was signed (milliseconds since the Unix epoch).
        at_ms: i64,
        /// The ed25519 public key that signed (hex).
        key: String,
        /// The signature (hex) of `runtime::signing::statement`.
        signature: String,
    },
    /// This session began as a branch of another's first `at_seq` events:
    /// shared (`shared`: they are the parent's own records, read through
    /// the log, and precede this event at `at_seq + 1`), or, as forks were
    /// made before, copied after this event at seq 1.
    SessionForked {
        /// The session it was forked from.
        parent: uuid::Uuid,
        /// The last seq of the parent it holds.
        at_seq: u64,
        /// This session re-runs the parent's user messages on another spec
        /// (`mneme rerun`; then `at_seq` is 0): its calls are answered
        /// from the parent's record where one matches.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rerun: Option<crate::rerun::RerunOf>,
        /// The parent's events are shared, not copied: they precede this
        /// event, which is the fork's first of its own.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        shared: bool,
    },
    /// The session began with this agent spec.
    SessionStarted {
        /// The spec as it was at the start.
        spec: Box<AgentSpec>,
        /// The tenant it belongs to (absent: the operator's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<Tenancy>,
    },
    /// A person said something.
    UserMessage {
        /// What they said.
        text: String,
    },
    /// The model answered a request.
    ModelReplied(ModelReply),
    /// A tool call is about to run.
    ToolStarted {
        /// The model's id of the call.
        call_id: String,
        /// The tool.
        tool: String,
        /// Arguments, exactly as the model sent them.
        args: String,
        /// The tool's declared effect.
        effect: Effect,
        /// Key the tool receives; the same on every attempt.
        idempotency_key: String,
        /// 1 for the first run, 2 for the first re-run, ...
        attempt: u32,
    },
    /// A tool call ended.
    ToolFinished {
        /// The model's id of the call.
        call_id: String,
        /// What it returned.
        outcome: ToolOutcome,
        /// How long it ran.
        duration_ms: u64,
        /// The outcome is what the tool's check answered for an attempt
        /// interrupted in flight (it had applied), not what a run returned.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        settled_by_check: bool,
        /// In a rerun, the call did not run: its outcome is the original's
        /// record, or says it was not run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rerun: Option<crate::rerun::RerunAnswer>,
        /// The call ran a child session (a tool of kind `agent`): which,
        /// and what the child's tree spent, counted here once into this
        /// session's totals.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        child: Option<Box<ChildRun>>,
    },
    /// A call started but its outcome is unknown and it is unsafe to run again.
    ToolInDoubt {
        /// The model's id of the call.
        call_id: String,
        /// Why it is in doubt.
        reason: String,
    },
    /// A person decided what to do with a call in doubt.
    ToolResolved {
        /// The model's id of the call.
        call_id: String,
        /// The decision.
        resolution: Resolution,
        /// Who decided.
        by: String,
    },
    /// A call of a tool that requires approval waits for a person.
    ApprovalRequested {
        /// The model's id of the call.
        call_id: String,
        /// When the wait ends, in milliseconds since the Unix epoch: the
        /// request's time plus the tool's `approval_timeout` (absent: no
        /// limit). Past it, the call is denied as [`EXPIRED`] the next time
        /// the session is looked at.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at_ms: Option<i64>,
    },
    /// A person approved or denied a call (or mneme denied it, its approval
    /// having expired).
    ApprovalDecided {
        /// The model's id of the call.
        call_id: String,
        /// Whether it may run.
        approved: bool,
        /// Who decided.
        by: String,
        /// Why it was denied, when mneme says: [`EXPIRED`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Arguments the person approved in place of the model's (a JSON
        /// text): the tool runs with these, and the model is told.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args: Option<String>,
    },
    /// The prompt's oldest entries were replaced by a summary (the log keeps
    /// them all; only the prompt is compacted).
    ContextCompacted {
        /// How many entries of the conversation the summary stands for, from
        /// the first.
        entries: u64,
        /// Seqs of the first and last events they cover.
        covers: (u64, u64),
        /// The model's summary of them.
        summary: String,
    },
    /// The session stopped until someone resumes it.
    SessionPaused {
        /// Why.
        reason: String,
        /// The turn ran out of one of its budgets (`[limits]`): only a
        /// resume that extends the budget continues it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        budget: bool,
    },
    /// Someone resumed a paused or failed session, or one whose process
    /// died in the middle of a turn.
    SessionResumed {
        /// Who or what resumed it.
        by: String,
        /// The turn's budgets start again from here (`resume --extend`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        extend_budget: bool,
        /// The process running the turn died (the turn was running, and
        /// nothing ran it): the same turn goes on from here, so the fold
        /// opens no new turn and the prompt is unchanged. Recorded so the
        /// log shows the crash instead of a silent gap.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        after_crash: bool,
    },
    /// The session ended.
    SessionFinished {
        /// How.
        outcome: SessionOutcome,
    },
    /// The session runs with this spec from here on (a fork given another
    /// agent: another model, prompt or tools).
    SpecChanged {
        /// The spec, as the session started it would have been recorded.
        spec: Box<AgentSpec>,
        /// Who asked.
        by: String,
    },
    /// The session's content was erased on request: its key was destroyed,
    /// so the personal fields of every event (see
    /// [`Event::personal_fields_mut`]) read as [`ERASED`] from here on.
    /// Nothing runs in the session again.
    SessionErased {
        /// Why (a request, a retention window).
        reason: String,
        /// Who asked.
        by: String,
    },
    /// The tool's check was asked whether an attempt interrupted in
    /// flight had applied (see `ToolSpec::check`). Applied: a
    /// `ToolFinished` settled by the check follows in the same append.
    /// Not applied: the call runs again with the same key. Unknown: it is
    /// in doubt, as without a check.
    ToolChecked {
        /// The model's id of the call.
        call_id: String,
        /// The attempt checked.
        attempt: u32,
        /// What the check answered.
        answer: CheckAnswer,
        /// How long the check took.
        duration_ms: u64,
        /// Applied: the result the check gave, as it gave it (the
        /// `ToolFinished` that follows tells the model it came from the
        /// check).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answered: Option<String>,
    },
    /// A person's message arrived while a turn ran; the agent's
    /// `mid_turn_messages` decided what it does. A queued or interrupting
    /// message waits in the session's mailbox, outside the prompt, until a
    /// `MidTurnDelivered` names it; a rejected one is recorded only.
    MidTurnMessage {
        /// What they said.
        text: String,
        /// What the agent does with it.
        policy: crate::spec::MidTurn,
    },
    /// The waiting message recorded at seq `arrived` enters the
    /// conversation here, as a user message, and opens a new turn.
    MidTurnDelivered {
        /// The seq of its `MidTurnMessage`.
        arrived: u64,
    },
    /// This session is a sub-agent: a call of its parent's agent tool
    /// started it (recorded with its start, in the same append).
    SpawnedBy {
        /// The parent session.
        parent: uuid::Uuid,
        /// The seq of the parent's `ToolStarted` that started it.
        seq: u64,
        /// The parent's call.
        call_id: String,
    },
    /// A call of a tool of kind `sleep` put the session to sleep (recorded
    /// with the call's `ToolStarted`, in the same append): nothing runs it
    /// until it is woken, at `at_ms`, by `event`, or at `deadline_ms`.
    WakeScheduled {
        /// The model's id of the call.
        call_id: String,
        /// The wake for a timer (milliseconds since the Unix epoch).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ms: Option<i64>,
        /// The name of the event it waits for (`mneme wake --event`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        event: Option<String>,
        /// When a wait for an event ends without it (milliseconds since
        /// the Unix epoch); absent: no limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<i64>,
    },
    /// A sleeping call woke; its `ToolFinished` (telling the model when and
    /// why) follows in the same append, and the turn goes on.
    Woken {
        /// The model's id of the call.
        call_id: String,
        /// What woke it.
        by: WokenBy,
        /// The event's payload (a JSON text), for a wake by an event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<String>,
        /// How long after its time it woke (a wake due while nothing ran
        /// the store fires once, late), in milliseconds.
        #[serde(default, skip_serializing_if = "is_zero")]
        late_ms: u64,
    },
    /// An MCP server now lists tools other than the ones the session
    /// pinned. Reported only: the session goes on with what it pinned.
    McpToolsChanged {
        /// The server (its `[[mcp]]` name).
        server: String,
        /// What differs, one line each.
        changes: Vec<String>,
    },
    /// The session adopted an MCP server's current tools on request
    /// (`run --refresh-tools`): its prompts offer these from here on.
    McpToolsRefreshed {
        /// The server (its `[[mcp]]` name).
        server: String,
        /// The tools now pinned for it.
        tools: Vec<crate::spec::ToolSpec>,
        /// What differs from the ones pinned before, one line each.
        changes: Vec<String>,
        /// Who asked.
        by: String,
    },
    /// This session was started, or its next turn's message sent, by a
    /// schedule's firing (recorded in the same append as that message).
    ScheduledBy {
        /// The schedule.
        schedule: uuid::Uuid,
        /// The tick the firing was for (milliseconds since the Unix epoch).
        tick_ms: i64,
    },
    /// A schedule was created: the first record of a schedule's own log
    /// (a schedule's log holds only the four `Schedule*` kinds).
    ScheduleCreated {
        /// What it does.
        schedule: Box<crate::schedule::ScheduleSpec>,
    },
    /// A schedule fired for a tick: it starts (or messages) `session`,
    /// whose record names the schedule and the tick (`ScheduledBy`).
    ScheduleFired {
        /// The tick (milliseconds since the Unix epoch).
        tick_ms: i64,
        /// The session started or messaged.
        session: uuid::Uuid,
    },
    /// A run of a schedule's ticks did not fire.
    ScheduleSkipped {
        /// The first of them (milliseconds since the Unix epoch).
        from_ms: i64,
        /// The last of them.
        to_ms: i64,
        /// How many.
        ticks: u64,
        /// Why.
        reason: crate::schedule::SkipReason,
    },
    /// A schedule was removed: it fires no more.
    ScheduleRemoved {
        /// Who removed it.
        by: String,
    },
    /// A tenant was added: the first record of a tenant's entry in the
    /// registry of tenants (a log of its own holding only the `Tenant*`
    /// kinds; see [`crate::tenant`]).
    TenantAdded {
        /// Its name ([`crate::tenant::check_name`]).
        name: String,
        /// The slot of the store's key store that holds its key, which
        /// wraps the keys of its sessions.
        key: uuid::Uuid,
        /// The salt of its sessions' prompt caches (hex), sent as
        /// `cache_salt`.
        cache_salt: String,
        /// Who added it.
        by: String,
    },
    /// A token of a tenant was issued: the SHA-256 of the token (hex),
    /// never the token.
    TenantTokenIssued {
        /// The tenant.
        tenant: String,
        /// SHA-256 of the token, hex.
        digest: String,
        /// Who issued it.
        by: String,
    },
    /// Every token of a tenant issued before was revoked.
    TenantTokensRevoked {
        /// The tenant.
        tenant: String,
        /// Who revoked them.
        by: String,
    },
    /// A tenant's limits are these from here on.
    TenantLimitsSet {
        /// The tenant.
        tenant: String,
        /// Its limits, whole.
        limits: crate::tenant::TenantLimits,
        /// Who set them.
        by: String,
    },
    /// A tenant was erased: its key destroyed (every session of it
    /// unreadable at once), its tokens revoked; its name is not given
    /// again.
    TenantErased {
        /// The tenant.
        tenant: String,
        /// Why.
        reason: String,
        /// Who asked.
        by: String,
    },
    /// The worst case of one model request of `session` was reserved
    /// against the cap of this ledger (a log of its own per cap and UTC
    /// day, holding only the `Spend*` kinds; see [`crate::spend`]).
    SpendReserved {
        /// The session whose request it is.
        session: uuid::Uuid,
        /// The worst-case cost reserved.
        cost: f64,
        /// The cap it was reserved against.
        cap: f64,
    },
    /// The reservation recorded at seq `reserved` of this ledger was
    /// settled by what the request really cost (0 for a request that got
    /// no reply).
    SpendSettled {
        /// The seq of its `SpendReserved`.
        reserved: u64,
        /// The real cost.
        cost: f64,
    },
}

/// The tenant a session belongs to, as its start records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenancy {
    /// The tenant's name.
    pub name: String,
    /// The tenant's prompt-cache salt, sent as `cache_salt` with the
    /// session's chat-completions requests (vLLM's prefix-cache
    /// isolation), unless the spec turns it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    /// The key store's slot of the tenant's key, which wraps the session's
    /// key (with encryption at rest): destroying it erases every session
    /// of the tenant at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<uuid::Uuid>,
}

/// A child session's run, as its parent's call records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildRun {
    /// The child session.
    pub session: uuid::Uuid,
    /// What the child (and its own children) spent, as its fold counts it.
    pub totals: crate::state::Totals,
}

/// What the model sent back for one request.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelReply {
    /// Assistant text, if any.
    pub content: Option<String>,
    /// The reasoning the server returned beside the text
    /// (`reasoning_content`), exactly as received; sent back or not by
    /// the spec's [`crate::spec::Reasoning`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Anthropic's `thinking` and `redacted_thinking` blocks, each the
    /// block's JSON as received (signature and all), in order: sent back
    /// unchanged at the head of the assistant turn they came with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinking: Vec<String>,
    /// Where each of `thinking`'s blocks stood among the reply's other
    /// blocks: how many of those sent back with it (its text, if any, then
    /// its calls) came before it, so thinking interleaved with tool calls
    /// goes back in the order it came. Empty: every block at the head.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinking_at: Vec<u32>,
    /// The Responses API's output items, each the item's JSON as received
    /// (reasoning with its id and `encrypted_content`, messages with their
    /// `phase`, function calls), in the response's order: sent back in
    /// that order in the `input` of every later request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<String>,
    /// Tool calls, in the model's order.
    pub tool_calls: Vec<ToolCall>,
    /// Token usage the server reported.
    pub usage: Usage,
    /// Why the model stopped (as the server said it).
    pub finish_reason: String,
    /// Time from request to reply.
    pub latency_ms: u64,
    /// SHA-256 of the request body, hex: which request this reply answers.
    #[serde(default)]
    pub request_digest: String,
    /// Chained SHA-256 of the request's stable prefix (system prompt, any
    /// summary, every message but the newest entry's), hex. It extends from
    /// one request to the next; where it does not, the prefix changed (a
    /// compaction), and a server's prefix cache misses from there.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix_digest: String,
    /// Bytes of the request body this reply answers: with `usage`, how many
    /// bytes a token is for this session's model and template.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub request_bytes: u64,
    /// Milliseconds from the request to the first token of a streamed
    /// reply (0: not streamed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_token_ms: u64,
    /// Why mneme did not act on this reply (it made more tool calls than
    /// allowed, say): none of its calls run, and the next request tells the
    /// model why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The reason of a denial mneme records when a call's approval was not
/// given before its deadline (`approval_timeout`).
pub const EXPIRED: &str = "expired";

/// Who an expired approval is denied by.
pub const EXPIRY_BY: &str = "mneme";

/// What a personal field of an erased session reads as.
pub const ERASED: &str = "[erased]";

/// The `finish_reason` of a reply the token limit cut off.
pub const CUT_OFF: &str = "length";

impl ModelReply {
    /// Whether the token limit cut this reply off (`finish_reason` length).
    pub fn cut_off(&self) -> bool {
        self.finish_reason == CUT_OFF
    }

    /// Whether mneme refused this reply because the token limit cut it
    /// off: in the middle of its tool calls, or while it still thought.
    pub fn cut_off_refused(&self) -> bool {
        self.cut_off() && self.refused.is_some()
    }

    /// Whether the token limit cut this reply off while it still thought,
    /// before it answered or called a tool: its thinking, unfinished, is
    /// never sent back.
    pub fn cut_off_thinking(&self) -> bool {
        self.cut_off_refused() && self.tool_calls.is_empty() && !self.thinking.is_empty()
    }
}

/// One tool call in a model reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for the call.
    pub id: String,
    /// The tool's name; `unknown_tool_<i>` (its place in the reply) for a
    /// tool the spec does not have (see [`ToolCall::invented`]).
    pub name: String,
    /// Arguments as a JSON text, exactly as received.
    pub arguments: String,
    /// The name the model gave a tool the spec does not have. A model can
    /// make one of anything it read, so it is kept here, with the content
    /// (encrypted at rest, erased with it, out of content-off traces),
    /// and not as the call's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invented: Option<String>,
}

impl ToolCall {
    /// The tool's name as the model sent it: what the conversation repeats
    /// to it.
    pub fn sent_name(&self) -> &str {
        self.invented.as_deref().unwrap_or(&self.name)
    }
}

/// Names each call of `calls` to a tool that `known` does not know
/// `unknown_tool_<i>`, keeping the model's name as its
/// [`ToolCall::invented`].
pub fn set_invented_names_aside(calls: &mut [ToolCall], known: impl Fn(&str) -> bool) {
    for (i, call) in calls.iter_mut().enumerate() {
        if call.invented.is_none() && !known(&call.name) {
            let invented = std::mem::replace(&mut call.name, format!("unknown_tool_{i}"));
            call.invented = Some(invented);
        }
    }
}

/// Token usage of one model request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Prompt tokens served from the server's prefix cache.
    pub cached_tokens: u64,
    /// Prompt tokens written to the server's cache by this request, where
    /// the server says (Anthropic's `cache_creation_input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Completion tokens the model spent reasoning (counted in
    /// `completion_tokens` too), where the server says (the Responses
    /// API's `output_tokens_details.reasoning_tokens`, chat completions'
    /// `completion_tokens_details.reasoning_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
}

/// What woke a sleeping call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WokenBy {
    /// Its time came.
    Timer,
    /// The event it waited for was delivered.
    Event,
    /// It waited for an event until its deadline, which came first.
    Deadline,
}

impl std::fmt::Display for WokenBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WokenBy::Timer => "timer",
            WokenBy::Event => "event",
            WokenBy::Deadline => "deadline",
        })
    }
}

/// The outcome of a tool call as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToolOutcome {
    /// It returned this output (JSON where it parses, else text).
    Ok(String),
    /// It failed with this message.
    Err(String),
}

/// What a tool's check answered about an interrupted attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckAnswer {
    /// Its effect happened (the result is the call's outcome).
    Applied,
    /// Its effect did not happen: the call may run again with its key.
    NotApplied,
    /// The check could not tell (why): the call is in doubt.
    Unknown(String),
}

/// A person's decision on a call in doubt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resolution {
    /// Run it again (the person accepts the risk of a duplicate).
    Retry,
    /// Do not run it; give the model this result (JSON).
    Skip(String),
    /// Do not run it; tell the model it failed with this message.
    Fail(String),
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionOutcome {
    /// A turn failed with this error; `resume` may try again.
    Failed(String),
    /// Someone cancelled the session; only a new user message reopens it.
    Cancelled {
        /// Who cancelled it.
        by: String,
    },
}

/// Why stored bytes are not an event this build can use.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Written by a newer mneme.
    #[error("event schema version {found} is newer than this build's {EVENT_SCHEMA}")]
    UnknownSchema {
        /// The version found.
        found: u16,
    },
    /// Not a valid event.
    #[error("event does not decode: {0}")]
    Malformed(String),
}

impl Event {
    /// The name of every kind of event, as stored in envelopes.
    pub const KINDS: &'static [&'static str] = &[
        "SessionForked",
        "SessionStarted",
        "UserMessage",
        "ModelReplied",
        "ToolStarted",
        "ToolFinished",
        "ToolInDoubt",
        "ToolResolved",
        "ApprovalRequested",
        "ApprovalDecided",
        "ContextCompacted",
        "SessionPaused",
        "SessionResumed",
        "SessionFinished",
        "McpToolsChanged",
        "McpToolsRefreshed",
        "SpecChanged",
        "HeadSigned",
        "SessionErased",
        "ToolChecked",
        "MidTurnMessage",
        "MidTurnDelivered",
        "SpawnedBy",
        "WakeScheduled",
        "Woken",
        "ScheduledBy",
        "ScheduleCreated",
        "ScheduleFired",
        "ScheduleSkipped",
        "ScheduleRemoved",
        "TenantAdded",
        "TenantTokenIssued",
        "TenantTokensRevoked",
        "TenantLimitsSet",
        "TenantErased",
        "SpendReserved",
        "SpendSettled",
    ];

    /// The name of this kind of event, as stored in the envelope.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::SessionForked { .. } => "SessionForked",
            Event::SessionStarted { .. } => "SessionStarted",
            Event::UserMessage { .. } => "UserMessage",
            Event::ModelReplied(_) => "ModelReplied",
            Event::ToolStarted { .. } => "ToolStarted",
            Event::ToolFinished { .. } => "ToolFinished",
            Event::ToolInDoubt { .. } => "ToolInDoubt",
            Event::ToolResolved { .. } => "ToolResolved",
            Event::ApprovalRequested { .. } => "ApprovalRequested",
            Event::ApprovalDecided { .. } => "ApprovalDecided",
            Event::ContextCompacted { .. } => "ContextCompacted",
            Event::SessionPaused { .. } => "SessionPaused",
            Event::SessionResumed { .. } => "SessionResumed",
            Event::HeadSigned { .. } => "HeadSigned",
            Event::SessionFinished { .. } => "SessionFinished",
            Event::McpToolsChanged { .. } => "McpToolsChanged",
            Event::McpToolsRefreshed { .. } => "McpToolsRefreshed",
            Event::SpecChanged { .. } => "SpecChanged",
            Event::SessionErased { .. } => "SessionErased",
            Event::ToolChecked { .. } => "ToolChecked",
            Event::MidTurnMessage { .. } => "MidTurnMessage",
            Event::MidTurnDelivered { .. } => "MidTurnDelivered",
            Event::SpawnedBy { .. } => "SpawnedBy",
            Event::WakeScheduled { .. } => "WakeScheduled",
            Event::Woken { .. } => "Woken",
            Event::ScheduledBy { .. } => "ScheduledBy",
            Event::ScheduleCreated { .. } => "ScheduleCreated",
            Event::ScheduleFired { .. } => "ScheduleFired",
            Event::ScheduleSkipped { .. } => "ScheduleSkipped",
            Event::ScheduleRemoved { .. } => "ScheduleRemoved",
            Event::TenantAdded { .. } => "TenantAdded",
            Event::TenantTokenIssued { .. } => "TenantTokenIssued",
            Event::TenantTokensRevoked { .. } => "TenantTokensRevoked",
            Event::TenantLimitsSet { .. } => "TenantLimitsSet",
            Event::TenantErased { .. } => "TenantErased",
            Event::SpendReserved { .. } => "SpendReserved",
            Event::SpendSettled { .. } => "SpendSettled",
        }
    }

    /// The fields of this event that hold what people and tools said: user
    /// messages, the model's text and call arguments, tool results,
    /// arguments and results given by a person, summaries, and failure
    /// messages (which may quote a server). In a fixed order for each kind, so a list of
    /// values taken from an event can be put back into its outline.
    /// Everything else (kinds, ids, names, effects, idempotency keys,
    /// tokens, times, the agent spec) is what operating a session needs.
    pub fn personal_fields_mut(&mut self) -> Vec<&mut String> {
        match self {
            Event::UserMessage { text } | Event::MidTurnMessage { text, .. } => vec![text],
            Event::ModelReplied(reply) => {
                let calls = reply.tool_calls.iter_mut();
                let (arguments, invented): (Vec<_>, Vec<_>) = calls
                    .map(|c| (&mut c.arguments, c.invented.as_mut()))
                    .unzip();
                (reply.content.iter_mut())
                    .chain(reply.reasoning.iter_mut())
                    .chain(reply.thinking.iter_mut())
                    .chain(reply.items.iter_mut())
                    .chain(arguments)
                    .chain(invented.into_iter().flatten())
                    .collect()
            }
            Event::ToolStarted { args, .. }
            | Event::Woken {
                payload: Some(args),
                ..
            } => vec![args],
            Event::ApprovalDecided {
                args: Some(args), ..
            } => vec![args],
            Event::ToolFinished { outcome, .. } => match outcome {
                ToolOutcome::Ok(text) | ToolOutcome::Err(text) => vec![text],
            },
            Event::ToolResolved { resolution, .. } => match resolution {
                Resolution::Skip(text) | Resolution::Fail(text) => vec![text],
                Resolution::Retry => vec![],
            },
            Event::ContextCompacted { summary, .. } => vec![summary],
            Event::ScheduleCreated { schedule } => vec![&mut schedule.message],
            Event::ToolChecked {
                answer, answered, ..
            } => {
                let why = match answer {
                    CheckAnswer::Unknown(why) => Some(why),
                    CheckAnswer::Applied | CheckAnswer::NotApplied => None,
                };
                why.into_iter().chain(answered.as_mut()).collect()
            }
            Event::SessionFinished {
                outcome: SessionOutcome::Failed(error),
            } => vec![error],
            _ => vec![],
        }
    }

    /// The schema version this event is written with: the lowest that
    /// holds what it uses. 2 added an approval's deadline, the reason of a
    /// denial and a person's edited arguments; 3 added messages that arrive
    /// mid-turn (their two events, and a spec's `mid_turn_messages`), a
    /// rerun's link, and a call a rerun answered from the record or did not
    /// run; 4 added sub-agents: a spec with a tool of kind `agent`, a
    /// child's `SpawnedBy`, a call's finish naming its child; 5 a tool name
    /// the model invented, set aside as content; 6 durable sleep (a spec
    /// with a tool of kind `sleep`, `WakeScheduled`, `Woken`); 7 schedules
    /// (their log's four kinds, a session's `ScheduledBy`); 8 a reply's
    /// reasoning or thinking blocks, and a spec's `reasoning` rule or
    /// thinking budget; 9 where thinking blocks stood among a reply's
    /// calls, a spec's `interleaved_thinking`, and the Responses API (a
    /// reply's output items, a spec with `provider = "openai-responses"`);
    /// 10 a fork that shares its parent's records instead of copying them.
    /// 11 tenants and spend caps (a session's or a schedule's tenant, the
    /// registry of tenants, the ledgers of caps, a spec's
    /// `max_cost_per_day` or `cache_salt`).
    /// A build that
    /// reads only older versions then refuses such an event by name instead
    /// of misreading it (it would run a call with the model's arguments
    /// where a person gave others, drop a waiting message, resume a rerun
    /// with its side effects live, or start a child twice); every other
    /// event stays readable by it.
    pub fn schema(&self) -> u16 {
        match self {
            Event::SessionStarted {
                tenant: Some(_), ..
            }
            | Event::TenantAdded { .. }
            | Event::TenantTokenIssued { .. }
            | Event::TenantTokensRevoked { .. }
            | Event::TenantLimitsSet { .. }
            | Event::TenantErased { .. }
            | Event::SpendReserved { .. }
            | Event::SpendSettled { .. } => 11,
            Event::ScheduleCreated { schedule } if schedule.tenant.is_some() => 11,
            Event::SessionStarted { spec, .. } | Event::SpecChanged { spec, .. }
                if spec.limits.max_cost_per_day.is_some() || spec.model.cache_salt.is_some() =>
            {
                11
            }
            Event::SessionForked { shared: true, .. } => 10,
            Event::ModelReplied(reply)
                if !reply.thinking_at.is_empty() || !reply.items.is_empty() =>
            {
                9
            }
            Event::SessionStarted { spec, .. } | Event::SpecChanged { spec, .. }
                if spec.model.interleaved_thinking || spec.model.is_responses() =>
            {
                9
            }
            Event::ModelReplied(reply)
                if reply.reasoning.is_some() || !reply.thinking.is_empty() =>
            {
                8
            }
            Event::SessionStarted { spec, .. } | Event::SpecChanged { spec, .. }
                if spec.model.reasoning != crate::spec::Reasoning::default()
                    || spec.model.thinking_budget_tokens.is_some() =>
            {
                8
            }
            Event::ScheduledBy { .. }
            | Event::ScheduleCreated { .. }
            | Event::ScheduleFired { .. }
            | Event::ScheduleSkipped { .. }
            | Event::ScheduleRemoved { .. } => 7,
            Event::WakeScheduled { .. } | Event::Woken { .. } => 6,
            Event::SessionStarted { spec, .. } | Event::SpecChanged { spec, .. }
                if spec.has_sleep_tools() =>
            {
                6
            }
            Event::ModelReplied(reply) if reply.tool_calls.iter().any(|c| c.invented.is_some()) => {
                5
            }
            Event::SessionStarted { spec, .. } | Event::SpecChanged { spec, .. }
                if spec.has_agent_tools() =>
            {
                4
            }
            Event::SpawnedBy { .. } | Event::ToolFinished { child: Some(_), .. } => 4,
            Event::SessionForked { rerun: Some(_), .. }
            | Event::ToolFinished { rerun: Some(_), .. } => 3,
            Event::ApprovalRequested {
                expires_at_ms: Some(_),
                ..
            } => 2,
            Event::ApprovalDecided { reason, args, .. } if reason.is_some() || args.is_some() => 2,
            Event::MidTurnMessage { .. } | Event::MidTurnDelivered { .. } => 3,
            Event::SessionStarted { spec, .. } | Event::SpecChanged { spec, .. }
                if spec.mid_turn_messages != crate::spec::MidTurn::default()
                    || spec.limits.max_waiting_messages.is_some() =>
            {
                3
            }
            _ => 1,
        }
    }

    /// MessagePack with named fields.
    pub fn encode(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("events always encode")
    }

    /// Decodes a payload written with schema version `schema`.
    pub fn decode(schema: u16, bytes: &[u8]) -> Result<Event, DecodeError> {
        if schema > EVENT_SCHEMA {
            return Err(DecodeError::UnknownSchema { found: schema });
        }
        rmp_serde::from_slice(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))
    }
}

/// Gives every call of a reply a safe, distinct id, deterministically. Ids
/// come from the model server: one that is not 1 to 64 ASCII letters,
/// digits, `_` or `-` (empty, a path, a flag, a terminal sequence) becomes
/// `call_<index>`; a repeated one gets `_<index>` appended. Results are
/// matched to calls by id, and ids appear in URLs, commands and terminals.
pub fn normalize_call_ids(calls: &mut [ToolCall]) {
    let mut seen = std::collections::HashSet::new();
    for (index, call) in calls.iter_mut().enumerate() {
        if !crate::spec::is_safe_name(&call.id) {
            call.id = format!("call_{index}");
        }
        if seen.contains(&call.id) {
            let suffixed = format!("{}_{index}", call.id);
            let fallbacks = (0..).map(|k| match k {
                0 => format!("call_{index}"),
                k => format!("call_{index}_{k}"),
            });
            call.id = std::iter::once(suffixed)
                .chain(fallbacks)
                .find(|id| crate::spec::is_safe_name(id) && !seen.contains(id))
                .expect("an unused id exists");
        }
        seen.insert(call.id.clone());
    }
}

/// The idempotency key of a call: the same on every attempt, restart and
/// machine, and distinct across sessions and across replies of one session
/// (some servers reuse call ids such as `call_0` in every reply).
pub fn idempotency_key(session: uuid::Uuid, reply_seq: u64, call_id: &str) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(session.as_bytes());
    hasher.update(reply_seq.to_be_bytes());
    hasher.update(call_id.as_bytes());
    format!("mneme-{}", &hex(&hasher.finalize())[..32])
}

/// The id of the child session a call of an agent tool runs: derived from
/// the parent session and the call's idempotency key (SHA-256, as a UUID
/// of version 8), so every attempt, restart and machine finds the same
/// child, and no two calls share one.
pub fn child_session_id(parent: uuid::Uuid, idempotency_key: &str) -> uuid::Uuid {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"mneme-subagent\0");
    hasher.update(parent.as_bytes());
    hasher.update(idempotency_key.as_bytes());
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// SHA-256 of `bytes`, as 64 lower-case hex digits.
pub fn digest_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}

/// `bytes` as lower-case hex digits.
pub(crate) fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}
