//! What a long turn is doing, told on a terminal: each model step with its
//! tokens, each tool as it starts and ends, and a line every
//! [`STILL_EVERY`] while the model or a tool keeps it waiting. Nothing is
//! said when stderr is not a terminal (a script reads only what it asked for).
//!
//! Steps are numbered as the session's fold counts its turn's model
//! requests (what `max_steps_per_turn` limits, a sub-agent's among them),
//! so a resumed turn goes on from where its crashed process was; a call is
//! named by its tool and its id, found in the session's state when another
//! process started it.

use replay::{Event, SessionState, ToolOutcome};
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
    /// Tool of each call of the latest reply seen in this process.
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

    /// The lines `events`, appended to a session whose fold was `before`,
    /// are told with.
    fn lines_of(&self, before: &SessionState, events: &[Event]) -> Vec<String> {
        let mut steps = before.turn.steps;
        let mut lines = Vec::new();
        for event in events {
            match event {
                Event::UserMessage { .. }
                | Event::MidTurnDelivered { .. }
                | Event::SessionResumed {
                    extend_budget: true,
                    ..
                } => steps = 0,
                Event::ModelReplied(_) => steps += 1,
                _ => {}
            }
            lines.extend(self.lines(event, steps, before));
            if let Event::ToolFinished {
                child: Some(child), ..
            } = event
            {
                steps += child.totals.model_calls;
            }
        }
        lines
    }

    /// The lines `event` is told with (`step`: the turn's model requests
    /// with it), and what the turn waits for next.
    fn lines(&self, event: &Event, step: u64, before: &SessionState) -> Vec<String> {
        let mut state = self.state.lock().expect("progress lock");
        let tool_of = |state: &State, call_id: &str| {
            (state.tools.get(call_id).cloned())
                .or_else(|| {
                    (before.open_calls().iter())
                        .find(|c| c.call.id == call_id)
                        .map(|c| c.call.name.clone())
                })
                .map_or_else(
                    || format!("call {call_id}"),
                    |tool| format!("{tool} (call {call_id})"),
                )
        };
        let (lines, waiting) = match event {
            Event::ModelReplied(reply) => {
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
                        vec![format!("mneme: step {step}: answered; {tokens}")],
                        None,
                    ),
                    false => (
                        vec![format!(
                            "mneme: step {step}: calls {}; {tokens}",
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
                state.tools.insert(call_id.clone(), tool.clone());
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
                let how = match outcome {
                    ToolOutcome::Ok(_) => "finished",
                    ToolOutcome::Err(_) => "failed",
                };
                let call = tool_of(&state, call_id);
                (
                    vec![format!("mneme: {call} {how} in {duration_ms} ms")],
                    Some("the model".into()),
                )
            }
            Event::ToolInDoubt { call_id, reason } => {
                let call = tool_of(&state, call_id);
                (vec![format!("mneme: {call} is in doubt: {reason}")], None)
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
    fn appended(&self, _: &[eventlog::Record], _: &[Event]) {}

    fn appended_to(&self, before: &SessionState, _: &[eventlog::Record], events: &[Event]) {
        for line in self.lines_of(before, events) {
            say!("{line}");
        }
    }

    fn durable(&self, _: uuid::Uuid, _: u64, _: Duration) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(calls: serde_json::Value) -> Event {
        let reply: replay::ModelReply = serde_json::from_value(serde_json::json!({
            "content": null,
            "tool_calls": calls,
            "usage": {"prompt_tokens": 120, "completion_tokens": 7, "cached_tokens": 100},
            "finish_reason": "tool_calls",
            "latency_ms": 5
        }))
        .unwrap();
        Event::ModelReplied(reply)
    }

    fn finished(call_id: &str) -> Event {
        Event::ToolFinished {
            call_id: call_id.into(),
            outcome: ToolOutcome::Ok("ok".into()),
            duration_ms: 12,
            settled_by_check: false,
            rerun: None,
            child: None,
        }
    }

    #[test]
    fn steps_tools_and_waits_are_told() {
        let progress = Progress::default();
        let fresh = SessionState::default();
        let calls = serde_json::json!([{"id": "c1", "name": "charge", "arguments": "{}"}]);
        assert_eq!(
            progress.lines_of(&fresh, &[reply(calls)]),
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
            progress.lines_of(&fresh, &[started]),
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
        assert_eq!(
            progress.lines_of(&fresh, &[finished("c1")]),
            ["mneme: charge (call c1) finished in 12 ms"]
        );
    }

    #[test]
    fn a_turn_another_process_began_goes_on_with_its_steps_and_tools() {
        let spec: replay::AgentSpec = toml::from_str(
            "name = \"n\"\n[model]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\n",
        )
        .unwrap();
        let calls = serde_json::json!([{"id": "c1", "name": "save_note", "arguments": "{}"}]);
        let before = SessionState::fold([
            (
                1,
                Event::SessionStarted {
                    spec: Box::new(spec),
                    tenant: None,
                },
            ),
            (2, Event::UserMessage { text: "hi".into() }),
            (3, reply(calls.clone())),
        ]);
        // A new process: it saw neither the reply nor the call start.
        let progress = Progress::default();
        assert_eq!(
            progress.lines_of(&before, &[finished("c1")]),
            ["mneme: save_note (call c1) finished in 12 ms"]
        );
        assert_eq!(
            progress.lines_of(&before, &[reply(serde_json::json!([]))]),
            ["mneme: step 2: answered; 120 tokens in (100 cached), 7 out"]
        );
        // A new message starts the count again, in the same append or not.
        let message = Event::UserMessage {
            text: "more".into(),
        };
        assert_eq!(
            progress.lines_of(&before, &[message, reply(calls)]),
            ["mneme: step 1: calls save_note; 120 tokens in (100 cached), 7 out"]
        );
    }
}
