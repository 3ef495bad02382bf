//! A message posted while a turn runs ("double texting"), through the real
//! daemon: recorded at once and durably, then queued, taken by the running
//! turn, or rejected, as the agent says; and kept across a SIGKILL.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::{agent_toml, command_tool, eventually, MockModel, MockReply, World};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A read-only tool that says it started (a file appears), then waits
/// until the test opens its gate.
fn gated_tool(dir: &Path) -> String {
    let (started, gate) = (dir.join("started"), dir.join("gate"));
    let script = format!(
        "cat >/dev/null; touch {}; while [ ! -f {} ]; do sleep 0.02; done; echo '{{\"rate\":0.92}}'",
        started.display(),
        gate.display()
    );
    command_tool("rate", &["sh", "-c", &script], "read_only", 60)
}

fn replies() -> Vec<MockReply> {
    vec![
        MockReply::calls(&[("rate", json!({"n": 1}))]),
        MockReply::answer("first answer"),
        MockReply::answer("second answer"),
    ]
}

struct Setup {
    world: World,
    model: MockModel,
    agent: String,
}

async fn setup(policy: Option<&str>) -> Setup {
    setup_with(policy, "").await
}

/// [`setup`], with `limits` (TOML lines) in the agent's `[limits]`.
async fn setup_with(policy: Option<&str>, limits: &str) -> Setup {
    let world = World::new();
    let model = MockModel::start(replies(), Default::default()).await;
    let mut agent = agent_toml(&model.base_url(), &[gated_tool(world.dir.path())]);
    if !limits.is_empty() {
        agent = format!("{agent}[limits]\n{limits}");
    }
    if let Some(policy) = policy {
        agent = format!("mid_turn_messages = \"{policy}\"\n{agent}");
    }
    Setup {
        world,
        model,
        agent,
    }
}

impl Setup {
    fn path(&self, name: &str) -> PathBuf {
        self.world.dir.path().join(name)
    }

    async fn wait_for_the_tool(&self) {
        wait_until(|| self.path("started").exists(), "the tool to start").await;
    }

    fn open_gate(&self) {
        std::fs::write(self.path("gate"), "").unwrap();
    }

    /// The user messages of each request the model received, in order.
    fn users_per_request(&self) -> Vec<Vec<String>> {
        self.model
            .bodies()
            .iter()
            .map(|body| {
                let request: Value = serde_json::from_slice(body).unwrap();
                (request["messages"].as_array().unwrap().iter())
                    .filter(|m| m["role"] == "user")
                    .map(|m| m["content"].as_str().unwrap().to_string())
                    .collect()
            })
            .collect()
    }
}

async fn wait_until(done: impl Fn() -> bool, what: &str) {
    eventually(what, Duration::from_secs(20), || async { done() }).await;
}

async fn events(daemon: &DaemonProcess, id: &str) -> Vec<Value> {
    let (status, events) = daemon.get(&format!("/sessions/{id}/events")).await;
    assert_eq!(status, 200, "{events}");
    events.as_array().unwrap().clone()
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["kind"].as_str().unwrap()).collect()
}

/// Waits until session `id`'s log holds an event of `kind`.
async fn wait_for_kind(daemon: &DaemonProcess, id: &str, kind: &str) {
    let what = format!("a {kind} in {id}'s log");
    eventually(what, Duration::from_secs(20), || async {
        let events = events(daemon, id).await;
        let kinds = kinds(&events);
        if kinds.contains(&kind) {
            Ok(())
        } else {
            Err(format!("{kinds:?}"))
        }
    })
    .await;
}

async fn wait_idle(daemon: &DaemonProcess, id: &str) -> Value {
    eventually(
        format!("{id} to be idle"),
        Duration::from_secs(20),
        || async {
            let (_, session) = daemon.get(&format!("/sessions/{id}")).await;
            if session["status"] == "idle" {
                Ok(session)
            } else {
                Err(session)
            }
        },
    )
    .await
}

/// Starts a turn with "first" and waits until its tool runs.
async fn first_turn_running(setup: &Setup, daemon: &DaemonProcess) -> String {
    let id = daemon.create(&setup.agent).await;
    let path = format!("/sessions/{id}/messages");
    let (status, body) = daemon.post(&path, &json!({"text": "first"})).await;
    assert_eq!(status, 202, "{body}");
    setup.wait_for_the_tool().await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_mid_turn_is_recorded_at_once_and_runs_after_the_turn() {
    let setup = setup(None).await;
    let daemon = DaemonProcess::start(&setup.world.data(), &[]).await;
    let id = first_turn_running(&setup, &daemon).await;
    let path = format!("/sessions/{id}/messages");
    let (status, body) = daemon.post(&path, &json!({"text": "second"})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["mid_turn"], "queue");
    // Recorded while the tool still runs: durable before the answer came.
    let recorded = events(&daemon, &id).await;
    assert_eq!(recorded.last().unwrap()["kind"], "MidTurnMessage");
    assert_eq!(recorded.last().unwrap()["seq"], body["seq"]);
    setup.open_gate();
    let session = wait_idle(&daemon, &id).await;
    assert_eq!(session["answer"], "second answer", "{session}");
    let users = setup.users_per_request();
    assert_eq!(users.len(), 3, "{users:?}");
    assert_eq!(users[1], ["first"], "the running turn never saw it");
    assert_eq!(
        users[2],
        ["first", "second"],
        "its own turn, after the answer"
    );
    let kinds = kinds(&events(&daemon, &id).await).join(" ");
    assert!(
        kinds.ends_with("MidTurnMessage ToolFinished ModelReplied MidTurnDelivered ModelReplied"),
        "{kinds}"
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupting_message_is_taken_by_the_running_turn_at_its_next_step() {
    let setup = setup(Some("interrupt")).await;
    let daemon = DaemonProcess::start(&setup.world.data(), &[]).await;
    let id = first_turn_running(&setup, &daemon).await;
    let path = format!("/sessions/{id}/messages");
    let message = json!({"text": "in euros, please", "wait": true});
    let ((status, outcome), ()) = tokio::join!(daemon.post(&path, &message), async {
        wait_for_kind(&daemon, &id, "MidTurnMessage").await;
        setup.open_gate();
    });
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(outcome["answer"], "first answer", "{outcome}");
    let users = setup.users_per_request();
    assert_eq!(users.len(), 2, "one turn took both: {users:?}");
    assert_eq!(users[1], ["first", "in euros, please"]);
    let request: Value = serde_json::from_slice(&setup.model.bodies()[1]).unwrap();
    let roles: Vec<&str> = (request["messages"].as_array().unwrap().iter())
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_message_is_a_409_and_is_recorded_but_never_delivered() {
    let setup = setup(Some("reject")).await;
    let daemon = DaemonProcess::start(&setup.world.data(), &[]).await;
    let id = first_turn_running(&setup, &daemon).await;
    let path = format!("/sessions/{id}/messages");
    let (status, body) = daemon.post(&path, &json!({"text": "second"})).await;
    assert_eq!(status, 409, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("reject") && error.contains("recorded at seq"),
        "{error}"
    );
    setup.open_gate();
    let session = wait_idle(&daemon, &id).await;
    assert_eq!(session["answer"], "first answer");
    let recorded = events(&daemon, &id).await;
    let rejected = recorded
        .iter()
        .find(|e| e["kind"] == "MidTurnMessage")
        .expect("recorded");
    assert_eq!(rejected["event"]["MidTurnMessage"]["policy"], "reject");
    assert!(!kinds(&recorded).contains(&"MidTurnDelivered"));
    assert_eq!(setup.users_per_request().len(), 2);
    // Once the turn has ended, the same message starts a turn as usual.
    let (status, outcome) = daemon
        .post(&path, &json!({"text": "second", "wait": true}))
        .await;
    assert_eq!((status, &outcome["answer"]), (200, &json!("second answer")));
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_message_survives_a_sigkill_and_runs_after_recovery() {
    let setup = setup(None).await;
    let data = setup.world.data();
    let daemon = DaemonProcess::start(&data, &[]).await;
    let id = first_turn_running(&setup, &daemon).await;
    let path = format!("/sessions/{id}/messages");
    let (status, body) = daemon.post(&path, &json!({"text": "second"})).await;
    assert_eq!(status, 202, "{body}");
    daemon.kill().await;
    setup.open_gate();
    let daemon = DaemonProcess::start(&data, &[]).await;
    let session = wait_idle(&daemon, &id).await;
    assert_eq!(session["answer"], "second answer", "{session}");
    let users = setup.users_per_request();
    assert_eq!(users.last().unwrap(), &["first", "second"], "{users:?}");
    let recorded = events(&daemon, &id).await;
    let count = |kind: &str| kinds(&recorded).iter().filter(|k| **k == kind).count();
    assert_eq!((count("MidTurnMessage"), count("MidTurnDelivered")), (1, 1));
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mneme_run_beside_the_daemon_mid_turn_waits_for_its_own_answer() {
    let setup = setup(None).await;
    let daemon = DaemonProcess::start(&setup.world.data(), &[]).await;
    let id = first_turn_running(&setup, &daemon).await;
    let cli = setup
        .world
        .mneme()
        .args(["run", "--session", &id, "second"])
        .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN)
        .output();
    let cli = tokio::spawn(cli);
    wait_for_kind(&daemon, &id, "MidTurnMessage").await;
    setup.open_gate();
    let out = cli.await.unwrap().unwrap();
    assert!(out.status.success(), "{}", mneme_e2e::stderr(&out));
    assert_eq!(mneme_e2e::stdout(&out).trim(), "second answer");
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_more_than_may_wait_is_a_429_and_is_not_recorded() {
    let setup = setup_with(None, "max_waiting_messages = 1\n").await;
    let daemon = DaemonProcess::start(&setup.world.data(), &[]).await;
    let id = first_turn_running(&setup, &daemon).await;
    let path = format!("/sessions/{id}/messages");
    let (status, body) = daemon.post(&path, &json!({"text": "second"})).await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = daemon.post(&path, &json!({"text": "third"})).await;
    assert_eq!(status, 429, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("max_waiting_messages = 1"), "{error}");
    setup.open_gate();
    let session = wait_idle(&daemon, &id).await;
    assert_eq!(session["answer"], "second answer", "{session}");
    let recorded = events(&daemon, &id).await;
    let count = kinds(&recorded)
        .iter()
        .filter(|k| **k == "MidTurnMessage")
        .count();
    assert_eq!(count, 1, "the third was not recorded");
    assert!(!setup
        .users_per_request()
        .concat()
        .contains(&"third".to_string()));
    assert!(daemon.terminate().await.success());
}

/// Rejected messages are recorded (never delivered), so they are bounded
/// as waiting ones are: past `max_waiting_messages` in one turn, each more
/// is a 429 and is not recorded (before, every one was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_messages_past_the_bound_are_a_429_and_are_not_recorded() {
    let setup = setup_with(Some("reject"), "max_waiting_messages = 2\n").await;
    let daemon = DaemonProcess::start(&setup.world.data(), &[]).await;
    let id = first_turn_running(&setup, &daemon).await;
    let path = format!("/sessions/{id}/messages");
    let mut statuses = Vec::new();
    for n in 0..5 {
        let (status, _) = daemon.post(&path, &json!({"text": format!("m{n}")})).await;
        statuses.push(status);
    }
    assert_eq!(statuses, [409, 409, 429, 429, 429]);
    setup.open_gate();
    let session = wait_idle(&daemon, &id).await;
    assert_eq!(session["answer"], "first answer", "{session}");
    let recorded = events(&daemon, &id).await;
    let count = kinds(&recorded)
        .iter()
        .filter(|k| **k == "MidTurnMessage")
        .count();
    assert_eq!(count, 2, "only the first two were recorded");
    assert!(daemon.terminate().await.success());
}
