//! Model clients: OpenAI-compatible chat completions, OpenAI's Responses
//! API, Anthropic's Messages API (over HTTP, one client), and scripted
//! replies.

use async_trait::async_trait;
use replay::{AgentSpec, ModelReply, PreparedRequest, SessionState, ToolCall, Usage};
use serde::Deserialize;
use std::time::{Duration, Instant};

/// Why no usable reply came back.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The server could not be reached or kept failing after retries.
    #[error("model server {url}: {reason} (after {attempts} attempts)")]
    Unavailable {
        /// The endpoint.
        url: String,
        /// The last failure.
        reason: String,
        /// How many requests were made.
        attempts: u32,
    },
    /// The server answered something that is not a chat completion.
    #[error("model server {url} answered garbage: {reason}; body starts: {snippet:?}")]
    Garbage {
        /// The endpoint.
        url: String,
        /// What is wrong.
        reason: String,
        /// The start of the body.
        snippet: String,
    },
    /// The server refused the request (4xx other than 429, or an error
    /// saying it could not parse it).
    #[error("model server {url} refused the request with HTTP {status}: {body}")]
    Refused {
        /// The endpoint.
        url: String,
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The server sent more than the spec's `max_response_bytes`.
    #[error("model server {url} sent more than {limit} bytes (max_response_bytes); the reply was cut off and refused")]
    TooLarge {
        /// The endpoint.
        url: String,
        /// The limit.
        limit: u64,
    },
    /// The token limit cut the model's replies off in the middle of their
    /// tool calls twice in a row (the second time with twice the tokens).
    #[error("the token limit cut the model's reply off in the middle of its tool calls twice in a row (the second time with max_tokens = {}); raise [model] max_tokens (or the server's own limit), then `mneme resume` asks again", max_tokens.map_or("the server's default".to_string(), |l| l.to_string()))]
    CutOff {
        /// The limit of the second request, if the spec set one.
        max_tokens: Option<u64>,
    },
    /// The client is misconfigured.
    #[error("model client: {0}")]
    Config(String),
    /// The scripted provider has no reply for this request.
    #[error("script {path}: {reason}")]
    Script {
        /// The script file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Receives a reply's text as the server generates it (streaming); an
/// empty piece ends the reply.
pub(crate) type Deltas = dyn Fn(&str) + Send + Sync;

/// Whether a server error says the server could not parse the request
/// (llama.cpp answers HTTP 500 "Failed to parse tool call arguments as
/// JSON"): the same request would fail the same way, so it is not retried.
fn cannot_parse_the_request(body: &str) -> bool {
    body.to_ascii_lowercase().contains("failed to parse")
}

/// What servers say when a prompt exceeds their context: llama.cpp,
/// OpenAI, vLLM, Anthropic.
const CONTEXT_OVERFLOW: &[&str] = &[
    "exceed_context_size_error",
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
];

impl ModelError {
    /// Whether the server refused the request because the prompt exceeds
    /// its context.
    pub fn is_context_overflow(&self) -> bool {
        matches!(self, ModelError::Refused { body, .. }
            if CONTEXT_OVERFLOW.iter().any(|marker| body.contains(marker)))
    }
}

/// Which model request of its session a [`ModelClient::complete`] is: all
/// a client learns of the session besides the request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelCall {
    /// Model requests of the session answered before this one (every
    /// attempt and compaction counted): this one's number, from 0.
    pub index: u64,
}

impl ModelCall {
    /// The next model request of the session in `state`.
    pub fn next(state: &SessionState) -> ModelCall {
        ModelCall {
            index: state.totals.model_calls,
        }
    }
}

/// A source of model replies.
#[async_trait]
pub trait ModelClient: Send + Sync {
    /// Sends `request` (the session's `call`-th) and returns the reply; a
    /// streamed reply's text goes to `deltas` as it arrives.
    async fn complete(
        &self,
        call: ModelCall,
        request: &PreparedRequest,
        deltas: Option<&Deltas>,
    ) -> Result<ModelReply, ModelError>;
}

/// Builds the client the spec asks for.
pub fn client_for(spec: &AgentSpec) -> Result<Box<dyn ModelClient>, ModelError> {
    match spec.model.provider.as_str() {
        "openai" | replay::spec::OPENAI_RESPONSES | "anthropic" => {
            Ok(Box::new(HttpModelClient::new(spec)?))
        }
        "scripted" => Ok(Box::new(ScriptedClient::load(
            spec.model.script.as_deref().unwrap_or_default(),
        )?)),
        other => Err(ModelError::Config(format!("unknown provider {other:?}"))),
    }
}

const MAX_ATTEMPTS: u32 = 4;
const SNIPPET_CHARS: usize = 200;

/// Bytes of an error response (4xx, 5xx) read: enough to quote it.
const ERROR_BODY_BYTES: u64 = 64 << 10;

/// Which API a model server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// OpenAI's chat completions (`/chat/completions`), which most
    /// servers speak (vLLM, llama.cpp, Ollama, SGLang...).
    ChatCompletions,
    /// Anthropic's Messages API (`/messages`).
    Messages,
    /// OpenAI's Responses API (`/responses`), stateless.
    Responses,
}

/// Anthropic's API version the requests are written for.
const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The beta that lets an Anthropic model think between tool calls
/// (`[model] interleaved_thinking`).
const INTERLEAVED_THINKING_BETA: &str = "interleaved-thinking-2025-05-14";

/// A client of a model server over HTTP: any OpenAI-compatible
/// `/chat/completions` endpoint, OpenAI's Responses API, or Anthropic's
/// Messages API. Its
/// connections come from the process's pool ([`crate::outbound::client`]),
/// shared with every other model client of the same connect timeout.
pub(crate) struct HttpModelClient {
    http: reqwest::Client,
    wire: Wire,
    url: String,
    api_key: Option<String>,
    /// Anthropic betas asked for (`anthropic-beta`).
    beta: Option<&'static str>,
    timeout: Duration,
    connect_timeout: Duration,
    max_response_bytes: u64,
}

/// Why one attempt got no usable body.
enum Attempt {
    /// Worth another try (connection error, 429, 5xx), with the server's
    /// Retry-After.
    Retry(String, Option<Duration>),
    /// Final.
    Fail(ModelError),
}

impl HttpModelClient {
    /// Builds the client; reads the API key from the variable the spec names.
    pub(crate) fn new(spec: &AgentSpec) -> Result<HttpModelClient, ModelError> {
        let base = spec.model.base_url();
        let wire = if spec.model.is_anthropic() {
            Wire::Messages
        } else if spec.model.is_responses() {
            Wire::Responses
        } else {
            Wire::ChatCompletions
        };
        let api_key = match &spec.model.api_key_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                ModelError::Config(format!(
                    "the agent's api_key_env names {var}, which is not set in the environment of {}: set it where that process starts",
                    crate::text::this_process()
                ))
            })?),
            None => None,
        };
        if let Some(key) = &api_key {
            crate::text::register_secret(key);
        }
        let timeout = spec.model.timeout();
        let connect_timeout = spec.model.connect_timeout().min(timeout);
        // The process's pool: a client per session kept each one's
        // connection open (see `outbound`).
        let http = crate::outbound::client(connect_timeout).map_err(ModelError::Config)?;
        let base = replay::spec::redact_url(base.trim_end_matches('/'));
        let path = match wire {
            Wire::ChatCompletions => "chat/completions",
            Wire::Messages => "messages",
            Wire::Responses => "responses",
        };
        Ok(HttpModelClient {
            http,
            wire,
            url: format!("{base}/{path}"),
            api_key,
            beta: spec
                .model
                .interleaved_thinking
                .then_some(INTERLEAVED_THINKING_BETA),
            timeout,
            connect_timeout,
            max_response_bytes: spec.model.max_response_bytes(),
        })
    }

    /// What a failed read or send says, by its cause: the connection
    /// refused, the name not found, the TLS handshake failed, a timeout (of
    /// the connection or of the answer), not reqwest's "error sending
    /// request".
    fn describe(&self, e: &reqwest::Error) -> String {
        let https = self.url.starts_with("https://");
        let chain = error_chain(e);
        let (causes, root) = (chain.join(": "), chain.last().cloned().unwrap_or_default());
        let said = |what: &str| causes.to_ascii_lowercase().contains(what);
        let reason = if e.is_connect() && e.is_timeout() {
            let scheme_hint = match https {
                true => ": a plain-HTTP server answers an https:// URL with silence; is the scheme right?",
                false => "",
            };
            format!(
                "no connection within {} s (connect_timeout_secs: connecting{}){scheme_hint}",
                self.connect_timeout.as_secs_f64(),
                if https { " and the TLS handshake" } else { "" }
            )
        } else if e.is_timeout() {
            format!(
                "no complete answer within {} s (timeout_secs)",
                self.timeout.as_secs()
            )
        } else if said("connection refused") {
            "connection refused: nothing listens there (is the server running, on this port?)"
                .to_string()
        } else if said("dns error") || said("failed to lookup address") {
            format!("the host name does not resolve (DNS: {root})")
        } else if https && (said("tls") || said("certificate") || said("corrupt message")) {
            format!("the TLS handshake failed ({root}); is it a plain-HTTP server (http://)?")
        } else {
            causes
        };
        crate::text::redact(&reason).into_owned()
    }

    /// Reads `response`'s body, at most `limit` bytes: `None` past that.
    async fn read_capped(
        &self,
        mut response: reqwest::Response,
        limit: u64,
    ) -> Result<Option<Vec<u8>>, reqwest::Error> {
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Ok(None);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Some(body))
    }

    async fn attempt(
        &self,
        body: &[u8],
        deltas: Option<&Deltas>,
        started: Instant,
    ) -> Result<ModelReply, Attempt> {
        let mut request = self
            .http
            .post(&self.url)
            .timeout(self.timeout)
            .header("content-type", "application/json")
            .body(body.to_vec());
        request = match (self.wire, &self.api_key) {
            (Wire::ChatCompletions | Wire::Responses, Some(key)) => request.bearer_auth(key),
            (Wire::Messages, key) => {
                let mut request = request.header("anthropic-version", ANTHROPIC_VERSION);
                if let Some(beta) = self.beta {
                    request = request.header("anthropic-beta", beta);
                }
                match key {
                    Some(key) => request.header("x-api-key", key),
                    None => request,
                }
            }
            (Wire::ChatCompletions | Wire::Responses, None) => request,
        };
        let retry = |e: reqwest::Error| Attempt::Retry(self.describe(&e), None);
        let response = request.send().await.map_err(retry)?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_secs);
        let streamed = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        if status.is_success() && streamed {
            return self.read_stream(response, deltas, started).await;
        }
        let limit = if status.is_success() {
            self.max_response_bytes
        } else {
            ERROR_BODY_BYTES
        };
        let bytes = self.read_capped(response, limit).await.map_err(retry)?;
        let text = match bytes {
            Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            None if status.is_success() => {
                return Err(Attempt::Fail(ModelError::TooLarge {
                    url: self.url.clone(),
                    limit,
                }))
            }
            None => format!("(a body over {limit} bytes)"),
        };
        let transient = status.as_u16() == 429 || status.is_server_error();
        if transient && !cannot_parse_the_request(&text) {
            return Err(Attempt::Retry(
                format!("HTTP {status}: {}", snippet(&text)),
                retry_after,
            ));
        }
        if !status.is_success() {
            return Err(Attempt::Fail(ModelError::Refused {
                url: self.url.clone(),
                status: status.as_u16(),
                body: snippet(&text),
            }));
        }
        let garbage = |reason| ModelError::Garbage {
            url: self.url.clone(),
            reason,
            snippet: snippet(&text),
        };
        match self.wire {
            Wire::ChatCompletions => parse_reply(&self.url, &text),
            Wire::Messages => crate::anthropic::parse_message(&text).map_err(garbage),
            Wire::Responses => crate::responses::parse_response(&text).map_err(garbage),
        }
        .map_err(Attempt::Fail)
    }

    /// Reads a streamed reply as it comes, up to `max_response_bytes`,
    /// handing its text to `deltas`; notes when the first token came.
    async fn read_stream(
        &self,
        mut response: reqwest::Response,
        deltas: Option<&Deltas>,
        started: Instant,
    ) -> Result<ModelReply, Attempt> {
        let mut assembly = crate::sse::Assembly::new(match self.wire {
            Wire::ChatCompletions => Box::<crate::sse::ChatChunks>::default(),
            Wire::Messages => Box::<crate::anthropic::MessageChunks>::default(),
            Wire::Responses => Box::<crate::responses::ResponseEvents>::default(),
        });
        let mut read = 0u64;
        let mut first_token_ms = 0;
        let garbage = |reason: String| {
            Attempt::Fail(ModelError::Garbage {
                url: self.url.clone(),
                reason,
                snippet: String::new(),
            })
        };
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| Attempt::Retry(self.describe(&e), None))?
        {
            read += chunk.len() as u64;
            if read > self.max_response_bytes {
                return Err(Attempt::Fail(ModelError::TooLarge {
                    url: self.url.clone(),
                    limit: self.max_response_bytes,
                }));
            }
            let progress = assembly.feed(&chunk).map_err(garbage)?;
            if progress.generated && first_token_ms == 0 {
                first_token_ms = (started.elapsed().as_millis() as u64).max(1);
            }
            if let (Some(deltas), false) = (deltas, progress.text.is_empty()) {
                deltas(&progress.text);
            }
        }
        if let Some(deltas) = deltas {
            deltas("");
        }
        let mut reply = assembly.finish().map_err(garbage)?;
        reply.first_token_ms = first_token_ms;
        Ok(reply)
    }
}

/// `e` and each error under it, outermost first: reqwest's own message
/// names neither the cause nor the address.
fn error_chain(e: &reqwest::Error) -> Vec<String> {
    let mut said: Vec<String> = vec![e.to_string()];
    let mut cause = std::error::Error::source(e);
    while let Some(error) = cause {
        let text = error.to_string();
        if !said.iter().any(|s| s.contains(&text)) {
            said.push(text);
        }
        cause = error.source();
    }
    said
}

/// The start of a server's text, fit to record: secrets mneme knows are
/// redacted (a server may echo the request's Authorization header) before
/// it is cut, so no part of one is kept.
fn snippet(text: &str) -> String {
    crate::text::redact(text)
        .chars()
        .take(SNIPPET_CHARS)
        .collect()
}

#[async_trait]
impl ModelClient for HttpModelClient {
    async fn complete(
        &self,
        _call: ModelCall,
        request: &PreparedRequest,
        deltas: Option<&Deltas>,
    ) -> Result<ModelReply, ModelError> {
        let body = request.to_vec();
        let started = Instant::now();
        let mut last_failure = String::new();
        for attempt in 1..=MAX_ATTEMPTS {
            match self.attempt(&body, deltas, started).await {
                Ok(mut reply) => {
                    reply.latency_ms = started.elapsed().as_millis() as u64;
                    return Ok(reply);
                }
                Err(Attempt::Fail(error)) => return Err(error),
                Err(Attempt::Retry(reason, retry_after)) => {
                    if attempt < MAX_ATTEMPTS {
                        let backoff = Duration::from_millis(100 << attempt);
                        let wait = retry_after.unwrap_or(backoff).min(Duration::from_secs(10));
                        crate::warn_line!(
                            "mneme: model server {}: {reason} (attempt {attempt} of {MAX_ATTEMPTS}); trying again in {:.1} s",
                            self.url,
                            wait.as_secs_f64()
                        );
                        tokio::time::sleep(wait).await;
                    }
                    last_failure = reason;
                }
            }
        }
        Err(ModelError::Unavailable {
            url: self.url.clone(),
            reason: last_failure,
            attempts: MAX_ATTEMPTS,
        })
    }
}

#[derive(Deserialize)]
struct ChatResponse {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<crate::sse::WireUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: WireMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    /// What llama.cpp, vLLM and DeepSeek return as `reasoning_content`
    /// (newer vLLM and OpenRouter: `reasoning`).
    #[serde(default, alias = "reasoning")]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireCall>>,
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default)]
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: serde_json::Value,
}

/// Parses a chat-completions response, tolerant of what real servers vary
/// on (empty finish reason, `usage: {}`, arguments as an object).
fn parse_reply(url: &str, text: &str) -> Result<ModelReply, ModelError> {
    let garbage = |reason: String| ModelError::Garbage {
        url: url.to_string(),
        reason,
        snippet: snippet(text),
    };
    let response: ChatResponse =
        serde_json::from_str(text).map_err(|e| garbage(format!("not a chat completion: {e}")))?;
    let choice = response
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| garbage("no choices".into()))?;
    let tool_calls = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|call| ToolCall {
            id: call.id,
            name: call.function.name,
            arguments: match call.function.arguments {
                serde_json::Value::String(s) => s,
                serde_json::Value::Null => "{}".to_string(),
                other => other.to_string(),
            },
            invented: None,
        })
        .collect();
    Ok(ModelReply {
        content: choice.message.content,
        reasoning: choice.message.reasoning_content.filter(|r| !r.is_empty()),
        tool_calls,
        usage: response.usage.unwrap_or_default().into(),
        finish_reason: choice.finish_reason.unwrap_or_default(),
        ..ModelReply::default()
    })
}

/// Largest script a scripted model reads.
pub(crate) const MAX_SCRIPT_BYTES: u64 = 16 << 20;

/// Reads a regular file of at most `limit` bytes as text.
pub(crate) fn read_small_file(path: &str, limit: u64) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut text = String::new();
    file.take(limit + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > limit {
        return Err(format!("larger than {limit} bytes"));
    }
    Ok(text)
}

/// Replies read from a JSON file: `{"replies": [{"content": "...",
/// "tool_calls": [{"name": "...", "arguments": {...}}]}, ...]}`. The n-th
/// model request of a session gets the n-th reply, so a resumed session
/// continues the script where the log says it is.
pub(crate) struct ScriptedClient {
    path: String,
    replies: Vec<ScriptedReply>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Script {
    replies: Vec<ScriptedReply>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct ScriptedReply {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ScriptedCall>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct ScriptedCall {
    name: String,
    #[serde(default)]
    arguments: serde_json::Value,
}

impl ScriptedClient {
    /// Reads the script at `path`.
    pub(crate) fn load(path: &str) -> Result<ScriptedClient, ModelError> {
        let error = |reason: String| ModelError::Script {
            path: path.to_string(),
            reason,
        };
        let text = read_small_file(path, MAX_SCRIPT_BYTES).map_err(error)?;
        let script: Script = serde_json::from_str(&text).map_err(|e| error(e.to_string()))?;
        Ok(ScriptedClient {
            path: path.to_string(),
            replies: script.replies,
        })
    }
}

#[async_trait]
impl ModelClient for ScriptedClient {
    async fn complete(
        &self,
        call: ModelCall,
        request: &PreparedRequest,
        _deltas: Option<&Deltas>,
    ) -> Result<ModelReply, ModelError> {
        let index = call.index as usize;
        let scripted = self.replies.get(index).ok_or_else(|| ModelError::Script {
            path: self.path.clone(),
            reason: format!(
                "no reply for model request #{} (the script has {})",
                index + 1,
                self.replies.len()
            ),
        })?;
        let tool_calls: Vec<ToolCall> = scripted
            .tool_calls
            .iter()
            .enumerate()
            .map(|(k, call)| ToolCall {
                id: format!("call_{}_{k}", index + 1),
                name: call.name.clone(),
                arguments: call.arguments.to_string(),
                invented: None,
            })
            .collect();
        Ok(ModelReply {
            content: scripted.content.clone(),
            finish_reason: if tool_calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            }
            .into(),
            tool_calls,
            usage: Usage {
                prompt_tokens: (request.len() / 4) as u64,
                completion_tokens: 0,
                cached_tokens: 0,
                ..Usage::default()
            },
            ..ModelReply::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerates_what_real_servers_vary_on() {
        let text = r#"{"choices":[{"message":{"content":null,"tool_calls":[
            {"id":"","type":"function","function":{"name":"f","arguments":{"a":1}}}]},
            "finish_reason":""}],"usage":{}}"#;
        let reply = parse_reply("u", text).unwrap();
        assert_eq!(reply.tool_calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(reply.usage, Usage::default());
    }

    #[test]
    fn reads_cached_and_reasoning_tokens() {
        let text = r#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8},
                     "completion_tokens_details":{"reasoning_tokens":1}}}"#;
        let reply = parse_reply("u", text).unwrap();
        assert_eq!(reply.usage.cached_tokens, 8);
        assert_eq!(reply.usage.reasoning_tokens, 1);
        assert_eq!(reply.content.as_deref(), Some("hi"));
    }

    #[test]
    fn reads_reasoning_beside_the_text_under_either_name() {
        for name in ["reasoning_content", "reasoning"] {
            let text = format!(
                r#"{{"choices":[{{"message":{{"content":"4","{name}":"2 and 2 make 4"}},"finish_reason":"stop"}}]}}"#
            );
            let reply = parse_reply("u", &text).unwrap();
            assert_eq!(reply.reasoning.as_deref(), Some("2 and 2 make 4"), "{name}");
            assert_eq!(reply.content.as_deref(), Some("4"));
        }
        let none = r#"{"choices":[{"message":{"content":"4","reasoning_content":""}}]}"#;
        assert_eq!(parse_reply("u", none).unwrap().reasoning, None);
    }

    #[test]
    fn garbage_is_named() {
        let err = parse_reply("http://x/v1/chat/completions", "<html>oops").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("garbage") && text.contains("<html>oops"),
            "{text}"
        );
        let err = parse_reply("u", r#"{"choices":[]}"#).unwrap_err();
        assert!(err.to_string().contains("no choices"));
    }
}
