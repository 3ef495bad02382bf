//! OpenAI's Responses API as a loopback server speaks it (through
//! [`crate::hostile::HostileModel`], at `/v1/responses`): responses, their
//! output items and their streams of events, in the documented shapes.

use crate::hostile::Answer;
use serde_json::{json, Value};

/// A reasoning item with its id, a summary and its encrypted content.
pub fn reasoning(id: &str, summary: &str, encrypted: &str) -> Value {
    json!({"type": "reasoning", "id": id, "encrypted_content": encrypted,
           "summary": [{"type": "summary_text", "text": summary}]})
}

/// A function call item: `call_id`, the tool's `name`, `arguments` as the
/// JSON text the API carries.
pub fn function_call(call_id: &str, name: &str, arguments: Value) -> Value {
    json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
           "name": name, "arguments": arguments.to_string(), "status": "completed"})
}

/// An assistant message item saying `text`, with its `phase` if given.
pub fn message(id: &str, text: &str, phase: Option<&str>) -> Value {
    let mut item = json!({"type": "message", "id": id, "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}]});
    if let Some(phase) = phase {
        item["phase"] = json!(phase);
    }
    item
}

/// A completed response with `output`; usage with 64 cached prompt tokens
/// of 100 and 20 reasoning tokens of 30.
pub fn response(output: Vec<Value>) -> Value {
    json!({"id": "resp_1", "object": "response", "status": "completed", "model": "test-model",
           "output": output, "incomplete_details": null, "error": null,
           "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64},
                     "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 20},
                     "total_tokens": 130}})
}

/// A response `max_output_tokens` cut off, with the `output` it had.
pub fn incomplete(output: Vec<Value>) -> Value {
    let mut response = response(output);
    response["status"] = json!("incomplete");
    response["incomplete_details"] = json!({"reason": "max_output_tokens"});
    for item in response["output"].as_array_mut().unwrap() {
        item["status"] = json!("incomplete");
    }
    response
}

/// `response` as the server answers it: one JSON body, or its stream.
pub fn answer(response: Value, streamed: bool) -> Answer {
    match streamed {
        true => Answer::Sse(stream(&response)),
        false => Answer::Json(response),
    }
}

/// One server-sent event of the Responses API, as it is written.
pub fn event(data: &Value) -> String {
    format!(
        "event: {}\ndata: {data}\n\n",
        data["type"].as_str().unwrap_or("message")
    )
}

/// The documented stream of `response`: `response.created` and
/// `response.in_progress`; for each output item, `output_item.added`, its
/// deltas (a message's text in two pieces, a call's arguments) and
/// `output_item.done`; then `response.completed` (or `.incomplete`), which
/// holds the whole response. Every event numbered by `sequence_number`.
pub fn stream(response: &Value) -> Vec<String> {
    let status = response["status"].as_str().unwrap();
    let started =
        json!({"id": response["id"], "object": "response", "status": "in_progress", "output": []});
    let mut events = vec![
        json!({"type": "response.created", "response": started}),
        json!({"type": "response.in_progress", "response": started}),
    ];
    for (i, item) in response["output"].as_array().unwrap().iter().enumerate() {
        let mut added = item.clone();
        added["status"] = json!("in_progress");
        let id = &item["id"];
        match item["type"].as_str().unwrap() {
            "message" => {
                added["content"] = json!([]);
                events.push(
                    json!({"type": "response.output_item.added", "output_index": i, "item": added}),
                );
                let text = item["content"][0]["text"].as_str().unwrap();
                let half = text
                    .char_indices()
                    .nth(text.chars().count() / 2)
                    .map_or(0, |(at, _)| at);
                events.push(json!({"type": "response.content_part.added", "item_id": id, "output_index": i,
                                   "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}));
                for piece in [&text[..half], &text[half..]] {
                    events.push(json!({"type": "response.output_text.delta", "item_id": id, "output_index": i,
                                       "content_index": 0, "delta": piece}));
                }
                events.push(
                    json!({"type": "response.output_text.done", "item_id": id, "output_index": i,
                                   "content_index": 0, "text": text}),
                );
                events.push(
                    json!({"type": "response.content_part.done", "item_id": id, "output_index": i,
                                   "content_index": 0, "part": item["content"][0]}),
                );
            }
            "function_call" => {
                added["arguments"] = json!("");
                events.push(
                    json!({"type": "response.output_item.added", "output_index": i, "item": added}),
                );
                events.push(
                    json!({"type": "response.function_call_arguments.delta", "item_id": id,
                                   "output_index": i, "delta": item["arguments"]}),
                );
                events.push(
                    json!({"type": "response.function_call_arguments.done", "item_id": id,
                                   "output_index": i, "arguments": item["arguments"]}),
                );
            }
            _ => {
                events.push(
                    json!({"type": "response.output_item.added", "output_index": i, "item": added}),
                );
            }
        }
        events.push(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
    }
    let terminal = match status {
        "incomplete" => "response.incomplete",
        "failed" => "response.failed",
        _ => "response.completed",
    };
    events.push(json!({"type": terminal, "response": response}));
    events
        .iter_mut()
        .enumerate()
        .map(|(n, e)| {
            e["sequence_number"] = json!(n);
            event(e)
        })
        .collect()
}
