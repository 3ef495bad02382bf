//! The resume plan: what a process must do next, decided from the state alone.

use crate::event::CheckAnswer;
use crate::state::{CallPhase, CallState, SessionState};

/// What to do with one call of the latest reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallDecision {
    /// It finished: reuse the recorded outcome, never run it again.
    Reuse,
    /// It never started: run it (attempt 1).
    Run,
    /// It started but did not finish, and running it again with the same
    /// idempotency key is safe (or a person chose to retry it).
    Rerun,
    /// It started but did not finish, and a re-run could repeat a side
    /// effect: record it as in doubt and pause. The reason says why.
    InDoubt(String),
    /// It is already in doubt: a person must decide (`mneme resolve`).
    AwaitingDecision(String),
    /// Its tool requires approval: record the request and wait.
    NeedsApproval,
    /// Approval was requested: a person must approve or deny it.
    AwaitingApproval,
    /// A call of a tool of kind `sleep` sleeps: it waits for its time or
    /// its event.
    Sleeping,
    /// It started but did not finish, a re-run could repeat a side effect,
    /// and its tool declares a check: ask the check whether it applied,
    /// and record the answer.
    Check,
}

/// The plan for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPlan {
    /// The model's id of the call.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// What to do.
    pub decision: CallDecision,
}

/// What the session needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    /// Nothing: the last turn is answered (or nothing was asked yet).
    Nothing,
    /// Ask the model (a missing reply is simply requested again).
    CallModel,
    /// Messages that arrived mid-turn are due (see
    /// `SessionState::delivery_due`): record their delivery, which opens a
    /// new turn, then go on.
    Deliver,
    /// Run or re-run the calls marked so; record the ones in doubt.
    RunTools,
    /// Only calls waiting for a person's decision remain.
    AwaitDecision,
    /// Only sleeping calls remain: nothing runs until one wakes.
    Sleep,
    /// Paused by someone or something; resuming it is an explicit act.
    Paused(String),
    /// The last turn failed; resuming it is an explicit act.
    Failed(String),
    /// Cancelled (by whom): nothing runs until a new user message.
    Cancelled(String),
    /// Its content was erased (by whom): nothing runs in it again.
    Erased(String),
    /// The next step would exceed a budget of the turn (`[limits]`): record
    /// a budget pause; only a resume that extends the budget continues.
    OverBudget(String),
}

/// The resume plan of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePlan {
    /// What to do next.
    pub next: NextStep,
    /// Decisions for the calls of the latest reply, in the model's order.
    pub calls: Vec<CallPlan>,
}

/// Decides what to do next. A finished call is always reused, never re-run.
pub fn plan(state: &SessionState) -> ResumePlan {
    let calls: Vec<CallPlan> = state
        .open_calls()
        .iter()
        .map(|c| CallPlan {
            call_id: c.call.id.clone(),
            tool: c.call.name.clone(),
            decision: decide(state, c),
        })
        .collect();
    let next = if let Some((by, _)) = &state.erased {
        NextStep::Erased(by.clone())
    } else if let Some(by) = &state.cancelled {
        NextStep::Cancelled(by.clone())
    } else if let Some(error) = &state.failed {
        NextStep::Failed(error.clone())
    } else if let Some(reason) = &state.paused {
        NextStep::Paused(reason.clone())
    } else if state.delivery_due() {
        NextStep::Deliver
    } else if state.entries.is_empty() || state.answer().is_some() {
        NextStep::Nothing
    } else if calls.iter().all(|c| c.decision == CallDecision::Reuse) {
        match over_budget(state, BudgetCheck::ModelRequest) {
            Some(reason) => NextStep::OverBudget(reason),
            None => NextStep::CallModel,
        }
    } else if calls
        .iter()
        .any(|c| matches!(c.decision, CallDecision::Run | CallDecision::Rerun))
    {
        match over_budget(state, BudgetCheck::ToolCalls) {
            Some(reason) => NextStep::OverBudget(reason),
            None => NextStep::RunTools,
        }
    } else if calls.iter().any(|c| {
        matches!(
            c.decision,
            CallDecision::Run
                | CallDecision::Rerun
                | CallDecision::InDoubt(_)
                | CallDecision::NeedsApproval
                | CallDecision::Check
        )
    }) {
        NextStep::RunTools
    } else if state.sleeps() {
        NextStep::Sleep
    } else {
        NextStep::AwaitDecision
    };
    ResumePlan { next, calls }
}

/// What is about to happen, for the budget check.
enum BudgetCheck {
    ModelRequest,
    ToolCalls,
}

/// Why the turn may not take its next step, if a budget of the spec's
/// `[limits]` is spent.
fn over_budget(state: &SessionState, next: BudgetCheck) -> Option<String> {
    let limits = state.spec.as_ref()?.limits;
    let spent = &state.turn;
    match next {
        BudgetCheck::ModelRequest if spent.steps >= limits.steps_per_turn() => Some(format!(
            "budget: {} model requests this turn reached max_steps_per_turn = {}",
            spent.steps,
            limits.steps_per_turn()
        )),
        BudgetCheck::ModelRequest => limits
            .max_cost_per_turn
            .filter(|&max| spent.cost >= max)
            .map(|max| {
                format!(
                    "budget: this turn's model requests cost {:.4}, reaching max_cost_per_turn = {max}",
                    spent.cost
                )
            }),
        BudgetCheck::ToolCalls => limits
            .max_tool_calls_per_turn
            .filter(|&max| spent.tool_calls > max)
            .map(|max| {
                format!(
                    "budget: the model made {} tool calls this turn, more than max_tool_calls_per_turn = {max}",
                    spent.tool_calls
                )
            }),
    }
}

fn decide(state: &SessionState, call: &CallState) -> CallDecision {
    let tool = call.call.name.as_str();
    let attempts = call.attempts;
    let spec = state.spec.as_ref().and_then(|s| s.tool(tool));
    match &call.phase {
        CallPhase::Pending if spec.is_some_and(|t| t.requires_approval) && !call.approved => {
            CallDecision::NeedsApproval
        }
        CallPhase::AwaitingApproval => CallDecision::AwaitingApproval,
        CallPhase::Sleeping(_) => CallDecision::Sleeping,
        CallPhase::Pending => CallDecision::Run,
        CallPhase::Finished(_) => CallDecision::Reuse,
        CallPhase::RetryApproved => CallDecision::Rerun,
        CallPhase::InDoubt(reason) => CallDecision::AwaitingDecision(reason.clone()),
        CallPhase::Started if spec.is_some_and(|s| !s.safe_to_rerun() && s.has_check()) => {
            CallDecision::Check
        }
        CallPhase::Checked(CheckAnswer::NotApplied) => CallDecision::Rerun,
        CallPhase::Checked(CheckAnswer::Applied) => CallDecision::Check,
        CallPhase::Checked(CheckAnswer::Unknown(why)) => CallDecision::InDoubt(format!(
            "attempt {attempts} of {tool} started but never finished, and its check could not \
             tell whether it applied ({why}); running it again could repeat its effect"
        )),
        CallPhase::Started => match spec {
            Some(spec) if spec.safe_to_rerun() => CallDecision::Rerun,
            Some(spec) => CallDecision::InDoubt(format!(
                "attempt {attempts} of {tool} started but never finished; {tool} has effect \
                 {} and does not honour idempotency keys, so running it again could repeat \
                 its effect",
                spec.effect
            )),
            None => CallDecision::InDoubt(format!(
                "attempt {attempts} of {tool} started but never finished, and {tool} is not \
                 in the session's spec"
            )),
        },
    }
}
