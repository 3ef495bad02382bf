//! The agent loop's crash points (see [`eventlog::crash`] for how to arm one).

pub use eventlog::crash::point;

/// The agent loop's crash points, in the order a turn reaches them.
pub const POINTS: &[&str] = &[
    "user_message_appended",
    "user_message_durable",
    "before_model_call",
    "model_replied_before_append",
    "model_reply_appended",
    "tool_started_appended",
    "tool_started_durable",
    "tool_returned",
    "tool_finished_appended",
    "in_doubt_appended",
    "decision_appended",
    "turn_answered",
];

/// Every crash point of the write path: the agent loop's and the log's.
pub fn all_points() -> Vec<&'static str> {
    POINTS
        .iter()
        .chain(eventlog::crash::POINTS)
        .copied()
        .collect()
}
