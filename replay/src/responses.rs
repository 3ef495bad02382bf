//! The next request as OpenAI's Responses API takes it, stateless: mneme
//! is the state, so no `previous_response_id` and `store: false`; every
//! output item of every reply (reasoning with its id and
//! `encrypted_content`, messages with their `phase`, function calls) goes
//! back in the `input`, in the order it came, and each call is followed by
//! its `function_call_output`, in call order. The same conversation as
//! [`crate::prompt`] renders for chat completions (refused replies shown
//! without their calls and followed by the reason, a summary in place of
//! compacted entries). A pure function of the events, like every request.

use crate::anthropic::NO_TEXT;
use crate::prompt::{result_text, wire_arguments, REFUSED_PREFIX, SUMMARY_PREFIX};
use crate::spec::AgentSpec;
use crate::state::{CallState, Entry, SessionState};
use serde::Serialize;
use serde_json::{json, Value};

/// What every request asks to be included: the reasoning items' encrypted
/// content, without which a stateless request cannot send them back.
pub const INCLUDE: &[&str] = &["reasoning.encrypted_content"];

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    /// Before the tools: the incremental render splits the body at the
    /// first `"input":[]`, which a tool's schema could also hold.
    input: &'a [Value],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<FunctionTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u64>,
    /// Nothing kept on the server: the log is the conversation.
    store: bool,
    include: &'static [&'static str],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    /// Last, as in chat completions' requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
}

#[derive(Serialize)]
struct FunctionTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
    /// The Responses API makes functions strict unless told: a strict
    /// schema must list every property as required and forbid others,
    /// which an agent file's or an MCP server's schema need not.
    strict: bool,
}

/// The body of a Responses API request for `spec` with `input`, the
/// prefix-cache key `cache_key`; with `widened`, twice the spec's
/// `max_tokens` as `max_output_tokens` (room to finish a cut-off reply).
pub fn body(spec: &AgentSpec, input: &[Value], cache_key: Option<&str>, widened: bool) -> Vec<u8> {
    let limit = match widened {
        true => spec.model.max_tokens.map(|l| l.saturating_mul(2)),
        false => spec.model.max_tokens,
    };
    let request = Request {
        model: &spec.model.model,
        instructions: Some(spec.system.as_str()).filter(|s| !s.is_empty()),
        input,
        tools: spec
            .tools
            .iter()
            .map(|t| FunctionTool {
                kind: "function",
                name: &t.name,
                description: &t.description,
                parameters: &t.parameters,
                strict: false,
            })
            .collect(),
        temperature: spec.model.temperature,
        max_output_tokens: limit,
        store: false,
        include: INCLUDE,
        stream: spec.model.streams(),
        prompt_cache_key: cache_key,
    };
    serde_json::to_vec(&request).expect("requests always serialize")
}

/// The input items of the whole conversation of `state`: any summary, then
/// every entry's.
pub fn input(state: &SessionState) -> Vec<Value> {
    let mut out: Vec<Value> = summary_item(state).into_iter().collect();
    for entry in &state.entries {
        entry_items(entry, &mut out);
    }
    out
}

/// The request asking the model to summarize the conversation in `lines`.
pub fn compaction_request(spec: &AgentSpec, instruction: &str, lines: &str) -> Vec<u8> {
    let request = Request {
        model: &spec.model.model,
        instructions: Some(instruction),
        input: &[message("user", lines)],
        tools: Vec::new(),
        temperature: spec.model.temperature,
        max_output_tokens: spec.model.max_tokens,
        store: false,
        include: &[],
        stream: false,
        prompt_cache_key: None,
    };
    serde_json::to_vec(&request).expect("requests always serialize")
}

/// The summary of compacted entries, as the user message that replaces
/// them.
pub(crate) fn summary_item(state: &SessionState) -> Option<Value> {
    let (_, summary) = state.compacted.as_ref()?;
    Some(message("user", &format!("{SUMMARY_PREFIX}{summary}")))
}

/// The input items of one entry: a user message; or a reply's output
/// items, then one `function_call_output` per call, in call order.
pub(crate) fn entry_items(entry: &Entry, out: &mut Vec<Value>) {
    match entry {
        Entry::User(text) => out.push(message("user", text)),
        Entry::Reply { reply, calls, .. } => {
            match (&reply.refused, reply.items.is_empty()) {
                (None, false) => output_items(&reply.items, calls, out),
                // Its calls never ran, so none of them goes back, nor the
                // reasoning that led to them: its messages alone.
                (Some(_), false) => {
                    out.extend(parsed(&reply.items).filter(|item| item["type"] == "message"))
                }
                // A reply from another API (before a fork), or from a
                // server that sent no items: its text and its calls.
                (_, true) => {
                    let text = reply.content.as_deref().filter(|t| !t.is_empty());
                    if text.is_some() || calls.is_empty() {
                        out.push(message("assistant", text.unwrap_or(NO_TEXT)));
                    }
                    out.extend(calls.iter().map(function_call));
                }
            }
            out.extend(calls.iter().map(|call| {
                json!({"type": "function_call_output", "call_id": call.call.id,
                       "output": result_text(call)})
            }));
            if let Some(reason) = &reply.refused {
                out.push(message("user", &format!("{REFUSED_PREFIX}{reason}")));
            }
        }
    }
}

/// A reply's output items as received, in order, each function call under
/// the id its call was recorded with (the same, unless the server's was
/// unsafe and mneme replaced it), so every call's output follows a call of
/// that id. A reasoning item goes back only before the item it led to: a
/// reply cut off while reasoning leaves none.
fn output_items(items: &[String], calls: &[CallState], out: &mut Vec<Value>) {
    let mut kept = Vec::with_capacity(items.len() + 1);
    let mut next_call = calls.iter();
    for mut item in parsed(items) {
        if item["type"] == "function_call" {
            let Some(call) = next_call.next() else {
                continue; // no recorded call: it would go back without an output
            };
            item["call_id"] = json!(call.call.id);
        }
        kept.push(item);
    }
    kept.extend(next_call.map(function_call));
    while kept.last().is_some_and(|item| item["type"] == "reasoning") {
        kept.pop();
    }
    out.extend(kept);
}

/// Each recorded item as JSON (an erased one is its placeholder text).
fn parsed(items: &[String]) -> impl Iterator<Item = Value> + '_ {
    items
        .iter()
        .map(|item| serde_json::from_str(item).unwrap_or_else(|_| json!(item)))
}

/// A call as a `function_call` item: the model's name and exact arguments.
fn function_call(call: &CallState) -> Value {
    json!({"type": "function_call", "call_id": call.call.id, "name": call.call.sent_name(),
           "arguments": wire_arguments(&call.call.arguments)})
}

fn message(role: &str, text: &str) -> Value {
    json!({"role": role, "content": text})
}
