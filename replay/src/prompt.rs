//! The prompt rebuild: the exact OpenAI chat-completions request a session
//! sends next, as bytes. A pure function of the events: the same log gives
//! the same bytes in any process, so a server's prefix cache keeps hitting.

use crate::event::ToolOutcome;
use crate::spec::{AgentSpec, Reasoning};
use crate::state::{CallPhase, CallState, Entry, SessionState};
use serde::Serialize;
use std::sync::Arc;

/// Result text shown for a call that started but has no recorded outcome.
pub const INTERRUPTED_RESULT: &str =
    "[mneme] this tool call was interrupted before it finished; its outcome is unknown";
/// Result text shown for a sleeping call whose turn ended before it woke
/// (a cancel, then a new message).
pub const NOT_WOKEN_RESULT: &str = "[mneme] this sleep ended before it woke";
/// Result text shown for a call that never started.
pub const NOT_RUN_RESULT: &str = "[mneme] this tool call has not run";
/// Result text shown for a call in doubt, waiting for a person.
pub const IN_DOUBT_RESULT: &str =
    "[mneme] the outcome of this tool call is unknown; a person must decide whether it ran";

/// Result text shown for a call that waits for a person's approval.
pub const AWAITING_APPROVAL_RESULT: &str =
    "[mneme] this tool call is waiting for a person's approval and has not run";

/// What the result of a call settled by its check starts with (the rest
/// is the check's answer): the model is told it did not come from the tool.
pub const SETTLED_BY_CHECK_PREFIX: &str = "[mneme] This call was interrupted before its result was recorded; its check found that it took effect, and answered: ";

/// What the message that tells the model its reply was refused starts with.
pub const REFUSED_PREFIX: &str = "[mneme] Your last reply was not acted on: ";

/// One chat message, as the OpenAI chat-completions API takes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: &'static str,
    /// The text (absent on an assistant message that only calls tools).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool calls of an assistant message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<WireToolCall>>,
    /// The call a tool message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The reasoning the server returned with this assistant message, sent
    /// back where the spec keeps it ([`crate::spec::Reasoning::Keep`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// A tool call as the API carries it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WireToolCall {
    /// The call's id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Name and arguments.
    pub function: WireFunction,
}

/// Name and arguments of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WireFunction {
    /// The tool.
    pub name: String,
    /// Arguments as a JSON text.
    pub arguments: String,
}

#[derive(Serialize)]
struct ToolDefinition<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionDefinition<'a>,
}

#[derive(Serialize)]
struct FunctionDefinition<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a serde_json::Value,
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: &'a [Message],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ToolDefinition<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u64>,
    /// Server-sent events instead of one body, with usage in the last one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    /// OpenAI's prefix-cache routing hint: requests with the same key are
    /// routed to the same cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
    /// vLLM's prefix-cache salt: only requests with the same salt share
    /// cached prefixes (a tenant's, so no other tenant can probe them).
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_salt: Option<&'a str>,
}

/// What a chat-completions request carries for the server's prefix cache:
/// the session id as its routing key, and its tenant's salt.
#[derive(Debug, Clone, Copy, Default)]
struct CacheFields<'a> {
    key: Option<&'a str>,
    salt: Option<&'a str>,
}

/// The cache fields of the session `session` in `state`: its id unless the
/// spec turns `prompt_cache_key` off, its tenant's salt unless the spec
/// turns `cache_salt` off.
fn cache_fields<'a>(
    spec: &AgentSpec,
    state: &'a SessionState,
    session: &'a str,
) -> CacheFields<'a> {
    let salt = state.tenant.as_ref().and_then(|t| t.cache_salt.as_deref());
    CacheFields {
        key: cache_key(spec, session),
        salt: salt.filter(|_| spec.model.cache_salt.unwrap_or(true)),
    }
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// The messages of the conversation: system prompt, then every entry in
/// order, each assistant tool call followed by exactly one result message,
/// in the model's call order. Never emits a call without a result.
pub fn messages(state: &SessionState) -> Vec<Message> {
    let mut out = Vec::with_capacity(state.entries.len() * 2 + 1);
    out.extend(system_message(state));
    out.extend(summary_message(state));
    for entry in &state.entries {
        entry_messages(entry, reasoning_of(state), &mut out);
    }
    out
}

/// The summary of compacted entries, as the message that replaces them.
fn summary_message(state: &SessionState) -> Option<Message> {
    let (_, summary) = state.compacted.as_ref()?;
    Some(text_message("user", &format!("{SUMMARY_PREFIX}{summary}")))
}

/// What the message that replaces compacted entries starts with.
pub const SUMMARY_PREFIX: &str = "[mneme] Summary of the earlier conversation: ";

fn system_message(state: &SessionState) -> Option<Message> {
    let spec = state.spec.as_ref().filter(|s| !s.system.is_empty())?;
    Some(text_message("system", &spec.system))
}

/// The messages of one entry: a user message, or an assistant message and
/// one result per call, in call order.
fn entry_messages(entry: &Entry, reasoning: Reasoning, out: &mut Vec<Message>) {
    match entry {
        Entry::User(text) => out.push(text_message("user", text)),
        Entry::Reply { reply, calls, .. } => {
            // Servers refuse an assistant message with neither text nor calls.
            let content = match (&reply.content, calls.is_empty()) {
                (None, true) => Some(String::new()),
                (content, _) => content.clone(),
            };
            out.push(Message {
                role: "assistant",
                content,
                tool_calls: (!calls.is_empty()).then(|| wire_calls(calls)),
                tool_call_id: None,
                reasoning_content: match reasoning {
                    Reasoning::Keep => reply.reasoning.clone(),
                    Reasoning::Drop => None,
                },
            });
            out.extend(calls.iter().map(|c| Message {
                role: "tool",
                content: Some(result_text(c)),
                tool_calls: None,
                tool_call_id: Some(c.call.id.clone()),
                reasoning_content: None,
            }));
            if let Some(reason) = &reply.refused {
                out.push(text_message("user", &format!("{REFUSED_PREFIX}{reason}")));
            }
        }
    }
}

/// The rendered messages of every entry but the last, kept to extend: the
/// fold only ever changes the last entry (tool results arrive for the latest
/// reply), so every earlier entry renders the same forever. With it, the work
/// of building a request is proportional to what is new, not to the history
/// (copying the bytes out aside).
#[derive(Debug, Clone, Default)]
pub struct RenderedPrefix {
    /// Comma-separated JSON of the messages rendered so far (shared with
    /// the requests built on it; copied only if one is still held when it
    /// grows).
    json: Arc<Vec<u8>>,
    /// Entries rendered (the system message comes with the first render).
    entries: usize,
    /// Whether the system message was rendered.
    started: bool,
    /// The compaction it was rendered under (entries replaced, summary).
    compacted: Option<(usize, String)>,
    /// Whether the replies' reasoning was rendered (the spec's rule).
    reasoning: Reasoning,
    /// The API whose shapes it was rendered in.
    api: Api,
    /// Chained SHA-256 over the rendered messages: H(previous ‖ message).
    digest: [u8; 32],
    /// The request's bytes before its messages, as last built.
    head: Vec<u8>,
    /// SHA-256 state over `head` then `json`: a request's digest costs
    /// what follows the prefix, not the whole body.
    body_hash: sha2::Sha256,
}

/// A model request, built: its exact bytes, in parts (the rendered
/// history is shared with the prefix it was built on, not copied), and
/// their SHA-256.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    head: Vec<u8>,
    history: Arc<Vec<u8>>,
    tail: Vec<u8>,
    /// SHA-256 of the request's bytes, as 64 lower-case hex digits (what
    /// [`crate::digest_hex`] gives).
    pub digest: String,
}

impl PreparedRequest {
    /// A request built whole, as `body` holds it.
    pub fn whole(body: Vec<u8>) -> PreparedRequest {
        let digest = crate::digest_hex(&body);
        PreparedRequest {
            head: body,
            history: Arc::default(),
            tail: Vec::new(),
            digest,
        }
    }

    /// Bytes of its stable start: everything before the newest entry's
    /// messages (0 for a request built whole), which the next request of the
    /// session repeats unless something changed it.
    pub fn stable_len(&self) -> usize {
        match self.history.is_empty() {
            true => 0,
            false => self.head.len() + self.history.len(),
        }
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.history.len() + self.tail.len()
    }

    /// Whether it has no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its exact bytes, in one piece.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.len());
        for part in [&self.head[..], &self.history[..], &self.tail[..]] {
            body.extend_from_slice(part);
        }
        body
    }
}

impl RenderedPrefix {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.json.len()
    }

    /// Whether nothing is rendered yet.
    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }

    fn push<T: Serialize>(&mut self, message: &T) {
        use sha2::Digest;
        let json = Arc::make_mut(&mut self.json);
        let before = json.len();
        if !json.is_empty() {
            json.push(b',');
        }
        let start = json.len();
        serde_json::to_writer(&mut *json, message).expect("messages always serialize");
        let mut hasher = sha2::Sha256::new();
        hasher.update(self.digest);
        hasher.update(&self.json[start..]);
        self.digest = hasher.finalize().into();
        self.body_hash.update(&self.json[before..]);
    }

    /// Makes `body_hash` cover `head` then the messages rendered so far:
    /// kept while the head stays the same, hashed again when it changes.
    fn hash_under(&mut self, head: &[u8]) {
        use sha2::Digest;
        if self.head != head {
            self.head = head.to_vec();
            self.body_hash = sha2::Sha256::new();
            self.body_hash.update(head);
            self.body_hash.update(&self.json[..]);
        }
    }

    /// Chained digest of the messages rendered so far, hex.
    pub fn digest_hex(&self) -> String {
        crate::event::hex(&self.digest)
    }

    /// Renders the entries of `state` it lacks, all but the last. A prefix
    /// rendered from a longer or another history starts over.
    fn extend(&mut self, state: &SessionState) {
        let done = state.entries.len().saturating_sub(1);
        let (reasoning, api) = (reasoning_of(state), Api::of(state));
        if self.entries > done
            || self.compacted != state.compacted
            || self.reasoning != reasoning
            || self.api != api
        {
            *self = RenderedPrefix {
                reasoning,
                api,
                ..RenderedPrefix::default()
            };
        }
        if !self.started {
            match api {
                Api::Chat => {
                    for message in system_message(state)
                        .into_iter()
                        .chain(summary_message(state))
                    {
                        self.push(&message);
                    }
                }
                // The system prompt is the request's `instructions`.
                Api::Responses => {
                    if let Some(item) = crate::responses::summary_item(state) {
                        self.push(&item);
                    }
                }
            }
            self.started = true;
            self.compacted = state.compacted.clone();
        }
        let entries = &state.entries[self.entries..done];
        match api {
            Api::Chat => {
                let mut messages = Vec::new();
                for entry in entries {
                    entry_messages(entry, self.reasoning, &mut messages);
                }
                for message in &messages {
                    self.push(message);
                }
            }
            Api::Responses => {
                let mut items = Vec::new();
                for entry in entries {
                    crate::responses::entry_items(entry, &mut items);
                }
                for item in &items {
                    self.push(item);
                }
            }
        }
        self.entries = done;
    }
}

/// [`next_request`], built on `prefix` (extended here): byte for byte the
/// same request, and its digest, without re-rendering or re-hashing the
/// history.
pub fn next_request_incremental(
    session: &str,
    state: &SessionState,
    prefix: &mut RenderedPrefix,
) -> Option<PreparedRequest> {
    let spec = state.spec.as_ref()?;
    if spec.model.is_anthropic() {
        // Its breakpoints move every turn: rendered whole each time.
        return crate::anthropic::request(state, room_to_finish(state)).map(PreparedRequest::whole);
    }
    let key = cache_key(spec, session);
    let fields = cache_fields(spec, state, session);
    prefix.extend(state);
    let widened = room_to_finish(state);
    let first = prefix.json.is_empty();
    let mut tail = Vec::with_capacity(1024);
    // The request with no messages, split where they go.
    let (empty, marker): (_, &[u8]) = match prefix.api {
        Api::Chat => {
            let mut last = Vec::new();
            if let Some(entry) = state.entries.last() {
                entry_messages(entry, prefix.reasoning, &mut last);
            }
            write_items(&mut tail, &last, first);
            (body(spec, &[], fields, widened), b"\"messages\":[]")
        }
        Api::Responses => {
            let mut last = Vec::new();
            if let Some(entry) = state.entries.last() {
                crate::responses::entry_items(entry, &mut last);
            }
            write_items(&mut tail, &last, first);
            let empty = crate::responses::body(spec, &[], key, widened);
            (empty, b"\"input\":[]")
        }
    };
    let at = empty.windows(marker.len()).position(|w| w == marker)? + marker.len() - 1;
    prefix.hash_under(&empty[..at]);
    tail.extend_from_slice(&empty[at..]);
    use sha2::Digest;
    let mut hasher = prefix.body_hash.clone();
    hasher.update(&tail);
    Some(PreparedRequest {
        head: empty[..at].to_vec(),
        history: prefix.json.clone(),
        tail,
        digest: crate::event::hex(&hasher.finalize()),
    })
}

/// Appends `items` to `tail`, comma-separated, after a comma unless they
/// are the first of the list.
fn write_items<T: Serialize>(tail: &mut Vec<u8>, items: &[T], first: bool) {
    for (i, item) in items.iter().enumerate() {
        if !(first && i == 0) {
            tail.push(b',');
        }
        serde_json::to_writer(&mut *tail, item).expect("messages always serialize");
    }
}

/// Which API's shapes a session's requests are rendered in (Anthropic's
/// are rendered whole, apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Api {
    /// Chat completions: `messages`.
    #[default]
    Chat,
    /// OpenAI's Responses API: `input` items.
    Responses,
}

impl Api {
    fn of(state: &SessionState) -> Api {
        match state.spec.as_ref().is_some_and(|s| s.model.is_responses()) {
            true => Api::Responses,
            false => Api::Chat,
        }
    }
}

/// The instruction of a compaction request.
pub const COMPACT_INSTRUCTION: &str = "[mneme:compact] Summarize the conversation below for your own later use: \
keep every fact, decision, amount, identifier and tool result that later turns may need. Answer with the summary only.";

/// The request that asks the model to summarize the first `upto` entries
/// (after any earlier summary): the instruction, then the conversation as
/// text. Deterministic, like every request.
pub fn compaction_request(state: &SessionState, upto: usize) -> Option<Vec<u8>> {
    let spec = state.spec.as_ref()?;
    let mut lines = Vec::new();
    if let Some((_, summary)) = &state.compacted {
        lines.push(format!("summary so far: {summary}"));
    }
    let mut earlier = Vec::new();
    for entry in state.entries.get(..upto.checked_sub(state.dropped)?)? {
        entry_messages(entry, Reasoning::Drop, &mut earlier);
    }
    for m in &earlier {
        let calls = m
            .tool_calls
            .iter()
            .flatten()
            .map(|c| format!(" [calls {}({})]", c.function.name, c.function.arguments));
        lines.push(format!(
            "{}: {}{}",
            m.role,
            m.content.as_deref().unwrap_or(""),
            calls.collect::<String>()
        ));
    }
    if spec.model.is_anthropic() {
        return Some(crate::anthropic::compaction_request(
            spec,
            COMPACT_INSTRUCTION,
            &lines.join("\n"),
        ));
    }
    if spec.model.is_responses() {
        return Some(crate::responses::compaction_request(
            spec,
            COMPACT_INSTRUCTION,
            &lines.join("\n"),
        ));
    }
    let messages = [
        text_message("system", COMPACT_INSTRUCTION),
        text_message("user", &lines.join("\n")),
    ];
    let request = ChatRequest {
        model: &spec.model.model,
        messages: &messages,
        tools: Vec::new(),
        temperature: spec.model.temperature,
        max_tokens: spec.model.max_tokens,
        max_completion_tokens: spec.model.max_completion_tokens,
        stream: false,
        stream_options: None,
        prompt_cache_key: None,
        cache_salt: None,
    };
    Some(serde_json::to_vec(&request).expect("requests always serialize"))
}

/// The session id as the request's prefix-cache key, unless the spec turns
/// that off.
fn cache_key<'a>(spec: &AgentSpec, session: &'a str) -> Option<&'a str> {
    spec.model
        .prompt_cache_key
        .unwrap_or(true)
        .then_some(session)
}

/// The exact body of the next request of `session` in its spec's API
/// (chat completions, the Responses API or Anthropic's Messages API): its
/// conversation, and the session id as the prefix-cache key unless the
/// spec turns that off.
pub fn next_request(session: &str, state: &SessionState) -> Option<Vec<u8>> {
    let spec = state.spec.as_ref()?;
    if spec.model.is_anthropic() {
        return crate::anthropic::request(state, room_to_finish(state));
    }
    let key = cache_key(spec, session);
    if spec.model.is_responses() {
        let input = crate::responses::input(state);
        return Some(crate::responses::body(
            spec,
            &input,
            key,
            room_to_finish(state),
        ));
    }
    let fields = cache_fields(spec, state, session);
    Some(body(spec, &messages(state), fields, room_to_finish(state)))
}

/// Whether the next request gives the reply twice the spec's tokens: the
/// last reply was cut off in the middle of its tool calls (once only: a
/// second cut-off ends the turn).
fn room_to_finish(state: &SessionState) -> bool {
    state.cut_off_in_a_row == 1
}

/// The exact body of a chat-completions request, with the spec's token
/// limits.
pub fn request_body(spec: &AgentSpec, messages: &[Message], cache_key: Option<&str>) -> Vec<u8> {
    let fields = CacheFields {
        key: cache_key,
        salt: None,
    };
    body(spec, messages, fields, false)
}

/// The exact body of a chat-completions request; with `widened`, its token
/// limits doubled.
fn body(spec: &AgentSpec, messages: &[Message], cache: CacheFields, widened: bool) -> Vec<u8> {
    let widen = |limit: Option<u64>| match widened {
        true => limit.map(|l| l.saturating_mul(2)),
        false => limit,
    };
    let request = ChatRequest {
        model: &spec.model.model,
        messages,
        tools: spec
            .tools
            .iter()
            .map(|t| ToolDefinition {
                kind: "function",
                function: FunctionDefinition {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                },
            })
            .collect(),
        temperature: spec.model.temperature,
        max_tokens: widen(spec.model.max_tokens),
        max_completion_tokens: widen(spec.model.max_completion_tokens),
        stream: spec.model.streams(),
        stream_options: spec.model.streams().then_some(StreamOptions {
            include_usage: true,
        }),
        prompt_cache_key: cache.key,
        cache_salt: cache.salt,
    };
    serde_json::to_vec(&request).expect("requests always serialize")
}

/// The spec's rule for the replies' reasoning.
fn reasoning_of(state: &SessionState) -> Reasoning {
    state
        .spec
        .as_ref()
        .map_or_else(Reasoning::default, |s| s.model.reasoning)
}

fn text_message(role: &'static str, text: &str) -> Message {
    Message {
        role,
        content: Some(text.to_string()),
        tool_calls: None,
        tool_call_id: None,
        reasoning_content: None,
    }
}

fn wire_calls(calls: &[CallState]) -> Vec<WireToolCall> {
    calls
        .iter()
        .map(|c| WireToolCall {
            id: c.call.id.clone(),
            kind: "function",
            function: WireFunction {
                name: c.call.sent_name().to_string(),
                arguments: wire_arguments(&c.call.arguments),
            },
        })
        .collect()
}

/// A call's arguments as the request carries them: the model's exact text
/// when it is JSON; otherwise (a log written before mneme refused such
/// replies) the text inside a JSON object, [`UNPARSED_ARGUMENTS`], since
/// servers refuse a history with arguments that do not parse.
pub(crate) fn wire_arguments(arguments: &str) -> String {
    if serde_json::from_str::<serde::de::IgnoredAny>(arguments).is_ok() {
        return arguments.to_string();
    }
    serde_json::json!({ UNPARSED_ARGUMENTS: arguments }).to_string()
}

/// The key under which arguments that are not JSON are sent back.
pub const UNPARSED_ARGUMENTS: &str = "mneme_unparsed_arguments";

/// The text the model sees as a call's result. A call a person approved
/// with other arguments keeps the model's arguments in the request (it is
/// what the model said, and an entry once sent never changes); its result
/// starts with a note of the arguments it ran with, and who gave them:
/// `(arguments edited by NAME: {...})`, then a new line.
pub fn result_text(call: &CallState) -> String {
    let result = outcome_text(call);
    match &call.edited {
        Some(edited) => format!(
            "{EDITED_PREFIX} {}: {})\n{result}",
            edited.by, edited.arguments
        ),
        None => result,
    }
}

/// What the result of a call a person approved with other arguments
/// starts with (then who, and the arguments).
pub const EDITED_PREFIX: &str = "(arguments edited by";

fn outcome_text(call: &CallState) -> String {
    match &call.phase {
        CallPhase::Finished(ToolOutcome::Ok(output)) => output.clone(),
        CallPhase::Finished(ToolOutcome::Err(error)) => format!("error: {error}"),
        CallPhase::Pending => NOT_RUN_RESULT.to_string(),
        CallPhase::Started | CallPhase::RetryApproved | CallPhase::Checked(_) => {
            INTERRUPTED_RESULT.to_string()
        }
        CallPhase::InDoubt(_) => IN_DOUBT_RESULT.to_string(),
        CallPhase::AwaitingApproval => AWAITING_APPROVAL_RESULT.to_string(),
        CallPhase::Sleeping(_) => NOT_WOKEN_RESULT.to_string(),
    }
}
