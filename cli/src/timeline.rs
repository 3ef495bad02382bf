//! `mneme log`: a session's audit trail as a readable timeline or JSON lines.

use crate::LogArgs;
use anyhow::{bail, Result};
use eventlog::EventLog;
use replay::{Event, ToolCall};
use runtime::store::read_events;
use runtime::text::for_terminal;
use runtime::{describe, store};
use serde_json::Value;
use std::collections::HashMap;
use std::process::ExitCode;

/// Parses `--since`: RFC 3339, or an age like `90s`, `10m`, `2h`, `1d`.
fn parse_since(text: &str) -> Result<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp_millis());
    }
    match runtime::text::parse_window(text) {
        Ok(age) => Ok(runtime::text::now_ms() - age.as_millis() as i64),
        Err(_) => bail!("--since {text:?}: expected RFC 3339 (2026-11-29T19:00:00Z) or an age such as 10m, 2h, 1d"),
    }
}

/// Reads a session's events from the log as rows (the `--json` shape).
pub async fn rows(log: &dyn EventLog, session: uuid::Uuid) -> Result<Vec<Value>> {
    Ok(read_events(log, session)
        .await?
        .iter()
        .map(|(record, event)| store::record(record, event))
        .collect())
}

/// Prints the rows (the log's events, see [`rows`]) that pass the filters.
pub fn print(rows: &[Value], args: &LogArgs) -> Result<ExitCode> {
    let since = args.since.as_deref().map(parse_since).transpose()?;
    if let Some(unknown) = args
        .kind
        .iter()
        .find(|k| !Event::KINDS.contains(&k.as_str()))
    {
        bail!(
            "--kind {unknown:?} is not an event kind; kinds are {}",
            Event::KINDS.join(", ")
        );
    }
    // Tool events belong to the latest reply; ids may repeat across replies.
    let mut calls = HashMap::new();
    let mut spec = None;
    for row in rows {
        if crate::out::closed() {
            break; // nobody reads the rest
        }
        let event: Event = serde_json::from_value(row["event"].clone())?;
        if let Event::SessionStarted { spec: s, .. } | Event::SpecChanged { spec: s, .. } = &event {
            spec = Some(s.clone());
        }
        if let Event::ModelReplied(reply) = &event {
            calls = (reply.tool_calls.iter())
                .map(|c| (c.id.clone(), c.clone()))
                .collect();
        }
        let ts = row["ts"].as_str().unwrap_or_default();
        let ts_ms = chrono::DateTime::parse_from_rfc3339(ts).map_or(0, |t| t.timestamp_millis());
        if since.is_some_and(|s| ts_ms < s)
            || (!args.kind.is_empty() && !args.kind.iter().any(|k| k == event.kind()))
            || args
                .tool
                .as_ref()
                .is_some_and(|t| !concerns_tool(&event, t, &calls))
        {
            continue;
        }
        if args.json.json {
            outln!("{row}");
        } else {
            let caused = row["caused_by"]
                .as_u64()
                .map(|c| format!(" <-#{c}"))
                .unwrap_or_default();
            let child = child_of(row, &event, spec.as_deref())
                .map(|child| format!(" -> sub-agent session {child}"))
                .unwrap_or_default();
            let line = format!(
                "#{:<5} {ts} {:<16} {}{child}{caused}",
                row["seq"].as_u64().unwrap_or(0),
                event.kind(),
                describe::summary(&event)
            );
            outln!("{}", for_terminal(&line));
            if let Some(call) = awaiting_approval(&event, &calls) {
                for line in describe::laid_out(&call.arguments, true).lines() {
                    outln!("{}", for_terminal(&format!("        {line}")));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The child session a call of an agent tool starts or continues, for
/// its `ToolStarted` row (the id derives from the session's and the key).
fn child_of(row: &Value, event: &Event, spec: Option<&replay::AgentSpec>) -> Option<uuid::Uuid> {
    let Event::ToolStarted {
        tool,
        idempotency_key,
        ..
    } = event
    else {
        return None;
    };
    spec?.tool(tool)?.child_spec()?;
    let session = row["session"].as_str()?.parse().ok()?;
    Some(replay::child_session_id(session, idempotency_key))
}

/// The call an `ApprovalRequested` asks a person about: its arguments are
/// shown whole under the row, laid out afresh, as they are to be approved.
fn awaiting_approval<'a>(
    event: &Event,
    calls: &'a HashMap<String, ToolCall>,
) -> Option<&'a ToolCall> {
    match event {
        Event::ApprovalRequested { call_id, .. } => calls.get(call_id),
        _ => None,
    }
}

fn concerns_tool(event: &Event, tool: &str, calls: &HashMap<String, ToolCall>) -> bool {
    let call_is = |id: &str| calls.get(id).is_some_and(|c| c.name == tool);
    match event {
        Event::ModelReplied(reply) => reply.tool_calls.iter().any(|c| c.name == tool),
        Event::ToolStarted { tool: t, .. } => t == tool,
        Event::ToolFinished { call_id, .. }
        | Event::ToolInDoubt { call_id, .. }
        | Event::ToolResolved { call_id, .. }
        | Event::ApprovalRequested { call_id, .. }
        | Event::ApprovalDecided { call_id, .. } => call_is(call_id),
        _ => false,
    }
}
