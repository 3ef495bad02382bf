//! Text from outside (model servers, tools) on its way to a terminal, a log
//! line or the log: control characters escaped, secrets redacted.
//!
//! Secrets are what this process knows to be secret (API key values, the
//! daemon's token, a store's password): registered once, redacted from
//! every event before it is recorded ([`redact_event`]) and from every line
//! printed ([`for_terminal`]). JSON output is exact: it is escaped by JSON.

use replay::Event;
use std::borrow::Cow;
use std::sync::RwLock;

/// What a redacted secret is replaced with.
pub const REDACTED: &str = "[redacted]";
/// Secrets shorter than this are not registered: redacting them would
/// rewrite ordinary words people and models say in the log (a store
/// password `postgres`, a local server's placeholder key); tokens under 16
/// bytes are refused anyway.
pub const MIN_SECRET_LEN: usize = 16;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// What this process is, as people started it (`mneme serve`).
static PROCESS: RwLock<String> = RwLock::new(String::new());

/// Names this process (`mneme serve`) for messages that depend on where
/// they happen: a variable missing from the daemon's environment is not
/// missing from the shell that asked it for a turn.
pub fn name_this_process(name: &str) {
    *PROCESS.write().expect("process lock") = name.to_string();
}

/// This process as messages name it: `mneme serve, pid 4242`.
pub fn this_process() -> String {
    let name = PROCESS.read().expect("process lock");
    let name = match name.is_empty() {
        true => "this process",
        false => name.as_str(),
    };
    format!("{name}, pid {}", std::process::id())
}

/// Registers `secret` (and its trimmed form) to be redacted from what this
/// process records and prints from now on.
pub fn register_secret(secret: &str) {
    let mut secrets = SECRETS.write().expect("secrets lock");
    for form in [secret, secret.trim()] {
        if form.len() >= MIN_SECRET_LEN && !secrets.iter().any(|s| s == form) {
            secrets.push(form.to_string());
        }
    }
    // Longest first, so a secret that contains another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `text` with every registered secret replaced by [`REDACTED`].
pub fn redact(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.read().expect("secrets lock");
    let mut out = Cow::Borrowed(text);
    for secret in secrets.iter() {
        if out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
        }
    }
    out
}

/// Whether `bytes` hold a registered secret.
fn holds_secret(bytes: &[u8]) -> bool {
    let secrets = SECRETS.read().expect("secrets lock");
    secrets
        .iter()
        .any(|s| bytes.windows(s.len()).any(|window| window == s.as_bytes()))
}

/// `event` with every registered secret redacted from its strings, and its
/// encoding; the event is unchanged (and not re-encoded) when it holds none.
pub fn redact_event(event: Event) -> (Event, Vec<u8>) {
    let encoded = event.encode();
    if !holds_secret(&encoded) {
        return (event, encoded);
    }
    let mut value = serde_json::to_value(&event).expect("events convert to JSON");
    redact_value(&mut value);
    let event: Event = serde_json::from_value(value).expect("redacting keeps the shape");
    let encoded = event.encode();
    (event, encoded)
}

fn redact_value(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(s) => {
            if let Cow::Owned(clean) = redact(s) {
                *s = clean;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_value),
        serde_json::Value::Object(map) => map.values_mut().for_each(redact_value),
        _ => {}
    }
}

/// Writes `line` to stderr as one line, in one write (a process killed
/// mid-line never leaves half of it, and lines of concurrent tasks never
/// interleave), made safe by [`for_terminal`]: what a command says to the
/// person who ran it.
pub fn say(line: &str) {
    use std::io::Write as _;
    let line = for_terminal(line) + "\n";
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// [`say`] for a message of several lines that mneme wrote itself (an
/// agent file's error, with the caret under the place at fault): its
/// newlines are kept, every other control character is escaped.
pub fn say_lines(text: &str) {
    use std::io::Write as _;
    let text = for_terminal_multiline(text.trim_end()) + "\n";
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// How bad a logged event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Something that happened as it should.
    Info,
    /// Something that failed or needs a person's attention.
    Warn,
}

/// Logs `line` as a `tracing` event of target `mneme` at `level`, made
/// safe by [`for_terminal`]; the binary writes events to stderr, as human
/// lines or JSON ([`init_logging`]), a library user's subscriber gets them.
pub fn log(level: Level, line: &str) {
    let line = for_terminal(line);
    match level {
        Level::Info => tracing::info!(target: "mneme", "{line}"),
        Level::Warn => tracing::warn!(target: "mneme", "{line}"),
    }
}

/// How the binary writes log events to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// The message alone, one line each.
    #[default]
    Human,
    /// One JSON object a line: timestamp, level, target, message.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "human" => Ok(Self::Human),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "unknown log format {other:?}: expected human or json"
            )),
        }
    }
}

/// Sends this process's log events to stderr in `format`, each line in
/// one write. Call once, first thing.
pub fn init_logging(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO);
    let _ = match format {
        LogFormat::Human => builder
            .without_time()
            .with_level(false)
            .with_target(false)
            .try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// [`log`] at [`Level::Info`] with `format!` arguments.
#[macro_export]
macro_rules! log_line {
    ($($arg:tt)*) => {
        $crate::text::log($crate::text::Level::Info, &format!($($arg)*))
    };
}

/// [`log`] at [`Level::Warn`] with `format!` arguments.
#[macro_export]
macro_rules! warn_line {
    ($($arg:tt)*) => {
        $crate::text::log($crate::text::Level::Warn, &format!($($arg)*))
    };
}

/// Streamed text on its way out: redacted (a secret split across pieces
/// too: the last bytes are held back until no secret can start in them),
/// and for a terminal escaped, newlines kept.
#[derive(Default)]
pub struct StreamText {
    held: std::sync::Mutex<String>,
    raw: bool,
}

impl StreamText {
    /// For a terminal: redacted and escaped.
    pub fn for_terminal() -> StreamText {
        StreamText::default()
    }

    /// For JSON (which escapes by itself): redacted only.
    pub fn for_json() -> StreamText {
        StreamText {
            raw: true,
            ..StreamText::default()
        }
    }

    fn shown(&self, text: &str) -> String {
        match self.raw {
            true => text.to_string(),
            false => escape(text, true),
        }
    }

    /// What of `piece` (after what was held) can be shown now.
    pub fn push(&self, piece: &str) -> String {
        let mut held = self.held.lock().expect("stream lock");
        held.push_str(piece);
        let redacted = redact(&held).into_owned();
        let hold = longest_secret().saturating_sub(1);
        let mut cut = redacted.len().saturating_sub(hold);
        while !redacted.is_char_boundary(cut) {
            cut -= 1;
        }
        *held = redacted[cut..].to_string();
        self.shown(&redacted[..cut])
    }

    /// What was held back, to show at the end of the stream.
    pub fn finish(&self) -> String {
        let rest = std::mem::take(&mut *self.held.lock().expect("stream lock"));
        self.shown(&redact(&rest))
    }
}

fn longest_secret() -> usize {
    let secrets = SECRETS.read().expect("secrets lock");
    secrets.first().map_or(0, String::len)
}

/// One line for a terminal or a log: secrets redacted, and every control
/// character (newlines, escape sequences, C1 controls, bidi overrides)
/// escaped, so text from outside can neither forge lines nor drive the
/// terminal.
pub fn for_terminal(text: &str) -> String {
    escape(&redact(text), false)
}

/// Several lines for a terminal (an answer): as [`for_terminal`], but
/// newlines and tabs are kept.
pub fn for_terminal_multiline(text: &str) -> String {
    escape(&redact(text), true)
}

fn escape(text: &str, keep_lines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' if keep_lines => out.push(c),
            c if is_dangerous(c) => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// Characters a terminal acts on instead of showing.
fn is_dangerous(c: char) -> bool {
    c.is_control() // C0, DEL and C1 (U+0080 to U+009F, CSI among them)
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}')
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Windows of time as people write them (`30d`, `12h`, `90s`): defined
/// with the agent spec, which checks a tool's `approval_timeout`.
pub use replay::spec::{parse_window, window};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_read_and_print_in_whole_units() {
        for (text, seconds) in [
            ("30d", 2_592_000),
            ("12h", 43_200),
            ("90s", 90),
            ("5m", 300),
        ] {
            let parsed = parse_window(text).unwrap();
            assert_eq!(parsed.as_secs(), seconds);
            assert_eq!(window(parsed), text);
        }
        for bad in ["", "30", "d", "0d", "-1d", "1.5h", "3w"] {
            let err = parse_window(bad).unwrap_err();
            assert!(err.contains("such as 30d"), "{bad}: {err}");
        }
    }

    #[test]
    fn escapes_what_a_terminal_would_obey() {
        let hostile = "ok\u{1b}]52;c;aGk=\u{7}\u{1b}[2J\u{9b}31m\r\nforged\u{202e}";
        let line = for_terminal(hostile);
        assert!(!line.chars().any(is_dangerous), "{line:?}");
        assert_eq!(
            line,
            "ok\\u{1b}]52;c;aGk=\\u{7}\\u{1b}[2J\\u{9b}31m\\r\\nforged\\u{202e}"
        );
        assert_eq!(for_terminal_multiline("a\nb\u{1b}c"), "a\nb\\u{1b}c");
    }

    #[test]
    fn a_secret_split_across_streamed_pieces_is_never_shown() {
        register_secret("sk-stream-0123456789abcdef");
        let stream = StreamText::for_terminal();
        let mut shown = String::new();
        for piece in [
            "your key is sk-str",
            "eam-0123",
            "456789abcdef, ok\u{1b}",
            "[2J done",
        ] {
            shown.push_str(&stream.push(piece));
        }
        shown.push_str(&stream.finish());
        assert_eq!(shown, "your key is [redacted], ok\\u{1b}[2J done");
    }

    #[test]
    fn registered_secrets_are_redacted_from_text_and_events() {
        register_secret("sk-test-0123456789abcdef");
        register_secret("lm-studio");
        assert_eq!(
            redact("key sk-test-0123456789abcdef, lm-studio"),
            "key [redacted], lm-studio"
        );
        let (event, bytes) = redact_event(Event::UserMessage {
            text: "echo: Authorization: Bearer sk-test-0123456789abcdef".into(),
        });
        assert_eq!(
            event,
            Event::UserMessage {
                text: "echo: Authorization: Bearer [redacted]".into()
            }
        );
        assert_eq!(bytes, event.encode());
        let clean = Event::UserMessage { text: "hi".into() };
        assert_eq!(redact_event(clean.clone()).0, clean);
    }
}
