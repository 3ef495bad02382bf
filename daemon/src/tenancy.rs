//! Who a request acts for, and what it may reach: the operator (the
//! daemon's token, or a web view sign-in its holder made) reaches every
//! session; a tenant (one of its tokens, or a sign-in one of them made)
//! reaches only its own. Another tenant's session is answered exactly as a
//! session the store does not hold (404, the same words), on every route
//! that names one, so a tenant cannot tell that it exists.

use crate::api::ApiError;
use crate::Daemon;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use replay::tenant::{Tenant, TenantLimits};
use runtime::RuntimeError;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// How old the registry of tenants a token's lookup reads may be: a token
/// revoked through another process stops working within it.
pub(crate) const TOKEN_LOOKUP_AGE: Duration = Duration::from_secs(1);

/// Who a request acts for.
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    /// The operator: the daemon's own token, or its holder's sign-in.
    Operator,
    /// A tenant: one of its tokens, or a sign-in one of them made.
    Tenant(Box<Tenant>),
}

impl Caller {
    /// The tenant's name, for a tenant.
    pub(crate) fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Operator => None,
            Caller::Tenant(tenant) => Some(&tenant.name),
        }
    }

    /// Whether it may reach what belongs to `owner` (a tenant's name;
    /// `None`: the operator's own).
    pub(crate) fn reaches(&self, owner: Option<&str>) -> bool {
        match self {
            Caller::Operator => true,
            Caller::Tenant(tenant) => owner == Some(tenant.name.as_str()),
        }
    }

    /// 403 for a tenant, for what only the operator may do (`what`).
    pub(crate) fn operator_only(&self, what: &str) -> Result<(), ApiError> {
        match self {
            Caller::Operator => Ok(()),
            Caller::Tenant(tenant) => Err(ApiError(
                StatusCode::FORBIDDEN,
                format!(
                    "{what}: only the operator's token may (this is a token of tenant {})",
                    tenant.name
                ),
            )),
        }
    }
}

impl Daemon {
    /// The tenant session `id` belongs to (`None`: the operator's), from
    /// its first records, remembered (it never changes).
    pub(crate) async fn owner_of(&self, id: Uuid) -> Result<Option<String>, RuntimeError> {
        if let Some(owner) = self.owners.lock().expect("owners lock").get(&id) {
            return Ok(owner.clone());
        }
        let owner = self.service.tenant_of(id).await?;
        let mut owners = self.owners.lock().expect("owners lock");
        owners.insert(id, owner.clone());
        Ok(owner)
    }

    /// 404, worded as for a session the store does not hold, unless
    /// `caller` reaches session `id`.
    pub(crate) async fn reach(&self, caller: &Caller, id: Uuid) -> Result<(), ApiError> {
        if matches!(caller, Caller::Operator) {
            return Ok(());
        }
        match self.owner_of(id).await {
            Ok(owner) if caller.reaches(owner.as_deref()) => Ok(()),
            Ok(_) | Err(RuntimeError::NoSuchSession(_)) => {
                Err(RuntimeError::NoSuchSession(id).into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The live tenant a token of which is `token`, if any (a registry at
    /// most [`TOKEN_LOOKUP_AGE`] old; a token unknown there is looked up
    /// again in the registry as it stands).
    pub(crate) async fn tenant_of_token(&self, token: &str) -> Option<Tenant> {
        let tenants = self.service.tenants();
        match tenants.owner_of(token, TOKEN_LOOKUP_AGE).await {
            Ok(found) => found,
            Err(e) => {
                runtime::warn_line!("mneme serve: cannot read the registry of tenants: {e}");
                None
            }
        }
    }

    /// Whose a turn of session `id` is (its tenant, `None`: the
    /// operator's), and that tenant's limits (the operator's: none).
    pub(crate) async fn share_of(&self, id: Uuid) -> (crate::fair::Whose, TenantLimits) {
        let whose = self.owner_of(id).await.unwrap_or(None);
        let Some(name) = &whose else {
            return (whose, TenantLimits::default());
        };
        let registry = (self.service.tenants())
            .registry_within(TOKEN_LOOKUP_AGE)
            .await;
        let limits = registry
            .ok()
            .and_then(|r| r.tenants.get(name).map(|t| t.limits))
            .unwrap_or_default();
        (whose, limits)
    }

    /// 429 when the tenant of session `id` has as many turns waiting as
    /// its `max_queued_turns`, naming the bound; for a turn asked for
    /// through the API, before anything is recorded.
    pub(crate) async fn refuse_when_queue_full(&self, id: Uuid) -> Result<(), ApiError> {
        let (whose, limits) = self.share_of(id).await;
        let (Some(name), Some(bound)) = (&whose, limits.max_queued_turns) else {
            return Ok(());
        };
        let queued = self.fair.queued(&whose);
        if (queued as u64) < bound {
            return Ok(());
        }
        Err(ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            format!("tenant {name} has {queued} turns waiting to run, its bound (max_queued_turns = {bound}, `mneme tenant set {name} --max-queued-turns`): ask again once some have run"),
        ))
    }

    /// The live tenant `name` (for a sign-in of it), if it still is.
    pub(crate) async fn live_tenant(&self, name: &str) -> Option<Tenant> {
        let registry = (self.service.tenants())
            .registry_within(TOKEN_LOOKUP_AGE)
            .await
            .ok()?;
        registry.live(name).cloned()
    }
}

/// The sessions a request's path names: `/sessions/{id}/…`, and the other
/// of `/sessions/{id}/diff/{other}`.
fn sessions_named(path: &str) -> Vec<Uuid> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut named = Vec::new();
    if let ["sessions", id, rest @ ..] = parts.as_slice() {
        named.extend(Uuid::parse_str(id).ok());
        if let ["diff", other] = rest {
            named.extend(Uuid::parse_str(other).ok());
        }
    }
    named
}

/// Answers 404 for every session the request's path names that its caller
/// does not reach, before any handler looks at it.
pub(crate) async fn scope(
    State(daemon): State<Arc<Daemon>>,
    request: Request,
    next: Next,
) -> Response {
    let caller = request.extensions().get::<Caller>().cloned();
    if let Some(caller @ Caller::Tenant(_)) = caller {
        for id in sessions_named(request.uri().path()) {
            if let Err(refused) = daemon.reach(&caller, id).await {
                return refused.into_response();
            }
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sessions_a_path_names_are_found() {
        let a = "0192a000-0000-7000-8000-000000000001";
        let b = "0192a000-0000-7000-8000-000000000002";
        let ids = |path: &str| sessions_named(path);
        assert_eq!(ids(&format!("/sessions/{a}")).len(), 1);
        assert_eq!(ids(&format!("/sessions/{a}/calls/c/approve")).len(), 1);
        assert_eq!(ids(&format!("/sessions/{a}/diff/{b}")).len(), 2);
        assert!(ids("/sessions").is_empty());
        assert!(ids("/sessions/not-a-uuid/verify").is_empty());
        assert!(ids(&format!("/schedules/{a}")).is_empty());
    }

    #[test]
    fn a_tenant_reaches_its_own_only() {
        let acme = Caller::Tenant(Box::new(Tenant {
            name: "acme".into(),
            key: Uuid::nil(),
            cache_salt: String::new(),
            tokens: Default::default(),
            limits: Default::default(),
            added_seq: 1,
            erased: None,
        }));
        assert!(acme.reaches(Some("acme")));
        assert!(!acme.reaches(Some("other")));
        assert!(!acme.reaches(None), "the operator's own");
        assert!(Caller::Operator.reaches(Some("acme")));
        assert!(acme.operator_only("adding tenants").is_err());
    }
}
