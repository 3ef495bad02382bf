//! Durable sleep through the real binary: a call of a tool of kind `sleep`
//! ends the turn with the session sleeping (`mneme run` exits 4 and says
//! how it goes on; `resume` before its time does nothing); a daemon wakes
//! it on time across a SIGKILL and a restart, once; a wake due while no
//! daemon ran fires once when one starts, saying how late; an event
//! delivered with `POST /sessions/{id}/wake` or `mneme wake` puts its
//! payload in the call's result; a crash right after the sleep or the
//! wake is recorded goes on once.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::*;
use serde_json::{json, Value};
use std::time::Duration;

/// The exit code of a run that ends with its session sleeping.
const SLEEPING: i32 = 4;

/// A sleep tool `wait`, as an agent file declares it.
fn wait_tool() -> String {
    "name = \"wait\"\nkind = \"sleep\"\neffect = \"read_only\"\n".to_string()
}

/// The model calls `wait` with `args`, then answers "Awake.".
fn sleeper(args: Value) -> TestbedBuilder {
    Testbed::new()
        .replies(vec![
            MockReply::calls(&[("wait", args)]),
            MockReply::answer("Awake."),
        ])
        .tools([wait_tool()])
}

/// What the model was told of its `wait` call: the tool message of the
/// last request it received, as JSON.
fn wait_result(model: &MockModel) -> Value {
    let bodies = model.bodies();
    let request: Value = serde_json::from_slice(bodies.last().expect("a request")).unwrap();
    let told = (request["messages"].as_array().unwrap().iter())
        .find(|m| m["role"] == "tool")
        .expect("a tool message");
    serde_json::from_str(told["content"].as_str().unwrap()).unwrap()
}

/// The `Woken` events of `session`.
async fn wakes(world: &World, session: &str) -> Vec<Value> {
    let events = logged_events(world, session).await;
    (events.into_iter())
        .filter(|(_, kind, _)| kind == "Woken")
        .map(|(_, _, event)| event)
        .collect()
}

/// The session's row in `mneme sessions --json`.
async fn row(world: &World, session: &str) -> Value {
    let out = world.run(&["sessions", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    (stdout(&out).lines())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["session"] == session)
        .unwrap_or_else(|| panic!("{session} is not listed"))
}

/// Runs `mneme ARGS` on `bed`'s world as a client of its daemon.
async fn client(bed: &Testbed, args: &[&str]) -> std::process::Output {
    let mut command = bed.world.mneme();
    command
        .args(args)
        .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN);
    command.output().await.unwrap()
}

/// Asserts that the command whose output is `out` ended the turn with the
/// model's "Awake.".
fn answered_awake(out: &std::process::Output) {
    assert!(out.status.success(), "{}", stderr(out));
    assert_eq!(stdout(out).trim(), "Awake.");
}

/// The `Woken` records of session `id`, as `daemon` lists them.
async fn woken_on(daemon: &DaemonProcess, id: &str) -> Vec<Value> {
    let (_, events) = daemon
        .get(&format!("/sessions/{id}/events?kind=Woken"))
        .await;
    events.as_array().cloned().unwrap_or_default()
}

/// Waits (up to 30 s) until `daemon` shows session `id` with `status`; its
/// view then.
async fn until_status(daemon: &DaemonProcess, id: &str, status: &str) -> Value {
    let what = format!("session {id} to be {status}");
    eventually(what, Duration::from_secs(30), || async {
        let (_, view) = daemon.get(&format!("/sessions/{id}")).await;
        (view["status"] == status).then_some(view)
    })
    .await
}

/// `mneme wake ID --event payment.landed --payload PAYLOAD`, through the
/// daemon.
async fn wake_payment(bed: &Testbed, id: &str, payload: &str) -> std::process::Output {
    let args = [
        "wake",
        id,
        "--event",
        "payment.landed",
        "--payload",
        payload,
    ];
    client(bed, &args).await
}

/// Milliseconds since the Unix epoch of an RFC 3339 time.
fn millis(time: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(time.as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

#[tokio::test]
async fn a_run_that_sleeps_exits_4_and_resume_wakes_it_only_after_its_time() {
    let bed = sleeper(json!({"seconds": 2})).await;
    let out = bed.run_agent("wait two seconds").await;
    assert_eq!(out.status.code(), Some(SLEEPING), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("sleeps until"), "{said}");
    assert!(said.contains("mneme resume"), "{said}");
    let id = session_id(&out);
    let listed = row(&bed.world, &id).await;
    assert_eq!(listed["status"], "sleeping", "{listed}");
    let wakes_at = millis(&listed["wakes_at"]);
    let table = stdout(&bed.run(&["sessions"]).await);
    assert!(
        table.contains("sleeping") && table.contains("sleeps until 20"),
        "{table}"
    );
    let kinds = event_kinds(&bed.world, &id).await;
    assert!(kinds.contains(&"WakeScheduled".to_string()), "{kinds:?}");

    let early = bed.run(&["resume", &id]).await;
    assert_eq!(early.status.code(), Some(SLEEPING), "{}", stderr(&early));
    assert_eq!(
        event_kinds(&bed.world, &id).await,
        kinds,
        "a resume before the time records nothing"
    );
    assert_eq!(bed.model.bodies().len(), 1);

    let left = wakes_at - chrono::Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_millis(left.max(0) as u64 + 100)).await;
    let late = bed.run(&["resume", &id]).await;
    answered_awake(&late);
    let woken = wakes(&bed.world, &id).await;
    assert_eq!(woken.len(), 1, "{woken:?}");
    assert_eq!(woken[0]["by"], "timer");
    assert_eq!(wait_result(&bed.model)["woke"], "timer");
    assert_eq!(bed.model.bodies().len(), 2);
    let verified = bed.run(&["verify", &id]).await;
    assert!(verified.status.success(), "{}", stderr(&verified));
}

#[tokio::test]
async fn a_daemon_sigkilled_during_a_sleep_wakes_it_on_time_after_its_restart_once() {
    let mut bed = sleeper(json!({"seconds": 3})).daemon().await;
    let id = bed.create().await;
    let (status, body) = bed.daemon().message(&id, "wait three seconds").await;
    assert_eq!(status, 202, "{body}");
    let daemon = bed.daemon();
    let view = until_status(daemon, &id, "sleeping").await;
    let wakes_at = millis(&view["wakes_at"]);
    bed.take_daemon().kill().await;
    bed.start_daemon(&[]).await;
    let daemon = bed.daemon();
    let view = until_status(daemon, &id, "idle").await;
    assert_eq!(view["answer"], "Awake.");
    let woken = woken_on(daemon, &id).await;
    assert_eq!(woken.len(), 1, "woken once: {woken:?}");
    let late = woken[0]["event"]["Woken"]["late_ms"].as_u64().unwrap_or(0);
    assert!(
        late < 1000,
        "woke {late} ms after its time (due {wakes_at})"
    );
    assert_eq!(bed.model.bodies().len(), 2);
    assert!(bed.take_daemon().terminate().await.success());
}

#[tokio::test]
async fn a_wake_due_while_no_daemon_ran_fires_once_when_one_starts_and_says_how_late() {
    let mut bed = sleeper(json!({"seconds": 1})).await;
    let out = bed.run_agent("wait a second").await;
    assert_eq!(out.status.code(), Some(SLEEPING), "{}", stderr(&out));
    let id = session_id(&out);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    bed.start_daemon(&[]).await;
    let daemon = bed.daemon();
    until_status(daemon, &id, "idle").await;
    let woken = woken_on(daemon, &id).await;
    assert_eq!(woken.len(), 1, "{woken:?}");
    let late = woken[0]["event"]["Woken"]["late_ms"].as_u64().unwrap();
    assert!(
        late >= 1500,
        "it was due 1.5 s before the daemon started: {late}"
    );
    let told = wait_result(&bed.model);
    assert_eq!(told["woke"], "timer");
    assert!(told["late_seconds"].as_u64().unwrap() >= 1, "{told}");
    assert!(bed.take_daemon().terminate().await.success());
}

#[tokio::test]
async fn an_event_wakes_its_sleeper_with_the_payload_in_the_result() {
    let args = json!({"event": "payment.landed", "timeout_seconds": 600});
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("wait", args)]),
            MockReply::answer("Awake."),
        ])
        .tools([wait_tool() + "max_output_bytes = 1024\n"])
        .daemon()
        .await;
    let id = bed.create().await;
    let daemon = bed.daemon();
    let (status, end) = daemon.message_and_wait(&id, "wait for the payment").await;
    assert_eq!(
        (status, end["status"].as_str()),
        (200, Some("sleeping")),
        "{end}"
    );
    assert_eq!(end["waits_for"], "payment.landed");
    let (_, view) = daemon.get(&format!("/sessions/{id}")).await;
    assert_eq!(view["waits_for"], "payment.landed", "{view}");

    let hostile = json!({"event": "../../x\u{1b}[2J", "payload": {}});
    let (status, refused) = daemon.post(&format!("/sessions/{id}/wake"), &hostile).await;
    assert_eq!(status, 400, "not an event name: {refused}");
    let wrong = json!({"event": "refund.landed", "payload": {}});
    let (status, refused) = daemon.post(&format!("/sessions/{id}/wake"), &wrong).await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("refund.landed"),
        "{refused}"
    );
    let bad = wake_payment(&bed, &id, "{not json").await;
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("--payload is not JSON"),
        "{}",
        stderr(&bad)
    );
    let huge = json!({"event": "payment.landed", "payload": "x".repeat(2000)});
    let (status, refused) = daemon.post(&format!("/sessions/{id}/wake"), &huge).await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("at most 1024"),
        "{refused}"
    );
    let none = woken_on(daemon, &id).await;
    assert!(none.is_empty(), "nothing recorded yet: {none:?}");

    let out = wake_payment(&bed, &id, r#"{"amount": 4200}"#).await;
    answered_awake(&out);
    let told = wait_result(&bed.model);
    assert_eq!(
        (told["woke"].as_str(), told["event"].as_str()),
        (Some("event"), Some("payment.landed"))
    );
    assert_eq!(told["payload"], json!({"amount": 4200}));
    let woken = woken_on(daemon, &id).await;
    assert_eq!(woken.len(), 1, "{woken:?}");
    assert_eq!(woken[0]["event"]["Woken"]["by"], "event");
}

#[tokio::test]
async fn a_crash_right_after_the_sleep_or_the_wake_is_recorded_goes_on_once() {
    let bed = sleeper(json!({"seconds": 1})).await;
    let agent = bed.agent_arg().to_string();
    let asleep = (bed.world)
        .run_crashing(&["run", "--agent", &agent, "nap"], "wake_scheduled_durable")
        .await;
    assert!(!asleep.status.success(), "killed at the crash point");
    let id = named_session(&asleep).expect("the session is named before the crash");
    assert_eq!(row(&bed.world, &id).await["status"], "sleeping");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let woke = bed
        .world
        .run_crashing(&["resume", &id], "woken_durable")
        .await;
    assert!(!woke.status.success(), "killed at the crash point");
    assert_eq!(wakes(&bed.world, &id).await.len(), 1);
    let out = bed.run(&["resume", &id]).await;
    answered_awake(&out);
    assert_eq!(wakes(&bed.world, &id).await.len(), 1, "woken once");
    assert_eq!(
        bed.model.bodies().len(),
        2,
        "the model asked once for each step"
    );
}

#[tokio::test]
async fn bad_sleep_arguments_are_told_to_the_model_and_the_turn_goes_on() {
    let bed = sleeper(json!({"seconds": -5, "event": "x"})).await;
    let out = bed.run_agent("nap").await;
    assert!(out.status.success(), "{}", stderr(&out));
    let request: Value = serde_json::from_slice(bed.model.bodies().last().unwrap()).unwrap();
    let told = (request["messages"].as_array().unwrap().iter())
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert!(
        told["content"]
            .as_str()
            .unwrap()
            .contains("seconds must be"),
        "{told}"
    );
    let id = session_id(&out);
    assert!(!event_kinds(&bed.world, &id)
        .await
        .contains(&"WakeScheduled".to_string()));
}

#[tokio::test]
async fn a_wait_for_an_event_ends_at_its_timeout_and_a_cancelled_sleep_never_wakes() {
    let args = json!({"event": "never", "timeout_seconds": 1});
    let bed = sleeper(args).daemon().await;
    let daemon = bed.daemon();
    let id = bed.create().await;
    let (status, end) = daemon.message_and_wait(&id, "wait for nothing").await;
    assert_eq!(
        (status, end["status"].as_str()),
        (200, Some("sleeping")),
        "{end}"
    );
    until_status(daemon, &id, "idle").await;
    let told = wait_result(&bed.model);
    assert_eq!(
        (told["woke"].as_str(), told["event"].as_str()),
        (Some("deadline"), Some("never"))
    );

    let cancelled = sleeper(json!({"seconds": 1})).daemon().await;
    let daemon = cancelled.daemon();
    let id = cancelled.create().await;
    let (_, end) = daemon.message_and_wait(&id, "nap").await;
    assert_eq!(end["status"], "sleeping", "{end}");
    let (status, body) = daemon
        .post(&format!("/sessions/{id}/cancel"), &json!({"by": "ada"}))
        .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let (_, view) = daemon.get(&format!("/sessions/{id}")).await;
    assert_eq!(view["status"], "cancelled", "{view}");
    let woken = woken_on(daemon, &id).await;
    assert!(woken.is_empty(), "a cancelled sleep never wakes: {woken:?}");
    assert_eq!(cancelled.model.bodies().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_on_postgresql_that_both_know_a_wake_fire_it_once() {
    let bed = sleeper(json!({"seconds": 3})).on_postgres().await;
    let store = bed.world.store.clone().expect("a store on PostgreSQL");
    let daemon_on = |name: &str| {
        let data = bed.world.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        let store = store.clone();
        async move { DaemonProcess::start(&data, &["--store", &store]).await }
    };
    let first = daemon_on("a").await;
    let id = first.create(&bed.agent_toml).await;
    let (_, end) = first.message_and_wait(&id, "wait three seconds").await;
    assert_eq!(end["status"], "sleeping", "{end}");
    // Started now, the second finds the sleep in its recovery's listing.
    let second = daemon_on("b").await;
    for daemon in [&first, &second] {
        until_status(daemon, &id, "idle").await;
    }
    let woken = woken_on(&second, &id).await;
    assert_eq!(woken.len(), 1, "fired once: {woken:?}");
    assert_eq!(bed.model.bodies().len(), 2, "the model asked once after it");
    assert!(first.terminate().await.success());
    assert!(second.terminate().await.success());
}

#[tokio::test]
async fn a_paused_sleep_does_not_wake_until_a_person_resumes_it() {
    let bed = sleeper(json!({"seconds": 1})).daemon().await;
    let daemon = bed.daemon();
    let id = bed.create().await;
    let (_, end) = daemon.message_and_wait(&id, "nap").await;
    assert_eq!(end["status"], "sleeping", "{end}");
    let (status, body) = daemon
        .post(&format!("/sessions/{id}/pause"), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, view) = daemon.get(&format!("/sessions/{id}")).await;
    assert_eq!(view["status"], "paused", "{view}");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let woken = woken_on(daemon, &id).await;
    assert!(
        woken.is_empty(),
        "paused: its time came and went: {woken:?}"
    );
    let (status, end) = daemon
        .post(&format!("/sessions/{id}/resume"), &json!({"wait": true}))
        .await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("Awake.")),
        "{end}"
    );
    let woken = woken_on(daemon, &id).await;
    assert_eq!(woken.len(), 1, "{woken:?}");
    let (status, refused) = daemon
        .post(&format!("/sessions/{id}/pause"), &json!({}))
        .await;
    assert_eq!(
        status, 409,
        "an idle session has nothing to pause: {refused}"
    );
}

#[tokio::test]
async fn a_fork_cannot_copy_a_sleep_that_would_wake_on_its_own() {
    let bed = sleeper(json!({"seconds": 600})).daemon().await;
    let daemon = bed.daemon();
    let id = bed.create().await;
    let (_, end) = daemon.message_and_wait(&id, "nap").await;
    assert_eq!(end["status"], "sleeping", "{end}");
    let (_, view) = daemon.get(&format!("/sessions/{id}")).await;
    let at = view["events"].as_u64().unwrap();
    let (status, refused) = daemon
        .post(&format!("/sessions/{id}/fork"), &json!({"at": at}))
        .await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("under way"),
        "{refused}"
    );
}

#[tokio::test]
async fn mneme_wake_without_a_daemon_wakes_the_sleeper_and_runs_the_turn_here() {
    let bed = sleeper(json!({"event": "approved.by.ops"})).await;
    let out = bed.run_agent("wait for ops").await;
    assert_eq!(out.status.code(), Some(SLEEPING), "{}", stderr(&out));
    assert!(stderr(&out).contains("mneme wake"), "{}", stderr(&out));
    let id = session_id(&out);
    let wrong = bed.run(&["wake", &id, "--event", "nope"]).await;
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        stderr(&wrong).contains("no call of it sleeps until event \"nope\""),
        "{}",
        stderr(&wrong)
    );
    let out = bed
        .run(&[
            "wake",
            &id,
            "--event",
            "approved.by.ops",
            "--payload",
            r#"{"ok": true}"#,
        ])
        .await;
    answered_awake(&out);
    assert_eq!(wait_result(&bed.model)["payload"], json!({"ok": true}));
    assert_eq!(wakes(&bed.world, &id).await.len(), 1);
}

#[tokio::test]
async fn an_event_for_a_cancelled_sleep_is_refused_and_nothing_is_recorded() {
    let bed = sleeper(json!({"event": "payment.landed"})).daemon().await;
    let daemon = bed.daemon();
    let id = bed.create().await;
    let (_, end) = daemon.message_and_wait(&id, "wait for the payment").await;
    assert_eq!(end["status"], "sleeping", "{end}");
    let (status, body) = daemon
        .post(&format!("/sessions/{id}/cancel"), &json!({"by": "ada"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let event = json!({"event": "payment.landed", "payload": {}});
    let (status, refused) = daemon.post(&format!("/sessions/{id}/wake"), &event).await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("cancelled"),
        "{refused}"
    );
    assert!(woken_on(daemon, &id).await.is_empty());
    assert_eq!(bed.model.bodies().len(), 1);
}
