//! Prefix-cache misses, explained from the log: for each model reply whose
//! cached prompt tokens fall short of what the request before it made
//! cacheable (its whole prompt, less a server's block granularity), where
//! the two requests first differ and which recorded event made them differ
//! (or none: the server evicted the prefix). Pure: events in, misses out;
//! every request is rebuilt as the session sent it.

use crate::event::Event;
use crate::prompt::{next_request_incremental, PreparedRequest, RenderedPrefix};
use crate::state::SessionState;
use serde::{Deserialize, Serialize};

/// Tokens a cached prefix may fall short by without counting as a miss
/// (servers cache in blocks: OpenAI's are 128 tokens, llama.cpp's
/// checkpoints coarser), or a tenth of the prefix if that is more.
pub const MISS_SLACK_TOKENS: u64 = 256;

/// One reply whose prompt missed the prefix cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheMiss {
    /// The seq of the reply that missed.
    pub seq: u64,
    /// Prompt tokens the request before it made cacheable.
    pub cacheable_tokens: u64,
    /// Prompt tokens the server said it read from its cache.
    pub cached_tokens: u64,
    /// The first byte at which the request differs from the one before.
    pub first_difference: u64,
    /// Why: the recorded events that changed the request (`compaction`,
    /// `spec change`, `system prompt changed`, `MCP tools refreshed`,
    /// `fork`), `request changed` when none did but the bytes differ
    /// within the earlier request's stable start, or `evicted` when the
    /// request extended the earlier one and the server had dropped it.
    pub cause: String,
}

/// The cache misses of a session whose events, in seq order, are `events`.
pub fn cache_misses(events: impl IntoIterator<Item = (u64, Event)>) -> Vec<CacheMiss> {
    let mut state = SessionState::default();
    let mut prefix = RenderedPrefix::default();
    let mut before: Option<(PreparedRequest, u64)> = None;
    let mut causes: Vec<&'static str> = Vec::new();
    let mut misses = Vec::new();
    for (seq, event) in events {
        match &event {
            Event::ModelReplied(reply) => {
                let request = next_request_incremental("", &state, &mut prefix);
                if let (Some(now), Some((earlier, cacheable))) = (&request, &before) {
                    let (cacheable, cached) = (*cacheable, reply.usage.cached_tokens);
                    let slack = MISS_SLACK_TOKENS.max(cacheable / 10);
                    if reply.usage.prompt_tokens > 0 && cached + slack < cacheable {
                        let (a, b) = (earlier.to_vec(), now.to_vec());
                        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
                        let cause = match (causes.is_empty(), common < earlier.stable_len()) {
                            (false, _) => causes.join(", "),
                            (true, true) => "request changed".into(),
                            (true, false) => "evicted".into(),
                        };
                        misses.push(CacheMiss {
                            seq,
                            cacheable_tokens: cacheable,
                            cached_tokens: cached,
                            first_difference: common as u64,
                            cause,
                        });
                    }
                }
                before = request.map(|r| (r, reply.usage.prompt_tokens));
                causes.clear();
            }
            Event::ContextCompacted { .. } => causes.push("compaction"),
            Event::SpecChanged { spec, .. } => {
                // Rendered afresh under the new spec, as a session loaded now.
                prefix = RenderedPrefix::default();
                let same = state.spec.as_ref().is_some_and(|s| s.system == spec.system);
                causes.push(if same {
                    "spec change"
                } else {
                    "system prompt changed"
                });
            }
            Event::McpToolsChanged { .. } | Event::McpToolsRefreshed { .. } => {
                causes.push("MCP tools refreshed")
            }
            Event::SessionForked { .. } => causes.push("fork"),
            _ => {}
        }
        state.apply(seq, event);
    }
    misses
}
