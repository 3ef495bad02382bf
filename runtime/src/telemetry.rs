//! Traces of turns in the OpenTelemetry format, sent over OTLP/HTTP
//! (protobuf), following the GenAI semantic conventions.
//!
//! A [`Tracer`] is given to a [`crate::service::Service`] (or a
//! [`crate::Runner`]); every drive of a session by a runner of it is then one
//! trace: an `invoke_agent <agent>` span for the turn, a `chat <model>` span
//! for each model reply and an `execute_tool <tool>` span for each tool run,
//! children of the turn's span. The spans are built from the events the turn
//! appends (when the log accepted them), so they say what the log says.
//!
//! Ids are derived, not random: a turn's trace and span ids are digests of
//! its session and of the seq of the event it started from ([`turn_ids`]), a
//! child's span id of its session and the seq of its event. A later process
//! can so point at an earlier process's turn without keeping anything: a
//! resumed turn's span carries a link to the span of the turn it continues.
//!
//! Exporting never slows or breaks a turn: spans are handed to a bounded
//! queue ([`OtlpConfig::queue`]; beyond it they are dropped and counted) and
//! sent in batches by a background task, each request bounded by
//! [`OtlpConfig::timeout`]. A collector that is down or refuses costs a
//! warning on stderr, at most once a minute, and the spans of that batch.
//!
//! What people, models and tools said (messages, arguments, results) is left
//! out unless [`OtlpConfig::content`] asks for it; then each text is clipped
//! to [`CONTENT_LIMIT`] bytes.

use crate::error::RuntimeError;
use api::TurnEnd;
use eventlog::Record;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prost::Message as _;
use replay::{Event, SessionState, ToolOutcome};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// Spans waiting to be sent, at most, by default; more are dropped (and
/// counted) until the queue drains.
pub(crate) const DEFAULT_QUEUE: usize = 2048;

/// Bytes of one text (a message, arguments, a result) a span carries at
/// most when content is exported; longer ones are clipped.
pub(crate) const CONTENT_LIMIT: usize = 4096;

/// Spans in one export request, at most.
const MAX_BATCH: usize = 512;

/// A failing collector is warned about at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Where traces go, and what they hold.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// The collector's base URL (`http://127.0.0.1:4318`): spans are POSTed
    /// to `<endpoint>/v1/traces` (a URL already ending in `/v1/traces` is
    /// used as it is).
    pub endpoint: String,
    /// Whether spans carry messages, tool arguments and results (clipped to
    /// 4,096 bytes each).
    pub content: bool,
    /// Spans waiting to be sent, at most.
    pub queue: usize,
    /// How long one export request may take.
    pub timeout: Duration,
}

impl OtlpConfig {
    /// How long one export request may take, by default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// Export to `endpoint`, without content, with the default queue and
    /// timeout.
    pub fn new(endpoint: impl Into<String>) -> OtlpConfig {
        OtlpConfig {
            endpoint: endpoint.into(),
            content: false,
            queue: DEFAULT_QUEUE,
            timeout: OtlpConfig::DEFAULT_TIMEOUT,
        }
    }
}

/// Sends the spans of turns to an OTLP/HTTP collector, from a background
/// task. Cheap to share (`Arc`); see the module's documentation.
pub struct Tracer {
    sender: mpsc::Sender<Queued>,
    url: String,
    content: bool,
    /// Spans dropped because the queue was full.
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("url", &replay::spec::redact_url(&self.url))
            .field("content", &self.content)
            .finish_non_exhaustive()
    }
}

/// What the background task is handed.
enum Queued {
    Span(Box<Span>),
    /// Answer once everything queued before has been sent (or given up).
    Flush(oneshot::Sender<()>),
}

impl Tracer {
    /// Starts exporting to `config.endpoint`; the sending task runs on the
    /// current tokio runtime (so this must be called inside one). Refuses
    /// an endpoint that is not an http(s) URL. A password in the URL is
    /// redacted from everything mneme prints from then on.
    pub fn start(config: OtlpConfig) -> Result<Arc<Tracer>, String> {
        let url = traces_url(&config.endpoint)?;
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .build()
            .map_err(|e| format!("the OTLP client does not start: {e}"))?;
        let (sender, receiver) = mpsc::channel(config.queue.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let exporter = Exporter {
            client,
            url: url.clone(),
            shown: replay::spec::redact_url(&url),
            dropped: dropped.clone(),
            warned: None,
            lost_since_warning: 0,
        };
        tokio::spawn(exporter.run(receiver));
        Ok(Arc::new(Tracer {
            sender,
            url,
            content: config.content,
            dropped,
        }))
    }

    /// The URL spans are POSTed to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Spans dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sends every span queued so far, waiting at most `within` (a process
    /// about to exit calls it, or its last turns' spans are lost). Returns
    /// whether they were all handled in time (sent, or given up on).
    pub async fn flush(&self, within: Duration) -> bool {
        let (done, handled) = oneshot::channel();
        let flushed =
            async { self.sender.send(Queued::Flush(done)).await.is_ok() && handled.await.is_ok() };
        tokio::time::timeout(within, flushed).await.unwrap_or(false)
    }

    fn emit(&self, span: Span) {
        if self.sender.try_send(Queued::Span(Box::new(span))).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The trace of a drive of `session` that starts with its log at
    /// `start_seq` (the head before the drive appends anything).
    pub(crate) fn begin(
        self: &Arc<Tracer>,
        session: Uuid,
        state: &SessionState,
        start_seq: u64,
    ) -> TurnTrace {
        let opened = state.turn_opened;
        // A drive from the event that opened its turn is the turn's first;
        // one from further on continues a turn a crash interrupted.
        let first = opened.seq == start_seq || opened.seq == 0;
        let (resumed, continues) = match first {
            true => (opened.resumed, opened.resumed.then_some(opened.previous)),
            false => (true, Some(opened.seq)),
        };
        let (trace_id, span_id) = turn_ids(session, start_seq);
        let spec = state.spec.as_ref();
        let model = spec.map(|s| &s.model);
        let input = match (self.content, first && !opened.resumed) {
            (true, true) => user_text(state, opened.seq).map(|t| user_messages(&t)),
            _ => None,
        };
        let mut names = HashMap::new();
        for call in state.open_calls() {
            names.insert(call.call.id.clone(), call.call.name.clone());
        }
        TurnTrace {
            tracer: self.clone(),
            session,
            trace_id,
            span_id,
            start_seq,
            started: now_ns(),
            resumed,
            continues: continues.filter(|seq| *seq > 0),
            agent: spec.map(|s| s.name.clone()).unwrap_or_default(),
            provider: model.map(|m| m.provider.clone()).unwrap_or_default(),
            model: model.map(|m| m.model.clone()).unwrap_or_default(),
            max_tokens: model.and_then(|m| m.max_tokens),
            server: model
                .and_then(|m| m.base_url.as_deref())
                .and_then(server_of),
            input,
            names,
            running: HashMap::new(),
            did_something: false,
        }
    }
}

/// The trace id and span id of the turn of `session` that started from
/// the event at `seq` (the head of its log when the drive began: the
/// user's message, the resume, or, after a crash, the last event the
/// crashed process wrote): the first 16 and 8 bytes of SHA-256 of
/// `"mneme.trace"` or `"mneme.turn"`, the session's 16 bytes and `seq`
/// (8 bytes, big-endian).
pub fn turn_ids(session: Uuid, seq: u64) -> ([u8; 16], [u8; 8]) {
    let trace = digest("mneme.trace", session, seq);
    let span = digest("mneme.turn", session, seq);
    (
        nonzero(trace[..16].try_into().expect("16 bytes")),
        span_id(span),
    )
}

/// The span id of the model call or tool run whose event (`ModelReplied`,
/// `ToolStarted`) is `seq` of `session`.
pub fn event_span_id(session: Uuid, seq: u64) -> [u8; 8] {
    span_id(digest("mneme.span", session, seq))
}

fn digest(what: &str, session: Uuid, seq: u64) -> [u8; 32] {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(what.as_bytes());
    hasher.update(session.as_bytes());
    hasher.update(seq.to_be_bytes());
    hasher.finalize().into()
}

fn span_id(digest: [u8; 32]) -> [u8; 8] {
    nonzero(digest[..8].try_into().expect("8 bytes"))
}

/// An id of all zeros is invalid in OpenTelemetry.
fn nonzero<const N: usize>(mut id: [u8; N]) -> [u8; N] {
    if id.iter().all(|b| *b == 0) {
        id[N - 1] = 1;
    }
    id
}

/// `endpoint/v1/traces`, checked.
fn traces_url(endpoint: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(endpoint.trim())
        .map_err(|e| format!("the OTLP endpoint {endpoint:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "the OTLP endpoint {endpoint:?} is not an http or https URL"
        ));
    }
    if let Some(password) = url.password() {
        crate::text::register_secret(password);
    }
    let text = url.as_str().trim_end_matches('/');
    Ok(match text.ends_with("/v1/traces") {
        true => text.to_string(),
        false => format!("{text}/v1/traces"),
    })
}

/// `server.address` and `server.port` of a model server's base URL.
fn server_of(base_url: &str) -> Option<(String, u16)> {
    let url = reqwest::Url::parse(base_url).ok()?;
    Some((url.host_str()?.to_string(), url.port_or_known_default()?))
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The text of the user's message at `seq`, if the state still holds it.
fn user_text(state: &SessionState, seq: u64) -> Option<String> {
    let at = state.entry_seqs.iter().position(|s| *s == seq)?;
    match state.entries.get(at)? {
        replay::Entry::User(text) => Some(text.clone()),
        replay::Entry::Reply { .. } => None,
    }
}

/// `text` cut to at most [`CONTENT_LIMIT`] bytes (on a character
/// boundary), saying how much was left out.
pub(crate) fn clip(text: &str) -> String {
    if text.len() <= CONTENT_LIMIT {
        return text.to_string();
    }
    let mut end = CONTENT_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[{} more bytes]", &text[..end], text.len() - end)
}

/// `gen_ai.input.messages` of a user's message.
fn user_messages(text: &str) -> String {
    serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": clip(text)}]}])
        .to_string()
}

/// `gen_ai.output.messages` of a reply.
fn output_messages(reply: &replay::ModelReply) -> String {
    let mut parts = Vec::new();
    if let Some(text) = reply.content.as_deref().filter(|t| !t.is_empty()) {
        parts.push(serde_json::json!({"type": "text", "content": clip(text)}));
    }
    for call in &reply.tool_calls {
        let arguments = match call.arguments.len() <= CONTENT_LIMIT {
            true => serde_json::from_str(&call.arguments)
                .unwrap_or_else(|_| serde_json::Value::String(call.arguments.clone())),
            false => serde_json::Value::String(clip(&call.arguments)),
        };
        parts.push(serde_json::json!({"type": "tool_call", "id": call.id, "name": call.sent_name(), "arguments": arguments}));
    }
    serde_json::json!([{"role": "assistant", "parts": parts, "finish_reason": reply.finish_reason}])
        .to_string()
}

/// One attribute.
fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn text(key: &str, value: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.into()))
}

fn int(key: &str, value: u64) -> KeyValue {
    kv(
        key,
        any_value::Value::IntValue(value.min(i64::MAX as u64) as i64),
    )
}

fn flag(key: &str, value: bool) -> KeyValue {
    kv(key, any_value::Value::BoolValue(value))
}

fn texts(key: &str, values: &[&str]) -> KeyValue {
    let values = values
        .iter()
        .map(|v| AnyValue {
            value: Some(any_value::Value::StringValue(v.to_string())),
        })
        .collect();
    kv(key, any_value::Value::ArrayValue(ArrayValue { values }))
}

fn error_status(message: String) -> Option<Status> {
    Some(Status {
        message,
        code: status::StatusCode::Error as i32,
    })
}

/// A tool run under way: its `ToolStarted`.
struct Running {
    seq: u64,
    started: u64,
    tool: String,
    args: String,
    effect: String,
    key: String,
    attempt: u32,
}

/// How a tool run ended, as its span tells it.
enum Ran<'a> {
    /// `ToolFinished`: it returned, or failed.
    Finished(u64, &'a ToolOutcome),
    /// `ToolInDoubt`: it may have acted and cannot run again safely.
    InDoubt(u64),
    /// Its outcome is unknown and it runs again (with the same key).
    Unknown,
    /// Still running when the turn ended (a pause gave up on it).
    Interrupted,
}

/// The trace of one drive of a session, fed what it appends.
pub(crate) struct TurnTrace {
    tracer: Arc<Tracer>,
    session: Uuid,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    start_seq: u64,
    started: u64,
    resumed: bool,
    /// The seq the turn this one continues started from, if any.
    continues: Option<u64>,
    agent: String,
    provider: String,
    model: String,
    max_tokens: Option<u64>,
    server: Option<(String, u16)>,
    /// `gen_ai.input.messages` of the turn, with content.
    input: Option<String>,
    /// Tools by call id, of the calls this turn may settle.
    names: HashMap<String, String>,
    /// Tool runs under way, by call id.
    running: HashMap<String, Running>,
    /// Whether the drive appended anything but signed heads.
    did_something: bool,
}

impl TurnTrace {
    fn child(&self, name: String, kind: span::SpanKind, seq: u64, start: u64) -> Span {
        Span {
            trace_id: self.trace_id.to_vec(),
            span_id: event_span_id(self.session, seq).to_vec(),
            parent_span_id: self.span_id.to_vec(),
            name,
            kind: kind as i32,
            start_time_unix_nano: start.max(self.started),
            end_time_unix_nano: now_ns().max(self.started),
            flags: 1,
            ..Default::default()
        }
    }

    fn common(&self, operation: &str) -> Vec<KeyValue> {
        vec![
            text("gen_ai.operation.name", operation),
            text("gen_ai.conversation.id", self.session.to_string()),
            text("mneme.session.id", self.session.to_string()),
        ]
    }

    /// `events` were appended as `records` (by this drive).
    pub(crate) fn appended(&mut self, records: &[Record], events: &[Event]) {
        for (record, event) in records.iter().zip(events) {
            let seq = record.envelope.seq;
            if !matches!(event, Event::HeadSigned { .. }) {
                self.did_something = true;
            }
            match event {
                Event::ModelReplied(reply) => {
                    for call in &reply.tool_calls {
                        self.names.insert(call.id.clone(), call.name.clone());
                    }
                    self.model_span(seq, reply);
                }
                Event::ToolStarted {
                    call_id,
                    tool,
                    args,
                    effect,
                    idempotency_key,
                    attempt,
                } => {
                    if let Some(earlier) = self.running.remove(call_id) {
                        self.tool_span(call_id, earlier, Ran::Unknown);
                    }
                    let running = Running {
                        seq,
                        started: now_ns(),
                        tool: tool.clone(),
                        args: args.clone(),
                        effect: effect.to_string(),
                        key: idempotency_key.clone(),
                        attempt: *attempt,
                    };
                    self.running.insert(call_id.clone(), running);
                }
                Event::ToolFinished {
                    call_id,
                    outcome,
                    duration_ms,
                    ..
                } => {
                    let run = self.running.remove(call_id).unwrap_or_else(|| Running {
                        // Settled without running (no such tool): its own event.
                        seq,
                        started: now_ns().saturating_sub(duration_ms * 1_000_000),
                        tool: self.names.get(call_id).cloned().unwrap_or_default(),
                        args: String::new(),
                        effect: String::new(),
                        key: String::new(),
                        attempt: 0,
                    });
                    self.tool_span(call_id, run, Ran::Finished(seq, outcome));
                }
                Event::ToolInDoubt { call_id, .. } => {
                    if let Some(run) = self.running.remove(call_id) {
                        self.tool_span(call_id, run, Ran::InDoubt(seq));
                    }
                }
                _ => {}
            }
        }
    }

    fn model_span(&self, seq: u64, reply: &replay::ModelReply) {
        let end = now_ns();
        let start = end.saturating_sub(reply.latency_ms.saturating_mul(1_000_000));
        let mut span = self.child(
            format!("chat {}", self.model),
            span::SpanKind::Client,
            seq,
            start,
        );
        let usage = &reply.usage;
        let mut attributes = self.common("chat");
        attributes.extend([
            text("gen_ai.provider.name", &*self.provider),
            text("gen_ai.request.model", &*self.model),
            int("gen_ai.usage.input_tokens", usage.prompt_tokens),
            int("gen_ai.usage.output_tokens", usage.completion_tokens),
            int("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens),
            int(
                "gen_ai.usage.cache_creation.input_tokens",
                usage.cache_write_tokens,
            ),
            texts("gen_ai.response.finish_reasons", &[&reply.finish_reason]),
            int("mneme.seq", seq),
        ]);
        if let Some(max) = self.max_tokens {
            attributes.push(int("gen_ai.request.max_tokens", max));
        }
        if let Some((host, port)) = &self.server {
            attributes.push(text("server.address", host));
            attributes.push(int("server.port", u64::from(*port)));
        }
        if reply.first_token_ms > 0 {
            attributes.push(int("mneme.model.first_token_ms", reply.first_token_ms));
        }
        if let Some(reason) = &reply.refused {
            attributes.push(text("mneme.reply.refused", clip(reason)));
        }
        if self.tracer.content {
            attributes.push(text("gen_ai.output.messages", output_messages(reply)));
        }
        span.attributes = attributes;
        self.tracer.emit(span);
    }

    fn tool_span(&self, call_id: &str, run: Running, ran: Ran<'_>) {
        let mut span = self.child(
            format!("execute_tool {}", run.tool),
            span::SpanKind::Internal,
            run.seq,
            run.started,
        );
        let mut attributes = self.common("execute_tool");
        attributes.extend([
            text("gen_ai.tool.name", &*run.tool),
            text("gen_ai.tool.type", "function"),
            text("gen_ai.tool.call.id", call_id),
            int("mneme.seq", run.seq),
        ]);
        if run.attempt > 0 {
            attributes.extend([
                text("mneme.tool.effect", run.effect),
                int("mneme.tool.attempt", u64::from(run.attempt)),
                text("mneme.tool.idempotency_key", run.key),
            ]);
        }
        if self.tracer.content && !run.args.is_empty() {
            attributes.push(text("gen_ai.tool.call.arguments", clip(&run.args)));
        }
        let (outcome, error) = match ran {
            Ran::Finished(seq, ToolOutcome::Ok(output)) => {
                attributes.push(int("mneme.finished_seq", seq));
                if self.tracer.content {
                    attributes.push(text("gen_ai.tool.call.result", clip(output)));
                }
                ("ok", None)
            }
            Ran::Finished(seq, ToolOutcome::Err(message)) => {
                attributes.push(int("mneme.finished_seq", seq));
                if self.tracer.content {
                    attributes.push(text("gen_ai.tool.call.result", clip(message)));
                }
                let shown = match self.tracer.content {
                    true => clip(message),
                    false => String::new(),
                };
                ("error", Some(("tool_error", shown)))
            }
            Ran::InDoubt(seq) => {
                attributes.push(int("mneme.finished_seq", seq));
                let why = "its outcome is unknown and it is unsafe to run again: a person decides";
                ("in_doubt", Some(("in_doubt", why.to_string())))
            }
            Ran::Unknown => {
                let why = "its outcome is unknown: it runs again with the same idempotency key";
                ("unknown", Some(("unknown_outcome", why.to_string())))
            }
            Ran::Interrupted => {
                let why = "still running when the turn ended; it runs again when the turn resumes";
                ("interrupted", Some(("interrupted", why.to_string())))
            }
        };
        attributes.push(text("mneme.tool.outcome", outcome));
        if let Some((kind, message)) = error {
            attributes.push(text("error.type", kind));
            span.status = error_status(message);
        }
        span.attributes = attributes;
        self.tracer.emit(span);
    }

    /// The drive ended with `end`, the session's state `state`: the
    /// turn's span (none for a drive that appended nothing but a signed
    /// head: it had nothing to do).
    pub(crate) fn end(mut self, end: Result<&TurnEnd, &RuntimeError>, state: &SessionState) {
        for (call_id, run) in std::mem::take(&mut self.running) {
            self.tool_span(&call_id, run, Ran::Interrupted);
        }
        if !self.did_something {
            return;
        }
        let mut span = Span {
            trace_id: self.trace_id.to_vec(),
            span_id: self.span_id.to_vec(),
            name: format!("invoke_agent {}", self.agent),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: self.started,
            end_time_unix_nano: now_ns().max(self.started),
            flags: 1,
            ..Default::default()
        };
        let mut attributes = self.common("invoke_agent");
        attributes.extend([
            text("gen_ai.agent.name", &*self.agent),
            text("gen_ai.provider.name", &*self.provider),
            text("gen_ai.request.model", &*self.model),
            flag("mneme.turn.resumed", self.resumed),
            int("mneme.turn.start_seq", self.start_seq),
            int("mneme.turn.end_seq", state.last_seq),
        ]);
        if let Some(seq) = self.continues {
            let (trace_id, span_id) = turn_ids(self.session, seq);
            attributes.push(int("mneme.turn.continues_seq", seq));
            span.links.push(span::Link {
                trace_id: trace_id.to_vec(),
                span_id: span_id.to_vec(),
                attributes: vec![text("mneme.link", "resumes")],
                flags: 1,
                ..Default::default()
            });
        }
        let (outcome, error) = match end {
            Ok(TurnEnd::Answered(_)) => ("answered", None),
            Ok(TurnEnd::CutOffAnswer(_)) => ("cut_off", None),
            Ok(TurnEnd::NeedsDecision(_)) => ("needs_decision", None),
            Ok(TurnEnd::NeedsApproval(_)) => ("needs_approval", None),
            Ok(TurnEnd::Paused(_)) => ("paused", None),
            Ok(TurnEnd::BudgetSpent(_)) => ("budget_spent", None),
            Ok(TurnEnd::Cancelled(_)) => ("cancelled", None),
            Ok(TurnEnd::Sleeping { .. }) => ("sleeping", None),
            Ok(TurnEnd::Failed(reason)) => ("failed", Some(("failed", reason.clone()))),
            Err(error) => ("failed", Some((error_type(error), error.to_string()))),
        };
        attributes.push(text("mneme.turn.outcome", outcome));
        if let Some((kind, message)) = error {
            attributes.push(text("error.type", kind));
            // A reason may quote what a server or tool said: content.
            let message = match self.tracer.content {
                true => clip(&message),
                false => format!("the turn failed ({kind}); `mneme log` says why"),
            };
            span.status = error_status(message);
        }
        if self.tracer.content {
            if let Some(input) = self.input.take() {
                attributes.push(text("gen_ai.input.messages", input));
            }
            if let Ok(TurnEnd::Answered(answer) | TurnEnd::CutOffAnswer(answer)) = end {
                let output = serde_json::json!([{"role": "assistant", "parts": [{"type": "text", "content": clip(answer)}]}]);
                attributes.push(text("gen_ai.output.messages", output.to_string()));
            }
        }
        span.attributes = attributes;
        self.tracer.emit(span);
    }
}

/// `error.type` of a turn that ended in an error: what kind of error.
fn error_type(error: &RuntimeError) -> &'static str {
    match error {
        RuntimeError::Log(_) => "log",
        RuntimeError::Decode { .. } => "decode",
        RuntimeError::Model(_) => "model",
        RuntimeError::Tool(_) => "tool",
        RuntimeError::Spec { .. } => "spec",
        RuntimeError::Signing(_) => "signing",
        _ => "_OTHER",
    }
}

/// The background task: takes what is queued, sends it in batches.
struct Exporter {
    client: reqwest::Client,
    url: String,
    /// `url` as warnings show it (without credentials).
    shown: String,
    dropped: Arc<AtomicU64>,
    /// When a failure was last warned about.
    warned: Option<Instant>,
    /// Spans lost since (sent to a failing collector, or dropped).
    lost_since_warning: u64,
}

impl Exporter {
    async fn run(mut self, mut queue: mpsc::Receiver<Queued>) {
        let mut dropped_seen = 0;
        while let Some(first) = queue.recv().await {
            let mut spans = Vec::new();
            let mut flushes = Vec::new();
            let mut next = Some(first);
            while let Some(queued) = next {
                match queued {
                    Queued::Span(span) => spans.push(*span),
                    Queued::Flush(done) => flushes.push(done),
                }
                next = match spans.len() < MAX_BATCH {
                    true => queue.try_recv().ok(),
                    false => None,
                };
            }
            let dropped = self.dropped.load(Ordering::Relaxed);
            if dropped > dropped_seen {
                let newly = dropped - dropped_seen;
                dropped_seen = dropped;
                self.failed(newly, "the queue of spans to send was full".into());
            }
            if !spans.is_empty() {
                let count = spans.len() as u64;
                if let Err(reason) = self.send(spans).await {
                    self.failed(count, reason);
                }
            }
            for done in flushes {
                let _ = done.send(());
            }
        }
    }

    async fn send(&self, spans: Vec<Span>) -> Result<(), String> {
        let body = request(spans).encode_to_vec();
        let response = self
            .client
            .post(&self.url)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        match response.status() {
            status if status.is_success() => Ok(()),
            status => Err(format!("the collector answered {status}")),
        }
    }

    /// `lost` spans were not sent, for `reason`: warns, at most once a
    /// minute, counting what was lost in between.
    fn failed(&mut self, lost: u64, reason: String) {
        self.lost_since_warning += lost;
        if self.warned.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        self.warned = Some(Instant::now());
        crate::warn_line!(
            "mneme: warning: traces not exported to {}: {reason} ({} spans lost; warned at most once a minute)",
            self.shown,
            std::mem::take(&mut self.lost_since_warning)
        );
    }
}

/// The export request of `spans`: this process as the resource, mneme as
/// the instrumentation scope.
fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "mneme".into());
    let version = env!("CARGO_PKG_VERSION");
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", service),
                    text("service.version", version),
                    int("process.pid", u64::from(std::process::id())),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "mneme".into(),
                    version: version.into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_derived_from_session_and_seq_and_never_zero() {
        let session = Uuid::now_v7();
        assert_eq!(turn_ids(session, 2), turn_ids(session, 2));
        assert_ne!(turn_ids(session, 2), turn_ids(session, 3));
        assert_ne!(turn_ids(session, 2).1, event_span_id(session, 2));
        assert_ne!(nonzero([0u8; 8]), [0u8; 8]);
    }

    #[test]
    fn the_traces_url_is_the_endpoint_and_v1_traces() {
        for (endpoint, url) in [
            ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
            ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
            (
                "https://c.example/otlp/",
                "https://c.example/otlp/v1/traces",
            ),
            (
                "http://127.0.0.1:4318/v1/traces",
                "http://127.0.0.1:4318/v1/traces",
            ),
        ] {
            assert_eq!(traces_url(endpoint).unwrap(), url);
        }
        assert!(traces_url("127.0.0.1:4318").is_err());
        assert!(traces_url("ftp://host/").is_err());
    }

    #[test]
    fn clipping_keeps_characters_whole_and_says_how_much_went() {
        let long = "é".repeat(CONTENT_LIMIT);
        let clipped = clip(&long);
        assert!(clipped.starts_with(&"é".repeat(CONTENT_LIMIT / 2)));
        assert!(clipped.ends_with(&format!("…[{} more bytes]", CONTENT_LIMIT)));
        assert_eq!(clip("short"), "short");
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_and_a_dead_collector_is_no_error() {
        // A port nothing listens on any more: refused at once.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap();
        let mut config = OtlpConfig::new(format!("http://{closed}"));
        config.queue = 2;
        let tracer = Tracer::start(config).unwrap();
        for _ in 0..10 {
            tracer.emit(Span::default());
        }
        assert!(tracer.dropped() > 0);
        assert!(tracer.flush(Duration::from_secs(10)).await);
    }
}
