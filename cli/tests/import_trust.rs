//! An import never acts or appends on its own: sessions made elsewhere
//! arrive at rest (nothing runs them until a person resumes one by id) and
//! the import says what each would reach; records past the head of a
//! session the store holds are refused unless asked for, and then listed.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::*;
use serde_json::{json, Value};
use std::time::Duration;

/// `mneme export` of every session of `world`, written to `name`.
fn exported(world: &World, name: &str) -> std::path::PathBuf {
    let path = world.dir.path().join(name);
    let out = world
        .mneme_std()
        .args(["export", "--output", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// A daemon on `world`, started, its recovery done (its log says so).
async fn daemon_recovered(world: &World, env: &[(&str, &str)]) -> DaemonProcess {
    let log = world.dir.path().join("daemon.log");
    let mut command = DaemonProcess::command(&world.data(), &[]);
    for (name, value) in env {
        command.env(name, value);
    }
    let daemon = DaemonProcess::launch_logged(command, &world.data(), &log).await;
    eventually("the daemon's recovery", Duration::from_secs(20), || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("recovery found").then_some(())
    })
    .await;
    daemon
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_made_elsewhere_arrive_at_rest_and_say_what_they_reach() {
    // Elsewhere: one session killed with its command durably started, one
    // with only its first message, on an agent whose key comes from a
    // variable of the victim's daemon.
    let elsewhere = World::new();
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("touch", json!({}))]),
            MockReply::answer("done"),
        ],
        Fault::None,
    )
    .await;
    let marker = elsewhere.dir.path().join("the command ran");
    let touch = command_tool(
        "touch",
        &[
            "sh",
            "-c",
            &format!("cat >/dev/null; touch '{}'", marker.display()),
        ],
        "side_effect",
        5,
    );
    let agent = elsewhere.write("agent.toml", &agent_toml(&model.base_url(), &[touch]));
    let out = elsewhere
        .run_crashing(
            &["run", "--agent", agent.to_str().unwrap(), "go"],
            "tool_started_durable",
        )
        .await;
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    let keyed = agent_toml(&model.base_url(), &[]).replace(
        "model = \"test-model\"",
        "model = \"test-model\"\napi_key_env = \"VICTIM_CLOUD_SECRET\"",
    );
    let keyed = elsewhere.write("keyed.toml", &keyed);
    let out = elsewhere
        .run_crashing(
            &["run", "--agent", keyed.to_str().unwrap(), "hello"],
            "user_message_durable",
        )
        .await;
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    let file = exported(&elsewhere, "elsewhere.jsonl");
    let requests_before = model.bodies().len();

    // Here: the import arrives at rest, and says what each would reach.
    let victim = World::new();
    let out = victim.run(&["import", file.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("at rest: nothing runs it until `mneme resume"),
        "{said}"
    );
    assert!(said.contains("its key from $VICTIM_CLOUD_SECRET"), "{said}");
    assert!(said.contains(&model.base_url()), "{said}");
    assert!(
        said.contains("tool \"touch\" (side_effect): runs [\"sh\", \"-c\""),
        "{said}"
    );
    let rows: Vec<Value> = (stdout(&victim.run(&["sessions", "--json"]).await).lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!(row["status"], "paused", "{row}");
        assert_eq!(row["resumable"], false, "not for `resume --all`: {row}");
    }
    let out = victim.run(&["resume", "--all"]).await;
    assert!(out.status.success(), "{}", stderr(&out));

    // A daemon with the secret in its environment runs neither.
    let daemon = daemon_recovered(
        &victim,
        &[("VICTIM_CLOUD_SECRET", "sk-victim-0123456789abcdef")],
    )
    .await;
    assert!(!marker.exists(), "the imported command ran");
    assert_eq!(
        model.bodies().len(),
        requests_before,
        "a model request was sent"
    );
    // A person resumes one by id: then it runs (its model request goes).
    let keyed = rows
        .iter()
        .find(|r| r["events"].as_u64() == Some(3))
        .unwrap()["session"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = daemon
        .post(&format!("/sessions/{keyed}/resume"), &json!({"wait": true}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["answer"], "done", "{body}");
    assert!(
        model.bodies().len() > requests_before,
        "its requests were sent"
    );
    assert!(!marker.exists(), "the other one still rests");
}

/// A session of `here` whose refund (of `sink`) waits for approval, run
/// with `extra` arguments (`--signing-key KEY`, say); its id, and the model
/// (which answers "refunded" once the call is decided).
async fn a_refund_waiting(here: &World, sink: &Sink, extra: &[&str]) -> (String, MockModel) {
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("refund", json!({"n": 7}))]),
            MockReply::answer("refunded"),
        ],
        Fault::None,
    )
    .await;
    let agent = here.write(
        "agent.toml",
        &agent_toml(&model.base_url(), &[refund_needing_approval(sink)]),
    );
    let args = [
        &["run"],
        extra,
        &["--agent", agent.to_str().unwrap(), "refund"],
    ]
    .concat();
    let out = here.run(&args).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "waits for approval: {}",
        stderr(&out)
    );
    (session_id(&out), model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_does_not_add_to_a_held_session_unless_asked_and_then_lists_it() {
    let here = World::new();
    let sink = Sink::start().await.unwrap();
    let (session, _model) = a_refund_waiting(&here, &sink, &[]).await;
    let before = exported(&here, "before.jsonl");

    // Elsewhere, someone approves it with other arguments.
    let elsewhere = World::new();
    let out = elsewhere.run(&["import", before.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let edited = r#"{"n": 7, "to": "mallory-iban"}"#;
    let out = elsewhere
        .run(&[
            "approve",
            &session,
            "call_0_0",
            "--edit-args",
            edited,
            "--by",
            "ada",
            "--no-resume",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let after = exported(&elsewhere, "after.jsonl");
    let head = |world: &World| {
        let out = world
            .mneme_std()
            .args(["sessions", "--json"])
            .output()
            .unwrap();
        let rows = String::from_utf8_lossy(&out.stdout).into_owned();
        let row: Value = serde_json::from_str(rows.lines().next().unwrap()).unwrap();
        row["events"].as_u64().unwrap()
    };
    let held = head(&here);

    // Back here: refused by default, nothing added.
    let out = here.run(&["import", after.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "session {session}: this store holds it up to seq {held}"
        )) && err.contains("--append"),
        "{err}"
    );
    assert_eq!(head(&here), held);

    // Asked for: added, named, and at rest; nothing refunds on its own.
    let out = here
        .run(&["import", "--append", after.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(&format!("added to session {session}: seq {}–", held + 1)),
        "{said}"
    );
    assert!(said.contains("at rest"), "{said}");
    let _daemon = daemon_recovered(&here, &[]).await;
    assert_eq!(
        sink.stats().path("refund").hits,
        0,
        "the edited refund ran on its own"
    );
}

/// With signed heads, `--append` is not enough: the records it adds must be
/// covered by a head signed with the key that signed the held history (the
/// chain proves nothing about who wrote them; only the key's holder can
/// vouch). An approval made elsewhere without the key is refused, naming
/// the records; the same approval made with the key is added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_to_a_signed_history_must_be_signed_with_its_key() {
    let here = World::new();
    let sink = Sink::start().await.unwrap();
    let key = here.dir.path().join("signing.key");
    let out = here.run(&["keygen", "--out", key.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let key = key.to_str().unwrap();
    let (session, _model) = a_refund_waiting(&here, &sink, &["--signing-key", key]).await;
    let before = exported(&here, "before.jsonl");
    let approved_elsewhere = |name: &'static str, signed: bool| {
        let (before, session) = (before.clone(), session.clone());
        async move {
            let elsewhere = World::new();
            let out = elsewhere.run(&["import", before.to_str().unwrap()]).await;
            assert!(out.status.success(), "{}", stderr(&out));
            let edited = r#"{"n": 7, "to": "mallory-iban"}"#;
            let approve = ["approve", &session, "call_0_0", "--edit-args", edited];
            let out = elsewhere
                .run(&[&approve[..], &["--no-resume"]].concat())
                .await;
            assert!(out.status.success(), "{}", stderr(&out));
            // Its turn goes on (a person's resume by id), signed or not.
            let resume = ["resume", &session, "--signing-key", key];
            let resume = if signed { &resume[..] } else { &resume[..2] };
            let out = elsewhere.run(resume).await;
            assert!(out.status.success(), "{}", stderr(&out));
            let file = exported(&elsewhere, name);
            (elsewhere, file) // the file lives as long as its world
        }
    };

    let (_unsigned_world, unsigned) = approved_elsewhere("unsigned.jsonl", false).await;
    let out = here
        .run(&["import", "--append", unsigned.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("session {session}: the file appends seq"))
            && err.contains("not covered by a head it signed"),
        "{err}"
    );
    let listed = stdout(&here.run(&["sessions", "--json"]).await);
    assert!(listed.contains(r#""events":6,"#), "nothing added: {listed}");

    let (_signed_world, signed) = approved_elsewhere("signed.jsonl", true).await;
    let out = here
        .run(&["import", "--append", signed.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("added to session {session}")));
}
