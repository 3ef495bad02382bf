//! OpenAI's Responses API on the reply side: a response (or its stream of
//! events) into a [`ModelReply`]. Every output item is kept as received, in
//! order (reasoning with its id and `encrypted_content`, messages with their
//! `phase`, function calls), to be sent back unchanged; besides, messages'
//! `output_text` joins into the reply's text, `function_call` items become
//! calls (their `call_id`, name and exact argument text), a response
//! `incomplete` for `max_output_tokens` is cut off (`finish_reason`
//! `length`), and usage counts cached and reasoning tokens. A malformed
//! response, item or event is refused, naming what is wrong.

use crate::sse::{Chunks, Progress};
use replay::{ModelReply, ToolCall, Usage};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Characters of a server's error message kept in the error mneme reports.
const MESSAGE_CHARS: usize = 200;

#[derive(Deserialize)]
struct Response {
    #[serde(default)]
    status: Option<String>,
    /// Each item as received: kept whole.
    output: Vec<Value>,
    #[serde(default)]
    incomplete_details: Option<IncompleteDetails>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct IncompleteDetails {
    #[serde(default)]
    reason: Option<String>,
}

/// What mneme reads of an output item (the item itself is kept whole).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item {
    Message {
        #[serde(default)]
        content: Vec<Part>,
    },
    FunctionCall {
        call_id: String,
        name: String,
        #[serde(default)]
        arguments: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part {
    OutputText {
        #[serde(default)]
        text: String,
    },
    Refusal {
        #[serde(default)]
        refusal: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize, Default)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: u64,
}

#[derive(Deserialize, Default)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: u64,
}

impl WireUsage {
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.input_tokens,
            completion_tokens: self.output_tokens,
            cached_tokens: self
                .input_tokens_details
                .as_ref()
                .map_or(0, |d| d.cached_tokens),
            reasoning_tokens: (self.output_tokens_details.as_ref())
                .map_or(0, |d| d.reasoning_tokens),
            ..Usage::default()
        }
    }
}

/// `text`, clipped for an error message.
fn clipped(text: &str) -> String {
    text.chars().take(MESSAGE_CHARS).collect()
}

/// The reply a finished response holds: refused if it failed or did not
/// finish (a background response still queued or in progress).
fn reply_of(response: Response) -> Result<ModelReply, String> {
    match response.status.as_deref() {
        None | Some("completed" | "incomplete") => {}
        Some("failed") => {
            let error = response.error.unwrap_or_default();
            let said = error["message"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_string);
            return Err(format!("the response failed: {}", clipped(&said)));
        }
        Some(other) => {
            return Err(format!(
                "the response is {:?}, not completed",
                clipped(other)
            ))
        }
    }
    let mut content: Option<String> = None;
    let mut tool_calls = Vec::new();
    let mut items = Vec::with_capacity(response.output.len());
    for (i, item) in response.output.into_iter().enumerate() {
        let read =
            Item::deserialize(&item).map_err(|e| format!("output item {i} is malformed: {e}"))?;
        match read {
            Item::Message { content: parts } => {
                for part in parts {
                    let text = match part {
                        Part::OutputText { text } => text,
                        Part::Refusal { refusal } => refusal,
                        Part::Other => continue,
                    };
                    content.get_or_insert_with(String::new).push_str(&text);
                }
            }
            Item::FunctionCall {
                call_id,
                name,
                arguments,
            } => tool_calls.push(ToolCall {
                id: call_id,
                name,
                arguments: match arguments {
                    Value::String(text) => text,
                    Value::Null => "{}".into(),
                    other => other.to_string(),
                },
                invented: None,
            }),
            Item::Other => {}
        }
        items.push(item.to_string());
    }
    let finish_reason = match (response.status.as_deref(), response.incomplete_details) {
        (Some("incomplete"), details) => match details.and_then(|d| d.reason).as_deref() {
            None | Some("max_output_tokens") => replay::event::CUT_OFF.to_string(),
            Some(other) => other.to_string(),
        },
        _ if tool_calls.is_empty() => "stop".into(),
        _ => "tool_calls".into(),
    };
    Ok(ModelReply {
        content,
        items,
        tool_calls,
        usage: response.usage.unwrap_or_default().usage(),
        finish_reason,
        ..ModelReply::default()
    })
}

/// A whole Responses API response.
pub(crate) fn parse_response(text: &str) -> Result<ModelReply, String> {
    let response: Response =
        serde_json::from_str(text).map_err(|e| format!("not a Responses API response: {e}"))?;
    reply_of(response)
}

/// A response streamed as the Responses API's events: the text shown as
/// `response.output_text.delta` brings it; each `response.output_item.done`
/// brings a whole item (in `output_index` order, whatever order they come
/// in); the terminal event (`response.completed`, `response.incomplete` or
/// `response.failed`) brings the status and usage, and the output if no
/// item came on its own.
#[derive(Default)]
pub(crate) struct ResponseEvents {
    items: BTreeMap<u64, Value>,
    end: Option<Response>,
}

/// The events mneme reads; every other kind is skipped.
#[derive(Deserialize)]
#[serde(tag = "type")]
enum Event {
    #[serde(rename = "response.output_text.delta")]
    TextDelta { delta: String },
    #[serde(rename = "response.output_item.done")]
    ItemDone { output_index: u64, item: Value },
    #[serde(
        rename = "response.completed",
        alias = "response.incomplete",
        alias = "response.failed"
    )]
    Ended { response: Response },
    #[serde(rename = "error")]
    Error {
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        code: Option<Value>,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct Kind {
    #[serde(rename = "type")]
    kind: String,
}

impl Chunks for ResponseEvents {
    fn apply(&mut self, data: &str, progress: &mut Progress) -> Result<(), String> {
        // Not the Responses API's, but proxies that speak several APIs end
        // with it; the terminal event is what ends a response.
        if data == "[DONE]" {
            return Ok(());
        }
        let Kind { kind } = serde_json::from_str(data)
            .map_err(|e| format!("a stream event is not a Responses API event: {e}"))?;
        let event: Event = serde_json::from_str(data)
            .map_err(|e| format!("a {:?} event is malformed: {e}", clipped(&kind)))?;
        match event {
            Event::TextDelta { delta } => {
                progress.text.push_str(&delta);
                progress.generated = true;
            }
            Event::ItemDone { output_index, item } => {
                self.items.insert(output_index, item);
                progress.generated = true;
            }
            Event::Ended { response } => self.end = Some(response),
            Event::Error { message, code } => {
                let code = code.map(|c| format!(" ({})", clipped(&c.to_string())));
                return Err(format!(
                    "the stream reported an error: {}{}",
                    clipped(message.as_deref().unwrap_or("no message")),
                    code.unwrap_or_default()
                ));
            }
            Event::Other => progress.generated |= kind.ends_with(".delta"),
        }
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<ModelReply, String> {
        let Some(mut response) = self.end else {
            return Err("the stream ended before the reply did".into());
        };
        if !self.items.is_empty() {
            response.output = self.items.into_values().collect();
        }
        reply_of(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::Assembly;
    use serde_json::json;

    fn reasoning() -> Value {
        json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "4200 cents is 42 EUR"}],
               "encrypted_content": "gAAAAB-secret=="})
    }

    fn call() -> Value {
        json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "charge",
               "arguments": "{\"cents\": 4200}", "status": "completed"})
    }

    fn message(text: &str) -> Value {
        json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "phase": "commentary",
               "content": [{"type": "output_text", "text": text, "annotations": []}]})
    }

    fn response(status: &str, output: Value) -> Value {
        json!({"id": "resp_1", "object": "response", "status": status, "output": output,
               "incomplete_details": if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null },
               "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64},
                         "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 20}, "total_tokens": 130}})
    }

    /// The documented stream of `response`: created, each item added and
    /// done (a message's text in two deltas), then its terminal event.
    fn stream(response: &Value) -> String {
        let terminal = match response["status"].as_str().unwrap() {
            "completed" => "response.completed",
            "incomplete" => "response.incomplete",
            _ => "response.failed",
        };
        let mut events = vec![json!({"type": "response.created", "sequence_number": 0,
            "response": {"id": "resp_1", "status": "in_progress", "output": []}})];
        for (i, item) in response["output"].as_array().unwrap().iter().enumerate() {
            events.push(json!({"type": "response.output_item.added", "output_index": i, "item": {"type": item["type"]}}));
            if item["type"] == "message" {
                let text = item["content"][0]["text"].as_str().unwrap();
                let (a, b) = text.split_at(text.len() / 2);
                for piece in [a, b] {
                    events.push(
                        json!({"type": "response.output_text.delta", "output_index": i,
                                       "content_index": 0, "delta": piece}),
                    );
                }
            }
            events.push(
                json!({"type": "response.output_item.done", "output_index": i, "item": item}),
            );
        }
        events.push(json!({"type": terminal, "response": response}));
        events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect()
    }

    fn assemble(text: &str, read: usize) -> Result<(ModelReply, String), String> {
        let mut assembly = Assembly::new(Box::<ResponseEvents>::default());
        let mut shown = String::new();
        for piece in text.as_bytes().chunks(read) {
            shown.push_str(&assembly.feed(piece)?.text);
        }
        Ok((assembly.finish()?, shown))
    }

    /// Every item is kept as received and in order, whole or streamed
    /// however the bytes are cut; text, calls and usage are read from them.
    #[test]
    fn output_items_are_kept_whole_in_order_streamed_or_not() {
        let whole = response(
            "completed",
            json!([reasoning(), message("Charging."), call()]),
        );
        let reply = parse_response(&whole.to_string()).unwrap();
        assert_eq!(
            reply.items,
            [
                reasoning().to_string(),
                message("Charging.").to_string(),
                call().to_string()
            ]
        );
        assert_eq!(reply.content.as_deref(), Some("Charging."));
        assert_eq!(reply.tool_calls.len(), 1);
        assert_eq!(reply.tool_calls[0].id, "call_1");
        assert_eq!(reply.tool_calls[0].arguments, "{\"cents\": 4200}");
        assert_eq!(reply.finish_reason, "tool_calls");
        let usage = reply.usage;
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
                usage.reasoning_tokens
            ),
            (100, 64, 30, 20)
        );
        let text = stream(&whole);
        for read in [1, 7, text.len()] {
            let (streamed, shown) = assemble(&text, read).unwrap();
            assert_eq!(shown, "Charging.");
            assert_eq!(streamed, reply, "read {read} bytes at a time");
        }
    }

    #[test]
    fn an_incomplete_response_is_cut_off_like_a_length_finish() {
        let whole = response("incomplete", json!([reasoning(), message("The answer is")]));
        let reply = parse_response(&whole.to_string()).unwrap();
        assert!(reply.cut_off());
        assert_eq!(reply.content.as_deref(), Some("The answer is"));
        let (streamed, _) = assemble(&stream(&whole), 64).unwrap();
        assert!(streamed.cut_off());
    }

    #[test]
    fn what_is_malformed_is_named() {
        let refused = |text: &str| parse_response(text).unwrap_err();
        assert!(refused("<html>").contains("not a Responses API response"));
        assert!(refused(r#"{"choices": []}"#).contains("missing field `output`"));
        let no_call_id =
            json!({"status": "completed", "output": [{"type": "function_call", "name": "x"}]});
        let err = refused(&no_call_id.to_string());
        assert!(
            err.contains("output item 0") && err.contains("call_id"),
            "{err}"
        );
        let failed = json!({"status": "failed", "output": [], "error": {"code": "server_error", "message": "boom"}});
        assert!(refused(&failed.to_string()).contains("failed: boom"));
        assert!(refused(r#"{"status": "queued", "output": []}"#).contains("\"queued\""));

        let feed = |events: &str| assemble(events, 16).map(|_| ()).unwrap_err();
        let err = feed("data: {\"type\":\"response.output_item.done\",\"output_index\":0}\n\n");
        assert!(
            err.contains("response.output_item.done") && err.contains("item"),
            "{err}"
        );
        assert!(feed("data: not json\n\n").contains("not a Responses API event"));
        let err = feed(
            "data: {\"type\":\"error\",\"code\":\"rate_limit\",\"message\":\"slow down\"}\n\n",
        );
        assert!(
            err.contains("slow down") && err.contains("rate_limit"),
            "{err}"
        );
        let unfinished = stream(&response("completed", json!([message("Hi")])));
        let cut = &unfinished[..unfinished.find("event: response.completed").unwrap()];
        assert!(feed(cut).contains("ended before the reply did"));
    }
}
