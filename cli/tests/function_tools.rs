//! Tools written as Python and TypeScript functions: the examples of
//! `examples/python-tools/` (the official MCP Python SDK, `mcp`) and
//! `examples/typescript-tools/` (the official MCP TypeScript SDK), run by
//! the real binary with their own agent files (only the model is the
//! scripted loopback double's, and the server's path made absolute). The
//! model calls each tool once: a read-only lookup, an idempotent write keyed
//! by the call's idempotency key, a key-ignoring side effect whose check is
//! another function of the server. mneme is SIGKILLed mid-call, and after
//! `mneme resume` each effect is in the files the functions write exactly
//! once.
//!
//! The SDKs are installed under target/ by `scripts/function-tools.sh`
//! (pinned by the examples' requirements.txt and package.json): never
//! skipped, they install or the test fails saying why.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Output;
use std::sync::OnceLock;
use std::time::Duration;

/// How long a held call waits to have taken effect: a server's start
/// (Python's SDK imports in about a second, more on a loaded machine) and
/// two calls before it.
const EFFECT_WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Lang {
    Python,
    TypeScript,
}

/// An example's server, ready to run.
struct Installed {
    /// The program the agent file's `command` runs.
    program: PathBuf,
    /// PATH for mneme (which passes it to the server): the Python SDK's
    /// virtual environment first, for server.py's `#!/usr/bin/env python3`.
    path: String,
}

impl Lang {
    fn example(self) -> PathBuf {
        let name = match self {
            Lang::Python => "python-tools",
            Lang::TypeScript => "typescript-tools",
        };
        repo_root().join("examples").join(name)
    }

    fn installed(self) -> &'static Installed {
        static PYTHON: OnceLock<Installed> = OnceLock::new();
        static TYPESCRIPT: OnceLock<Installed> = OnceLock::new();
        let once = match self {
            Lang::Python => &PYTHON,
            Lang::TypeScript => &TYPESCRIPT,
        };
        once.get_or_init(|| self.install())
    }

    fn install(self) -> Installed {
        let which = match self {
            Lang::Python => "python",
            Lang::TypeScript => "typescript",
        };
        let script = repo_root().join("scripts/function-tools.sh");
        let output = std::process::Command::new("bash")
            .arg(&script)
            .arg(which)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "{} {which} could not install the MCP SDK (python3 and PyPI, or Node.js, npm and the npm registry, are needed):\n{}",
            script.display(),
            stderr(&output)
        );
        let printed = PathBuf::from(stdout(&output).trim());
        let path = std::env::var("PATH").unwrap_or_default();
        match self {
            Lang::Python => Installed {
                program: self.example().join("server.py"),
                path: format!("{}:{path}", printed.display()),
            },
            Lang::TypeScript => Installed {
                program: printed,
                path,
            },
        }
    }
}

/// A world running one example's agent against the scripted model.
struct Bed {
    world: World,
    model: MockModel,
    agent: PathBuf,
    lang: Lang,
}

const ANSWER: &str = "Ada is looked up, noted, and has her receipt.";

/// The model calls each tool of the example once, in turn, then answers.
fn replies() -> Vec<MockReply> {
    vec![
        MockReply::calls(&[("crm__find_customer", json!({"name": "ada"}))]),
        MockReply::calls(&[(
            "crm__save_note",
            json!({"customer": "ada", "text": "Prefers email receipts."}),
        )]),
        MockReply::calls(&[(
            "crm__send_receipt",
            json!({"to": "ada@example.com", "text": "Your receipt for $42.00"}),
        )]),
        MockReply::answer(ANSWER),
    ]
}

impl Bed {
    /// The example's agent file, as it stands but for its model (the
    /// scripted double) and its server's path (absolute: the file is
    /// written into the world).
    async fn new(lang: Lang) -> Bed {
        let installed = lang.installed();
        let world = World::new();
        let model = MockModel::start(replies(), Fault::None).await;
        let text = std::fs::read_to_string(lang.example().join("agent.toml")).unwrap();
        let mut agent: toml::Table = toml::from_str(&text).unwrap();
        let mut scripted = toml::Table::new();
        scripted.insert("provider".into(), "openai".into());
        scripted.insert("base_url".into(), model.base_url().into());
        scripted.insert("model".into(), "test-model".into());
        scripted.insert("timeout_secs".into(), 10.into());
        agent.insert("model".into(), scripted.into());
        let server = &mut agent["mcp"].as_array_mut().unwrap()[0];
        let command = server["command"].as_array_mut().unwrap();
        assert_eq!(
            command.len(),
            1,
            "the example runs its server as one program"
        );
        command[0] = installed.program.display().to_string().into();
        let agent = world.write("agent.toml", &toml::to_string(&agent).unwrap());
        Bed {
            world,
            model,
            agent,
            lang,
        }
    }

    /// `mneme ARGS` in the world's directory (where the tools write their
    /// files), with the example's PATH.
    fn mneme(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = self.world.mneme();
        command
            .args(args)
            .current_dir(self.world.dir.path())
            .env("PATH", &self.lang.installed().path);
        command
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.mneme(args).output().await.unwrap()
    }

    fn run_args(&self) -> [&str; 4] {
        let message = "Look ada up, note that she prefers email, and email her a receipt for $42";
        ["run", "--agent", self.agent.to_str().unwrap(), message]
    }

    fn file(&self, name: &str) -> PathBuf {
        self.world.dir.path().join(name)
    }

    /// The receipts send_receipt sent (outbox.jsonl, a line each).
    fn receipts(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.file("outbox.jsonl")).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The notes save_note saved (notes.json), by idempotency key.
    fn notes(&self) -> serde_json::Map<String, Value> {
        match std::fs::read_to_string(self.file("notes.json")) {
            Ok(text) => serde_json::from_str(&text).unwrap(),
            Err(_) => serde_json::Map::new(),
        }
    }

    /// `mneme run`, SIGKILLed while `tool` holds its call after taking
    /// effect (the example's hook: it waits while `hold-TOOL` exists, as a
    /// slow API would); `applied` says when it has. The hold is then let go,
    /// and the killed run's output returned.
    async fn run_killed_in(&self, tool: &str, applied: impl Fn(&Bed) -> bool) -> Output {
        let hold = self.file(&format!("hold-{tool}"));
        std::fs::write(&hold, "").unwrap();
        let mut child = self
            .mneme(&self.run_args())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let what = format!("{:?}'s {tool} to take effect", self.lang);
        eventually(what, EFFECT_WAIT, || async { applied(self) }).await;
        child.start_kill().unwrap(); // SIGKILL, mid-call: the function is still running
        let killed = child.wait_with_output().await.unwrap();
        std::fs::remove_file(&hold).unwrap();
        assert_eq!(killed.status.code(), None, "killed: {}", stderr(&killed));
        killed
    }

    /// `mneme resume SESSION`, which must answer as the uncrashed run does.
    async fn resume(&self, session: &str) {
        let out = self.run(&["resume", session]).await;
        assert!(out.status.success(), "resume: {}", stderr(&out));
        assert_eq!(stdout(&out).trim(), ANSWER);
    }

    /// The session's events, each as (kind, fields).
    async fn events(&self, session: &str) -> Vec<(String, Value)> {
        let out = self.run(&["log", "--json", session]).await;
        let lines = log_lines(&out).into_iter();
        lines.map(|(_, kind, event)| (kind, event)).collect()
    }
}

fn of_kind<'a>(events: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|(k, _)| k == kind)
        .map(|(_, e)| e)
        .collect()
}

/// The ToolStarted events of `tool` (its name as the model calls it).
fn started<'a>(events: &'a [(String, Value)], tool: &str) -> Vec<&'a Value> {
    let all = of_kind(events, "ToolStarted");
    all.into_iter().filter(|s| s["tool"] == tool).collect()
}

/// Asserts what every finished session of the example holds: each effect
/// once, under the key mneme gave its call (the key reached the function
/// in `_meta`).
fn assert_each_effect_once(bed: &Bed, events: &[(String, Value)]) {
    let key = |tool: &str| {
        let starts = started(events, tool);
        let keys: Vec<&Value> = starts.iter().map(|s| &s["idempotency_key"]).collect();
        assert!(
            keys.windows(2).all(|w| w[0] == w[1]),
            "every attempt of {tool} has its call's key: {keys:?}"
        );
        keys[0].as_str().unwrap().to_string()
    };
    let receipts = bed.receipts();
    assert_eq!(receipts.len(), 1, "one receipt sent: {receipts:?}");
    assert_eq!(receipts[0]["message_id"], key("crm__send_receipt"));
    assert_eq!(receipts[0]["to"], "ada@example.com");
    let notes = bed.notes();
    assert_eq!(notes.len(), 1, "one note saved: {notes:?}");
    let note = &notes[&key("crm__save_note")];
    assert_eq!(note["text"], "Prefers email receipts.", "{notes:?}");
    assert!(of_kind(events, "ToolInDoubt").is_empty(), "no person asked");
}

async fn runs_with_its_declared_effects(lang: Lang) {
    let bed = Bed::new(lang).await;
    let out = bed.run(&bed.run_args()).await;
    assert!(out.status.success(), "{lang:?}: {}", stderr(&out));
    assert_eq!(stdout(&out).trim(), ANSWER);
    let session = session_id(&out);
    let events = bed.events(&session).await;
    assert_each_effect_once(&bed, &events);

    // The model was offered the three functions (not the check) under the
    // server's name, with the schemas the SDK made of their signatures.
    let first: Value = serde_json::from_slice(&bed.model.bodies()[0]).unwrap();
    let offered: Vec<&Value> = first["tools"].as_array().unwrap().iter().collect();
    let names: Vec<&str> = offered
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["crm__find_customer", "crm__save_note", "crm__send_receipt"],
        "{lang:?}"
    );
    let receipt = &offered[2]["function"]["parameters"];
    assert_eq!(receipt["properties"]["to"]["type"], "string", "{receipt}");

    // Each call ran with the effect the agent file gives its function.
    let effects: Vec<(&str, &str)> = of_kind(&events, "ToolStarted")
        .iter()
        .map(|s| (s["tool"].as_str().unwrap(), s["effect"].as_str().unwrap()))
        .collect();
    assert_eq!(
        effects,
        [
            ("crm__find_customer", "read_only"),
            ("crm__save_note", "idempotent"),
            ("crm__send_receipt", "side_effect"),
        ]
    );
    // The lookup's answer is the function's return value.
    let finished = of_kind(&events, "ToolFinished");
    let found = finished[0]["outcome"]["Ok"].as_str().unwrap();
    let found: Value = serde_json::from_str(found).unwrap();
    assert_eq!(found["name"], "Ada Lovelace", "{lang:?}");
    // Nothing was interrupted, so nothing was checked.
    assert!(of_kind(&events, "ToolChecked").is_empty());
    let replay = stdout(&bed.run(&["replay", &session]).await);
    for line in [
        "crm__find_customer (mcp): read_only (from policy)",
        "crm__save_note (mcp): idempotent (from policy)",
        "crm__send_receipt (mcp): side_effect (from policy)",
    ] {
        assert!(replay.contains(line), "{lang:?}: {line}\n{replay}");
    }
}

/// SIGKILL while send_receipt (which ignores keys) is running, its email
/// sent: the resume asks receipt_sent, which finds the email by its key,
/// and records its answer as the call's outcome. One email, no person.
async fn a_side_effect_killed_mid_call_is_settled_by_its_check(lang: Lang) {
    let bed = Bed::new(lang).await;
    let killed = bed
        .run_killed_in("send_receipt", |bed| bed.receipts().len() == 1)
        .await;
    let session = session_id(&killed);
    bed.resume(&session).await;
    let events = bed.events(&session).await;
    assert_each_effect_once(&bed, &events);
    assert_eq!(
        started(&events, "crm__send_receipt").len(),
        1,
        "not sent again"
    );
    let checked = of_kind(&events, "ToolChecked");
    assert_eq!(checked.len(), 1, "{lang:?}: {checked:?}");
    assert_eq!(checked[0]["answer"], "Applied", "{checked:?}");
    let finished = of_kind(&events, "ToolFinished");
    let settled = finished.last().unwrap();
    assert_eq!(settled["settled_by_check"], true, "{settled}");
    // The check's result is the call's, and the model is told where it
    // came from.
    let outcome = settled["outcome"]["Ok"].as_str().unwrap();
    let answered = outcome.strip_prefix(replay::prompt::SETTLED_BY_CHECK_PREFIX);
    let result: Value = serde_json::from_str(answered.unwrap_or(outcome)).unwrap();
    assert_eq!(result["sent"], bed.receipts()[0]["message_id"], "{result}");
    let last = String::from_utf8(bed.model.bodies().last().unwrap().clone()).unwrap();
    assert!(
        last.contains(replay::prompt::SETTLED_BY_CHECK_PREFIX),
        "{last}"
    );
}

/// Killed once the call to send_receipt is durably started but before the
/// function ran: receipt_sent finds no email, so the call runs again with
/// its key. One email.
async fn a_side_effect_killed_before_it_ran_runs_again_once(lang: Lang) {
    let bed = Bed::new(lang).await;
    let out = bed
        .mneme(&bed.run_args())
        .env("MNEME_CRASH_AT", "tool_started_durable:3")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    assert!(bed.receipts().is_empty(), "not sent before the kill");
    let session = session_id(&out);
    bed.resume(&session).await;
    let events = bed.events(&session).await;
    assert_each_effect_once(&bed, &events);
    let checked = of_kind(&events, "ToolChecked");
    assert_eq!(checked.len(), 1, "{lang:?}: {checked:?}");
    assert_eq!(checked[0]["answer"], "NotApplied", "{checked:?}");
    assert_eq!(started(&events, "crm__send_receipt").len(), 2, "attempt 2");
}

/// SIGKILL while save_note (idempotent, keyed) is running, its note
/// written: the resume runs it again with the same key, which writes the
/// same entry. One note, and nothing checked.
async fn an_idempotent_write_killed_mid_call_runs_again_once(lang: Lang) {
    let bed = Bed::new(lang).await;
    let killed = bed
        .run_killed_in("save_note", |bed| bed.notes().len() == 1)
        .await;
    let session = session_id(&killed);
    bed.resume(&session).await;
    let events = bed.events(&session).await;
    assert_each_effect_once(&bed, &events);
    assert_eq!(started(&events, "crm__save_note").len(), 2, "run again");
    assert!(of_kind(&events, "ToolChecked").is_empty());
}

#[tokio::test]
async fn python_tools_run_with_the_effects_their_agent_file_declares() {
    runs_with_its_declared_effects(Lang::Python).await;
}

#[tokio::test]
async fn a_python_side_effect_killed_mid_call_is_settled_by_its_check() {
    a_side_effect_killed_mid_call_is_settled_by_its_check(Lang::Python).await;
}

#[tokio::test]
async fn a_python_side_effect_killed_before_it_ran_runs_again_once() {
    a_side_effect_killed_before_it_ran_runs_again_once(Lang::Python).await;
}

#[tokio::test]
async fn an_idempotent_python_write_killed_mid_call_runs_again_once() {
    an_idempotent_write_killed_mid_call_runs_again_once(Lang::Python).await;
}

#[tokio::test]
async fn typescript_tools_run_with_the_effects_their_agent_file_declares() {
    runs_with_its_declared_effects(Lang::TypeScript).await;
}

#[tokio::test]
async fn a_typescript_side_effect_killed_mid_call_is_settled_by_its_check() {
    a_side_effect_killed_mid_call_is_settled_by_its_check(Lang::TypeScript).await;
}

#[tokio::test]
async fn a_typescript_side_effect_killed_before_it_ran_runs_again_once() {
    a_side_effect_killed_before_it_ran_runs_again_once(Lang::TypeScript).await;
}

#[tokio::test]
async fn an_idempotent_typescript_write_killed_mid_call_runs_again_once() {
    an_idempotent_write_killed_mid_call_runs_again_once(Lang::TypeScript).await;
}
