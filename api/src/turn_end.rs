//! How a drive of a session ended, as both faces tell it.

use replay::Waiting;

/// How a drive of a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEnd {
    /// The model answered; nothing is pending.
    Answered(String),
    /// The model answered, but the token limit cut the answer off.
    CutOffAnswer(String),
    /// Calls are in doubt: a person must decide (`mneme resolve`).
    NeedsDecision(Vec<Waiting>),
    /// Calls wait for approval (`mneme approve`).
    NeedsApproval(Vec<Waiting>),
    /// Paused for another reason.
    Paused(String),
    /// The turn spent a budget of the agent's `[limits]`: paused until a
    /// resume extends the budget (`mneme resume ID --extend`).
    BudgetSpent(String),
    /// The last turn failed earlier; resume it explicitly.
    Failed(String),
    /// Cancelled (by whom); a new message reopens it.
    Cancelled(String),
    /// A call of a tool of kind `sleep` sleeps: the turn goes on when it
    /// wakes (a daemon wakes it; `mneme resume` does after its time).
    Sleeping {
        /// When it wakes on its own (milliseconds since the Unix epoch):
        /// its timer, or the deadline of its wait for an event.
        wakes_at_ms: Option<i64>,
        /// The event it waits for (`mneme wake --event`).
        event: Option<String>,
    },
}
