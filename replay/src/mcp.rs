//! MCP servers in an agent spec, and the pure rules that turn a server's
//! tool list into the tools a session records (pins).
//!
//! A session's MCP tools are pinned: the `tools/list` answer it started
//! with becomes ordinary [`ToolSpec`]s (kind `mcp`) in its recorded spec, so
//! its prompts are rebuilt from the log, never from what a server says
//! today. Effects are local policy: the agent file decides, a server's
//! annotations only where the file opts in (`trust_annotations`).

use crate::spec::{Effect, ToolKind, ToolSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Separates a server's name from its tool's in the name the model sees.
pub const NAME_SEPARATOR: &str = "__";
/// Default per-call timeout of an MCP tool, and of starting a server.
pub const DEFAULT_MCP_TIMEOUT_SECS: u64 = 30;
/// Default bytes of one message a server may send before it is refused.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 8 << 20;
/// Most bytes of one message a spec may allow.
pub const MAX_MESSAGE_BYTES_LIMIT: u64 = 64 << 20;
/// Most tools one server may list.
pub const MAX_LISTED_TOOLS: usize = 512;

/// One MCP server of an agent (`[[mcp]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// Its name; the model sees its tools as `<name>__<tool>`.
    pub name: String,
    /// Program and arguments of a server spoken to over stdio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// URL of a server spoken to over Streamable HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP headers and the environment variables that hold their values
    /// (never the values: specs are recorded in the log).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers_env: BTreeMap<String, String>,
    /// Variables of mneme's environment a stdio server gets besides PATH,
    /// HOME and LANG; every other variable is withheld.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Effect of each of its tools that no policy names (default side_effect).
    #[serde(default = "side_effect")]
    pub effect: Effect,
    /// Whether the server drops a repeated call with the same idempotency
    /// key (default false: an interrupted side effect is in doubt).
    #[serde(default)]
    pub honours_idempotency_key: bool,
    /// Per-call timeout in seconds, also the time a server has to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Let the server's annotations (`readOnlyHint`, `idempotentHint`) set
    /// the effect of a tool no policy names, and `destructiveHint` make
    /// its calls wait for approval.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trust_annotations: bool,
    /// Only these tools are offered (the server's names); default all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expose: Option<Vec<String>>,
    /// `tools = ["a", "b"]` (offer only these) or `[mcp.tools]` (a policy
    /// per tool: an effect, or a table).
    #[serde(default, skip_serializing_if = "McpTools::is_empty")]
    pub tools: McpTools,
    /// Bytes of a call's output kept (default the tools' default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Bytes of one message from the server read before it is refused
    /// (default [`DEFAULT_MAX_MESSAGE_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<u64>,
    /// Where the agent file declared it (`file:line`), for errors; not
    /// recorded.
    #[serde(skip)]
    pub declared_at: Option<String>,
}

fn side_effect() -> Effect {
    Effect::SideEffect
}

/// The `tools` key of an `[[mcp]]` entry.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(untagged)]
pub enum McpTools {
    /// Not given: every tool, with the server's defaults.
    #[default]
    All,
    /// Offer only these.
    Only(Vec<String>),
    /// A policy per tool (every tool is offered unless `expose` says).
    Policies(BTreeMap<String, McpToolPolicy>),
}

impl McpTools {
    fn is_empty(&self) -> bool {
        matches!(self, McpTools::All)
    }
}

/// Local policy for one MCP tool: an effect, or a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum McpToolPolicy {
    /// Just its effect.
    Effect(Effect),
    /// Its settings.
    Table(McpToolSettings),
}

/// The settings a policy table may give one MCP tool.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolSettings {
    /// Its effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// Overrides the server's `honours_idempotency_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honours_idempotency_key: Option<bool>,
    /// Each call waits for a person's approval.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_approval: bool,
    /// How long a call waits for approval before it is denied as expired
    /// (`24h`; only with `requires_approval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout: Option<String>,
    /// Overrides the server's timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Another tool of the same server (its name there) that tells whether
    /// an interrupted call of this one took effect: asked with the call's
    /// arguments and idempotency key, it answers `{"applied": true,
    /// "result": ...}` or `{"applied": false}` (see `docs/guide/checks.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_tool: Option<String>,
}

/// Where a pinned MCP tool came from, recorded on its [`ToolSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpOrigin {
    /// The server (its `name` in the agent file).
    pub server: String,
    /// The tool's name on the server.
    pub tool: String,
    /// What decided its effect.
    pub effect_from: EffectSource,
    /// The server's annotations, as listed (shown, never obeyed unless
    /// trusted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<serde_json::Value>,
    /// The server's tool asked whether an interrupted call took effect
    /// (its name on the server; the policy's `check_tool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_tool: Option<String>,
}

/// What decided an MCP tool's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectSource {
    /// The agent file's `[mcp.tools]` policy.
    Policy,
    /// The server's annotations (`trust_annotations = true`).
    Annotation,
    /// The server's default (`effect` of the `[[mcp]]` entry).
    ServerDefault,
}

impl std::fmt::Display for EffectSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EffectSource::Policy => "policy",
            EffectSource::Annotation => "annotation",
            EffectSource::ServerDefault => "server default",
        })
    }
}

/// One tool as a server's `tools/list` gave it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListedTool {
    /// Its name on the server.
    pub name: String,
    /// Its description.
    #[serde(default)]
    pub description: String,
    /// JSON schema of its arguments.
    #[serde(rename = "inputSchema", default = "object_schema")]
    pub input_schema: serde_json::Value,
    /// Hints about its behaviour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<serde_json::Value>,
}

fn object_schema() -> serde_json::Value {
    serde_json::json!({"type": "object"})
}

impl McpServerSpec {
    /// Per-call timeout (and start-up time).
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_secs.unwrap_or(DEFAULT_MCP_TIMEOUT_SECS))
    }

    /// Bytes of one message read before it is refused.
    pub fn max_message_bytes(&self) -> u64 {
        self.max_message_bytes.unwrap_or(DEFAULT_MAX_MESSAGE_BYTES)
    }

    /// How the agent file names this server in errors.
    pub fn label(&self) -> String {
        match &self.declared_at {
            Some(at) => format!("[[mcp]] {:?} ({at})", self.name),
            None => format!("[[mcp]] {:?}", self.name),
        }
    }

    fn policy(&self, tool: &str) -> Option<McpToolSettings> {
        let McpTools::Policies(policies) = &self.tools else {
            return None;
        };
        policies.get(tool).map(|policy| match policy {
            McpToolPolicy::Effect(effect) => McpToolSettings {
                effect: Some(*effect),
                ..McpToolSettings::default()
            },
            McpToolPolicy::Table(settings) => settings.clone(),
        })
    }

    fn offered(&self, tool: &str) -> bool {
        let listed = |names: &Vec<String>| names.iter().any(|n| n == tool);
        let only = match &self.tools {
            McpTools::Only(names) => listed(names),
            _ => true,
        };
        only && self.expose.as_ref().is_none_or(listed)
    }

    /// Every tool name the agent file gives for this server (in `tools`
    /// or `expose`), which the server must list.
    fn named_tools(&self) -> Vec<&str> {
        let mut names: Vec<&str> = match &self.tools {
            McpTools::All => Vec::new(),
            McpTools::Only(names) => names.iter().map(String::as_str).collect(),
            McpTools::Policies(policies) => policies.keys().map(String::as_str).collect(),
        };
        names.extend(self.expose.iter().flatten().map(String::as_str));
        if let McpTools::Policies(policies) = &self.tools {
            let checks = policies.values().filter_map(|policy| match policy {
                McpToolPolicy::Table(settings) => settings.check_tool.as_deref(),
                McpToolPolicy::Effect(_) => None,
            });
            names.extend(checks);
        }
        names
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        let me = |reason: String| format!("{}: {reason}", self.label());
        if !crate::spec::is_safe_name(&self.name) || self.name.contains(NAME_SEPARATOR) {
            return Err(me(format!(
                "name {:?} must be 1 to 64 ASCII letters, digits, '_' or '-', without \"__\"",
                self.name
            )));
        }
        match (&self.command, &self.url) {
            (Some(command), None) if !command.is_empty() => {
                crate::spec::check_program("command", command).map_err(me)?
            }
            (None, Some(url)) => crate::spec::check_http_url("url", url).map_err(me)?,
            _ => {
                return Err(me(
                    "give exactly one of command (a stdio server) or url (Streamable HTTP)".into(),
                ))
            }
        }
        if self.timeout_secs == Some(0) {
            return Err(me("timeout_secs must be greater than 0".into()));
        }
        match self.max_message_bytes {
            Some(0) => return Err(me("max_message_bytes must be greater than 0".into())),
            Some(n) if n > MAX_MESSAGE_BYTES_LIMIT => {
                return Err(me(format!(
                    "max_message_bytes = {n} is above {MAX_MESSAGE_BYTES_LIMIT}"
                )))
            }
            _ => {}
        }
        if let McpTools::Policies(policies) = &self.tools {
            for (tool, policy) in policies {
                let McpToolPolicy::Table(settings) = policy else {
                    continue;
                };
                let name = tool;
                let tool = |reason: String| me(format!("[mcp.tools] {name:?}: {reason}"));
                if settings.check_tool.as_ref() == Some(name) {
                    return Err(tool(
                        "check_tool names the tool itself: a check must only look, never act again"
                            .into(),
                    ));
                }
                let Some(window) = &settings.approval_timeout else {
                    continue;
                };
                crate::spec::parse_window(window)
                    .map_err(|e| tool(format!("approval_timeout {e}")))?;
                if !settings.requires_approval {
                    return Err(tool(
                        "approval_timeout is given, but not requires_approval = true".into(),
                    ));
                }
            }
        }
        for (header, var) in &self.headers_env {
            if !is_header_name(header) || var.is_empty() {
                return Err(me(format!(
                    "headers_env {header:?} = {var:?}: a header name and the variable that holds its value"
                )));
            }
        }
        Ok(())
    }

    /// The tools a session pins from `listed` (this server's `tools/list`),
    /// in the server's order: named `<server>__<tool>`, with the effect
    /// local policy gives. Refuses a tool the agent file names that the
    /// server does not list, and a listed name unfit for a model (the
    /// reason, without the server's [`McpServerSpec::label`]).
    pub fn pin(&self, listed: &[ListedTool]) -> Result<Vec<ToolSpec>, String> {
        for named in self.named_tools() {
            if !listed.iter().any(|t| t.name == named) {
                let names: Vec<&str> = listed.iter().map(|t| t.name.as_str()).collect();
                return Err(format!(
                    "names tool {named:?}, which the server does not list (it lists: {})",
                    names.join(", ")
                ));
            }
        }
        self.pin_offered(listed)
    }

    /// [`McpServerSpec::pin`] without refusing a named tool the server does
    /// not list: what a session started with compares a list to.
    pub fn pin_offered(&self, listed: &[ListedTool]) -> Result<Vec<ToolSpec>, String> {
        if listed.len() > MAX_LISTED_TOOLS {
            return Err(format!(
                "the server lists {} tools; at most {MAX_LISTED_TOOLS} are taken",
                listed.len()
            ));
        }
        listed
            .iter()
            .filter(|t| self.offered(&t.name))
            .map(|t| self.pin_one(t))
            .collect()
    }

    fn pin_one(&self, listed: &ListedTool) -> Result<ToolSpec, String> {
        let name = format!("{}{NAME_SEPARATOR}{}", self.name, listed.name);
        if !crate::spec::is_safe_name(&name) {
            return Err(format!(
                "tool {:?} gives the name {name:?}, which is not 1 to 64 ASCII letters, digits, '_' or '-'",
                listed.name
            ));
        }
        let named = self.policy(&listed.name);
        // A destructive tool no policy names waits for a person, when the
        // server's annotations are trusted.
        let destructive = self.trust_annotations
            && named.is_none()
            && hint(listed.annotations.as_ref(), "destructiveHint") == Some(true);
        let policy = named.unwrap_or_default();
        let hinted = self
            .trust_annotations
            .then(|| effect_from_annotations(listed.annotations.as_ref()))
            .flatten();
        let (effect, effect_from) = match (policy.effect, hinted) {
            (Some(effect), _) => (effect, EffectSource::Policy),
            (None, Some(effect)) => (effect, EffectSource::Annotation),
            (None, None) => (self.effect, EffectSource::ServerDefault),
        };
        Ok(ToolSpec {
            name,
            description: listed.description.clone(),
            kind: ToolKind::Mcp,
            effect,
            parameters: listed.input_schema.clone(),
            honours_idempotency_key: Some(
                policy
                    .honours_idempotency_key
                    .unwrap_or(self.honours_idempotency_key),
            ),
            timeout_secs: policy.timeout_secs.or(self.timeout_secs),
            requires_approval: policy.requires_approval || destructive,
            approval_timeout: policy.approval_timeout,
            method: None,
            url: None,
            command: None,
            env: Vec::new(),
            max_output_bytes: self.max_output_bytes,
            mcp: Some(McpOrigin {
                server: self.name.clone(),
                tool: listed.name.clone(),
                effect_from,
                annotations: listed.annotations.clone(),
                check_tool: policy.check_tool.clone(),
            }),
            check: None,
            check_command: None,
            agent: None,
            agent_spec: None,
        })
    }
}

/// Whether `name` is an HTTP header name: a non-empty token of visible
/// ASCII without separators.
fn is_header_name(name: &str) -> bool {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    !name.is_empty() && name.bytes().all(token)
}

/// A boolean hint of MCP annotations (`readOnlyHint`, `destructiveHint`).
fn hint(annotations: Option<&serde_json::Value>, key: &str) -> Option<bool> {
    annotations?.get(key)?.as_bool()
}

/// The effect MCP annotations claim: read only, else idempotent, else none.
fn effect_from_annotations(annotations: Option<&serde_json::Value>) -> Option<Effect> {
    let hint = |key: &str| hint(annotations, key);
    match (hint("readOnlyHint"), hint("idempotentHint")) {
        (Some(true), _) => Some(Effect::ReadOnly),
        (_, Some(true)) => Some(Effect::Idempotent),
        _ => None,
    }
}

/// What differs between a server's pinned tools and the ones it lists now
/// (both as pinned), one line each; empty when they are the same.
pub fn tool_list_changes(pinned: &[&ToolSpec], now: &[ToolSpec]) -> Vec<String> {
    let mut changes = Vec::new();
    for old in pinned {
        match now.iter().find(|t| t.name == old.name) {
            None => changes.push(format!("{} is no longer listed", old.name)),
            Some(new) => {
                let differs =
                    |what: &str, a: bool| a.then(|| format!("{} changed its {what}", old.name));
                changes.extend(differs("description", new.description != old.description));
                changes.extend(differs("input schema", new.parameters != old.parameters));
                changes.extend(differs(
                    "annotations",
                    new.mcp.as_ref().map(|m| &m.annotations)
                        != old.mcp.as_ref().map(|m| &m.annotations),
                ));
                changes.extend(differs("effect", new.effect != old.effect));
            }
        }
    }
    for new in now {
        if !pinned.iter().any(|t| t.name == new.name) {
            changes.push(format!("{} is new", new.name));
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(toml_text: &str) -> McpServerSpec {
        toml::from_str(toml_text).unwrap()
    }

    fn listed(name: &str, annotations: Option<serde_json::Value>) -> ListedTool {
        ListedTool {
            name: name.into(),
            description: format!("does {name}"),
            input_schema: serde_json::json!({"type": "object"}),
            annotations,
        }
    }

    #[test]
    fn policy_decides_then_trusted_annotations_then_the_server_default() {
        let read_only = Some(serde_json::json!({"readOnlyHint": true}));
        let tools = [
            listed("read", read_only.clone()),
            listed("write", None),
            listed("peek", read_only),
        ];
        let plain = server(
            "name = \"fs\"\ncommand = [\"x\"]\n[tools]\nwrite = { effect = \"idempotent\", requires_approval = true }\nread = \"read_only\"\n",
        );
        let pinned = plain.pin(&tools).unwrap();
        let by = |n: &str| pinned.iter().find(|t| t.name == n).unwrap().clone();
        assert_eq!(by("fs__read").effect, Effect::ReadOnly);
        assert_eq!(by("fs__write").effect, Effect::Idempotent);
        assert!(by("fs__write").requires_approval);
        // An annotation is shown but not obeyed without trust.
        let peek = by("fs__peek");
        assert_eq!(peek.effect, Effect::SideEffect);
        assert_eq!(
            peek.mcp.as_ref().unwrap().effect_from,
            EffectSource::ServerDefault
        );
        assert!(
            !peek.safe_to_rerun(),
            "a key-ignoring side effect is never rerun"
        );
        let trusting = server("name = \"fs\"\ncommand = [\"x\"]\ntrust_annotations = true\n");
        let peek = trusting.pin(&tools).unwrap().remove(2);
        assert_eq!(peek.effect, Effect::ReadOnly);
        assert_eq!(peek.mcp.unwrap().effect_from, EffectSource::Annotation);
    }

    #[test]
    fn a_destructive_tool_waits_for_approval_when_annotations_are_trusted_and_no_policy_names_it() {
        let destructive = Some(serde_json::json!({"destructiveHint": true}));
        let tools = [
            listed("delete", destructive.clone()),
            listed("wipe", destructive),
            listed("write", Some(serde_json::json!({"destructiveHint": false}))),
        ];
        let approval = |spec: &McpServerSpec| -> Vec<bool> {
            let pinned = spec.pin(&tools).unwrap();
            pinned.iter().map(|t| t.requires_approval).collect()
        };
        // Untrusted: shown, never obeyed.
        let plain = server("name = \"fs\"\ncommand = [\"x\"]\n");
        assert_eq!(approval(&plain), [false, false, false]);
        // Trusted: a destructive tool waits for a person, unless a policy
        // names it (the policy decides, here: no approval).
        let trusting = server(
            "name = \"fs\"\ncommand = [\"x\"]\ntrust_annotations = true\n[tools]\nwipe = { effect = \"side_effect\" }\n",
        );
        assert_eq!(approval(&trusting), [true, false, false]);
        // A policy may give a timeout, with approval only.
        let timed = server(
            "name = \"fs\"\ncommand = [\"x\"]\n[tools]\nwipe = { requires_approval = true, approval_timeout = \"24h\" }\n",
        );
        timed.validate().unwrap();
        let wipe = timed.pin(&tools).unwrap().remove(1);
        assert_eq!(wipe.approval_timeout.as_deref(), Some("24h"));
        for bad in [
            "approval_timeout = \"24h\"",
            "requires_approval = true, approval_timeout = \"1w\"",
        ] {
            let spec = server(&format!(
                "name = \"fs\"\ncommand = [\"x\"]\n[tools]\nwipe = {{ {bad} }}\n"
            ));
            let err = spec.validate().unwrap_err();
            assert!(err.contains("approval_timeout"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_check_tool_is_pinned_with_its_tool_and_must_be_listed() {
        let tools = [listed("send", None), listed("was_sent", None)];
        let spec = server(
            "name = \"mail\"\ncommand = [\"x\"]\nexpose = [\"send\"]\n[tools]\nsend = { effect = \"side_effect\", check_tool = \"was_sent\" }\n",
        );
        spec.validate().unwrap();
        let pinned = spec.pin(&tools).unwrap();
        // The check is not offered to the model; the tool it checks says
        // which it is, and so has a check.
        assert_eq!(pinned.len(), 1);
        let send = &pinned[0];
        assert_eq!(
            send.mcp.as_ref().unwrap().check_tool.as_deref(),
            Some("was_sent")
        );
        assert!(send.has_check() && !send.safe_to_rerun());
        // A check the server does not list is refused by name.
        let err = spec.pin(&[listed("send", None)]).unwrap_err();
        assert!(err.contains("\"was_sent\""), "{err}");
        // A tool cannot check itself.
        let itself = server(
            "name = \"mail\"\ncommand = [\"x\"]\n[tools]\nsend = { check_tool = \"send\" }\n",
        );
        let err = itself.validate().unwrap_err();
        assert!(err.contains("check_tool names the tool itself"), "{err}");
        // Without one, a pinned tool has no check, and its recorded origin
        // no check_tool key (sessions recorded before it are unchanged).
        let plain = server("name = \"mail\"\ncommand = [\"x\"]\n")
            .pin(&tools)
            .unwrap();
        assert!(!plain[0].has_check());
        let recorded = serde_json::to_string(&plain[0].mcp).unwrap();
        assert!(!recorded.contains("check_tool"), "{recorded}");
    }

    #[test]
    fn a_named_tool_the_server_does_not_list_is_refused_by_name() {
        let spec = server("name = \"fs\"\ncommand = [\"x\"]\ntools = [\"read\", \"gone\"]\n");
        let err = spec
            .pin(&[listed("read", None), listed("write", None)])
            .unwrap_err();
        assert!(
            err.contains("\"gone\"") && err.contains("read, write"),
            "{err}"
        );
        let only = server("name = \"fs\"\ncommand = [\"x\"]\ntools = [\"read\"]\n");
        let pinned = only
            .pin(&[listed("read", None), listed("write", None)])
            .unwrap();
        assert_eq!(pinned.len(), 1);
        assert_eq!(pinned[0].name, "fs__read");
    }

    #[test]
    fn a_server_needs_exactly_one_transport_and_a_safe_name() {
        for bad in [
            "name = \"fs\"\n",
            "name = \"fs\"\ncommand = [\"x\"]\nurl = \"http://127.0.0.1:1/mcp\"\n",
            "name = \"a__b\"\ncommand = [\"x\"]\n",
            "name = \"fs\"\nurl = \"ftp://x/\"\n",
            "name = \"fs\"\nurl = \"http://127.0.0.1:1/mcp\"\nheaders_env = { \"Bad Header\" = \"V\" }\n",
            "name = \"fs\"\ncommand = [\"x\"]\nmax_message_bytes = 0\n",
        ] {
            assert!(server(bad).validate().is_err(), "{bad}");
        }
        let unknown =
            toml::from_str::<McpServerSpec>("name = \"fs\"\ncommand = [\"x\"]\nbogus = 1\n");
        assert!(unknown.unwrap_err().to_string().contains("bogus"));
    }

    #[test]
    fn changes_name_what_differs() {
        let spec = server("name = \"s\"\ncommand = [\"x\"]\n");
        let before = spec.pin(&[listed("a", None), listed("b", None)]).unwrap();
        let mut b = listed("b", None);
        b.description = "other".into();
        let after = spec.pin(&[b, listed("c", None)]).unwrap();
        let changes = tool_list_changes(&before.iter().collect::<Vec<_>>(), &after);
        assert_eq!(
            changes,
            [
                "s__a is no longer listed",
                "s__b changed its description",
                "s__c is new"
            ]
        );
        assert!(tool_list_changes(&before.iter().collect::<Vec<_>>(), &before).is_empty());
    }
}
