//! `mneme diff A B`: prints two sessions compared (`runtime::diff`): where
//! their histories hold the same events, where they part, and what differs
//! after: each side's events, answers, tool calls, tokens and cost.

use runtime::api::{DiffSide, SessionDiff};
use runtime::text::for_terminal;
use serde_json::json;

/// Prints a diff for people (or as one JSON object).
pub fn print(diff: &SessionDiff, as_json: bool) {
    if as_json {
        println!("{}", json!(diff));
        return;
    }
    let line = |text: String| println!("{}", for_terminal(&text));
    line(format!(
        "{} and {} hold the same first {} events of their history",
        diff.a.session, diff.b.session, diff.common_events
    ));
    for (name, side) in [("A", &diff.a), ("B", &diff.b)] {
        println!();
        print_side(name, side, &line);
    }
    println!();
    let figures = |side: &DiffSide| {
        [
            ("answer", json!(side.answer)),
            ("tool calls", json!(side.tool_calls)),
            ("prompt tokens", json!(side.prompt_tokens)),
            ("completion tokens", json!(side.completion_tokens)),
            ("cost", json!(side.cost)),
        ]
    };
    for ((what, x), (_, y)) in figures(&diff.a).into_iter().zip(figures(&diff.b)) {
        let same = if x == y { "same" } else { "differs" };
        line(format!("{what} ({same}): A {x} | B {y}"));
    }
}

/// Prints where one side goes on from the common events, and its events.
fn print_side(name: &str, side: &DiffSide, line: &dyn Fn(String)) {
    match side.diverges_at_seq {
        Some(seq) => line(format!(
            "{name} {} goes on from seq {seq} with {} events:",
            side.session,
            side.after.len()
        )),
        None => line(format!("{name} {} has nothing after them", side.session)),
    }
    for event in &side.after {
        line(format!(
            "  #{:<5} {:<16} {}",
            event.seq, event.kind, event.summary
        ));
    }
}
