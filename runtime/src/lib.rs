//! The mneme runtime: wires the log, the fold and the tools into an agent
//! loop that can be killed at any instant and continued from its log.
//!
//! A program that embeds mneme opens a store (`eventlog::SledLog`, or
//! `pglog::PgLog`), makes a [`Service`] over it, creates or
//! [loads](Service::load) a [`Session`], posts messages
//! ([`Service::post_message`]) and drives turns with a [`Runner`]
//! until they end ([`TurnEnd`]). Every change is an event appended to the
//! log first; a process killed at any instant continues from the log, and a
//! side effect that committed never runs again.
//!
//! Tools are HTTP endpoints, commands, or Rust types implementing
//! `tools::Tool` that the agent declares with `kind = "native"` and the
//! program hands the runner ([`Runner::parts_with_native`]); see
//! `examples/embed.rs`. Model servers speak OpenAI's chat completions or its
//! Responses API, or Anthropic's Messages API ([`ModelClient`]). The daemon's HTTP API
//! is described by the types of [`api`]; log events are `tracing` events of
//! target `mneme` ([`text`]); turns can be traced in the OpenTelemetry format
//! ([`Tracer`]).
//!
//! Beyond the names at the root, three modules: [`control`] (what a face,
//! the command line or the daemon, can ask of a session, and what holds a
//! session while it does), [`store`] (what is kept and how it is shown) and
//! [`text`] (words for terminals and logs).

#![warn(unreachable_pub)]

mod agent;
mod anthropic;
mod blobs;
mod budgets;
pub mod control;
mod diff;
mod error;
mod inbox;
mod lease;
mod mcp;
mod model;
mod outbound;
mod pause;
mod preflight;
mod privacy;
mod rerun;
mod responses;
mod runner;
mod schedule;
mod secret;
mod service;
mod session;
mod signing;
mod sleep;
mod snapshot;
mod spend;
mod sse;
mod subagent;
mod telemetry;
mod tenants;
pub mod text;
mod transfer;
mod views;

pub use agent::{load_agent_file, MAX_AGENT_FILE_BYTES};
pub use api;
pub use api::describe;
pub use error::RuntimeError;
pub use model::{client_for, ModelClient, ModelError};
pub use runner::{DeltaSink, Runner, StopCheck, StopFuture, TurnEnd, TurnParts};
pub use service::Service;
pub use session::{Session, SessionObserver};
pub use telemetry::{OtlpConfig, Tracer};
pub use tenants::{limits_of, limits_set, tenant_view, IssuedToken, Tenants, TOKEN_PREFIX};

/// What is kept of a session beyond its live state, and the shapes it is
/// shown in: reading and decoding its records (and the trace ids they are
/// traced under), summaries and snapshots, keys at rest, signed heads,
/// export and import, diffs, and the views the faces print or serve.
pub mod store {
    pub use crate::diff::sessions as diff_sessions;
    pub use crate::privacy::{MasterKey, SealedLog};
    pub use crate::schedule::schedule_view;
    pub use crate::session::{decode, read_events};
    pub use crate::signing::{HeadKey, HeadSigner, Witnessed};
    pub use crate::snapshot::{store as store_snapshot, Summary, DEFAULT_EVERY as SNAPSHOT_EVERY};
    pub use crate::telemetry::{event_span_id, turn_ids};
    pub use crate::transfer::{export, import, importing, Imported, Policy};
    pub use crate::views::{record, summary_of, turn_end, verified, waiting_calls};
}

/// Makes every file this process creates from then on readable by its user
/// only: sets the file-creation mask to 0o077 (files 0600, directories
/// 0700, sled's own included). Command tools still start with the mask it
/// replaced: the files a tool creates are its user's business. The `mneme`
/// binary calls it first thing, before any thread starts.
pub fn restrict_umask() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: umask(2) has no memory-safety preconditions.
        let original = unsafe { libc::umask(0o077) };
        tools::set_tool_umask(original);
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_restricted_umask_makes_private_files() {
        use std::os::unix::fs::PermissionsExt;
        super::restrict_umask();
        super::restrict_umask();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "secret").unwrap();
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
