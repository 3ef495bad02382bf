//! JSON-RPC over a Streamable HTTP MCP server: each message is a POST; an
//! answer comes back as JSON or as a server-sent event stream.
//!
//! Every body is read up to the spec's `max_message_bytes` and no further;
//! header values come from environment variables named in the spec, never
//! from the spec itself.

use super::{RpcError, RpcResult};
use replay::mcp::McpServerSpec;
use serde_json::Value;
use std::sync::Mutex;

/// A Streamable HTTP server's endpoint and the session it gave us.
pub(crate) struct HttpServer {
    client: reqwest::Client,
    url: reqwest::Url,
    headers: reqwest::header::HeaderMap,
    session: Mutex<Option<String>>,
    protocol: Mutex<Option<String>>,
    /// The server forgot our session (HTTP 404 to a request carrying it):
    /// a new connection must initialize again.
    expired: std::sync::atomic::AtomicBool,
    max: usize,
}

impl HttpServer {
    /// The endpoint of `spec`, with headers read from the environment.
    pub(crate) fn new(spec: &McpServerSpec) -> Result<HttpServer, String> {
        let text = spec.url.clone().unwrap_or_default();
        let url = reqwest::Url::parse(&text).map_err(|e| format!("url {text:?}: {e}"))?;
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, var) in &spec.headers_env {
            let value = std::env::var(var)
                .map_err(|_| format!("headers_env {name:?}: variable {var} is not set"))?;
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| format!("header {name:?}: {e}"))?;
            let mut value = reqwest::header::HeaderValue::from_str(&value)
                .map_err(|_| format!("variable {var} does not hold a valid header value"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        // A redirect is not followed: reqwest would carry the headers above
        // to whatever host it names.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(HttpServer {
            client,
            url,
            headers,
            session: Mutex::new(None),
            protocol: Mutex::new(None),
            expired: std::sync::atomic::AtomicBool::new(false),
            max: usize::try_from(spec.max_message_bytes()).unwrap_or(usize::MAX),
        })
    }

    /// Whether the session the server gave is still good.
    pub(crate) fn alive(&self) -> bool {
        !self.expired.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// From now on every request carries `MCP-Protocol-Version: version`.
    pub(crate) fn set_protocol(&self, version: &str) {
        *self.protocol.lock().expect("protocol lock") = Some(version.to_string());
    }

    /// Posts `message`; with `id`, waits for its answer. `idempotency_key`
    /// goes along as the `Idempotency-Key` header.
    /// Header values from the environment are replaced by `[redacted]`
    /// wherever the answer holds them (a server that quotes a bad key).
    pub(crate) async fn post(
        &self,
        message: &Value,
        id: Option<u64>,
        idempotency_key: Option<&str>,
    ) -> RpcResult {
        let secrets: Vec<&str> = (self.headers.values())
            .filter_map(|value| value.to_str().ok())
            .filter(|value| !value.is_empty())
            .collect();
        let answer = self.post_as_sent(message, id, idempotency_key).await;
        super::without_secrets(answer, &secrets)
    }

    async fn post_as_sent(
        &self,
        message: &Value,
        id: Option<u64>,
        idempotency_key: Option<&str>,
    ) -> RpcResult {
        let mut request = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header("Accept", "application/json, text/event-stream")
            .json(message);
        let session = self.session.lock().expect("session lock").clone();
        let had_session = session.is_some();
        if let Some(session) = session {
            request = request.header("Mcp-Session-Id", session);
        }
        if let Some(version) = self.protocol.lock().expect("protocol lock").clone() {
            request = request.header("MCP-Protocol-Version", version);
        }
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        let sent = |e: reqwest::Error| match e.is_connect() || e.is_builder() {
            true => RpcError::NotSent(format!("POST {}: {e}", self.url)),
            false => RpcError::Gone(format!("POST {}: {e}", self.url)),
        };
        let response = request.send().await.map_err(sent)?;
        if let Some(session) = response.headers().get("mcp-session-id") {
            if let Ok(session) = session.to_str() {
                *self.session.lock().expect("session lock") = Some(session.to_string());
            }
        }
        let status = response.status();
        let Some(id) = id else {
            return Ok(Value::Null);
        };
        if status == reqwest::StatusCode::NOT_FOUND && had_session {
            self.expired
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let refused = format!("POST {} answered HTTP {status}", self.url);
        match status.as_u16() {
            200..=299 => {}
            300..=399 => {
                return Err(RpcError::Protocol(format!(
                    "{refused}: mneme does not follow redirects"
                )))
            }
            // The server says it did not take the request.
            400..=499 => return Err(RpcError::Protocol(refused)),
            // It may have acted before it failed.
            _ => return Err(RpcError::Gone(refused)),
        }
        let event_stream = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        match event_stream {
            true => self.answer_from_events(response, id).await,
            false => super::answer_of(self.json_body(response).await?),
        }
    }

    async fn json_body(&self, mut response: reqwest::Response) -> Result<Value, RpcError> {
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(gone)? {
            if body.len() + chunk.len() > self.max {
                return Err(self.too_long());
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body)
            .map_err(|e| RpcError::Protocol(format!("the server's answer is not JSON: {e}")))
    }

    /// Reads server-sent events until the answer to `id`; other messages
    /// (notifications, the server's own requests) are skipped.
    async fn answer_from_events(&self, mut response: reqwest::Response, id: u64) -> RpcResult {
        let mut events = EventStream::default();
        let mut read = 0usize;
        while let Some(chunk) = response.chunk().await.map_err(gone)? {
            read += chunk.len();
            if read > self.max {
                return Err(self.too_long());
            }
            for data in events.feed(&chunk) {
                let Ok(message) = serde_json::from_str::<Value>(&data) else {
                    continue;
                };
                if message.get("method").is_none()
                    && message.get("id").and_then(Value::as_u64) == Some(id)
                {
                    return super::answer_of(message);
                }
            }
        }
        Err(RpcError::Gone(
            "the server's event stream ended without an answer".into(),
        ))
    }

    fn too_long(&self) -> RpcError {
        RpcError::Gone(format!(
            "the server sent a message over {} bytes (max_message_bytes)",
            self.max
        ))
    }
}

fn gone(e: reqwest::Error) -> RpcError {
    RpcError::Gone(format!("reading the server's answer: {e}"))
}

/// Splits a server-sent event stream into the `data` of each event.
#[derive(Default)]
struct EventStream {
    line: Vec<u8>,
    data: Vec<String>,
}

impl EventStream {
    /// Takes the next bytes; returns the data of every event they complete.
    fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut done = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            let line = String::from_utf8_lossy(&self.line)
                .trim_end_matches('\r')
                .to_string();
            self.line.clear();
            if line.is_empty() {
                if !self.data.is_empty() {
                    done.push(self.data.join("\n"));
                    self.data.clear();
                }
            } else if let Some(data) = line.strip_prefix("data:") {
                self.data
                    .push(data.strip_prefix(' ').unwrap_or(data).to_string());
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::EventStream;

    #[test]
    fn events_split_across_chunks_and_lines_join() {
        let mut stream = EventStream::default();
        assert!(stream.feed(b"event: message\r\ndata: {\"a\"").is_empty());
        let done = stream.feed(b":1}\r\n\r\n: comment\n\ndata: x\ndata: y\n\n");
        assert_eq!(done, ["{\"a\":1}", "x\ny"]);
    }
}
