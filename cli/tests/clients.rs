//! The Python and TypeScript clients (`clients/`) against a real daemon.
//!
//! A Python script (`clients/python/tests/drive_daemon.py`, on the client
//! installed with `pip install ./clients/python`) and a TypeScript one
//! (`clients/typescript/test/drive_daemon.mjs`, type-checked against the
//! package's types with tsc, run by node on the shipped `dist/`) each create
//! a session of an agent whose `refund` waits for approval, send a message,
//! follow the session's events while the daemon is restarted under them (the
//! stream reopens with `Last-Event-ID`: no event lost or repeated), approve
//! the call with edited arguments, follow on to the answer, read the session
//! back, stream a reply's text, fork and erase, and meet the daemon's
//! errors. The test checks what they printed and the daemon's record (the
//! sink charged once with the edited arguments; `mneme log` names who
//! edited, to what).
//!
//! And the drift check: the checked-in `clients/openapi.json`, the Python
//! models, the TypeScript types and the compiled `dist/` are exactly what
//! `clients/generate.sh` makes from the document the binary serves, and
//! the hand-written Python layer type-checks (`mypy --strict`) against its
//! models.
//!
//! The tools (pinned) are installed under target/ by
//! `scripts/client-tools.sh`: these tests are never skipped, they install
//! what they need or fail saying why.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::{DaemonProcess, TOKEN};
use mneme_e2e::hostile::{streamed_text, Answer, HostileModel};
use mneme_e2e::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The model's id of the call that waits for approval.
const CALL: &str = "call_refund";
/// The answer after the approved refund.
const ANSWER: &str = "Refunded 2 cents to ada.";
/// The second message's answer, streamed in these pieces.
const PIECES: [&str; 3] = ["Streamed ", "piece by piece, ", "to the client."];
/// How long a script may take, at most.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

/// What `scripts/client-tools.sh WHICH` installed: the Python tools' bin
/// directory (`python`), or the TypeScript tools' node_modules (`node`).
fn client_tools(which: &str) -> PathBuf {
    let script = repo_root().join("scripts/client-tools.sh");
    let output = StdCommand::new("bash")
        .arg(&script)
        .arg(which)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} {which} could not install the clients' tools (python3 and PyPI, or node, npm \
         and the npm registry, are needed):\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// Runs `command`; its stdout, or a failure showing everything it said.
fn run(command: &mut StdCommand) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} exited {}:\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn clients() -> PathBuf {
    repo_root().join("clients")
}

/// Where two JSON documents differ (JSON pointers, the first few).
fn differences(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
    if out.len() >= 12 {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let here = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                match (x.get(key), y.get(key)) {
                    (Some(v), Some(w)) => differences(v, w, &here, out),
                    (Some(_), None) => out.push(format!("{here}: only served")),
                    _ => out.push(format!("{here}: only checked in")),
                }
            }
        }
        _ if a != b => out.push(format!("{at}: served {a:.80}, checked in {b:.80}")),
        _ => {}
    }
}

/// The files under `dir`, relative, with their bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    found.sort();
    found
}

/// Fails unless `made` (what the generator makes now) is the checked-in
/// file `checked_in` (a path under clients/).
fn assert_same_file(made: &Path, checked_in: &str) {
    let made_text = std::fs::read_to_string(made).unwrap();
    let checked_text = std::fs::read_to_string(clients().join(checked_in)).unwrap_or_default();
    if made_text != checked_text {
        let line = (made_text.lines().zip(checked_text.lines()))
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| made_text.lines().count().min(checked_text.lines().count()));
        panic!(
            "clients/{checked_in} is not what clients/generate.sh makes from the document the \
             daemon serves (first difference at line {}): run clients/generate.sh and commit the result",
            line + 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_client_files_are_what_the_served_document_generates() {
    let python = client_tools("python");
    let node = client_tools("node");
    let world = World::new();
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let (status, served) = daemon.get("/openapi.json").await;
    assert_eq!(status, 200, "{served}");
    assert!(daemon.terminate().await.success());

    let checked_in: Value =
        serde_json::from_slice(&std::fs::read(clients().join("openapi.json")).unwrap()).unwrap();
    let mut differ = Vec::new();
    differences(&served, &checked_in, "", &mut differ);
    assert!(
        differ.is_empty(),
        "clients/openapi.json is not the document the daemon serves: run clients/generate.sh \
         and commit the result. Where they differ:\n{}",
        differ.join("\n")
    );

    // Generated again from the served document, with the pinned tools.
    let document = world.write("openapi.json", &serde_json::to_string(&served).unwrap());
    let models = world.dir.path().join("models.py");
    run(StdCommand::new(clients().join("python/generate-models.sh"))
        .arg(python.join("datamodel-codegen"))
        .arg(&document)
        .arg(&models));
    assert_same_file(&models, "python/src/mneme_client/models.py");
    let schema = world.dir.path().join("schema.ts");
    run(
        StdCommand::new(clients().join("typescript/generate-types.sh"))
            .arg(&node)
            .arg(&document)
            .arg(&schema),
    );
    assert_same_file(&schema, "typescript/src/schema.ts");
    // dist/ is what tsc makes of src/ (which type-checks against the types).
    let dist = world.dir.path().join("dist");
    run(StdCommand::new(clients().join("typescript/build.sh"))
        .arg(&node)
        .arg(&dist));
    let checked_in_dist = clients().join("typescript/dist");
    let (made, shipped) = (files(&dist), files(&checked_in_dist));
    let names = |f: &[(String, Vec<u8>)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&made),
        names(&shipped),
        "clients/typescript/dist/: run clients/generate.sh"
    );
    for ((name, made), (_, shipped)) in made.iter().zip(&shipped) {
        assert!(
            made == shipped,
            "clients/typescript/dist/{name} is not what tsc makes of src/: run clients/generate.sh"
        );
    }
    // The hand-written Python layer (and the test's script) against the models.
    let said = run(StdCommand::new(python.join("mypy"))
        .args(["--strict", "--no-error-summary", "--cache-dir"])
        .arg(repo_root().join("target/client-tools/mypy-cache"))
        .arg(clients().join("python/src/mneme_client"))
        .arg(clients().join("python/tests/drive_daemon.py"))
        .env("MYPYPATH", clients().join("python/src")));
    assert!(said.trim().is_empty(), "{said}");
}

/// A daemon's world: the model, the sink the refund charges, an agent
/// `billing` in an agents directory, a master key (so sessions can be
/// erased), and a loopback address the daemon keeps across restarts.
struct Bed {
    world: World,
    sink: Sink,
    key: PathBuf,
    agents: PathBuf,
    addr: String,
    /// A loopback address nothing listens on.
    closed: String,
    _model: HostileModel,
}

impl Bed {
    async fn new() -> Bed {
        let world = World::new();
        let sink = Sink::start().await.unwrap();
        let model = model().await;
        let key = world.dir.path().join("master.key");
        let out = world
            .run(&["keygen", "--master", "--out", key.to_str().unwrap()])
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
        let agents = world.dir.path().join("agents");
        std::fs::create_dir_all(&agents).unwrap();
        let agent = agent_toml(&model.base_url(), &[refund_needing_approval(&sink)])
            .replace("timeout_secs = 10\n", "timeout_secs = 10\nstream = true\n")
            .replace("name = \"test-agent\"", "name = \"billing\"");
        std::fs::write(agents.join("billing.toml"), agent).unwrap();
        let free = || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().to_string()
        };
        Bed {
            world,
            sink,
            key,
            agents,
            addr: free(),
            closed: free(),
            _model: model,
        }
    }

    /// A daemon on the bed's address.
    async fn daemon(&self) -> DaemonProcess {
        let mut command = tokio::process::Command::new(mneme_bin());
        command
            .arg("--data-dir")
            .arg(self.world.data())
            .args(["serve", "--listen", &self.addr, "--agents"])
            .arg(&self.agents)
            .env("MNEME_TOKEN", TOKEN)
            .env("MNEME_MASTER_KEY", &self.key)
            .env_remove("MNEME_CRASH_AT")
            .kill_on_drop(true);
        DaemonProcess::launch(command, &self.world.data()).await
    }

    /// Runs `script` (a client's) against a daemon: restarts the daemon
    /// when it says `RESTART`, answers `restarted` once the new one
    /// listens; what it printed after `RESULT `.
    async fn drive(&self, mut script: tokio::process::Command) -> Value {
        let mut daemon = Some(self.daemon().await);
        script
            .env("MNEME_URL", format!("http://{}", self.addr))
            .env("MNEME_TOKEN", TOKEN)
            .env("MNEME_CLOSED_URL", format!("http://{}", self.closed))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = script.spawn().unwrap_or_else(|e| panic!("{script:?}: {e}"));
        let mut stdin = child.stdin.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let said = tokio::spawn(async move {
            let mut text = String::new();
            stderr.read_to_string(&mut text).await.unwrap();
            text
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut printed = Vec::new();
        let mut restarts = 0;
        let reading = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line == "RESTART" {
                    let stopped = daemon.take().unwrap().terminate().await;
                    assert!(stopped.success(), "the daemon's exit: {stopped}");
                    daemon = Some(self.daemon().await);
                    restarts += 1;
                    stdin.write_all(b"restarted\n").await.unwrap();
                }
                printed.push(line);
            }
        };
        let finished = tokio::time::timeout(SCRIPT_TIMEOUT, reading).await;
        let status = match finished {
            Ok(()) => child.wait().await.unwrap(),
            Err(_) => {
                child.start_kill().unwrap();
                child.wait().await.unwrap()
            }
        };
        let said = said.await.unwrap();
        let printed = printed.join("\n");
        assert!(
            finished.is_ok(),
            "{script:?} ran longer than {SCRIPT_TIMEOUT:?}:\n--- stdout\n{printed}\n--- stderr\n{said}"
        );
        assert!(
            status.success(),
            "{script:?} exited {status}:\n--- stdout\n{printed}\n--- stderr\n{said}"
        );
        assert_eq!(restarts, 1, "the script asks for one restart: {printed}");
        let result = (printed.lines())
            .find_map(|l| l.strip_prefix("RESULT "))
            .unwrap_or_else(|| panic!("no RESULT line:\n{printed}\n--- stderr\n{said}"));
        let seen: Value = serde_json::from_str(result).unwrap_or_else(|e| panic!("{e}: {result}"));
        assert!(daemon.take().unwrap().terminate().await.success());
        seen
    }

    /// What the script saw, and the daemon's record, as the script's steps
    /// should have left them.
    async fn check(&self, seen: &Value) {
        let session = seen["session"].as_str().unwrap();
        // The turn's outcome: the call waits, with the model's arguments.
        let awaiting = &seen["awaiting"];
        assert_eq!(awaiting.as_array().map(Vec::len), Some(1), "{seen}");
        assert_eq!(awaiting[0]["call_id"], CALL, "{seen}");
        assert_eq!(awaiting[0]["tool"], "refund", "{seen}");
        assert_eq!(args(&awaiting[0]["arguments"]), json!({"n": 1}), "{seen}");
        assert_eq!(
            seen["decided"],
            json!({"decided": CALL, "continuing": true})
        );

        // Followed across the restart: every event once, in order, to the answer.
        let seqs: Vec<u64> = (seen["seqs"].as_array().unwrap().iter())
            .map(|s| s.as_u64().unwrap())
            .collect();
        let answer_seq = seen["answer_seq"]
            .as_u64()
            .expect("the answer was followed");
        assert_eq!(seqs, (1..=answer_seq).collect::<Vec<_>>(), "{seen}");
        assert!(seen["reconnects"].as_u64().unwrap() >= 1, "{seen}");
        let kinds = seen["kinds"].to_string();
        for kind in [
            "ApprovalRequested",
            "ApprovalDecided",
            "ToolStarted",
            "ToolFinished",
        ] {
            assert!(kinds.contains(kind), "{kind} not followed: {kinds}");
        }
        let before: u64 = seen["before_restart"].as_str().unwrap().parse().unwrap();
        assert!(before < answer_seq, "{seen}");

        // Read back.
        assert_eq!(seen["status"], "idle", "{seen}");
        assert_eq!(seen["answer"], ANSWER, "{seen}");
        let approval = &seen["approval"][0];
        assert_eq!(approval["approved"], true, "{seen}");
        assert_eq!(approval["by"], "ada", "{seen}");
        assert_eq!(args(&approval["args"]), json!({"n": 2}), "{seen}");

        // The streamed reply: its pieces, in order, make the answer.
        let whole = PIECES.concat();
        assert_eq!(seen["streamed_answer"], whole.as_str(), "{seen}");
        let deltas = seen["deltas"].as_array().unwrap();
        let text: String = deltas.iter().map(|d| d["text"].as_str().unwrap()).collect();
        assert_eq!(text, whole, "{seen}");
        let offsets: Vec<u64> = deltas
            .iter()
            .map(|d| d["offset"].as_u64().unwrap())
            .collect();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{seen}");
        assert_eq!(offsets.last(), Some(&(whole.len() as u64)), "{seen}");
        let reply_seq = deltas[0]["seq"].as_u64().unwrap();
        assert!(deltas.iter().all(|d| d["seq"] == reply_seq), "{seen}");

        // What the daemon reads out of it: the plan, the next request (the
        // whole conversation), no cache miss (the model reports none).
        let reads = &seen["reads"];
        assert_eq!(reads["replay_events"], reply_seq, "{seen}");
        assert_eq!(reads["tools"], json!([["refund", "side_effect"]]), "{seen}");
        let roles = [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
        ];
        assert_eq!(reads["next_request_roles"], json!(roles), "{seen}");
        assert_eq!(reads["cache_misses"], 0, "{seen}");

        // The fork, compared, erased.
        let fork = seen["fork"]["id"].as_str().unwrap();
        assert_eq!(seen["fork"]["forked_from"], session, "{seen}");
        let diff = &seen["diff"];
        assert_eq!(diff["common"], 2, "{seen}");
        assert_eq!(diff["answer"], whole.as_str(), "{seen}");
        assert_eq!(diff["fork_events"], seen["fork"]["events"], "{seen}");
        assert_eq!(seen["erased"]["status"], "erased", "{seen}");
        assert_eq!(seen["erased"]["erased"], json!([fork]), "{seen}");

        // Each error as the daemon said it.
        let errors = &seen["errors"];
        let error = |name: &str, status: Value, says: &str| {
            assert_eq!(errors[name]["status"], status, "{name}: {errors}");
            let message = errors[name]["message"].as_str().unwrap();
            assert!(message.contains(says), "{name}: {message:?} lacks {says:?}");
        };
        error(
            "unknown_session",
            json!(404),
            "0192a000-0000-7000-8000-000000000000",
        );
        error("wrong_token", json!(401), "bearer token");
        error("approve_again", json!(409), CALL);
        error("pause_idle", json!(409), "");
        error("erased_fork", json!(409), "erased");
        error("unreachable", Value::Null, &self.closed);
        error("deny_decided", json!(409), "does not wait for approval");
        error("resolve_not_in_doubt", json!(409), "is not in doubt");
        error("wake_awake", json!(409), "sleeps");
        assert!(seen["listed"].to_string().contains(session), "{seen}");
        let resumed = json!({"status": "idle", "answer": whole});
        assert_eq!(seen["resumed"], resumed, "{seen}");
        assert_eq!(seen["cancelled"], "cancelled", "{seen}");
        assert_eq!(seen["status_at_end"], "cancelled", "{seen}");

        // The daemon's record: charged once, with the person's arguments.
        assert_eq!(self.sink.bodies("refund"), [json!({"n": 2})]);
        assert_eq!(self.sink.stats().path("refund").effects, 1);
        let out = (self.world.mneme())
            .args(["log", "--json", session])
            .env("MNEME_MASTER_KEY", &self.key)
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let records: Vec<Value> = (stdout(&out).lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let of = |kind: &str| {
            (records.iter())
                .find(|r| r["kind"] == kind)
                .unwrap_or_else(|| panic!("no {kind} in {records:?}"))
        };
        let decided = &of("ApprovalDecided")["event"]["ApprovalDecided"];
        assert_eq!(decided["by"], "ada", "{decided}");
        assert_eq!(args(&decided["args"]), json!({"n": 2}), "{decided}");
        let started = &of("ToolStarted")["event"]["ToolStarted"];
        assert_eq!(args(&started["args"]), json!({"n": 2}), "{started}");
        let replied = (records.iter())
            .filter(|r| r["kind"] == "ModelReplied")
            .map(|r| r["seq"].as_u64().unwrap())
            .collect::<Vec<_>>();
        assert!(replied.contains(&answer_seq), "{replied:?} {seen}");
        assert!(replied.contains(&reply_seq), "{replied:?} {seen}");
        assert_eq!(
            records.len() as u64,
            records.last().unwrap()["seq"].as_u64().unwrap()
        );
    }
}

/// A JSON text's value.
fn args(text: &Value) -> Value {
    serde_json::from_str(
        text.as_str()
            .unwrap_or_else(|| panic!("not a text: {text}")),
    )
    .unwrap()
}

/// The agent's model, streaming: a turn's first request calls `refund`
/// (`{"n": 1}`), the one after its result answers [`ANSWER`], and the next
/// message's answer comes in [`PIECES`].
async fn model() -> HostileModel {
    HostileModel::start(|_, request, _| {
        let replies = (request["messages"].as_array().into_iter().flatten())
            .filter(|m| m["role"] == "assistant")
            .count();
        let events = match replies {
            0 => vec![
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": CALL, "type": "function", "function": {"name": "refund", "arguments": "{\"n\""}}]}}]}).to_string(),
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "finish_reason": "tool_calls"}]}).to_string(),
            ],
            1 => streamed_text(&[ANSWER], "stop"),
            _ => streamed_text(&PIECES, "stop"),
        };
        Answer::Stream {
            events,
            gate: None,
            then_stall: false,
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_drives_a_real_daemon() {
    let python = client_tools("python");
    let bed = Bed::new().await;
    let mut script = tokio::process::Command::new(python.join("python"));
    script.arg(clients().join("python/tests/drive_daemon.py"));
    let seen = bed.drive(script).await;
    bed.check(&seen).await;
    // The async face read the same session back.
    let head = seen["before_restart"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    let read = &seen["async"];
    assert_eq!(read["answer"], PIECES.concat().as_str(), "{seen}");
    assert_eq!(read["page"], json!([head - 1, head]), "{seen}");
    assert_eq!(read["followed"], json!([head + 1, head + 2]), "{seen}");
    assert_eq!(read["missing"], 404, "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_client_drives_a_real_daemon() {
    let node = client_tools("node");
    let package = clients().join("typescript");
    // The script, checked against the package's types as a user's code is.
    run(StdCommand::new("node")
        .arg(node.join("typescript/bin/tsc"))
        .arg("-p")
        .arg(package.join("test/tsconfig.json"))
        .arg("--typeRoots")
        .arg(node.join("@types")));
    let bed = Bed::new().await;
    let mut script = tokio::process::Command::new("node");
    script.arg(package.join("test/drive_daemon.mjs"));
    let seen = bed.drive(script).await;
    bed.check(&seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_sse_parsers_frame_as_the_spec_says_and_bound_what_they_take() {
    let python = client_tools("python");
    let node = client_tools("node");
    let output = StdCommand::new(python.join("python"))
        .args(["-m", "unittest", "-v", "clients/python/tests/test_sse.py"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert!(
        said.contains("Ran 5 tests") && said.contains("\nOK"),
        "{said}"
    );
    run(StdCommand::new("node")
        .arg(node.join("typescript/bin/tsc"))
        .arg("-p")
        .arg(clients().join("typescript/test/tsconfig.json"))
        .arg("--typeRoots")
        .arg(node.join("@types")));
    let said = run(StdCommand::new("node")
        .args(["--test", "test/sse.test.mjs"])
        .current_dir(clients().join("typescript")));
    assert!(
        said.contains("# pass 5") && said.contains("# fail 0"),
        "{said}"
    );
}
