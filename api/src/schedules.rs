//! The types of `/schedules`.

use replay::AgentSpec;
use serde::{Deserialize, Serialize};
#[cfg(feature = "openapi")]
use utoipa::ToSchema;
use uuid::Uuid;

/// A new schedule (`POST /schedules`, `mneme schedule add`): exactly one
/// of `every` and `cron`; for `into = "new"` exactly one of `agent` and
/// `spec`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSchedule {
    /// The name of a file (`NAME.toml`) in the daemon's agents directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// An agent spec, as an agent file's TOML would read as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub spec: Option<AgentSpec>,
    /// A period: a whole number and a unit, `s`, `m`, `h` or `d` (`30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// A cron expression of 5 fields, or 6 with seconds first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The zone a cron expression is read in: `UTC` (the default) or a
    /// fixed offset such as `+02:00`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The user message each firing sends.
    pub message: String,
    /// `new` (the default: each firing starts a session of the agent) or
    /// the id of a session each firing sends the message to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub into: Option<String>,
    /// `skip` (the default) or `queue`: what a tick does while the
    /// previous firing's turn has not ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
    /// `none`, `one` (the default) or `all`: which of the ticks that came
    /// due at once (after a downtime) fire; the others are recorded missed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<String>,
}

/// A schedule just created.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ScheduleCreated {
    /// Its id (`mneme log ID` shows its log).
    pub schedule: Uuid,
}

/// A schedule as `GET /schedules` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ScheduleView {
    /// The schedule.
    pub schedule: Uuid,
    /// When it ticks: `every 30s`, or `cron EXPR (ZONE)`.
    pub when: String,
    /// The agent its firings start sessions of (`into = new`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// `new`, or the session its firings message.
    pub into: String,
    /// The message (on one line, clipped).
    pub message: String,
    /// `skip` or `queue`.
    pub overlap: String,
    /// `none`, `one` or `all`.
    pub catch_up: String,
    /// Its next tick (RFC 3339), none once removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Its last firing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<LastFiring>,
    /// Ticks fired.
    pub fired: u64,
    /// Ticks skipped (missed, or overlapping a turn that ran).
    pub skipped: u64,
    /// Who removed it, once removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_by: Option<String>,
}

/// A schedule's last firing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct LastFiring {
    /// The tick it was for (RFC 3339).
    pub tick: String,
    /// The session it started or messaged.
    pub session: Uuid,
}

/// The schedule firing a session's record names (`ScheduledBy`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ScheduledByView {
    /// The schedule.
    pub schedule: Uuid,
    /// The tick its firing was for (RFC 3339).
    pub tick: String,
}
