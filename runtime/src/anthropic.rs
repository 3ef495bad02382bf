//! Anthropic's Messages API on the reply side: a message (or its stream of
//! events) into a [`ModelReply`]. Text blocks join into the reply's text,
//! `tool_use` blocks become calls (their input as compact JSON text),
//! `stop_reason` is named as chat completions name it (`max_tokens` is
//! `length`), and the prompt cache's reads count as cached prompt tokens.

use crate::sse::{Chunks, Progress};
use replay::{ModelReply, ToolCall, Usage};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Message {
    /// Each block as received: thinking blocks are kept whole.
    #[serde(default)]
    content: Vec<Value>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    #[serde(other)]
    Other,
}

/// Whether a content block is thinking (kept whole, sent back unchanged).
fn is_thinking(block: &Value) -> bool {
    matches!(
        block["type"].as_str(),
        Some("thinking" | "redacted_thinking")
    )
}

#[derive(Deserialize, Default, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
}

impl WireUsage {
    /// Prompt tokens in all (uncached, written to the cache, read from it).
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.input_tokens
                + self.cache_creation_input_tokens
                + self.cache_read_input_tokens,
            completion_tokens: self.output_tokens,
            cached_tokens: self.cache_read_input_tokens,
            cache_write_tokens: self.cache_creation_input_tokens,
            reasoning_tokens: 0,
        }
    }
}

/// `stop_reason` as chat completions name it.
fn finish_reason(stop: Option<String>) -> String {
    match stop.as_deref() {
        Some("max_tokens") => replay::event::CUT_OFF.into(),
        Some("tool_use") => "tool_calls".into(),
        Some("end_turn" | "stop_sequence") => "stop".into(),
        Some(other) => other.into(),
        None => String::new(),
    }
}

/// A reply put together from its content blocks in the order they came:
/// text blocks join, tool uses become calls, and each thinking block is
/// kept whole with where it stood among the blocks sent back with it.
#[derive(Default)]
struct Assembled {
    content: Option<String>,
    tool_calls: Vec<ToolCall>,
    thinking: Vec<String>,
    thinking_at: Vec<u32>,
}

impl Assembled {
    fn text(&mut self, text: &str) {
        self.content.get_or_insert_with(String::new).push_str(text);
    }

    fn call(&mut self, id: String, name: String, arguments: String) {
        self.tool_calls.push(ToolCall {
            id,
            name,
            arguments,
            invented: None,
        });
    }

    fn thought(&mut self, block: String) {
        // The blocks sent back before it: the reply's text, if any, then
        // its calls so far.
        let text = self.content.as_deref().is_some_and(|t| !t.is_empty());
        let before = usize::from(text) + self.tool_calls.len();
        self.thinking.push(block);
        self.thinking_at
            .push(u32::try_from(before).unwrap_or(u32::MAX));
    }

    fn reply(self, usage: Usage, finish_reason: String) -> ModelReply {
        // Thinking only at the head is recorded as it always was.
        let thinking_at = match self.thinking_at.iter().all(|&at| at == 0) {
            true => Vec::new(),
            false => self.thinking_at,
        };
        ModelReply {
            content: self.content,
            thinking: self.thinking,
            thinking_at,
            tool_calls: self.tool_calls,
            usage,
            finish_reason,
            ..ModelReply::default()
        }
    }
}

/// A whole Messages API response.
pub(crate) fn parse_message(text: &str) -> Result<ModelReply, String> {
    let message: Message =
        serde_json::from_str(text).map_err(|e| format!("not a Messages API message: {e}"))?;
    let mut reply = Assembled::default();
    for block in message.content {
        if is_thinking(&block) {
            reply.thought(block.to_string());
            continue;
        }
        match serde_json::from_value(block).unwrap_or(Block::Other) {
            Block::Text { text } => reply.text(&text),
            Block::ToolUse { id, name, input } => reply.call(id, name, input.to_string()),
            Block::Thinking { .. } | Block::RedactedThinking { .. } | Block::Other => {}
        }
    }
    let usage = message.usage.usage();
    Ok(reply.reply(usage, finish_reason(message.stop_reason)))
}

/// A Messages API response streamed as events (`message_start`,
/// `content_block_start`/`_delta`/`_stop`, `message_delta`,
/// `message_stop`).
#[derive(Default)]
pub(crate) struct MessageChunks {
    blocks: Vec<PartialBlock>,
    usage: WireUsage,
    stop_reason: Option<String>,
    done: bool,
}

enum PartialBlock {
    Text(String),
    /// A thinking block: its text and signature as they stream in.
    Thinking {
        thinking: String,
        signature: String,
    },
    /// A redacted thinking block, which arrives whole.
    Redacted(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: StartedMessage,
    },
    ContentBlockStart {
        index: usize,
        content_block: Block,
    },
    ContentBlockDelta {
        index: usize,
        delta: Piece,
    },
    MessageDelta {
        #[serde(default)]
        delta: StopDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Error {
        #[serde(default)]
        error: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct StartedMessage {
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Piece {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "signature_delta")]
    Signature { signature: String },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct StopDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

impl Chunks for MessageChunks {
    fn apply(&mut self, data: &str, progress: &mut Progress) -> Result<(), String> {
        // Not Anthropic's, but proxies that speak both APIs end with it.
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let event: Event = serde_json::from_str(data)
            .map_err(|e| format!("a stream event is not a Messages API event: {e}"))?;
        match event {
            Event::MessageStart { message } => self.usage = message.usage,
            Event::ContentBlockStart {
                index,
                content_block,
            } => {
                let block = match content_block {
                    Block::Text { text } => {
                        progress.text.push_str(&text);
                        PartialBlock::Text(text)
                    }
                    Block::ToolUse { id, name, .. } => PartialBlock::ToolUse {
                        id,
                        name,
                        json: String::new(),
                    },
                    Block::Thinking {
                        thinking,
                        signature,
                    } => PartialBlock::Thinking {
                        thinking,
                        signature,
                    },
                    Block::RedactedThinking { data } => PartialBlock::Redacted(data),
                    Block::Other => PartialBlock::Other,
                };
                if self.blocks.len() <= index {
                    self.blocks.resize_with(index + 1, || PartialBlock::Other);
                }
                self.blocks[index] = block;
                progress.generated = true;
            }
            Event::ContentBlockDelta { index, delta } => {
                match (self.blocks.get_mut(index), delta) {
                    (Some(PartialBlock::Text(text)), Piece::Text { text: piece }) => {
                        text.push_str(&piece);
                        progress.text.push_str(&piece);
                    }
                    (
                        Some(PartialBlock::ToolUse { json, .. }),
                        Piece::InputJson { partial_json },
                    ) => json.push_str(&partial_json),
                    (
                        Some(PartialBlock::Thinking { thinking, .. }),
                        Piece::Thinking { thinking: piece },
                    ) => thinking.push_str(&piece),
                    (
                        Some(PartialBlock::Thinking { signature, .. }),
                        Piece::Signature { signature: piece },
                    ) => signature.push_str(&piece),
                    _ => {}
                }
                progress.generated = true;
            }
            Event::MessageDelta { delta, usage } => {
                if delta.stop_reason.is_some() {
                    self.stop_reason = delta.stop_reason;
                }
                if let Some(usage) = usage {
                    self.usage.output_tokens = usage.output_tokens;
                }
            }
            Event::MessageStop => self.done = true,
            Event::Error { error } => return Err(format!("the stream reported an error: {error}")),
            Event::Other => {}
        }
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<ModelReply, String> {
        if !self.done && self.stop_reason.is_none() {
            return Err("the stream ended before the reply did".into());
        }
        let mut reply = Assembled::default();
        for block in self.blocks {
            match block {
                PartialBlock::Text(text) => reply.text(&text),
                PartialBlock::Thinking {
                    thinking,
                    signature,
                } => reply.thought(
                    serde_json::json!({"type": "thinking", "thinking": thinking, "signature": signature})
                        .to_string(),
                ),
                PartialBlock::Redacted(data) => reply.thought(
                    serde_json::json!({"type": "redacted_thinking", "data": data}).to_string(),
                ),
                PartialBlock::ToolUse { id, name, json } => {
                    let arguments = if json.is_empty() { "{}".into() } else { json };
                    reply.call(id, name, arguments)
                }
                PartialBlock::Other => {}
            }
        }
        Ok(reply.reply(self.usage.usage(), finish_reason(self.stop_reason)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::Assembly;

    #[test]
    fn a_message_becomes_a_reply() {
        let text = r#"{"id":"msg_1","type":"message","role":"assistant","content":[
            {"type":"text","text":"Charging."},
            {"type":"tool_use","id":"toolu_1","name":"charge","input":{"cents":4200}}],
            "stop_reason":"tool_use","usage":{"input_tokens":12,"output_tokens":30,
            "cache_creation_input_tokens":100,"cache_read_input_tokens":900}}"#;
        let reply = parse_message(text).unwrap();
        assert_eq!(reply.content.as_deref(), Some("Charging."));
        assert_eq!(reply.tool_calls[0].arguments, r#"{"cents":4200}"#);
        assert_eq!(reply.finish_reason, "tool_calls");
        assert_eq!(
            reply.usage,
            Usage {
                prompt_tokens: 1012,
                completion_tokens: 30,
                cached_tokens: 900,
                cache_write_tokens: 100,
                reasoning_tokens: 0,
            }
        );
    }

    #[test]
    fn a_streamed_message_comes_together() {
        let events = [
            r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":5,"cache_read_input_tokens":40,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"ping"}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Char"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ging."}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"charge","input":{}}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"cents\":"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" 4200}"}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":17}}"#,
            r#"{"type":"message_stop"}"#,
        ];
        let stream: String = events
            .iter()
            .map(|e| format!("event: x\ndata: {e}\n\n"))
            .collect();
        let mut assembly = Assembly::new(Box::<MessageChunks>::default());
        let mut text = String::new();
        for piece in stream.as_bytes().chunks(9) {
            text.push_str(&assembly.feed(piece).unwrap().text);
        }
        let reply = assembly.finish().unwrap();
        assert_eq!(text, "Charging.");
        assert_eq!(reply.tool_calls[0].arguments, r#"{"cents": 4200}"#);
        assert_eq!(reply.finish_reason, "length", "max_tokens is a cut-off");
        assert_eq!(
            (reply.usage.prompt_tokens, reply.usage.cached_tokens),
            (45, 40)
        );
        assert_eq!(reply.usage.completion_tokens, 17);
    }

    /// Thinking blocks, whole or streamed, come out as the same JSON, the
    /// signature and a redacted block's data untouched, in order.
    #[test]
    fn thinking_blocks_are_kept_whole_streamed_or_not() {
        let thinking = serde_json::json!({"type": "thinking", "thinking": "4200 cents is 42 EUR", "signature": "sig/+=="});
        let redacted = serde_json::json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3"});
        let text = serde_json::json!({"content": [thinking, redacted,
            {"type": "tool_use", "id": "toolu_1", "name": "charge", "input": {"cents": 4200}}],
            "stop_reason": "tool_use", "usage": {}})
        .to_string();
        let whole = parse_message(&text).unwrap();
        assert_eq!(whole.thinking, [thinking.to_string(), redacted.to_string()]);
        assert_eq!(whole.tool_calls.len(), 1);
        let events = [
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"4200 cents"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":" is 42 EUR"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig/+=="}}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"redacted_thinking","data":"EmwKAhgBEgy3"}}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"charge","input":{}}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"cents\": 4200}"}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#,
            r#"{"type":"message_stop"}"#,
        ];
        let stream: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let mut assembly = Assembly::new(Box::<MessageChunks>::default());
        let shown = assembly.feed(stream.as_bytes()).unwrap();
        assert_eq!(shown.text, "", "thinking is not the reply's text");
        let streamed = assembly.finish().unwrap();
        assert_eq!(streamed.thinking, whole.thinking);
        // All at the head: recorded as thinking always was.
        assert!(whole.thinking_at.is_empty() && streamed.thinking_at.is_empty());
    }

    /// Thinking between calls (and after text) is recorded with where it
    /// stood among the blocks sent back, whole or streamed.
    #[test]
    fn interleaved_thinking_is_recorded_where_it_stood() {
        let think = |n: u32| serde_json::json!({"type": "thinking", "thinking": format!("step {n}"), "signature": format!("sig{n}")});
        let call = |id: &str| serde_json::json!({"type": "tool_use", "id": id, "name": "charge", "input": {}});
        let blocks = serde_json::json!([think(0), {"type": "text", "text": "Looking."}, think(1),
                                        call("toolu_1"), think(2), call("toolu_2")]);
        let text = serde_json::json!({"content": blocks, "stop_reason": "tool_use", "usage": {}});
        let whole = parse_message(&text.to_string()).unwrap();
        assert_eq!(whole.thinking_at, [0, 1, 2]);
        let mut events = Vec::new();
        for (index, block) in blocks.as_array().unwrap().iter().enumerate() {
            let block = serde_json::json!({"type": "content_block_start", "index": index, "content_block": block});
            events.push(block.to_string());
        }
        events.push(r#"{"type":"message_stop"}"#.into());
        let stream: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let mut assembly = Assembly::new(Box::<MessageChunks>::default());
        assembly.feed(stream.as_bytes()).unwrap();
        let streamed = assembly.finish().unwrap();
        assert_eq!(streamed.thinking, whole.thinking);
        assert_eq!(streamed.thinking_at, whole.thinking_at);
        assert_eq!(streamed.tool_calls.len(), 2);
    }
}
