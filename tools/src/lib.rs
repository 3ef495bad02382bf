//! Tools with declared effects, and the two built-in kinds: HTTP and command.
//!
//! This crate knows nothing of the log: it runs a call with the context it
//! is given (session, call id, idempotency key) and returns the outcome. The
//! write-ahead rules around a call are the runtime's business.

mod capture;
pub mod check;
mod command;
mod http;
pub mod mcp;
mod spawn;

pub use command::{CommandTool, BASE_ENV};
pub use http::HttpTool;
pub use spawn::set_tool_umask;

use async_trait::async_trait;
use replay::mcp::McpServerSpec;
use replay::spec::{AgentSpec, ToolKind, ToolSpec};
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
    /// Where binary content the tool returns is kept (by reference: its
    /// bytes never go in an event); `None`: it is only described.
    pub blobs: Option<Blobs>,
    /// Fires when the turn is paused by a person: a tool that can give up
    /// (an MCP call, which tells its server) returns
    /// [`ToolError::Cancelled`]; others run to their end.
    pub cancel: Option<Cancel>,
}

/// A signal that the call should give up.
#[derive(Debug, Clone)]
pub struct Cancel(pub tokio::sync::watch::Receiver<bool>);

impl Cancel {
    /// A signal and the sender that fires it.
    pub fn new() -> (tokio::sync::watch::Sender<bool>, Cancel) {
        let (fire, signal) = tokio::sync::watch::channel(false);
        (fire, Cancel(signal))
    }

    /// Returns once the signal fires (never, if its sender is gone unfired).
    pub async fn cancelled(&self) {
        let mut signal = self.0.clone();
        if signal.wait_for(|fired| *fired).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A [`BlobStore`] to hand a call.
#[derive(Clone)]
pub struct Blobs(pub Arc<dyn BlobStore>);

impl std::fmt::Debug for Blobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Blobs")
    }
}

/// Keeps binary content beside the log, addressed by its SHA-256.
#[async_trait]
pub trait BlobStore: Send + Sync {
    /// Keeps `bytes`, whose SHA-256 is `digest` (hex).
    async fn keep(&self, digest: &str, bytes: &[u8]) -> Result<(), String>;
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
    /// It was given up when the turn was paused; whether it took effect
    /// is unknown, and it is not retried before the turn resumes.
    #[error("tool {tool} was cancelled: {reason}")]
    Cancelled {
        /// The tool.
        tool: String,
        /// Why.
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
            ToolError::Timeout { .. } | ToolError::Interrupted { .. } | ToolError::Cancelled { .. }
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
    /// The HTTP client of HTTP tools and checks.
    client: reqwest::Client,
    mcp: Vec<Arc<mcp::McpConnector>>,
}

impl Toolbox {
    /// Builds every tool of `specs`; a spec of kind `native` is refused
    /// (this process has no code for it: see [`Toolbox::with_native`]).
    pub fn from_specs(specs: &[ToolSpec]) -> Result<Toolbox, ToolError> {
        Toolbox::with_native(specs, Vec::new())
    }

    /// Builds every HTTP and command tool of `specs`, and takes each
    /// `native` one from `native` (a tool whose spec is the one `specs`
    /// declares under its name). A native spec without its tool, or a tool
    /// that `specs` does not declare as native (or declares otherwise), is
    /// refused, naming the tool: what runs is what the session recorded.
    pub fn with_native(
        specs: &[ToolSpec],
        native: Vec<Arc<dyn Tool>>,
    ) -> Result<Toolbox, ToolError> {
        let client = reqwest::Client::builder()
            .build()
            .map_err(|e| ToolError::Config {
                tool: "*".into(),
                reason: format!("cannot build HTTP client: {e}"),
            })?;
        Toolbox::build(specs, &[], native, client)
    }

    /// Every tool of `agent`: [`Toolbox::with_native`] for its own tools,
    /// and its pinned MCP tools, whose servers start when first needed.
    /// HTTP tools and checks send through `http`: the process's pool, so
    /// a session's toolbox keeps no connections of its own.
    pub fn for_agent(
        agent: &AgentSpec,
        native: Vec<Arc<dyn Tool>>,
        http: reqwest::Client,
    ) -> Result<Toolbox, ToolError> {
        Toolbox::build(&agent.tools, &agent.mcp, native, http)
    }

    fn build(
        specs: &[ToolSpec],
        servers: &[McpServerSpec],
        native: Vec<Arc<dyn Tool>>,
        client: reqwest::Client,
    ) -> Result<Toolbox, ToolError> {
        let connectors: HashMap<&str, Arc<mcp::McpConnector>> = servers
            .iter()
            .map(|s| (s.name.as_str(), Arc::new(mcp::McpConnector::new(s.clone()))))
            .collect();
        let mut given: HashMap<String, Arc<dyn Tool>> = HashMap::new();
        for tool in native {
            let spec = tool.spec();
            if !specs
                .iter()
                .any(|s| s == spec && s.kind == ToolKind::Native)
            {
                return Err(ToolError::Config {
                    tool: spec.name.clone(),
                    reason: "the agent's spec does not declare this native tool as it is (name, description, parameters, effect and kind = \"native\" must match)".into(),
                });
            }
            given.insert(spec.name.clone(), tool);
        }
        let mut tools: HashMap<String, Arc<dyn Tool>> = HashMap::new();
        for spec in specs {
            let tool: Arc<dyn Tool> = match spec.kind {
                ToolKind::Http => Arc::new(HttpTool::new(spec.clone(), client.clone())?),
                ToolKind::Command => Arc::new(CommandTool::new(spec.clone())?),
                ToolKind::Native => given.remove(&spec.name).ok_or_else(|| ToolError::Config {
                    tool: spec.name.clone(),
                    reason: "kind = \"native\" is code of a program that embeds mneme, handed to its runner; this process has none".into(),
                })?,
                ToolKind::Agent | ToolKind::Sleep => Arc::new(RuntimeTool(spec.clone())),
                ToolKind::Mcp => {
                    let server = spec.mcp.as_ref().map_or("", |m| m.server.as_str());
                    let connector = connectors.get(server).ok_or_else(|| ToolError::Config {
                        tool: spec.name.clone(),
                        reason: format!("its MCP server {server:?} is not declared"),
                    })?;
                    Arc::new(mcp::McpTool::new(spec.clone(), connector.clone()))
                }
            };
            tools.insert(spec.name.clone(), tool);
        }
        let mcp = connectors.into_values().collect();
        Ok(Toolbox { tools, client, mcp })
    }

    /// Starts every MCP server of the toolbox that `agent` has pinned tools
    /// of, and says for each what its list now differs in from the pinned
    /// one (empty: the same). Fails on a server that cannot start or list.
    pub async fn check_mcp(
        &self,
        agent: &AgentSpec,
    ) -> Result<Vec<(String, Vec<String>)>, mcp::McpError> {
        let mut report = Vec::new();
        for connector in &self.mcp {
            let spec = connector.spec();
            let pinned = agent.mcp_tools(&spec.name);
            let server = connector.server().await?;
            let listed = server.list_tools().await?;
            let now = spec.pin_offered(&listed).map_err(|reason| mcp::McpError {
                server: spec.label(),
                reason,
            })?;
            let changes = replay::mcp::tool_list_changes(&pinned, &now);
            report.push((spec.name.clone(), changes));
        }
        report.sort();
        Ok(report)
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Asks tool `name`'s check whether the call `ctx` with `args` took
    /// effect (see [`check`]; an MCP tool's `check_tool` is a tool of its
    /// server); `None` if it has no check or no such tool.
    pub async fn check(&self, name: &str, ctx: &CallContext, args: &str) -> Option<check::Checked> {
        let spec = self.get(name)?.spec();
        let Some((server, check_tool)) = spec
            .mcp
            .as_ref()
            .and_then(|m| Some((m.server.as_str(), m.check_tool.as_deref()?)))
        else {
            return check::check(spec, ctx, args, &self.client).await;
        };
        let Some(connector) = self.mcp.iter().find(|c| c.spec().name == server) else {
            let why = format!("its MCP server {server:?} is not declared");
            return Some(check::Checked::Unknown(why));
        };
        Some(mcp::check(connector, spec, check_tool, ctx, args).await)
    }
}

/// A tool of kind `agent` or `sleep`: its calls run a child session, or
/// put the session to sleep, which the runtime does (it owns the log);
/// called here, it refuses. It is in the toolbox so the tool is known by
/// name, like every other.
struct RuntimeTool(ToolSpec);

#[async_trait]
impl Tool for RuntimeTool {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    async fn call(&self, _ctx: &CallContext, _args: &str) -> Result<String, ToolError> {
        Err(ToolError::Config {
            tool: self.0.name.clone(),
            reason:
                "kind = \"agent\" and kind = \"sleep\" are run by the runtime, which owns the log"
                    .into(),
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use replay::spec::Effect;

    struct Echo(ToolSpec);

    #[async_trait]
    impl Tool for Echo {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        async fn call(&self, _ctx: &CallContext, args: &str) -> Result<String, ToolError> {
            Ok(args.to_string())
        }
    }

    fn native(name: &str, effect: Effect) -> ToolSpec {
        let toml = format!(
            "name = \"{name}\"\ndescription = \"d\"\nkind = \"native\"\neffect = \"{effect}\"\nparameters = {{ type = \"object\" }}"
        );
        toml::from_str(&toml).unwrap()
    }

    #[test]
    fn a_native_tool_runs_only_as_the_spec_declares_it() {
        let specs = [native("echo", Effect::ReadOnly)];
        let declared = Arc::new(Echo(specs[0].clone()));
        let toolbox = Toolbox::with_native(&specs, vec![declared]).unwrap();
        assert!(toolbox.get("echo").is_some());
        // Without its code: refused, naming the tool.
        let missing = Toolbox::from_specs(&specs).err().unwrap().to_string();
        assert!(
            missing.contains("echo") && missing.contains("embeds mneme"),
            "{missing}"
        );
        // Code the spec declares otherwise (another effect): refused.
        let other = Arc::new(Echo(native("echo", Effect::SideEffect)));
        let refused = Toolbox::with_native(&specs, vec![other])
            .err()
            .unwrap()
            .to_string();
        assert!(refused.contains("does not declare"), "{refused}");
    }
}
