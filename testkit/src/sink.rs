//! A side-effect sink on loopback: an HTTP service that counts every request
//! (raw hits) and applies each idempotency key's effect once, answering
//! repeats with the first answer, as a payment API does. `mneme demo` and the
//! end-to-end tests use it to prove that nothing ran twice.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Counts for one path of the sink.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PathStats {
    /// Requests received, duplicates included.
    pub hits: u64,
    /// Effects applied: one per distinct idempotency key (or per request
    /// without a key).
    pub effects: u64,
}

/// Counts for the whole sink.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SinkStats {
    /// Per path.
    pub paths: BTreeMap<String, PathStats>,
    /// Requests per idempotency key.
    pub hits_by_key: BTreeMap<String, u64>,
}

impl SinkStats {
    /// Counts for `path` (zero if it was never hit).
    pub fn path(&self, path: &str) -> PathStats {
        self.paths.get(path).cloned().unwrap_or_default()
    }
}

/// A hold on the next effect of one path: the effect is applied, `applied`
/// fires, and the response waits until `release` fires or is dropped.
pub struct Hold {
    /// Fires once the effect was applied (the response is withheld).
    pub applied: oneshot::Receiver<()>,
    /// Fire or drop to let the response go.
    pub release: oneshot::Sender<()>,
}

#[derive(Default)]
struct Inner {
    stats: SinkStats,
    /// Every request's body per path, in order (JSON where it parses).
    bodies: HashMap<String, Vec<serde_json::Value>>,
    answers: HashMap<String, serde_json::Value>,
    holds: HashMap<String, (oneshot::Sender<()>, oneshot::Receiver<()>)>,
}

/// A running sink. Stops when dropped.
pub struct Sink {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    _stop: oneshot::Sender<()>,
}

impl Sink {
    /// Starts a sink on a free loopback port.
    pub async fn start() -> std::io::Result<Sink> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/stats", get(stats))
            .route("/{*path}", post(effect))
            .with_state(inner.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Sink {
            addr,
            inner,
            _stop: stop,
        })
    }

    /// The URL of `path` on this sink (`path` without a leading slash).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    /// A snapshot of the counts.
    pub fn stats(&self) -> SinkStats {
        self.inner.lock().expect("sink lock").stats.clone()
    }

    /// The body of every request `path` received, in order, duplicates
    /// included (JSON where it parses, else the text).
    pub fn bodies(&self, path: &str) -> Vec<serde_json::Value> {
        let inner = self.inner.lock().expect("sink lock");
        inner.bodies.get(path).cloned().unwrap_or_default()
    }

    /// Holds the response of the next new effect on `path`.
    pub fn hold(&self, path: &str) -> Hold {
        let (applied_tx, applied) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        self.inner
            .lock()
            .expect("sink lock")
            .holds
            .insert(path.to_string(), (applied_tx, release_rx));
        Hold { applied, release }
    }
}

async fn stats(State(inner): State<Arc<Mutex<Inner>>>) -> Json<SinkStats> {
    Json(inner.lock().expect("sink lock").stats.clone())
}

async fn effect(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Json<serde_json::Value> {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let (answer, hold) = {
        let mut inner = inner.lock().expect("sink lock");
        let inner = &mut *inner;
        let request = serde_json::from_str::<serde_json::Value>(&body)
            .unwrap_or(serde_json::Value::String(body));
        inner
            .bodies
            .entry(path.clone())
            .or_default()
            .push(request.clone());
        let counts = inner.stats.paths.entry(path.clone()).or_default();
        counts.hits += 1;
        if let Some(key) = &key {
            *inner.stats.hits_by_key.entry(key.clone()).or_default() += 1;
            if let Some(answer) = inner.answers.get(key) {
                return Json(answer.clone());
            }
        }
        counts.effects += 1;
        let answer = serde_json::json!({
            "ok": true,
            "path": path,
            "effect": counts.effects,
            "request": request,
        });
        if let Some(key) = key {
            inner.answers.insert(key, answer.clone());
        }
        (answer, inner.holds.remove(&path))
    };
    if let Some((applied, release)) = hold {
        let _ = applied.send(());
        let _ = release.await;
    }
    Json(answer)
}
