//! Traces of turns over OTLP/HTTP, received by a minimal collector on
//! loopback and checked span by span against the GenAI semantic
//! conventions and against the log: the real binary, a fake model server,
//! real tools.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::scenario::log_events;
use mneme_e2e::*;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode as Code, Span};
use prost::Message;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// What the collector received.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    /// Every request body, as sent.
    bodies: Vec<Vec<u8>>,
    /// The `service.name` of every request's resource.
    services: Vec<String>,
}

/// An OTLP/HTTP trace receiver on loopback: `POST /v1/traces`, protobuf.
struct Collector {
    addr: std::net::SocketAddr,
    received: Arc<Mutex<Received>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Collector {
    async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Received::default()));
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(received.clone());
        let stop = serve_until_dropped(listener, app);
        Collector {
            addr,
            received,
            _stop: stop,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.received.lock().unwrap().spans.clone()
    }

    /// Waits (up to 20 s) until at least `n` spans arrived.
    async fn wait_for(&self, n: usize) -> Vec<Span> {
        eventually(format!("{n} spans"), Duration::from_secs(20), || async {
            let spans = self.spans();
            if spans.len() >= n {
                Ok(spans)
            } else {
                Err(format!("{} spans: {:?}", spans.len(), names(&spans)))
            }
        })
        .await
    }

    /// Every byte received, as one text (to look for what must not be there).
    fn everything(&self) -> String {
        let received = self.received.lock().unwrap();
        String::from_utf8_lossy(&received.bodies.concat()).into_owned()
    }
}

async fn receive(
    State(received): State<Arc<Mutex<Received>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    if headers.get("content-type").and_then(|v| v.to_str().ok()) != Some("application/x-protobuf") {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, "protobuf only").into_response();
    }
    let request = match ExportTraceServiceRequest::decode(&body[..]) {
        Ok(request) => request,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let mut received = received.lock().unwrap();
    received.bodies.push(body.to_vec());
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.unwrap_or_default();
        let service = resource
            .attributes
            .iter()
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.clone()?.value);
        if let Some(Any::StringValue(service)) = service {
            received.services.push(service);
        }
        for scope_spans in resource_spans.scope_spans {
            assert_eq!(scope_spans.scope.unwrap_or_default().name, "mneme");
            received.spans.extend(scope_spans.spans);
        }
    }
    (
        [("content-type", "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn text(span: &Span, key: &str) -> String {
    match attribute(span, key) {
        Some(Any::StringValue(s)) => s.clone(),
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

fn int(span: &Span, key: &str) -> u64 {
    match attribute(span, key) {
        Some(Any::IntValue(n)) => *n as u64,
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

fn flag(span: &Span, key: &str) -> bool {
    match attribute(span, key) {
        Some(Any::BoolValue(b)) => *b,
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

fn texts(span: &Span, key: &str) -> Vec<String> {
    match attribute(span, key) {
        Some(Any::ArrayValue(array)) => array
            .values
            .iter()
            .map(|v| match &v.value {
                Some(Any::StringValue(s)) => s.clone(),
                other => panic!("{}: {key} holds {other:?}", span.name),
            })
            .collect(),
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

fn status(span: &Span) -> Code {
    Code::try_from(span.status.clone().unwrap_or_default().code).unwrap()
}

/// The spans named `name`, in the order of their `mneme.seq`.
fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    let mut found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    found.sort_by_key(|s| match attribute(s, "mneme.seq") {
        Some(Any::IntValue(seq)) => *seq,
        _ => 0,
    });
    found
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "{name} in {:?}", names(spans));
    found[0]
}

/// The events of the log of kind `kind` (the payload, and its seq).
fn events_of(log: &[Value], kind: &str) -> Vec<(u64, Value)> {
    log.iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| (e["seq"].as_u64().unwrap(), e["event"][kind].clone()))
        .collect()
}

/// Content attributes, which are off by default.
const CONTENT: [&str; 4] = [
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
];

const QUESTION: &str = "Who is customer 7? (question-8d1f)";
const ANSWER: &str = "Customer 7 is Ada (answer-5c2e).";

/// A model that asks for `lookup` once, then answers, and its agent.
fn lookup_world() -> TestbedBuilder {
    Testbed::new()
        .replies(vec![
            MockReply::calls(&[("lookup", json!({"customer": 7}))]),
            MockReply::answer(ANSWER),
        ])
        .tools([lookup_tool()])
}

/// The span of the turn of `session` that started from `seq`: its ids
/// are the derived ones, and it is a root.
fn check_turn_ids(turn: &Span, session: Uuid, seq: u64) {
    let (trace_id, span_id) = runtime::store::turn_ids(session, seq);
    assert_eq!(turn.trace_id, trace_id, "{}", turn.name);
    assert_eq!(turn.span_id, span_id, "{}", turn.name);
    assert!(turn.parent_span_id.is_empty(), "the turn is the root");
    assert_eq!(int(turn, "mneme.turn.start_seq"), seq);
}

/// `child` belongs to `turn`'s trace, under it, within its time.
fn check_child(child: &Span, turn: &Span) {
    assert_eq!(child.trace_id, turn.trace_id, "{}", child.name);
    assert_eq!(child.parent_span_id, turn.span_id, "{}", child.name);
    assert!(child.start_time_unix_nano >= turn.start_time_unix_nano);
    assert!(child.start_time_unix_nano <= child.end_time_unix_nano);
    assert!(child.end_time_unix_nano <= turn.end_time_unix_nano);
    assert_eq!(
        text(child, "mneme.session.id"),
        text(turn, "mneme.session.id")
    );
}

/// Each `chat` span says what its ModelReplied says.
fn check_chats(spans: &[Span], log: &[Value], turn: &Span, finish: &[&str]) {
    let session: Uuid = text(turn, "mneme.session.id").parse().unwrap();
    let chats = named(spans, "chat test-model");
    let replies: Vec<(u64, Value)> = events_of(log, "ModelReplied")
        .into_iter()
        .filter(|(seq, _)| chats.iter().any(|c| int(c, "mneme.seq") == *seq))
        .collect();
    assert_eq!(chats.len(), finish.len(), "{:?}", names(spans));
    assert_eq!(
        replies.len(),
        chats.len(),
        "every chat span is a reply of the log"
    );
    for ((chat, (seq, reply)), finish) in chats.iter().zip(&replies).zip(finish) {
        check_child(chat, turn);
        assert_eq!(chat.kind, SpanKind::Client as i32);
        assert_eq!(chat.span_id, runtime::store::event_span_id(session, *seq));
        assert_eq!(text(chat, "gen_ai.operation.name"), "chat");
        assert_eq!(text(chat, "gen_ai.provider.name"), "openai");
        assert_eq!(text(chat, "gen_ai.request.model"), "test-model");
        assert_eq!(text(chat, "gen_ai.conversation.id"), session.to_string());
        assert_eq!(text(chat, "server.address"), "127.0.0.1");
        let usage = &reply["usage"];
        assert_eq!(
            int(chat, "gen_ai.usage.input_tokens"),
            usage["prompt_tokens"].as_u64().unwrap()
        );
        assert!(int(chat, "gen_ai.usage.input_tokens") > 0);
        assert_eq!(
            int(chat, "gen_ai.usage.output_tokens"),
            usage["completion_tokens"].as_u64().unwrap()
        );
        assert_eq!(
            int(chat, "gen_ai.usage.output_tokens"),
            5,
            "as the server said"
        );
        assert_eq!(
            int(chat, "gen_ai.usage.cache_read.input_tokens"),
            usage["cached_tokens"].as_u64().unwrap()
        );
        assert_eq!(texts(chat, "gen_ai.response.finish_reasons"), [*finish]);
        assert_eq!(status(chat), Code::Unset);
    }
}

/// The `execute_tool` span of the call `call_id`, checked against its
/// ToolStarted (the last one: the attempt that finished).
fn check_tool(
    spans: &[Span],
    log: &[Value],
    turn: &Span,
    (tool, call_id, effect, attempt): (&str, &str, &str, u64),
) {
    let span = one(spans, &format!("execute_tool {tool}"));
    check_child(span, turn);
    assert_eq!(span.kind, SpanKind::Internal as i32);
    let (seq, started) = events_of(log, "ToolStarted")
        .into_iter()
        .rev()
        .find(|(_, e)| e["call_id"] == call_id)
        .expect("a ToolStarted");
    let (finished, _) = events_of(log, "ToolFinished")
        .into_iter()
        .find(|(_, e)| e["call_id"] == call_id)
        .expect("a ToolFinished");
    assert_eq!(text(span, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(text(span, "gen_ai.tool.name"), tool);
    assert_eq!(text(span, "gen_ai.tool.call.id"), call_id);
    assert_eq!(int(span, "mneme.seq"), seq);
    assert_eq!(int(span, "mneme.finished_seq"), finished);
    assert_eq!(text(span, "mneme.tool.effect"), effect);
    assert_eq!(int(span, "mneme.tool.attempt"), attempt);
    assert_eq!(
        text(span, "mneme.tool.idempotency_key"),
        started["idempotency_key"].as_str().unwrap(),
        "the key the log recorded"
    );
    assert!(text(span, "mneme.tool.idempotency_key").starts_with("mneme-"));
    assert_eq!(text(span, "mneme.tool.outcome"), "ok");
    assert_eq!(status(span), Code::Unset);
    assert!(attribute(span, "error.type").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_is_one_trace_of_its_model_calls_and_tool_runs_without_content() {
    let bed = lookup_world().await;
    let (world, agent) = (&bed.world, bed.agent_arg());
    let collector = Collector::start().await;
    let out = world
        .mneme()
        .args(["run", "--agent", agent, QUESTION])
        .args(["--otlp-endpoint", &collector.endpoint()])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), ANSWER);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    let session: Uuid = session_id(&out).parse().unwrap();
    // The process sent every span before it exited.
    let spans = collector.spans();
    let mut seen = names(&spans);
    seen.sort();
    assert_eq!(
        seen,
        [
            "chat test-model",
            "chat test-model",
            "execute_tool lookup",
            "invoke_agent test-agent"
        ]
    );
    let log = log_events(world, &session.to_string()).await;
    let turn = one(&spans, "invoke_agent test-agent");
    // SessionStarted is 1, the user's message 2: the turn started there.
    check_turn_ids(turn, session, 2);
    assert_eq!(turn.kind, SpanKind::Internal as i32);
    assert_eq!(text(turn, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(text(turn, "gen_ai.agent.name"), "test-agent");
    assert_eq!(text(turn, "gen_ai.provider.name"), "openai");
    assert_eq!(text(turn, "gen_ai.request.model"), "test-model");
    assert_eq!(text(turn, "mneme.session.id"), session.to_string());
    assert!(!flag(turn, "mneme.turn.resumed"));
    assert_eq!(text(turn, "mneme.turn.outcome"), "answered");
    assert_eq!(int(turn, "mneme.turn.end_seq"), log.len() as u64);
    assert!(turn.links.is_empty(), "a fresh turn resumes nothing");
    assert_eq!(status(turn), Code::Unset);
    check_chats(&spans, &log, turn, &["tool_calls", "stop"]);
    check_tool(&spans, &log, turn, ("lookup", "call_0_0", "read_only", 1));
    // The tool ran between the two model calls.
    let chats = named(&spans, "chat test-model");
    let tool = one(&spans, "execute_tool lookup");
    assert!(chats[0].end_time_unix_nano <= tool.start_time_unix_nano);
    assert!(tool.end_time_unix_nano <= chats[1].end_time_unix_nano);
    // Content is off by default: no message, argument or result, anywhere.
    for span in &spans {
        for key in CONTENT {
            assert!(attribute(span, key).is_none(), "{}: {key}", span.name);
        }
    }
    let everything = collector.everything();
    for secret in [
        "question-8d1f",
        "answer-5c2e",
        r#""name":"Ada""#,
        "customer",
    ] {
        assert!(!everything.contains(secret), "{secret:?} was exported");
    }
    let services = collector.received.lock().unwrap().services.clone();
    assert!(!services.is_empty() && services.iter().all(|s| s == "mneme"));

    // A failed turn says so, and of what kind, but not the reason (a
    // server's text may quote what was said): the log keeps it.
    let out = world
        .mneme()
        .args(["run", "--session", &session.to_string(), "again"])
        .args(["--otlp-endpoint", &collector.endpoint()])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "the model has no third reply");
    let spans = collector.spans();
    let failed = spans
        .iter()
        .find(|s| s.name == "invoke_agent test-agent" && s.span_id != turn.span_id)
        .expect("the second turn's span");
    assert_eq!(text(failed, "mneme.turn.outcome"), "failed");
    assert_eq!(text(failed, "error.type"), "model");
    assert_eq!(status(failed), Code::Error);
    let reason = failed.status.clone().unwrap().message;
    assert!(!reason.contains("scripted"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_is_exported_when_asked_clipped() {
    let bed = lookup_world().await;
    let (world, agent) = (&bed.world, bed.agent_arg());
    let collector = Collector::start().await;
    let out = world
        .mneme()
        .args(["run", "--agent", agent, QUESTION])
        .args(["--otlp-endpoint", &collector.endpoint(), "--otlp-content"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), ANSWER);
    let spans = collector.spans();
    assert_eq!(spans.len(), 4, "{:?}", names(&spans));
    let turn = one(&spans, "invoke_agent test-agent");
    let input: Value = serde_json::from_str(&text(turn, "gen_ai.input.messages")).unwrap();
    assert_eq!(
        input,
        json!([{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}])
    );
    let output: Value = serde_json::from_str(&text(turn, "gen_ai.output.messages")).unwrap();
    assert_eq!(output[0]["parts"][0]["content"], ANSWER);
    let chats = named(&spans, "chat test-model");
    let asked: Value = serde_json::from_str(&text(chats[0], "gen_ai.output.messages")).unwrap();
    assert_eq!(
        asked,
        json!([{"role": "assistant", "finish_reason": "tool_calls", "parts": [
            {"type": "tool_call", "id": "call_0_0", "name": "lookup", "arguments": {"customer": 7}}
        ]}])
    );
    let answered: Value = serde_json::from_str(&text(chats[1], "gen_ai.output.messages")).unwrap();
    assert_eq!(answered[0]["parts"][0]["content"], ANSWER);
    let tool = one(&spans, "execute_tool lookup");
    assert_eq!(
        text(tool, "gen_ai.tool.call.arguments"),
        r#"{"customer":7}"#
    );
    assert_eq!(
        text(tool, "gen_ai.tool.call.result").trim(),
        r#"{"name":"Ada"}"#
    );

    // A long message is clipped to 4 KiB in the span (the log keeps it).
    let long = format!("{}{}", "x".repeat(10_000), "tail-3b9a");
    let session = session_id(&out);
    let out = world
        .mneme()
        .args(["run", "--session", &session, &long])
        .args(["--otlp-endpoint", &collector.endpoint(), "--otlp-content"])
        .output()
        .await
        .unwrap();
    // The model has no third reply: the turn fails, and says so.
    assert!(!out.status.success());
    let spans = collector.spans();
    let turns = named_unsorted(&spans, "invoke_agent test-agent");
    let second = turns.last().unwrap();
    assert_eq!(text(second, "mneme.turn.outcome"), "failed");
    assert_eq!(status(second), Code::Error);
    assert_eq!(text(second, "error.type"), "model");
    let reason = second.status.clone().unwrap().message;
    assert!(
        reason.contains("no scripted reply"),
        "with content: {reason}"
    );
    let input = text(second, "gen_ai.input.messages");
    assert!(input.len() < 4096 + 200, "{} bytes", input.len());
    assert!(input.contains("more bytes]") && !input.contains("tail-3b9a"));
}

fn named_unsorted<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_resumed_after_an_approval_links_to_the_turn_it_continues() {
    let collector = Collector::start().await;
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("refund", json!({"n": 1}))]),
            MockReply::answer("refunded"),
        ])
        .sink_tools(|sink| vec![refund_needing_approval(sink)])
        .await;
    let world = &bed.world;
    let endpoint = collector.endpoint();
    let out = world
        .mneme()
        .args(["run", "--agent", bed.agent_arg(), "refund ada"])
        .args(["--otlp-endpoint", &endpoint])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let session: Uuid = session_id(&out).parse().unwrap();
    let spans = collector.spans();
    let first = one(&spans, "invoke_agent test-agent");
    check_turn_ids(first, session, 2);
    assert_eq!(text(first, "mneme.turn.outcome"), "needs_approval");
    assert!(!flag(first, "mneme.turn.resumed"));
    assert_eq!(
        names(&spans)
            .iter()
            .filter(|n| n.starts_with("execute_tool"))
            .count(),
        0,
        "nothing ran before the approval"
    );

    let out = world
        .mneme()
        .args(["approve", &session.to_string(), "call_0_0", "--by", "ops"])
        .args(["--otlp-endpoint", &endpoint])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "refunded");
    let log = log_events(world, &session.to_string()).await;
    let (resumed_at, _) = events_of(&log, "SessionResumed")[0].clone();
    let spans = collector.spans();
    let turns = named_unsorted(&spans, "invoke_agent test-agent");
    assert_eq!(turns.len(), 2, "{:?}", names(&spans));
    let second = turns[1];
    check_turn_ids(second, session, resumed_at);
    assert_ne!(second.trace_id, first.trace_id, "a trace per turn");
    assert!(flag(second, "mneme.turn.resumed"));
    assert_eq!(text(second, "mneme.turn.outcome"), "answered");
    assert_eq!(int(second, "mneme.turn.continues_seq"), 2);
    assert_eq!(second.links.len(), 1);
    let link = &second.links[0];
    assert_eq!(
        (&link.trace_id, &link.span_id),
        (&first.trace_id, &first.span_id),
        "the link points at the interrupted turn's span"
    );
    let in_second: Vec<Span> = spans
        .iter()
        .filter(|s| s.trace_id == second.trace_id)
        .cloned()
        .collect();
    check_tool(
        &in_second,
        &log,
        second,
        ("refund", "call_0_0", "side_effect", 1),
    );
    check_chats(&in_second, &log, second, &["stop"]);
    let in_first: Vec<Span> = spans
        .iter()
        .filter(|s| s.trace_id == first.trace_id)
        .cloned()
        .collect();
    check_chats(&in_first, &log, first, &["tool_calls"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_resumed_after_a_crash_links_to_the_crashed_turn() {
    let bed = lookup_world().await;
    let (world, agent) = (&bed.world, bed.agent_arg());
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    // Killed once its call is durably started, before the tool runs.
    let out = world
        .mneme()
        .args(["run", "--agent", agent, QUESTION])
        .args(["--otlp-endpoint", &endpoint])
        .env("MNEME_CRASH_AT", "tool_started_durable")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    let session: Uuid = session_id(&out).parse().unwrap();
    let crashed_at = log_events(world, &session.to_string()).await.len() as u64;
    let out = world
        .mneme()
        .args(["resume", &session.to_string()])
        .args(["--otlp-endpoint", &endpoint])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), ANSWER);
    let log = log_events(world, &session.to_string()).await;
    let spans = collector.spans();
    let turn = &one(&spans, "invoke_agent test-agent").clone();
    // The resume recorded the crash, then the turn went on from there.
    let (resumed_at, resumed) = events_of(&log, "SessionResumed")[0].clone();
    assert_eq!(resumed_at, crashed_at + 1);
    assert_eq!(resumed["after_crash"], true, "{resumed}");
    check_turn_ids(turn, session, resumed_at);
    assert!(flag(turn, "mneme.turn.resumed"));
    assert_eq!(text(turn, "mneme.turn.outcome"), "answered");
    assert_eq!(int(turn, "mneme.turn.continues_seq"), 2);
    let (crashed_trace, crashed_span) = runtime::store::turn_ids(session, 2);
    assert_eq!(turn.links.len(), 1);
    assert_eq!(turn.links[0].trace_id, crashed_trace);
    assert_eq!(turn.links[0].span_id, crashed_span);
    let (resumed, crashed): (Vec<Span>, Vec<Span>) =
        spans.into_iter().partition(|s| s.trace_id == turn.trace_id);
    // The call ran again, with the key of its first start.
    check_tool(&resumed, &log, turn, ("lookup", "call_0_0", "read_only", 2));
    let keys: Vec<Value> = events_of(&log, "ToolStarted")
        .into_iter()
        .map(|(_, e)| e["idempotency_key"].clone())
        .collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    check_chats(&resumed, &log, turn, &["stop"]);
    // Whatever the crashed process sent before it died (its first model
    // call, if it got out) sits under the span the link points at.
    for span in &crashed {
        assert_eq!(span.trace_id, crashed_trace, "{}", span.name);
        assert_eq!(span.parent_span_id, crashed_span, "{}", span.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_a_warning_not_the_run() {
    let bed = lookup_world().await;
    let (world, agent) = (&bed.world, bed.agent_arg());
    // A port nobody listens on: connections are refused.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let started = Instant::now();
    let out = world
        .mneme()
        .args(["run", "--agent", agent, QUESTION])
        .args(["--otlp-endpoint", &format!("http://{closed}")])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), ANSWER);
    let err = stderr(&out);
    assert!(
        err.contains(&format!("traces not exported to http://{closed}/v1/traces")),
        "{err}"
    );
    assert_eq!(err.matches("traces not exported").count(), 1, "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let log = log_events(world, &session_id(&out)).await;
    assert_eq!(log.last().unwrap()["kind"], "ModelReplied");

    // Nor does a collector that refuses what it is sent.
    let refusing = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            "/v1/traces",
            post(|| async { (StatusCode::SERVICE_UNAVAILABLE, "busy") }),
        );
        (addr, serve_until_dropped(listener, app))
    };
    let out = world
        .mneme()
        .args(["run", "--agent", agent, QUESTION])
        .args(["--otlp-endpoint", &format!("http://{}", refusing.0)])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), ANSWER);
    assert!(
        stderr(&out).contains("the collector answered 503"),
        "{}",
        stderr(&out)
    );

    // An endpoint that is not a URL is a usage error, before anything runs.
    let out = world
        .mneme()
        .args(["run", "--agent", agent, QUESTION])
        .args(["--otlp-endpoint", "localhost:4318"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--otlp-endpoint"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_traces_the_turns_it_runs() {
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let mut bed = lookup_world()
        .daemon_with(&["--otlp-endpoint", &endpoint])
        .await;
    let id = bed.create().await;
    let daemon = bed.take_daemon();
    let (status, end) = daemon.message_and_wait(&id, QUESTION).await;
    assert_eq!(status, 200, "{end}");
    let spans = collector.wait_for(4).await;
    let session: Uuid = id.parse().unwrap();
    let turn = one(&spans, "invoke_agent test-agent");
    let log = log_events_via(&daemon, &id).await;
    let (message_at, _) = events_of(&log, "UserMessage")[0].clone();
    check_turn_ids(turn, session, message_at);
    check_chats(&spans, &log, turn, &["tool_calls", "stop"]);
    check_tool(&spans, &log, turn, ("lookup", "call_0_0", "read_only", 1));
    assert!(daemon.terminate().await.success());
}

/// The log of `id` as the daemon serves it, in the shape `mneme log
/// --json` prints.
async fn log_events_via(daemon: &DaemonProcess, id: &str) -> Vec<Value> {
    let (status, body) = daemon.get(&format!("/sessions/{id}/events")).await;
    assert_eq!(status, 200, "{body}");
    body.as_array().unwrap_or_else(|| panic!("{body}")).clone()
}
