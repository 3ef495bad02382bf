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
}
