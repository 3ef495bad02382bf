//! Erasure through the real binary: sessions encrypted at rest under keys
//! of their own (`--master-key`), `mneme erase` destroying a key, the
//! session's shape and chain left, nothing of its content or key left in
//! any file (or PostgreSQL dump); a crash in the middle of an erasure; and
//! retention, from the command line and from the daemon.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Output;

const MESSAGE: &str = "PLANTED-MESSAGE-7d1f: my card is 4111";
const ARGUMENT: &str = "PLANTED-ARGUMENT-9c2e";
/// What the tool answers; its command computes it, so the agent spec (in
/// the clear by design) does not hold it.
const RESULT: &str = "PLANTED-RESULT-1002";
const ANSWER: &str = "PLANTED-ANSWER-5e40";
/// The model's reasoning beside its call (`reasoning_content`).
const REASONING: &str = "PLANTED-REASONING-3b8a";
const PLANTED: [&str; 5] = [MESSAGE, ARGUMENT, RESULT, ANSWER, REASONING];

/// A world whose commands encrypt at rest with a master key kept beside
/// (not inside) the data directory, and snapshot after every event (so
/// derived data holds the transcript too).
struct Private {
    world: World,
    key: PathBuf,
}

impl Private {
    async fn new(world: World) -> Private {
        let key = world.dir.path().join("master.key");
        let out = world
            .run(&["keygen", "--master", "--out", key.to_str().unwrap()])
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
        Private { world, key }
    }

    fn mneme(&self) -> tokio::process::Command {
        let mut command = self.world.mneme();
        command
            .env("MNEME_MASTER_KEY", &self.key)
            .env("MNEME_SNAPSHOT_EVERY", "1");
        command
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.mneme().args(args).output().await.unwrap()
    }

    async fn run_ok(&self, args: &[&str]) -> Output {
        let out = self.run(args).await;
        assert!(out.status.success(), "mneme {args:?}: {}", stderr(&out));
        out
    }

    /// Runs one turn that plants every marker: the message, a tool call's
    /// argument, its result, and the answer. Returns the session id.
    async fn planted_session(&self) -> String {
        let model = call_then_answer("lookup", json!({ "card": ARGUMENT })).await;
        let echo = "cat >/dev/null; echo \"{\\\"found\\\":\\\"PLANTED-RESULT-$((1000+2))\\\"}\"";
        let tools = [command_tool("lookup", &["sh", "-c", echo], "read_only", 10)];
        let agent = self
            .world
            .write("agent.toml", &agent_toml(&model.base_url(), &tools));
        let out = self
            .run_ok(&["run", "--agent", agent.to_str().unwrap(), MESSAGE])
            .await;
        assert!(stdout(&out).contains(ANSWER));
        session_id(&out)
    }

    /// The session's key as the store keeps it (hex), from an export.
    async fn wrapped_key(&self, session: &str) -> String {
        let out = self.run_ok(&["export", session]).await;
        let line: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
        line["wrapped_key"]
            .as_str()
            .expect("a key line first")
            .to_string()
    }

    async fn log_text(&self, session: &str) -> String {
        stdout(&self.run_ok(&["log", session, "--json"]).await)
    }

    async fn kinds(&self, session: &str) -> Vec<String> {
        let log = self.log_text(session).await;
        log.lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap()["kind"].to_string())
            .collect()
    }
}

/// Every file under `dir`, its bytes, every value sled keeps there and
/// every run of records in its segment files (decompressed: sled
/// compresses its pages and the log its runs, so the files alone would
/// hide plaintext).
fn every_byte(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            found.push((path.display().to_string(), std::fs::read(&path).unwrap()));
        }
    }
    let log = eventlog::SledLog::open(dir).unwrap();
    found.extend(log.every_stored_value().unwrap());
    found
}

fn holding<'a>(places: &'a [(String, Vec<u8>)], needle: &[u8]) -> Vec<&'a str> {
    places
        .iter()
        .filter(|(_, bytes)| bytes.windows(needle.len()).any(|w| w == needle))
        .map(|(name, _)| name.as_str())
        .collect()
}

fn assert_shape_left(log: &str) {
    assert!(log.contains("[erased]"), "{log}");
    for kind in [
        "SessionStarted",
        "UserMessage",
        "ModelReplied",
        "ToolStarted",
        "ToolFinished",
        "SessionErased",
    ] {
        assert!(log.contains(kind), "{kind} missing from the shape: {log}");
    }
    assert!(
        log.contains("lookup") && log.contains("mneme-"),
        "tool and idempotency key stay: {log}"
    );
    assert!(
        log.contains("by dpo") && log.contains("asked on 2026-11-30"),
        "{log}"
    );
    for planted in PLANTED {
        assert!(!log.contains(planted), "{planted} still shown: {log}");
    }
}

async fn erase(private: &Private, session: &str) {
    let out = private
        .run(&[
            "erase",
            session,
            "--reason",
            "asked on 2026-11-30",
            "--by",
            "dpo",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A model that calls `tool` with `args`, then answers [`ANSWER`].
async fn call_then_answer(tool: &str, args: Value) -> MockModel {
    let replies = vec![
        MockReply::calls(&[(tool, args)]).reasoning(REASONING),
        MockReply::answer(ANSWER),
    ];
    MockModel::start(replies, Fault::None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erased_content_and_its_key_are_in_no_file_and_the_shape_and_chain_remain() {
    let private = Private::new(World::new()).await;
    let session = private.planted_session().await;
    let before = private.log_text(&session).await;
    for planted in PLANTED {
        assert!(
            before.contains(planted),
            "{planted} readable with the key: {before}"
        );
    }
    // Encrypted at rest: no marker in any file, nor in any value of sled.
    let places = every_byte(&private.world.data());
    for planted in PLANTED {
        assert_eq!(
            holding(&places, planted.as_bytes()),
            Vec::<&str>::new(),
            "{planted}"
        );
    }
    let wrapped = hex::decode(private.wrapped_key(&session).await).unwrap();
    assert!(
        !holding(&places, &wrapped).is_empty(),
        "the key is kept in the data directory"
    );

    erase(&private, &session).await;

    let after = private.log_text(&session).await;
    assert_shape_left(&after);
    let places = every_byte(&private.world.data());
    assert_eq!(
        holding(&places, &wrapped),
        Vec::<&str>::new(),
        "the key is destroyed"
    );
    private.run_ok(&["verify", &session]).await;
    let listed = stdout(&private.run_ok(&["sessions", "--json"]).await);
    assert!(listed.contains("\"erased\""), "{listed}");

    // Nothing runs in it again, and the refusals say why.
    for args in [
        vec!["resume", session.as_str()],
        vec!["run", "--session", session.as_str(), "again"],
        vec!["fork", session.as_str(), "--at", "2"],
    ] {
        let out = private.run(&args).await;
        assert!(!out.status.success(), "{args:?} ran");
        assert!(
            stderr(&out).contains("erased"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // An export carries the shape, and no key.
    let export = stdout(&private.run_ok(&["export", &session]).await);
    assert!(!export.contains("wrapped_key") && !export.is_empty());
    // Erasing again is harmless.
    erase(&private, &session).await;
}

/// A session on OpenAI's Responses API: its reasoning item's summary and
/// encrypted content (recorded whole, with the reply) are encrypted at
/// rest like the rest of the content, and erased with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_reasoning_item_is_encrypted_at_rest_and_erased() {
    use mneme_e2e::hostile::HostileModel;
    use mneme_e2e::responses_api as api;
    const SUMMARY: &str = "PLANTED-SUMMARY-51c0";
    const ENCRYPTED: &str = "PLANTED-ENCRYPTED-REASONING-a7e2";
    let private = Private::new(World::new()).await;
    let model = HostileModel::start(|n, _, _| {
        let output = match n {
            0 => vec![
                api::reasoning("rs_1", SUMMARY, ENCRYPTED),
                api::function_call("call_1", "lookup", json!({ "card": ARGUMENT })),
            ],
            _ => vec![api::message("msg_2", ANSWER, Some("final_answer"))],
        };
        api::answer(api::response(output), false)
    })
    .await;
    let planted = [SUMMARY, ENCRYPTED, ARGUMENT, ANSWER, MESSAGE];
    planted_markers_are_erased(&private, &model, "openai-responses", &planted).await;
}

/// A session on Anthropic's Messages API with extended thinking: its
/// thinking block (text and signature) and a redacted block's data are
/// encrypted at rest like the rest of the content, and erased with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_thinking_is_encrypted_at_rest_and_erased() {
    use mneme_e2e::hostile::{Answer, HostileModel};
    const THINKING: &str = "PLANTED-THINKING-0e9d";
    const SIGNATURE: &str = "PLANTED-SIGNATURE-44ab";
    const REDACTED: &str = "PLANTED-REDACTED-c3f1";
    let private = Private::new(World::new()).await;
    let model = HostileModel::start(|n, _, _| {
        let (content, stop) = match n {
            0 => (
                json!([{"type": "thinking", "thinking": THINKING, "signature": SIGNATURE},
                       {"type": "redacted_thinking", "data": REDACTED},
                       {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"card": ARGUMENT}}]),
                "tool_use",
            ),
            _ => (json!([{"type": "text", "text": ANSWER}]), "end_turn"),
        };
        Answer::Json(json!({"type": "message", "role": "assistant", "content": content,
                            "stop_reason": stop, "usage": {"input_tokens": 20, "output_tokens": 10}}))
    })
    .await;
    let planted = [THINKING, SIGNATURE, REDACTED, ARGUMENT, ANSWER, MESSAGE];
    planted_markers_are_erased(&private, &model, "anthropic", &planted).await;
}

/// Runs MESSAGE in a session of `provider` on `model` (which calls
/// `lookup`): each of `planted` is readable with the key and in no file;
/// after `erase`, none is shown or in any file, and the chain verifies.
async fn planted_markers_are_erased(
    private: &Private,
    model: &mneme_e2e::hostile::HostileModel,
    provider: &str,
    planted: &[&str],
) {
    let agent = agent_toml(&model.base_url(), &[lookup_tool()]).replace(
        "provider = \"openai\"",
        &format!("provider = \"{provider}\""),
    );
    let agent = private.world.write("agent.toml", &agent);
    let out = private
        .run_ok(&["run", "--agent", agent.to_str().unwrap(), MESSAGE])
        .await;
    let session = session_id(&out);
    let before = private.log_text(&session).await;
    let places = every_byte(&private.world.data());
    for &marker in planted {
        assert!(before.contains(marker), "{marker} readable with the key");
        assert_eq!(holding(&places, marker.as_bytes()), Vec::<&str>::new());
    }
    erase(private, &session).await;
    let after = private.log_text(&session).await;
    let places = every_byte(&private.world.data());
    for &marker in planted {
        assert!(!after.contains(marker), "{marker} still shown: {after}");
        assert_eq!(holding(&places, marker.as_bytes()), Vec::<&str>::new());
    }
    assert!(after.contains("[erased]"), "{after}");
    private.run_ok(&["verify", &session]).await;
}

/// The control: without a master key, the same search finds the content
/// (so the search above can fail), and erasure is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_written_without_a_master_key_is_found_and_cannot_be_erased() {
    let private = Private::new(World::new()).await;
    let plain = Private {
        key: private.world.dir.path().join("no-such-key"),
        world: World::new(),
    };
    let model = MockModel::start(vec![MockReply::answer(ANSWER)], Fault::None).await;
    let agent = plain
        .world
        .write("agent.toml", &agent_toml(&model.base_url(), &[]));
    let out = plain
        .world
        .run(&["run", "--agent", agent.to_str().unwrap(), MESSAGE])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let session = session_id(&out);
    let places = every_byte(&plain.world.data());
    assert!(!holding(&places, MESSAGE.as_bytes()).is_empty());
    let out = plain
        .world
        .run(&["erase", &session, "--reason", "asked", "--by", "dpo"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("written without encryption"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_erasure_is_recorded_leaves_it_erased_and_erase_finishes_it() {
    let private = Private::new(World::new()).await;
    let session = private.planted_session().await;
    let wrapped = hex::decode(private.wrapped_key(&session).await).unwrap();
    let out = private
        .mneme()
        .args([
            "erase",
            &session,
            "--reason",
            "asked on 2026-11-30",
            "--by",
            "dpo",
        ])
        .env("MNEME_CRASH_AT", "erase_recorded")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "the crash point was not reached");
    // The old content is still readable, but the session is erased: it
    // verifies, and nothing runs in it.
    private.run_ok(&["verify", &session]).await;
    let listed = stdout(&private.run_ok(&["sessions", "--json"]).await);
    assert!(listed.contains("\"erased\""), "{listed}");
    assert!(!private.run(&["resume", &session]).await.status.success());
    erase(&private, &session).await;
    assert_shape_left(&private.log_text(&session).await);
    let places = every_byte(&private.world.data());
    assert_eq!(holding(&places, &wrapped), Vec::<&str>::new());
    let kinds = private.kinds(&session).await;
    let erasures = kinds.iter().filter(|k| *k == "\"SessionErased\"").count();
    assert_eq!(erasures, 1, "recorded once: {kinds:?}");
}

/// An export carries the encrypted records and the wrapped key: imported
/// elsewhere (with the same master key), the session reads as before, and
/// erasing it there works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_session_imported_elsewhere_reads_and_erases_there() {
    let source = Private::new(World::new()).await;
    let session = source.planted_session().await;
    let export = source.world.dir.path().join("export.jsonl");
    source
        .run_ok(&["export", &session, "-o", export.to_str().unwrap()])
        .await;
    let text = std::fs::read_to_string(&export).unwrap();
    for planted in PLANTED {
        assert!(
            !text.contains(planted),
            "{planted} in the clear in the export"
        );
    }
    let target = Private {
        world: World::new(),
        key: source.key.clone(),
    };
    target.run_ok(&["import", export.to_str().unwrap()]).await;
    let log = target.log_text(&session).await;
    for planted in PLANTED {
        assert!(
            log.contains(planted),
            "{planted} not readable after import: {log}"
        );
    }
    erase(&target, &session).await;
    assert_shape_left(&target.log_text(&session).await);
    assert!(
        source.log_text(&session).await.contains(MESSAGE),
        "the source keeps its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_on_postgres_leaves_nothing_in_a_dump() {
    let private = Private::new(World::on_postgres()).await;
    let session = private.planted_session().await;
    let wrapped = private.wrapped_key(&session).await;
    let dump = || {
        let ctl = std::env::var("MNEME_TEST_PG_CTL").expect("MNEME_TEST_PG_CTL");
        let pg_ctl = ctl
            .split_whitespace()
            .find(|w| w.ends_with("/pg_ctl"))
            .unwrap();
        let server = std::env::var("MNEME_TEST_PG").unwrap();
        stdout_of_success(
            std::process::Command::new(pg_ctl.replace("/pg_ctl", "/pg_dump"))
                .args(["--data-only", &server]),
        )
    };
    let before = dump();
    assert!(before.contains(&wrapped), "pg_dump shows the key table");
    for planted in PLANTED {
        assert!(!before.contains(planted), "{planted} in the clear");
        assert!(
            !before.contains(&hex::encode(planted)),
            "{planted} in the clear (bytea)"
        );
    }
    erase(&private, &session).await;
    assert_shape_left(&private.log_text(&session).await);
    assert!(!dump().contains(&wrapped), "the key is destroyed");
    private.run_ok(&["verify", &session]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_erases_idle_sessions_from_the_command_line_and_the_daemon() {
    let private = Private::new(World::new()).await;
    let old = private.planted_session().await;
    // Time, not a barrier: `old` is idle for longer than 1 s.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let fresh = private.planted_session().await;
    let out = private.run_ok(&["erase", "--idle-for", "1s"]).await;
    assert!(
        stderr(&out).contains(&format!("session {old}: erased")),
        "{}",
        stderr(&out)
    );
    let kinds = private.kinds(&fresh).await;
    assert!(
        !kinds.contains(&"\"SessionErased\"".to_string()),
        "{kinds:?}"
    );
    assert!(private
        .log_text(&old)
        .await
        .contains("retention: idle longer than 1s"));

    // The daemon sweeps on its own.
    let mut command = DaemonProcess::command(&private.world.data(), &["--retain", "2s"]);
    command.env("MNEME_MASTER_KEY", &private.key);
    let log = private.world.dir.path().join("daemon.log");
    let daemon = DaemonProcess::launch_logged(command, &private.world.data(), &log).await;
    // Until the daemon says it erased the session: its status says erased
    // as soon as SessionErased is recorded, a moment before the key is gone.
    let what = "the daemon to erase the idle session";
    eventually(what, std::time::Duration::from_secs(20), || async {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said.contains(&format!("erased session {fresh}")) {
            Ok(())
        } else {
            Err(said)
        }
    })
    .await;
    let (code, view) = daemon.get(&format!("/sessions/{fresh}")).await;
    assert_eq!((code, &view["status"]), (200, &json!("erased")), "{view}");
    let (_, events) = daemon.get(&format!("/sessions/{fresh}/events")).await;
    let text = events.to_string();
    assert!(
        text.contains("mneme retention") && !text.contains(ANSWER),
        "{text}"
    );
    daemon.terminate().await;
}

/// A session erased while its turn runs: the turn stops at its next step
/// (the model is not asked again), then the session is erased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_erased_while_its_turn_runs_is_stopped_first() {
    let private = Private::new(World::new()).await;
    let model = call_then_answer("slow", json!({ "card": ARGUMENT })).await;
    let started = private.world.dir.path().join("started");
    let slow = format!(
        "cat >/dev/null; touch {}; sleep 2; echo 1",
        started.display()
    );
    let tools = [command_tool("slow", &["sh", "-c", &slow], "read_only", 10)];
    let mut command = DaemonProcess::command(&private.world.data(), &[]);
    command.env("MNEME_MASTER_KEY", &private.key);
    let daemon = DaemonProcess::launch(command, &private.world.data()).await;
    let id = daemon.create(&agent_toml(&model.base_url(), &tools)).await;
    let (code, _) = daemon
        .post(
            &format!("/sessions/{id}/messages"),
            &json!({ "text": MESSAGE }),
        )
        .await;
    assert!(code < 300, "{code}");
    eventually(
        "the tool to start",
        std::time::Duration::from_secs(20),
        || async { started.exists() },
    )
    .await;
    let response = daemon
        .http
        .delete(daemon.url(&format!("/sessions/{id}")))
        .json(&json!({ "reason": "asked on 2026-11-30", "by": "dpo" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "erased", "{body}");
    let (_, view) = daemon.get(&format!("/sessions/{id}")).await;
    assert_eq!(view["status"], "erased", "{view}");
    let (_, events) = daemon.get(&format!("/sessions/{id}/events")).await;
    let text = events.to_string();
    assert!(
        text.contains("SessionErased") && !text.contains(MESSAGE),
        "{text}"
    );
    assert_eq!(model.bodies().len(), 1, "the model was asked again");
    let (code, refused) = daemon
        .post(&format!("/sessions/{id}/resume"), &json!({}))
        .await;
    assert_eq!(code, 409, "{refused}");
    assert!(refused["error"].to_string().contains("erased"), "{refused}");
    daemon.terminate().await;
}

/// The head seq of `session`: where a fork holding all of it forks.
async fn head(private: &Private, session: &str) -> String {
    private.kinds(session).await.len().to_string()
}

/// A fork of `session` holding all of it.
async fn fork_all(private: &Private, session: &str) -> String {
    let at = head(private, session).await;
    let out = private.run_ok(&["fork", session, "--at", &at]).await;
    stdout(&out).trim().to_string()
}

/// The status `mneme sessions --json` gives each session.
async fn statuses(private: &Private) -> std::collections::HashMap<String, String> {
    let listed = stdout(&private.run_ok(&["sessions", "--json"]).await);
    (listed.lines())
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .map(|row| {
            let id = row["session"].as_str().unwrap().to_string();
            (id, row["status"].as_str().unwrap().to_string())
        })
        .collect()
}

/// Erases `session` with `extra` arguments; its stderr.
async fn erase_saying(private: &Private, session: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "erase",
        session,
        "--reason",
        "asked on 2026-11-30",
        "--by",
        "dpo",
    ];
    args.extend(extra);
    stderr(&private.run_ok(&args).await)
}

/// A session's copies elsewhere in the store are erased with it: its fork,
/// the fork's own fork and its rerun each hold its content under a key of
/// their own, and each is erased too, recording why, and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasing_a_session_erases_its_forks_and_reruns_with_it() {
    let private = Private::new(World::new()).await;
    let parent = private.planted_session().await;
    let fork = fork_all(&private, &parent).await;
    let fork_of_fork = fork_all(&private, &fork).await;
    let model = MockModel::start(vec![MockReply::answer("another answer")], Fault::None).await;
    let other = private
        .world
        .write("other.toml", &agent_toml(&model.base_url(), &[]));
    let out = private
        .run_ok(&["rerun", &parent, "--agent", other.to_str().unwrap()])
        .await;
    let rerun = session_id(&out);
    let copies = [fork.clone(), fork_of_fork.clone(), rerun.clone()];
    let mut keys = Vec::new();
    for copy in &copies {
        let log = private.log_text(copy).await;
        assert!(log.contains(MESSAGE), "{copy} holds no copy: {log}");
        keys.push(hex::decode(private.wrapped_key(copy).await).unwrap());
    }
    keys.push(hex::decode(private.wrapped_key(&parent).await).unwrap());

    let said = erase_saying(&private, &parent, &[]).await;
    for line in [
        format!("session {parent}: erased"),
        format!("session {fork}: erased with {parent} (a fork of {parent})"),
        format!("session {fork_of_fork}: erased with {parent} (a fork of {fork}, derived from {parent})"),
        format!("session {rerun}: erased with {parent} (a rerun of {parent})"),
    ] {
        assert!(said.contains(&line), "{line:?} not said: {said}");
    }
    // Every key gone; no planted text in any file; each session says why.
    let places = every_byte(&private.world.data());
    for key in &keys {
        assert_eq!(holding(&places, key), Vec::<&str>::new(), "a key is kept");
    }
    for planted in PLANTED {
        assert_eq!(holding(&places, planted.as_bytes()), Vec::<&str>::new());
    }
    let statuses = statuses(&private).await;
    for session in copies.iter().chain([&parent]) {
        assert_eq!(statuses[session], "erased", "{session}: {statuses:?}");
        let log = private.log_text(session).await;
        for planted in PLANTED {
            assert!(!log.contains(planted), "{planted} readable in {session}");
        }
        private.run_ok(&["verify", session]).await;
    }
    for (copy, how) in [
        (&fork, "its fork".to_string()),
        (&fork_of_fork, format!("a fork of {fork}, derived from it")),
        (&rerun, "its rerun".to_string()),
    ] {
        let log = private.log_text(copy).await;
        let reason = format!("asked on 2026-11-30 (erased with session {parent}: {how})");
        assert!(log.contains(&reason) && log.contains("by dpo"), "{log}");
    }
    // Again: nothing to do, the copies named as erased before.
    let again = erase_saying(&private, &parent, &[]).await;
    let line = format!("session {fork}: already erased (a fork of {parent})");
    assert!(again.contains(&line), "{again}");
}

/// `--only-this` erases the one named and names the copies left (a
/// rerun's); it is refused, erasing nothing, while a fork shares the
/// named session's records (they are its history too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_this_erases_the_one_named_and_names_the_copies_left() {
    let private = Private::new(World::new()).await;
    let parent = private.planted_session().await;
    let fork = fork_all(&private, &parent).await;
    let out = private
        .run(&[
            "erase",
            &parent,
            "--reason",
            "r",
            "--by",
            "dpo",
            "--only-this",
        ])
        .await;
    assert!(!out.status.success());
    let refused = stderr(&out);
    assert!(
        refused.contains(&format!("fork(s) share its records ({fork})")),
        "{refused}"
    );
    let statuses = self::statuses(&private).await;
    assert_ne!(statuses[&parent], "erased");
    assert_ne!(statuses[&fork], "erased");

    let model = MockModel::start(vec![MockReply::answer("another answer")], Fault::None).await;
    let other = private
        .world
        .write("other.toml", &agent_toml(&model.base_url(), &[]));
    let out = private
        .run_ok(&["rerun", &parent, "--agent", other.to_str().unwrap()])
        .await;
    let rerun = session_id(&out);
    let rerun_key = hex::decode(private.wrapped_key(&rerun).await).unwrap();
    erase_saying(&private, &fork, &[]).await;
    let said = erase_saying(&private, &parent, &["--only-this"]).await;
    assert!(
        said.contains(&format!("session {parent}: erased")),
        "{said}"
    );
    let kept = format!(
        "session {rerun}: still holds a copy of {parent}'s content (a rerun of {parent}): not erased"
    );
    assert!(said.contains(&kept), "{said}");
    let statuses = self::statuses(&private).await;
    assert_eq!(statuses[&parent], "erased");
    assert_ne!(statuses[&rerun], "erased");
    assert!(private.log_text(&rerun).await.contains(MESSAGE));
    let places = every_byte(&private.world.data());
    assert!(!holding(&places, &rerun_key).is_empty(), "the rerun's key");
    private.run_ok(&["verify", &parent]).await;

    let said = erase_saying(&private, &rerun, &[]).await;
    assert!(said.contains(&format!("session {rerun}: erased")), "{said}");
    let log = private.log_text(&rerun).await;
    assert!(
        !log.contains(MESSAGE) && !log.contains("erased with"),
        "{log}"
    );
}

/// A crash between erasures (the fork's erasure recorded, its key not yet
/// destroyed): a second erasure of the parent finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_erasures_is_finished_by_a_second_erase() {
    let private = Private::new(World::new()).await;
    let parent = private.planted_session().await;
    let fork = fork_all(&private, &parent).await;
    let fork_key = hex::decode(private.wrapped_key(&fork).await).unwrap();
    let out = private
        .mneme()
        .args(["erase", &parent, "--reason", "asked", "--by", "dpo"])
        .env("MNEME_CRASH_AT", "erase_recorded:2")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "the crash point was not reached");
    assert_eq!(statuses(&private).await[&fork], "erased");
    let places = every_byte(&private.world.data());
    assert!(!holding(&places, &fork_key).is_empty(), "crashed before");
    let said = erase_saying(&private, &parent, &[]).await;
    let line = format!("session {fork}: already erased (a fork of {parent})");
    assert!(said.contains(&line), "{said}");
    let places = every_byte(&private.world.data());
    assert_eq!(holding(&places, &fork_key), Vec::<&str>::new());
    let kinds = private.kinds(&fork).await;
    let erasures = kinds.iter().filter(|k| *k == "\"SessionErased\"").count();
    assert_eq!(erasures, 1, "recorded once: {kinds:?}");
    private.run_ok(&["verify", &fork]).await;
}

/// A sub-agent holds what its parent's call gave it; through the daemon,
/// `"cascade": false` names it as holding a copy, and by default it is
/// erased with its parent, the answer listing both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_erases_a_sub_agent_with_its_parent_unless_told_not_to() {
    let private = Private::new(World::new()).await;
    let parent_model = call_then_answer("helper", json!({ "message": MESSAGE })).await;
    let child_model = MockModel::start(vec![MockReply::answer(RESULT)], Fault::None).await;
    std::fs::create_dir(private.world.dir.path().join("agents")).unwrap();
    let child = agent_toml(&child_model.base_url(), &[]).replace("test-agent", "helper");
    private.world.write("agents/helper.toml", &child);
    let helper = "name = \"helper\"\ndescription = \"The helper\"\nkind = \"agent\"\n\
                  agent = \"agents/helper.toml\"\neffect = \"read_only\"\n";
    let agent = private.world.write(
        "parent.toml",
        &agent_toml(&parent_model.base_url(), &[helper.to_string()]),
    );
    let out = private
        .run_ok(&["run", "--agent", agent.to_str().unwrap(), "ask the helper"])
        .await;
    let parent = session_id(&out);
    let statuses_before = statuses(&private).await;
    let child = statuses_before
        .keys()
        .find(|s| **s != parent)
        .unwrap()
        .clone();
    assert!(private.log_text(&child).await.contains(MESSAGE));

    let mut command = DaemonProcess::command(&private.world.data(), &[]);
    command.env("MNEME_MASTER_KEY", &private.key);
    let daemon = DaemonProcess::launch(command, &private.world.data()).await;
    let delete = |body: Value| {
        let request = daemon
            .http
            .delete(daemon.url(&format!("/sessions/{parent}")));
        async move {
            let response = request.json(&body).send().await.unwrap();
            assert_eq!(response.status().as_u16(), 200);
            response.json::<Value>().await.unwrap()
        }
    };
    let only = delete(json!({ "reason": "asked", "by": "dpo", "cascade": false })).await;
    assert_eq!(only["erased"], json!([parent]), "{only}");
    let kept =
        json!([{ "session": child, "from": parent, "link": "sub_agent", "outcome": "kept" }]);
    assert_eq!(only["derived"], kept, "{only}");
    let (_, view) = daemon.get(&format!("/sessions/{child}")).await;
    assert_ne!(view["status"], "erased", "{view}");

    let all = delete(json!({ "reason": "asked", "by": "dpo" })).await;
    assert_eq!(all["erased"], json!([parent, child]), "{all}");
    assert_eq!(all["derived"][0]["outcome"], "erased", "{all}");
    let (_, view) = daemon.get(&format!("/sessions/{child}")).await;
    assert_eq!(view["status"], "erased", "{view}");
    let (_, events) = daemon.get(&format!("/sessions/{child}/events")).await;
    let text = events.to_string();
    assert!(
        text.contains(&format!("erased with session {parent}: its sub-agent"))
            && !text.contains(MESSAGE)
            && !text.contains(RESULT),
        "{text}"
    );
    daemon.terminate().await;
}

/// An unkeyed SHA-256 of an erased request let a 4-digit PIN in it be
/// found by guessing: an encrypted session's request digests are keyed by
/// its key, so neither the store nor `log` holds the plain one, before or
/// after erasure. (The control, in the clear, holds it: the search can
/// fail.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_sessions_request_digests_mean_nothing_without_its_key() {
    async fn one_turn(world: &World, mneme: tokio::process::Command) -> (String, String) {
        let model = MockModel::start(vec![MockReply::answer("ok")], Fault::None).await;
        let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[]));
        let mut mneme = mneme;
        let out = (mneme.args(["run", "--agent", agent.to_str().unwrap(), "my pin is 4821"]))
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        (session_id(&out), replay::digest_hex(&model.raw_bodies()[0]))
    }
    let clear = World::new();
    let (_, plain) = one_turn(&clear, clear.mneme()).await;
    let places = every_byte(&clear.data());
    assert!(
        !holding(&places, plain.as_bytes()).is_empty(),
        "the control"
    );

    let private = Private::new(World::new()).await;
    let (session, plain) = one_turn(&private.world, private.mneme()).await;
    let recorded = |log: &str| -> String {
        let reply = log.lines().find(|l| l.contains("ModelReplied")).unwrap();
        let reply: Value = serde_json::from_str(reply).unwrap();
        reply["event"]["ModelReplied"]["request_digest"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let log = stdout(&private.run_ok(&["log", &session, "--json"]).await);
    let keyed = recorded(&log);
    assert_eq!(keyed.len(), 64, "{keyed}");
    assert_ne!(keyed, plain);
    erase(&private, &session).await;
    let log = stdout(&private.run_ok(&["log", &session, "--json"]).await);
    assert_eq!(recorded(&log), keyed, "the outline keeps the keyed digest");
    let places = every_byte(&private.world.data());
    assert_eq!(holding(&places, plain.as_bytes()), Vec::<&str>::new());
}

/// A model can make a tool name of anything it read (`send_pin_4821`): a
/// name the spec does not have is recorded as `unknown_tool_<i>`, the
/// model's own kept with the content (encrypted, in no file, erased with
/// it), and sent back to the model as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_name_the_model_invented_is_content() {
    const INVENTED: &str = "send_pin_4821";
    let private = Private::new(World::new()).await;
    let model = MockModel::start(
        vec![
            MockReply::calls(&[(INVENTED, json!({}))]),
            MockReply::answer("ok"),
        ],
        Fault::None,
    )
    .await;
    let agent = private
        .world
        .write("agent.toml", &agent_toml(&model.base_url(), &[]));
    let out = private
        .run_ok(&["run", "--agent", agent.to_str().unwrap(), "hi"])
        .await;
    let session = session_id(&out);
    let asked = String::from_utf8_lossy(&model.raw_bodies()[1]).to_string();
    assert!(
        asked.contains(&format!(r#""name":"{INVENTED}""#)),
        "sent back as it was: {asked}"
    );
    assert!(asked.contains("no tool named"), "{asked}");
    let call = |log: &str| -> Value {
        let reply = log.lines().find(|l| l.contains("ModelReplied")).unwrap();
        let reply: Value = serde_json::from_str(reply).unwrap();
        reply["event"]["ModelReplied"]["tool_calls"][0].clone()
    };
    let log = stdout(&private.run_ok(&["log", &session, "--json"]).await);
    assert_eq!(call(&log)["name"], "unknown_tool_0", "{log}");
    assert_eq!(call(&log)["invented"], INVENTED, "readable with the key");
    let places = every_byte(&private.world.data());
    assert_eq!(holding(&places, INVENTED.as_bytes()), Vec::<&str>::new());
    erase(&private, &session).await;
    let log = stdout(&private.run_ok(&["log", &session, "--json"]).await);
    assert_eq!(call(&log)["name"], "unknown_tool_0");
    assert!(!log.contains(INVENTED), "{log}");
}
