//! The mneme runtime: wires the log, the fold and the tools into an agent
//! loop that can be killed at any instant and continued from its log.
//!
//! A program that embeds mneme opens a store (`eventlog::SledLog`, or
//! `pglog::PgLog`), makes a [`service::Service`] over it, creates or
//! [loads](service::Service::load) a [`Session`], posts messages
//! ([`service::Service::post_message`]) and drives turns with a [`Runner`]
//! until they end ([`TurnEnd`]). Every change is an event appended to the
//! log first; a process killed at any instant continues from the log, and a
//! side effect that committed never runs again.
//!
//! Tools are HTTP endpoints, commands, or Rust types implementing
//! `tools::Tool` that the agent declares with `kind = "native"` and the
//! program hands the runner ([`Runner::parts_with_native`]); see
//! `examples/embed.rs`. Model servers speak OpenAI's chat completions or
//! Anthropic's Messages API ([`ModelClient`]). The daemon's HTTP API
//! is described by the types of [`api`]; log events are `tracing` events of
//! target `mneme` ([`text`]); turns can be traced in the OpenTelemetry format
//! ([`telemetry`]).

mod agent;
pub use api;
pub use api::describe;
mod anthropic;
mod blobs;
pub mod control;
pub mod crash;
pub mod diff;
mod error;
pub mod inbox;
pub mod lease;
mod mcp;
mod model;
pub mod outbound;
pub mod pause;
pub mod preflight;
pub mod privacy;
mod rerun;
pub mod runner;
mod secret;
pub mod service;
pub mod session;
pub mod signing;
pub mod snapshot;
mod sse;
mod subagent;
pub mod telemetry;
pub mod text;
pub mod transfer;
pub mod views;

pub use agent::{load_agent_file, MAX_AGENT_FILE_BYTES};
pub use error::RuntimeError;
pub use model::{client_for, ModelClient, ModelError};
pub use runner::{Runner, TurnEnd};
pub use session::Session;

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
