//! The model server and side-effect sink mneme's demo and tests run
//! against, on loopback: an OpenAI-compatible server with scripted replies
//! ([`MockModel`]), and a sink that applies each idempotency key's effect
//! once ([`Sink`]). Real HTTP, no mocks inside mneme.
//!
//! Architecture invariant: nothing here is part of the runtime; only the
//! binary's demo and the tests depend on it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

mod sink;

pub use sink::{Hold, PathStats, Sink, SinkStats};

/// One scripted reply of the model server.
#[derive(Clone, Debug)]
pub struct MockReply {
    /// Assistant text.
    pub content: Option<String>,
    /// Tool calls: (tool name, arguments).
    pub calls: Vec<(String, Value)>,
    /// Reasoning returned beside the text (`reasoning_content`), if any.
    pub reasoning: Option<String>,
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
            reasoning: None,
        }
    }

    /// A final answer.
    pub fn answer(text: &str) -> MockReply {
        MockReply {
            content: Some(text.into()),
            calls: vec![],
            reasoning: None,
        }
    }

    /// The same reply, with `reasoning` returned beside it, as llama.cpp,
    /// vLLM and DeepSeek return `reasoning_content`.
    pub fn reasoning(self, reasoning: &str) -> MockReply {
        MockReply {
            reasoning: Some(reasoning.into()),
            ..self
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
    if let Some(reasoning) = &reply.reasoning {
        message["reasoning_content"] = json!(reasoning);
    }
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
