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
    /// Code of the program that embeds mneme (a Rust type implementing
    /// `tools::Tool`), handed to the runner with the session's tools; the
    /// `mneme` binary has none to run.
    Native,
    /// A tool of an MCP server (`[[mcp]]`), pinned from its `tools/list`
    /// when the session started; never written in `[[tools]]`.
    Mcp,
    /// Another agent (`agent = "child.toml"`): a call starts or continues
    /// a child session with the call's `message` as its user message, and
    /// the child's answer is the call's result (run by the runtime, which
    /// owns the log; see `runtime::subagent`).
    Agent,
    /// Durable sleep, run by the runtime: a call (`{"seconds": N}`,
    /// `{"until": "<RFC 3339>"}` or `{"event": NAME, "timeout_seconds": N}`)
    /// records when or on what the session wakes, and the turn ends with
    /// the session sleeping; nothing holds a thread or a lease meanwhile.
    Sleep,
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
    /// How long a call waits for approval (`24h`, `90s`: see
    /// [`parse_window`]); past it, the call is denied as expired and the
    /// model told. Only with `requires_approval`. Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout: Option<String>,
    /// HTTP method (HTTP tools; default POST).
    #[serde(default)]
    pub method: Option<String>,
    /// URL (HTTP tools).
    #[serde(default)]
    pub url: Option<String>,
    /// Program and arguments (command tools).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Environment variables a command tool gets from mneme's environment,
    /// besides PATH, HOME, LANG and its `MNEME_*` call variables; every other
    /// variable (API keys, the daemon's token) is withheld.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Bytes of a call's output kept (default [`DEFAULT_MAX_OUTPUT_BYTES`]);
    /// the rest is dropped, and the model is told how much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// The MCP server and tool it was pinned from (kind `mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<crate::mcp::McpOrigin>,
    /// An HTTP request that tells whether a call's effect happened, for a
    /// call interrupted in flight (`{key}` and `{args.NAME}` are filled in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<HttpCheck>,
    /// A program that tells whether a call's effect happened (exit 0 with
    /// the result on stdout: applied; exit 3: not applied), with the same
    /// placeholders, environment and input as the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_command: Option<Vec<String>>,
    /// The agent file a tool of kind `agent` runs, as written (relative to
    /// the file that names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The spec of that agent, pinned when the parent's session starts
    /// (the loader fills it in from `agent`): what every child session of
    /// this tool records as its own, wherever and whenever it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_spec: Option<Box<AgentSpec>>,
}

/// The arguments mneme offers the model for a tool of kind `agent` when
/// the agent file gives none: one string, `message`, the child's user
/// message.
pub fn agent_parameters() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "message": {
                "type": "string",
                "description": "What to ask the sub-agent: its task, with everything it needs to know."
            }
        },
        "required": ["message"]
    })
}

/// The arguments mneme offers the model for a tool of kind `sleep` when
/// the agent file gives none.
pub fn sleep_parameters() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "seconds": {"type": "number", "description": "Wake after this many seconds."},
            "until": {"type": "string", "description": "Wake at this time (RFC 3339, e.g. 2026-12-03T09:00:00Z)."},
            "event": {"type": "string", "description": "Wake when this event is delivered (a webhook, a person)."},
            "timeout_seconds": {"type": "number", "description": "With event: give up waiting after this many seconds."}
        }
    })
}

/// What a tool of kind `sleep` tells the model it does, when the agent
/// file does not say.
pub const SLEEP_DESCRIPTION: &str = "Sleep durably: {\"seconds\": N} waits N seconds, \
{\"until\": \"<RFC 3339>\"} waits until that time, {\"event\": \"NAME\", \"timeout_seconds\": N} \
waits until the event NAME is delivered (or the timeout passes). The result says when and why you woke.";

/// The longest a call of a tool of kind `sleep` may sleep or wait: a year.
pub const MAX_SLEEP_SECONDS: u64 = 366 * 24 * 3600;

/// How deep sub-agents may nest (a parent's agent tool is depth 1).
pub const MAX_AGENT_DEPTH: usize = 8;

/// An HTTP check: answers 200 with `{"applied": true, "result": ...}` or
/// `{"applied": false}`; 404 means not applied; anything else, unknown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpCheck {
    /// HTTP method (default GET).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// URL, with placeholders.
    pub url: String,
}

fn empty_object_schema() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// Default per-call timeout of a tool.
pub const DEFAULT_TOOL_TIMEOUT_SECS: u64 = 30;
/// Default bytes of a tool call's output kept.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1 << 20;
/// Most bytes of a tool call's output a spec may keep: escaped as JSON text
/// (up to 6 bytes a byte), the output must still fit in one record of the
/// log (16 MiB).
pub const MAX_OUTPUT_BYTES_LIMIT: u64 = 2 << 20;
/// Default bytes of a model server's response read before it is refused.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 8 << 20;
/// Most bytes of a response a spec may read: the reply (its text and
/// arguments, never longer than the response) must fit in one record.
pub const MAX_RESPONSE_BYTES_LIMIT: u64 = 15 << 20;
/// Default model request timeout.
pub const DEFAULT_MODEL_TIMEOUT_SECS: u64 = 120;
/// Default seconds to connect to a model server, TLS handshake included.
pub const DEFAULT_CONNECT_TIMEOUT_SECS: u64 = 10;
/// HTTP methods an HTTP tool may use.
pub const HTTP_METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE"];

impl ToolSpec {
    /// Whether a started-but-unfinished call may be run again with its key.
    pub fn honours_key(&self) -> bool {
        // An agent call's key names its child session: run again, it
        // continues that session, whose own calls follow their own rules.
        self.kind == ToolKind::Agent
            || self
                .honours_idempotency_key
                .unwrap_or(self.kind == ToolKind::Http)
    }

    /// Whether the tool declares a check (`check` or `check_command`, or
    /// for an MCP tool its policy's `check_tool`).
    pub fn has_check(&self) -> bool {
        self.check.is_some()
            || self.check_command.is_some()
            || self.mcp.as_ref().is_some_and(|m| m.check_tool.is_some())
    }

    /// Whether an unfinished call of this tool may run again after a crash.
    pub fn safe_to_rerun(&self) -> bool {
        self.effect != Effect::SideEffect || self.honours_key()
    }

    /// Per-call timeout.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_secs.unwrap_or(DEFAULT_TOOL_TIMEOUT_SECS))
    }

    /// How long a call waits for approval before it is denied as expired
    /// (`approval_timeout`), if the tool sets a limit.
    pub fn approval_timeout(&self) -> Option<std::time::Duration> {
        parse_window(self.approval_timeout.as_deref()?).ok()
    }

    /// Bytes of a call's output kept.
    pub fn max_output_bytes(&self) -> u64 {
        self.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES)
    }

    /// The HTTP method (HTTP tools), upper case; POST when not given.
    pub fn http_method(&self) -> String {
        self.method
            .as_deref()
            .unwrap_or("POST")
            .to_ascii_uppercase()
    }

    fn validate(&self) -> Result<(), String> {
        if !is_safe_name(&self.name) {
            return Err(format!(
                "tool name {:?} must be 1 to 64 ASCII letters, digits, '_' or '-', not starting with '-'",
                self.name
            ));
        }
        let tool = |reason: String| format!("tool {:?}: {reason}", self.name);
        positive("timeout_secs", self.timeout_secs).map_err(tool)?;
        within(
            "max_output_bytes",
            self.max_output_bytes,
            MAX_OUTPUT_BYTES_LIMIT,
        )
        .map_err(tool)?;
        if let Some(window) = &self.approval_timeout {
            parse_window(window).map_err(|e| tool(format!("approval_timeout {e}")))?;
            if !self.requires_approval {
                return Err(tool(
                    "approval_timeout is given, but the tool does not set requires_approval = true"
                        .into(),
                ));
            }
        }
        if let Some(bad) = self.env.iter().find(|v| !is_env_name(v)) {
            return Err(tool(format!(
                "env names {bad:?}, which is not a variable name"
            )));
        }
        self.validate_check().map_err(tool)?;
        let names_an_agent = self.agent.is_some() || self.agent_spec.is_some();
        if names_an_agent && self.kind != ToolKind::Agent {
            return Err(tool("agent is only for kind = \"agent\"".into()));
        }
        match self.kind {
            ToolKind::Http => {
                let url = self.url.as_deref().unwrap_or("");
                if url.is_empty() {
                    return Err(tool("kind = \"http\" needs a url".into()));
                }
                check_http_url("url", url).map_err(tool)?;
                let method = self.http_method();
                if !HTTP_METHODS.contains(&method.as_str()) {
                    return Err(tool(format!(
                        "method {method:?} is not one of {}",
                        HTTP_METHODS.join(", ")
                    )));
                }
                Ok(())
            }
            ToolKind::Command => match self.command.as_deref() {
                Some(command) if !command.is_empty() => {
                    check_program("command", command).map_err(tool)
                }
                _ => Err(tool("kind = \"command\" needs a command".into())),
            },
            ToolKind::Mcp if self.mcp.is_none() => Err(tool(
                "kind = \"mcp\" tools come from an [[mcp]] server's list, not from [[tools]]"
                    .into(),
            )),
            ToolKind::Agent => self.validate_agent().map_err(tool),
            ToolKind::Sleep => self.validate_sleep().map_err(tool),
            ToolKind::Native | ToolKind::Mcp => Ok(()),
        }
    }

    /// A tool of kind `agent`: a pinned child spec, valid, and nothing of
    /// the other kinds (a URL, a command, a check: the child's own tools
    /// say what it does).
    fn validate_agent(&self) -> Result<(), String> {
        if self.url.is_some() || self.command.is_some() || self.has_check() {
            return Err(
                "kind = \"agent\" takes agent = \"file.toml\", not a url, command or check".into(),
            );
        }
        let child = self.agent_spec.as_ref().ok_or_else(|| {
            "kind = \"agent\" needs agent = \"file.toml\" (the child agent's file)".to_string()
        })?;
        if child.has_sleep_tools() {
            return Err(format!(
                "agent {:?} has a tool of kind \"sleep\": a sub-agent's turn is its parent's, and cannot sleep",
                child.name
            ));
        }
        child
            .validate()
            .map_err(|e| format!("agent {:?}: {e}", child.name))
    }

    /// A tool of kind `sleep`: run by mneme, with no effect on the world,
    /// nothing to run it with and no approval to wait for.
    fn validate_sleep(&self) -> Result<(), String> {
        if self.url.is_some() || self.command.is_some() || self.has_check() {
            return Err(
                "kind = \"sleep\" is run by mneme: it takes no url, command or check".into(),
            );
        }
        if self.effect != Effect::ReadOnly {
            return Err(
                "kind = \"sleep\" has no effect on the world: effect = \"read_only\"".into(),
            );
        }
        if self.requires_approval {
            return Err("kind = \"sleep\" cannot require approval".into());
        }
        Ok(())
    }

    /// The child spec of a tool of kind `agent` (pinned by the loader).
    pub fn child_spec(&self) -> Option<&AgentSpec> {
        match self.kind {
            ToolKind::Agent => self.agent_spec.as_deref(),
            _ => None,
        }
    }
}

impl ToolSpec {
    fn validate_check(&self) -> Result<(), String> {
        match (&self.check, &self.check_command) {
            (Some(_), Some(_)) => Err("give check or check_command, not both".into()),
            (Some(check), None) => {
                // The placeholders are filled in per call; the rest must
                // be a URL a tool may call.
                check_http_url("check.url", &check.url.replace(['{', '}'], ""))?;
                let method = check.method.as_deref().unwrap_or("GET");
                match HTTP_METHODS.contains(&method) {
                    true => Ok(()),
                    false => Err(format!(
                        "check.method {method:?} is not one of {}",
                        HTTP_METHODS.join(", ")
                    )),
                }
            }
            (None, Some(command)) if command.is_empty() => {
                Err("check_command is empty: give a program and its arguments".into())
            }
            (None, Some(command)) => check_program("check_command", command),
            (None, None) => Ok(()),
        }
    }
}

/// Refuses a program (`command`'s first word) given as a relative path
/// (`./charge.sh`, `bin/x`): it would name another file depending on the
/// directory mneme starts in. An agent file's are anchored to the file when
/// it is loaded; a name without a slash is looked up on PATH.
pub fn check_program(field: &str, command: &[String]) -> Result<(), String> {
    match command.first() {
        Some(program) if program.contains('/') && !program.starts_with('/') => Err(format!(
            "{field} program {program:?} is a relative path, which would run whatever file \
             that path names from the directory mneme starts in: give an absolute path, or a \
             name found on PATH"
        )),
        _ => Ok(()),
    }
}

/// A window of time as people write it: a whole number and a unit, `s`,
/// `m`, `h` or `d` (`30d`, `12h`, `90s`).
pub fn parse_window(text: &str) -> Result<std::time::Duration, String> {
    let refuse =
        || format!("{text:?}: expected a whole number and a unit (s, m, h or d), such as 30d");
    let unit = text.chars().last().ok_or_else(refuse)?;
    let seconds = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(refuse()),
    };
    let count: u64 = text[..text.len() - 1].parse().map_err(|_| refuse())?;
    match count.checked_mul(seconds) {
        Some(0) | None => Err(refuse()),
        Some(total) => Ok(std::time::Duration::from_secs(total)),
    }
}

/// `window` as [`parse_window`] reads it, in its largest whole unit.
pub fn window(window: std::time::Duration) -> String {
    let seconds = window.as_secs();
    [(86_400, "d"), (3600, "h"), (60, "m")]
        .into_iter()
        .find(|(unit, _)| seconds >= *unit && seconds.is_multiple_of(*unit))
        .map_or(format!("{seconds}s"), |(unit, name)| {
            format!("{}{name}", seconds / unit)
        })
}

/// Whether `name` is 1 to 64 ASCII letters, digits, `_` or `-`, not
/// starting with `-`: safe in a URL path, a file name, a command line (never
/// a flag) and a terminal.
pub fn is_safe_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Refuses a setting given as zero.
fn positive<T: PartialEq + Default>(name: &str, value: Option<T>) -> Result<(), String> {
    match value {
        Some(v) if v == T::default() => Err(format!("{name} must be greater than 0")),
        _ => Ok(()),
    }
}

/// Refuses a size given as zero or above `max` (what one record of the log
/// can hold).
fn within(name: &str, value: Option<u64>, max: u64) -> Result<(), String> {
    positive(name, value)?;
    match value {
        Some(v) if v > max => Err(format!(
            "{name} = {v} is above {max}: what is kept must fit in one record of the log"
        )),
        _ => Ok(()),
    }
}

/// Refuses a URL that is not `http://` or `https://` with a host, or that
/// carries user information: specs are recorded in the log, and credentials
/// must stay out of it.
pub(crate) fn check_http_url(field: &str, text: &str) -> Result<(), String> {
    let refuse = |why: String| Err(format!("{field} {:?}: {why}", redact_url(text)));
    let url = match url::Url::parse(text) {
        Ok(url) => url,
        Err(e) => return refuse(format!("not a URL ({e})")),
    };
    if !matches!(url.scheme(), "http" | "https") {
        return refuse(format!(
            "scheme {:?}: only http and https are allowed",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return refuse("has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return refuse(
            "carries user information: the spec is recorded in the log, so credentials \
             must not be in it (give a model's key with api_key_env)"
                .into(),
        );
    }
    Ok(())
}

/// `url` with any user information replaced by `***`, fit to print.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// Which model serves the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// `openai` (any OpenAI-compatible chat completions server),
    /// `openai-responses` (OpenAI's Responses API, stateless), `anthropic`
    /// (Anthropic's Messages API) or `scripted`.
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
    /// Most tokens a reply may have (`max_tokens` in the request; the
    /// Responses API's `max_output_tokens`), sent when given; after a reply
    /// cut off in the middle of its tool calls, the next request allows
    /// twice as many, once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The same for OpenAI's reasoning models (`max_completion_tokens`),
    /// sent when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    /// Whether replies are streamed (server-sent events): text reaches
    /// `mneme run` and the daemon's clients as it is generated; only the
    /// whole reply is recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Request timeout in seconds (default 120).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Seconds to connect to the server, TLS handshake included (default
    /// [`DEFAULT_CONNECT_TIMEOUT_SECS`]; at most `timeout_secs`): a server
    /// that is down, or a plain-HTTP port named with `https://`, fails
    /// fast instead of after the whole request timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_secs: Option<u64>,
    /// Whether requests carry the session id as `prompt_cache_key` (OpenAI's
    /// prefix-cache routing hint; default true). Turn off for servers that
    /// refuse unknown fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<bool>,
    /// Whether a tenant's session sends its tenant's salt as `cache_salt`
    /// (vLLM's prefix-cache isolation: one tenant's cached prefixes cannot
    /// be probed by another's timing) with its chat-completions requests
    /// (default true). Turn off for servers that refuse unknown fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<bool>,
    /// The model's context window, in tokens: shown in reports, and the
    /// conversation is compacted as it nears it.
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
    /// Price of a million prompt tokens read from the server's cache
    /// (default: `input_cost_per_mtok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_cost_per_mtok: Option<f64>,
    /// Price of a million prompt tokens written to the server's cache
    /// (Anthropic; default: `input_cost_per_mtok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_cost_per_mtok: Option<f64>,
    /// Bytes of a response read before the server is cut off and the reply
    /// refused (default [`DEFAULT_MAX_RESPONSE_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    /// Whether the reasoning a chat-completions server returns beside the
    /// reply (`reasoning_content`) is sent back with it in later requests.
    /// Recorded either way.
    #[serde(default, skip_serializing_if = "Reasoning::is_default")]
    pub reasoning: Reasoning,
    /// Anthropic's extended thinking: the tokens the model may think with
    /// (at least [`MIN_THINKING_BUDGET_TOKENS`], under `max_tokens`); its
    /// thinking blocks are recorded and sent back exactly as received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_budget_tokens: Option<u64>,
    /// Anthropic's interleaved thinking (its `interleaved-thinking` beta):
    /// the model may think between tool calls, and each thinking block goes
    /// back where it stood. The budget may then exceed `max_tokens` (it
    /// spans the whole turn).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interleaved_thinking: bool,
}

/// The least thinking budget Anthropic's API takes.
pub const MIN_THINKING_BUDGET_TOKENS: u64 = 1024;

/// What becomes of the reasoning (`reasoning_content`) a chat-completions
/// server returned with a reply (`[model] reasoning`). Whichever it is,
/// the reasoning is recorded with the reply, and the prompt is rebuilt from
/// the record by the same rule, byte for byte, after any crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reasoning {
    /// Not sent back: what llama.cpp's, vLLM's and DeepSeek's documentation
    /// ask (DeepSeek refuses a request that carries it; chat templates such
    /// as Qwen3's drop it from earlier turns).
    #[default]
    Drop,
    /// Sent back as `reasoning_content` on the assistant message it came
    /// with, as received: for a server whose template reads it.
    Keep,
}

impl Reasoning {
    fn is_default(&self) -> bool {
        *self == Reasoning::Drop
    }
}

/// Where Anthropic's Messages API is when the spec names no `base_url`.
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com/v1";

/// Where OpenAI's Responses API is when the spec names no `base_url`.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// The provider that speaks OpenAI's Responses API.
pub const OPENAI_RESPONSES: &str = "openai-responses";

impl ModelSpec {
    /// Whether the model is reached through Anthropic's Messages API.
    pub fn is_anthropic(&self) -> bool {
        self.provider == "anthropic"
    }

    /// Whether the model is reached through OpenAI's Responses API
    /// (`provider = "openai-responses"`).
    pub fn is_responses(&self) -> bool {
        self.provider == OPENAI_RESPONSES
    }

    /// Base URL of the server, up to and including `/v1`.
    pub fn base_url(&self) -> &str {
        match &self.base_url {
            Some(url) => url,
            None if self.is_anthropic() => ANTHROPIC_BASE_URL,
            None if self.is_responses() => OPENAI_BASE_URL,
            None => "",
        }
    }

    /// Whether replies are streamed.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Request timeout.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_secs.unwrap_or(DEFAULT_MODEL_TIMEOUT_SECS))
    }

    /// Time to connect (TLS handshake included).
    pub fn connect_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.connect_timeout_secs
                .unwrap_or(DEFAULT_CONNECT_TIMEOUT_SECS),
        )
    }

    /// Bytes of a response read at most.
    pub fn max_response_bytes(&self) -> u64 {
        self.max_response_bytes
            .unwrap_or(DEFAULT_MAX_RESPONSE_BYTES)
    }

    /// `thinking_budget_tokens` as Anthropic's API takes it: with its
    /// provider, at least [`MIN_THINKING_BUDGET_TOKENS`], under the reply's
    /// `max_tokens` unless interleaved, and no `temperature` but 1 (the API
    /// refuses others); `interleaved_thinking` only with a budget.
    fn validate_thinking(&self) -> Result<(), String> {
        let Some(budget) = self.thinking_budget_tokens else {
            return match self.interleaved_thinking {
                true => Err("interleaved_thinking needs thinking_budget_tokens".into()),
                false => Ok(()),
            };
        };
        let max_tokens = self
            .max_tokens
            .unwrap_or(crate::anthropic::DEFAULT_MAX_TOKENS);
        if !self.is_anthropic() {
            Err("thinking_budget_tokens is read only with provider = \"anthropic\"".into())
        } else if budget < MIN_THINKING_BUDGET_TOKENS {
            Err(format!(
                "thinking_budget_tokens = {budget}: at least {MIN_THINKING_BUDGET_TOKENS}"
            ))
        } else if budget >= max_tokens && !self.interleaved_thinking {
            Err(format!(
                "thinking_budget_tokens = {budget}: must be under max_tokens ({max_tokens})"
            ))
        } else if self.temperature.is_some_and(|t| t != 1.0) {
            Err("temperature: with thinking_budget_tokens, leave it out (or 1)".into())
        } else {
            Ok(())
        }
    }

    /// The keys the Responses API has no place for, refused by name with
    /// `provider = "openai-responses"`: its one reply limit is
    /// `max_output_tokens` (given as `max_tokens`), and its reasoning items
    /// are always sent back, so chat completions' `reasoning` rule does not
    /// apply.
    fn validate_responses(&self) -> Result<(), String> {
        if !self.is_responses() {
            return Ok(());
        }
        if self.max_completion_tokens.is_some() {
            return Err("max_completion_tokens is chat completions'; with provider = \"openai-responses\" give max_tokens (sent as max_output_tokens)".into());
        }
        if self.reasoning != Reasoning::default() {
            return Err("reasoning is read only by chat completions (reasoning_content); with provider = \"openai-responses\" every reasoning item is sent back as received".into());
        }
        Ok(())
    }

    /// A server that picks the model by name must be given one: Anthropic's
    /// API and OpenAI's refuse a request without it (a local server such
    /// as llama.cpp's serves the one model it loaded, whatever the name).
    fn validate_model_name(&self) -> Result<(), String> {
        if !self.model.trim().is_empty() {
            return Ok(());
        }
        if self.is_responses() {
            return Err(
                "provider = \"openai-responses\" needs model (e.g. model = \"gpt-5-mini\")".into(),
            );
        }
        let openai = self.provider == "openai"
            && url::Url::parse(self.base_url())
                .is_ok_and(|u| u.host_str() == Some("api.openai.com"));
        match (self.is_anthropic(), openai) {
            (true, _) => Err(
                "provider = \"anthropic\" needs model (e.g. model = \"claude-sonnet-4-5\")".into(),
            ),
            (_, true) => Err(format!(
                "{} needs model (e.g. model = \"gpt-4.1-mini\")",
                self.base_url()
            )),
            _ => Ok(()),
        }
    }

    fn validate(&self) -> Result<(), String> {
        let model = |reason: String| format!("[model] {reason}");
        match self.provider.as_str() {
            "openai" => match &self.base_url {
                None => Err("provider = \"openai\" needs base_url".to_string()),
                Some(url) => check_http_url("base_url", url),
            },
            "anthropic" | OPENAI_RESPONSES => check_http_url("base_url", self.base_url()),
            "scripted" if self.script.is_none() => {
                Err("provider = \"scripted\" needs script (a file of replies)".to_string())
            }
            "scripted" => Ok(()),
            other => Err(format!(
                "provider {other:?} is unknown: expected \"openai\", \"openai-responses\", \"anthropic\" or \"scripted\""
            )),
        }
        .map_err(model)?;
        self.validate_model_name().map_err(model)?;
        positive("timeout_secs", self.timeout_secs).map_err(model)?;
        positive("connect_timeout_secs", self.connect_timeout_secs).map_err(model)?;
        let numbers = [
            ("temperature", self.temperature),
            ("input_cost_per_mtok", self.input_cost_per_mtok),
            ("output_cost_per_mtok", self.output_cost_per_mtok),
            (
                "cached_input_cost_per_mtok",
                self.cached_input_cost_per_mtok,
            ),
            ("cache_write_cost_per_mtok", self.cache_write_cost_per_mtok),
        ];
        if let Some((name, value)) = numbers
            .into_iter()
            .find_map(|(name, v)| v.filter(|v| !v.is_finite() || *v < 0.0).map(|v| (name, v)))
        {
            return Err(model(format!(
                "{name} = {value}: must be a finite number, 0 or more"
            )));
        }
        positive("max_tokens", self.max_tokens).map_err(model)?;
        positive("max_completion_tokens", self.max_completion_tokens).map_err(model)?;
        self.validate_thinking().map_err(model)?;
        self.validate_responses().map_err(model)?;
        within(
            "max_response_bytes",
            self.max_response_bytes,
            MAX_RESPONSE_BYTES_LIMIT,
        )
        .map_err(model)?;
        if let Some(kv) = &self.kv {
            if kv.checked_bytes_per_token().is_none_or(|b| b == 0) {
                return Err(model(format!(
                    "kv {kv:?}: every dimension must be greater than 0 and their product fit in 64 bits"
                )));
            }
        }
        Ok(())
    }
}

/// Budgets of one turn and bounds on what one reply may ask for. A turn is
/// what follows a user message (or a resume that extends the budget).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Model requests in one turn (default [`DEFAULT_MAX_STEPS_PER_TURN`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps_per_turn: Option<u64>,
    /// Tool calls the model may make in one turn (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls_per_turn: Option<u64>,
    /// Cost of the model requests of one turn, in the spec's prices
    /// (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_per_turn: Option<f64>,
    /// Cost of the model requests of every session of this agent (of its
    /// tenant) in one UTC day, in the spec's prices (default: no limit):
    /// a request whose worst case would cross it is not sent, and its
    /// session pauses until the day ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_per_day: Option<f64>,
    /// Tool calls one reply may make (default [`DEFAULT_MAX_CALLS_PER_REPLY`]);
    /// a reply with more is refused and the model told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls_per_reply: Option<u64>,
    /// Calls of one reply that run at once (default [`DEFAULT_MAX_PARALLEL_CALLS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel_calls: Option<u64>,
    /// Messages that arrived mid-turn and may wait to be delivered at once
    /// (default [`DEFAULT_MAX_WAITING_MESSAGES`]); more are refused, not
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting_messages: Option<u64>,
}

/// Default model requests in one turn.
pub const DEFAULT_MAX_STEPS_PER_TURN: u64 = 50;
/// Default tool calls one reply may make.
pub const DEFAULT_MAX_CALLS_PER_REPLY: u64 = 64;
/// Default calls of one reply that run at once.
pub const DEFAULT_MAX_PARALLEL_CALLS: u64 = 8;
/// Default messages that may wait, arrived mid-turn, to be delivered.
pub const DEFAULT_MAX_WAITING_MESSAGES: u64 = 16;

impl Limits {
    fn is_default(&self) -> bool {
        *self == Limits::default()
    }

    /// Model requests allowed in one turn.
    pub fn steps_per_turn(&self) -> u64 {
        self.max_steps_per_turn
            .unwrap_or(DEFAULT_MAX_STEPS_PER_TURN)
    }

    /// Tool calls one reply may make.
    pub fn calls_per_reply(&self) -> u64 {
        self.max_calls_per_reply
            .unwrap_or(DEFAULT_MAX_CALLS_PER_REPLY)
    }

    /// Calls of one reply that run at once.
    pub fn parallel_calls(&self) -> u64 {
        self.max_parallel_calls
            .unwrap_or(DEFAULT_MAX_PARALLEL_CALLS)
    }

    /// Messages that arrived mid-turn and may wait at once.
    pub fn waiting_messages(&self) -> u64 {
        self.max_waiting_messages
            .unwrap_or(DEFAULT_MAX_WAITING_MESSAGES)
    }

    fn validate(&self) -> Result<(), String> {
        let limits = |reason: String| format!("[limits] {reason}");
        positive("max_steps_per_turn", self.max_steps_per_turn).map_err(limits)?;
        positive("max_tool_calls_per_turn", self.max_tool_calls_per_turn).map_err(limits)?;
        positive("max_calls_per_reply", self.max_calls_per_reply).map_err(limits)?;
        positive("max_parallel_calls", self.max_parallel_calls).map_err(limits)?;
        positive("max_waiting_messages", self.max_waiting_messages).map_err(limits)?;
        for (name, cost) in [
            ("max_cost_per_turn", self.max_cost_per_turn),
            ("max_cost_per_day", self.max_cost_per_day),
        ] {
            match cost {
                Some(cost) if !(cost > 0.0 && cost.is_finite()) => {
                    return Err(limits(format!("{name} = {cost} must be a positive number")))
                }
                _ => {}
            }
        }
        Ok(())
    }
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
    /// KV-cache bytes per token (saturating; specs with a shape whose
    /// product overflows are refused).
    pub fn bytes_per_token(&self) -> u64 {
        self.checked_bytes_per_token().unwrap_or(u64::MAX)
    }

    /// KV-cache bytes per token, or `None` if the product overflows.
    pub fn checked_bytes_per_token(&self) -> Option<u64> {
        [self.layers, self.kv_heads, self.head_dim, self.dtype_bytes]
            .into_iter()
            .try_fold(2u64, u64::checked_mul)
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
    /// Budgets of a turn and bounds on a reply.
    #[serde(default, skip_serializing_if = "Limits::is_default")]
    pub limits: Limits,
    /// MCP servers whose tools the session pins when it starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp: Vec<crate::mcp::McpServerSpec>,
    /// What a message posted while a turn runs does.
    #[serde(default, skip_serializing_if = "MidTurn::is_default")]
    pub mid_turn_messages: MidTurn,
}

/// What a message that arrives while a turn of the session runs does
/// (`mid_turn_messages` in the agent file). Recorded whichever it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MidTurn {
    /// It waits, and opens a turn of its own once the running turn is
    /// answered.
    #[default]
    Queue,
    /// The running turn takes it at its next step (once the calls under
    /// way are done): the model is asked next with the message added.
    Interrupt,
    /// It is refused (recorded only; the API answers 409).
    Reject,
}

impl MidTurn {
    fn is_default(&self) -> bool {
        *self == MidTurn::Queue
    }

    /// Its name in agent files and answers.
    pub fn name(self) -> &'static str {
        match self {
            MidTurn::Queue => "queue",
            MidTurn::Interrupt => "interrupt",
            MidTurn::Reject => "reject",
        }
    }
}

impl AgentSpec {
    /// Checks what serde cannot: providers, tool names, per-kind settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty()
            || self.name.len() > 128
            || self.name.contains(char::is_control)
        {
            return Err(format!(
                "name {:?} must be 1 to 128 characters, none of them control characters",
                self.name
            ));
        }
        self.model.validate()?;
        self.limits.validate()?;
        let priced =
            self.model.input_cost_per_mtok.is_some() || self.model.output_cost_per_mtok.is_some();
        if self.limits.max_cost_per_day.is_some() && !priced {
            return Err("[limits] max_cost_per_day needs prices in [model] \
                 (input_cost_per_mtok, output_cost_per_mtok): without them every request costs 0"
                .into());
        }
        if self.limits.max_cost_per_turn.is_some() && !priced {
            return Err("[limits] max_cost_per_turn needs prices in [model] \
                 (input_cost_per_mtok, output_cost_per_mtok): without them every turn costs 0"
                .into());
        }
        if self.agent_depth() > MAX_AGENT_DEPTH {
            return Err(format!(
                "sub-agents nest {} deep, more than {MAX_AGENT_DEPTH}",
                self.agent_depth()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for tool in &self.tools {
            tool.validate()?;
            if !seen.insert(tool.name.as_str()) {
                return Err(format!("tool {:?} is defined twice", tool.name));
            }
            if let Some(origin) = &tool.mcp {
                if self.mcp_server(&origin.server).is_none() {
                    return Err(format!(
                        "tool {:?} comes from MCP server {:?}, which the spec does not declare",
                        tool.name, origin.server
                    ));
                }
            }
        }
        let mut servers = std::collections::HashSet::new();
        for server in &self.mcp {
            server.validate()?;
            if !servers.insert(server.name.as_str()) {
                return Err(format!("{} is declared twice", server.label()));
            }
        }
        Ok(())
    }

    /// The MCP server called `name`, if the agent has it.
    pub fn mcp_server(&self, name: &str) -> Option<&crate::mcp::McpServerSpec> {
        self.mcp.iter().find(|s| s.name == name)
    }

    /// The tools pinned from MCP server `server`.
    pub fn mcp_tools(&self, server: &str) -> Vec<&ToolSpec> {
        self.tools
            .iter()
            .filter(|t| t.mcp.as_ref().is_some_and(|m| m.server == server))
            .collect()
    }

    /// The spec with `server`'s pinned tools replaced by `tools` (where the
    /// first of the old ones stood, else at the end).
    pub fn with_mcp_tools(&self, server: &str, tools: &[ToolSpec]) -> AgentSpec {
        let mut spec = self.clone();
        let of_server = |t: &ToolSpec| t.mcp.as_ref().is_some_and(|m| m.server == server);
        let at = spec
            .tools
            .iter()
            .position(of_server)
            .unwrap_or(spec.tools.len());
        spec.tools.retain(|t| !of_server(t));
        let at = at.min(spec.tools.len());
        spec.tools.splice(at..at, tools.iter().cloned());
        spec
    }

    /// The tool called `name`, if the agent has it.
    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// Whether a tool of the spec is another agent (kind `agent`).
    pub fn has_agent_tools(&self) -> bool {
        self.tools.iter().any(|t| t.kind == ToolKind::Agent)
    }

    /// Whether a tool of the spec sleeps (kind `sleep`).
    pub fn has_sleep_tools(&self) -> bool {
        self.tools.iter().any(|t| t.kind == ToolKind::Sleep)
    }

    /// How deep the spec's sub-agents nest (0: it has none).
    pub fn agent_depth(&self) -> usize {
        (self.tools.iter())
            .filter_map(ToolSpec::child_spec)
            .map(|child| 1 + child.agent_depth())
            .max()
            .unwrap_or(0)
    }

    /// The spec a child session of this agent records, when its parent's
    /// turn has `remaining` of its budgets left: each budget the smaller of
    /// the child's own and the parent's rest (a child never spends more
    /// than its parent has left: budgets apply to the tree).
    pub fn bounded_by(&self, remaining: &Remaining) -> AgentSpec {
        let mut spec = self.clone();
        let steps = spec.limits.steps_per_turn().min(remaining.steps.max(1));
        spec.limits.max_steps_per_turn = Some(steps);
        let priced =
            spec.model.input_cost_per_mtok.is_some() || spec.model.output_cost_per_mtok.is_some();
        if let (Some(left), true) = (remaining.cost, priced) {
            let own = spec.limits.max_cost_per_turn.unwrap_or(f64::INFINITY);
            spec.limits.max_cost_per_turn = Some(own.min(left.max(f64::MIN_POSITIVE)));
        }
        spec
    }
}

/// What a turn has left of its budgets: model requests, and cost where
/// the spec limits it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Remaining {
    /// Model requests.
    pub steps: u64,
    /// Cost, if limited.
    pub cost: Option<f64>,
}
