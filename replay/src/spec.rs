//! The agent spec: model, system prompt and tools with their declared effects.
//!
//! A session records the spec it started with (in `SessionStarted`), so a
//! resume runs with the tools and effects the session was started with, not
//! with whatever the agent file says today. Secrets are never part of a spec:
//! only the name of the environment variable that holds one.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What running a tool does to the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Reads only: running it again is harmless.
    ReadOnly,
    /// Writes, but running it again with the same arguments changes nothing more.
    Idempotent,
    /// Changes the world each time it runs (a charge, an email).
    SideEffect,
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Effect::ReadOnly => "read_only",
            Effect::Idempotent => "idempotent",
            Effect::SideEffect => "side_effect",
        })
    }
}

/// How a tool is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// An HTTP request; the arguments are the JSON body (query string for GET).
    Http,
    /// A local command; the arguments arrive as JSON on stdin.
    Command,
}

/// One tool the agent may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// Name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// How it runs.
    pub kind: ToolKind,
    /// Its effect on the world.
    pub effect: Effect,
    /// JSON schema of its arguments.
    #[serde(default = "empty_object_schema")]
    pub parameters: serde_json::Value,
    /// Whether a retry with the same idempotency key is safe. Defaults to
    /// true for HTTP tools and false for command tools.
    #[serde(default)]
    pub honours_idempotency_key: Option<bool>,
    /// Per-call timeout in seconds (default 30).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Whether each call waits for a person's approval before it runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_approval: bool,
    /// HTTP method (HTTP tools; default POST).
    #[serde(default)]
    pub method: Option<String>,
    /// URL (HTTP tools).
    #[serde(default)]
    pub url: Option<String>,
    /// Program and arguments (command tools).
    #[serde(default)]
    pub command: Option<Vec<String>>,
}

fn empty_object_schema() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// Default per-call timeout of a tool.
pub const DEFAULT_TOOL_TIMEOUT_SECS: u64 = 30;

impl ToolSpec {
    /// Whether a started-but-unfinished call may be run again with its key.
    pub fn honours_key(&self) -> bool {
        self.honours_idempotency_key
            .unwrap_or(self.kind == ToolKind::Http)
    }

    /// Whether an unfinished call of this tool may run again after a crash.
    pub fn safe_to_rerun(&self) -> bool {
        self.effect != Effect::SideEffect || self.honours_key()
    }

    /// Per-call timeout.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_secs.unwrap_or(DEFAULT_TOOL_TIMEOUT_SECS))
    }

    fn validate(&self) -> Result<(), String> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "tool name {:?} must be non-empty ASCII letters, digits, '_' or '-'",
                self.name
            ));
        }
        match self.kind {
            ToolKind::Http if self.url.as_deref().unwrap_or("").is_empty() => {
                Err(format!("tool {:?}: kind = \"http\" needs a url", self.name))
            }
            ToolKind::Command if self.command.as_ref().is_none_or(|c| c.is_empty()) => Err(
                format!("tool {:?}: kind = \"command\" needs a command", self.name),
            ),
            _ => Ok(()),
        }
    }
}

/// Which model serves the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// `openai` (any OpenAI-compatible chat completions server) or `scripted`.
    pub provider: String,
    /// Base URL of the server, up to and including `/v1`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Model name sent to the server.
    #[serde(default)]
    pub model: String,
    /// Name of the environment variable that holds the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// File of scripted replies (`scripted` provider).
    #[serde(default)]
    pub script: Option<String>,
    /// Sampling temperature, sent when given.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Request timeout in seconds (default 120).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Whether requests carry the session id as `prompt_cache_key` (OpenAI's
    /// prefix-cache routing hint; default true). Turn off for servers that
    /// refuse unknown fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<bool>,
    /// The model's context window, in tokens (for reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// The model's shape, to estimate the KV cache a prompt occupies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<KvShape>,
    /// Price of a million prompt tokens, for cost totals.
    #[serde(default)]
    pub input_cost_per_mtok: Option<f64>,
    /// Price of a million completion tokens, for cost totals.
    #[serde(default)]
    pub output_cost_per_mtok: Option<f64>,
}

/// What a model's KV cache holds per token: 2 (K and V) × layers × KV heads
/// × head dimension × bytes per value (about 0.5 MB for a 7B MHA model in
/// 16-bit, a quarter of that with grouped-query attention).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvShape {
    /// Transformer layers.
    pub layers: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Dimension of a head.
    pub head_dim: u64,
    /// Bytes per value (2 for fp16/bf16).
    pub dtype_bytes: u64,
}

impl KvShape {
    /// KV-cache bytes per token.
    pub fn bytes_per_token(&self) -> u64 {
        2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes
    }
}

/// An agent: its model, system prompt and tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Name of the agent.
    pub name: String,
    /// System prompt, the stable start of every prompt.
    #[serde(default)]
    pub system: String,
    /// The model.
    pub model: ModelSpec,
    /// The tools, in the order they are offered to the model.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
}

impl AgentSpec {
    /// Checks what serde cannot: providers, tool names, per-kind settings.
    pub fn validate(&self) -> Result<(), String> {
        match self.model.provider.as_str() {
            "openai" if self.model.base_url.is_none() => {
                Err("[model] provider = \"openai\" needs base_url".to_string())
            }
            "scripted" if self.model.script.is_none() => {
                Err("[model] provider = \"scripted\" needs script (a file of replies)".to_string())
            }
            "openai" | "scripted" => Ok(()),
            other => Err(format!(
                "[model] provider {other:?} is unknown: expected \"openai\" or \"scripted\""
            )),
        }?;
        let mut seen = std::collections::HashSet::new();
        for tool in &self.tools {
            tool.validate()?;
            if !seen.insert(tool.name.as_str()) {
                return Err(format!("tool {:?} is defined twice", tool.name));
            }
        }
        Ok(())
    }

    /// The tool called `name`, if the agent has it.
    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }
}
