//! A model server that takes its time: an OpenAI-compatible
//! chat-completions server on loopback answering every request "Done."
//! after a fixed delay, counting the requests it holds at once. For the
//! fair-share tests and benchmark, where turns must last long enough to
//! queue.

use axum::extract::State;
use axum::routing::post;
use axum::Router;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The server; stops when dropped.
pub struct SlowModel {
    addr: std::net::SocketAddr,
    counts: Arc<Counts>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Default)]
struct Counts {
    delay_ms: AtomicUsize,
    held: AtomicUsize,
    most_held: AtomicUsize,
    answered: AtomicUsize,
}

impl SlowModel {
    /// Starts a server answering each request after `delay`.
    pub async fn start(delay: Duration) -> SlowModel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(Counts::default());
        counts
            .delay_ms
            .store(delay.as_millis() as usize, Ordering::SeqCst);
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .with_state(counts.clone());
        let stop = crate::serve_until_dropped(listener, app);
        SlowModel {
            addr,
            counts,
            _stop: stop,
        }
    }

    /// Base URL for an agent file.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Requests answered so far.
    pub fn answered(&self) -> usize {
        self.counts.answered.load(Ordering::SeqCst)
    }

    /// The most requests it held at once.
    pub fn most_held(&self) -> usize {
        self.counts.most_held.load(Ordering::SeqCst)
    }
}

async fn complete(
    State(counts): State<Arc<Counts>>,
    body: axum::body::Bytes,
) -> axum::Json<serde_json::Value> {
    let held = counts.held.fetch_add(1, Ordering::SeqCst) + 1;
    counts.most_held.fetch_max(held, Ordering::SeqCst);
    let delay = counts.delay_ms.load(Ordering::SeqCst) as u64;
    tokio::time::sleep(Duration::from_millis(delay)).await;
    counts.held.fetch_sub(1, Ordering::SeqCst);
    counts.answered.fetch_add(1, Ordering::SeqCst);
    let prompt_tokens = body.len() / 4;
    axum::Json(json!({
        "id": "slow", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2, "total_tokens": prompt_tokens + 2},
    }))
}
