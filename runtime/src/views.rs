//! The data the CLI prints with `--json` and the daemon's API returns: one
//! shape for both, built here.

use crate::runner::TurnEnd;
use crate::session::read_events;
use crate::snapshot::Summary;
use eventlog::{EventLog, Record, SessionMeta};
use replay::{plan, CallDecision, Event, NextStep, SessionState};
use serde_json::{json, Value};
use uuid::Uuid;

/// UTC time with milliseconds, e.g. `2026-11-29T19:40:01.123Z`.
pub fn format_time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| format!("{ms}ms"))
}

/// A session in a listing: status, size, activity, usage.
pub fn session_summary(meta: &SessionMeta, summary: &Summary) -> Value {
    let t = &summary.totals;
    json!({
        "session": meta.session,
        "agent": summary.agent,
        "status": summary.status,
        "waits_for_a_person": summary.waits_for_a_person,
        "answer_cut_off": summary.answer_cut_off,
        "prompt_tokens_last": summary.prompt_tokens_last,
        "kv_bytes_last": summary.kv_bytes_last,
        "context_window": summary.context_window,
        "events": meta.events,
        "created": format_time(meta.created_ms),
        "last_activity": format_time(meta.updated_ms),
        "model_calls": t.model_calls,
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        "cached_tokens": t.cached_tokens,
        "cache_hit_ratio": t.cache_hit_ratio(),
        "cost": t.cost,
    })
}

/// A listing's row for a session whose summary may not be readable: an
/// unreadable session is listed with its error, not hidden, and does not
/// fail the listing.
pub fn session_row(meta: &SessionMeta, summary: Result<Summary, crate::RuntimeError>) -> Value {
    match summary {
        Ok(summary) => session_summary(meta, &summary),
        Err(error) => json!({
            "session": meta.session,
            "agent": "",
            "status": "unreadable",
            "error": error.to_string(),
            "events": meta.events,
            "created": format_time(meta.created_ms),
            "last_activity": format_time(meta.updated_ms),
        }),
    }
}

/// The result of checking one session's chain (and that every record
/// decodes as an event this build knows).
pub async fn verify(log: &dyn EventLog, session: Uuid) -> Value {
    let checked = match log.verify(session).await {
        Ok(n) => read_events(log, session)
            .await
            .map(|_| n)
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
            json!({"session": session, "ok": true, "events": events, "head": head})
        }
        Err(error) => json!({"session": session, "ok": false, "error": error}),
    }
}

/// The dry run: the next request exactly as it would be sent, its digest,
/// and what resuming would do with each open call.
pub fn replay(session: Uuid, state: &SessionState) -> Value {
    let plan = plan(state);
    let calls: Vec<Value> = plan
        .calls
        .iter()
        .map(|c| {
            let (decision, reason) = describe_decision(&c.decision);
            json!({"call_id": c.call_id, "tool": c.tool, "decision": decision, "reason": reason})
        })
        .collect();
    let body = replay::next_request(&session.to_string(), state);
    let request = body.as_deref().map_or(Value::Null, |b| {
        serde_json::from_slice(b).unwrap_or(Value::Null)
    });
    json!({
        "session": session,
        "agent": state.spec.as_ref().map_or("", |s| s.name.as_str()),
        "events": state.last_seq,
        "status": state.status().to_string(),
        "next": describe_next(&plan.next),
        "calls": calls,
        "request_bytes": body.as_ref().map_or(0, Vec::len),
        "request_digest": body.as_deref().map(replay::digest_hex),
        "request": request,
    })
}

/// A stored event with its envelope and hashes.
pub fn record(record: &Record, event: &Event) -> Value {
    let e = &record.envelope;
    json!({
        "session": e.session, "seq": e.seq, "event_id": e.event_id, "ts": format_time(e.ts_ms),
        "caused_by": e.caused_by, "schema": e.schema, "kind": e.kind,
        "prev_hash": e.prev_hash.to_hex(), "hash": record.hash.to_hex(), "event": event,
    })
}

/// How a drive of a session ended.
pub fn turn_end(session: Uuid, end: &TurnEnd) -> Value {
    match end {
        TurnEnd::Answered(answer) => {
            json!({"session": session, "status": "idle", "answer": answer})
        }
        TurnEnd::CutOffAnswer(answer) => {
            json!({"session": session, "status": "idle", "answer": answer, "cut_off": true})
        }
        TurnEnd::NeedsDecision(calls) => {
            let calls: Vec<Value> = calls
                .iter()
                .map(|(c, r)| json!({"call_id": c, "reason": r}))
                .collect();
            json!({"session": session, "status": "paused", "in_doubt": calls})
        }
        TurnEnd::NeedsApproval(calls) => {
            let calls: Vec<Value> = calls
                .iter()
                .map(|(c, t)| json!({"call_id": c, "tool": t}))
                .collect();
            json!({"session": session, "status": "paused", "awaiting_approval": calls})
        }
        TurnEnd::Paused(reason) => {
            json!({"session": session, "status": "paused", "reason": reason})
        }
        TurnEnd::BudgetSpent(reason) => {
            json!({"session": session, "status": "paused", "reason": reason, "budget": true})
        }
        TurnEnd::Failed(error) => json!({"session": session, "status": "failed", "error": error}),
        TurnEnd::Cancelled(by) => json!({"session": session, "status": "cancelled", "by": by}),
    }
}

/// Reads back what [`turn_end`] wrote.
pub fn turn_end_from(value: &Value) -> Option<TurnEnd> {
    let text = |key: &str| value[key].as_str().map(String::from);
    match value["status"].as_str()? {
        "idle" if value["cut_off"] == true => Some(TurnEnd::CutOffAnswer(text("answer")?)),
        "idle" => Some(TurnEnd::Answered(text("answer")?)),
        "failed" => Some(TurnEnd::Failed(text("error")?)),
        "cancelled" => Some(TurnEnd::Cancelled(text("by")?)),
        "paused" => {
            let pairs = |key: &str, second: &str| -> Option<Vec<(String, String)>> {
                value[key]
                    .as_array()?
                    .iter()
                    .map(|c| {
                        Some((
                            c["call_id"].as_str()?.to_string(),
                            c[second].as_str()?.to_string(),
                        ))
                    })
                    .collect()
            };
            if let Some(calls) = pairs("in_doubt", "reason") {
                Some(TurnEnd::NeedsDecision(calls))
            } else if let Some(calls) = pairs("awaiting_approval", "tool") {
                Some(TurnEnd::NeedsApproval(calls))
            } else if value["budget"] == true {
                Some(TurnEnd::BudgetSpent(text("reason")?))
            } else {
                Some(TurnEnd::Paused(text("reason")?))
            }
        }
        _ => None,
    }
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
    }
}

fn describe_next(next: &NextStep) -> String {
    match next {
        NextStep::Nothing => "nothing: the last turn is answered".into(),
        NextStep::CallModel => "call the model".into(),
        NextStep::RunTools => "run tools".into(),
        NextStep::AwaitDecision => {
            "wait for a person's decision (mneme resolve or mneme approve)".into()
        }
        NextStep::Paused(reason) => format!("paused: {reason}"),
        NextStep::OverBudget(reason) => {
            format!("stop: {reason} (mneme resume --extend continues)")
        }
        NextStep::Failed(error) => format!("failed: {error} (mneme resume tries again)"),
        NextStep::Cancelled(by) => format!("cancelled by {by}: nothing runs until a new message"),
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
        let row = session_row(&meta, Err(error));
        assert_eq!(row["status"], "unreadable");
        assert!(
            row["error"].as_str().unwrap().contains("no session"),
            "{row}"
        );
        assert_eq!(row["events"], 3);
    }
}
