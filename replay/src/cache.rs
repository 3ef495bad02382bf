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
use sha2::{Digest, Sha256};

/// Tokens a cached prefix may fall short by without counting as a miss
/// (servers cache in blocks: OpenAI's are 128 tokens, llama.cpp's
/// checkpoints coarser), or a tenth of the prefix if that is more.
pub const MISS_SLACK_TOKENS: u64 = 256;

/// The cause of a miss no recorded event explains, where the request
/// extended the one before it: the server dropped the prefix.
pub const EVICTED: &str = "evicted";

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

/// A reply that read less from the cache than the request before it made
/// cacheable, as [`MissWatch`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    /// Prompt tokens the request before it made cacheable.
    pub cacheable_tokens: u64,
    /// Prompt tokens the server said it read from its cache.
    pub cached_tokens: u64,
    /// The recorded events since the reply before that changed the
    /// request, in order (empty: none did).
    pub causes: Vec<&'static str>,
}

impl Shortfall {
    /// The recorded causes as one label, or [`EVICTED`] where none was
    /// recorded (which is right while prompts are rebuilt byte for byte:
    /// only [`cache_misses`], comparing the bytes, can tell it apart from
    /// a request that changed by itself).
    pub fn recorded_cause(&self) -> String {
        if self.causes.is_empty() {
            EVICTED.to_string()
        } else {
            self.causes.join(", ")
        }
    }
}

/// The rule for what a miss is and which recorded event caused it, kept
/// across one session's events as they are appended: the prompt tokens
/// the last reply's request made cacheable, the system prompt in force
/// (by digest) and the causes recorded since that reply. Both
/// [`cache_misses`] and a live counter of misses by cause use it.
#[derive(Debug, Clone, Default)]
pub struct MissWatch {
    cacheable: Option<u64>,
    system: Option<[u8; 32]>,
    causes: Vec<&'static str>,
}

impl MissWatch {
    /// Notes `event`, the session's next: for a model reply that read
    /// less than the request before it made cacheable (beyond
    /// [`MISS_SLACK_TOKENS`] or a tenth), what it fell short by and why.
    pub fn note(&mut self, event: &Event) -> Option<Shortfall> {
        let system = |text: &str| -> [u8; 32] { Sha256::digest(text.as_bytes()).into() };
        match event {
            Event::ModelReplied(reply) => {
                let (prompt, cached) = (reply.usage.prompt_tokens, reply.usage.cached_tokens);
                let short = self.cacheable.filter(|&cacheable| {
                    prompt > 0 && cached + MISS_SLACK_TOKENS.max(cacheable / 10) < cacheable
                });
                self.cacheable = Some(prompt);
                let causes = std::mem::take(&mut self.causes);
                return short.map(|cacheable_tokens| Shortfall {
                    cacheable_tokens,
                    cached_tokens: cached,
                    causes,
                });
            }
            Event::SessionStarted { spec, .. } => self.system = Some(system(&spec.system)),
            Event::ContextCompacted { .. } => self.causes.push("compaction"),
            Event::SpecChanged { spec, .. } => {
                let now = system(&spec.system);
                self.causes.push(if self.system == Some(now) {
                    "spec change"
                } else {
                    "system prompt changed"
                });
                self.system = Some(now);
            }
            Event::McpToolsChanged { .. } | Event::McpToolsRefreshed { .. } => {
                self.causes.push("MCP tools refreshed")
            }
            Event::SessionForked { .. } => self.causes.push("fork"),
            _ => {}
        }
        None
    }
}

/// The cache misses of a session whose events, in seq order, are `events`.
pub fn cache_misses(events: impl IntoIterator<Item = (u64, Event)>) -> Vec<CacheMiss> {
    let mut state = SessionState::default();
    let mut prefix = RenderedPrefix::default();
    let mut watch = MissWatch::default();
    let mut before: Option<PreparedRequest> = None;
    let mut misses = Vec::new();
    for (seq, event) in events {
        if let Event::SpecChanged { .. } = event {
            // Rendered afresh under the new spec, as a session loaded now.
            prefix = RenderedPrefix::default();
        }
        let shortfall = watch.note(&event);
        if let Event::ModelReplied(_) = event {
            let request = next_request_incremental("", &state, &mut prefix);
            if let (Some(short), Some(now), Some(earlier)) = (shortfall, &request, &before) {
                misses.push(explained(seq, short, earlier, now));
            }
            before = request;
        }
        state.apply(seq, event);
    }
    misses
}

/// The miss of reply `seq`, whose request `now` followed `earlier`: where
/// the two first differ, and why.
fn explained(
    seq: u64,
    short: Shortfall,
    earlier: &PreparedRequest,
    now: &PreparedRequest,
) -> CacheMiss {
    let (a, b) = (earlier.to_vec(), now.to_vec());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let cause = if short.causes.is_empty() && common < earlier.stable_len() {
        "request changed".to_string()
    } else {
        short.recorded_cause()
    };
    CacheMiss {
        seq,
        cacheable_tokens: short.cacheable_tokens,
        cached_tokens: short.cached_tokens,
        first_difference: common as u64,
        cause,
    }
}
