//! Replay: a session's events in, its state, prompt and resume plan out.
//!
//! Pure: no I/O, no clock, no randomness. The same events always give the
//! same state, the same prompt bytes and the same plan, in any process.

pub mod anthropic;
pub mod cache;
pub mod event;
pub mod mcp;
pub mod plan;
pub mod prompt;
pub mod rerun;
pub mod responses;
pub mod schedule;
pub mod spec;
pub mod spend;
pub mod state;
pub mod tenant;

pub use event::{
    child_session_id, digest_hex, idempotency_key, CheckAnswer, ChildRun, DecodeError, Event,
    ModelReply, Resolution, SessionOutcome, Tenancy, ToolCall, ToolOutcome, Usage, WokenBy, ERASED,
    EVENT_SCHEMA, EXPIRED, EXPIRY_BY,
};
pub use plan::{plan, CallDecision, CallPlan, NextStep, ResumePlan};
pub use prompt::{
    compaction_request, messages, next_request, next_request_incremental, request_body, Message,
    PreparedRequest, RenderedPrefix,
};
pub use rerun::{Record, RerunAnswer, RerunOf, RerunState};
pub use spec::{
    AgentSpec, Effect, HttpCheck, KvShape, Limits, ModelSpec, Remaining, ToolKind, ToolSpec,
};
pub use state::{
    CallPhase, CallState, EditedArgs, Entry, SessionLink, SessionState, Status, Totals, TurnOpened,
    TurnSpend, Waiting, Wake, APPROVAL_REQUIRED, FALLBACK_BYTES_PER_TOKEN, STATE_FORMAT,
};

#[cfg(test)]
mod tests;
