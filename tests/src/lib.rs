//! Support for the end-to-end tests: an OpenAI-compatible model server on
//! loopback, agent files, and a driver for the real `mneme` binary.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Output;
use std::sync::{Arc, Mutex};
use tokio::process::Command;
use tokio::sync::oneshot;

pub mod bench;
pub mod browser;
pub mod daemon;
pub mod hostile;
pub mod mcp;
pub mod powercut;
pub mod scenario;

pub use runtime::sink::{Sink, SinkStats};

/// One scripted reply of the model server.
#[derive(Clone, Debug)]
pub struct MockReply {
    /// Assistant text.
    pub content: Option<String>,
    /// Tool calls: (tool name, arguments).
    pub calls: Vec<(String, Value)>,
}

impl MockReply {
    /// A reply that calls tools.
    pub fn calls(calls: &[(&str, Value)]) -> MockReply {
        MockReply {
            content: None,
            calls: calls
                .iter()
                .map(|(n, a)| (n.to_string(), a.clone()))
                .collect(),
        }
    }

    /// A final answer.
    pub fn answer(text: &str) -> MockReply {
        MockReply {
            content: Some(text.into()),
            calls: vec![],
        }
    }
}

/// How the model server misbehaves.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Fault {
    /// Behaves.
    #[default]
    None,
    /// Answers HTTP 500 to the first `n` requests.
    Fail500(u32),
    /// Answers 200 with a body that is not JSON, always.
    Garbage,
    /// Gives every tool call of a reply the same id, as some servers do.
    RepeatCallIds,
    /// Answers HTTP 503 the first time it sees each request body, so every
    /// request needs one retry (the same on every run, crashed or not).
    FailFirstTry,
}

#[derive(Default)]
struct ModelInner {
    replies: Vec<MockReply>,
    bodies: Vec<Vec<u8>>,
    fault: Fault,
    failed: u32,
}

/// An OpenAI-compatible chat-completions server on loopback. It picks its
/// reply by the number of assistant messages in the request, so a resumed
/// session gets the same reply the crashed one would have; it records every
/// request body; it reports as cached the longest common prefix (in 4-byte
/// "tokens") with the last [`CACHE_WINDOW`] requests, like a server's prefix cache.
pub struct MockModel {
    addr: std::net::SocketAddr,
    inner: Arc<Mutex<ModelInner>>,
    _stop: oneshot::Sender<()>,
}

impl MockModel {
    /// Starts a server with these replies.
    pub async fn start(replies: Vec<MockReply>, fault: Fault) -> MockModel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let inner = Arc::new(Mutex::new(ModelInner {
            replies,
            fault,
            ..Default::default()
        }));
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .with_state(inner.clone());
        let stop = serve_until_dropped(listener, app);
        MockModel {
            addr,
            inner,
            _stop: stop,
        }
    }

    /// Base URL for an agent file.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body received, in order, without the session-specific
    /// `prompt_cache_key`, so runs of different sessions compare byte for byte.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        self.raw_bodies()
            .iter()
            .map(|b| without_cache_key(b))
            .collect()
    }

    /// Every request body received, in order, exactly as sent.
    pub fn raw_bodies(&self) -> Vec<Vec<u8>> {
        self.inner.lock().unwrap().bodies.clone()
    }
}

/// Serves `app` on `listener` in the background until the returned sender
/// is dropped.
pub fn serve_until_dropped(listener: tokio::net::TcpListener, app: Router) -> oneshot::Sender<()> {
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    stop
}

/// How many recent requests the simulated prefix cache remembers.
pub const CACHE_WINDOW: usize = 8;

/// `body` without its `"prompt_cache_key":"<session id>"` member.
pub fn without_cache_key(body: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let marker = ",\"prompt_cache_key\":\"";
    match text.find(marker) {
        Some(at) => {
            let end = text[at + marker.len()..]
                .find('"')
                .map_or(text.len(), |e| at + marker.len() + e + 1);
            format!("{}{}", &text[..at], &text[end..]).into_bytes()
        }
        None => body.to_vec(),
    }
}

/// How many leading bytes `a` and `b` share (compared 64 at a time, then
/// byte by byte: requests run to hundreds of KiB).
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let chunks = a.chunks(64).zip(b.chunks(64));
    let same: usize = chunks
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x.len())
        .sum();
    same + a[same..]
        .iter()
        .zip(&b[same..])
        .take_while(|(x, y)| x == y)
        .count()
}

/// What the scripted model reads of a request: the model, and each
/// message's role (the rest is skipped, not built into a tree).
#[derive(serde::Deserialize)]
struct Request {
    #[serde(default)]
    model: Value,
    #[serde(default)]
    messages: Vec<Message>,
}

#[derive(serde::Deserialize)]
struct Message {
    #[serde(default)]
    role: String,
}

async fn complete(
    State(inner): State<Arc<Mutex<ModelInner>>>,
    body: axum::body::Bytes,
) -> Response {
    let mut inner = inner.lock().unwrap();
    let first_try = !inner.bodies.iter().any(|b| b[..] == body[..]);
    let cached = inner
        .bodies
        .iter()
        .rev()
        .take(CACHE_WINDOW)
        .map(|b| common_prefix(b, &body))
        .max()
        .unwrap_or(0)
        / 4;
    inner.bodies.push(body.to_vec());
    match inner.fault {
        Fault::Fail500(n) if inner.failed < n => {
            inner.failed += 1;
            return (StatusCode::INTERNAL_SERVER_ERROR, "overloaded").into_response();
        }
        Fault::Garbage => return (StatusCode::OK, "<html>this is not json").into_response(),
        Fault::FailFirstTry if first_try => {
            return (StatusCode::SERVICE_UNAVAILABLE, "warming up").into_response()
        }
        _ => {}
    }
    if String::from_utf8_lossy(&body).contains("[mneme:compact]") {
        let lines = String::from_utf8_lossy(&body).matches("\\n").count() + 1;
        let content = format!("SUMMARY of {lines} lines");
        return axum::Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": body.len() / 4, "completion_tokens": 5}})).into_response();
    }
    let request: Request = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad json: {e}")).into_response(),
    };
    let turn = request
        .messages
        .iter()
        .filter(|m| m.role == "assistant")
        .count();
    let Some(reply) = inner.replies.get(turn).cloned() else {
        return (
            StatusCode::BAD_REQUEST,
            format!("no scripted reply #{turn}"),
        )
            .into_response();
    };
    let tool_calls: Vec<Value> = reply
        .calls
        .iter()
        .enumerate()
        .map(|(k, (name, args))| {
            let id = match inner.fault {
                Fault::RepeatCallIds => format!("call_{turn}"),
                _ => format!("call_{turn}_{k}"),
            };
            json!({"id": id, "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": reply.content});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    let prompt_tokens = body.len() / 4;
    axum::Json(json!({
        "id": format!("chatcmpl-{turn}"), "object": "chat.completion", "model": request.model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": if reply.calls.is_empty() { "stop" } else { "tool_calls" }}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    }))
    .into_response()
}

/// Path of the `mneme` binary: `MNEME_BIN`, else next to the test executable
/// (cargo builds it for the runtime package's own CLI tests).
pub fn mneme_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("MNEME_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("mneme");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --bin mneme` (cargo test --workspace builds it)",
        bin.display()
    );
    bin
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
    let out = world.run(&["log", "--json", session]).await;
    assert!(out.status.success(), "log failed: {}", stderr(&out));
    (stdout(&out).lines())
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

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn common_prefix_counts_the_bytes_two_requests_share() {
        let a: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8).collect();
        for at in [0, 1, 63, 64, 65, 128, 299] {
            let mut b = a.clone();
            b[at] ^= 1;
            assert_eq!(common_prefix(&a, &b), at, "differing at {at}");
        }
        for len in [0, 1, 64, 100, 300] {
            assert_eq!(common_prefix(&a, &a[..len]), len, "a prefix of {len}");
            assert_eq!(common_prefix(&a[..len], &a), len, "a prefix of {len}");
        }
    }
}
