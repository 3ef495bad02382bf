//! `mneme serve` end to end: the API, its security, live streams, recovery
//! after SIGKILL under load, and graceful shutdown.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::{all_accepted, follow_two_turns, kill_mid_load, DaemonProcess, TOKEN};
use mneme_e2e::*;
use serde_json::{json, Value};
use std::time::Duration;

/// The billing agent (see [`billing_replies`]) and its sink.
fn billing() -> TestbedBuilder {
    Testbed::new()
        .replies(billing_replies())
        .sink_tools(|sink| billing_tools(sink).to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_runs_a_turn_and_shows_its_log() {
    let mut replies = billing_replies();
    replies.push(MockReply::answer("Nothing more to do."));
    let mut bed = billing().replies(replies).daemon().await;
    let (daemon, sink) = (bed.daemon(), &bed.sink);
    let (status, health) = daemon.get("/health").await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    let id = bed.create().await;
    let (status, end) = daemon.message_and_wait(&id, "charge ada").await;
    assert_eq!(status, 200, "{end}");
    assert_eq!(end["answer"], "Charged and emailed.");
    let (_, session) = daemon.get(&format!("/sessions/{id}")).await;
    assert_eq!(session["status"], "idle");
    assert_eq!(session["answer"], "Charged and emailed.");
    let (_, events) = daemon
        .get(&format!("/sessions/{id}/events?kind=ToolStarted"))
        .await;
    assert_eq!(events.as_array().unwrap().len(), 3);
    let (_, verified) = daemon.get(&format!("/sessions/{id}/verify")).await;
    assert_eq!(verified["ok"], true, "{verified}");
    let (_, listed) = daemon.get("/sessions?status=idle").await;
    assert_eq!(listed.as_array().unwrap().len(), 1);
    let metrics = daemon.metrics_text().await;
    assert!(
        metrics.contains("mneme_events_appended_total 11"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mneme_sessions{status=\"idle\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mneme_flush_latency_seconds_count"),
        "{metrics}"
    );
    let (_, openapi) = daemon.get("/openapi.json").await;
    assert!(openapi["paths"]["/sessions/{id}/messages"].is_object());
    assert_eq!(sink.stats().path("charge").effects, 1);
    let (status, end) = daemon.message_and_wait(&id, "again").await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("Nothing more to do.")),
        "{end}"
    );
    assert!(bed.take_daemon().terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_and_bad_bodies_are_refused_and_change_nothing() {
    let world = World::new();
    let daemon = DaemonProcess::start(&world.data(), &["--max-body-bytes", "65536"]).await;
    let plain = reqwest::Client::new();
    for auth in [None, Some("Bearer wrong"), Some(TOKEN)] {
        let mut request = plain.get(daemon.url("/sessions"));
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 401, "{auth:?}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().contains("bearer token"));
    }
    let response = daemon
        .http
        .post(daemon.url("/sessions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("request body"),
        "{body}"
    );
    let huge = format!("{{\"spec\": \"{}\"}}", "x".repeat(100_000));
    let response = daemon
        .http
        .post(daemon.url("/sessions"))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let (status, body) = daemon
        .post(
            "/sessions",
            &json!({"spec": {"name": "x", "model": {"provider": "nope"}}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("nope"), "{body}");
    let (status, _) = daemon
        .get("/sessions/01900000-0000-7000-8000-000000000001")
        .await;
    assert_eq!(status, 404);
    let (_, sessions) = daemon.get("/sessions").await;
    assert_eq!(sessions, json!([]), "nothing was created");
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_replays_history_then_follows() {
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("one"), MockReply::answer("two")])
        .await;
    let daemon = DaemonProcess::start(&bed.world.data(), &[]).await;
    let (content_type, seen) = follow_two_turns(&daemon, &daemon, &bed.agent_toml).await;
    assert_eq!(content_type, "text/event-stream");
    assert!(
        seen.contains("event: SessionStarted") && seen.contains("event: ModelReplied"),
        "{seen}"
    );
    assert_eq!(seen.matches("event: UserMessage").count(), 2, "{seen}");
    assert!(daemon.terminate().await.success());
}

async fn kinds_of(daemon: &DaemonProcess, id: &str) -> Vec<String> {
    let (_, events) = daemon.get(&format!("/sessions/{id}/events")).await;
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_then_restart_finishes_every_session_exactly_once() {
    const SESSIONS: usize = 200;
    let mut bed = billing().daemon().await;
    let mut ids = Vec::new();
    for _ in 0..SESSIONS {
        ids.push(bed.create().await);
    }
    let daemon = bed.take_daemon();
    all_accepted(ids.iter().map(|id| daemon.message(id, "charge and email"))).await;
    // Kill it mid-load: some sessions charged, most not finished.
    let sink = &bed.sink;
    kill_mid_load(daemon, sink, SESSIONS).await;

    let daemon = DaemonProcess::start(&bed.world.data(), &[]).await;
    daemon
        .wait_all_idle(SESSIONS, Duration::from_secs(180))
        .await;
    assert_billed_once(sink, SESSIONS);
    daemon
        .assert_verified_with_answer(&ids, "Charged and emailed.")
        .await;
    let recovered = daemon.metric("mneme_sessions_recovered_total").await;
    assert!(recovered > 0 && recovered <= SESSIONS as u64, "{recovered}");
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_running_calls_finish_pauses_the_rest_and_restart_resumes() {
    const SESSIONS: usize = 4;
    let world = World::new();
    let started_dir = world.dir.path().join("started");
    std::fs::create_dir(&started_dir).unwrap();
    let script = format!(
        "cat >/dev/null; touch {}/$MNEME_SESSION_ID; sleep 1; echo slow-done",
        started_dir.display()
    );
    let mut bed = Testbed::new()
        .in_world(world)
        .replies(vec![
            MockReply::calls(&[("slow", json!({}))]),
            MockReply::answer("done"),
        ])
        .tools([command_tool(
            "slow",
            &["sh", "-c", &script],
            "read_only",
            10,
        )])
        .daemon()
        .await;
    let mut ids = Vec::new();
    for _ in 0..SESSIONS {
        let id = bed.create().await;
        bed.daemon().message(&id, "go").await;
        ids.push(id);
    }
    let daemon = bed.take_daemon();
    eventually(
        "every slow call to start",
        Duration::from_secs(30),
        || async {
            let started = std::fs::read_dir(&started_dir).unwrap().count();
            if started >= SESSIONS {
                Ok(())
            } else {
                Err(format!("{started} started"))
            }
        },
    )
    .await;
    let status = daemon.terminate().await;
    assert!(status.success(), "exit {status:?}");

    let daemon = DaemonProcess::start(&bed.world.data(), &[]).await;
    daemon
        .wait_all_idle(SESSIONS, Duration::from_secs(60))
        .await;
    for id in &ids {
        let kinds = kinds_of(&daemon, id).await;
        let at = |k: &str| {
            kinds
                .iter()
                .position(|x| x == k)
                .unwrap_or_else(|| panic!("no {k} in {kinds:?}"))
        };
        assert!(
            at("ToolFinished") < at("SessionPaused"),
            "the call under way finished first: {kinds:?}"
        );
        assert_eq!(
            kinds.iter().filter(|k| *k == "ToolStarted").count(),
            1,
            "never re-run: {kinds:?}"
        );
        assert!(at("SessionPaused") < at("SessionResumed"), "{kinds:?}");
    }
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_beside_a_running_daemon_goes_through_it_with_the_same_output() {
    let mut bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("slow_write", json!({}))]),
            MockReply::answer("gave up on it"),
        ])
        .tools([command_tool(
            "slow_write",
            &["sleep", "30"],
            "side_effect",
            1,
        )])
        .daemon()
        .await;
    let daemon = bed.take_daemon();
    let cli = |args: &[&str]| {
        let mut command = bed.world.mneme();
        command.args(args).env("MNEME_TOKEN", TOKEN);
        command
    };
    let out = cli(&["run", "--agent", bed.agent_arg(), "write it"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "the call is in doubt: {}",
        stderr(&out)
    );
    let session = session_id(&out);
    let out = cli(&[
        "resolve", &session, "call_0_0", "--fail", "not sent", "--by", "ops",
    ])
    .output()
    .await
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "gave up on it");
    let commands: Vec<Vec<&str>> = vec![
        vec!["sessions"],
        vec!["sessions", "--json"],
        vec!["log", &session],
        vec!["log", &session, "--json", "--kind", "ToolResolved"],
        vec!["verify"],
        vec!["replay", &session],
        vec!["replay", &session, "--raw"],
    ];
    let mut through_daemon = Vec::new();
    for args in &commands {
        let out = cli(args).output().await.unwrap();
        assert!(
            out.status.success(),
            "{args:?} via the daemon: {}",
            stderr(&out)
        );
        through_daemon.push(stdout(&out));
    }
    assert!(daemon.terminate().await.success());
    for (args, expected) in commands.iter().zip(&through_daemon) {
        let out = cli(args).output().await.unwrap();
        assert!(out.status.success(), "{args:?} directly: {}", stderr(&out));
        assert_eq!(
            &stdout(&out),
            expected,
            "{args:?} differs between the daemon and the log"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_branches_a_session_and_cancel_stops_one() {
    let slow = ["sh", "-c", "cat >/dev/null; sleep 1; echo ok"];
    let mut bed = Testbed::new()
        .replies(vec![
            MockReply::answer("one"),
            MockReply::calls(&[("slow", json!({}))]),
            MockReply::answer("two"),
        ])
        .tools([command_tool("slow", &slow, "read_only", 10)])
        .daemon()
        .await;
    let parent = bed.create().await;
    let daemon = bed.take_daemon();
    let (_, end) = daemon.message_and_wait(&parent, "first").await;
    assert_eq!(end["answer"], "one");
    // Fork after the first answer (SessionStarted, UserMessage, ModelReplied).
    let (status, forked) = daemon
        .post(&format!("/sessions/{parent}/fork"), &json!({"at": 3}))
        .await;
    assert_eq!(status, 201, "{forked}");
    let child = forked["session"].as_str().unwrap().to_string();
    let (_, events) = daemon.get(&format!("/sessions/{child}/events")).await;
    // The parent's three records, shared (the same hashes), then the
    // fork's own first, naming them.
    let (_, held) = daemon
        .get(&format!("/sessions/{parent}/events?until=3"))
        .await;
    let hashes = |events: &Value| -> Vec<Value> {
        let events = events.as_array().unwrap().iter().take(3);
        events.map(|e| e["hash"].clone()).collect()
    };
    assert_eq!(hashes(&events), hashes(&held));
    let own = &events[3]["event"]["SessionForked"];
    assert_eq!(
        (
            own["parent"].as_str(),
            own["at_seq"].as_u64(),
            events[3]["seq"].as_u64()
        ),
        (Some(parent.as_str()), Some(3), Some(4))
    );
    assert_eq!(events.as_array().unwrap().len(), 4);
    // The branch goes on by itself; cancel it while its tool runs.
    daemon.message(&child, "second").await;
    eventually(
        "the branch's tool to start",
        Duration::from_secs(20),
        || async {
            let kinds = kinds_of(&daemon, &child).await;
            if kinds.iter().any(|k| k == "ToolStarted") {
                Ok(())
            } else {
                Err(format!("{kinds:?}"))
            }
        },
    )
    .await;
    let (status, cancelled) = daemon
        .post(&format!("/sessions/{child}/cancel"), &json!({"by": "ops"}))
        .await;
    assert_eq!(status, 200, "{cancelled}");
    let kinds = kinds_of(&daemon, &child).await;
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("SessionFinished"),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&"ToolFinished".to_string()),
        "the call under way finished first: {kinds:?}"
    );
    let (_, session) = daemon.get(&format!("/sessions/{child}")).await;
    assert_eq!(session["status"], "cancelled");
    let (status, _) = daemon
        .post(&format!("/sessions/{child}/resume"), &json!({"wait": true}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        kinds_of(&daemon, &child).await.len(),
        kinds.len(),
        "a resume runs nothing"
    );
    // The parent is untouched, and a fork inside a tool call is refused.
    assert_eq!(kinds_of(&daemon, &parent).await.len(), 3);
    let (status, refused) = daemon
        .post(&format!("/sessions/{child}/fork"), &json!({"at": 6}))
        .await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("under way"),
        "{refused}"
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_token_is_private_and_secrets_never_reach_the_log_or_api() {
    use std::os::unix::fs::PermissionsExt;
    let world = World::new();
    let model = MockModel::start(vec![MockReply::answer("fine")], Fault::None).await;
    // No MNEME_TOKEN: the daemon makes one, readable by its user only.
    let child = world
        .mneme()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("MNEME_TOKEN")
        .env("MNEME_TEST_API_KEY", "sk-very-secret-value")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let token_path = world.data().join("mneme.token");
    let note_path = world.data().join("mneme.daemon");
    eventually("the daemon to start", Duration::from_secs(20), || async {
        note_path.exists()
    })
    .await;
    let mode = std::fs::metadata(&token_path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "token file mode {mode:o}");
    let note: Value = serde_json::from_str(&std::fs::read_to_string(&note_path).unwrap()).unwrap();
    assert_eq!(
        note["token_file"].as_str(),
        Some(token_path.to_str().unwrap())
    );
    let token = std::fs::read_to_string(&token_path).unwrap();
    let base = format!("http://{}", note["addr"].as_str().unwrap());
    let http = reqwest::Client::new();
    let agent = agent_toml(&model.base_url(), &[]).replace(
        "timeout_secs = 10\n",
        "timeout_secs = 10\napi_key_env = \"MNEME_TEST_API_KEY\"\n",
    );
    let created: Value = http
        .post(format!("{base}/sessions"))
        .bearer_auth(&token)
        .header("content-type", "application/toml")
        .body(agent)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["session"].as_str().unwrap();
    let end: Value = http
        .post(format!("{base}/sessions/{id}/messages"))
        .bearer_auth(&token)
        .json(&json!({"text": "hi", "wait": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(end["answer"], "fine", "{end}");
    // The spec names the variable; the value appears nowhere.
    let mut everything = String::new();
    for path in [
        format!("/sessions/{id}"),
        format!("/sessions/{id}/events"),
        format!("/sessions/{id}/replay"),
        "/sessions".into(),
        "/metrics".into(),
    ] {
        everything.push_str(
            &http
                .get(format!("{base}{path}"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
    }
    assert!(
        everything.contains("MNEME_TEST_API_KEY"),
        "the spec names the variable"
    );
    assert!(
        !everything.contains("sk-very-secret-value"),
        "the API leaks the key"
    );
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
    unsafe {
        libc::kill(child.id().unwrap() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("mneme.token"),
        "the daemon says where the token is"
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("sk-very-secret-value"));
    for entry in std::fs::read_dir(world.data()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !bytes.windows(20).any(|w| w == b"sk-very-secret-value"),
                "{} holds the key",
                path.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_can_be_recorded_without_continuing_and_idle_sessions_cannot_be_paused() {
    let mut bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("refund", json!({"n": 1}))]),
            MockReply::answer("refunded"),
        ])
        .sink_tools(|sink| vec![refund_needing_approval(sink)])
        .daemon()
        .await;
    let id = bed.create().await;
    let (daemon, sink) = (bed.take_daemon(), &bed.sink);
    let (_, end) = daemon.message_and_wait(&id, "refund").await;
    assert_eq!(end["awaiting_approval"][0]["call_id"], "call_0_0", "{end}");
    let (status, _) = daemon
        .post(&format!("/sessions/{id}/pause"), &json!({}))
        .await;
    assert_eq!(status, 409, "no turn runs: nothing to pause");
    let (status, body) = daemon
        .post(
            &format!("/sessions/{id}/calls/call_0_0/approve"),
            &json!({"approved": true, "by": "ops", "continue": false}),
        )
        .await;
    assert_eq!(
        (status, body["continuing"].as_bool()),
        (200, Some(false)),
        "{body}"
    );
    // Time, not a barrier: nothing may run within 300 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        sink.stats().path("refund").hits,
        0,
        "recorded only: nothing ran"
    );
    let (_, end) = daemon
        .post(&format!("/sessions/{id}/resume"), &json!({"wait": true}))
        .await;
    assert_eq!(end["answer"], "refunded", "{end}");
    assert_eq!(sink.stats().path("refund").effects, 1);
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_session_changed_between_turns_is_loaded_again() {
    let mut bed = Testbed::new()
        .replies(vec![MockReply::answer("one"), MockReply::answer("two")])
        .daemon()
        .await;
    let id = bed.create().await;
    let daemon = bed.take_daemon();
    let (status, end) = daemon.message_and_wait(&id, "first").await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("one")),
        "{end}"
    );
    // Recorded outside the turn (the session is hot in the daemon): the
    // next turn must see it, not the fold it kept.
    let (status, body) = daemon
        .post(&format!("/sessions/{id}/cancel"), &json!({"by": "ops"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, end) = daemon.message_and_wait(&id, "second").await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("two")),
        "{end}"
    );
    let (_, events) = daemon.get(&format!("/sessions/{id}/events")).await;
    let kinds: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "SessionStarted",
            "UserMessage",
            "ModelReplied",
            "SessionFinished",
            "UserMessage",
            "ModelReplied"
        ]
    );
    let (_, verified) = daemon.get(&format!("/sessions/{id}/verify")).await;
    assert_eq!(verified["ok"], true, "{verified}");
    daemon.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_stream_resumes_after_the_last_event_id_it_had() {
    let mut bed = Testbed::new()
        .replies(vec![MockReply::answer("one")])
        .daemon()
        .await;
    let id = bed.create().await;
    let daemon = bed.take_daemon();
    let (status, _) = daemon.message_and_wait(&id, "go").await;
    assert_eq!(status, 200);
    // Each frame's id is its seq; a reconnect from id 2 goes on at 3.
    let response = daemon
        .http
        .get(daemon.url(&format!("/sessions/{id}/events?follow=true")))
        .header("last-event-id", "2")
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    let mut seen = String::new();
    mneme_e2e::daemon::read_until(&mut stream, &mut seen, "id: 3").await;
    assert!(
        !seen.contains("id: 1\n") && !seen.contains("id: 2\n"),
        "{seen}"
    );
    assert!(seen.contains("event: ModelReplied"), "{seen}");
    let refused = daemon
        .http
        .get(daemon.url(&format!("/sessions/{id}/events?follow=true")))
        .header("last-event-id", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert!(daemon.terminate().await.success());
}
