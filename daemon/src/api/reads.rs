//! What a session holds, read: its chain checked, the dry run, its next
//! request's bytes, its blobs, a comparison with another session; and
//! the web view's sign-in codes.

use super::*;

/// Checks the session's hash chain, and that every event decodes.
#[utoipa::path(get, path = "/sessions/{id}/verify", params(SessionPath),
    responses((status = 200, description = "The result (a broken chain is `ok: false`, not an error)", body = Verified)))]
pub(super) async fn verify(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
) -> Result<Json<Verified>, ApiError> {
    daemon.service.ensure_exists(id).await?;
    Ok(Json(
        store::verified(daemon.service.log().as_ref(), id).await,
    ))
}

/// Dry run: the rebuilt next request and the resume plan.
#[utoipa::path(get, path = "/sessions/{id}/replay", params(SessionPath),
    responses((status = 200, description = "The plan", body = ReplayView)))]
pub(super) async fn replay_view(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
) -> Result<Json<ReplayView>, ApiError> {
    Ok(Json(daemon.service.replay_view(id).await?))
}

/// The session's prefix-cache misses, each with its cause: the recorded
/// event that changed the request, or eviction by the server.
#[utoipa::path(get, path = "/sessions/{id}/cache", params(SessionPath),
    responses((status = 200, description = "The misses", body = CacheReport)))]
pub(super) async fn cache_report(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
) -> Result<Json<CacheReport>, ApiError> {
    Ok(Json(daemon.service.cache_report(id).await?))
}

/// Binary content a tool returned by reference (an MCP server's image,
/// say), by the SHA-256 its event records.
#[utoipa::path(get, path = "/sessions/{id}/blobs/{digest}", params(BlobPath),
    responses((status = 200, description = "The blob's bytes", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 404, description = "No such session or blob", body = wire::ApiError)))]
pub(super) async fn blob(
    State(daemon): State<Shared>,
    Path((id, digest)): Path<(Uuid, String)>,
) -> Result<Response, ApiError> {
    let bytes = daemon.service.blob(id, &digest).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// Two sessions of the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // read by axum as `Path<(Uuid, Uuid)>`
struct PairPath {
    /// The first session.
    id: Uuid,
    /// The session to compare it with (its fork, say).
    other: Uuid,
}

/// The two sessions compared: how many events of history they hold alike,
/// then each side's events from where it parts, answer, tool calls, tokens
/// and cost (what `mneme diff` prints).
#[utoipa::path(get, path = "/sessions/{id}/diff/{other}", params(PairPath),
    responses((status = 200, description = "The comparison", body = SessionDiff)))]
pub(super) async fn diff(
    State(daemon): State<Shared>,
    Path((id, other)): Path<(Uuid, Uuid)>,
) -> Result<Json<SessionDiff>, ApiError> {
    Ok(Json(
        runtime::store::diff_sessions(&**daemon.service.log(), id, other).await?,
    ))
}

/// A one-time code that signs a browser in to the web view as `name`
/// (`mneme ui` asks for it): valid once, for two minutes. Only a holder of
/// a token may ask (a signed-in browser may not); a tenant's token signs
/// the browser in for that tenant, seeing its sessions only.
#[utoipa::path(post, path = "/ui/codes", request_body = wire::UiCodeRequest,
    responses(
        (status = 201, description = "The code, as a sign-in link", body = wire::UiCode),
        (status = 403, description = "Asked by a signed-in browser", body = wire::ApiError)))]
pub(super) async fn ui_code(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<wire::UiCodeRequest>,
) -> Result<(StatusCode, Json<wire::UiCode>), ApiError> {
    let name = body.name.trim();
    let fits = |c: char| c.is_alphanumeric() || " .-_@".contains(c);
    if name.is_empty() || name.chars().count() > ui::MAX_NAME_CHARS || !name.chars().all(fits) {
        return Err(bad_request(format!(
            "name {name:?}: 1 to {} letters, digits, spaces or .-_@",
            ui::MAX_NAME_CHARS
        )));
    }
    // A tenant's sign-in sees that tenant's sessions only.
    let code = daemon.sign_ins.issue(name, caller.tenant()).map_err(|e| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("random source: {e}"),
        )
    })?;
    Ok((
        StatusCode::CREATED,
        Json(wire::UiCode {
            login: format!("/ui/login?code={code}"),
            expires_in_secs: ui::CODE_VALID.as_secs(),
        }),
    ))
}

/// The exact bytes of the session's next model request.
#[utoipa::path(get, path = "/sessions/{id}/request", params(SessionPath),
    responses((status = 200, description = "The request body, as it would be sent", body = Object)))]
pub(super) async fn next_request(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
) -> Result<Response, ApiError> {
    let body = daemon.service.next_request(id).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
