//! The data the CLI prints with `--json` and the daemon's API returns: one
//! shape for both, built here.

use crate::api::{
    EventRecord, InDoubtCall, PlannedCall, ReplayView, SessionStatus, SessionSummary, SessionView,
    ToolView, TurnOutcome, Verified, WaitingCall,
};
use crate::session::decode_every_event;
use crate::snapshot::Summary;
use api::TurnEnd;
use eventlog::{EventLog, Record, SessionMeta};
use replay::{plan, CallDecision, Event, NextStep, ResumePlan, SessionState};
use serde_json::Value;
use uuid::Uuid;

/// UTC time with milliseconds, e.g. `2026-11-29T19:40:01.123Z`.
pub(crate) use api::format_time;

/// A session in a listing: status, size, activity, usage.
pub fn summary_of(meta: &SessionMeta, summary: &Summary) -> SessionSummary {
    let t = &summary.totals;
    SessionSummary {
        session: meta.session,
        tenant: summary.tenant.clone(),
        parent: summary.parent,
        forked_from: summary.forked_from,
        rerun_of: summary.rerun_of,
        title: Some(summary.title.clone()).filter(|t| !t.is_empty()),
        agent: summary.agent.clone(),
        status: summary.status.parse().unwrap_or(SessionStatus::Unreadable),
        interrupted: None,
        pending: None,
        error: None,
        events: meta.events,
        created: format_time(meta.created_ms),
        last_activity: format_time(meta.updated_ms),
        waits_for_a_person: Some(summary.waits_for_a_person),
        resumable: Some(summary.resumable()),
        answer_cut_off: Some(summary.answer_cut_off),
        approval_expires_at: summary.approval_expires_ms.map(format_time),
        wakes_at: summary.wakes_at_ms.map(format_time),
        waits_for: summary.waits_for.clone(),
        prompt_tokens_last: Some(summary.prompt_tokens_last),
        kv_bytes_last: summary.kv_bytes_last,
        context_window: summary.context_window,
        model_calls: Some(t.model_calls),
        prompt_tokens: Some(t.prompt_tokens),
        completion_tokens: Some(t.completion_tokens),
        cached_tokens: Some(t.cached_tokens),
        reasoning_tokens: Some(t.reasoning_tokens).filter(|n| *n > 0),
        cache_hit_ratio: Some(t.cache_hit_ratio()),
        cost: Some(t.cost),
    }
}

/// A listing's row for a session whose summary may not be readable: an
/// unreadable session is listed with its error, not hidden, and does not
/// fail the listing.
pub(crate) fn row_of(
    meta: &SessionMeta,
    summary: Result<Summary, crate::RuntimeError>,
) -> SessionSummary {
    match summary {
        Ok(summary) => summary_of(meta, &summary),
        Err(error) => SessionSummary {
            session: meta.session,
            tenant: None,
            parent: None,
            forked_from: None,
            rerun_of: None,
            title: None,
            agent: String::new(),
            status: SessionStatus::Unreadable,
            interrupted: None,
            pending: None,
            error: Some(error.to_string()),
            events: meta.events,
            created: format_time(meta.created_ms),
            last_activity: format_time(meta.updated_ms),
            waits_for_a_person: None,
            resumable: None,
            answer_cut_off: None,
            approval_expires_at: None,
            wakes_at: None,
            waits_for: None,
            prompt_tokens_last: None,
            kv_bytes_last: None,
            context_window: None,
            model_calls: None,
            prompt_tokens: None,
            completion_tokens: None,
            cached_tokens: None,
            reasoning_tokens: None,
            cache_hit_ratio: None,
            cost: None,
        },
    }
}

/// `value` as JSON (every API type serializes).
fn to_json(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("API types serialize")
}

/// The result of checking one session's chain (and that every record
/// decodes as an event this build knows).
pub async fn verified(log: &dyn EventLog, session: Uuid) -> Verified {
    let checked = match log.verify(session).await {
        Ok(n) => decode_every_event(log, session, n)
            .await
            .map(|()| n)
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match checked {
        Ok(events) => {
            let head = log
                .head(session)
                .await
                .map(|h| h.hash.to_hex())
                .unwrap_or_default();
            Verified {
                session,
                ok: true,
                events: Some(events),
                head: Some(head),
                error: None,
                signed: None,
            }
        }
        Err(error) => Verified {
            session,
            ok: false,
            events: None,
            head: None,
            error: Some(error),
            signed: None,
        },
    }
}

/// A session's page: its listing `row`, the owner of its live lease, and
/// what its state holds for a person (answer, calls in doubt or waiting,
/// parent and children).
pub(crate) fn session_view(
    row: SessionSummary,
    running_on: Option<String>,
    id: Uuid,
    state: &SessionState,
) -> SessionView {
    SessionView {
        summary: row,
        answer: state.answer().map(String::from),
        running_on,
        in_doubt: (state.calls_in_doubt().iter())
            .map(InDoubtCall::from)
            .collect(),
        waiting: waiting_calls(state),
        spawned_by: state.parent.clone().map(Into::into),
        children: state.children(id).into_iter().map(Into::into).collect(),
        scheduled_by: state.scheduled_by.map(|by| api::ScheduledByView {
            schedule: by.schedule,
            tick: api::format_time(by.tick_ms),
        }),
    }
}

/// The dry run: the next request exactly as it would be sent, its digest,
/// and what resuming would do with each open call.
pub(crate) fn replay_view(session: Uuid, state: &SessionState) -> ReplayView {
    let plan = plan(state);
    let calls = plan
        .calls
        .iter()
        .map(|c| {
            let (decision, reason) = describe_decision(&c.decision);
            PlannedCall {
                call_id: c.call_id.clone(),
                tool: c.tool.clone(),
                decision: decision.into(),
                reason,
            }
        })
        .collect();
    let body = replay::next_request(&session.to_string(), state);
    let request = body.as_deref().map_or(Value::Null, |b| {
        serde_json::from_slice(b).unwrap_or(Value::Null)
    });
    ReplayView {
        session,
        agent: state.spec.as_ref().map_or("", |s| s.name.as_str()).into(),
        events: state.last_seq,
        status: state.status().into(),
        interrupted: None,
        pending: None,
        next: describe_next(&plan, session),
        calls,
        request_bytes: body.as_ref().map_or(0, Vec::len) as u64,
        request_digest: body.as_deref().map(replay::digest_hex),
        request,
        tools: state
            .spec
            .iter()
            .flat_map(|s| &s.tools)
            .map(tool_view)
            .collect(),
        mcp_changes: state.mcp_changes.clone(),
    }
}

fn tool_view(tool: &replay::ToolSpec) -> ToolView {
    let kind = serde_json::to_value(tool.kind).unwrap_or_default();
    ToolView {
        name: tool.name.clone(),
        kind: kind.as_str().unwrap_or_default().to_string(),
        effect: tool.effect.to_string(),
        effect_from: tool
            .mcp
            .as_ref()
            .map_or("agent file".to_string(), |m| m.effect_from.to_string()),
        safe_to_rerun: tool.safe_to_rerun(),
        requires_approval: tool.requires_approval,
        approval_timeout: tool.approval_timeout.clone(),
        mcp_server: tool.mcp.as_ref().map(|m| m.server.clone()),
        annotations: tool.mcp.as_ref().and_then(|m| m.annotations.clone()),
    }
}

/// Every call of `state` that waits for a person, with its arguments.
pub fn waiting_calls(state: &SessionState) -> Vec<WaitingCall> {
    let in_doubt = state.calls_in_doubt();
    let awaiting = state.calls_awaiting_approval();
    let waits = |id: &str| {
        if let Some(waiting) = in_doubt.iter().find(|w| w.call_id == id) {
            return Some(("decision", waiting.reason.clone()));
        }
        (awaiting.iter().any(|w| w.call_id == id))
            .then(|| ("approval", "waits for approval".into()))
    };
    state
        .open_calls()
        .iter()
        .filter_map(|c| {
            let (waits_for, reason) = waits(&c.call.id)?;
            Some(WaitingCall {
                call_id: c.call.id.clone(),
                tool: c.call.name.clone(),
                arguments: c.call.arguments.clone(),
                description: (state.spec.as_ref())
                    .and_then(|spec| spec.tool(&c.call.name))
                    .map(|tool| tool.description.clone())
                    .unwrap_or_default(),
                waits_for: waits_for.into(),
                reason,
                expires_at: (waits_for == "approval")
                    .then_some(c.approval_expires_at_ms)
                    .flatten()
                    .map(format_time),
            })
        })
        .collect()
}

/// A stored event with its envelope and hashes.
pub fn record(record: &Record, event: &Event) -> Value {
    let e = &record.envelope;
    to_json(EventRecord {
        session: e.session,
        seq: e.seq,
        event_id: e.event_id,
        ts: format_time(e.ts_ms),
        caused_by: e.caused_by,
        schema: e.schema,
        kind: e.kind.clone(),
        summary: crate::describe::summary(event),
        prev_hash: e.prev_hash.to_hex(),
        hash: record.hash.to_hex(),
        event: to_json(event),
    })
}

/// How a drive of a session ended.
pub fn turn_end(session: Uuid, end: &TurnEnd) -> Value {
    to_json(TurnOutcome::new(session, end))
}

fn describe_decision(decision: &CallDecision) -> (&'static str, String) {
    match decision {
        CallDecision::Reuse => ("reuse", "finished: its recorded result is reused".into()),
        CallDecision::Run => ("run", "never started".into()),
        CallDecision::Rerun => (
            "rerun",
            "started, not finished; safe to run again with the same idempotency key".into(),
        ),
        CallDecision::InDoubt(reason) => ("in_doubt", reason.clone()),
        CallDecision::AwaitingDecision(reason) => ("awaiting_decision", reason.clone()),
        CallDecision::NeedsApproval => (
            "needs_approval",
            "its tool requires a person's approval; the request is recorded next".into(),
        ),
        CallDecision::AwaitingApproval => (
            "awaiting_approval",
            "waits for a person's approval (mneme approve)".into(),
        ),
        CallDecision::Sleeping => (
            "sleeping",
            "sleeps until its time or its event (mneme wake); nothing runs it until then".into(),
        ),
        CallDecision::Check => (
            "check",
            "started, not finished, unsafe to run again: its tool's check is asked whether it applied"
                .into(),
        ),
    }
}

/// What a resume of `session` would do next, in words: the calls it runs,
/// those it records in doubt, and what a person runs then.
fn describe_next(plan: &ResumePlan, session: Uuid) -> String {
    let tools = |pick: fn(&CallDecision) -> bool| {
        let named: Vec<&str> = (plan.calls.iter())
            .filter(|c| pick(&c.decision))
            .map(|c| c.tool.as_str())
            .collect();
        named.join(", ")
    };
    let count =
        |pick: fn(&CallDecision) -> bool| plan.calls.iter().filter(|c| pick(&c.decision)).count();
    let in_doubt = count(|d| {
        matches!(
            d,
            CallDecision::InDoubt(_) | CallDecision::AwaitingDecision(_)
        )
    });
    let approvals = count(|d| {
        matches!(
            d,
            CallDecision::NeedsApproval | CallDecision::AwaitingApproval
        )
    });
    match &plan.next {
        NextStep::Nothing => "nothing: the last turn is answered".into(),
        NextStep::CallModel => "call the model".into(),
        NextStep::Deliver => {
            "deliver the messages that arrived mid-turn, then call the model".into()
        }
        NextStep::RunTools => {
            let mut steps = Vec::new();
            let run = tools(|d| *d == CallDecision::Run);
            if !run.is_empty() {
                steps.push(format!("run {run}"));
            }
            let rerun = tools(|d| *d == CallDecision::Rerun);
            if !rerun.is_empty() {
                steps.push(format!("run {rerun} again with the same idempotency key"));
            }
            let check = tools(|d| *d == CallDecision::Check);
            if !check.is_empty() {
                steps.push(format!(
                    "ask the check of {check} whether it applied (if it cannot tell, the call is in doubt)"
                ));
            }
            let recorded = tools(|d| matches!(d, CallDecision::InDoubt(_)));
            if !recorded.is_empty() {
                steps.push(format!("record {recorded} in doubt"));
            }
            match in_doubt + approvals {
                0 => steps.push("call the model".into()),
                _ => steps.push(ask_a_person(in_doubt, approvals, session)),
            }
            steps.join(", then ")
        }
        NextStep::AwaitDecision => ask_a_person(in_doubt, approvals, session),
        NextStep::Sleep => "sleep: nothing runs until a sleeping call wakes".into(),
        // Paused on the calls that wait: a resume stops there again.
        NextStep::Paused(_) if in_doubt + approvals > 0 => {
            ask_a_person(in_doubt, approvals, session)
        }
        NextStep::Paused(reason) => format!("paused: {reason}"),
        NextStep::OverBudget(reason) => {
            format!("stop: {reason} (mneme resume --extend continues)")
        }
        NextStep::Failed(error) => format!("failed: {error} (mneme resume tries again)"),
        NextStep::Cancelled(by) => format!("cancelled by {by}: nothing runs until a new message"),
        NextStep::Erased(by) => format!("erased by {by}: nothing runs in it again"),
    }
}

/// Stopping for a person (exit 3 at the command line): `in_doubt` calls
/// to settle, `approvals` to approve or deny, with the commands that do.
fn ask_a_person(in_doubt: usize, approvals: usize, session: Uuid) -> String {
    let calls = |n: usize| match n {
        1 => "1 call".to_string(),
        n => format!("{n} calls"),
    };
    let mut asks = Vec::new();
    if in_doubt > 0 {
        asks.push(format!(
            "{} in doubt (mneme resolve {session} CALL --retry | --skip --result JSON | --fail MSG)",
            calls(in_doubt)
        ));
    }
    if approvals > 0 {
        asks.push(format!(
            "{} to approve (mneme approve {session} CALL [--deny])",
            calls(approvals)
        ));
    }
    match asks.is_empty() {
        true => "wait for a person's decision (mneme resolve or mneme approve)".into(),
        false => format!("stop and ask a person: {}", asks.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_session_is_listed_with_its_error() {
        let meta = SessionMeta {
            session: Uuid::nil(),
            events: 3,
            created_ms: 0,
            updated_ms: 0,
            last_kind: "UserMessage".into(),
        };
        let error = crate::RuntimeError::NoSuchSession(Uuid::nil());
        let row = to_json(row_of(&meta, Err(error)));
        assert_eq!(row["status"], "unreadable");
        assert!(
            row["error"].as_str().unwrap().contains("no session"),
            "{row}"
        );
        assert_eq!(row["events"], 3);
    }

    #[tokio::test]
    async fn verify_decodes_every_event_a_chunk_at_a_time_and_names_one_that_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let log = eventlog::SledLog::open(dir.path()).unwrap();
        let message = |text: String| {
            let event = Event::UserMessage { text };
            eventlog::NewEvent {
                kind: event.kind().into(),
                schema: replay::EVENT_SCHEMA,
                caused_by: None,
                payload: event.encode(),
            }
        };
        let (good, bad) = (Uuid::now_v7(), Uuid::now_v7());
        // Past the first chunk, so the second is read and decoded too.
        let events = || (0..5_000).map(|i| message(format!("m{i}")));
        log.append(good, 1, events().collect()).await.unwrap();
        let mut broken: Vec<_> = events().collect();
        broken[4_500].payload = vec![0xc1];
        log.append(bad, 1, broken).await.unwrap();

        let checked = verified(&log, good).await;
        assert!(checked.ok, "{:?}", checked.error);
        assert_eq!(checked.events, Some(5_000));
        let checked = verified(&log, bad).await;
        assert!(!checked.ok);
        let error = checked.error.unwrap();
        assert!(
            error.contains("seq 4501") && error.contains("does not decode"),
            "{error}"
        );
    }
}
