//! `mneme diff A B`: prints two sessions compared (`runtime::diff`): where
//! their histories hold the same events, where they part, and what differs
//! after: each side's events, answers, tool calls, tokens and cost.

use runtime::api::{DiffSide, RerunReport, SessionDiff};
use runtime::text::for_terminal;
use serde_json::json;

/// Prints a diff for people (or as one JSON object).
pub fn print(diff: &SessionDiff, as_json: bool) {
    if as_json {
        outln!("{}", json!(diff));
        return;
    }
    let line = |text: String| outln!("{}", for_terminal(&text));
    line(format!(
        "{} and {} hold the same first {} events of their history",
        diff.a.session, diff.b.session, diff.common_events
    ));
    for (name, side) in [("A", &diff.a), ("B", &diff.b)] {
        outln!();
        print_side(name, side, &line);
    }
    outln!();
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

/// Prints a rerun's report for people (or as one JSON object): the two
/// sessions, where their requests first differ, both answers to each
/// message, what each spent, and how the rerun's calls were answered.
pub fn print_rerun(report: &RerunReport, as_json: bool) {
    if as_json {
        outln!("{}", json!(report));
        return;
    }
    let line = |text: String| outln!("{}", for_terminal(&text));
    let (a, b) = (&report.original, &report.rerun);
    line(format!(
        "rerun {} of {} (model {:?}, was {:?})",
        b.session, a.session, b.model, a.model
    ));
    match &report.first_difference {
        None => line("every model request holds the same messages in both".into()),
        Some(d) => {
            let seq = |s: Option<u64>| s.map_or("none".to_string(), |s| format!("#{s}"));
            line(format!(
                "first request that differs: request {} (reply {} in the original, {} in the rerun), message {}, byte {}",
                d.request,
                seq(d.original_seq),
                seq(d.rerun_seq),
                d.message,
                d.offset
            ));
            line(format!("  original: {}", d.original_bytes));
            line(format!("  rerun:    {}", d.rerun_bytes));
        }
    }
    for (i, turn) in report.turns.iter().enumerate() {
        let answer = |a: &Option<String>| {
            a.as_deref()
                .map_or("(no answer)".into(), |a| format!("{a:?}"))
        };
        let same = match turn.original == turn.rerun {
            true => "same",
            false => "differs",
        };
        line(format!("turn {} ({same}): {:?}", i + 1, turn.message));
        line(format!("  original: {}", answer(&turn.original)));
        line(format!("  rerun:    {}", answer(&turn.rerun)));
    }
    for (name, side) in [("original", a), ("rerun", b)] {
        line(format!(
            "{name:<8} {} requests, tokens {} in / {} out, cost {:.6}, cache hit ratio {:.2} ({} cached)",
            side.requests,
            side.prompt_tokens,
            side.completion_tokens,
            side.cost,
            side.cache_hit_ratio,
            side.cached_tokens
        ));
    }
    let calls = &report.calls;
    line(format!(
        "calls: {} answered from the record, {} run live, {} not run{}",
        calls.answered_from_record,
        calls.run_live,
        calls.not_run,
        match report.live_tools {
            true => " (--live-tools)",
            false => "",
        }
    ));
    if let Some(why) = &report.stopped {
        line(format!("stopped: {why}"));
    }
}
