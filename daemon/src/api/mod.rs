//! The daemon's HTTP API (JSON; see `/openapi.json`). Each handler is
//! annotated with its route, parameters and responses (`#[utoipa::path]`),
//! and the router is built from those annotations (`routes!`), so the
//! document served at `/openapi.json` and the routes served are one list.

use super::tenancy::Caller;
use super::ui::{self, SignedIn};
use super::Daemon;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use eventlog::LogError;
use replay::AgentSpec;
use runtime::api::{
    self as wire, Approve, CacheReport, Cancel, Cancelled, Created, Decided, Erase, Erased,
    EventRecord, EventsQuery, Fork, Forked, Health, Index, ListQuery, MessageAccepted,
    PauseRequested, PostMessage, ReplayView, Resolve, Resume, Resuming, SessionDiff, SessionStatus,
    SessionSummary, SessionView, TurnOutcome, Verified,
};
use runtime::control::{edited_arguments, resolution};
use runtime::control::{Decision, TurnStart, TurnTask};
use runtime::store;
use runtime::RuntimeError;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

mod deltas;
mod reads;
mod schedules;
mod stream;
mod tenants;
mod wake;

type Shared = Arc<Daemon>;

/// An error as the API reports it: a status and a message naming what.
pub(crate) struct ApiError(pub(crate) StatusCode, pub(crate) String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(wire::ApiError { error: self.1 })).into_response()
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> ApiError {
        let status = match &e {
            RuntimeError::NoSuchSession(_)
            | RuntimeError::NoSuchBlob { .. }
            | RuntimeError::NoSuchSchedule(_)
            | RuntimeError::NoSuchTenant(_) => StatusCode::NOT_FOUND,
            RuntimeError::Tenant(_) => StatusCode::CONFLICT,
            RuntimeError::Forbidden(_) => StatusCode::FORBIDDEN,
            RuntimeError::InvalidRequest { .. }
            | RuntimeError::Erased { .. }
            | RuntimeError::Log(
                LogError::Conflict { .. } | LogError::LeaseHeld { .. } | LogError::Fenced { .. },
            ) => StatusCode::CONFLICT,
            RuntimeError::Spec { .. }
            | RuntimeError::NotStarted { .. }
            | RuntimeError::Schedule(_) => StatusCode::BAD_REQUEST,
            RuntimeError::Model(_) => StatusCode::BAD_GATEWAY,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

impl From<LogError> for ApiError {
    fn from(e: LogError) -> ApiError {
        RuntimeError::from(e).into()
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// The routes that need no token.
fn open_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(index))
        .routes(routes!(health))
}

/// The routes behind the bearer-token check. Every route is added here (or
/// in [`open_routes`]) with `routes!`, from its handler's annotation: a
/// route added any other way would be served undocumented, which
/// `openapi::tests` refuses.
fn guarded_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(metrics))
        .routes(routes!(openapi))
        .routes(routes!(list_sessions, create_session))
        .routes(routes!(get_session, erase_session))
        .routes(routes!(post_message))
        .routes(routes!(resume))
        .routes(routes!(pause))
        .routes(routes!(cancel))
        .routes(routes!(fork))
        .routes(routes!(rerun))
        .routes(routes!(resolve))
        .routes(routes!(approve))
        .routes(routes!(stream::events))
        .routes(routes!(deltas::deltas))
        .routes(routes!(reads::verify))
        .routes(routes!(reads::replay_view))
        .routes(routes!(reads::cache_report))
        .routes(routes!(reads::next_request))
        .routes(routes!(reads::blob))
        .routes(routes!(reads::diff))
        .routes(routes!(reads::ui_code))
        .routes(routes!(wake::wake))
        .routes(routes!(schedules::list, schedules::create))
        .routes(routes!(schedules::remove))
        .routes(routes!(tenants::list_tenants, tenants::create_tenant))
        .routes(routes!(tenants::set_tenant, tenants::erase_tenant))
        .routes(routes!(
            tenants::issue_tenant_token,
            tenants::revoke_tenant_tokens
        ))
        .routes(routes!(tenants::spend))
}

/// The operations of every route, as [`router`] serves them, undressed:
/// `openapi::document` adds what the whole API shares.
pub(crate) fn operations() -> utoipa::openapi::OpenApi {
    open_routes().merge(guarded_routes()).into_openapi()
}

/// The routes, with the bearer-token check (or a signed-in browser's
/// cookie) on all but `/health`, every error answered as JSON; and the web
/// view's pages (`/ui/`, not part of the API).
pub(crate) fn router(daemon: Shared, stopped: CancellationToken) -> Router {
    let (guarded, _) = guarded_routes().split_for_parts();
    let guarded = guarded
        // Inside the token's check: a tenant reaches its own sessions only.
        .layer(axum::middleware::from_fn_with_state(
            daemon.clone(),
            super::tenancy::scope,
        ))
        .layer(axum::middleware::from_fn_with_state(
            daemon.clone(),
            require_token,
        ))
        .layer(axum::middleware::map_response(no_store));
    let (open, _) = open_routes().split_for_parts();
    let limit = daemon.config.max_body_bytes;
    let sign_ins = daemon.sign_ins.clone();
    open.merge(guarded)
        .with_state(AppState { daemon, stopped })
        .merge(ui::routes(sign_ins))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(limit, errors_as_json))
}

/// What a session holds is kept by no cache, the browser's included.
async fn no_store(mut response: Response) -> Response {
    let never = header::HeaderValue::from_static("no-store");
    response.headers_mut().insert(header::CACHE_CONTROL, never);
    response
}

/// The most of a non-JSON error's text kept as its reason.
const ERROR_TEXT_BYTES: usize = 4096;

/// Answers every error as `{"error": REASON}`. The handlers' own errors are
/// JSON already (or, for the web view's pages, HTML); axum's rejections (a body too large, a wrong content type,
/// bad JSON, a bad path or query) are text, which becomes the reason, and
/// those without any (no such route, a wrong method) name what was asked.
async fn errors_as_json(State(limit): State<usize>, request: Request, next: Next) -> Response {
    let asked = format!("{} {}", request.method(), request.uri().path());
    let response = next.run(request).await;
    let status = response.status();
    let is_own = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| {
            [&b"application/json"[..], b"text/html"]
                .iter()
                .any(|own| t.as_bytes().starts_with(own))
        });
    if is_own || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, ERROR_TEXT_BYTES)
        .await
        .map(|text| String::from_utf8_lossy(&text).trim().to_string())
        .unwrap_or_default();
    let reason = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            format!(
                "request body larger than the daemon's limit of {limit} bytes (--max-body-bytes)"
            )
        }
        _ if text.is_empty() => format!(
            "{asked}: {}",
            status.canonical_reason().unwrap_or("error").to_lowercase()
        ),
        _ => text,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    let body = serde_json::to_string(&wire::ApiError { error: reason }).expect("serializes");
    Response::from_parts(parts, body.into())
}

/// A session named in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // read by axum as `Path<Uuid>`; here for the document
struct SessionPath {
    /// The session's id.
    id: Uuid,
}

/// A blob of a session named in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // read by axum as `Path<(Uuid, String)>`
struct BlobPath {
    /// The session's id.
    id: Uuid,
    /// The blob's SHA-256 (hex), as its event records it.
    digest: String,
}

/// A call of a session named in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // read by axum as `Path<(Uuid, String)>`
struct CallPath {
    /// The session's id.
    id: Uuid,
    /// The call's id (from the model's reply; percent-encoded).
    call: String,
}

#[derive(Clone)]
struct AppState {
    daemon: Shared,
    stopped: CancellationToken,
}

impl axum::extract::FromRef<AppState> for Shared {
    fn from_ref(state: &AppState) -> Shared {
        state.daemon.clone()
    }
}

/// Admits a request that carries the operator's bearer token or a
/// tenant's, or a web view sign-in (its cookie and key; it then acts as its
/// signed-in name, and may only look and decide, from the view itself);
/// and says who it acts for ([`Caller`]).
async fn require_token(State(daemon): State<Shared>, mut request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    if given
        .as_deref()
        .is_some_and(|given| daemon.bearer.admits(given))
    {
        request.extensions_mut().insert(Caller::Operator);
        return next.run(request).await;
    }
    let bearer = given.as_deref().and_then(|given| {
        let (scheme, token) = given.trim_start().split_once([' ', '\t'])?;
        let token = super::token::trimmed(token);
        // Only what could be a token is looked up.
        let plausible = scheme.eq_ignore_ascii_case("bearer")
            && (super::token::MIN_BYTES..=MAX_TOKEN_BYTES).contains(&token.len());
        plausible.then_some(token)
    });
    if let Some(token) = bearer {
        if let Some(tenant) = daemon.tenant_of_token(token).await {
            request
                .extensions_mut()
                .insert(Caller::Tenant(Box::new(tenant)));
            return next.run(request).await;
        }
    }
    let refused = || {
        ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token (Authorization: Bearer <token>), and no web view sign-in (run `mneme ui`)".into(),
        )
        .into_response()
    };
    let Some(signed_in) = daemon.sign_ins.who(request.headers()) else {
        return refused();
    };
    if let Some(why) = ui::cross_site_refusal(request.method(), request.headers()) {
        return ApiError(StatusCode::FORBIDDEN, why).into_response();
    }
    if !ui::view_may(request.method(), request.uri().path()) {
        let asked = format!("{} {}", request.method(), request.uri().path());
        return ApiError(
            StatusCode::FORBIDDEN,
            format!("{asked}: a web view sign-in may look and decide, not start sessions or send messages (they run tools): use the token"),
        )
        .into_response();
    }
    let caller = match &signed_in.1 {
        None => Caller::Operator,
        // A sign-in of a tenant erased since opens nothing.
        Some(name) => match daemon.live_tenant(name).await {
            Some(tenant) => Caller::Tenant(Box::new(tenant)),
            None => return refused(),
        },
    };
    request.extensions_mut().insert(caller);
    request.extensions_mut().insert(signed_in);
    next.run(request).await
}

/// The longest token looked up among tenants' (a tenant's is 68 bytes):
/// longer is nobody's.
const MAX_TOKEN_BYTES: usize = 256;

/// Who a request acts as: a signed-in browser's name, else the `by` it
/// gives.
fn who(signed_in: &Option<Extension<SignedIn>>, by: &str) -> String {
    signed_in
        .as_ref()
        .map_or_else(|| by.to_string(), |Extension(s)| s.0.clone())
}

/// Where things are: the OpenAPI document, the web view, liveness. No
/// token needed.
#[utoipa::path(get, path = "/", security(()),
    responses((status = 200, description = "Where to go from here", body = Index)))]
async fn index() -> Json<Index> {
    Json(Index {
        service: format!("mneme {}", env!("CARGO_PKG_VERSION")),
        openapi: "/openapi.json".into(),
        web_view: "/ui/ (sign a browser in with `mneme ui`)".into(),
        health: "/health".into(),
    })
}

/// Liveness; no token needed.
#[utoipa::path(get, path = "/health", security(()),
    responses((status = 200, description = "The daemon answers", body = Health)))]
async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Prometheus metrics: sessions by status, events appended, flushes,
/// latencies.
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain")))]
async fn metrics(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let service = daemon.service_for(&caller);
    let mut spend = service.spend(&wire::SpendQuery::default()).await?;
    // Every tenant the caller reaches has its line, at 0 before it spends.
    let registry = service.tenants().registry().await?;
    for tenant in registry.tenants.values().filter(|t| t.erased.is_none()) {
        let listed = spend
            .rows
            .iter()
            .any(|r| r.tenant.as_ref() == Some(&tenant.name));
        if caller.reaches(Some(&tenant.name)) && !listed {
            spend.rows.push(wire::SpendRow {
                tenant: Some(tenant.name.clone()),
                agent: None,
                day: None,
                session: None,
                model_calls: 0,
                prompt_tokens: 0,
                completion_tokens: 0,
                cached_tokens: 0,
                cost: 0.0,
            });
        }
    }
    let text = match &caller {
        Caller::Operator => {
            let (running, queued) = daemon.fair.counts();
            daemon
                .metrics
                .render(&daemon.statuses.counts(), running, queued)
        }
        // A tenant's: its own sessions by status, nothing of the daemon's.
        Caller::Tenant(_) => {
            let mut counts = std::collections::HashMap::new();
            for row in service.rows().await? {
                if caller.reaches(row.tenant.as_deref()) {
                    *counts.entry(row.status.to_string()).or_insert(0) += 1;
                }
            }
            super::metrics::render_sessions(&counts)
        }
    };
    let text = text + &super::metrics::render_spend(&spend);
    Ok(([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], text).into_response())
}

/// This document: the API's contract, generated from the daemon's code.
#[utoipa::path(get, path = "/openapi.json",
    responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
async fn openapi() -> Json<Value> {
    Json(super::openapi::document_json().clone())
}

/// The sessions, with their status and usage.
#[utoipa::path(get, path = "/sessions", params(ListQuery),
    responses((status = 200, description = "Every session that passes the filter", body = Vec<SessionSummary>)))]
async fn list_sessions(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<SessionSummary>>, ApiError> {
    let mut rows = daemon.service.rows().await?;
    rows.retain(|row| {
        caller.reaches(row.tenant.as_deref())
            && q.status.is_none_or(|s| row.status == s)
            && q.agent.as_deref().is_none_or(|a| row.agent == a)
            && q.tenant
                .as_deref()
                .is_none_or(|t| row.tenant.as_deref() == Some(t))
    });
    Ok(Json(rows))
}

/// A new session: `{"agent": "NAME"}` (a file in the agents directory),
/// `{"spec": {...}}`, or an agent file as the TOML body.
#[utoipa::path(post, path = "/sessions",
    request_body(description = "The agent: by name, as a spec, or as an agent file (TOML)",
        content((wire::CreateSession = "application/json"), (String = "application/toml"))),
    responses((status = 201, description = "Created", body = Created)))]
async fn create_session(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: String,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    let toml_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("toml"));
    let (spec, first_message) = if toml_body {
        refuse_own_spec(&caller)?;
        let spec = toml::from_str::<AgentSpec>(&body)
            .map_err(|e| bad_request(format!("agent spec (TOML): {e}")))?;
        (spec, None)
    } else {
        spec_from_json(&daemon, &caller, &body)?
    };
    let service = daemon.service_for(&caller);
    let session = match first_message {
        Some(text) => service.start(spec, text).await?,
        None => service.create(spec).await?,
    };
    daemon.statuses.saw(session.id(), session.state());
    Ok((
        StatusCode::CREATED,
        Json(Created {
            session: session.id(),
        }),
    ))
}

/// What `POST /sessions` takes, for a request that gave none of it.
const CREATE_TAKES: &str = "POST /sessions takes {\"agent\": \"NAME\"} (NAME.toml in the daemon's --agents directory), {\"spec\": {...}} (an agent spec as JSON), or an agent file as the body with Content-Type: application/toml; \"first_message\": \"...\" adds the first user message, whose turn POST /sessions/{id}/resume runs";

/// 403 for a tenant giving a spec of its own: its tools could run any
/// command, read any file and name any variable of the daemon's user, which
/// would reach every other tenant.
pub(super) fn refuse_own_spec(caller: &Caller) -> Result<(), ApiError> {
    match caller.tenant() {
        None => Ok(()),
        Some(tenant) => Err(ApiError(
            StatusCode::FORBIDDEN,
            format!("tenant {tenant}: a tenant's token runs its own agents only ({{\"agent\": \"NAME\"}}, NAME.toml in the daemon's agents directory for {tenant}), never a spec of its own: its tools would run as the daemon's user"),
        )),
    }
}

/// The spec and first message of a JSON request to create a session.
fn spec_from_json(
    daemon: &Daemon,
    caller: &Caller,
    body: &str,
) -> Result<(AgentSpec, Option<String>), ApiError> {
    if body.trim().is_empty() {
        return Err(bad_request(format!("no request body: {CREATE_TAKES}")));
    }
    let create: wire::CreateSession = serde_json::from_str(body)
        .map_err(|e| bad_request(format!("request body: {e}. {CREATE_TAKES}")))?;
    let spec = match (create.agent, create.spec) {
        (Some(name), None) => agent_named(daemon, caller, &name),
        (None, Some(spec)) => refuse_own_spec(caller).map(|()| spec),
        _ => Err(bad_request(format!(
            "give exactly one of \"agent\" (a name) or \"spec\" (an agent spec): {CREATE_TAKES}"
        ))),
    }?;
    Ok((spec, create.first_message))
}

/// The agent file `NAME.toml` of the daemon's agents directory: for a
/// tenant, of its own directory in it (`DIR/TENANT/NAME.toml`).
fn agent_named(daemon: &Daemon, caller: &Caller, name: &str) -> Result<AgentSpec, ApiError> {
    let Some(dir) = &daemon.config.agents_dir else {
        return Err(bad_request(
            "this daemon has no agents directory (--agents DIR)",
        ));
    };
    // A tenant's name is a word of letters, digits, '-' and '_'.
    let dir = match caller.tenant() {
        Some(tenant) => dir.join(tenant),
        None => dir.clone(),
    };
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(bad_request(format!(
            "agent name {name:?}: letters, digits, '-' and '_' only"
        )));
    }
    let path = dir.join(format!("{name}.toml"));
    let Some(tenant) = caller.tenant() else {
        return Ok(runtime::load_agent_file(&path)?);
    };
    // A tenant is told nothing of the daemon's files.
    if name.is_empty() || !path.is_file() {
        return Err(bad_request(format!(
            "tenant {tenant} has no agent {name:?} (its agent files are NAME.toml in the daemon's agents directory, under {tenant}/, put there by the operator)"
        )));
    }
    runtime::load_agent_file(&path).map_err(|e| {
        runtime::warn_line!("mneme serve: tenant {tenant}'s agent {name}: {e}");
        bad_request(format!(
            "tenant {tenant}'s agent {name:?} does not load (the daemon's log says why)"
        ))
    })
}

/// A session's status, usage, answer, calls in doubt, and `running_on`:
/// the owner of its live lease (the daemon running a turn of it), or null.
#[utoipa::path(get, path = "/sessions/{id}", params(SessionPath),
    responses((status = 200, description = "The session", body = SessionView)))]
async fn get_session(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(daemon.service.session_view(id).await?))
}

/// Turns of one session asked for (running or waiting to) past which a
/// resume or a decision's continuation is refused: each waiting one runs
/// all the session's pending work, so more add nothing but memory.
const MAX_TURNS_ASKED: usize = 4;

/// 429 when [`MAX_TURNS_ASKED`] turns of `id` are asked for already (for
/// requests that do not wait: one that waits holds its connection, which
/// the connection cap bounds).
fn refuse_when_turns_wait(daemon: &Daemon, id: Uuid) -> Result<(), ApiError> {
    let asked = daemon.scheduler.turns_of(id);
    if asked >= MAX_TURNS_ASKED {
        return Err(ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "session {id} has {asked} turns running or waiting to run, each of which \
                 runs all its pending work; ask again once one has ended"
            ),
        ));
    }
    Ok(())
}

/// A web view sign-in may not send messages (they run tools): nor may it
/// start a turn no step of which was recorded (a fork at a user message, a
/// session created with its first message), which is one by another name.
/// (Behind a turn that runs here already, a resume only waits its turn.)
async fn refuse_a_turn_nobody_started(daemon: &Daemon, id: Uuid) -> Result<(), ApiError> {
    if daemon.scheduler.turns_of(id) > 0 {
        return Ok(());
    }
    let summary = daemon.service.current_summary(id).await?;
    if summary.status == "running" && !summary.turn_driven {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!("session {id}: no step of its turn was recorded, so resuming it starts a model turn (it runs tools), which a web view sign-in may not: use the token"),
        ));
    }
    Ok(())
}

fn refuse_when_stopping(daemon: &Daemon) -> Result<(), ApiError> {
    if daemon.is_shutting_down() {
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the daemon is shutting down".into(),
        ));
    }
    Ok(())
}

/// 503 while the daemon shuts down, or when one more turn could take it
/// past its open-file limit ([`Daemon::admit_turn`], saying how near);
/// else the turn's place in the budget, to hold until its task is spawned.
fn admit_turn(daemon: &Daemon) -> Result<crate::Admitted<'_>, ApiError> {
    refuse_when_stopping(daemon)?;
    daemon
        .admit_turn()
        .map_err(|reason| ApiError(StatusCode::SERVICE_UNAVAILABLE, reason))
}

/// Records the message (durable before this returns) and runs the turn in
/// the background; with `"wait": true`, answers when the turn ends. 409
/// while another daemon sharing the store runs the session (the error
/// names it). While a turn of the session runs here, the message is
/// recorded at once and the agent's `mid_turn_messages` decides: `queue`
/// (its own turn follows), `interrupt` (the running turn takes it at its
/// next step) or `reject` (409, recorded). Otherwise a turn near the
/// daemon's open-file limit is refused (503), recording nothing.
#[utoipa::path(post, path = "/sessions/{id}/messages", params(SessionPath), request_body = PostMessage,
    responses(
        (status = 202, description = "Recorded; the turn runs", body = MessageAccepted),
        (status = 200, description = "With `wait`: the turn ended", body = TurnOutcome),
        (status = 409, description = "Another daemon runs the session, or a turn runs and the agent rejects messages mid-turn (the message is recorded)", body = wire::ApiError),
        (status = 429, description = "A turn runs and `max_waiting_messages` messages wait already (not recorded)", body = wire::ApiError),
        (status = 503, description = "The daemon is shutting down, or near its open-file limit (not recorded)", body = wire::ApiError)))]
async fn post_message(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
    Json(body): Json<PostMessage>,
) -> Result<Response, ApiError> {
    refuse_when_stopping(&daemon)?;
    daemon.service.ensure_exists(id).await?; // 404 before spawning
    let text = match daemon.scheduler.inboxes.post(id, body.text) {
        Ok(answer) => return mid_turn(&daemon, id, body.wait, answer).await,
        Err(text) => text, // no turn of it runs here
    };
    daemon.refuse_when_queue_full(id).await?; // 429, nothing recorded
    let admitted = admit_turn(&daemon)?;
    let (recorded, seq) = tokio::sync::oneshot::channel();
    let message = TurnStart::Message {
        text,
        refresh_tools: body.refresh_tools.then(|| "api".to_string()),
        recorded: Some(recorded),
    };
    let turn = daemon.control().post_message(id, message);
    drop(admitted); // its task counts now
    let Ok(seq) = seq.await else {
        // Not recorded: the turn's end says why.
        return Err(match turn.await {
            Err(e) => e.into(),
            Ok(_) => ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the turn ended before recording the message".into(),
            ),
        });
    };
    let accepted = MessageAccepted {
        session: id,
        seq,
        mid_turn: None,
    };
    answer_turn(accepted, body.wait, turn).await
}

/// A message the running turn of `id` recorded (or refused): a rejected
/// one is a 409; a queued or interrupting one is answered like any other,
/// its turn being the one that follows the running turn (which takes an
/// interrupting message itself: the next turn then has nothing to do).
async fn mid_turn(
    daemon: &Shared,
    id: Uuid,
    wait: bool,
    answer: runtime::control::Answer,
) -> Result<Response, ApiError> {
    let accepted = answer
        .await
        .map_err(|_| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the turn ended before recording the message".into(),
            )
        })?
        .map_err(|refused| {
            let status = match refused {
                runtime::control::Refused::Invalid(_) => StatusCode::BAD_REQUEST,
                runtime::control::Refused::Full(_) => StatusCode::TOO_MANY_REQUESTS,
            };
            ApiError(status, format!("session {id}: {refused}"))
        })?;
    if accepted.policy == replay::spec::MidTurn::Reject {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "session {id} is running a turn, and its agent rejects messages mid-turn \
                 (mid_turn_messages = \"reject\"): the message is recorded at seq {} and \
                 not delivered; send it again once the turn has ended",
                accepted.seq
            ),
        ));
    }
    let accepted = MessageAccepted {
        session: id,
        seq: accepted.seq,
        mid_turn: Some(accepted.policy.name().into()),
    };
    if !wait {
        // The running turn, once answered, starts the message's own turn.
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    }
    // A turn behind the running one: it delivers the message, or finds it
    // delivered and answered already.
    let turn = daemon.run_turn(id, TurnStart::Deliver);
    answer_turn(accepted, wait, turn).await
}

/// 202 with `accepted`, or, with `wait`, the turn's outcome once it ends.
async fn answer_turn(
    accepted: MessageAccepted,
    wait: bool,
    turn: TurnTask,
) -> Result<Response, ApiError> {
    if !wait {
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    }
    let end = turn.await?;
    Ok(Json(store::turn_end(accepted.session, &end)).into_response())
}

/// Continues pending work; `extend` starts a spent budget of the turn
/// again (recorded).
#[utoipa::path(post, path = "/sessions/{id}/resume", params(SessionPath),
    request_body(content = Option<Resume>, description = "Optional"),
    responses(
        (status = 202, description = "The turn runs", body = Resuming),
        (status = 200, description = "With `wait`: the turn ended", body = TurnOutcome),
        (status = 409, description = "Another daemon runs the session", body = wire::ApiError),
        (status = 429, description = "Without `wait`: turns of the session are asked for already (a few)", body = wire::ApiError),
        (status = 503, description = "The daemon is shutting down, or near its open-file limit", body = wire::ApiError)))]
async fn resume(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
    signed_in: Option<Extension<SignedIn>>,
    body: Option<Json<Resume>>,
) -> Result<Response, ApiError> {
    let admitted = admit_turn(&daemon)?;
    daemon.service.ensure_exists(id).await?; // 404 before spawning
    daemon.service.refuse_if_erased(id).await?; // 409
    daemon.refuse_when_queue_full(id).await?; // 429
    if signed_in.is_some() {
        refuse_a_turn_nobody_started(&daemon, id).await?; // 403
    }
    let body = body.map(|Json(b)| b).unwrap_or_default();
    if !body.wait {
        refuse_when_turns_wait(&daemon, id)?;
    }
    let turn = daemon
        .control()
        .resume(id, &who(&signed_in, "api"), body.extend);
    drop(admitted); // its task counts now
    if !body.wait {
        let resuming = Resuming {
            session: id,
            resuming: true,
        };
        return Ok((StatusCode::ACCEPTED, Json(resuming)).into_response());
    }
    let end = turn.await?;
    Ok(Json(store::turn_end(id, &end)).into_response())
}

/// Pauses the session at its next step, wherever it runs (on another
/// daemon sharing the store: within a second; the answer names it in
/// `running_on`).
#[utoipa::path(post, path = "/sessions/{id}/pause", params(SessionPath),
    responses(
        (status = 200, description = "The pause is asked for", body = PauseRequested),
        (status = 409, description = "No turn of the session runs, and it does not sleep (a sleeping session is paused where it sleeps)", body = wire::ApiError)))]
async fn pause(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
) -> Result<Json<PauseRequested>, ApiError> {
    daemon.service.ensure_exists(id).await?;
    let requested = |running_on| PauseRequested {
        session: id,
        pause_requested: true,
        running_on,
    };
    if daemon.scheduler.request_pause(id) {
        return Ok(Json(requested(None)));
    }
    if let Some(owner) = daemon.ask_pause_elsewhere(id).await? {
        return Ok(Json(requested(Some(owner))));
    }
    // No turn runs anywhere: a sleeping session is paused where it sleeps.
    daemon.control().pause_sleeping(id).await?;
    Ok(Json(requested(None)))
}

/// Cancels the session: a running turn stops at its next step first; a new
/// message reopens it.
#[utoipa::path(post, path = "/sessions/{id}/cancel", params(SessionPath), request_body = Cancel,
    responses(
        (status = 200, description = "Cancelled", body = Cancelled),
        (status = 409, description = "Another daemon holds the session", body = wire::ApiError)))]
async fn cancel(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
    signed_in: Option<Extension<SignedIn>>,
    Json(body): Json<Cancel>,
) -> Result<Json<Cancelled>, ApiError> {
    let by = who(&signed_in, &body.by);
    daemon.control().cancel(id, &by).await?;
    Ok(Json(Cancelled {
        session: id,
        status: SessionStatus::Cancelled,
    }))
}

/// Erases the session's content for good (a running turn stops at its
/// next step first): records who asked and why, then destroys the
/// session's key. Its shape (events, kinds, times, tools, keys, tokens)
/// stays, and its chain still verifies. Unless `cascade` is false, every
/// session derived from it (forks, reruns, sub-agents, transitively) is
/// erased with it, each recording its own erasure; the answer lists what
/// was erased, and what still holds a copy.
#[utoipa::path(delete, path = "/sessions/{id}", params(SessionPath), request_body = Erase,
    responses(
        (status = 200, description = "Erased, with what became of the sessions derived from it", body = Erased),
        (status = 409, description = "Written without encryption, or held by another daemon", body = wire::ApiError)))]
async fn erase_session(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
    Json(body): Json<Erase>,
) -> Result<Json<Erased>, ApiError> {
    // Every copy of an erased session's state this daemon keeps goes too.
    let forget = |erased: Uuid| daemon.forget(erased);
    let control = daemon.control();
    Ok(Json(control.erase_with_derived(id, &body, &forget).await?))
}

/// Stops a running turn of session `id`, then erases it under its lease,
/// and forgets every copy of its state this daemon keeps.
pub(crate) async fn erase(
    daemon: &Shared,
    id: Uuid,
    reason: &str,
    by: &str,
) -> Result<(), ApiError> {
    let erased = daemon.control().erase(id, reason, by).await;
    daemon.forget(id);
    Ok(erased?)
}

/// A new session holding this one's first `at` events; its first event
/// names the parent and seq.
#[utoipa::path(post, path = "/sessions/{id}/fork", params(SessionPath), request_body = Fork,
    responses((status = 201, description = "The fork", body = Forked),
        (status = 409, description = "Not forked: the session was erased, a call is under way at that seq, or it has the most forks a session may have", body = wire::ApiError),
        (status = 429, description = "A sign-in made the most forks it may in a minute", body = wire::ApiError)))]
async fn fork(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<Uuid>,
    signed_in: Option<Extension<SignedIn>>,
    Json(body): Json<Fork>,
) -> Result<(StatusCode, Json<Forked>), ApiError> {
    if body.spec.is_some() {
        refuse_own_spec(&caller)?;
    }
    if signed_in.is_some() && body.spec.is_some() {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "a web view sign-in cannot fork with another spec (its tools would run): use the token"
                .into(),
        ));
    }
    if let Some(Extension(who)) = &signed_in {
        let sign_ins = &daemon.sign_ins;
        sign_ins
            .may_fork(who)
            .map_err(|why| ApiError(StatusCode::TOO_MANY_REQUESTS, why))?;
    }
    let by = who(&signed_in, "api");
    let spec = body.spec.map(|spec| (spec, by.as_str()));
    let child = daemon.control().fork(id, body.at, spec).await;
    crate::memory::release_free();
    let child = child?;
    let forked = Forked {
        session: child,
        parent: id,
        at: body.at,
    };
    Ok((StatusCode::CREATED, Json(forked)))
}

/// Re-runs this session's user messages on another spec in a new session
/// linked to it (`mneme rerun`), one turn each, until one does not end
/// answered; answers when it is done, with the two sessions compared.
/// Calls that match a recorded one are answered from the record; others
/// with side effects run only with `live_tools`.
#[utoipa::path(post, path = "/sessions/{id}/rerun", params(SessionPath), request_body = wire::Rerun,
    responses(
        (status = 200, description = "The rerun ran (`stopped` says if a turn did not end answered)", body = wire::RerunReport),
        (status = 503, description = "The daemon is shutting down, or near its open-file limit", body = wire::ApiError)))]
async fn rerun(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<Uuid>,
    Json(body): Json<wire::Rerun>,
) -> Result<Json<wire::RerunReport>, ApiError> {
    refuse_own_spec(&caller)?;
    // Held through the rerun: its turns count twice, never not at all.
    let _admitted = admit_turn(&daemon)?;
    let control = daemon.control();
    let report = control.rerun(id, body.spec, body.live_tools, &|_| {});
    Ok(Json(report.await?))
}

/// Decides on a call in doubt: exactly one of `retry`, `skip` (the
/// result), `fail` (a message); `by` names who decides. The session then
/// continues unless other calls still wait or `continue` is false.
#[utoipa::path(post, path = "/sessions/{id}/calls/{call}/resolve", params(CallPath), request_body = Resolve,
    responses(
        (status = 200, description = "Recorded, not continued; or with `wait`, the continued turn's end", body = wire::DecisionAnswer),
        (status = 202, description = "Recorded; the session continues", body = Decided),
        (status = 409, description = "The call is not in doubt, or another daemon holds the session", body = wire::ApiError),
        (status = 503, description = "The daemon is shutting down, or (with `continue`) near its open-file limit (not recorded)", body = wire::ApiError)))]
async fn resolve(
    State(daemon): State<Shared>,
    Path((id, call)): Path<(Uuid, String)>,
    signed_in: Option<Extension<SignedIn>>,
    Json(body): Json<Resolve>,
) -> Result<Response, ApiError> {
    let skip = body.skip.as_ref().map(Value::to_string);
    let resolution =
        resolution(body.retry, skip.as_deref(), body.fail.as_deref()).map_err(bad_request)?;
    let by = who(&signed_in, &body.by);
    let decision = Decision::Resolve(resolution);
    decide(
        &daemon,
        (id, &call),
        decision,
        by,
        (body.proceed, body.wait),
    )
    .await
}

/// Approves or denies a call that waits for approval; `by` names who
/// decides; `args` (with an approval) gives the arguments the tool runs
/// with instead of the model's. The session then continues unless other
/// calls still wait or `continue` is false.
#[utoipa::path(post, path = "/sessions/{id}/calls/{call}/approve", params(CallPath), request_body = Approve,
    responses(
        (status = 200, description = "Recorded, not continued; or with `wait`, the continued turn's end", body = wire::DecisionAnswer),
        (status = 202, description = "Recorded; the session continues", body = Decided),
        (status = 400, description = "The edited arguments are not JSON, or come with a denial", body = wire::ApiError),
        (status = 409, description = "The call does not wait for approval (or its approval expired; or the edited arguments exceed the session's bound), or another daemon holds the session", body = wire::ApiError),
        (status = 503, description = "The daemon is shutting down, or (with `continue`) near its open-file limit (not recorded)", body = wire::ApiError)))]
async fn approve(
    State(daemon): State<Shared>,
    Path((id, call)): Path<(Uuid, String)>,
    signed_in: Option<Extension<SignedIn>>,
    Json(body): Json<Approve>,
) -> Result<Response, ApiError> {
    if let Some(args) = &body.args {
        // Not JSON, or with a denial: refused before anything is looked
        // up. The session's own bound is checked where it is recorded.
        if !body.approved {
            return Err(bad_request(format!(
                "call {call:?}: edited arguments are for an approval, not a denial"
            )));
        }
        let most = replay::spec::MAX_RESPONSE_BYTES_LIMIT;
        edited_arguments(&call, args, most).map_err(bad_request)?;
    }
    let by = who(&signed_in, &body.by);
    let decision = Decision::Approve {
        approved: body.approved,
        args: body.args,
    };
    decide(
        &daemon,
        (id, &call),
        decision,
        by,
        (body.proceed, body.wait),
    )
    .await
}

/// Records a person's decision on call `call` of session `id` as `by`,
/// then continues the session if `next.0` asks and nothing else waits,
/// answering at once or, if `next.1` asks, when the continued turn ends.
/// One that would continue is refused near the open-file limit (503)
/// before anything is recorded.
async fn decide(
    daemon: &Shared,
    (id, call): (Uuid, &str),
    decision: Decision,
    by: String,
    (proceed, wait): (bool, bool),
) -> Result<Response, ApiError> {
    if proceed {
        daemon.refuse_when_queue_full(id).await?; // 429, nothing recorded
    }
    let admitted = match proceed {
        true => Some(admit_turn(daemon)?),
        false => refuse_when_stopping(daemon).map(|()| None)?,
    };
    let control = daemon.control();
    let can_continue = control.decide(id, call, decision, &by).await?;
    let decided = |continuing| Decided {
        session: id,
        decided: call.to_string(),
        continuing,
    };
    if !(can_continue && proceed) {
        return Ok(Json(decided(false)).into_response());
    }
    // Turns asked for already continue the session: without `wait`, one
    // more would add nothing but a task waiting (a request with `wait`
    // holds its connection, which the connection cap bounds).
    if !wait && daemon.scheduler.turns_of(id) >= MAX_TURNS_ASKED {
        return Ok((StatusCode::ACCEPTED, Json(decided(true))).into_response());
    }
    let turn = control.resume(id, &by, false);
    drop(admitted); // its task counts now
    if !wait {
        return Ok((StatusCode::ACCEPTED, Json(decided(true))).into_response());
    }
    let end = turn.await?;
    Ok(Json(store::turn_end(id, &end)).into_response())
}
