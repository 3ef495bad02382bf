//! Tenants: the users of one daemon (or fleet), each with its own tokens,
//! sessions, key, prompt-cache salt and limits, none seeing another's.
//!
//! The registry of tenants is a log of its own ([`registry_id`]), holding
//! only the `Tenant*` kinds; who the tenants are is a fold of it
//! ([`Registry`]). A change is appended at the seq after the state it was
//! decided from, so of two processes adding the same name one append wins
//! and the other, refused as a conflict, reads the registry again and
//! finds the name taken. Tokens are kept as their SHA-256, never as
//! themselves.

use crate::event::{Event, Tenancy};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use uuid::Uuid;

/// The most characters a tenant's name has.
pub const MAX_NAME_CHARS: usize = 32;

/// Whether `name` may name a tenant: 1 to [`MAX_NAME_CHARS`] lower-case
/// ASCII letters, digits, `-` and `_`, starting with a letter or a digit
/// (it names a directory of agent files, and appears in metrics' labels).
/// If not, why.
pub fn check_name(name: &str) -> Result<(), String> {
    let fits = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    let starts = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.is_empty() || name.len() > MAX_NAME_CHARS || !starts || !name.chars().all(fits) {
        let shown: String = name.chars().take(MAX_NAME_CHARS + 8).collect();
        return Err(format!(
            "tenant name {shown:?}: 1 to {MAX_NAME_CHARS} lower-case letters, digits, '-' and '_', starting with a letter or a digit"
        ));
    }
    Ok(())
}

/// The id of the registry of tenants' log: the same in every store.
pub fn registry_id() -> Uuid {
    derived_id(b"mneme-tenants\0", b"")
}

/// A UUID of version 8 from the SHA-256 of `domain` and `name`.
pub(crate) fn derived_id(domain: &[u8], name: &[u8]) -> Uuid {
    use sha2::Digest;
    let digest = sha2::Sha256::new()
        .chain_update(domain)
        .chain_update(name)
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// Whether `kind` is one of the registry of tenants' (its log holds no
/// other).
pub fn is_tenant_kind(kind: &str) -> bool {
    kind.starts_with("Tenant")
}

/// The SHA-256 (hex) a token is kept as: of the token trimmed.
pub fn token_digest(token: &str) -> String {
    crate::event::digest_hex(token.trim().as_bytes())
}

/// A tenant's limits (`mneme tenant set`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    /// Cost of the model requests of all its sessions in one UTC day, in
    /// their agents' prices (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_per_day: Option<f64>,
    /// Turns of its sessions running at once on one daemon (absent: as
    /// many as the daemon runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running_turns: Option<u64>,
    /// Tool calls of its sessions running at once in one process (absent:
    /// as many as the process runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel_calls: Option<u64>,
    /// Turns of its sessions waiting to run on one daemon, past which one
    /// more asked for through the API is refused (absent: no bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued_turns: Option<u64>,
}

/// The most any count limit of a tenant may be.
pub const MAX_COUNT_LIMIT: u64 = 1_000_000;

impl TenantLimits {
    /// Whether these limits can hold: a cost a positive, finite number;
    /// each count 1 to [`MAX_COUNT_LIMIT`]. If not, why.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(cost) = self.max_cost_per_day {
            if !(cost > 0.0 && cost.is_finite()) {
                return Err(format!(
                    "max_cost_per_day = {cost}: must be a positive number"
                ));
            }
        }
        for (name, count) in [
            ("max_running_turns", self.max_running_turns),
            ("max_parallel_calls", self.max_parallel_calls),
            ("max_queued_turns", self.max_queued_turns),
        ] {
            if count.is_some_and(|n| !(1..=MAX_COUNT_LIMIT).contains(&n)) {
                return Err(format!(
                    "{name} = {}: must be 1 to {MAX_COUNT_LIMIT}",
                    count.unwrap_or_default()
                ));
            }
        }
        Ok(())
    }
}

/// One tenant, as the registry's fold knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// The key store's slot of its key.
    pub key: Uuid,
    /// Its prompt-cache salt (hex).
    pub cache_salt: String,
    /// The digests of its live tokens.
    pub tokens: BTreeSet<String>,
    /// Its limits.
    pub limits: TenantLimits,
    /// Seq of the record that added it.
    pub added_seq: u64,
    /// Who erased it, and why, if it was erased.
    pub erased: Option<(String, String)>,
}

impl Tenant {
    /// What a session of this tenant records in its start.
    pub fn tenancy(&self) -> Tenancy {
        Tenancy {
            name: self.name.clone(),
            cache_salt: Some(self.cache_salt.clone()),
            key: Some(self.key),
        }
    }
}

/// The registry of tenants: a fold of its log.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Registry {
    /// Seq of the last record folded.
    pub last_seq: u64,
    /// Every tenant ever added, erased ones too, by name.
    pub tenants: BTreeMap<String, Tenant>,
    /// Records the fold could not place (`(seq, what)`): a healthy
    /// registry has none.
    pub anomalies: Vec<(u64, String)>,
}

impl Registry {
    /// Folds one more record. Never panics, whatever the event.
    pub fn apply(&mut self, seq: u64, event: &Event) {
        self.last_seq = seq;
        let unknown = |tenant: &str| (seq, format!("names tenant {tenant:?}, which was not added"));
        match event {
            Event::TenantAdded {
                name,
                key,
                cache_salt,
                ..
            } => {
                if self.tenants.contains_key(name) {
                    self.anomalies
                        .push((seq, format!("adds tenant {name:?} a second time")));
                    return;
                }
                self.tenants.insert(
                    name.clone(),
                    Tenant {
                        name: name.clone(),
                        key: *key,
                        cache_salt: cache_salt.clone(),
                        tokens: BTreeSet::new(),
                        limits: TenantLimits::default(),
                        added_seq: seq,
                        erased: None,
                    },
                );
            }
            Event::TenantTokenIssued { tenant, digest, .. } => {
                match self.tenants.get_mut(tenant).filter(|t| t.erased.is_none()) {
                    Some(t) => {
                        t.tokens.insert(digest.clone());
                    }
                    None => self.anomalies.push(unknown(tenant)),
                }
            }
            Event::TenantTokensRevoked { tenant, .. } => match self.tenants.get_mut(tenant) {
                Some(t) => t.tokens.clear(),
                None => self.anomalies.push(unknown(tenant)),
            },
            Event::TenantLimitsSet { tenant, limits, .. } => match self.tenants.get_mut(tenant) {
                Some(t) => t.limits = *limits,
                None => self.anomalies.push(unknown(tenant)),
            },
            Event::TenantErased {
                tenant, reason, by, ..
            } => match self.tenants.get_mut(tenant) {
                Some(t) => {
                    t.tokens.clear();
                    t.erased = Some((by.clone(), reason.clone()));
                }
                None => self.anomalies.push(unknown(tenant)),
            },
            other => self.anomalies.push((
                seq,
                format!("a {} has no place in the registry of tenants", other.kind()),
            )),
        }
    }

    /// Folds `events` (seq and event, in seq order) from the empty registry.
    pub fn fold<'a>(events: impl IntoIterator<Item = (u64, &'a Event)>) -> Registry {
        let mut registry = Registry::default();
        for (seq, event) in events {
            registry.apply(seq, event);
        }
        registry
    }

    /// The tenant named `name`, unless it was never added or was erased.
    pub fn live(&self, name: &str) -> Option<&Tenant> {
        self.tenants.get(name).filter(|t| t.erased.is_none())
    }

    /// The live tenant whose token has SHA-256 `digest`, if any.
    pub fn owner_of(&self, digest: &str) -> Option<&Tenant> {
        self.tenants
            .values()
            .find(|t| t.erased.is_none() && t.tokens.contains(digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(name: &str) -> Event {
        Event::TenantAdded {
            name: name.into(),
            key: Uuid::from_u128(1),
            cache_salt: "00".into(),
            by: "op".into(),
        }
    }

    #[test]
    fn names_are_short_lower_case_words() {
        for good in ["acme", "a", "team-7", "x_y", &"a".repeat(32)] {
            check_name(good).unwrap();
        }
        for bad in [
            "",
            "Acme",
            "-acme",
            "_a",
            "a b",
            "../etc",
            "a/b",
            "é",
            "a\u{202e}b",
            &"a".repeat(33),
        ] {
            let said = check_name(bad).unwrap_err();
            assert!(said.contains("tenant name"), "{said}");
        }
    }

    #[test]
    fn tokens_are_found_by_digest_until_revoked_or_erased() {
        let digest = token_digest(" t0ken \n");
        assert_eq!(digest, token_digest("t0ken"), "trimmed");
        let issued = |tenant: &str| Event::TenantTokenIssued {
            tenant: tenant.into(),
            digest: digest.clone(),
            by: "op".into(),
        };
        let mut registry = Registry::fold([(1, &added("acme")), (2, &issued("acme"))]);
        assert_eq!(registry.owner_of(&digest).unwrap().name, "acme");
        registry.apply(
            3,
            &Event::TenantTokensRevoked {
                tenant: "acme".into(),
                by: "op".into(),
            },
        );
        assert!(registry.owner_of(&digest).is_none());
        registry.apply(4, &issued("acme"));
        assert!(registry.owner_of(&digest).is_some());
        registry.apply(
            5,
            &Event::TenantErased {
                tenant: "acme".into(),
                reason: "gone".into(),
                by: "op".into(),
            },
        );
        assert!(registry.owner_of(&digest).is_none());
        assert!(registry.live("acme").is_none());
        assert!(registry.tenants["acme"].erased.is_some());
        // A token issued to an erased or unknown tenant opens nothing.
        registry.apply(6, &issued("acme"));
        registry.apply(7, &issued("nobody"));
        assert!(registry.owner_of(&digest).is_none());
        assert_eq!(registry.anomalies.len(), 2);
        assert_eq!(registry.last_seq, 7);
    }

    #[test]
    fn a_name_is_added_once() {
        let registry = Registry::fold([(1, &added("acme")), (2, &added("acme"))]);
        assert_eq!(registry.tenants.len(), 1);
        assert_eq!(registry.tenants["acme"].added_seq, 1);
        assert_eq!(registry.anomalies.len(), 1);
    }

    #[test]
    fn limits_must_be_positive_numbers() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let limits = TenantLimits {
                max_cost_per_day: Some(bad),
                ..TenantLimits::default()
            };
            assert!(limits.validate().is_err(), "{bad}");
        }
        TenantLimits {
            max_cost_per_day: Some(0.01),
            ..TenantLimits::default()
        }
        .validate()
        .unwrap();
        let none = TenantLimits {
            max_running_turns: Some(0),
            ..TenantLimits::default()
        };
        assert!(none.validate().unwrap_err().contains("max_running_turns"));
    }

    #[test]
    fn the_registry_id_is_fixed() {
        assert_eq!(registry_id(), registry_id());
        assert_ne!(registry_id(), derived_id(b"mneme-tenants\0", b"x"));
    }
}
