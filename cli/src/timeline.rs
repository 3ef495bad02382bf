//! `mneme log`: a session's audit trail as a readable timeline or JSON lines.

use crate::LogArgs;
use anyhow::{bail, Result};
use eventlog::EventLog;
use replay::{Event, Resolution, SessionOutcome, ToolOutcome};
use runtime::session::read_events;
use runtime::text::for_terminal;
use runtime::views;
use serde_json::Value;
use std::collections::HashMap;
use std::process::ExitCode;

/// Parses `--since`: RFC 3339, or an age like `90s`, `10m`, `2h`, `1d`.
fn parse_since(text: &str) -> Result<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp_millis());
    }
    let mut chars = text.chars();
    let unit = chars.next_back();
    let number = chars.as_str();
    let seconds = match unit {
        Some('s') => 1,
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86400,
        _ => bail!("--since {text:?}: expected RFC 3339 (2026-11-29T19:00:00Z) or an age such as 10m, 2h, 1d"),
    };
    let Ok(n) = number.parse::<i64>() else {
        bail!("--since {text:?}: {number:?} is not a whole number");
    };
    Ok(chrono::Utc::now().timestamp_millis() - n * seconds * 1000)
}

/// Reads a session's events from the log as rows (the `--json` shape).
pub async fn rows(log: &dyn EventLog, session: uuid::Uuid) -> Result<Vec<Value>> {
    Ok(read_events(log, session)
        .await?
        .iter()
        .map(|(record, event)| views::record(record, event))
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
    let mut tool_of_call = HashMap::new();
    for row in rows {
        let event: Event = serde_json::from_value(row["event"].clone())?;
        if let Event::ModelReplied(reply) = &event {
            tool_of_call = reply
                .tool_calls
                .iter()
                .map(|c| (c.id.clone(), c.name.clone()))
                .collect();
        }
        let ts = row["ts"].as_str().unwrap_or_default();
        let ts_ms = chrono::DateTime::parse_from_rfc3339(ts).map_or(0, |t| t.timestamp_millis());
        if since.is_some_and(|s| ts_ms < s)
            || (!args.kind.is_empty() && !args.kind.iter().any(|k| k == event.kind()))
            || args
                .tool
                .as_ref()
                .is_some_and(|t| !concerns_tool(&event, t, &tool_of_call))
        {
            continue;
        }
        if args.json.json {
            println!("{row}");
        } else {
            let caused = row["caused_by"]
                .as_u64()
                .map(|c| format!(" <-#{c}"))
                .unwrap_or_default();
            let line = format!(
                "#{:<5} {ts} {:<16} {}{caused}",
                row["seq"].as_u64().unwrap_or(0),
                event.kind(),
                summary(&event)
            );
            println!("{}", for_terminal(&line));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn concerns_tool(event: &Event, tool: &str, tool_of_call: &HashMap<String, String>) -> bool {
    let call_is = |id: &str| tool_of_call.get(id).is_some_and(|t| t == tool);
    match event {
        Event::ModelReplied(reply) => reply.tool_calls.iter().any(|c| c.name == tool),
        Event::ToolStarted { tool: t, .. } => t == tool,
        Event::ToolFinished { call_id, .. }
        | Event::ToolInDoubt { call_id, .. }
        | Event::ToolResolved { call_id, .. }
        | Event::ApprovalRequested { call_id }
        | Event::ApprovalDecided { call_id, .. } => call_is(call_id),
        _ => false,
    }
}

fn clip(text: &str, max: usize) -> String {
    let one_line = text.replace('\n', " ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let clipped: String = one_line.chars().take(max).collect();
    format!("{clipped}…")
}

pub(crate) fn summary(event: &Event) -> String {
    match event {
        Event::SessionForked { parent, at_seq } => format!("forked from {parent} at seq {at_seq}"),
        Event::SessionFinished {
            outcome: SessionOutcome::Cancelled { by },
        } => format!("cancelled by {by}"),
        Event::SessionStarted { spec } => format!(
            "agent {} (provider {}, model {:?}, {} tools)",
            spec.name,
            spec.model.provider,
            spec.model.model,
            spec.tools.len()
        ),
        Event::UserMessage { text } => format!("{:?}", clip(text, 100)),
        Event::ModelReplied(r) => {
            let calls: Vec<String> = r
                .tool_calls
                .iter()
                .map(|c| format!("{}({}) {}", c.name, c.id, clip(&c.arguments, 60)))
                .collect();
            let what = match (&r.content, calls.is_empty()) {
                (Some(text), true) => format!("answer {:?}", clip(text, 80)),
                (_, false) => format!("calls {}", calls.join(", ")),
                (None, true) => "empty reply".into(),
            };
            let what = match (&r.refused, r.cut_off()) {
                (Some(why), _) => format!("{what}; REFUSED: {}", clip(why, 80)),
                (None, true) => format!("{what}; CUT OFF by the token limit"),
                (None, false) => what,
            };
            let prefix = r
                .prefix_digest
                .get(..12)
                .map(|p| format!("; prefix {p}"))
                .unwrap_or_default();
            let first = match r.first_token_ms {
                0 => String::new(),
                ms => format!(" (first token {ms} ms)"),
            };
            format!(
                "{what}; tokens {} in ({} cached{}) / {} out; {} ms{first}; finish {:?}{prefix}",
                r.usage.prompt_tokens,
                r.usage.cached_tokens,
                match r.usage.cache_write_tokens {
                    0 => String::new(),
                    n => format!(", {n} written to the cache"),
                },
                r.usage.completion_tokens,
                r.latency_ms,
                r.finish_reason
            )
        }
        Event::ToolStarted {
            call_id,
            tool,
            args,
            effect,
            idempotency_key,
            attempt,
        } => {
            format!(
                "{tool}({call_id}) {effect} attempt {attempt} key {idempotency_key} args {}",
                clip(args, 60)
            )
        }
        Event::ToolFinished {
            call_id,
            outcome,
            duration_ms,
        } => match outcome {
            ToolOutcome::Ok(out) => format!("{call_id} ok in {duration_ms} ms: {}", clip(out, 80)),
            ToolOutcome::Err(err) => {
                format!("{call_id} error in {duration_ms} ms: {}", clip(err, 80))
            }
        },
        Event::ToolInDoubt { call_id, reason } => format!("{call_id}: {reason}"),
        Event::ApprovalRequested { call_id } => format!("{call_id} waits for approval"),
        Event::ContextCompacted {
            entries,
            covers,
            summary,
        } => format!(
            "first {entries} entries (seqs {}-{}) summarized in the prompt: {:?}",
            covers.0,
            covers.1,
            clip(summary, 80)
        ),
        Event::ApprovalDecided {
            call_id,
            approved,
            by,
        } => format!(
            "{call_id} {} by {by}",
            if *approved { "approved" } else { "denied" }
        ),
        Event::ToolResolved {
            call_id,
            resolution,
            by,
        } => {
            let what = match resolution {
                Resolution::Retry => "retry".to_string(),
                Resolution::Skip(result) => format!("skip with result {}", clip(result, 60)),
                Resolution::Fail(message) => format!("fail: {message}"),
            };
            format!("{call_id}: {what} (by {by})")
        }
        Event::SessionPaused { reason, .. } => reason.clone(),
        Event::SessionResumed { by, extend_budget } => match extend_budget {
            true => format!("by {by}, with the turn's budget started again"),
            false => format!("by {by}"),
        },
        Event::SessionFinished {
            outcome: SessionOutcome::Failed(error),
        } => format!("failed: {error}"),
        Event::SpecChanged { spec, by } => format!(
            "from here on agent {} (provider {}, model {:?}, {} tools), by {by}",
            spec.name,
            spec.model.provider,
            spec.model.model,
            spec.tools.len()
        ),
        Event::McpToolsChanged { server, changes } => format!(
            "MCP server {server} now lists other tools (not adopted): {}",
            changes.join("; ")
        ),
        Event::McpToolsRefreshed {
            server,
            tools,
            changes,
            by,
        } => format!(
            "MCP server {server}: {} tools adopted by {by}: {}",
            tools.len(),
            changes.join("; ")
        ),
    }
}
