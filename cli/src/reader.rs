//! Reads beside a running command. sled admits one process per data
//! directory, so while a `mneme run` (or `resume`, `approve`, …) holds it,
//! that process answers reads of its sessions from other terminals
//! (`sessions`, `log`, `verify`, `replay` and `replay --cache`, `diff`,
//! `blob`): over loopback,
//! with a token of its own, at the daemon API's paths and in its types, so
//! the other process reads through [`crate::remote::Remote`] and prints what
//! it would print holding the log itself. Nothing is written through it.

use crate::sessions::Sessions;
use anyhow::{Context, Result};
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use std::sync::Arc;
use uuid::Uuid;

/// The note a holder leaves in the data directory: where it answers reads.
pub const READER_FILE: &str = "mneme.reader";
/// The file holding the reader's token, beside the note.
const TOKEN_FILE: &str = "mneme.reader.token";

/// Reads answered for as long as the value lives; dropping it removes the
/// note (a killed process leaves it, and the next holder replaces it).
pub struct Reader {
    dir: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

struct Shared {
    sessions: Arc<dyn Sessions>,
    expected: daemon::token::Expected,
}

impl Reader {
    /// Answers reads of `sessions` on a loopback port, and leaves a note
    /// in `data_dir` naming it, the token's file and `holder` (what this
    /// process is: `mneme run, pid 4242`).
    pub async fn start(
        sessions: Arc<dyn Sessions>,
        data_dir: &std::path::Path,
        holder: &str,
    ) -> Result<Reader> {
        let token = random_token()?;
        let token_file = data_dir.join(TOKEN_FILE);
        write_whole(&token_file, token.as_bytes())?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let note = serde_json::json!({
            "addr": listener.local_addr()?.to_string(),
            "pid": std::process::id(),
            "holder": holder,
            "token_file": token_file,
        });
        let shared = Arc::new(Shared {
            sessions,
            expected: daemon::token::Expected::new(&token),
        });
        let app = Router::new()
            .route("/sessions", get(list))
            .route("/sessions/{id}/events", get(events))
            .route("/sessions/{id}/verify", get(verify))
            .route("/sessions/{id}/replay", get(replay))
            .route("/sessions/{id}/cache", get(cache_report))
            .route("/sessions/{id}/request", get(request))
            .route("/sessions/{id}/blobs/{digest}", get(blob))
            .route("/sessions/{id}/diff/{other}", get(diff))
            .route("/spend", get(spend))
            .route("/tenants", get(tenants))
            .layer(axum::middleware::from_fn_with_state(shared.clone(), admit))
            .with_state(shared);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let stopped = async {
                let _ = stopped.await;
            };
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .await;
        });
        write_whole(&data_dir.join(READER_FILE), note.to_string().as_bytes())?;
        Ok(Reader {
            dir: data_dir.to_path_buf(),
            stop: Some(stop),
        })
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.dir.join(READER_FILE));
        let _ = std::fs::remove_file(self.dir.join(TOKEN_FILE));
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// 32 random bytes, hex.
fn random_token() -> Result<String> {
    use std::io::Read;
    let mut random = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
    Ok(hex::encode(random))
}

/// Writes `bytes` to `path` readable by this user only, whole: aside, then
/// renamed, so a reader never sees half of it.
fn write_whole(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let aside = path.with_extension(format!("{}", std::process::id()));
    let context = || format!("writing {}", path.display());
    let _ = std::fs::remove_file(&aside);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&aside)
        .with_context(context)?;
    file.write_all(bytes).with_context(context)?;
    std::fs::rename(&aside, path).with_context(context)
}

/// Admits requests that carry the token.
async fn admit(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match given.is_some_and(|given| shared.expected.admits(given)) {
        true => next.run(request).await,
        false => failed(StatusCode::UNAUTHORIZED, "missing or wrong bearer token"),
    }
}

fn failed(status: StatusCode, error: &str) -> Response {
    let body = runtime::api::ApiError {
        error: error.to_string(),
    };
    (status, Json(body)).into_response()
}

/// A read's answer: its JSON, or its error as the daemon gives one.
fn answer<T: serde::Serialize>(result: Result<T>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(e) => {
            let missing = e.chain().any(|cause| {
                matches!(
                    cause.downcast_ref::<runtime::RuntimeError>(),
                    Some(runtime::RuntimeError::NoSuchSession(_))
                )
            });
            let status = match missing {
                true => StatusCode::NOT_FOUND,
                false => StatusCode::INTERNAL_SERVER_ERROR,
            };
            failed(status, &format!("{e:#}"))
        }
    }
}

/// Bytes as they are, or the error.
fn bytes(result: Result<Vec<u8>>) -> Response {
    match result {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => answer::<()>(Err(e)),
    }
}

async fn list(State(shared): State<Arc<Shared>>) -> Response {
    answer(shared.sessions.list().await)
}

async fn events(State(shared): State<Arc<Shared>>, Path(id): Path<Uuid>) -> Response {
    answer(shared.sessions.events(id).await)
}

async fn verify(State(shared): State<Arc<Shared>>, Path(id): Path<Uuid>) -> Response {
    answer(shared.sessions.verify(id).await)
}

async fn replay(State(shared): State<Arc<Shared>>, Path(id): Path<Uuid>) -> Response {
    answer(shared.sessions.replay(id).await)
}

async fn cache_report(State(shared): State<Arc<Shared>>, Path(id): Path<Uuid>) -> Response {
    answer(shared.sessions.cache_report(id).await)
}

async fn request(State(shared): State<Arc<Shared>>, Path(id): Path<Uuid>) -> Response {
    bytes(shared.sessions.next_request(id).await)
}

async fn blob(
    State(shared): State<Arc<Shared>>,
    Path((id, digest)): Path<(Uuid, String)>,
) -> Response {
    bytes(shared.sessions.blob(id, &digest).await)
}

async fn diff(
    State(shared): State<Arc<Shared>>,
    Path((id, other)): Path<(Uuid, Uuid)>,
) -> Response {
    answer(shared.sessions.diff(id, other).await)
}

async fn spend(
    State(shared): State<Arc<Shared>>,
    axum::extract::Query(query): axum::extract::Query<runtime::api::SpendQuery>,
) -> Response {
    answer(shared.sessions.spend(query).await)
}

async fn tenants(State(shared): State<Arc<Shared>>) -> Response {
    answer(shared.sessions.tenants().await)
}
