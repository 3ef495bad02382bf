//! A misbehaving OpenAI-compatible model server on loopback, and ways to
//! measure what `mneme` costs while it faces one: the model side is
//! untrusted input, and these tests feed it the bad thing.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::io::Read;
use std::process::Output;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// What the server answers one request with.
pub enum Answer {
    /// 200 with this chat completion.
    Json(Value),
    /// This status and text body.
    Status(u16, String),
    /// 200 with this many bytes of body, streamed (not JSON).
    Bytes(u64),
    /// 200 with a body that never ends.
    Endless,
    /// 200, then a body that never comes.
    Stall,
    /// 200 as server-sent events: each of `events` as a `data:` line, then
    /// `data: [DONE]`; after the first event, waits for `gate` (if any) to
    /// be opened; with `then_stall`, never ends after the first event.
    Stream {
        /// The events' JSON texts.
        events: Vec<String>,
        /// Opened by the test when the rest may follow.
        gate: Option<Arc<tokio::sync::Notify>>,
        /// Stop after the first event and never end.
        then_stall: bool,
    },
    /// 200 as server-sent events written exactly as given, each piece
    /// apart (`event:` lines and all, no `[DONE]`: the Responses API's
    /// streams end with their terminal event).
    Sse(Vec<String>),
}

/// Chunks of a streamed chat completion saying `text` in `pieces`, then
/// finishing with `finish_reason` and usage.
pub fn streamed_text(pieces: &[&str], finish_reason: &str) -> Vec<String> {
    let mut events: Vec<String> = pieces
        .iter()
        .map(|p| {
            json!({"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": null}]})
                .to_string()
        })
        .collect();
    events.push(
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]}).to_string(),
    );
    events.push(
        json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).to_string(),
    );
    events
}

type Handler = dyn Fn(usize, &Value, &HeaderMap) -> Answer + Send + Sync;

struct Inner {
    handler: Box<Handler>,
    /// What `GET /props` answers (llama.cpp's server's properties), if anything.
    props: Option<Value>,
    requests: Mutex<Vec<Value>>,
    bodies: Mutex<Vec<Vec<u8>>>,
}

/// The server (chat completions at `/v1/chat/completions`, Anthropic's
/// Messages API at `/v1/messages`, OpenAI's Responses API at
/// `/v1/responses`): each request gets what the handler answers for
/// (request number from 0, the request body as JSON, its headers).
pub struct HostileModel {
    addr: std::net::SocketAddr,
    inner: Arc<Inner>,
    _stop: oneshot::Sender<()>,
}

impl HostileModel {
    /// Starts the server.
    pub async fn start(
        handler: impl Fn(usize, &Value, &HeaderMap) -> Answer + Send + Sync + 'static,
    ) -> HostileModel {
        HostileModel::start_with_props(None, handler).await
    }

    /// Starts the server, answering `GET /props` (beside `/v1`) with
    /// `props` as llama.cpp's server does, if given (else 404).
    pub async fn start_with_props(
        props: Option<Value>,
        handler: impl Fn(usize, &Value, &HeaderMap) -> Answer + Send + Sync + 'static,
    ) -> HostileModel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let inner = Arc::new(Inner {
            handler: Box::new(handler),
            props,
            requests: Mutex::default(),
            bodies: Mutex::default(),
        });
        let app = Router::new()
            .route("/props", get(props_of))
            .route("/v1/chat/completions", post(complete))
            .route("/v1/messages", post(complete))
            .route("/v1/responses", post(complete))
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(inner.clone());
        let stop = crate::serve_until_dropped(listener, app);
        HostileModel {
            addr,
            inner,
            _stop: stop,
        }
    }

    /// Base URL for an agent file.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body received, as JSON, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// Every request body received, in order, exactly as sent.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        self.inner.bodies.lock().unwrap().clone()
    }
}

async fn props_of(State(inner): State<Arc<Inner>>) -> Response {
    match &inner.props {
        Some(props) => axum::Json(props.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn complete(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: String) -> Response {
    let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let n = {
        let mut requests = inner.requests.lock().unwrap();
        requests.push(request.clone());
        inner.bodies.lock().unwrap().push(body.into_bytes());
        requests.len() - 1
    };
    match (inner.handler)(n, &request, &headers) {
        Answer::Json(value) => axum::Json(value).into_response(),
        Answer::Status(status, text) => {
            (StatusCode::from_u16(status).unwrap(), text).into_response()
        }
        Answer::Bytes(total) => {
            let chunk = bytes::Bytes::from(vec![b'a'; 1 << 16]);
            let chunks = total.div_ceil(1 << 16);
            let stream = futures_util::stream::iter(
                (0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
            );
            Body::from_stream(stream).into_response()
        }
        Answer::Endless => {
            let chunk = bytes::Bytes::from(vec![b'a'; 1 << 16]);
            let stream =
                futures_util::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
            Body::from_stream(stream).into_response()
        }
        Answer::Stall => {
            let stream = futures_util::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
            Body::from_stream(stream).into_response()
        }
        Answer::Sse(pieces) => {
            let stream = futures_util::stream::iter(pieces).then(|piece| async move {
                // Apart, as a real server sends them.
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                Ok::<_, std::io::Error>(bytes::Bytes::from(piece))
            });
            (
                [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                Body::from_stream(stream),
            )
                .into_response()
        }
        Answer::Stream {
            events,
            gate,
            then_stall,
        } => {
            let lines: Vec<String> = events
                .into_iter()
                .map(|e| format!("data: {e}\n\n"))
                .chain(std::iter::once("data: [DONE]\n\n".to_string()))
                .collect();
            let stream = futures_util::stream::unfold(
                (lines.into_iter(), 0usize, gate, then_stall),
                |(mut lines, sent, gate, stall)| async move {
                    if sent == 1 {
                        if stall {
                            std::future::pending::<()>().await;
                        }
                        if let Some(gate) = &gate {
                            gate.notified().await;
                        }
                    }
                    // Time, not a barrier: the pieces of a stream arrive
                    // apart, as a real server sends them.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    let line = lines.next()?;
                    let chunk = Ok::<_, std::io::Error>(bytes::Bytes::from(line));
                    Some((chunk, (lines, sent + 1, gate, stall)))
                },
            );
            (
                [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                Body::from_stream(stream),
            )
                .into_response()
        }
    }
}

/// A chat completion with `content` and `calls` (id, tool name, arguments).
pub fn completion(content: Option<&str>, calls: &[(&str, &str, Value)]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| {
            json!({"id": id, "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": content});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    json!({"choices": [{"index": 0, "message": message,
            "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}],
           "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
}

/// A chat completion with one call (id `c1`) of `tool` whose arguments are
/// `arguments` exactly as written (padded, repeated keys, not JSON).
pub fn raw_call(tool: &str, arguments: &str) -> Answer {
    Answer::Json(json!({"choices": [{"index": 0,
        "message": {"role": "assistant", "content": "",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": tool, "arguments": arguments}}]},
        "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 30}}))
}

/// A chat completion with `n` calls of `tool` (no arguments), with ids
/// `<prefix>0`, `<prefix>1`, …
pub fn calls_of(tool: &str, n: usize, prefix: &str) -> Value {
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let calls: Vec<(&str, &str, Value)> = ids
        .iter()
        .map(|id| (id.as_str(), tool, json!({})))
        .collect();
    completion(None, &calls)
}

/// Runs `command` to its end and returns its output and its peak resident
/// memory in bytes: the high-water mark of its own memory (`VmHWM`, read
/// while it runs). Not `wait4`'s count: Linux charges a spawned child,
/// at its exec, with the resident memory of the process that spawned it
/// (the test's, which other tests of its binary may have grown by
/// hundreds of MiB at that moment); only a child too short-lived to be
/// read is measured that way.
// The child is reaped by wait4, which std's Child does not know of.
#[allow(clippy::zombie_processes)]
pub fn run_measured(mut command: std::process::Command) -> (Output, u64) {
    use std::process::Stdio;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let pid = child.id() as i32;
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes).unwrap();
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watched = running.clone();
    let watcher = std::thread::spawn(move || {
        let mut peak = 0;
        while watched.load(std::sync::atomic::Ordering::Acquire) {
            peak = peak.max(high_water(pid as u32).unwrap_or(0));
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        peak
    });
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with valid pointers.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4 failed");
    running.store(false, std::sync::atomic::Ordering::Release);
    let peak = match watcher.join().unwrap() {
        0 => usage.ru_maxrss as u64 * 1024,
        peak => peak,
    };
    let output = Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (output, peak)
}

/// `VmHWM` of process `pid` in bytes, while it has memory of its own.
fn high_water(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    Some(
        kib.trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()?
            * 1024,
    )
}

/// Peak resident memory of a running process, in bytes (`VmHWM`).
pub fn peak_rss(pid: u32) -> u64 {
    high_water(pid).expect("VmHWM in /proc/PID/status")
}

/// The memory bound the issue sets for every probe.
pub const RSS_BOUND: u64 = 256 << 20;
