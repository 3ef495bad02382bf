//! The daemon's API contract: the OpenAPI document a real daemon serves at
//! `/openapi.json` names exactly the routes it serves, passes a standard
//! validator (`openapi-spec-validator`), and a client generated from it by
//! a standard generator (`openapi-python-client`) drives the daemon the way
//! a Python user would. The Python tools are installed into a virtual
//! environment under target/ by `scripts/python-tools.sh` (once; a fresh
//! machine needs python3 and PyPI, or Debian's packages for python3): these
//! tests are never skipped, they install the tools or fail saying why.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::{DaemonProcess, TOKEN};
use mneme_e2e::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The bin directory of the virtual environment holding the Python tools.
fn python_tools() -> PathBuf {
    let script = repo_root().join("scripts/python-tools.sh");
    let output = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} could not install the Python tools the API contract is checked with \
         (openapi-spec-validator, openapi-python-client: python3 and PyPI are needed):\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// Runs `command`; its stdout, or a failure showing everything it said.
fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let said = format!(
        "{command:?} exited {}:\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{said}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The document a real daemon serves, written to `dir/openapi.json`.
async fn served_document(daemon: &DaemonProcess, dir: &Path) -> (Value, PathBuf) {
    let (status, document) = daemon.get("/openapi.json").await;
    assert_eq!(status, 200, "{document}");
    let path = dir.join("openapi.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&document).unwrap()).unwrap();
    (document, path)
}

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_names_exactly_the_routes_served() {
    let world = World::new();
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let (document, _) = served_document(&daemon, world.dir.path()).await;
    let paths = document["paths"].as_object().unwrap();
    assert!(paths.contains_key("/sessions/{id}/calls/{call}/resolve"));
    let mut checked = 0;
    for (path, item) in paths {
        // A session that does not exist: every route answers before doing anything.
        let url = daemon.url(
            &path
                .replace("{id}", "0192a000-0000-7000-8000-000000000000")
                .replace("{call}", "call_0")
                .replace("{name}", "nobody"),
        );
        for method in METHODS {
            let documented = item.get(method.to_lowercase()).is_some();
            let request = daemon
                .http
                .request(method.parse().unwrap(), &url)
                .header("content-type", "application/json")
                .body("{}");
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            let error = body["error"].as_str().unwrap_or("");
            if documented {
                // Served: not "no such route", not "method not allowed".
                let unrouted = status == 404 && error.ends_with(": not found");
                assert!(
                    status != 405 && !unrouted,
                    "{method} {path} is documented but not served: {status} {body}"
                );
                checked += 1;
            } else {
                assert_eq!(
                    status, 405,
                    "{method} {path} is served (or fails otherwise) but not documented: {body}"
                );
            }
        }
    }
    assert_eq!(checked, 36, "operations checked");
    // And a path the document does not name is not served.
    let (status, body) = daemon.get("/sessions/x/undocumented").await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].as_str().unwrap().ends_with(": not found"));
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_passes_openapi_spec_validator() {
    let tools = python_tools();
    let world = World::new();
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let (document, path) = served_document(&daemon, world.dir.path()).await;
    assert!(daemon.terminate().await.success());
    assert_eq!(document["openapi"], "3.1.0");
    let said = run(Command::new(tools.join("openapi-spec-validator")).arg(&path));
    assert!(said.contains("OK"), "{said}");
}

/// What the generated client does, as a Python user would write it.
const PYTHON_USER: &str = r#"
import json, sys, uuid
from mneme_daemon_client import AuthenticatedClient
from mneme_daemon_client.api.default import create_session, get_session, post_message, list_sessions
from mneme_daemon_client.models import ApiError, CreateSession, Created, PostMessage, SessionStatus, SessionView, TurnOutcome

base, token = sys.argv[1], sys.argv[2]
client = AuthenticatedClient(base_url=base, token=token, raise_on_unexpected_status=True)

created = create_session.sync(client=client, body=CreateSession(agent="helper"))
assert isinstance(created, Created), created
ended = post_message.sync(created.session, client=client, body=PostMessage(text="hello", wait=True))
assert isinstance(ended, TurnOutcome), ended
assert ended.status == SessionStatus.IDLE, ended
session = get_session.sync(created.session, client=client)
assert isinstance(session, SessionView), session
listed = list_sessions.sync(client=client, status=SessionStatus.IDLE)

missing = get_session.sync(uuid.UUID("0192a000-0000-7000-8000-000000000000"), client=client)
assert isinstance(missing, ApiError), missing
wrong = AuthenticatedClient(base_url=base, token="wrong")
refused = get_session.sync(created.session, client=wrong)
assert isinstance(refused, ApiError), refused

print(json.dumps({
    "session": str(created.session),
    "answer": ended.answer,
    "status": session.status.value,
    "read_answer": session.answer,
    "listed": [str(row.session) for row in listed],
    "missing": missing.error,
    "refused": refused.error,
}))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_generated_from_the_document_drives_the_daemon() {
    let tools = python_tools();
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("Hello from mneme.")])
        .await;
    let world = &bed.world;
    let agents = world.dir.path().join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(agents.join("helper.toml"), &bed.agent_toml).unwrap();
    let agents = agents.to_str().unwrap();
    let daemon = DaemonProcess::start(&world.data(), &["--agents", agents]).await;
    let (_, document) = served_document(&daemon, world.dir.path()).await;
    let client = world.dir.path().join("mneme_daemon_client");
    // No formatting of the generated code afterwards (it would want ruff).
    let config = world.write("generator.yaml", "post_hooks: []\n");
    run(Command::new(tools.join("openapi-python-client"))
        .arg("generate")
        .arg("--path")
        .arg(&document)
        .arg("--config")
        .arg(&config)
        .arg("--meta")
        .arg("none")
        .arg("--output-path")
        .arg(&client)
        .current_dir(world.dir.path()));
    let said = run(Command::new(tools.join("python"))
        .arg("-c")
        .arg(PYTHON_USER)
        .arg(&daemon.base)
        .arg(TOKEN)
        .env("PYTHONPATH", world.dir.path()));
    let seen: Value = serde_json::from_str(said.trim()).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert_eq!(seen["answer"], "Hello from mneme.", "{seen}");
    assert_eq!(seen["status"], "idle", "{seen}");
    assert_eq!(seen["read_answer"], "Hello from mneme.", "{seen}");
    assert_eq!(
        seen["listed"],
        serde_json::json!([seen["session"]]),
        "{seen}"
    );
    assert!(
        seen["missing"].as_str().unwrap().contains("no session"),
        "{seen}"
    );
    assert!(
        seen["refused"].as_str().unwrap().contains("bearer token"),
        "{seen}"
    );
    // What the Python user did is in the log, as if done by the CLI.
    let (_, verified) = daemon
        .get(&format!(
            "/sessions/{}/verify",
            seen["session"].as_str().unwrap()
        ))
        .await;
    assert_eq!(verified["ok"], true, "{verified}");
    assert!(daemon.terminate().await.success());
}
