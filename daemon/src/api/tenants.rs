//! Tenants, managed with the operator's token (`mneme tenant …`), and
//! spend (`mneme spend`), which a tenant's token sees of its own only.

use super::*;
use replay::tenant::{check_name, TenantLimits};
use runtime::api::{
    CreateTenant, EraseTenant, SetTenant, SpendQuery, SpendReport, TenantErased, TenantToken,
    TenantView, TokensRevoked,
};

/// A tenant named in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // read by axum as `Path<String>`; here for the document
pub(super) struct TenantPath {
    /// The tenant's name.
    name: String,
}

/// 400 for a name that cannot be a tenant's, before anything is read.
fn checked_name(name: &str) -> Result<(), ApiError> {
    check_name(name).map_err(bad_request)
}

/// Adds a tenant and issues its first token, shown this once (kept only
/// as its SHA-256). Its sessions are its own: no other tenant's token
/// reaches them. The operator's token only.
#[utoipa::path(post, path = "/tenants", request_body = CreateTenant,
    responses(
        (status = 201, description = "Added; its token", body = TenantToken),
        (status = 400, description = "Not a tenant's name, or a cap that is not a positive number", body = wire::ApiError),
        (status = 403, description = "Asked with a tenant's token", body = wire::ApiError),
        (status = 409, description = "The name is taken (an erased tenant's too)", body = wire::ApiError)))]
pub(super) async fn create_tenant(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    signed_in: Option<Extension<SignedIn>>,
    Json(body): Json<CreateTenant>,
) -> Result<(StatusCode, Json<TenantToken>), ApiError> {
    caller.operator_only("adding a tenant")?;
    checked_name(&body.name)?;
    let limits = runtime::limits_of(&body);
    limits.validate().map_err(bad_request)?;
    let by = who(&signed_in, "api");
    let issued = daemon
        .service
        .tenants()
        .add(&body.name, limits, &by)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(TenantToken {
            tenant: issued.tenant,
            token: issued.token,
        }),
    ))
}

/// Every tenant, erased ones too: how many of its tokens work, its cap.
/// The operator's token only.
#[utoipa::path(get, path = "/tenants",
    responses(
        (status = 200, description = "The tenants, by name", body = Vec<TenantView>),
        (status = 403, description = "Asked with a tenant's token", body = wire::ApiError)))]
pub(super) async fn list_tenants(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<TenantView>>, ApiError> {
    caller.operator_only("listing tenants")?;
    let registry = daemon.service.tenants().registry().await?;
    Ok(Json(
        registry
            .tenants
            .values()
            .map(runtime::tenant_view)
            .collect(),
    ))
}

/// Sets a tenant's limits: each field given replaces its own (`null`
/// removes it). A new cap holds everywhere within a second. The
/// operator's token only.
#[utoipa::path(patch, path = "/tenants/{name}", params(TenantPath), request_body = SetTenant,
    responses(
        (status = 200, description = "The tenant as it is now", body = TenantView),
        (status = 400, description = "A cap that is not a positive number", body = wire::ApiError),
        (status = 403, description = "Asked with a tenant's token", body = wire::ApiError),
        (status = 404, description = "No such tenant", body = wire::ApiError),
        (status = 409, description = "The tenant was erased", body = wire::ApiError)))]
pub(super) async fn set_tenant(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    signed_in: Option<Extension<SignedIn>>,
    Path(name): Path<String>,
    Json(body): Json<SetTenant>,
) -> Result<Json<TenantView>, ApiError> {
    caller.operator_only("setting a tenant's limits")?;
    checked_name(&name)?;
    // What is given, checked alone first: a 400 before anything is read.
    runtime::limits_set(TenantLimits::default(), &body)
        .validate()
        .map_err(bad_request)?;
    let change = |limits| runtime::limits_set(limits, &body);
    let tenants = daemon.service.tenants();
    tenants
        .set_limits(&name, change, &who(&signed_in, "api"))
        .await?;
    let registry = tenants.registry().await?;
    let tenant = registry.tenants.get(&name).expect("set just now");
    Ok(Json(runtime::tenant_view(tenant)))
}

/// Issues another token of a tenant (its others still work), shown this
/// once. The operator's token only.
#[utoipa::path(post, path = "/tenants/{name}/tokens", params(TenantPath),
    responses(
        (status = 201, description = "The new token", body = TenantToken),
        (status = 403, description = "Asked with a tenant's token", body = wire::ApiError),
        (status = 404, description = "No such tenant", body = wire::ApiError),
        (status = 409, description = "The tenant was erased", body = wire::ApiError)))]
pub(super) async fn issue_tenant_token(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    signed_in: Option<Extension<SignedIn>>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<TenantToken>), ApiError> {
    caller.operator_only("issuing a tenant's token")?;
    checked_name(&name)?;
    let by = who(&signed_in, "api");
    let issued = daemon.service.tenants().issue_token(&name, &by).await?;
    Ok((
        StatusCode::CREATED,
        Json(TenantToken {
            tenant: issued.tenant,
            token: issued.token,
        }),
    ))
}

/// Revokes every token of a tenant, and signs out its web view sign-ins
/// on this daemon: none opens anything from then on (on every daemon
/// sharing the store within a second). Its sessions stay. The operator's
/// token only.
#[utoipa::path(delete, path = "/tenants/{name}/tokens", params(TenantPath),
    responses(
        (status = 200, description = "Revoked", body = TokensRevoked),
        (status = 403, description = "Asked with a tenant's token", body = wire::ApiError),
        (status = 404, description = "No such tenant", body = wire::ApiError),
        (status = 409, description = "The tenant was erased", body = wire::ApiError)))]
pub(super) async fn revoke_tenant_tokens(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    signed_in: Option<Extension<SignedIn>>,
    Path(name): Path<String>,
) -> Result<Json<TokensRevoked>, ApiError> {
    caller.operator_only("revoking a tenant's tokens")?;
    checked_name(&name)?;
    let by = who(&signed_in, "api");
    let revoked = daemon.service.tenants().revoke(&name, &by).await?;
    daemon.sign_ins.sign_out_tenant(&name);
    Ok(Json(TokensRevoked {
        tenant: name,
        revoked,
    }))
}

/// Erases a tenant for good: recorded in the registry (its tokens revoked,
/// its name never given again), then its key is destroyed (every session
/// of it unreadable at once, each chain still verifying), then each of its
/// sessions is erased on its own (a running turn stops first). Refused
/// when its sessions were written without encryption. The operator's
/// token only.
#[utoipa::path(delete, path = "/tenants/{name}", params(TenantPath), request_body = EraseTenant,
    responses(
        (status = 200, description = "Erased, with each of its sessions", body = TenantErased),
        (status = 403, description = "Asked with a tenant's token", body = wire::ApiError),
        (status = 404, description = "No such tenant", body = wire::ApiError),
        (status = 409, description = "Its sessions were written without encryption", body = wire::ApiError)))]
pub(super) async fn erase_tenant(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Json(body): Json<EraseTenant>,
) -> Result<Json<TenantErased>, ApiError> {
    caller.operator_only("erasing a tenant")?;
    checked_name(&name)?;
    if body.reason.trim().is_empty() {
        return Err(bad_request("reason: empty (it is recorded)"));
    }
    let forget = |id: Uuid| daemon.forget(id);
    let control = daemon.control();
    let erased = control
        .erase_tenant(&name, &body.reason, &body.by, &forget)
        .await?;
    daemon.sign_ins.sign_out_tenant(&name);
    Ok(Json(erased))
}

/// What sessions spent, from their logs at their agents' prices: grouped
/// by tenant, and by `agent`, `day` or `session` if asked. A tenant's
/// token sees its own only (another tenant named: 404).
#[utoipa::path(get, path = "/spend", params(SpendQuery),
    responses(
        (status = 200, description = "The spend", body = SpendReport),
        (status = 400, description = "A day that is not YYYY-MM-DD", body = wire::ApiError),
        (status = 404, description = "A tenant's token named another tenant", body = wire::ApiError)))]
pub(super) async fn spend(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<SpendQuery>,
) -> Result<Json<SpendReport>, ApiError> {
    if let Some(day) = &query.day {
        chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
            .map_err(|_| bad_request(format!("day {day:?}: a UTC day as YYYY-MM-DD")))?;
    }
    if let Some(tenant) = &query.tenant {
        checked_name(tenant)?;
    }
    Ok(Json(daemon.service_for(&caller).spend(&query).await?))
}
