//! The registry of tenants over the log (its fold is
//! [`replay::tenant::Registry`]): adding a tenant, issuing and revoking
//! its tokens, setting its limits, marking it erased; and finding whose a
//! token is. Every change is appended at the seq after the registry it
//! was decided from (a conflict: read again, decide again), durable
//! before it is answered; the registry is read again from where this
//! process last read it, so every process sharing a store sees the same
//! tenants.

use crate::error::RuntimeError;
use crate::session::{decode, new_event};
use eventlog::{Durability, EventLog, LogError};
use replay::tenant::{check_name, registry_id, token_digest, Registry, Tenant, TenantLimits};
use replay::Event;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a token of a tenant begins (the rest is 64 hex digits): tells it
/// from the operator's token in a log line or a leak report.
pub const TOKEN_PREFIX: &str = "mnt_";

/// The tenants of one store, read from its registry.
pub struct Tenants {
    log: Arc<dyn EventLog>,
    durability: Durability,
    /// The registry as last read, and when.
    read: tokio::sync::Mutex<(Registry, Option<Instant>)>,
}

/// A token as issued: the only time it is seen whole.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    /// The tenant.
    pub tenant: String,
    /// The token.
    pub token: String,
}

impl Tenants {
    /// The tenants of `log`; changes are made durable with `durability`.
    pub fn new(log: Arc<dyn EventLog>, durability: Durability) -> Tenants {
        Tenants {
            log,
            durability,
            read: tokio::sync::Mutex::new((Registry::default(), None)),
        }
    }

    /// The registry as the store holds it now (what other processes
    /// appended read since this one last looked).
    pub async fn registry(&self) -> Result<Registry, RuntimeError> {
        self.registry_within(Duration::ZERO).await
    }

    /// The registry as this process read it at most `age` ago (read again
    /// if older): for lookups on every request, which may lag another
    /// process's change by `age`.
    pub async fn registry_within(&self, age: Duration) -> Result<Registry, RuntimeError> {
        let mut read = self.read.lock().await;
        if read.1.is_some_and(|at| at.elapsed() < age) {
            return Ok(read.0.clone());
        }
        let id = registry_id();
        let head = self.log.head(id).await?.seq;
        if head > read.0.last_seq {
            for record in self.log.read(id, read.0.last_seq + 1, head).await? {
                let event = decode(&record)?;
                read.0.apply(record.envelope.seq, &event);
            }
        }
        read.1 = Some(Instant::now());
        Ok(read.0.clone())
    }

    /// The live tenant whose token `token` is, looking at a registry read
    /// at most `age` ago; none for a token of nobody (or revoked, or of an
    /// erased tenant).
    pub async fn owner_of(
        &self,
        token: &str,
        age: Duration,
    ) -> Result<Option<Tenant>, RuntimeError> {
        let digest = token_digest(token);
        let registry = self.registry_within(age).await?;
        if let Some(tenant) = registry.owner_of(&digest) {
            return Ok(Some(tenant.clone()));
        }
        // Perhaps issued since: read again now (a token nobody has costs
        // a look at the registry's head).
        Ok(self.registry().await?.owner_of(&digest).cloned())
    }

    /// The live tenant `name`, as the registry stands now.
    pub async fn live(&self, name: &str) -> Result<Tenant, RuntimeError> {
        check_name(name).map_err(RuntimeError::Tenant)?;
        let registry = self.registry().await?;
        match registry.tenants.get(name) {
            Some(tenant) if tenant.erased.is_none() => Ok(tenant.clone()),
            Some(_) => Err(RuntimeError::Tenant(format!(
                "tenant {name} was erased: nothing more is done for it"
            ))),
            None => Err(RuntimeError::NoSuchTenant(name.to_string())),
        }
    }

    /// Adds tenant `name` (as `by` asks) with `limits`, and issues its
    /// first token. Refused for a name that is not one, or is taken (an
    /// erased tenant's name too: its key slot stays erased).
    pub async fn add(
        &self,
        name: &str,
        limits: TenantLimits,
        by: &str,
    ) -> Result<IssuedToken, RuntimeError> {
        check_name(name).map_err(RuntimeError::Tenant)?;
        limits.validate().map_err(RuntimeError::Tenant)?;
        let salt = crate::secret::random::<32>()
            .map_err(|e| RuntimeError::Tenant(format!("random source: {e}")))?;
        let token = new_token()?;
        let key = uuid::Uuid::now_v7();
        self.change(|registry| {
            if let Some(taken) = registry.tenants.get(name) {
                let why = match taken.erased {
                    Some(_) => "it was erased, and an erased tenant's name is not given again",
                    None => "it exists already (`mneme tenant list`)",
                };
                return Err(RuntimeError::Tenant(format!(
                    "cannot add tenant {name}: {why}"
                )));
            }
            let mut events = vec![
                Event::TenantAdded {
                    name: name.into(),
                    key,
                    cache_salt: hex::encode(salt),
                    by: by.into(),
                },
                Event::TenantTokenIssued {
                    tenant: name.into(),
                    digest: token_digest(&token),
                    by: by.into(),
                },
            ];
            if limits != TenantLimits::default() {
                events.push(Event::TenantLimitsSet {
                    tenant: name.into(),
                    limits,
                    by: by.into(),
                });
            }
            Ok(events)
        })
        .await?;
        Ok(IssuedToken {
            tenant: name.into(),
            token,
        })
    }

    /// Issues another token of live tenant `name` (its others still work).
    pub async fn issue_token(&self, name: &str, by: &str) -> Result<IssuedToken, RuntimeError> {
        let token = new_token()?;
        self.change(|registry| {
            live_in(registry, name)?;
            Ok(vec![Event::TenantTokenIssued {
                tenant: name.into(),
                digest: token_digest(&token),
                by: by.into(),
            }])
        })
        .await?;
        Ok(IssuedToken {
            tenant: name.into(),
            token,
        })
    }

    /// Revokes every token of live tenant `name`: none opens anything from
    /// then on (within a second in every process sharing the store).
    pub async fn revoke(&self, name: &str, by: &str) -> Result<usize, RuntimeError> {
        let mut revoked = 0;
        self.change(|registry| {
            revoked = live_in(registry, name)?.tokens.len();
            Ok(vec![Event::TenantTokensRevoked {
                tenant: name.into(),
                by: by.into(),
            }])
        })
        .await?;
        Ok(revoked)
    }

    /// Sets live tenant `name`'s limits to what `change` makes of them.
    pub async fn set_limits(
        &self,
        name: &str,
        change: impl Fn(TenantLimits) -> TenantLimits,
        by: &str,
    ) -> Result<TenantLimits, RuntimeError> {
        let mut set = TenantLimits::default();
        self.change(|registry| {
            let limits = change(live_in(registry, name)?.limits);
            limits.validate().map_err(RuntimeError::Tenant)?;
            set = limits;
            Ok(vec![Event::TenantLimitsSet {
                tenant: name.into(),
                limits,
                by: by.into(),
            }])
        })
        .await?;
        Ok(set)
    }

    /// Records that tenant `name` is erased (its tokens revoked with it);
    /// the tenant as it was. Erasing an erased tenant records nothing.
    pub(crate) async fn mark_erased(
        &self,
        name: &str,
        reason: &str,
        by: &str,
    ) -> Result<Tenant, RuntimeError> {
        let mut found = None;
        self.change(|registry| {
            let tenant = (registry.tenants.get(name))
                .ok_or_else(|| RuntimeError::NoSuchTenant(name.to_string()))?;
            found = Some(tenant.clone());
            if tenant.erased.is_some() {
                return Ok(vec![]);
            }
            Ok(vec![Event::TenantErased {
                tenant: name.into(),
                reason: reason.into(),
                by: by.into(),
            }])
        })
        .await?;
        Ok(found.expect("found or refused"))
    }

    /// Appends what `decide` makes of the registry as it stands, at the
    /// seq after it, durable; decided again on a conflict (another process
    /// changed the registry meanwhile). Nothing to append: nothing done.
    async fn change(
        &self,
        mut decide: impl FnMut(&Registry) -> Result<Vec<Event>, RuntimeError>,
    ) -> Result<(), RuntimeError> {
        loop {
            let registry = self.registry().await?;
            let events = decide(&registry)?;
            if events.is_empty() {
                return Ok(());
            }
            let new = events.into_iter().map(|e| new_event(e, None).1).collect();
            match self
                .log
                .append(registry_id(), registry.last_seq + 1, new)
                .await
            {
                Ok(_) => {}
                Err(LogError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
            self.log.barrier(self.durability).await?;
            // Read now, so this process's next lookup sees the change.
            self.registry().await?;
            return Ok(());
        }
    }
}

/// The limits a new tenant as `request` asks for it has.
pub fn limits_of(request: &api::CreateTenant) -> TenantLimits {
    TenantLimits {
        max_cost_per_day: request.max_cost_per_day,
        max_running_turns: request.max_running_turns,
        max_parallel_calls: request.max_parallel_calls,
        max_queued_turns: request.max_queued_turns,
    }
}

/// `limits` as `set` changes them: each field given replaces its own
/// (`null` removes it).
pub fn limits_set(mut limits: TenantLimits, set: &api::SetTenant) -> TenantLimits {
    if let Some(cost) = set.max_cost_per_day {
        limits.max_cost_per_day = cost;
    }
    if let Some(turns) = set.max_running_turns {
        limits.max_running_turns = turns;
    }
    if let Some(calls) = set.max_parallel_calls {
        limits.max_parallel_calls = calls;
    }
    if let Some(queued) = set.max_queued_turns {
        limits.max_queued_turns = queued;
    }
    limits
}

/// `tenant` as `GET /tenants` lists it.
pub fn tenant_view(tenant: &Tenant) -> api::TenantView {
    api::TenantView {
        name: tenant.name.clone(),
        tokens: tenant.tokens.len(),
        max_cost_per_day: tenant.limits.max_cost_per_day,
        max_running_turns: tenant.limits.max_running_turns,
        max_parallel_calls: tenant.limits.max_parallel_calls,
        max_queued_turns: tenant.limits.max_queued_turns,
        erased: (tenant.erased.as_ref()).map(|(by, reason)| format!("by {by}: {reason}")),
    }
}

/// The live tenant `name` of `registry`, or why not.
fn live_in<'a>(registry: &'a Registry, name: &str) -> Result<&'a Tenant, RuntimeError> {
    check_name(name).map_err(RuntimeError::Tenant)?;
    match registry.tenants.get(name) {
        Some(tenant) if tenant.erased.is_none() => Ok(tenant),
        Some(_) => Err(RuntimeError::Tenant(format!(
            "tenant {name} was erased: nothing more is done for it"
        ))),
        None => Err(RuntimeError::NoSuchTenant(name.to_string())),
    }
}

/// A new token: [`TOKEN_PREFIX`] and 32 random bytes in hex.
fn new_token() -> Result<String, RuntimeError> {
    let bytes = crate::secret::random::<32>()
        .map_err(|e| RuntimeError::Tenant(format!("random source: {e}")))?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn tenants() -> (tempfile::TempDir, Tenants) {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn EventLog> = Arc::new(eventlog::SledLog::open(dir.path()).unwrap());
        (dir, Tenants::new(log, Durability::Flushed))
    }

    #[tokio::test]
    async fn a_token_opens_its_tenant_until_revoked() {
        let (_dir, tenants) = tenants().await;
        let issued = tenants
            .add("acme", TenantLimits::default(), "op")
            .await
            .unwrap();
        assert!(issued.token.starts_with(TOKEN_PREFIX));
        let owner = tenants.owner_of(&issued.token, Duration::ZERO).await;
        assert_eq!(owner.unwrap().unwrap().name, "acme");
        let forged = format!("{TOKEN_PREFIX}{}", "0".repeat(64));
        assert!(tenants
            .owner_of(&forged, Duration::ZERO)
            .await
            .unwrap()
            .is_none());
        let second = tenants.issue_token("acme", "op").await.unwrap();
        assert_eq!(tenants.revoke("acme", "op").await.unwrap(), 2);
        for token in [&issued.token, &second.token] {
            assert!(tenants
                .owner_of(token, Duration::ZERO)
                .await
                .unwrap()
                .is_none());
        }
    }

    #[tokio::test]
    async fn names_are_checked_and_given_once() {
        let (_dir, tenants) = tenants().await;
        let none = TenantLimits::default();
        let said = tenants.add("Bad Name", none, "op").await.unwrap_err();
        assert!(said.to_string().contains("tenant name"), "{said}");
        tenants.add("acme", none, "op").await.unwrap();
        let said = tenants.add("acme", none, "op").await.unwrap_err();
        assert!(said.to_string().contains("exists already"), "{said}");
        tenants.mark_erased("acme", "gone", "op").await.unwrap();
        let said = tenants.add("acme", none, "op").await.unwrap_err();
        assert!(said.to_string().contains("erased"), "{said}");
        let said = tenants.issue_token("acme", "op").await.unwrap_err();
        assert!(said.to_string().contains("erased"), "{said}");
        let said = tenants.revoke("nobody", "op").await.unwrap_err();
        assert!(matches!(said, RuntimeError::NoSuchTenant(_)), "{said}");
    }

    #[tokio::test]
    async fn limits_are_set_whole_and_checked() {
        let (_dir, tenants) = tenants().await;
        let capped = TenantLimits {
            max_cost_per_day: Some(20.0),
            ..TenantLimits::default()
        };
        tenants.add("acme", capped, "op").await.unwrap();
        let registry = tenants.registry().await.unwrap();
        assert_eq!(registry.live("acme").unwrap().limits, capped);
        let said = tenants
            .set_limits(
                "acme",
                |_| TenantLimits {
                    max_cost_per_day: Some(-1.0),
                    ..TenantLimits::default()
                },
                "op",
            )
            .await
            .unwrap_err();
        assert!(said.to_string().contains("positive"), "{said}");
        let set = tenants
            .set_limits("acme", |_| TenantLimits::default(), "op")
            .await
            .unwrap();
        assert_eq!(set, TenantLimits::default());
    }

    #[tokio::test]
    async fn two_processes_adding_one_name_both_see_one_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn EventLog> = Arc::new(eventlog::SledLog::open(dir.path()).unwrap());
        let (a, b) = (
            Tenants::new(log.clone(), Durability::Flushed),
            Tenants::new(log, Durability::Flushed),
        );
        let none = TenantLimits::default();
        let (x, y) = tokio::join!(a.add("acme", none, "a"), b.add("acme", none, "b"));
        assert!(x.is_ok() != y.is_ok(), "one wins: {x:?} {y:?}");
        assert_eq!(a.registry().await.unwrap(), b.registry().await.unwrap());
    }
}
