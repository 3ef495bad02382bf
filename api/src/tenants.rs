//! The types of `/tenants` and `/spend`.

use serde::{Deserialize, Serialize};
#[cfg(feature = "openapi")]
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// A new tenant (`POST /tenants`, `mneme tenant add`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// Its name: 1 to 32 lower-case letters, digits, `-` and `_`,
    /// starting with a letter or a digit.
    pub name: String,
    /// The most the model requests of all its sessions may cost in one
    /// UTC day, in their agents' prices (absent: no cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_per_day: Option<f64>,
    /// Turns of its sessions running at once on a daemon (absent: no
    /// limit but the daemon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running_turns: Option<u64>,
    /// Tool calls of its sessions running at once in a process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel_calls: Option<u64>,
    /// Turns of its sessions waiting on a daemon, past which one more is
    /// refused (429).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued_turns: Option<u64>,
}

/// A tenant's token, as issued: shown this once, kept only as its
/// SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TenantToken {
    /// The tenant.
    pub tenant: String,
    /// The token (`Authorization: Bearer TOKEN`): it sees only the
    /// tenant's sessions, schedules, spend and metrics.
    pub token: String,
}

/// A tenant as `GET /tenants` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TenantView {
    /// Its name.
    pub name: String,
    /// How many of its tokens work.
    pub tokens: usize,
    /// Its daily cap on cost, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_per_day: Option<f64>,
    /// Its turns running at once, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running_turns: Option<u64>,
    /// Its tool calls running at once, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel_calls: Option<u64>,
    /// Its turns waiting, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued_turns: Option<u64>,
    /// Who erased it and why, if it was erased.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erased: Option<String>,
}

/// A tenant's limits as `PATCH /tenants/{name}` sets them (`mneme tenant
/// set`): each field given replaces the tenant's; `null` removes it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetTenant {
    /// The most the model requests of all its sessions may cost in one
    /// UTC day; `null` removes the cap.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>))]
    pub max_cost_per_day: Option<Option<f64>>,
    /// Turns of its sessions running at once on a daemon; `null` removes
    /// the limit.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub max_running_turns: Option<Option<u64>>,
    /// Tool calls of its sessions running at once in a process; `null`
    /// removes the limit.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub max_parallel_calls: Option<Option<u64>>,
    /// Turns of its sessions waiting on a daemon; `null` removes the bound.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub max_queued_turns: Option<Option<u64>>,
}

/// Absent, `null` or a value, told apart.
mod double_option {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer, T: Serialize + Copy>(
        value: &Option<Option<T>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.flatten().serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(deserializer).map(Some)
    }
}

/// Revoking a tenant's tokens.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TokensRevoked {
    /// The tenant.
    pub tenant: String,
    /// How many worked until now.
    pub revoked: usize,
}

/// Erasing a tenant (`DELETE /tenants/{name}`, `mneme erase --tenant`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EraseTenant {
    /// Why (recorded in the registry and in each session).
    pub reason: String,
    /// Who asks.
    #[serde(default = "default_by")]
    pub by: String,
}

fn default_by() -> String {
    "api".into()
}

/// What erasing a tenant did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TenantErased {
    /// The tenant.
    pub tenant: String,
    /// Whether its key was destroyed (false: its sessions were written
    /// without encryption, and only their erasure one by one, refused,
    /// could have erased them).
    pub key_destroyed: bool,
    /// Its sessions, each erased (recorded in it, its own key destroyed).
    pub erased: Vec<Uuid>,
    /// Its sessions not erased one by one, each with why (their content is
    /// unreadable all the same once the tenant's key is gone).
    pub not_erased: Vec<NotErased>,
}

/// A session of an erased tenant that could not be erased on its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NotErased {
    /// The session.
    pub session: Uuid,
    /// Why.
    pub error: String,
}

/// How spend is grouped, besides by tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SpendBy {
    /// By tenant only.
    #[default]
    Tenant,
    /// By tenant and agent.
    Agent,
    /// By tenant and UTC day.
    Day,
    /// By tenant and session.
    Session,
}

impl std::str::FromStr for SpendBy {
    type Err = String;

    fn from_str(s: &str) -> Result<SpendBy, String> {
        match s {
            "tenant" => Ok(SpendBy::Tenant),
            "agent" => Ok(SpendBy::Agent),
            "day" => Ok(SpendBy::Day),
            "session" => Ok(SpendBy::Session),
            other => Err(format!(
                "by {other:?}: expected tenant, agent, day or session"
            )),
        }
    }
}

/// Which spend `GET /spend` reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct SpendQuery {
    /// Only this tenant's sessions (a tenant's token sees only its own).
    pub tenant: Option<String>,
    /// Grouped by tenant (the default), or by tenant and `agent`, `day`
    /// or `session`.
    pub by: Option<SpendBy>,
    /// Only this UTC day (`YYYY-MM-DD`).
    pub day: Option<String>,
}

/// Spend, summed from every session's model requests at their agents'
/// prices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SpendReport {
    /// How the rows are grouped.
    pub by: SpendBy,
    /// The tenant it is limited to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The day it is limited to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day: Option<String>,
    /// One a group, in order of tenant (the operator's own first), then
    /// agent, day or session.
    pub rows: Vec<SpendRow>,
    /// Every row summed.
    pub total: SpendRow,
}

/// What one group of sessions spent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SpendRow {
    /// The tenant (null: the operator's own sessions).
    pub tenant: Option<String>,
    /// The agent, when grouped by agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The UTC day, when grouped by day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day: Option<String>,
    /// The session, when grouped by session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Uuid>,
    /// Model requests answered.
    pub model_calls: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Prompt tokens served from the server's cache.
    pub cached_tokens: u64,
    /// Cost, in the agents' prices.
    pub cost: f64,
}
