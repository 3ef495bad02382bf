//! Text for people, from the same JSON views that `--json` prints and the
//! daemon returns.

use anyhow::Result;
use runtime::text::for_terminal;
use serde_json::Value;
use std::process::ExitCode;

/// Prints one line of text for people: text from outside (agent names,
/// errors, prompts) can neither forge lines nor drive the terminal.
macro_rules! line {
    ($($arg:tt)*) => {
        outln!("{}", for_terminal(&format!($($arg)*)))
    };
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// Characters of a session's title shown in `mneme sessions`.
const TITLE_SHOWN: usize = 48;

/// The schedules as a table (or one JSON object a line).
pub fn schedules(views: &[runtime::api::ScheduleView], json: bool) {
    if json {
        views
            .iter()
            .for_each(|v| outln!("{}", serde_json::to_value(v).unwrap_or_default()));
        return;
    }
    line!(
        "{:<36}  {:<22}  {:<36}  {:<24}  {:>5}  {:>7}  MESSAGE",
        "SCHEDULE",
        "WHEN",
        "INTO",
        "NEXT",
        "FIRED",
        "SKIPPED"
    );
    for v in views {
        let into = match &v.agent {
            Some(agent) if v.into == "new" => format!("new session of {agent}"),
            _ => v.into.clone(),
        };
        let next = match &v.removed_by {
            Some(by) => format!("removed by {by}"),
            None => v.next.clone().unwrap_or_default(),
        };
        line!(
            "{:<36}  {:<22}  {:<36}  {:<24}  {:>5}  {:>7}  {:?}",
            v.schedule,
            clip(&v.when, 22),
            clip(&into, 36),
            next,
            v.fired,
            v.skipped,
            clip(&v.message, TITLE_SHOWN)
        );
    }
}

/// The tenants as a table (or one JSON object a line).
pub fn tenants(views: &[runtime::api::TenantView], json: bool) {
    if json {
        views
            .iter()
            .for_each(|v| outln!("{}", serde_json::to_value(v).unwrap_or_default()));
        return;
    }
    line!(
        "{:<32}  {:>6}  {:>12}  {:>7}  {:>7}  {:>7}  ERASED",
        "TENANT",
        "TOKENS",
        "COST/DAY",
        "TURNS",
        "CALLS",
        "QUEUED"
    );
    let or_none = |n: Option<String>| n.unwrap_or_else(|| "-".to_string());
    for v in views {
        line!(
            "{:<32}  {:>6}  {:>12}  {:>7}  {:>7}  {:>7}  {}",
            v.name,
            v.tokens,
            or_none(v.max_cost_per_day.map(|c| c.to_string())),
            or_none(v.max_running_turns.map(|n| n.to_string())),
            or_none(v.max_parallel_calls.map(|n| n.to_string())),
            or_none(v.max_queued_turns.map(|n| n.to_string())),
            v.erased.as_deref().unwrap_or("-")
        );
    }
}

/// Spend as a table, a row a group and the total (or the report as JSON).
pub fn spend(report: &runtime::api::SpendReport, json: bool) {
    if json {
        outln!("{}", serde_json::to_value(report).unwrap_or_default());
        return;
    }
    let by = match report.by {
        runtime::api::SpendBy::Tenant => None,
        runtime::api::SpendBy::Agent => Some("AGENT"),
        runtime::api::SpendBy::Day => Some("DAY (UTC)"),
        runtime::api::SpendBy::Session => Some("SESSION"),
    };
    let second = |row: &runtime::api::SpendRow| {
        let value = (row.agent.clone())
            .or(row.day.clone())
            .or(row.session.map(|s| s.to_string()));
        value.unwrap_or_default()
    };
    let head = by.map_or(String::new(), |b| format!("{b:<36}  "));
    line!(
        "{:<32}  {head}{:>8}  {:>12}  {:>12}  {:>12}  {:>12}",
        "TENANT",
        "REQUESTS",
        "PROMPT",
        "COMPLETION",
        "CACHED",
        "COST"
    );
    let shown = |row: &runtime::api::SpendRow, tenant: &str| {
        let second = by.map_or(String::new(), |_| format!("{:<36}  ", second(row)));
        line!(
            "{:<32}  {second}{:>8}  {:>12}  {:>12}  {:>12}  {:>12.6}",
            tenant,
            row.model_calls,
            row.prompt_tokens,
            row.completion_tokens,
            row.cached_tokens,
            row.cost
        );
    };
    for row in &report.rows {
        shown(row, row.tenant.as_deref().unwrap_or("(operator)"));
    }
    let total = &report.total;
    let total = runtime::api::SpendRow {
        agent: None,
        day: None,
        session: None,
        ..total.clone()
    };
    shown(&total, "total");
}

/// `mneme sessions`: one row a session, sub-agents under their parents,
/// each id as its shortest prefix that no other listed session shares
/// (what commands take), with the first message as its title and how it
/// came to be (a fork, a rerun, a sub-agent) and what it waits for.
pub fn sessions(rows: &[Value], json: bool) {
    if json {
        rows.iter().for_each(|r| outln!("{r}"));
        return;
    }
    let width = unique_prefix_len(rows.iter().map(|r| text(r, "session")));
    let short = |id: &str| id.get(..width).unwrap_or(id).to_string();
    line!(
        "{:<width$}  {:<16}  {:<11}  {:>6}  {:<24}  {:>6}  ABOUT",
        "SESSION",
        "AGENT",
        "STATUS",
        "EVENTS",
        "LAST ACTIVITY",
        "CACHE"
    );
    for (depth, r) in as_tree(rows) {
        let id = text(r, "session");
        let interrupted = r["interrupted"].as_bool() == Some(true);
        let mut about = Vec::new();
        if let Some(title) = r["title"].as_str() {
            about.push(format!("{:?}", clip(title, TITLE_SHOWN)));
        }
        let pending = r["pending"].as_bool() == Some(true);
        if interrupted {
            about.push(format!("process died: mneme resume {}", short(id)));
        }
        if pending {
            about.push(format!(
                "no step recorded yet: mneme resume {} runs it",
                short(id)
            ));
        }
        if r["answer_cut_off"].as_bool() == Some(true) {
            about.push("answer cut off by the token limit".to_string());
        }
        if let Some(at) = r["approval_expires_at"].as_str() {
            about.push(format!("approval expires {at}"));
        }
        match (r["waits_for"].as_str(), r["wakes_at"].as_str()) {
            (Some(event), Some(at)) => {
                about.push(format!("sleeps until event {event:?}, at most {at}"))
            }
            (Some(event), None) => about.push(format!("sleeps until event {event:?}")),
            (None, Some(at)) => about.push(format!("sleeps until {at}")),
            (None, None) => {}
        }
        for (key, what) in [
            ("parent", "sub-agent of"),
            ("forked_from", "fork of"),
            ("rerun_of", "rerun of"),
        ] {
            if let Some(other) = r[key].as_str() {
                about.push(format!("{what} {}", short(other)));
            }
        }
        let agent = match depth {
            0 => text(r, "agent").to_string(),
            depth => format!("{}└ {}", "  ".repeat(depth - 1), text(r, "agent")),
        };
        let status = shown_status(r);
        let row = format!(
            "{:<width$}  {:<16}  {:<11}  {:>6}  {:<24}  {:>5.1}%  {}",
            short(id),
            agent,
            status,
            r["events"].as_u64().unwrap_or(0),
            text(r, "last_activity"),
            r["cache_hit_ratio"].as_f64().unwrap_or(0.0) * 100.0,
            about.join("  ·  ")
        );
        line!("{}", row.trim_end());
    }
}

/// The shortest length (at least 8) at which no two of `ids` share a
/// prefix: ids made in the same minute share their first 8 characters.
fn unique_prefix_len<'a>(ids: impl Iterator<Item = &'a str>) -> usize {
    let mut ids: Vec<&str> = ids.collect();
    ids.sort_unstable();
    let shared = |a: &str, b: &str| a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    (ids.windows(2))
        .map(|pair| shared(pair[0], pair[1]) + 1)
        .fold(8, usize::max)
}

/// `text` cut to `chars` characters, with an ellipsis where it was cut.
fn clip(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// The rows in listing order, each sub-agent right under its parent (and
/// its depth below the top): a session whose parent is not listed stays
/// where it is, at the top.
fn as_tree<'a>(rows: &'a [Value]) -> Vec<(usize, &'a Value)> {
    let listed: std::collections::HashSet<&str> = rows.iter().map(|r| text(r, "session")).collect();
    let parent_of =
        |r: &'a Value| -> Option<&'a str> { r["parent"].as_str().filter(|p| listed.contains(p)) };
    let mut children: std::collections::HashMap<&str, Vec<&Value>> = Default::default();
    for r in rows {
        if let Some(parent) = parent_of(r) {
            children.entry(parent).or_default().push(r);
        }
    }
    let mut ordered = Vec::with_capacity(rows.len());
    let mut stack: Vec<(usize, &Value)> = (rows.iter().rev())
        .filter(|r| parent_of(r).is_none())
        .map(|r| (0, r))
        .collect();
    while let Some((depth, r)) = stack.pop() {
        ordered.push((depth, r));
        let under = children
            .get(text(r, "session"))
            .map_or(&[][..], Vec::as_slice);
        stack.extend(under.iter().rev().map(|c| (depth + 1, *c)));
    }
    ordered
}

/// `mneme verify`: one line a session; failure if any chain is broken.
pub fn verify(results: &[Value], json: bool) -> ExitCode {
    let mut broken = 0;
    for r in results {
        let ok = r["ok"].as_bool().unwrap_or(false);
        broken += usize::from(!ok);
        match (json, ok) {
            (true, _) => outln!("{r}"),
            (false, true) => line!(
                "ok    {}  {} events, head {}{}",
                text(r, "session"),
                r["events"].as_u64().unwrap_or(0),
                text(r, "head").get(..16).unwrap_or(""),
                r["signed"]
                    .as_str()
                    .map(|s| format!("; {s}"))
                    .unwrap_or_default()
            ),
            (false, false) => line!("FAIL  {}  {}", text(r, "session"), text(r, "error")),
        }
    }
    if broken > 0 {
        say!(
            "mneme: verify: {broken} of {} sessions failed",
            results.len()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `mneme replay --cache`: a line a miss, or a line saying there was none.
pub fn cache_report(report: &runtime::api::CacheReport, json: bool) -> Result<()> {
    if json {
        for miss in &report.misses {
            outln!("{}", serde_json::to_string(miss)?);
        }
        return Ok(());
    }
    if report.misses.is_empty() {
        line!(
            "Session {}: no prefix-cache misses (every reply read what the request before it made cacheable)",
            report.session
        );
    }
    for miss in &report.misses {
        line!(
            "#{} missed {} of {} cacheable prompt tokens ({} cached): {}, the request first differing at byte {}",
            miss.seq,
            miss.cacheable_tokens.saturating_sub(miss.cached_tokens),
            miss.cacheable_tokens,
            miss.cached_tokens,
            miss.cause,
            miss.first_difference
        );
    }
    Ok(())
}

/// `mneme replay`.
pub fn replay(view: &Value, json: bool) -> Result<()> {
    if json {
        outln!("{view}");
        return Ok(());
    }
    let empty = Vec::new();
    let messages = view["request"]["messages"].as_array().unwrap_or(&empty);
    line!(
        "Session {} ({}), {} events, status {}",
        text(view, "session"),
        text(view, "agent"),
        view["events"].as_u64().unwrap_or(0),
        shown_status(view)
    );
    outln!();
    line!(
        "Rebuilt prompt: {} messages, request body {} bytes, SHA-256 {}",
        messages.len(),
        view["request_bytes"].as_u64().unwrap_or(0),
        text(view, "request_digest").get(..16).unwrap_or("")
    );
    for m in messages {
        line!("{}", serde_json::to_string(m)?);
    }
    let open_calls = view["calls"].as_array().is_some_and(|c| !c.is_empty());
    if open_calls {
        line!("(a call still open shows above as a placeholder: the resume settles it first, and the model is sent its result instead)");
    }
    outln!();
    line!("Resume plan: {}", text(view, "next"));
    for c in view["calls"].as_array().unwrap_or(&empty) {
        line!(
            "  {} (call {}): {}",
            text(c, "tool"),
            text(c, "call_id"),
            decision_in_words(text(c, "decision"), text(c, "reason"))
        );
    }
    replay_tools(view, &empty);
    Ok(())
}

/// A session's status as `mneme sessions` shows it: a running session
/// nothing runs is `interrupted` (its process died mid-turn) or `pending`.
fn shown_status(row: &Value) -> &str {
    match (row["interrupted"].as_bool(), row["pending"].as_bool()) {
        (Some(true), _) => "interrupted",
        (_, Some(true)) => "pending",
        _ => text(row, "status"),
    }
}

/// What a resume does with a call, as a person says it, from the view's
/// `decision` (a name for programs) and `reason`.
fn decision_in_words(decision: &str, reason: &str) -> String {
    match decision {
        "reuse" => "done: its recorded result is reused".into(),
        "run" => "runs (it never started)".into(),
        "rerun" => format!("runs again: {reason}"),
        "in_doubt" => format!("in doubt, a person decides (mneme resolve): {reason}"),
        "awaiting_decision" => format!("in doubt, waiting for a person (mneme resolve): {reason}"),
        "needs_approval" => format!("asks for approval: {reason}"),
        _ => reason.to_string(),
    }
}

/// The session's tools with their effects, and MCP lists that changed.
fn replay_tools(view: &Value, empty: &Vec<Value>) {
    let tools = view["tools"].as_array().unwrap_or(empty);
    if !tools.is_empty() {
        outln!();
        line!("Tools:");
    }
    for t in tools {
        let hints = match &t["annotations"] {
            Value::Null => String::new(),
            hints => format!(", server's annotations {hints}"),
        };
        let approval = match (
            t["requires_approval"].as_bool(),
            t["approval_timeout"].as_str(),
        ) {
            (Some(true), Some(timeout)) => format!(", requires approval (expires after {timeout})"),
            (Some(true), None) => ", requires approval".to_string(),
            _ => String::new(),
        };
        line!(
            "  {} ({}): {} (from {}){approval}{}",
            text(t, "name"),
            text(t, "kind"),
            text(t, "effect"),
            text(t, "effect_from"),
            hints
        );
    }
    for (server, changes) in view["mcp_changes"].as_object().into_iter().flatten() {
        outln!();
        line!("MCP server {server} now lists other tools than the session pinned (not adopted; run --refresh-tools adopts them):");
        for change in changes.as_array().unwrap_or(empty) {
            line!("  {}", change.as_str().unwrap_or_default());
        }
    }
}
