//! What a long turn is doing, told on a terminal: each model step with its
//! tokens, each tool as it starts and ends, and a line every
//! [`STILL_EVERY`] while the model or a tool keeps it waiting. Nothing is
//! said when stderr is not a terminal (a script reads only what it asked for).

use replay::{Event, ToolOutcome};
use runtime::SessionObserver;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a wait that goes on is told of again.
pub const STILL_EVERY: Duration = Duration::from_secs(10);

/// Tells the person at the terminal what the turns of this process do.
#[derive(Default)]
pub struct Progress {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Model replies seen: the step number.
    steps: u64,
    /// Tool of each call of the latest reply.
    tools: HashMap<String, String>,
    /// What the turn waits for, since when, and when that was last said.
    waiting: Option<(String, Instant, Instant)>,
}

impl Progress {
    /// A [`Progress`] if stderr is a terminal, telling of waits as they
    /// go on (the ticker lives as long as the value).
    pub fn on_terminal() -> Option<Arc<Progress>> {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return None;
        }
        let progress = Arc::new(Progress::default());
        let ticking = Arc::downgrade(&progress);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(progress) = ticking.upgrade() else {
                    return;
                };
                if let Some(line) = progress.still() {
                    say!("{line}");
                }
            }
        });
        Some(progress)
    }

    /// The line for a wait that has gone on another [`STILL_EVERY`], if any.
    fn still(&self) -> Option<String> {
        let mut state = self.state.lock().expect("progress lock");
        let (what, since, said) = state.waiting.as_mut()?;
        if said.elapsed() < STILL_EVERY {
            return None;
        }
        *said = Instant::now();
        Some(format!(
            "mneme: still waiting for {what} ({} s)",
            since.elapsed().as_secs()
        ))
    }

    /// The lines `event` is told with, and what the turn waits for next.
    fn lines(&self, event: &Event) -> Vec<String> {
        let mut state = self.state.lock().expect("progress lock");
        let (lines, waiting) = match event {
            Event::ModelReplied(reply) => {
                state.steps += 1;
                state.tools = (reply.tool_calls.iter())
                    .map(|c| (c.id.clone(), c.name.clone()))
                    .collect();
                let u = &reply.usage;
                let tokens = format!(
                    "{} tokens in ({} cached), {} out",
                    u.prompt_tokens, u.cached_tokens, u.completion_tokens
                );
                let names: Vec<&str> = reply.tool_calls.iter().map(|c| c.name.as_str()).collect();
                match names.is_empty() {
                    true => (
                        vec![format!("mneme: step {}: answered; {tokens}", state.steps)],
                        None,
                    ),
                    false => (
                        vec![format!(
                            "mneme: step {}: calls {}; {tokens}",
                            state.steps,
                            names.join(", ")
                        )],
                        None,
                    ),
                }
            }
            Event::ToolStarted {
                tool,
                attempt,
                call_id,
                ..
            } => {
                let again = match attempt {
                    1 => String::new(),
                    n => format!(", attempt {n}"),
                };
                (
                    vec![format!("mneme: running {tool} (call {call_id}{again})")],
                    Some(format!("{tool} to finish")),
                )
            }
            Event::ToolFinished {
                call_id,
                outcome,
                duration_ms,
                ..
            } => {
                let tool = state
                    .tools
                    .get(call_id)
                    .cloned()
                    .unwrap_or_else(|| call_id.clone());
                let how = match outcome {
                    ToolOutcome::Ok(_) => "finished",
                    ToolOutcome::Err(_) => "failed",
                };
                (
                    vec![format!("mneme: {tool} {how} in {duration_ms} ms")],
                    Some("the model".into()),
                )
            }
            Event::ToolInDoubt { call_id, reason } => {
                let tool = state
                    .tools
                    .get(call_id)
                    .cloned()
                    .unwrap_or_else(|| call_id.clone());
                (vec![format!("mneme: {tool} is in doubt: {reason}")], None)
            }
            Event::UserMessage { .. }
            | Event::SessionResumed { .. }
            | Event::MidTurnDelivered { .. } => (vec![], Some("the model".into())),
            Event::SessionPaused { .. }
            | Event::SessionFinished { .. }
            | Event::ApprovalRequested { .. } => (vec![], None),
            _ => return vec![],
        };
        state.waiting = waiting.map(|what| (what, Instant::now(), Instant::now()));
        lines
    }
}

impl SessionObserver for Progress {
    fn appended(&self, _: &[eventlog::Record], events: &[Event]) {
        for event in events {
            for line in self.lines(event) {
                say!("{line}");
            }
        }
    }

    fn durable(&self, _: uuid::Uuid, _: u64, _: Duration) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_tools_and_waits_are_told() {
        let progress = Progress::default();
        let reply: replay::ModelReply = serde_json::from_value(serde_json::json!({
            "content": null,
            "tool_calls": [{"id": "c1", "name": "charge", "arguments": "{}"}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 7, "cached_tokens": 100},
            "finish_reason": "tool_calls",
            "latency_ms": 5
        }))
        .unwrap();
        assert_eq!(
            progress.lines(&Event::ModelReplied(reply)),
            ["mneme: step 1: calls charge; 120 tokens in (100 cached), 7 out"]
        );
        let started = Event::ToolStarted {
            call_id: "c1".into(),
            tool: "charge".into(),
            args: "{}".into(),
            effect: replay::Effect::SideEffect,
            idempotency_key: "k".into(),
            attempt: 2,
        };
        assert_eq!(
            progress.lines(&started),
            ["mneme: running charge (call c1, attempt 2)"]
        );
        assert_eq!(progress.still(), None, "not yet");
        {
            let mut state = progress.state.lock().unwrap();
            let (_, since, said) = state.waiting.as_mut().unwrap();
            *since -= STILL_EVERY * 3;
            *said -= STILL_EVERY;
        }
        assert_eq!(
            progress.still().as_deref(),
            Some("mneme: still waiting for charge to finish (30 s)")
        );
        assert_eq!(progress.still(), None, "said once per wait period");
    }
}
