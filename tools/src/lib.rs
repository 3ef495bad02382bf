//! Tools with declared effects, and the two built-in kinds: HTTP and command.
//!
//! This crate knows nothing of the log: it runs a call with the context it
//! is given (session, call id, idempotency key) and returns the outcome. The
//! write-ahead rules around a call are the runtime's business.

mod capture;
mod command;
mod http;
mod spawn;

pub use command::{CommandTool, BASE_ENV};
pub use http::HttpTool;
pub use spawn::set_tool_umask;

use async_trait::async_trait;
use replay::spec::{ToolKind, ToolSpec};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Everything a tool may know about the call it runs.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// The session.
    pub session: Uuid,
    /// The model's id of the call.
    pub call_id: String,
    /// The same on every attempt of this call; tools pass it on so the far
    /// side can drop duplicates.
    pub idempotency_key: String,
    /// 1 for the first run.
    pub attempt: u32,
}

/// Why a call produced no output.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// It ran past its timeout and was stopped; whether it took effect is unknown.
    #[error("tool {tool} timed out after {secs} s")]
    Timeout {
        /// The tool.
        tool: String,
        /// The timeout.
        secs: u64,
    },
    /// The arguments are not what the tool takes.
    #[error("tool {tool}: bad arguments: {reason}")]
    BadArguments {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// It was cut off after it may have acted (the connection broke after
    /// the request was sent, the task died): whether it took effect is unknown.
    #[error("tool {tool} was interrupted: {reason}")]
    Interrupted {
        /// The tool.
        tool: String,
        /// What broke.
        reason: String,
    },
    /// It ran and failed, or could not start.
    #[error("tool {tool} failed: {reason}")]
    Failed {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// It could not be set up from its spec.
    #[error("tool {tool} is misconfigured: {reason}")]
    Config {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
}

impl ToolError {
    /// Whether the call may have taken effect in part or in full.
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            ToolError::Timeout { .. } | ToolError::Interrupted { .. }
        )
    }
}

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync {
    /// Its declaration: name, description, parameters, effect.
    fn spec(&self) -> &ToolSpec;

    /// Runs one call with `args` (a JSON text) and returns its output: JSON
    /// where it parses, else text. Gives up after the spec's timeout.
    async fn call(&self, ctx: &CallContext, args: &str) -> Result<String, ToolError>;
}

/// The tools of one agent, by name.
#[derive(Clone, Default)]
pub struct Toolbox {
    tools: HashMap<String, Arc<dyn Tool>>,
}

impl Toolbox {
    /// Builds every tool of `specs`.
    pub fn from_specs(specs: &[ToolSpec]) -> Result<Toolbox, ToolError> {
        let client = reqwest::Client::builder()
            .build()
            .map_err(|e| ToolError::Config {
                tool: "*".into(),
                reason: format!("cannot build HTTP client: {e}"),
            })?;
        let mut tools: HashMap<String, Arc<dyn Tool>> = HashMap::new();
        for spec in specs {
            let tool: Arc<dyn Tool> = match spec.kind {
                ToolKind::Http => Arc::new(HttpTool::new(spec.clone(), client.clone())?),
                ToolKind::Command => Arc::new(CommandTool::new(spec.clone())?),
            };
            tools.insert(spec.name.clone(), tool);
        }
        Ok(Toolbox { tools })
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }
}

/// Output text for a value: JSON text where `raw` parses as JSON (re-encoded
/// compactly so equal values give equal bytes), else `raw` itself.
pub(crate) fn json_or_text(raw: &str) -> serde_json::Value {
    serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_string()))
}

/// Runs `work` under the tool's timeout.
pub(crate) async fn with_timeout<T>(
    spec: &ToolSpec,
    work: impl std::future::Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    let limit: Duration = spec.timeout();
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
        Err(ToolError::Timeout {
            tool: spec.name.clone(),
            secs: limit.as_secs(),
        })
    })
}
