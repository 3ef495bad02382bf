//! A recorded session re-run on another spec (`mneme rerun`): the record
//! a rerun's calls are answered from, and the report that compares the
//! two sessions: where their model requests first part, the answers side
//! by side, tokens, cost and cache hit ratios, and how the rerun's calls
//! were answered. Starting a rerun is `Service::start_rerun`; its calls are
//! answered by the runner (`replay::Record::answer`).

use crate::api::{RequestDifference, RerunCalls, RerunReport, RerunSide, RerunTurn};
use crate::diff::Events;
use crate::error::RuntimeError;
use crate::session::read_events;
use eventlog::EventLog;
use replay::{Event, Record, RerunAnswer, RerunState, SessionState, Status};
use uuid::Uuid;

/// The recorded calls of the session `rerun` re-runs, up to the seq it
/// replays.
pub(crate) async fn record(log: &dyn EventLog, rerun: &RerunState) -> Result<Record, RuntimeError> {
    let events = numbered(read_events(log, rerun.of).await?);
    Ok(Record::from_events(rerun.of, events, rerun.through_seq))
}

/// The report of session `rerun`, a rerun of `original`, from the log.
pub(crate) async fn report(
    log: &dyn EventLog,
    original: Uuid,
    rerun: Uuid,
) -> Result<RerunReport, RuntimeError> {
    let left = numbered(read_events(log, original).await?);
    let right = numbered(read_events(log, rerun).await?);
    Ok(compare((original, &left), (rerun, &right)))
}

fn numbered(events: Vec<(eventlog::Record, Event)>) -> Vec<(u64, Event)> {
    events
        .into_iter()
        .map(|(record, event)| (record.envelope.seq, event))
        .collect()
}

/// Session `rerun` compared with the session it re-runs, `original`, given
/// their events. The original counts up to the seq the rerun replays.
pub(crate) fn compare(original: (Uuid, &Events), rerun: (Uuid, &Events)) -> RerunReport {
    let state = SessionState::fold(rerun.1.iter().cloned());
    let (through, live_tools) = match &state.rerun {
        Some(r) => (r.through_seq, r.live_tools),
        None => (u64::MAX, false),
    };
    let cut = original.1.partition_point(|(seq, _)| *seq <= through);
    let original_events = &original.1[..cut];
    let turns = turns(original_events, rerun.1);
    let answered = turns.iter().filter(|t| t.rerun.is_some()).count();
    let stopped = match state.status() {
        Status::Idle if answered == turns.len() => None,
        Status::Idle => Some(format!(
            "{answered} of the original's {} messages were answered",
            turns.len()
        )),
        status if state.waits_for_a_person() => Some(format!(
            "the rerun is {status}: its calls wait for a person (`mneme replay {}` lists them)",
            rerun.0
        )),
        status => Some(format!(
            "the rerun is {status}: `mneme resume {}` continues its turn",
            rerun.0
        )),
    };
    RerunReport {
        original: side(original.0, original_events),
        rerun: side(rerun.0, rerun.1),
        live_tools,
        first_difference: first_difference(original_events, rerun.1),
        turns,
        calls: calls(rerun.1),
        stopped,
    }
}

/// What one session spent.
fn side(id: Uuid, events: &Events) -> RerunSide {
    let state = SessionState::fold(events.iter().cloned());
    let totals = state.totals;
    RerunSide {
        session: id,
        model: state.spec.map(|s| s.model.model).unwrap_or_default(),
        requests: totals.model_calls,
        prompt_tokens: totals.prompt_tokens,
        completion_tokens: totals.completion_tokens,
        cached_tokens: totals.cached_tokens,
        cache_hit_ratio: totals.cache_hit_ratio(),
        cost: totals.cost,
    }
}

/// How the rerun's calls were answered.
fn calls(events: &Events) -> RerunCalls {
    let mut calls = RerunCalls::default();
    for (_, event) in events {
        match event {
            Event::ToolFinished {
                rerun: Some(RerunAnswer::Recorded { .. }),
                ..
            } => calls.answered_from_record += 1,
            Event::ToolFinished {
                rerun: Some(RerunAnswer::NotRun),
                ..
            } => calls.not_run += 1,
            Event::ToolStarted { attempt: 1, .. } => calls.run_live += 1,
            _ => {}
        }
    }
    calls
}

/// Each user message with the answer its turn ended on: the turn's last
/// reply, if it made no calls that ran.
fn answers(events: &Events) -> Vec<(String, Option<String>)> {
    let mut turns: Vec<(String, Option<String>)> = Vec::new();
    let mut waiting = replay::rerun::Waiting::default();
    for (seq, event) in events {
        if let Some(text) = waiting.opens_turn(*seq, event) {
            turns.push((text.to_string(), None));
            continue;
        }
        if let (Event::ModelReplied(reply), Some((_, answer))) = (event, turns.last_mut()) {
            *answer = (reply.tool_calls.is_empty() && reply.refused.is_none())
                .then(|| reply.content.clone().unwrap_or_default());
        }
    }
    turns
}

/// The original's messages, each with both sessions' answers.
fn turns(original: &Events, rerun: &Events) -> Vec<RerunTurn> {
    let theirs = answers(rerun);
    answers(original)
        .into_iter()
        .enumerate()
        .map(|(i, (message, answer))| RerunTurn {
            message,
            original: answer,
            rerun: theirs.get(i).and_then(|(_, a)| a.clone()),
        })
        .collect()
}

/// Each model request of a session: the seq of the reply that answered it,
/// and its messages, each as JSON (rebuilt from the events before it).
fn requests(events: &Events) -> Vec<(u64, Vec<String>)> {
    let mut state = SessionState::default();
    let mut out = Vec::new();
    for (seq, event) in events {
        if let Event::ModelReplied(_) = event {
            let messages = replay::messages(&state)
                .iter()
                .map(|m| serde_json::to_string(m).expect("messages serialize"))
                .collect();
            out.push((*seq, messages));
        }
        state.apply(*seq, event.clone());
    }
    out
}

/// Bytes shown before the point where two requests part.
const CONTEXT_BEFORE: usize = 40;
/// Bytes shown of each side from there.
const CONTEXT_BYTES: usize = 160;

/// The first request whose messages differ, or that only one session made.
fn first_difference(original: &Events, rerun: &Events) -> Option<RequestDifference> {
    let (left, right) = (requests(original), requests(rerun));
    let at = (0..left.len().max(right.len()))
        .find(|&i| left.get(i).map(|r| &r.1) != right.get(i).map(|r| &r.1))?;
    let empty = Vec::new();
    let (a, b) = (
        left.get(at).map_or(&empty, |r| &r.1),
        right.get(at).map_or(&empty, |r| &r.1),
    );
    let message = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (as_array(a), as_array(b));
    let offset = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    Some(RequestDifference {
        request: at as u64 + 1,
        original_seq: left.get(at).map(|r| r.0),
        rerun_seq: right.get(at).map(|r| r.0),
        message: message as u64,
        offset: offset as u64,
        original_bytes: around(&a, offset),
        rerun_bytes: around(&b, offset),
    })
}

/// Messages as the JSON array a request carries.
fn as_array(messages: &[String]) -> String {
    format!("[{}]", messages.join(","))
}

/// `text` from a little before byte `offset`, on character boundaries.
fn around(text: &str, offset: usize) -> String {
    let floor = |mut i: usize| {
        i = i.min(text.len());
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let start = floor(offset.saturating_sub(CONTEXT_BEFORE));
    let end = floor(offset.saturating_add(CONTEXT_BYTES));
    text[start..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use replay::{ModelReply, RerunOf, ToolCall, ToolOutcome, Usage};

    fn spec(model: &str) -> replay::AgentSpec {
        toml::from_str(&format!(
            "name = \"t\"\n[model]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"{model}\"\ninput_cost_per_mtok = 1.0\n"
        ))
        .unwrap()
    }

    fn reply(content: Option<&str>, calls: &[(&str, &str)], prompt: u64, cached: u64) -> Event {
        Event::ModelReplied(ModelReply {
            content: content.map(str::to_string),
            tool_calls: (calls.iter().enumerate())
                .map(|(i, (name, args))| ToolCall {
                    id: format!("c{i}"),
                    name: name.to_string(),
                    arguments: args.to_string(),
                    invented: None,
                })
                .collect(),
            usage: Usage {
                prompt_tokens: prompt,
                completion_tokens: 5,
                cached_tokens: cached,
                cache_write_tokens: 0,
                reasoning_tokens: 0,
            },
            finish_reason: "stop".into(),
            ..Default::default()
        })
    }

    fn finished(call_id: &str, out: &str, rerun: Option<RerunAnswer>) -> Event {
        Event::ToolFinished {
            call_id: call_id.into(),
            outcome: ToolOutcome::Ok(out.into()),
            duration_ms: 1,
            settled_by_check: false,
            rerun,
            child: None,
        }
    }

    fn user(text: &str) -> Event {
        Event::UserMessage { text: text.into() }
    }

    fn numbered(events: Vec<Event>) -> Vec<(u64, Event)> {
        (1..).zip(events).collect()
    }

    #[test]
    fn the_report_names_the_first_request_whose_messages_differ() {
        let original = numbered(vec![
            Event::SessionStarted {
                spec: Box::new(spec("old")),
                tenant: None,
            },
            user("one"),
            reply(None, &[("lookup", r#"{"a":1}"#)], 100, 0),
            finished("c0", "Ada", None),
            reply(Some("It is Ada."), &[], 120, 100),
            user("two"),
            reply(Some("Bye."), &[], 140, 120),
        ]);
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let recorded = RerunAnswer::Recorded {
            session: a,
            seq: 4,
            call_id: "c0".into(),
        };
        let rerun = numbered(vec![
            Event::SessionForked {
                parent: a,
                at_seq: 0,
                rerun: Some(RerunOf {
                    through_seq: 7,
                    live_tools: false,
                }),
                shared: false,
            },
            Event::SessionStarted {
                spec: Box::new(spec("new")),
                tenant: None,
            },
            user("one"),
            reply(None, &[("lookup", r#"{"a": 1}"#)], 100, 0),
            finished("c0", "Ada", Some(recorded)),
            reply(Some("Ada, it is."), &[], 120, 60),
            user("two"),
            reply(Some("Bye."), &[], 140, 0),
        ]);
        let report = compare((a, &original), (b, &rerun));
        let first = report.first_difference.expect("the second answer differs");
        // Requests 1 and 2 hold the same messages (the arguments' spacing
        // aside, the model's exact text differs: request 2 carries it).
        assert_eq!(first.request, 2, "{first:?}");
        assert_eq!((first.original_seq, first.rerun_seq), (Some(5), Some(6)));
        assert_eq!(first.message, 1, "the assistant message");
        assert!(first.original_bytes.contains(r#"{\"a\":1}"#), "{first:?}");
        assert!(first.rerun_bytes.contains(r#"{\"a\": 1}"#), "{first:?}");
        assert_eq!(report.turns.len(), 2);
        assert_eq!(report.turns[0].original.as_deref(), Some("It is Ada."));
        assert_eq!(report.turns[0].rerun.as_deref(), Some("Ada, it is."));
        assert_eq!(report.calls.answered_from_record, 1);
        assert_eq!((report.calls.run_live, report.calls.not_run), (0, 0));
        assert_eq!(report.original.model, "old");
        assert_eq!(report.rerun.model, "new");
        assert_eq!(report.original.prompt_tokens, 360);
        assert!((report.original.cache_hit_ratio - 220.0 / 360.0).abs() < 1e-9);
        assert!((report.rerun.cache_hit_ratio - 60.0 / 360.0).abs() < 1e-9);
        assert!((report.original.cost - 360.0 / 1e6).abs() < 1e-12);
        assert_eq!(report.stopped, None);
    }

    #[test]
    fn a_rerun_that_made_fewer_requests_differs_where_it_stopped() {
        let original = numbered(vec![
            Event::SessionStarted {
                spec: Box::new(spec("m")),
                tenant: None,
            },
            user("one"),
            reply(Some("A."), &[], 10, 0),
            user("two"),
            reply(Some("B."), &[], 10, 0),
        ]);
        let a = Uuid::from_u128(1);
        let rerun = numbered(vec![
            Event::SessionForked {
                parent: a,
                at_seq: 0,
                rerun: Some(RerunOf {
                    through_seq: 3,
                    live_tools: true,
                }),
                shared: false,
            },
            Event::SessionStarted {
                spec: Box::new(spec("m")),
                tenant: None,
            },
            user("one"),
            reply(Some("A."), &[], 10, 0),
        ]);
        let report = compare((a, &original), (Uuid::nil(), &rerun));
        // Only the original's messages up to the seq the rerun replays count.
        assert_eq!(report.turns.len(), 1);
        assert_eq!(report.first_difference.map(|d| d.request), None);
        assert!(report.live_tools);
        assert_eq!(report.stopped, None);
        let unanswered = &rerun[..3];
        let report = compare((a, &original), (Uuid::nil(), unanswered));
        let first = report.first_difference.unwrap();
        assert_eq!((first.request, first.rerun_seq), (1, None));
        assert!(report.stopped.unwrap().contains("running"));
    }
}
