//! Approvals a person can edit, and that expire, through the real binary:
//! `mneme approve --edit-args` runs the tool once with the person's
//! arguments (recorded with who gave them, the model's kept in its reply,
//! the model told, the request rebuilt byte for byte); edited arguments
//! that are not JSON, or larger than a model's reply may be, are refused
//! and nothing is recorded; an approval past its `approval_timeout` is
//! denied as expired by `mneme resume`, and by the daemon on its own; a
//! crash right after an edited approval is recorded resumes with the
//! edited arguments, once.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The `(call id, content)` of every tool message of a request body.
fn tool_messages(body: &[u8]) -> Vec<(String, String)> {
    let request: Value = serde_json::from_slice(body).unwrap();
    (request["messages"].as_array().unwrap().iter())
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let id = m["tool_call_id"].as_str().unwrap().to_string();
            (id, m["content"].as_str().unwrap().to_string())
        })
        .collect()
}

/// The arguments of the first tool call the model made in a request body.
fn first_call_arguments(body: &[u8]) -> String {
    let request: Value = serde_json::from_slice(body).unwrap();
    (request["messages"].as_array().unwrap().iter())
        .find_map(|m| m["tool_calls"][0]["function"]["arguments"].as_str())
        .unwrap()
        .to_string()
}

/// The schema version the first `kind` event of a session was written with.
async fn schema_of(world: &World, session: &str, kind: &str) -> u64 {
    let out = world.run(&["log", "--json", session]).await;
    (stdout(&out).lines())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["kind"] == kind)
        .and_then(|r| r["schema"].as_u64())
        .unwrap_or_else(|| panic!("no {kind}"))
}

fn the<'a>(events: &'a [(u64, String, Value)], kind: &str) -> &'a Value {
    let found = events.iter().find(|(_, k, _)| k == kind);
    &found.unwrap_or_else(|| panic!("no {kind} in {events:?}")).2
}

/// What the model says: refund 1 cent, then the answer.
fn refund_replies() -> Vec<MockReply> {
    vec![
        MockReply::calls(&[("refund", json!({"n": 1}))]),
        MockReply::answer("Refunded."),
    ]
}

/// Whether `text` is a UTC time as the views give it (RFC 3339 with
/// milliseconds: `2026-11-29T19:40:01.123Z`).
fn is_rfc3339(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 24 && b[4] == b'-' && b[10] == b'T' && b[19] == b'.' && text.ends_with('Z')
}

/// An agent whose `refund` waits for approval (with `extra` lines in its
/// tool table; its model reads replies of at most 2 KiB).
async fn refunds(extra: &str) -> Testbed {
    let extra = extra.to_string();
    Testbed::new()
        .replies(refund_replies())
        .sink_tools(move |sink| vec![refund_needing_approval(sink) + &extra])
        .model_options("max_response_bytes = 2048\n")
        .await
}

/// Runs `bed`'s agent until it stops on the call; the session id.
async fn waiting_session(bed: &Testbed) -> String {
    let out = bed.run_agent("refund ada").await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    session_id(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_approval_runs_the_persons_arguments_once_and_the_model_is_told() {
    let bed = refunds("").await;
    let id = waiting_session(&bed).await;
    let (world, sink, model) = (&bed.world, &bed.sink, &bed.model);
    let out = world
        .run(&[
            "approve",
            &id,
            "call_0_0",
            "--edit-args",
            r#"{ "n": 2 }"#,
            "--by",
            "ada",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Refunded.");
    assert!(
        stderr(&out).contains("call_0_0 approved with edited arguments"),
        "{}",
        stderr(&out)
    );
    // The side effect happened once, with the person's arguments.
    assert_eq!(sink.bodies("refund"), [json!({"n": 2})]);
    assert_eq!(sink.stats().path("refund").effects, 1);

    // The log: who edited, to what; the model's own arguments stay in its
    // reply; the tool started with the edited ones.
    let log = logged_events(world, &id).await;
    let decided = the(&log, "ApprovalDecided");
    assert_eq!(decided["by"], "ada", "{decided}");
    assert_eq!(decided["args"], r#"{"n":2}"#, "{decided}");
    assert_eq!(decided["approved"], true, "{decided}");
    let reply = the(&log, "ModelReplied");
    assert_eq!(reply["tool_calls"][0]["arguments"], r#"{"n":1}"#, "{reply}");
    assert_eq!(the(&log, "ToolStarted")["args"], r#"{"n":2}"#);
    // Written as version 2 (an older build refuses it by name rather than
    // run the model's arguments); the rest stays version 1.
    assert_eq!(schema_of(world, &id, "ApprovalDecided").await, 2);
    assert_eq!(schema_of(world, &id, "ApprovalRequested").await, 1);
    let text = stdout(&world.run(&["log", &id, "--kind", "ApprovalDecided"]).await);
    assert!(
        text.contains(r#"call_0_0 approved with edited arguments by ada: {"n":2}"#),
        "{text}"
    );

    // The model's next request tells it, keeping its call as it made it.
    let bodies = model.bodies();
    let sent = bodies.last().unwrap();
    assert_eq!(first_call_arguments(sent), r#"{"n":1}"#);
    let results = tool_messages(sent);
    assert_eq!(results.len(), 1);
    let (call, content) = &results[0];
    assert_eq!(call, "call_0_0");
    assert!(
        content.starts_with("(arguments edited by ada: {\"n\":2})\n{"),
        "{content}"
    );
    assert!(content.contains(r#""request":{"n":2}"#), "{content}");

    // Replay rebuilds that request byte for byte: a fork just before the
    // answer holds the same history, and its next request is the one sent.
    let finished = (log.iter().rev())
        .find(|(_, kind, _)| kind == "ToolFinished")
        .unwrap()
        .0;
    let out = world
        .run(&["fork", &id, "--at", &finished.to_string()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let fork = stdout(&out).trim().to_string();
    assert_eq!(&rebuilt_request(world, &fork).await, sent);
    let out = world.run(&["verify", &id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edited_arguments_that_are_not_json_or_too_large_are_refused_and_nothing_is_recorded() {
    let bed = refunds("").await;
    let id = waiting_session(&bed).await;
    let (world, sink) = (&bed.world, &bed.sink);
    let before = logged_events(world, &id).await.len();
    let out = world
        .run(&["approve", &id, "call_0_0", "--edit-args", r#"{"n": "#])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let error = stderr(&out);
    assert!(
        error.contains("call_0_0")
            && error.contains("not JSON")
            && error.contains("nothing was recorded"),
        "{error}"
    );
    // Larger than a model's reply may be (the agent's max_response_bytes).
    let big = format!(r#"{{"note": "{}"}}"#, "x".repeat(3000));
    let out = world
        .run(&["approve", &id, "call_0_0", "--edit-args", &big])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("more than a model's reply may hold"),
        "{}",
        stderr(&out)
    );
    // A denial takes no arguments.
    let out = world
        .run(&["approve", &id, "call_0_0", "--deny", "--edit-args", "{}"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        logged_events(world, &id).await.len(),
        before,
        "nothing recorded"
    );
    assert_eq!(sink.stats().path("refund").hits, 0);
    // The call still waits, and a plain approval goes on.
    let out = world
        .run(&["approve", &id, "call_0_0", "--by", "ops"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(sink.bodies("refund"), [json!({"n": 1})]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_not_given_in_time_is_denied_as_expired_by_resume_and_the_model_is_told() {
    let bed = refunds("approval_timeout = \"2s\"\n").await;
    let asked = Instant::now();
    let id = waiting_session(&bed).await;
    let (world, model, sink) = (&bed.world, &bed.model, &bed.sink);
    let out = world.run(&["sessions", "--json"]).await;
    let row: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    let expires = row["approval_expires_at"].as_str().unwrap().to_string();
    assert!(is_rfc3339(&expires), "{row}");
    let listing = stdout(&world.run(&["sessions"]).await);
    assert!(
        listing.contains(&format!("approval expires {expires}")),
        "{listing}"
    );
    let log = logged_events(world, &id).await;
    assert!(the(&log, "ApprovalRequested")["expires_at_ms"].is_i64());

    // Before the deadline nothing changes on its own.
    let out = world.run(&["resume", &id]).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // Time, not a barrier: the approval's 2 s run out.
    tokio::time::sleep(
        Duration::from_secs(2).saturating_sub(asked.elapsed()) + Duration::from_millis(200),
    )
    .await;

    // Past it, the call can no longer be approved...
    let out = world
        .run(&["approve", &id, "call_0_0", "--by", "ada"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("expired"), "{}", stderr(&out));
    assert_eq!(
        logged_events(world, &id).await.len(),
        log.len(),
        "nothing recorded"
    );
    // ...and a resume records the denial and goes on.
    let out = world.run(&["resume", &id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Refunded.");
    assert_eq!(sink.stats().path("refund").hits, 0, "never ran");
    let log = logged_events(world, &id).await;
    let decided = the(&log, "ApprovalDecided");
    assert_eq!(
        (&decided["approved"], &decided["by"], &decided["reason"]),
        (&json!(false), &json!("mneme"), &json!("expired")),
        "{decided}"
    );
    let told = tool_messages(model.bodies().last().unwrap());
    assert_eq!(
        told[0].1,
        "error: denied (expired after 2s: nobody approved it in time)"
    );
    let row = stdout(&world.run(&["sessions", "--json"]).await);
    assert!(!row.contains("approval_expires_at"), "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_expires_an_approval_on_its_own_and_takes_edited_arguments() {
    let mut bed = Testbed::new()
        .replies(refund_replies())
        .sink_tools(|sink| vec![refund_needing_approval(sink)])
        .daemon()
        .await;
    let edited = bed.create().await;
    let (daemon, model, sink) = (bed.take_daemon(), &bed.model, &bed.sink);
    let timed = refund_needing_approval(sink) + "approval_timeout = \"2s\"\n";
    let expiring = daemon
        .create(&agent_toml(&model.base_url(), &[timed]))
        .await;
    for id in [&expiring, &edited] {
        let (status, end) = daemon.message_and_wait(id, "refund ada").await;
        assert_eq!(status, 200, "{end}");
        assert_eq!(end["awaiting_approval"][0]["call_id"], "call_0_0", "{end}");
    }
    let asked = Instant::now();
    let (_, view) = daemon.get(&format!("/sessions/{expiring}")).await;
    let expires = view["waiting"][0]["expires_at"].as_str().unwrap();
    assert!(is_rfc3339(expires), "{view}");
    let (_, other) = daemon.get(&format!("/sessions/{edited}")).await;
    assert!(other["waiting"][0].get("expires_at").is_none(), "{other}");

    // The API takes edited arguments as a JSON text; not JSON: 400.
    let approve = format!("/sessions/{edited}/calls/call_0_0/approve");
    let (status, error) = daemon
        .post(
            &approve,
            &json!({"approved": true, "by": "ada", "args": "{\"n\": "}),
        )
        .await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"].as_str().unwrap().contains("call_0_0"),
        "{error}"
    );
    let (status, error) = daemon
        .post(
            &approve,
            &json!({"approved": false, "by": "ada", "args": "{}"}),
        )
        .await;
    assert_eq!(status, 400, "{error}");
    let (status, end) = daemon
        .post(
            &approve,
            &json!({"approved": true, "by": "ada", "args": "{\"n\": 3}", "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{end}");
    assert_eq!(end["answer"], "Refunded.", "{end}");
    assert_eq!(sink.bodies("refund"), [json!({"n": 3})]);

    // Nobody approves the other: within a few seconds of its deadline the
    // daemon records the expiry and the turn goes on to its answer.
    let limit = Duration::from_secs(15).saturating_sub(asked.elapsed());
    let view = eventually("the approval to expire", limit, || async {
        let (_, view) = daemon.get(&format!("/sessions/{expiring}")).await;
        if view["status"] == "idle" {
            Ok(view)
        } else {
            Err(view)
        }
    })
    .await;
    assert!(asked.elapsed() >= Duration::from_secs(2), "expired early");
    assert_eq!(view["answer"], "Refunded.", "{view}");
    assert_eq!(
        sink.stats().path("refund").hits,
        1,
        "only the approved one ran"
    );
    let (_, records) = daemon
        .get(&format!("/sessions/{expiring}/events?kind=ApprovalDecided"))
        .await;
    let decided = &records[0]["event"]["ApprovalDecided"];
    assert_eq!(decided["reason"], "expired", "{records}");
    assert_eq!(decided["by"], "mneme", "{records}");
    assert!(
        records[0]["summary"].as_str().unwrap().contains("expired"),
        "{records}"
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_an_edited_approval_resumes_with_the_edited_arguments_once() {
    let bed = refunds("").await;
    let id = waiting_session(&bed).await;
    let (world, sink, model) = (&bed.world, &bed.sink, &bed.model);
    let out = world
        .run_crashing(
            &[
                "approve",
                &id,
                "call_0_0",
                "--edit-args",
                r#"{"n": 5}"#,
                "--by",
                "ada",
            ],
            "decision_appended",
        )
        .await;
    assert!(!out.status.success(), "the crash point was reached");
    assert_eq!(
        sink.stats().path("refund").hits,
        0,
        "it crashed before the tool"
    );
    let kinds = event_kinds(world, &id).await;
    assert_eq!(kinds.last().unwrap(), "SessionResumed", "{kinds:?}");
    let out = world.run(&["resume", &id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Refunded.");
    assert_eq!(sink.bodies("refund"), [json!({"n": 5})]);
    assert_eq!(sink.stats().path("refund").effects, 1);
    let log = logged_events(world, &id).await;
    assert_eq!(the(&log, "ToolStarted")["args"], r#"{"n":5}"#);
    let told = tool_messages(model.bodies().last().unwrap());
    assert!(
        told[0]
            .1
            .starts_with("(arguments edited by ada: {\"n\":5})\n"),
        "{told:?}"
    );
    // Every request equals an uncrashed run's, byte for byte.
    let calm = refunds("").await;
    let other = waiting_session(&calm).await;
    let edit = [
        "approve",
        &other,
        "call_0_0",
        "--edit-args",
        r#"{"n": 5}"#,
        "--by",
        "ada",
    ];
    let out = calm.run(&edit).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(model.bodies(), calm.model.bodies());
}
