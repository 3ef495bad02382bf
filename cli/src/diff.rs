//! `mneme diff A B`: where two sessions (a session and its fork, say) hold
//! the same events, where they part, and what differs after: each side's
//! events, answers, tool calls, tokens and cost.

use crate::timeline::summary;
use anyhow::{Context, Result};
use replay::{Event, SessionState};
use runtime::text::for_terminal;
use serde_json::{json, Value};
use uuid::Uuid;

/// One session's events as `log --json` rows give them: (seq, event).
pub type Events = Vec<(u64, Event)>;

/// Reads (seq, event) out of `log --json` rows.
pub fn events_of(rows: &[Value]) -> Result<Events> {
    rows.iter()
        .map(|row| {
            let seq = row["seq"].as_u64().context("a row without a seq")?;
            let event = serde_json::from_value(row["event"].clone())
                .with_context(|| format!("seq {seq}: an event this build does not read"))?;
            Ok((seq, event))
        })
        .collect()
}

/// The events that make up a session's history: a fork's first event
/// (naming its parent) is left out, so a fork lines up with its parent.
fn history(events: &Events) -> &[(u64, Event)] {
    match events.first() {
        Some((_, Event::SessionForked { .. })) => &events[1..],
        _ => events,
    }
}

/// How many history events the two sessions hold alike, from the first.
pub fn common_prefix(a: &Events, b: &Events) -> usize {
    history(a)
        .iter()
        .zip(history(b))
        .take_while(|((_, x), (_, y))| x == y)
        .count()
}

/// One side of a diff, as JSON: the session, its events after the common
/// prefix, its answer, its tool calls after the prefix, tokens and cost.
fn side(id: Uuid, events: &Events, common: usize) -> Value {
    let state = SessionState::fold(events.iter().cloned());
    let after = &history(events)[common..];
    let calls: Vec<String> = after
        .iter()
        .filter_map(|(_, e)| match e {
            Event::ToolStarted { tool, args, .. } => Some(format!("{tool} {args}")),
            _ => None,
        })
        .collect();
    json!({
        "session": id,
        "events": events.len(),
        "diverges_at_seq": after.first().map(|(seq, _)| *seq),
        "after": after.iter().map(|(seq, e)| json!({"seq": seq, "kind": e.kind(), "summary": summary(e)})).collect::<Vec<_>>(),
        "answer": state.answer(),
        "tool_calls": calls,
        "prompt_tokens": state.totals.prompt_tokens,
        "completion_tokens": state.totals.completion_tokens,
        "cost": state.totals.cost,
    })
}

/// The diff of sessions `a` and `b` as JSON.
pub fn diff(a: (Uuid, &Events), b: (Uuid, &Events)) -> Value {
    let common = common_prefix(a.1, b.1);
    json!({
        "common_events": common,
        "a": side(a.0, a.1, common),
        "b": side(b.0, b.1, common),
    })
}

/// Prints a diff for people (or as one JSON object).
pub fn print(diff: &Value, as_json: bool) {
    if as_json {
        println!("{diff}");
        return;
    }
    let line = |text: String| println!("{}", for_terminal(&text));
    let (a, b) = (&diff["a"], &diff["b"]);
    line(format!(
        "{} and {} hold the same first {} events of their history",
        a["session"].as_str().unwrap_or(""),
        b["session"].as_str().unwrap_or(""),
        diff["common_events"]
    ));
    for (name, side) in [("A", a), ("B", b)] {
        println!();
        let after = side["after"].as_array().map_or(0, Vec::len);
        match side["diverges_at_seq"].as_u64() {
            Some(seq) => line(format!(
                "{name} {} goes on from seq {seq} with {after} events:",
                side["session"].as_str().unwrap_or("")
            )),
            None => line(format!(
                "{name} {} has nothing after them",
                side["session"].as_str().unwrap_or("")
            )),
        }
        for event in side["after"].as_array().into_iter().flatten() {
            line(format!(
                "  #{:<5} {:<16} {}",
                event["seq"],
                event["kind"].as_str().unwrap_or(""),
                event["summary"].as_str().unwrap_or("")
            ));
        }
    }
    println!();
    for (what, key) in [
        ("answer", "answer"),
        ("tool calls", "tool_calls"),
        ("prompt tokens", "prompt_tokens"),
        ("completion tokens", "completion_tokens"),
        ("cost", "cost"),
    ] {
        let (x, y) = (&a[key], &b[key]);
        let same = if x == y { "same" } else { "differs" };
        line(format!("{what} ({same}): A {x} | B {y}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Event {
        Event::UserMessage { text: text.into() }
    }

    #[test]
    fn a_fork_lines_up_with_its_parent_and_parts_where_it_differs() {
        let parent: Events = vec![(1, user("a")), (2, user("b")), (3, user("c"))];
        let fork: Events = vec![
            (
                1,
                Event::SessionForked {
                    parent: Uuid::nil(),
                    at_seq: 2,
                },
            ),
            (2, user("a")),
            (3, user("b")),
            (4, user("other")),
        ];
        assert_eq!(common_prefix(&parent, &fork), 2);
        let d = diff((Uuid::nil(), &parent), (Uuid::max(), &fork));
        assert_eq!(d["a"]["diverges_at_seq"], 3);
        assert_eq!(d["b"]["diverges_at_seq"], 4);
        assert_eq!(d["b"]["after"][0]["summary"], "\"other\"");
        assert_eq!(common_prefix(&parent, &parent), 3);
    }
}
