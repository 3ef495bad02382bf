//! Events described for people: the one-line summaries the CLI's timeline,
//! `mneme diff` and the web view show.

use replay::spec::MidTurn;
use replay::{CheckAnswer, Event, RerunAnswer, Resolution, SessionOutcome, ToolOutcome};

/// `text` on one line, cut to `max` characters (with `…` when cut).
pub fn clip(text: &str, max: usize) -> String {
    let one_line = text.replace('\n', " ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let clipped: String = one_line.chars().take(max).collect();
    format!("{clipped}…")
}

/// A reply's Responses API output items in a line: their types in order,
/// and the first reasoning summary, clipped.
fn output_items(items: &[String]) -> String {
    let parsed: Vec<serde_json::Value> = items
        .iter()
        .map(|i| serde_json::from_str(i).unwrap_or_default())
        .collect();
    let kinds: Vec<&str> = parsed
        .iter()
        .map(|i| i["type"].as_str().unwrap_or("?"))
        .collect();
    let summary = parsed
        .iter()
        .filter(|i| i["type"] == "reasoning")
        .find_map(|i| i["summary"][0]["text"].as_str());
    match summary {
        Some(text) => format!("({}) reasoning {:?}", kinds.join(", "), clip(text, 60)),
        None => format!("({})", kinds.join(", ")),
    }
}

/// A call's arguments laid out afresh, as a person should read them before
/// a tool gets them: whitespace between tokens dropped (so padding cannot
/// push a member out of sight) and, with `pretty`, one member a line,
/// indented two spaces; every string and number kept byte for byte (no
/// float rounding of a long number). Text that is not JSON is returned as
/// it is.
pub fn laid_out(arguments: &str, pretty: bool) -> String {
    if serde_json::from_str::<serde::de::IgnoredAny>(arguments).is_err() {
        return arguments.to_string();
    }
    let mut out = String::with_capacity(arguments.len());
    let break_line = |out: &mut String, depth: usize| {
        if pretty {
            out.push('\n');
            out.push_str(&"  ".repeat(depth));
        }
    };
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut chars = arguments.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            (in_string, escaped) = match (escaped, c) {
                (true, _) => (true, false),
                (false, '\\') => (true, true),
                (false, '"') => (false, false),
                (false, _) => (true, false),
            };
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.next_if(|c| c.is_whitespace()).is_some() {}
                if let Some(close) = chars.next_if(|c| matches!(c, '}' | ']')) {
                    out.push(close); // empty: on one line
                    continue;
                }
                depth += 1;
                break_line(&mut out, depth);
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                break_line(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                break_line(&mut out, depth);
            }
            ':' if pretty => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

/// A one-line summary of `event` for people: what happened, with the
/// figures that matter (tokens, effects, keys, who decided); long texts are
/// clipped. Not escaped for a terminal or a page: the caller does that.
pub fn summary(event: &Event) -> String {
    match event {
        Event::SessionForked {
            parent,
            rerun: Some(rerun),
            ..
        } => format!(
            "rerun of {parent} (its messages up to seq {}) on another agent; calls with no record {}",
            rerun.through_seq,
            match rerun.live_tools {
                true => "run live (--live-tools)",
                false => "run only if read-only",
            }
        ),
        Event::SessionForked { parent, at_seq, .. } => {
            format!("forked from {parent} at seq {at_seq}")
        }
        Event::SpawnedBy {
            parent,
            seq,
            call_id,
        } => format!("sub-agent of session {parent}: its call {call_id} (#{seq})"),
        Event::HeadSigned { seq, hash, key, .. } => format!(
            "head #{seq} {} signed by key {}",
            clip(hash, 12),
            clip(key, 12)
        ),
        Event::SessionFinished {
            outcome: SessionOutcome::Cancelled { by },
        } => format!("cancelled by {by}"),
        Event::SessionErased { reason, by } => {
            format!("content erased by {by}: {:?}", clip(reason, 80))
        }
        Event::SessionStarted { spec, tenant } => format!(
            "agent {} (provider {}, model {:?}, {} tools){}",
            spec.name,
            spec.model.provider,
            spec.model.model,
            spec.tools.len(),
            tenant
                .as_ref()
                .map_or(String::new(), |t| format!(" for tenant {}", t.name))
        ),
        Event::UserMessage { text } => format!("{:?}", clip(text, 100)),
        Event::ModelReplied(r) => {
            let calls: Vec<String> = r
                .tool_calls
                .iter()
                .map(|c| format!("{}({}) {}", c.name, c.id, clip(&laid_out(&c.arguments, false), 60)))
                .collect();
            let what = match (&r.content, calls.is_empty()) {
                (Some(text), true) => format!("answer {:?}", clip(text, 80)),
                (_, false) => format!("calls {}", calls.join(", ")),
                (None, true) => "empty reply".into(),
            };
            let what = match &r.reasoning {
                Some(thought) => format!("{what}; reasoning {:?}", clip(thought, 60)),
                None => what,
            };
            let what = match r.thinking.len() {
                0 => what,
                n => format!("{what}; {n} thinking block(s) {}", clip(&r.thinking[0], 60)),
            };
            let what = match r.items.len() {
                0 => what,
                n => format!("{what}; {n} output item(s) {}", output_items(&r.items)),
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
                "{what}; tokens {} in ({} cached{}) / {} out{}; {} ms{first}; finish {:?}{prefix}",
                r.usage.prompt_tokens,
                r.usage.cached_tokens,
                match r.usage.cache_write_tokens {
                    0 => String::new(),
                    n => format!(", {n} written to the cache"),
                },
                r.usage.completion_tokens,
                match r.usage.reasoning_tokens {
                    0 => String::new(),
                    n => format!(" ({n} reasoning)"),
                },
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
            settled_by_check,
            rerun,
            child,
        } => {
            let how = match (settled_by_check, rerun, child) {
                (true, ..) => " (settled by its check)".to_string(),
                (false, Some(RerunAnswer::Recorded { session, seq, call_id }), _) => {
                    format!(" (answered from the record: {call_id} of {session}, seq {seq})")
                }
                (false, Some(RerunAnswer::NotRun), _) => " (not run in a rerun)".to_string(),
                (false, None, Some(child)) => format!(
                    " (sub-agent session {}: {} model requests, {} tokens in / {} out)",
                    child.session,
                    child.totals.model_calls,
                    child.totals.prompt_tokens,
                    child.totals.completion_tokens
                ),
                (false, None, None) => String::new(),
            };
            match outcome {
                ToolOutcome::Ok(out) => {
                    // What the model was told it came from is said above.
                    let prefix = replay::prompt::SETTLED_BY_CHECK_PREFIX;
                    let out = out.strip_prefix(prefix).unwrap_or(out);
                    format!("{call_id} ok in {duration_ms} ms{how}: {}", clip(out, 80))
                }
                ToolOutcome::Err(err) => {
                    format!(
                        "{call_id} error in {duration_ms} ms{how}: {}",
                        clip(err, 80)
                    )
                }
            }
        }
        Event::ToolChecked {
            call_id,
            attempt,
            answer,
            duration_ms,
            ..
        } => {
            let answer = match answer {
                CheckAnswer::Applied => "applied".to_string(),
                CheckAnswer::NotApplied => "not applied: it runs again with its key".into(),
                CheckAnswer::Unknown(why) => format!("unknown ({}): in doubt", clip(why, 120)),
            };
            format!("{call_id} attempt {attempt} checked in {duration_ms} ms: {answer}")
        }
        Event::ToolInDoubt { call_id, reason } => format!("{call_id}: {}", clip(reason, 200)),
        Event::MidTurnMessage { text, policy } => {
            let what = match policy {
                MidTurn::Queue => "queued: its own turn follows the running one",
                MidTurn::Interrupt => "interrupts: the running turn takes it at its next step",
                MidTurn::Reject => "rejected: a turn was running",
            };
            format!("{:?} ({what})", clip(text, 100))
        }
        Event::MidTurnDelivered { arrived } => {
            format!("the message of seq {arrived} enters the conversation")
        }
        Event::WakeScheduled {
            call_id,
            at_ms,
            event,
            deadline_ms,
        } => match (at_ms, event, deadline_ms) {
            (Some(at), _, _) => format!("{call_id} sleeps until {}", crate::format_time(*at)),
            (None, Some(event), Some(deadline)) => format!(
                "{call_id} sleeps until event {} (at most until {})",
                clip(event, 60),
                crate::format_time(*deadline)
            ),
            (None, Some(event), None) => format!("{call_id} sleeps until event {}", clip(event, 60)),
            (None, None, _) => format!("{call_id} sleeps"),
        },
        Event::Woken {
            call_id,
            by,
            late_ms,
            ..
        } => match late_ms {
            0 => format!("{call_id} woke ({by})"),
            late => format!("{call_id} woke ({by}), {:.1} s late", *late as f64 / 1000.0),
        },
        Event::ApprovalRequested {
            call_id,
            expires_at_ms,
        } => match expires_at_ms {
            Some(at) => format!(
                "{call_id} waits for approval until {}",
                crate::format_time(*at)
            ),
            None => format!("{call_id} waits for approval"),
        },
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
            reason,
            args,
        } => match (approved, reason.as_deref(), args) {
            (false, Some(replay::EXPIRED), _) => {
                format!("{call_id} denied by {by}: its approval expired")
            }
            (false, Some(reason), _) => format!("{call_id} denied by {by}: {}", clip(reason, 200)),
            (false, None, _) => format!("{call_id} denied by {by}"),
            (true, _, Some(args)) => format!(
                "{call_id} approved with edited arguments by {by}: {}",
                clip(args, 200)
            ),
            (true, _, None) => format!("{call_id} approved by {by}"),
        },
        Event::ToolResolved {
            call_id,
            resolution,
            by,
        } => {
            let what = match resolution {
                Resolution::Retry => "retry".to_string(),
                Resolution::Skip(result) => format!("skip with result {}", clip(result, 60)),
                Resolution::Fail(message) => format!("fail: {}", clip(message, 200)),
            };
            format!("{call_id}: {what} (by {by})")
        }
        Event::SessionPaused { reason, .. } => clip(reason, 200),
        Event::SessionResumed {
            by,
            extend_budget,
            after_crash,
        } => match (extend_budget, after_crash) {
            (_, true) => format!("by {by}, after the process running the turn died: the turn goes on"),
            (true, _) => format!("by {by}, with the turn's budget started again"),
            (false, false) => format!("by {by}"),
        },
        Event::SessionFinished {
            outcome: SessionOutcome::Failed(error),
        } => format!("failed: {}", clip(error, 200)),
        Event::SpecChanged { spec, by } => format!(
            "from here on agent {} (provider {}, model {:?}, {} tools), by {by}",
            spec.name,
            spec.model.provider,
            spec.model.model,
            spec.tools.len()
        ),
        Event::McpToolsChanged { server, changes } => format!(
            "MCP server {server} now lists other tools (not adopted): {}",
            clip(&changes.join("; "), 200)
        ),
        Event::ScheduledBy { schedule, tick_ms } => format!(
            "by schedule {schedule}, its tick at {}",
            crate::format_time(*tick_ms)
        ),
        Event::ScheduleCreated { schedule } => schedule_summary(schedule),
        Event::ScheduleFired { tick_ms, session } => format!(
            "tick at {}: session {session}",
            crate::format_time(*tick_ms)
        ),
        Event::ScheduleSkipped {
            from_ms,
            to_ms,
            ticks,
            reason,
        } => match ticks {
            1 => format!("tick at {} skipped ({reason})", crate::format_time(*from_ms)),
            _ => format!(
                "{ticks} ticks from {} to {} skipped ({reason})",
                crate::format_time(*from_ms),
                crate::format_time(*to_ms)
            ),
        },
        Event::ScheduleRemoved { by } => format!("removed by {by}"),
        Event::TenantAdded { name, by, .. } => format!("tenant {name} added by {by}"),
        Event::TenantTokenIssued { tenant, digest, by } => format!(
            "a token of tenant {tenant} issued by {by} (SHA-256 {})",
            clip(digest, 12)
        ),
        Event::TenantTokensRevoked { tenant, by } => {
            format!("every token of tenant {tenant} revoked by {by}")
        }
        Event::TenantLimitsSet { tenant, limits, by } => format!(
            "limits of tenant {tenant} set by {by}: max_cost_per_day {}",
            limits
                .max_cost_per_day
                .map_or("none".to_string(), |c| c.to_string())
        ),
        Event::TenantErased { tenant, reason, by } => format!(
            "tenant {tenant} erased by {by}: {:?}",
            clip(reason, 80)
        ),
        Event::SpendReserved { session, cost, cap } => {
            format!("{cost:.6} reserved for session {session} (cap {cap})")
        }
        Event::SpendSettled { reserved, cost } => {
            format!("reservation of seq {reserved} settled at {cost:.6}")
        }
        Event::McpToolsRefreshed {
            server,
            tools,
            changes,
            by,
        } => format!(
            "MCP server {server}: {} tools adopted by {by}: {}",
            tools.len(),
            clip(&changes.join("; "), 200)
        ),
    }
}

/// A schedule's creation for people: when, what it sends where, and its
/// policies.
fn schedule_summary(schedule: &replay::schedule::ScheduleSpec) -> String {
    use replay::schedule::Target;
    let into = match (&schedule.into, &schedule.agent) {
        (Target::Session(id), _) => format!("to session {id}"),
        (Target::New, Some(agent)) => format!("to a new session of agent {agent}"),
        (Target::New, None) => "to a new session".into(),
    };
    format!(
        "{}: {} {into} (overlap {}, catch up {})",
        schedule.when,
        clip(&schedule.message, 60),
        schedule.overlap,
        schedule.catch_up
    )
}

#[cfg(test)]
mod tests {
    use super::laid_out;

    #[test]
    fn arguments_are_laid_out_afresh_with_every_value_kept_exactly() {
        let padded = format!(
            "{{\"to\": \"alice\",{}\"cents\" :12345678901234567890123, \"memo\": \"a,  b: {{c}}\\\"\", \"tags\": [ ], \"at\": {{}}}}",
            "\n".repeat(400)
        );
        assert_eq!(
            laid_out(&padded, false),
            r#"{"to":"alice","cents":12345678901234567890123,"memo":"a,  b: {c}\"","tags":[],"at":{}}"#
        );
        assert_eq!(
            laid_out(r#"{"a":[1,{"b":null}],"c":"x"}"#, true),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": \"x\"\n}"
        );
        assert_eq!(laid_out("not json {", true), "not json {", "as it is");
    }
}
