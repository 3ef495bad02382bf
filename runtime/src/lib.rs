//! The mneme runtime: wires the log, the fold and the tools into an agent
//! loop that can be killed at any instant and continued from its log.

pub mod agent;
pub mod crash;
pub mod daemon;
pub mod error;
pub mod lease;
pub mod model;
pub mod pause;
pub mod runner;
pub mod service;
pub mod session;
pub mod sink;
pub mod snapshot;
pub mod text;
pub mod transfer;
pub mod views;

pub use error::RuntimeError;
pub use runner::{Runner, TurnEnd};
pub use session::Session;
