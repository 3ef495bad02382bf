//! The HTTP tool: arguments as the JSON body (query string for GET), the
//! idempotency key as the `Idempotency-Key` header.

use crate::capture::{truncation_note, Captured, Keep};
use crate::{json_or_text, with_timeout, CallContext, Tool, ToolError};
use async_trait::async_trait;
use replay::spec::ToolSpec;

/// A tool that is one HTTP request.
pub struct HttpTool {
    spec: ToolSpec,
    method: reqwest::Method,
    url: reqwest::Url,
    client: reqwest::Client,
}

impl HttpTool {
    /// Builds the tool; fails if the method or URL is malformed.
    pub fn new(spec: ToolSpec, client: reqwest::Client) -> Result<HttpTool, ToolError> {
        let config = |reason: String| ToolError::Config {
            tool: spec.name.clone(),
            reason,
        };
        let method_name = spec.http_method();
        let method = reqwest::Method::from_bytes(method_name.as_bytes())
            .map_err(|_| config(format!("bad HTTP method {method_name:?}")))?;
        let url_text = spec.url.clone().unwrap_or_default();
        let url = reqwest::Url::parse(&url_text)
            .map_err(|e| config(format!("bad url {url_text:?}: {e}")))?;
        Ok(HttpTool {
            spec,
            method,
            url,
            client,
        })
    }

    fn request(&self, args: &serde_json::Value) -> Result<reqwest::RequestBuilder, ToolError> {
        let builder = self.client.request(self.method.clone(), self.url.clone());
        if self.method != reqwest::Method::GET {
            return Ok(builder.json(args));
        }
        let Some(fields) = args.as_object() else {
            return Err(ToolError::BadArguments {
                tool: self.spec.name.clone(),
                reason: "a GET tool takes a JSON object of query parameters".into(),
            });
        };
        let pairs: Vec<(&String, String)> = fields
            .iter()
            .map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), String::from)))
            .collect();
        Ok(builder.query(&pairs))
    }
}

#[async_trait]
impl Tool for HttpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &CallContext, args: &str) -> Result<String, ToolError> {
        let args: serde_json::Value =
            serde_json::from_str(args).map_err(|e| ToolError::BadArguments {
                tool: self.spec.name.clone(),
                reason: format!("not JSON: {e}"),
            })?;
        let request = self
            .request(&args)?
            .header("Idempotency-Key", &ctx.idempotency_key);
        // Only a request that was never sent (it could not be built, or no
        // connection was made) is known to have had no effect.
        let failed = |e: reqwest::Error| {
            let tool = self.spec.name.clone();
            let reason = format!("{} {}: {e}", self.method, self.url);
            if e.is_connect() || e.is_builder() {
                ToolError::Failed { tool, reason }
            } else {
                ToolError::Interrupted { tool, reason }
            }
        };
        let limit = usize::try_from(self.spec.max_output_bytes()).unwrap_or(usize::MAX);
        with_timeout(&self.spec, async {
            let mut response = request.send().await.map_err(failed)?;
            let status = response.status().as_u16();
            let length = response.content_length();
            let mut body = Captured::default();
            // Read up to the limit and stop: an endless body is not drained.
            while !body.truncated() {
                match response.chunk().await.map_err(failed)? {
                    Some(chunk) => body.take(&chunk, Keep::Head(limit)),
                    None => break,
                }
            }
            let text = body.text(Keep::Head(limit));
            let body = if body.truncated() {
                let (total, complete) = length.map_or((body.total, false), |l| (l, true));
                let note = truncation_note(text.len(), total, complete);
                serde_json::Value::String(text + &note)
            } else {
                json_or_text(&text)
            };
            Ok(serde_json::json!({"status": status, "body": body}).to_string())
        })
        .await
    }
}
