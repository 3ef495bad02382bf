//! Support for the end-to-end tests: an OpenAI-compatible model server on
//! loopback, agent files, and a driver for the real `mneme` binary.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Output;
use tokio::process::Command;
use tokio::sync::oneshot;

pub mod bench;
pub mod browser;
pub mod daemon;
mod eventually;
pub mod floor;
pub mod hostile;
pub mod mcp;
pub mod powercut;
pub mod responses_api;
pub mod scenario;
pub mod schedules;
pub mod slow;
mod testbed;

pub use eventually::{eventually, eventually_blocking, Check};
pub use testbed::{Testbed, TestbedBuilder};
pub use testkit::{
    serve_until_dropped, without_cache_key, Fault, Hold, MockModel, MockReply, Sink, SinkStats,
    CACHE_WINDOW,
};

/// The `mneme` binary cargo built for the test crate in which
/// [`binary!`] stands; `MNEME_BIN` names another.
#[doc(hidden)]
pub static REGISTERED_BIN: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Names the `mneme` binary the tests of this crate drive, before they
/// run: every file of `cli/tests/` begins with
/// `mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));`, so the tests run the
/// binary cargo built with them, never one left from an earlier build.
///
/// (It registers the path from the program's `.init_array`, the way a
/// constructor runs on Linux, since a test harness has no `main` of ours.)
#[macro_export]
macro_rules! binary {
    ($path:expr) => {
        #[used]
        #[link_section = ".init_array"]
        static __MNEME_E2E_BINARY: extern "C" fn() = {
            extern "C" fn register() {
                let _ = $crate::REGISTERED_BIN.set($path);
            }
            register
        };
    };
}

/// Path of the `mneme` binary: `MNEME_BIN`, else the one the test crate
/// named with [`binary!`]; panics saying so when neither is given.
pub fn mneme_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("MNEME_BIN") {
        return PathBuf::from(bin);
    }
    let bin = REGISTERED_BIN.get().unwrap_or_else(|| {
        panic!(
            "no mneme binary: an end-to-end test lives in cli/tests/ and begins with \
             `mneme_e2e::binary!(env!(\"CARGO_BIN_EXE_mneme\"));` (or set MNEME_BIN)"
        )
    });
    PathBuf::from(bin)
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `tests/fixtures/`: the frozen and captured inputs of the tests.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A data directory, an agent file and the `mneme` commands to use them.
pub struct World {
    /// Holds every file of the test.
    pub dir: tempfile::TempDir,
    /// The PostgreSQL store its commands use, if not the data directory.
    pub store: Option<String>,
    /// Lease time to live of its commands on PostgreSQL.
    pub lease_ttl_ms: u64,
}

/// Lease time to live of commands on PostgreSQL in tests: a SIGKILLed
/// command's lease lapses quickly, as the operator-like driver waits.
pub const TEST_LEASE_TTL_MS: u64 = 400;

impl World {
    /// A new empty world on a sled data directory.
    pub fn new() -> World {
        World {
            dir: tempfile::tempdir().unwrap(),
            store: None,
            lease_ttl_ms: TEST_LEASE_TTL_MS,
        }
    }

    /// A new empty world whose log is a fresh PostgreSQL store.
    pub fn on_postgres() -> World {
        World {
            store: Some(pg_store()),
            ..World::new()
        }
    }

    /// The data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Writes `name` with `text` and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A `mneme` command on this world's data directory (or store). It
    /// snapshots every 3 events, so every test also resumes from snapshots
    /// and their tails.
    pub fn mneme(&self) -> Command {
        Command::from(self.mneme_std())
    }

    /// [`World::mneme`], as a std command (to run it measured, say).
    pub fn mneme_std(&self) -> std::process::Command {
        let mut command = std::process::Command::new(mneme_bin());
        command
            .env("MNEME_SNAPSHOT_EVERY", "3")
            .arg("--data-dir")
            .arg(self.data())
            .env_remove("MNEME_CRASH_AT")
            .env_remove("MNEME_DURABILITY");
        if let Some(store) = &self.store {
            command
                .arg("--store")
                .arg(store)
                .env("MNEME_LEASE_TTL_MS", self.lease_ttl_ms.to_string());
        }
        command
    }

    /// Runs `mneme ARGS` with the crash point `crash_at` armed.
    pub async fn run_crashing(&self, args: &[&str], crash_at: &str) -> Output {
        self.mneme()
            .args(args)
            .env("MNEME_CRASH_AT", crash_at)
            .output()
            .await
            .unwrap()
    }

    /// Starts `mneme ARGS` (output piped) and waits, up to 30 s, until the
    /// sink applied the effect of the call it holds (`applied`, from
    /// `Sink::hold`): the process is then inside that call.
    pub async fn spawn_until_applied(
        &self,
        args: &[&str],
        applied: oneshot::Receiver<()>,
    ) -> tokio::process::Child {
        let child = self
            .mneme()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(30), applied)
            .await
            .expect("the held call was never applied")
            .unwrap();
        child
    }

    /// Runs `mneme ARGS` and returns its output.
    pub async fn run(&self, args: &[&str]) -> Output {
        self.mneme().args(args).output().await.unwrap()
    }

    /// Runs one turn of `agent` per message: the first starts a session
    /// (`mneme run --agent`), each next one goes on in it (`--session`);
    /// panics naming the turn that fails. The session and each turn's
    /// output.
    pub async fn run_turns(
        &self,
        agent: &std::path::Path,
        messages: impl IntoIterator<Item = String>,
    ) -> (String, Vec<Output>) {
        let mut session: Option<String> = None;
        let mut outputs = Vec::new();
        for (turn, message) in messages.into_iter().enumerate() {
            let out = match &session {
                None => {
                    let agent = agent.to_str().unwrap();
                    self.run(&["run", "--agent", agent, &message]).await
                }
                Some(id) => self.run(&["run", "--session", id, &message]).await,
            };
            assert!(out.status.success(), "turn {turn}: {}", stderr(&out));
            session.get_or_insert_with(|| session_id(&out));
            outputs.push(out);
        }
        (session.expect("at least one message"), outputs)
    }
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

/// An agent file on the model server `model_url` with `tools` (TOML tables).
pub fn agent_toml(model_url: &str, tools: &[String]) -> String {
    let mut text = format!(
        "name = \"test-agent\"\nsystem = \"You are a test agent.\"\n[model]\nprovider = \"openai\"\nbase_url = \"{model_url}\"\nmodel = \"test-model\"\ntimeout_secs = 10\n"
    );
    for tool in tools {
        text.push_str("[[tools]]\n");
        text.push_str(tool);
    }
    text
}

/// A read-only command tool `lookup` that answers `{"name":"Ada"}`.
pub fn lookup_tool() -> String {
    command_tool(
        "lookup",
        &["sh", "-c", "cat >/dev/null; echo '{\"name\":\"Ada\"}'"],
        "read_only",
        10,
    )
}

/// The billing agent's tools: `charge` and `email` side effects on `sink`
/// (which honour idempotency keys), and `lookup`.
pub fn billing_tools(sink: &Sink) -> [String; 3] {
    [
        http_tool("charge", &sink.url("charge"), "side_effect"),
        lookup_tool(),
        http_tool("email", &sink.url("email"), "side_effect"),
    ]
}

/// What the model says to the billing agent: charge and look up, then
/// email, then "Charged and emailed.".
pub fn billing_replies() -> Vec<MockReply> {
    vec![
        MockReply::calls(&[
            ("charge", serde_json::json!({"n": 1})),
            ("lookup", serde_json::json!({"n": 2})),
        ]),
        MockReply::calls(&[("email", serde_json::json!({"n": 3}))]),
        MockReply::answer("Charged and emailed."),
    ]
}

/// A TOML tool table for an HTTP tool.
pub fn http_tool(name: &str, url: &str, effect: &str) -> String {
    format!("name = \"{name}\"\ndescription = \"{name}\"\nkind = \"http\"\nurl = \"{url}\"\neffect = \"{effect}\"\nparameters = {{ type = \"object\", properties = {{ n = {{ type = \"integer\" }} }} }}\n")
}

/// A TOML tool table for `refund`, a side-effecting HTTP tool on `sink`
/// whose calls wait for a person's approval.
pub fn refund_needing_approval(sink: &Sink) -> String {
    format!(
        "{}requires_approval = true\n",
        http_tool("refund", &sink.url("refund"), "side_effect")
    )
}

/// A TOML tool table for a command tool.
pub fn command_tool(name: &str, command: &[&str], effect: &str, timeout_secs: u64) -> String {
    let words: Vec<String> = command.iter().map(|w| format!("{w:?}")).collect();
    format!("name = \"{name}\"\ndescription = \"{name}\"\nkind = \"command\"\ncommand = [{}]\neffect = \"{effect}\"\ntimeout_secs = {timeout_secs}\n", words.join(", "))
}

/// The session id `mneme run` printed on stderr, if it got that far.
pub fn named_session(output: &Output) -> Option<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .map(|id| id.trim().to_string())
}

/// The session id `mneme run` printed on stderr; panics without one.
pub fn session_id(output: &Output) -> String {
    named_session(output).unwrap_or_else(|| panic!("no session id in stderr: {}", stderr(output)))
}

/// Text of stdout.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// Text of stderr.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

/// Runs `command` to its end; its stdout, once it exited 0 (else panics
/// with its stderr).
pub fn stdout_of_success(command: &mut std::process::Command) -> String {
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    stdout(&output)
}

/// The final request body of a session as `mneme replay --raw` rebuilds it,
/// without its session-specific `prompt_cache_key`.
pub async fn rebuilt_request(world: &World, session: &str) -> Vec<u8> {
    let out = world.run(&["replay", "--raw", session]).await;
    assert!(out.status.success(), "replay failed: {}", stderr(&out));
    without_cache_key(&out.stdout)
}

/// The kinds of a session's events, from `mneme log --json`.
pub async fn event_kinds(world: &World, session: &str) -> Vec<String> {
    let events = logged_events(world, session).await;
    events.into_iter().map(|(_, kind, _)| kind).collect()
}

/// Each event `mneme log --json` shows of `session`: its seq, its kind and
/// its fields.
pub async fn logged_events(world: &World, session: &str) -> Vec<(u64, String, Value)> {
    log_lines(&world.run(&["log", "--json", session]).await)
}

/// Each event of the output of a `mneme log --json` that succeeded: its
/// seq, its kind and its fields.
pub fn log_lines(out: &Output) -> Vec<(u64, String, Value)> {
    assert!(out.status.success(), "log failed: {}", stderr(out));
    (stdout(out).lines())
        .map(|l| {
            let record: Value = serde_json::from_str(l).unwrap();
            let kind = record["kind"].as_str().unwrap().to_string();
            let event = record["event"][&kind].clone();
            (record["seq"].as_u64().unwrap(), kind, event)
        })
        .collect()
}

/// A fresh, empty store on the test PostgreSQL server (`MNEME_TEST_PG`,
/// which `scripts/with-postgres.sh` starts and sets): its own schema.
pub fn pg_store() -> String {
    let server = std::env::var("MNEME_TEST_PG").expect(
        "MNEME_TEST_PG is not set: run the tests as `scripts/with-postgres.sh cargo test --workspace`",
    );
    format!(
        "{server}?schema=e2e_{}_{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    )
}

/// Asserts that every session charged and emailed exactly once on `sink`:
/// each path's effects equal `sessions`, and each side-effecting call had
/// one idempotency key that every retry reused.
pub fn assert_billed_once(sink: &Sink, sessions: usize) {
    let stats = sink.stats();
    for path in ["charge", "email"] {
        assert_eq!(
            stats.path(path).effects,
            sessions as u64,
            "{path}: {:?}",
            stats.paths
        );
    }
    assert_eq!(
        stats.hits_by_key.len(),
        2 * sessions,
        "one key per side-effecting call, every retry reused it"
    );
}

/// Waits (up to `timeout`) until `sink` applied at least `n` effects on
/// `path`.
pub async fn effects_reach(sink: &Sink, path: &str, n: u64, timeout: std::time::Duration) {
    let what = format!("{n} effects on {path}");
    eventually(what, timeout, || async {
        let stats = sink.stats();
        if stats.path(path).effects >= n {
            Ok(())
        } else {
            Err(format!("{:?}", stats.paths))
        }
    })
    .await
}

/// xorshift64*: small, fast, and reproducible from its seed (the random
/// instants of the soak and power-cut tests).
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The number in variable `name`, if set; a test knob.
pub fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// Runs the future `test` makes to its end on a runtime of two workers,
/// driven from a thread with a 64 MiB stack (a panic in it is the
/// caller's). The fault scenarios' futures, polled unoptimised, overflowed
/// a test thread's 2 MiB once in a while: which path a random run takes
/// decides how deep they go.
pub fn on_a_deep_stack<F: std::future::Future<Output = ()>>(
    test: impl FnOnce() -> F + Send + 'static,
) {
    const STACK_BYTES: usize = 64 << 20;
    let driven = std::thread::Builder::new()
        .stack_size(STACK_BYTES)
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_stack_size(STACK_BYTES)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(Box::pin(test()));
        })
        .unwrap();
    if let Err(panic) = driven.join() {
        std::panic::resume_unwind(panic);
    }
}
