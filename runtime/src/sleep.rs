//! Durable sleep: what a call of a tool of kind `sleep` asks for, what is
//! recorded when it sleeps and when it wakes, and what the model is told.
//! Nothing holds a thread, a process or a lease while a session sleeps:
//! whoever looks at it when its time comes (a daemon's deadline loop,
//! `mneme resume`) or delivers its event (`mneme wake`) wakes it.

use replay::spec::{DEFAULT_MAX_OUTPUT_BYTES, MAX_SLEEP_SECONDS};
use replay::SessionState;
use replay::{Event, ToolOutcome, Wake, WokenBy};
use serde_json::{json, Value};

/// Longest name of an event a call may wait for.
const MAX_EVENT_NAME: usize = 128;

/// The wake a call with `args` (the model's JSON text) asks for, made at
/// `now_ms`; or what is wrong with its arguments, for the model.
pub(crate) fn wake_for(args: &str, now_ms: i64) -> Result<Wake, String> {
    let args: Value =
        serde_json::from_str(args).map_err(|e| format!("arguments are not JSON: {e}"))?;
    let seconds = |field: &str| -> Result<Option<i64>, String> {
        match args.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => match value.as_f64() {
                Some(s) if s.is_finite() && (0.0..=MAX_SLEEP_SECONDS as f64).contains(&s) => {
                    Ok(Some((s * 1000.0).round() as i64))
                }
                _ => Err(format!(
                    "{field} must be a number of seconds from 0 to {MAX_SLEEP_SECONDS}, not {value}"
                )),
            },
        }
    };
    let after = seconds("seconds")?;
    let timeout = seconds("timeout_seconds")?;
    let until = match args.get("until") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => {
            let at = chrono::DateTime::parse_from_rfc3339(text)
                .map_err(|e| format!("until {text:?} is not an RFC 3339 time: {e}"))?
                .timestamp_millis();
            if at > now_ms + MAX_SLEEP_SECONDS as i64 * 1000 {
                return Err(format!("until {text:?} is more than a year away"));
            }
            Some(at)
        }
        Some(other) => return Err(format!("until must be an RFC 3339 time, not {other}")),
    };
    let event = match args.get("event") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if is_event_name(name) => Some(name.clone()),
        Some(other) => {
            return Err(format!(
                "event must be a name of 1 to {MAX_EVENT_NAME} letters, digits, '_', '-', '.' or ':', not {other}"
            ))
        }
    };
    match (after, until, event) {
        (Some(ms), None, None) if timeout.is_none() => Ok(Wake {
            at_ms: Some(now_ms.saturating_add(ms)),
            event: None,
            deadline_ms: None,
        }),
        (None, Some(at), None) if timeout.is_none() => Ok(Wake {
            at_ms: Some(at),
            event: None,
            deadline_ms: None,
        }),
        (None, None, Some(event)) => Ok(Wake {
            at_ms: None,
            event: Some(event),
            deadline_ms: timeout.map(|ms| now_ms.saturating_add(ms)),
        }),
        _ => Err(
            "give exactly one of seconds, until or event (timeout_seconds only with event)".into(),
        ),
    }
}

/// What a call of the sleep tool `tool` with `args` records as it starts
/// (`ctx` gives its id, key and attempt): its `ToolStarted` and its
/// `WakeScheduled`, or, for arguments that ask for no valid wake, its
/// `ToolFinished` telling the model what is wrong. One append.
pub(crate) fn fall_asleep(ctx: &tools::CallContext, tool: &str, args: &str) -> Vec<Event> {
    let started = Event::ToolStarted {
        call_id: ctx.call_id.clone(),
        tool: tool.to_string(),
        args: args.to_string(),
        effect: replay::Effect::ReadOnly,
        idempotency_key: ctx.idempotency_key.clone(),
        attempt: ctx.attempt,
    };
    let then = match wake_for(args, crate::text::now_ms()) {
        Ok(wake) => Event::WakeScheduled {
            call_id: ctx.call_id.clone(),
            at_ms: wake.at_ms,
            event: wake.event,
            deadline_ms: wake.deadline_ms,
        },
        Err(why) => Event::ToolFinished {
            call_id: ctx.call_id.clone(),
            outcome: ToolOutcome::Err(format!("{tool}: {why}")),
            duration_ms: 0,
            settled_by_check: false,
            rerun: None,
            child: None,
        },
    };
    vec![started, then]
}

/// Records `events` (a wake's: [`due`], [`by_event`]) in `session`,
/// durably.
pub(crate) async fn record(
    session: &mut crate::session::Session,
    events: Vec<Event>,
    durability: eventlog::Durability,
) -> Result<(), crate::error::RuntimeError> {
    session.append(events, None).await?;
    session.barrier(durability).await?;
    crate::control::crash::point(crate::control::crash::WOKEN_DURABLE);
    Ok(())
}

/// How a turn whose calls sleep ends: when it wakes on its own, and on
/// what event it waits.
pub(crate) fn turn_end(state: &replay::SessionState) -> api::TurnEnd {
    api::TurnEnd::Sleeping {
        wakes_at_ms: state.next_wake_ms(),
        event: state.awaited_event().map(String::from),
    }
}

/// Whether `name` may name an event: 1 to 128 ASCII letters, digits, `_`,
/// `-`, `.` or `:` (it appears in URLs, commands and terminals).
pub fn is_event_name(name: &str) -> bool {
    (1..=MAX_EVENT_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
}

/// What the model is told when a call that slept with `wake` woke `by`
/// at `now_ms`, with the event's `payload`.
fn woken_result(wake: &Wake, by: WokenBy, now_ms: i64, payload: Option<&Value>) -> String {
    let at = api::format_time(now_ms);
    let late = wake.due_at_ms().map_or(0, |due| (now_ms - due).max(0));
    let mut result = match by {
        WokenBy::Timer => json!({"woke": "timer", "at": at}),
        WokenBy::Event => {
            json!({"woke": "event", "event": wake.event, "at": at, "payload": payload})
        }
        WokenBy::Deadline => json!({"woke": "deadline", "event": wake.event, "at": at,
            "note": "the event did not come before the timeout"}),
    };
    if by != WokenBy::Event && late >= 1000 {
        result["late_seconds"] = json!(late / 1000);
    }
    result.to_string()
}

/// The events that wake the sleeping call `call_id` (with `wake`) `by`
/// at `now_ms`: its `Woken` and its `ToolFinished`, one append.
fn woken(
    call_id: &str,
    wake: &Wake,
    by: WokenBy,
    now_ms: i64,
    payload: Option<&Value>,
) -> Vec<Event> {
    let late_ms = match by {
        WokenBy::Event => 0,
        _ => wake
            .due_at_ms()
            .map_or(0, |due| (now_ms - due).max(0) as u64),
    };
    vec![
        Event::Woken {
            call_id: call_id.to_string(),
            by,
            payload: payload.map(Value::to_string),
            late_ms,
        },
        Event::ToolFinished {
            call_id: call_id.to_string(),
            outcome: ToolOutcome::Ok(woken_result(wake, by, now_ms, payload)),
            duration_ms: 0,
            settled_by_check: false,
            rerun: None,
            child: None,
        },
    ]
}

/// The events that wake every call of `state` whose time or deadline is
/// at or before `now_ms` (none unless the session sleeps: not while a
/// person's pause, a cancel or an erasure holds it), and the calls they
/// wake.
pub(crate) fn due(state: &SessionState, now_ms: i64) -> (Vec<Event>, Vec<String>) {
    if state.status() != replay::Status::Sleeping {
        return (Vec::new(), Vec::new());
    }
    let mut events = Vec::new();
    let mut calls = Vec::new();
    for (call_id, wake) in state.sleeping_calls() {
        if let Some(by) = wake.due(now_ms) {
            events.extend(woken(call_id, wake, by, now_ms, None));
            calls.push(call_id.to_string());
        }
    }
    (events, calls)
}

/// The events that deliver event `name` with `payload` at `now_ms` to the
/// call of `state` sleeping until it, and that call; or why not: the
/// session does not sleep (a pause, a cancel), no call waits for that
/// event, or the payload is larger than the sleeping tool's
/// `max_output_bytes`.
pub(crate) fn by_event(
    state: &SessionState,
    name: &str,
    payload: &Value,
    now_ms: i64,
) -> Result<(Vec<Event>, String), String> {
    if state.status() != replay::Status::Sleeping {
        return Err(format!(
            "it is {}: nothing of it sleeps until an event",
            state.status()
        ));
    }
    let (call_id, wake) = (state.sleeping_calls().into_iter())
        .find(|(_, wake)| wake.event.as_deref() == Some(name))
        .ok_or_else(|| format!("no call of it sleeps until event {name:?}"))?;
    let tool = (state.open_calls().iter())
        .find(|c| c.call.id == call_id)
        .and_then(|c| state.spec.as_ref()?.tool(&c.call.name));
    let limit = (tool.and_then(|t| t.max_output_bytes)).unwrap_or(DEFAULT_MAX_OUTPUT_BYTES);
    let size = payload.to_string().len() as u64;
    if size > limit {
        return Err(format!(
            "the payload is {size} bytes; its sleeping call takes at most {limit}"
        ));
    }
    let events = woken(call_id, wake, WokenBy::Event, now_ms, Some(payload));
    Ok((events, call_id.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_asks_for_exactly_one_wake() {
        let now = 1_000_000;
        let timer = wake_for(r#"{"seconds": 3}"#, now).unwrap();
        assert_eq!(
            (timer.at_ms, timer.event, timer.deadline_ms),
            (Some(now + 3000), None, None)
        );
        let until = wake_for(r#"{"until": "1970-01-01T00:20:00Z"}"#, now).unwrap();
        assert_eq!(until.at_ms, Some(1_200_000));
        let event = wake_for(r#"{"event": "payment.landed", "timeout_seconds": 60}"#, now).unwrap();
        assert_eq!(event.event.as_deref(), Some("payment.landed"));
        assert_eq!(event.deadline_ms, Some(now + 60_000));
        for bad in [
            r#"{}"#,
            r#"{"seconds": 3, "event": "x"}"#,
            r#"{"seconds": -1}"#,
            r#"{"seconds": "soon"}"#,
            r#"{"seconds": 1e12}"#,
            r#"{"until": "tomorrow"}"#,
            r#"{"until": "9999-01-01T00:00:00Z"}"#,
            r#"{"event": "../x"}"#,
            r#"{"event": ""}"#,
            r#"{"seconds": 3, "timeout_seconds": 5}"#,
            "not json",
        ] {
            let error = wake_for(bad, now).unwrap_err();
            assert!(!error.is_empty(), "{bad}");
        }
    }

    #[test]
    fn a_late_wake_says_how_late_and_an_event_carries_its_payload() {
        let wake = Wake {
            at_ms: Some(10_000),
            event: None,
            deadline_ms: None,
        };
        let late: Value =
            serde_json::from_str(&woken_result(&wake, WokenBy::Timer, 75_000, None)).unwrap();
        assert_eq!(
            (late["woke"].as_str(), late["late_seconds"].as_i64()),
            (Some("timer"), Some(65))
        );
        let on_time: Value =
            serde_json::from_str(&woken_result(&wake, WokenBy::Timer, 10_200, None)).unwrap();
        assert!(on_time.get("late_seconds").is_none(), "{on_time}");
        let waits = Wake {
            at_ms: None,
            event: Some("paid".into()),
            deadline_ms: Some(50_000),
        };
        let payload = json!({"amount": 4200});
        let events = woken("call_0", &waits, WokenBy::Event, 20_000, Some(&payload));
        match &events[..] {
            [Event::Woken {
                by,
                payload: Some(text),
                late_ms: 0,
                ..
            }, Event::ToolFinished {
                outcome: ToolOutcome::Ok(result),
                ..
            }] => {
                assert_eq!(*by, WokenBy::Event);
                assert_eq!(text, r#"{"amount":4200}"#);
                let result: Value = serde_json::from_str(result).unwrap();
                assert_eq!(result["payload"]["amount"], 4200);
                assert_eq!(result["event"], "paid");
            }
            other => panic!("{other:?}"),
        }
    }
}
