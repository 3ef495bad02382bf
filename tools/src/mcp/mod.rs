//! MCP servers as tools: a client of the Model Context Protocol over stdio
//! and Streamable HTTP, and [`McpTool`], one pinned tool of a server.
//!
//! mneme's rules hold for MCP tools as for every tool: the effect is the
//! agent file's (see `replay::mcp`), the idempotency key travels with each
//! call (in `_meta` as `mneme/idempotency_key`, and over HTTP as the
//! `Idempotency-Key` header), and a server that dies or times out mid-call
//! leaves the outcome unknown. A server is started when a session's turn
//! first needs it and stopped (its whole process group) when the toolbox
//! that started it is dropped, or with mneme itself.

mod http;
mod stdio;

use crate::capture::truncation_note;
use crate::check::Checked;
use crate::{CallContext, Tool, ToolError};
use async_trait::async_trait;
use replay::mcp::{ListedTool, McpServerSpec, MAX_LISTED_TOOLS};
use replay::spec::ToolSpec;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Protocol versions this client speaks, newest first: it asks for the
/// first and accepts any of them in the answer.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];

/// Characters of the end of a server's stderr quoted in an error.
const STDERR_QUOTED_CHARS: usize = 500;
/// How long telling a server a request is cancelled may take: the call has
/// ended already, and a server that does not take the notice is not waited
/// for.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// Pages of `tools/list` followed at most (each may be empty).
const MAX_LIST_PAGES: usize = 64;

/// Why an MCP server could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{server}: {reason}")]
pub struct McpError {
    /// The server, as the agent file names it (with its line where known).
    pub server: String,
    /// Why.
    pub reason: String,
}

/// The answer to one JSON-RPC request.
pub(crate) type RpcResult = Result<Value, RpcError>;

/// Why a request got no result.
#[derive(Debug)]
pub(crate) enum RpcError {
    /// Never sent: the server was not reached.
    NotSent(String),
    /// Sent, but the server went away (or broke the protocol) before
    /// answering: whatever it was asked may have happened.
    Gone(String),
    /// The server answered with a JSON-RPC error.
    Server(String),
    /// The server answered, but not as the protocol says.
    Protocol(String),
}

impl RpcError {
    /// Its text, to be changed in place.
    fn text_mut(&mut self) -> &mut String {
        match self {
            RpcError::NotSent(text)
            | RpcError::Gone(text)
            | RpcError::Server(text)
            | RpcError::Protocol(text) => text,
        }
    }
}

/// `answer` with each of `secrets` replaced by `[redacted]` in every string
/// it holds, its error's text included.
pub(crate) fn without_secrets(answer: RpcResult, secrets: &[&str]) -> RpcResult {
    fn hide(text: &mut String, secrets: &[&str]) {
        for secret in secrets {
            if text.contains(secret) {
                *text = text.replace(secret, "[redacted]");
            }
        }
    }
    fn walk(value: &mut Value, secrets: &[&str]) {
        match value {
            Value::String(text) => hide(text, secrets),
            Value::Array(items) => items.iter_mut().for_each(|v| walk(v, secrets)),
            Value::Object(fields) => fields.values_mut().for_each(|v| walk(v, secrets)),
            _ => {}
        }
    }
    match answer {
        Ok(mut value) => {
            walk(&mut value, secrets);
            Ok(value)
        }
        Err(mut error) => {
            hide(error.text_mut(), secrets);
            Err(error)
        }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::NotSent(why) | RpcError::Gone(why) | RpcError::Protocol(why) => {
                f.write_str(why)
            }
            RpcError::Server(why) => write!(f, "the server answered with an error: {why}"),
        }
    }
}

/// The result or error of a JSON-RPC answer.
pub(crate) fn answer_of(message: Value) -> RpcResult {
    if let Some(error) = message.get("error") {
        let text = error.get("message").and_then(Value::as_str).unwrap_or("");
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
        return Err(RpcError::Server(format!("{text} (code {code})")));
    }
    match message.get("result") {
        Some(result) => Ok(result.clone()),
        None => Err(RpcError::Protocol(
            "an answer with neither result nor error".into(),
        )),
    }
}

/// The answer to a request the server sends us: `ping` is served; mneme
/// offers no client capabilities (roots, sampling, elicitation), so every
/// other method is not found.
pub(crate) fn reply_to_server(id: &Value, method: &Value) -> Value {
    match method.as_str() {
        Some("ping") => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
        _ => json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": -32601, "message": "method not found: mneme offers no client capabilities"}}),
    }
}

enum Transport {
    Stdio(stdio::StdioServer),
    Http(http::HttpServer),
}

/// A connected, initialized MCP server.
pub struct McpServer {
    spec: McpServerSpec,
    transport: Transport,
    next_id: AtomicU64,
    /// The protocol version the server answered with.
    protocol: String,
}

impl McpServer {
    /// Starts (stdio) or reaches (HTTP) the server of `spec` and completes
    /// the `initialize` handshake, within the spec's timeout.
    pub async fn connect(spec: &McpServerSpec) -> Result<McpServer, McpError> {
        let error = |reason: String| McpError {
            server: spec.label(),
            reason,
        };
        let transport = match spec.url {
            Some(_) => Transport::Http(http::HttpServer::new(spec).map_err(error)?),
            None => Transport::Stdio(stdio::StdioServer::start(spec).await.map_err(error)?),
        };
        let mut server = McpServer {
            spec: spec.clone(),
            transport,
            next_id: AtomicU64::new(0),
            protocol: String::new(),
        };
        let params = json!({
            "protocolVersion": PROTOCOL_VERSIONS[0],
            "capabilities": {},
            "clientInfo": {"name": "mneme", "version": env!("CARGO_PKG_VERSION")},
        });
        let answer =
            tokio::time::timeout(spec.timeout(), server.request("initialize", params, None))
                .await
                .map_err(|_| {
                    server.failure(format!(
                        "no answer to initialize within {} s",
                        spec.timeout().as_secs()
                    ))
                })?
                .map_err(|e| server.failure(format!("initialize: {e}")))?;
        let version = answer
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !PROTOCOL_VERSIONS.contains(&version) {
            return Err(server.failure(format!(
                "the server speaks MCP protocol version {version:?}; mneme speaks {}",
                PROTOCOL_VERSIONS.join(", ")
            )));
        }
        server.protocol = version.to_string();
        if let Transport::Http(http) = &server.transport {
            http.set_protocol(version);
        }
        let initialized = server.notify("notifications/initialized", json!({}));
        tokio::time::timeout(spec.timeout(), initialized)
            .await
            .map_err(|_| server.failure("notifications/initialized was not taken in time".into()))?
            .map_err(|e| server.failure(format!("notifications/initialized: {e}")))?;
        Ok(server)
    }

    /// The protocol version agreed on.
    pub fn protocol_version(&self) -> &str {
        &self.protocol
    }

    /// An error about this server, with the end of its stderr where it has one.
    fn failure(&self, reason: String) -> McpError {
        let stderr = match &self.transport {
            Transport::Stdio(stdio) => stdio.stderr_tail(),
            Transport::Http(_) => String::new(),
        };
        let reason = match stderr.char_indices().rev().nth(STDERR_QUOTED_CHARS) {
            _ if stderr.is_empty() => reason,
            Some((cut, _)) => format!("{reason} (its stderr ends: …{})", &stderr[cut..]),
            None => format!("{reason} (its stderr ends: {stderr})"),
        };
        McpError {
            server: self.spec.label(),
            reason,
        }
    }

    /// Every tool the server lists (following pages), as it lists them.
    pub async fn list_tools(&self) -> Result<Vec<ListedTool>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut cursors = std::collections::HashSet::new();
        // One deadline for the whole list: a server that answers each page
        // just in time must not stretch it to 64 timeouts.
        let deadline = tokio::time::Instant::now() + self.spec.timeout();
        for page in 0..MAX_LIST_PAGES {
            let params = match &cursor {
                Some(cursor) => json!({"cursor": cursor}),
                None => json!({}),
            };
            let late = || {
                let within = self.spec.timeout().as_secs_f64();
                self.failure(format!(
                    "tools/list did not finish within {within} s (timeout_secs; {page} pages listed)"
                ))
            };
            let page = tokio::time::timeout_at(deadline, self.request("tools/list", params, None))
                .await
                .map_err(|_| late())?
                .map_err(|e| self.failure(format!("tools/list: {e}")))?;
            let listed: Vec<ListedTool> = serde_json::from_value(
                page.get("tools").cloned().unwrap_or(Value::Null),
            )
            .map_err(|e| self.failure(format!("tools/list answered a malformed list: {e}")))?;
            tools.extend(listed);
            if tools.len() > MAX_LISTED_TOOLS {
                return Err(self.failure(format!("lists more than {MAX_LISTED_TOOLS} tools")));
            }
            cursor = page
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(String::from);
            match &cursor {
                None => return Ok(tools),
                Some(next) if !cursors.insert(next.clone()) => {
                    return Err(
                        self.failure(format!("tools/list gave the cursor {next:?} a second time"))
                    )
                }
                Some(_) => {}
            }
        }
        Err(self.failure(format!("tools/list goes on past {MAX_LIST_PAGES} pages")))
    }

    /// Whether the server can still be asked anything.
    fn alive(&self) -> bool {
        match &self.transport {
            Transport::Stdio(stdio) => stdio.alive(),
            Transport::Http(http) => http.alive(),
        }
    }

    async fn request(&self, method: &str, params: Value, key: Option<&str>) -> RpcResult {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.request_with_id(id, method, params, key).await
    }

    async fn request_with_id(
        &self,
        id: u64,
        method: &str,
        params: Value,
        key: Option<&str>,
    ) -> RpcResult {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        match &self.transport {
            Transport::Http(http) => http.post(&message, Some(id), key).await,
            Transport::Stdio(stdio) => {
                let answer = stdio
                    .send(&message, Some(id))
                    .await?
                    .expect("a request waits");
                answer
                    .await
                    .unwrap_or_else(|_| Err(RpcError::Gone("the server went away".into())))
            }
        }
    }

    async fn notify(&self, method: &str, params: Value) -> Result<(), RpcError> {
        let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
        match &self.transport {
            Transport::Http(http) => http.post(&message, None, None).await.map(|_| ()),
            Transport::Stdio(stdio) => stdio.send(&message, None).await.map(|_| ()),
        }
    }

    /// Calls `tool` (its name on the server) with `arguments`; on timeout
    /// tells the server the request is cancelled.
    async fn call_tool(
        &self,
        spec: &ToolSpec,
        tool: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<Value, ToolError> {
        let key = ctx.idempotency_key.as_str();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let params = json!({
            "name": tool,
            "arguments": arguments,
            "_meta": {"mneme/idempotency_key": key},
        });
        let limit = spec.timeout();
        let call = tokio::time::timeout(
            limit,
            self.request_with_id(id, "tools/call", params, Some(key)),
        );
        let paused = async {
            match &ctx.cancel {
                Some(cancel) => cancel.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let (why, error) = tokio::select! {
            answered = call => match answered {
                Ok(Ok(result)) => return Ok(result),
                Ok(Err(e)) => return Err(tool_error(spec, e, self)),
                Err(_) => ("mneme: the call timed out", ToolError::Timeout {
                    tool: spec.name.clone(),
                    secs: limit.as_secs(),
                }),
            },
            () = paused => ("mneme: the turn was paused", ToolError::Cancelled {
                tool: spec.name.clone(),
                reason: "the turn was paused while it ran".into(),
            }),
        };
        let cancel = json!({"requestId": id, "reason": why});
        let notice = self.notify("notifications/cancelled", cancel);
        let _ = tokio::time::timeout(CANCEL_WAIT, notice).await;
        Err(error)
    }
}

fn tool_error(spec: &ToolSpec, error: RpcError, server: &McpServer) -> ToolError {
    let tool = spec.name.clone();
    let reason = match &error {
        RpcError::Gone(_) => server.failure(error.to_string()).reason,
        _ => error.to_string(),
    };
    match error {
        RpcError::Gone(_) => ToolError::Interrupted { tool, reason },
        RpcError::NotSent(_) | RpcError::Server(_) | RpcError::Protocol(_) => {
            ToolError::Failed { tool, reason }
        }
    }
}

/// The tools a session pins from the server of `spec` when it starts: it
/// is started, asked for its list, and stopped. Refuses a tool the spec
/// names that the server does not list.
pub async fn pin_tools(spec: &McpServerSpec) -> Result<Vec<ToolSpec>, McpError> {
    let listed = McpServer::connect(spec).await?.list_tools().await?;
    spec.pin(&listed).map_err(|reason| McpError {
        server: spec.label(),
        reason,
    })
}

/// The tools the server of `spec` offers now, as a session would pin them;
/// a tool the spec names that the server no longer lists is left out (a
/// session's recorded spec cannot change, so this is no error).
pub async fn offered_tools(spec: &McpServerSpec) -> Result<Vec<ToolSpec>, McpError> {
    let listed = McpServer::connect(spec).await?.list_tools().await?;
    spec.pin_offered(&listed).map_err(|reason| McpError {
        server: spec.label(),
        reason,
    })
}

/// One server of a toolbox, started when a call first needs it and again
/// after it died.
pub(crate) struct McpConnector {
    spec: McpServerSpec,
    live: tokio::sync::Mutex<Option<Arc<McpServer>>>,
}

impl McpConnector {
    pub(crate) fn new(spec: McpServerSpec) -> McpConnector {
        McpConnector {
            spec,
            live: tokio::sync::Mutex::new(None),
        }
    }

    /// The server's spec.
    pub(crate) fn spec(&self) -> &McpServerSpec {
        &self.spec
    }

    /// The running server, started if it is not.
    pub(crate) async fn server(&self) -> Result<Arc<McpServer>, McpError> {
        let mut live = self.live.lock().await;
        if let Some(server) = live.as_ref().filter(|s| s.alive()) {
            return Ok(server.clone());
        }
        let server = Arc::new(McpServer::connect(&self.spec).await?);
        *live = Some(server.clone());
        Ok(server)
    }
}

/// One pinned tool of an MCP server.
pub struct McpTool {
    spec: ToolSpec,
    connector: Arc<McpConnector>,
}

impl McpTool {
    pub(crate) fn new(spec: ToolSpec, connector: Arc<McpConnector>) -> McpTool {
        McpTool { spec, connector }
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &CallContext, args: &str) -> Result<String, ToolError> {
        let arguments: Value = serde_json::from_str(args).map_err(|e| ToolError::BadArguments {
            tool: self.spec.name.clone(),
            reason: format!("not JSON: {e}"),
        })?;
        let on_server = self.spec.mcp.as_ref().map_or("", |m| m.tool.as_str());
        let server = self
            .connector
            .server()
            .await
            .map_err(|e| ToolError::Failed {
                tool: self.spec.name.clone(),
                reason: e.to_string(),
            })?;
        let result = server
            .call_tool(&self.spec, on_server, arguments, ctx)
            .await?;
        let limit = usize::try_from(self.spec.max_output_bytes()).unwrap_or(usize::MAX);
        let kept = keep_payloads(&result, ctx.blobs.as_ref()).await;
        let (text, is_error) = render_result(&result, &kept);
        let text = bounded(text, limit);
        match is_error {
            true => Err(ToolError::Failed {
                tool: self.spec.name.clone(),
                reason: text,
            }),
            false => Ok(text),
        }
    }
}

/// Asks `check_tool`, a tool of `connector`'s server, whether the call
/// `ctx` of `spec` with `args` took effect: called like the call itself
/// (its arguments, its idempotency key in `_meta`, its timeout), it answers
/// `{"applied": true, "result": ...}` or `{"applied": false}`, as its
/// structured content or its text. Anything else (an error, a server that
/// cannot start, no answer in time) is an unknown.
pub(crate) async fn check(
    connector: &McpConnector,
    spec: &ToolSpec,
    check_tool: &str,
    ctx: &CallContext,
    args: &str,
) -> Checked {
    let unknown = |why: String| Checked::Unknown(format!("check tool {check_tool:?}: {why}"));
    let Ok(arguments) = serde_json::from_str::<Value>(args) else {
        return unknown("the call's arguments are not JSON".into());
    };
    let server = match connector.server().await {
        Ok(server) => server,
        Err(e) => return unknown(e.to_string()),
    };
    let result = match server.call_tool(spec, check_tool, arguments, ctx).await {
        Ok(result) => result,
        Err(e) => return unknown(e.to_string()),
    };
    let (text, is_error) = render_result(&result, &Kept::new());
    let limit = usize::try_from(spec.max_output_bytes()).unwrap_or(usize::MAX);
    if is_error {
        return unknown(format!("answered an error: {}", bounded(text, 500)));
    }
    if text.len() > limit {
        return unknown("the answer is longer than the tool's max_output_bytes".into());
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(answer) => crate::check::answered(&answer)
            .unwrap_or_else(|| unknown("the answer has no boolean \"applied\"".into())),
        Err(e) => unknown(format!("the answer is not JSON: {e}")),
    }
}

/// What became of each binary payload of a result, by its SHA-256.
type Kept = std::collections::HashMap<String, String>;

/// Keeps every binary payload of `result` in `blobs`; says for each
/// whether it was kept (`kept`) or why not.
async fn keep_payloads(result: &Value, blobs: Option<&crate::Blobs>) -> Kept {
    let mut kept = Kept::new();
    for payload in payloads(result) {
        let (bytes, digest) = identify(payload);
        let status = match (bytes, blobs) {
            (Err(why), _) => why,
            (Ok(_), None) => "not kept: this program keeps no binary content".into(),
            (Ok(bytes), Some(blobs)) => match blobs.0.keep(&digest, &bytes).await {
                Ok(()) => "kept".into(),
                Err(why) => format!("not kept: {why}"),
            },
        };
        kept.insert(digest, status);
    }
    kept
}

/// The base64 payloads of a result's content blocks (`data`, and an
/// embedded resource's `blob`).
fn payloads(result: &Value) -> Vec<&str> {
    let blocks = result.get("content").and_then(Value::as_array);
    blocks
        .into_iter()
        .flatten()
        .flat_map(|b| [b.get("data"), b.get("resource").and_then(|r| r.get("blob"))])
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn decode(payload: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(payload)
        .map_err(|e| format!("not kept: not base64 ({e})"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A payload's bytes (or why it has none) and how it is known: the SHA-256
/// of its bytes, or of its text when it is not base64. Decoded once.
fn identify(payload: &str) -> (Result<Vec<u8>, String>, String) {
    let bytes = decode(payload);
    let digest = match &bytes {
        Ok(bytes) => sha256_hex(bytes),
        Err(_) => sha256_hex(payload.as_bytes()),
    };
    (bytes, digest)
}

/// A `tools/call` result as the model and the log see it: the text of a
/// result made only of text; its `structuredContent` where the rest is only
/// text; else JSON of its content (binary content by type, size, SHA-256
/// and whether it was kept, never inline) and `structuredContent`. And
/// whether the server marked it an error.
pub(crate) fn render_result(result: &Value, kept: &Kept) -> (String, bool) {
    let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
    let blocks: Vec<Value> = result
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let structured = result.get("structuredContent").filter(|v| !v.is_null());
    let all_text = blocks.iter().all(|b| b.get("type") == Some(&json!("text")));
    match (all_text, structured) {
        // Text blocks beside structured content are its serialization
        // (MCP asks servers to send both): the structured form is the result.
        (true, Some(structured)) => return (structured.to_string(), is_error),
        (true, None) => {
            let texts: Vec<&str> = blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            return (texts.join("\n"), is_error);
        }
        (false, _) => {}
    }
    let content: Vec<Value> = blocks.iter().map(|b| by_reference(b, kept)).collect();
    let mut out = json!({ "content": content });
    if let Some(structured) = structured {
        out["structuredContent"] = structured.clone();
    }
    (out.to_string(), is_error)
}

/// A content block with any base64 payload (`data`, or an embedded
/// resource's `blob`) replaced by its size, SHA-256 and what became of it.
fn by_reference(block: &Value, kept: &Kept) -> Value {
    let mut block = block.clone();
    replace_payload(&mut block, "data", kept);
    if let Some(resource) = block.get_mut("resource") {
        replace_payload(resource, "blob", kept);
    }
    block
}

fn replace_payload(holder: &mut Value, field: &str, kept: &Kept) {
    let Some(object) = holder.as_object_mut() else {
        return;
    };
    let Some(payload) = object.remove(field) else {
        return;
    };
    let text = payload.as_str().unwrap_or_default();
    let (bytes, digest) = identify(text);
    let size = bytes.map_or(text.len(), |bytes| bytes.len());
    let status = kept
        .get(&digest)
        .cloned()
        .unwrap_or_else(|| "not kept".into());
    object.insert("bytes".into(), json!(size));
    object.insert("sha256".into(), json!(digest));
    object.insert("blob".into(), json!(status));
}

fn bounded(text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let mut cut = limit;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let note = truncation_note(cut, text.len() as u64, true);
    format!("{}{note}", &text[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_results_read_as_text_and_binary_goes_by_reference() {
        let (text, error) = render_result(
            &json!({"content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            &Kept::new(),
        );
        assert_eq!((text.as_str(), error), ("a\nb", false));
        let (text, error) = render_result(
            &json!({"isError": true, "content": [
            {"type": "text", "text": "no such file"}]}),
            &Kept::new(),
        );
        assert_eq!((text.as_str(), error), ("no such file", true));
        let image = json!({"content": [{"type": "image", "mimeType": "image/png", "data": "aGVsbG8="}],
            "structuredContent": {"ok": true}});
        let (text, _) = render_result(&image, &Kept::new());
        let out: Value = serde_json::from_str(&text).unwrap();
        let block = &out["content"][0];
        assert_eq!(block["bytes"], 5);
        assert_eq!(block["sha256"], sha256_hex(b"hello"));
        assert_eq!(block["blob"], "not kept");
        assert!(block.get("data").is_none(), "{text}");
        assert_eq!(out["structuredContent"]["ok"], true);
    }

    #[test]
    fn a_long_result_is_cut_on_a_character_and_says_so() {
        let out = bounded("é".repeat(10), 5);
        assert!(out.starts_with("éé\n[mneme] output truncated"), "{out}");
    }
}

#[cfg(test)]
mod hostile_servers {
    //! Servers that hold a call past its timeout, list tools for ever, echo
    //! a secret header or redirect it elsewhere: none gets its way.
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn server_spec(toml_text: &str) -> McpServerSpec {
        toml::from_str(toml_text).unwrap()
    }

    fn tool_spec() -> ToolSpec {
        toml::from_str(
            "name = \"t\"\nkind = \"command\"\ncommand = [\"x\"]\neffect = \"read_only\"\ntimeout_secs = 1",
        )
        .unwrap()
    }

    fn ctx() -> CallContext {
        CallContext {
            session: uuid::Uuid::nil(),
            call_id: "c1".into(),
            idempotency_key: "mneme-k1".into(),
            attempt: 1,
            blobs: None,
            cancel: None,
        }
    }

    /// A loopback HTTP server: `answer` gives each JSON-RPC message's
    /// (status, body), or None to hold the request unanswered forever.
    async fn http_server(answer: fn(&Value, &str) -> Option<(u16, String)>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        let end = loop {
                            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break at + 4;
                            }
                            let n = conn.read(&mut chunk).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        while buf.len() < end + length {
                            let n = conn.read(&mut chunk).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        }
                        let body: Value = serde_json::from_slice(&buf[end..end + length]).unwrap();
                        buf.drain(..end + length);
                        let Some((status, text)) = answer(&body, &head) else {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            return;
                        };
                        let reply = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\nmcp-session-id: s1\r\ncontent-length: {}\r\n\r\n{text}",
                            text.len()
                        );
                        conn.write_all(reply.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        url
    }

    fn initialize(message: &Value) -> Option<(u16, String)> {
        let id = message.get("id")?;
        Some((
            200,
            json!({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": "2025-06-18", "capabilities": {}}})
                .to_string(),
        ))
    }

    /// Answers initialize, then holds every other request (the
    /// notifications/initialized POST included) without an answer.
    fn only_initialize(message: &Value, _head: &str) -> Option<(u16, String)> {
        match message["method"].as_str() {
            Some("initialize") => initialize(message),
            _ => None,
        }
    }

    #[tokio::test]
    async fn http_connect_returns_within_its_timeout() {
        let url = http_server(only_initialize).await;
        let spec = server_spec(&format!(
            "name = \"s\"\nurl = \"{url}\"\ntimeout_secs = 1\n"
        ));
        let connected =
            tokio::time::timeout(Duration::from_secs(5), McpServer::connect(&spec)).await;
        assert!(
            connected.is_ok(),
            "connect (timeout_secs = 1) still running after 5 s: the notifications/initialized POST has no timeout"
        );
    }

    /// Answers initialize and notifications/initialized; holds tools/call
    /// and notifications/cancelled.
    fn holds_calls(message: &Value, _head: &str) -> Option<(u16, String)> {
        match message["method"].as_str() {
            Some("initialize") => initialize(message),
            Some("notifications/initialized") => Some((202, String::new())),
            _ => None,
        }
    }

    #[tokio::test]
    async fn http_call_returns_within_its_timeout() {
        let url = http_server(holds_calls).await;
        let spec = server_spec(&format!(
            "name = \"s\"\nurl = \"{url}\"\ntimeout_secs = 1\n"
        ));
        let server = McpServer::connect(&spec).await.unwrap();
        let (spec, ctx) = (tool_spec(), ctx());
        let call = server.call_tool(&spec, "slow", json!({}), &ctx);
        let done = tokio::time::timeout(Duration::from_secs(5), call).await;
        assert!(
            done.is_ok(),
            "a call with timeout_secs = 1 still running after 5 s: notifications/cancelled has no timeout"
        );
    }

    /// A stdio server (`sh`) that answers initialize and the messages the
    /// `case` arms of `cases` match, with a timeout of 1 s.
    fn sh_server(cases: &str) -> McpServerSpec {
        sh_server_within(cases, 1)
    }

    /// [`sh_server`], with a timeout of `secs`.
    fn sh_server_within(cases: &str, secs: u64) -> McpServerSpec {
        const SCRIPT: &str = r#"
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
  case "$line" in
    *'"initialize"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{}}}\n' "$id" ;;
    CASES
  esac
done
"#;
        let script = SCRIPT.replace("CASES", cases);
        server_spec(&format!(
            "name = \"s\"\ncommand = [\"sh\", \"-c\", {script:?}]\ntimeout_secs = {secs}\n"
        ))
    }

    #[tokio::test]
    async fn stdio_call_with_large_arguments_returns_within_its_timeout() {
        // It stops reading once initialized: the call's 1 MiB fills its pipe.
        let spec = sh_server("*'notifications/initialized'*) sleep 3600 ;;");
        let server = McpServer::connect(&spec).await.unwrap();
        let arguments = json!({"text": "x".repeat(1 << 20)});
        let (spec, ctx) = (tool_spec(), ctx());
        let call = server.call_tool(&spec, "write", arguments, &ctx);
        let done = tokio::time::timeout(Duration::from_secs(5), call).await;
        assert!(
            done.is_ok(),
            "a call with timeout_secs = 1 still running after 5 s: notifications/cancelled blocks on a full stdin"
        );
    }

    /// A check tool's answers: applied (with its result, as text or as
    /// structured content), not applied, and everything else unknown (an
    /// error result, no boolean, not JSON, no answer within the timeout).
    /// It is called with the call's key in `_meta`.
    #[tokio::test]
    async fn a_check_tool_answers_applied_not_applied_or_unknown() {
        let cases = [
            (
                r#"{"content":[{"type":"text","text":"{\"applied\":true,\"result\":{\"sent\":1}}"}]}"#,
                Checked::Applied("{\"sent\":1}".into()),
            ),
            (
                r#"{"content":[{"type":"text","text":"x"}],"structuredContent":{"applied":false}}"#,
                Checked::NotApplied,
            ),
            (
                r#"{"content":[{"type":"text","text":"{\"applied\":true}"}],"isError":true}"#,
                Checked::Unknown("answered an error".into()),
            ),
            (
                r#"{"content":[{"type":"text","text":"{\"applied\":\"maybe\"}"}]}"#,
                Checked::Unknown("no boolean".into()),
            ),
            (
                r#"{"content":[{"type":"text","text":"yes"}]}"#,
                Checked::Unknown("not JSON".into()),
            ),
            ("", Checked::Unknown("timed out".into())),
        ];
        for (result, expected) in cases {
            // Answers only a call naming the check and carrying the key.
            let answer = match result {
                "" => "sleep 3600".to_string(),
                _ => format!(
                    "printf '%s\\n' '{{\"jsonrpc\":\"2.0\",\"id\":'\"$id\"',\"result\":{result}}}'"
                ),
            };
            let spec = sh_server(&format!(
                r#"*'"name":"was_sent"'*) case "$line" in *'"mneme/idempotency_key":"mneme-k1"'*) {answer} ;; esac ;;"#
            ));
            let connector = McpConnector::new(spec);
            let args = r#"{"to":"ada"}"#;
            let checked = check(&connector, &tool_spec(), "was_sent", &ctx(), args).await;
            match (&checked, &expected) {
                (Checked::Unknown(why), Checked::Unknown(part)) => {
                    assert!(
                        why.contains(part.as_str()) && why.contains("was_sent"),
                        "{why}"
                    )
                }
                _ => assert_eq!(checked, expected, "{result}"),
            }
        }
    }

    #[tokio::test]
    async fn an_endless_tool_list_is_refused() {
        // Empty pages, each with a new cursor (all 64 well within 10 s).
        let spec = sh_server_within(
            r#"*'"tools/list"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[],"nextCursor":"page-%s"}}\n' "$id" "$id" ;;"#,
            10,
        );
        let listed = tokio::time::timeout(Duration::from_secs(15), pin_tools(&spec)).await;
        let refused = listed
            .expect("pin_tools (timeout_secs = 10) still paging after 15 s")
            .unwrap_err();
        assert!(refused.to_string().contains("past 64 pages"), "{refused}");
    }

    #[tokio::test]
    async fn a_tool_list_paged_slowly_has_one_deadline() {
        // Each page in 0.4 s, within the 1 s timeout; the whole list not.
        let spec = sh_server(
            r#"*'"tools/list"'*) sleep 0.4; printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[],"nextCursor":"page-%s"}}\n' "$id" "$id" ;;"#,
        );
        let listed = tokio::time::timeout(Duration::from_secs(5), pin_tools(&spec)).await;
        let refused = listed
            .expect("pin_tools (timeout_secs = 1) still paging after 5 s")
            .unwrap_err();
        let refused = refused.to_string();
        assert!(refused.contains("did not finish within 1 s"), "{refused}");
    }

    /// Answers tools/call with a JSON-RPC error quoting the request's
    /// X-Api-Key header, as servers do ("invalid key ...").
    fn echoes_the_key(message: &Value, head: &str) -> Option<(u16, String)> {
        match message["method"].as_str() {
            Some("initialize") => initialize(message),
            Some("tools/call") => {
                let key = head
                    .lines()
                    .find_map(|l| l.strip_prefix("x-api-key:"))
                    .unwrap_or("")
                    .trim();
                let error = json!({"code": -32001, "message": format!("invalid api key {key}")});
                Some((
                    200,
                    json!({"jsonrpc": "2.0", "id": message["id"], "error": error}).to_string(),
                ))
            }
            _ => Some((202, String::new())),
        }
    }

    #[tokio::test]
    async fn a_header_secret_echoed_by_the_server_stays_out_of_the_error() {
        let url = http_server(echoes_the_key).await;
        std::env::set_var("MNEME_TEST_MCP_ECHOED_KEY", "sk-mcp-0123456789abcdef");
        let spec = server_spec(&format!(
            "name = \"s\"\nurl = \"{url}\"\ntimeout_secs = 5\nheaders_env = {{ X-Api-Key = \"MNEME_TEST_MCP_ECHOED_KEY\" }}\n"
        ));
        let server = McpServer::connect(&spec).await.unwrap();
        let err = server
            .call_tool(&tool_spec(), "t", json!({}), &ctx())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            !err.contains("0123456789abcdef"),
            "the header's value reached the error: {err}"
        );
    }
}

#[cfg(test)]
mod redirects {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One-shot server: reads a request head, answers `reply`, returns the head.
    async fn once(reply: String) -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            let _ = conn.write_all(reply.as_bytes()).await;
            String::from_utf8_lossy(&buf).to_lowercase()
        });
        (format!("http://{addr}/mcp"), task)
    }

    #[tokio::test]
    async fn a_header_secret_does_not_follow_a_redirect_to_another_host() {
        // "localhost" and "127.0.0.1" are different hosts to reqwest.
        let (elsewhere, seen) = once("HTTP/1.1 500 X\r\ncontent-length: 0\r\n\r\n".into()).await;
        let elsewhere = elsewhere.replace("127.0.0.1", "localhost");
        let (url, _) = once(format!(
            "HTTP/1.1 307 X\r\nlocation: {elsewhere}\r\ncontent-length: 0\r\n\r\n"
        ))
        .await;
        std::env::set_var(
            "MNEME_TEST_MCP_REDIRECTED_KEY",
            "sk-mcp-redirect-0123456789",
        );
        let spec: McpServerSpec = toml::from_str(&format!(
            "name = \"s\"\nurl = \"{url}\"\ntimeout_secs = 2\nheaders_env = {{ X-Api-Key = \"MNEME_TEST_MCP_REDIRECTED_KEY\" }}\n"
        ))
        .unwrap();
        let refused = McpServer::connect(&spec).await.err().unwrap();
        assert!(refused.to_string().contains("redirects"), "{refused}");
        let followed = tokio::time::timeout(std::time::Duration::from_secs(1), seen).await;
        assert!(
            followed.is_err(),
            "the redirect was followed, the key sent along: {:?}",
            followed.map(|head| head.unwrap().contains("sk-mcp-redirect"))
        );
    }
}
