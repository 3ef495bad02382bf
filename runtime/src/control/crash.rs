//! The agent loop's crash points (see [`eventlog::crash`] for how to arm one).

pub use eventlog::crash::{point, CrashPoint};

/// A user message is appended, not yet durable.
pub const USER_MESSAGE_APPENDED: CrashPoint = CrashPoint::named("user_message_appended");
/// A user message is durable; the turn has not begun.
pub const USER_MESSAGE_DURABLE: CrashPoint = CrashPoint::named("user_message_durable");
/// A model request is about to be sent.
pub const BEFORE_MODEL_CALL: CrashPoint = CrashPoint::named("before_model_call");
/// The model answered; its reply is not appended.
pub const MODEL_REPLIED_BEFORE_APPEND: CrashPoint =
    CrashPoint::named("model_replied_before_append");
/// The model's reply is appended.
pub const MODEL_REPLY_APPENDED: CrashPoint = CrashPoint::named("model_reply_appended");
/// A call's ToolStarted is appended, not yet durable.
pub const TOOL_STARTED_APPENDED: CrashPoint = CrashPoint::named("tool_started_appended");
/// A call's ToolStarted is durable; the tool has not run.
pub const TOOL_STARTED_DURABLE: CrashPoint = CrashPoint::named("tool_started_durable");
/// A tool returned; its outcome is not appended.
pub const TOOL_RETURNED: CrashPoint = CrashPoint::named("tool_returned");
/// A call's outcome is appended.
pub const TOOL_FINISHED_APPENDED: CrashPoint = CrashPoint::named("tool_finished_appended");
/// A resume recorded a call in doubt (reached only after an earlier crash mid-call).
pub const IN_DOUBT_APPENDED: CrashPoint = CrashPoint::named("in_doubt_appended");
/// A person's decision (resolve or approve) is durable.
pub const DECISION_APPENDED: CrashPoint = CrashPoint::named("decision_appended");
/// A turn's answer is durable.
pub const TURN_ANSWERED: CrashPoint = CrashPoint::named("turn_answered");
/// An erasure is recorded and durable; the session's key is not destroyed.
/// Not a point of the agent loop (not in [`POINTS`]): `cli/tests/erasure.rs`
/// crashes there.
pub const ERASE_RECORDED: CrashPoint = CrashPoint::named("erase_recorded");

/// A child session (a sub-agent) answered and its answer is durable; its
/// parent's call has not recorded it. Not in [`POINTS`] (the matrix's
/// scenarios have no sub-agents): `cli/tests/subagents.rs` crashes there.
pub const SUBAGENT_ANSWERED: CrashPoint = CrashPoint::named("subagent_answered");

/// A call of a tool of kind `sleep` is durably asleep (its `WakeScheduled`
/// recorded), the turn not yet ended. In [`SLEEP_POINTS`], not in
/// [`POINTS`]: only a scenario that sleeps reaches it.
pub const WAKE_SCHEDULED_DURABLE: CrashPoint = CrashPoint::named("wake_scheduled_durable");

/// A sleeping call's `Woken` and result are durable; the turn has not gone
/// on. In [`SLEEP_POINTS`].
pub const WOKEN_DURABLE: CrashPoint = CrashPoint::named("woken_durable");

/// A schedule's firing is durable (its `ScheduleFired`); the session it
/// names is not started (or messaged) yet. Not in [`POINTS`]: a scenario
/// with a schedule reaches it (`cli/tests/schedules.rs`).
pub const SCHEDULE_FIRED: CrashPoint = CrashPoint::named("schedule_fired");

/// The crash points of a durable sleep, in the order a turn reaches them:
/// the crash matrix's sleep scenario reaches each.
pub const SLEEP_POINTS: &[CrashPoint] = &[WAKE_SCHEDULED_DURABLE, WOKEN_DURABLE];

/// The agent loop's crash points, in the order a turn reaches them.
pub const POINTS: &[CrashPoint] = &[
    USER_MESSAGE_APPENDED,
    USER_MESSAGE_DURABLE,
    BEFORE_MODEL_CALL,
    MODEL_REPLIED_BEFORE_APPEND,
    MODEL_REPLY_APPENDED,
    TOOL_STARTED_APPENDED,
    TOOL_STARTED_DURABLE,
    TOOL_RETURNED,
    TOOL_FINISHED_APPENDED,
    IN_DOUBT_APPENDED,
    DECISION_APPENDED,
    TURN_ANSWERED,
];

/// Every crash point of the write path: the agent loop's and the log's.
pub fn all_points() -> Vec<CrashPoint> {
    POINTS
        .iter()
        .chain(eventlog::crash::POINTS)
        .copied()
        .collect()
}
