//! The next request as Anthropic's Messages API takes it: the same
//! conversation as [`crate::prompt`] renders for chat completions (the same
//! entries, results in call order, refused replies shown without their
//! calls and followed by the reason), in the Messages API's shapes, with
//! prompt-cache breakpoints on the stable prefix mneme knows: the tools, the
//! system prompt, and the end of the conversation before the newest entry.
//! A pure function of the events, like every request.

use crate::event::ToolOutcome;
use crate::prompt::{result_text, REFUSED_PREFIX, SUMMARY_PREFIX, UNPARSED_ARGUMENTS};
use crate::spec::AgentSpec;
use crate::state::{CallPhase, Entry, SessionState};
use serde_json::{json, Value};

/// `max_tokens` when the spec gives none (the Messages API requires one).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Text shown for an assistant turn that had no text (the Messages API
/// refuses an empty turn).
pub(crate) const NO_TEXT: &str = "[mneme] (no text)";

/// The body of the next Messages API request of `state`; with `widened`,
/// twice the spec's `max_tokens` (room to finish a cut-off reply).
pub fn request(state: &SessionState, widened: bool) -> Option<Vec<u8>> {
    let spec = state.spec.as_ref()?;
    let mut messages = Vec::new();
    if let Some((_, summary)) = &state.compacted {
        push(
            &mut messages,
            "user",
            text_block(&format!("{SUMMARY_PREFIX}{summary}")),
        );
    }
    let mut stable = None;
    for (i, entry) in state.entries.iter().enumerate() {
        if i + 1 == state.entries.len() {
            stable = last_block(&messages);
        }
        entry_blocks(entry, &mut messages);
    }
    if let Some((message, block)) = stable {
        let block = &mut messages[message]["content"][block];
        *block = cached(block.take());
    }
    let limit = spec.model.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let mut body = json!({
        "model": spec.model.model,
        "max_tokens": if widened { limit.saturating_mul(2) } else { limit },
        "messages": messages,
    });
    if !spec.system.is_empty() {
        body["system"] = json!([cached(text_block(&spec.system))]);
    }
    if !spec.tools.is_empty() {
        body["tools"] = tools(spec);
    }
    if let Some(t) = spec.model.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(budget) = spec.model.thinking_budget_tokens {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
    }
    if spec.model.streams() {
        body["stream"] = json!(true);
    }
    Some(serde_json::to_vec(&body).expect("requests always serialize"))
}

/// The request asking the model to summarize the conversation in `lines`.
pub fn compaction_request(spec: &AgentSpec, instruction: &str, lines: &str) -> Vec<u8> {
    let body = json!({
        "model": spec.model.model,
        "max_tokens": spec.model.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "system": instruction,
        "messages": [{"role": "user", "content": [text_block(lines)]}],
    });
    serde_json::to_vec(&body).expect("requests always serialize")
}

fn tools(spec: &AgentSpec) -> Value {
    let mut tools: Vec<Value> = spec
        .tools
        .iter()
        .map(
            |t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}),
        )
        .collect();
    if let Some(last) = tools.last_mut() {
        *last = cached(last.take());
    }
    Value::Array(tools)
}

fn cached(mut block: Value) -> Value {
    block["cache_control"] = json!({"type": "ephemeral"});
    block
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// Appends `block` to the conversation: to the last message if it has the
/// same role (the Messages API wants roles to alternate), else as a new one.
fn push(messages: &mut Vec<Value>, role: &str, block: Value) {
    if let Some(last) = messages.last_mut().filter(|m| m["role"] == role) {
        if let Some(content) = last["content"].as_array_mut() {
            content.push(block);
            return;
        }
    }
    messages.push(json!({"role": role, "content": [block]}));
}

fn entry_blocks(entry: &Entry, messages: &mut Vec<Value>) {
    match entry {
        Entry::User(text) => push(messages, "user", text_block(text)),
        Entry::Reply { reply, calls, .. } => {
            let text = reply.content.as_deref().filter(|t| !t.is_empty());
            let mut blocks = Vec::new();
            if text.is_some() || calls.is_empty() {
                blocks.push(text_block(text.unwrap_or(NO_TEXT)));
            }
            for call in calls {
                let input = serde_json::from_str::<Value>(&call.call.arguments)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({ UNPARSED_ARGUMENTS: call.call.arguments }));
                blocks.push(
                    json!({"type": "tool_use", "id": call.call.id, "name": call.call.name, "input": input}),
                );
            }
            // A turn's thinking goes back as received, each block where it
            // stood among the others (at the head if the record does not
            // say); unfinished thinking that was refused, never.
            let mut thoughts = match reply.cut_off_thinking() {
                true => Vec::new(),
                false => thinking_blocks(reply),
            }
            .into_iter()
            .peekable();
            for (i, block) in blocks.into_iter().enumerate() {
                while let Some((_, thought)) = thoughts.next_if(|(at, _)| *at <= i) {
                    push(messages, "assistant", thought);
                }
                push(messages, "assistant", block);
            }
            for (_, thought) in thoughts {
                push(messages, "assistant", thought);
            }
            for call in calls {
                let is_error = matches!(call.phase, CallPhase::Finished(ToolOutcome::Err(_)));
                let mut block = json!({"type": "tool_result", "tool_use_id": call.call.id,
                                       "content": result_text(call)});
                if is_error {
                    block["is_error"] = json!(true);
                }
                push(messages, "user", block);
            }
            if let Some(reason) = &reply.refused {
                push(
                    messages,
                    "user",
                    text_block(&format!("{REFUSED_PREFIX}{reason}")),
                );
            }
        }
    }
}

/// A reply's thinking blocks as received, each with the number of the
/// reply's other blocks that came before it, in order.
fn thinking_blocks(reply: &crate::event::ModelReply) -> Vec<(usize, Value)> {
    let at = |i: usize| reply.thinking_at.get(i).map_or(0, |&at| at as usize);
    let mut blocks: Vec<(usize, Value)> = (reply.thinking.iter().enumerate())
        .map(|(i, block)| {
            let block = serde_json::from_str(block).unwrap_or_else(|_| json!(block));
            (at(i), block)
        })
        .collect();
    blocks.sort_by_key(|(at, _)| *at);
    blocks
}

/// Where the conversation so far ends: (message, block).
fn last_block(messages: &[Value]) -> Option<(usize, usize)> {
    let message = messages.len().checked_sub(1)?;
    let block = messages[message]["content"]
        .as_array()?
        .len()
        .checked_sub(1)?;
    Some((message, block))
}
