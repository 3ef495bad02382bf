//! A streamed reply (server-sent events) put back together into one reply:
//! the event lines are split here, whatever the format; each format
//! ([`ChatChunks`] for chat completions, `crate::anthropic` for the
//! Messages API, `crate::responses` for the Responses API) applies its
//! events. Chat completions: text and tool-call deltas, calls told apart by
//! `index` or (where a server reuses index 0 for parallel calls) by `id`,
//! usage in a last chunk with no choices (its shape is here, shared with
//! the whole reply's: nothing here names the model clients).

use replay::{ModelReply, ToolCall, Usage};
use serde::Deserialize;

/// One format of streamed events: applies each event's data.
pub(crate) trait Chunks: Send {
    /// Applies one event's data (the text after `data:`).
    fn apply(&mut self, data: &str, progress: &mut Progress) -> Result<(), String>;
    /// The whole reply; an error if the stream ended before the reply did.
    fn finish(self: Box<Self>) -> Result<ModelReply, String>;
}

/// The reply so far, built from a stream's events as they arrive.
pub(crate) struct Assembly {
    chunks: Box<dyn Chunks>,
    /// Bytes of an unfinished line carried to the next read.
    pending: Vec<u8>,
}

/// A chat completion streamed as `chat.completion.chunk` events.
#[derive(Debug, Default)]
pub(crate) struct ChatChunks {
    content: Option<String>,
    reasoning: Option<String>,
    calls: Vec<PartialCall>,
    finish_reason: String,
    usage: Usage,
    done: bool,
}

#[derive(Debug)]
struct PartialCall {
    index: u64,
    id: String,
    name: String,
    arguments: String,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Delta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    /// What llama.cpp, vLLM and DeepSeek stream as `reasoning_content`
    /// (newer vLLM and OpenRouter: `reasoning`).
    #[serde(default, alias = "reasoning")]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<CallDelta>,
}

#[derive(Deserialize)]
struct CallDelta {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: FunctionDelta,
}

#[derive(Deserialize, Default)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<serde_json::Value>,
}

/// Chat completions' usage, streamed in a last chunk or with a whole reply
/// (`crate::model` reads it there).
#[derive(Deserialize, Default)]
pub(crate) struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<WireDetails>,
    #[serde(default)]
    completion_tokens_details: Option<WireCompletionDetails>,
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Usage {
        Usage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            cached_tokens: usage
                .prompt_tokens_details
                .unwrap_or_default()
                .cached_tokens,
            cache_write_tokens: 0,
            reasoning_tokens: usage
                .completion_tokens_details
                .unwrap_or_default()
                .reasoning_tokens,
        }
    }
}

#[derive(Deserialize, Default)]
struct WireDetails {
    #[serde(default)]
    cached_tokens: u64,
}

#[derive(Deserialize, Default)]
struct WireCompletionDetails {
    #[serde(default)]
    reasoning_tokens: u64,
}

/// What one read of the stream brought.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Progress {
    /// New text of the reply, in order.
    pub text: String,
    /// Whether anything of the reply (text or a call) arrived.
    pub generated: bool,
}

impl Assembly {
    /// A stream of `format`'s events.
    pub(crate) fn new(format: Box<dyn Chunks>) -> Assembly {
        Assembly {
            chunks: format,
            pending: Vec::new(),
        }
    }

    /// Takes the next bytes of the stream; what they added.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<Progress, String> {
        self.pending.extend_from_slice(bytes);
        let mut progress = Progress::default();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim_end().strip_prefix("data:") else {
                continue; // comments, event names, blank lines between events
            };
            self.chunks.apply(data.trim(), &mut progress)?;
        }
        Ok(progress)
    }

    /// The whole reply, once the stream ended.
    pub(crate) fn finish(self) -> Result<ModelReply, String> {
        self.chunks.finish()
    }
}

impl Chunks for ChatChunks {
    fn apply(&mut self, data: &str, progress: &mut Progress) -> Result<(), String> {
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| format!("a stream event is not a chat completion chunk: {e}"))?;
        self.apply_chunk(chunk, progress);
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<ModelReply, String> {
        if !self.done && self.finish_reason.is_empty() {
            return Err("the stream ended before the reply did".into());
        }
        let tool_calls = self
            .calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.name,
                arguments: if c.arguments.is_empty() {
                    "{}".into()
                } else {
                    c.arguments
                },
                invented: None,
            })
            .collect();
        Ok(ModelReply {
            content: self.content,
            reasoning: self.reasoning,
            tool_calls,
            usage: self.usage,
            finish_reason: self.finish_reason,
            ..ModelReply::default()
        })
    }
}

impl ChatChunks {
    fn apply_chunk(&mut self, chunk: Chunk, progress: &mut Progress) {
        if let Some(usage) = chunk.usage {
            self.usage = usage.into();
        }
        for choice in chunk.choices.into_iter().take(1) {
            if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                self.content.get_or_insert_with(String::new).push_str(&text);
                progress.text.push_str(&text);
                progress.generated = true;
            }
            if let Some(text) = choice.delta.reasoning_content.filter(|t| !t.is_empty()) {
                self.reasoning
                    .get_or_insert_with(String::new)
                    .push_str(&text);
                progress.generated = true;
            }
            for call in choice.delta.tool_calls {
                self.apply_call(call);
                progress.generated = true;
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = reason;
            }
        }
    }

    fn apply_call(&mut self, delta: CallDelta) {
        let id = delta.id.filter(|id| !id.is_empty());
        // A new id starts a new call even at a reused index.
        let known = self.calls.iter().rposition(|c| match &id {
            Some(id) => c.id == *id || (c.index == delta.index && c.id.is_empty()),
            None => c.index == delta.index,
        });
        let at = match known {
            Some(at) => at,
            None => {
                self.calls.push(PartialCall {
                    index: delta.index,
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[at];
        if let Some(id) = id {
            call.id = id;
        }
        if let Some(name) = delta.function.name {
            call.name.push_str(&name);
        }
        match delta.function.arguments {
            Some(serde_json::Value::String(piece)) => call.arguments.push_str(&piece),
            Some(serde_json::Value::Null) | None => {}
            Some(whole) => call.arguments.push_str(&whole.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assemble(stream: &str, read: usize) -> (ModelReply, String) {
        let mut assembly = Assembly::new(Box::<ChatChunks>::default());
        let mut text = String::new();
        for piece in stream.as_bytes().chunks(read) {
            text.push_str(&assembly.feed(piece).unwrap().text);
        }
        (assembly.finish().unwrap(), text)
    }

    #[test]
    fn streamed_reasoning_is_kept_apart_from_the_text_shown() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"2 and 2\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\" make 4\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"4\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        for read in [1, 9, stream.len()] {
            let (reply, text) = assemble(stream, read);
            assert_eq!(text, "4");
            assert_eq!(reply.content.as_deref(), Some("4"));
            assert_eq!(reply.reasoning.as_deref(), Some("2 and 2 make 4"));
        }
    }

    #[test]
    fn text_and_calls_come_together_however_the_bytes_are_cut() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Char\"}}]}\n\n",
            ": a comment\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ging.\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"charge\",\"arguments\":\"{\\\"n\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"b\",\"function\":{\"name\":\"email\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
            "data: [DONE]\n\n"
        );
        for read in [1, 7, 64, stream.len()] {
            let (reply, text) = assemble(stream, read);
            assert_eq!(text, "Charging.");
            assert_eq!(reply.content.as_deref(), Some("Charging."));
            let calls: Vec<(&str, &str, &str)> = reply
                .tool_calls
                .iter()
                .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
                .collect();
            assert_eq!(calls, [("a", "charge", "{\"n\":1}"), ("b", "email", "{}")]);
            assert_eq!(reply.finish_reason, "tool_calls");
            assert_eq!(reply.usage.cached_tokens, 8);
        }
    }

    #[test]
    fn a_stream_cut_short_is_an_error() {
        let mut assembly = Assembly::new(Box::<ChatChunks>::default());
        assembly
            .feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n")
            .unwrap();
        assert!(assembly.finish().is_err());
        let mut assembly = Assembly::new(Box::<ChatChunks>::default());
        assert!(assembly.feed(b"data: <html>\n").is_err());
    }
}
