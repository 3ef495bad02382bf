//! JSON-RPC over a stdio MCP server: one JSON message a line each way.
//!
//! The server is untrusted: a line longer than the spec's
//! `max_message_bytes` ends the connection (a stream cannot be resynced
//! after it), its stderr's end only is kept, and it runs in its own process
//! group with mneme's death as its own (see `spawn`).

use super::{RpcError, RpcResult};
use crate::capture::{Captured, Keep};
use crate::spawn::GroupKiller;
use replay::mcp::McpServerSpec;
use serde_json::Value;
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;

/// Bytes of a stdio server's stderr kept (its end).
const STDERR_TAIL_BYTES: usize = 8 << 10;

type Pending = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<RpcResult>>>>>;
type Stdin = Arc<tokio::sync::Mutex<tokio::process::ChildStdin>>;

/// A running stdio server.
pub(crate) struct StdioServer {
    stdin: Stdin,
    pending: Pending,
    stderr: Arc<Mutex<Captured>>,
    _child: tokio::process::Child,
    _group: Option<GroupKiller>,
}

impl StdioServer {
    /// Starts the server's command with a minimal environment.
    pub(crate) async fn start(spec: &McpServerSpec) -> Result<StdioServer, String> {
        let words = spec.command.clone().unwrap_or_default();
        let (program, args) = words.split_first().ok_or("command is empty")?;
        let mut command = tokio::process::Command::new(program);
        command.args(args).env_clear();
        let passed = crate::BASE_ENV
            .iter()
            .copied()
            .chain(spec.env.iter().map(String::as_str));
        for name in passed {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = crate::spawn::spawn(command)
            .await
            .map_err(|e| format!("cannot start {program:?}: {e}"))?;
        let group = child.id().map(GroupKiller);
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
        let stdin = child.stdin.take().expect("stdin is piped");
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let stderr = Arc::new(Mutex::new(Captured::default()));
        let kept = stderr.clone();
        tokio::spawn(async move {
            let mut chunk = vec![0u8; 8 << 10];
            while let Ok(n) = stderr_pipe.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                let mut kept = kept.lock().expect("stderr lock");
                kept.take(&chunk[..n], Keep::Tail(STDERR_TAIL_BYTES));
            }
        });
        let max = usize::try_from(spec.max_message_bytes()).unwrap_or(usize::MAX);
        let server = StdioServer {
            stdin: Arc::new(tokio::sync::Mutex::new(stdin)),
            pending: pending.clone(),
            stderr,
            _child: child,
            _group: group,
        };
        let stdin = server.stdin.clone();
        tokio::spawn(read_loop(BufReader::new(stdout), max, pending, stdin));
        Ok(server)
    }

    /// Whether the server's stdout is still open.
    pub(crate) fn alive(&self) -> bool {
        self.pending.lock().expect("pending lock").is_some()
    }

    /// The end of what the server wrote to stderr, for errors.
    pub(crate) fn stderr_tail(&self) -> String {
        let kept = self.stderr.lock().expect("stderr lock");
        kept.text(Keep::Tail(STDERR_TAIL_BYTES)).trim().to_string()
    }

    /// Sends `message`; if it carries `id`, the answer arrives on the
    /// returned channel.
    pub(crate) async fn send(
        &self,
        message: &Value,
        id: Option<u64>,
    ) -> Result<Option<oneshot::Receiver<RpcResult>>, RpcError> {
        let answer = match id {
            None => None,
            Some(id) => {
                let (tx, rx) = oneshot::channel();
                let mut pending = self.pending.lock().expect("pending lock");
                let Some(pending) = pending.as_mut() else {
                    return Err(RpcError::Gone("the server has exited".into()));
                };
                pending.insert(id, tx);
                Some(rx)
            }
        };
        // A write given up half way (its call timed out against a server
        // that stopped reading) leaves half a line: the server is then done
        // for, and the next call starts it again.
        let unfinished = Unfinished(&self.pending);
        let written = write(&self.stdin, message).await;
        std::mem::forget(unfinished);
        written.map_err(|e| RpcError::Gone(format!("writing to the server: {e}")))?;
        Ok(answer)
    }
}

/// Marks the server gone when dropped (a write not finished).
struct Unfinished<'a>(&'a Pending);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        self.0.lock().expect("pending lock").take();
    }
}

/// Writes one message as a line.
async fn write(stdin: &Stdin, message: &Value) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).expect("JSON encodes");
    line.push(b'\n');
    let mut stdin = stdin.lock().await;
    stdin.write_all(&line).await?;
    stdin.flush().await
}

/// Reads the server's messages: answers go to whoever waits for them, the
/// server's own requests are answered (only `ping` is served; mneme offers
/// no client capabilities), and notifications are dropped. On the end of the stream (or a message past
/// the bound) every waiter learns the server is gone.
async fn read_loop(
    mut stdout: BufReader<tokio::process::ChildStdout>,
    max: usize,
    pending: Pending,
    stdin: Stdin,
) {
    let why = loop {
        match read_line(&mut stdout, max).await {
            Ok(Some(line)) => {
                if let Some(reply) = dispatch(&line, &pending) {
                    let _ = write(&stdin, &reply).await;
                }
            }
            Ok(None) => break "the server closed its stdout (it exited)".to_string(),
            Err(e) => break e,
        }
    };
    let waiting = pending.lock().expect("pending lock").take();
    for (_, waiter) in waiting.into_iter().flatten() {
        let _ = waiter.send(Err(RpcError::Gone(why.clone())));
    }
}

/// One line of at most `max` bytes; `None` at the end of the stream.
async fn read_line(
    reader: &mut BufReader<tokio::process::ChildStdout>,
    max: usize,
) -> Result<Option<Vec<u8>>, String> {
    let mut line = Vec::new();
    loop {
        let buf = reader
            .fill_buf()
            .await
            .map_err(|e| format!("reading the server's stdout: {e}"))?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max + 1 {
            return Err(format!(
                "the server sent a message over {max} bytes (max_message_bytes); the connection is closed"
            ));
        }
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if done {
            return Ok(Some(line));
        }
    }
}

/// Hands an answer to its waiter; returns the reply a request of the
/// server's gets.
fn dispatch(line: &[u8], pending: &Pending) -> Option<Value> {
    let message = serde_json::from_slice::<Value>(line).ok()?;
    if let Some(method) = message.get("method") {
        let id = message.get("id")?; // a notification: nothing to answer
        return Some(super::reply_to_server(id, method));
    }
    let id = message.get("id").and_then(Value::as_u64)?;
    let waiter = pending
        .lock()
        .expect("pending lock")
        .as_mut()
        .and_then(|p| p.remove(&id));
    if let Some(waiter) = waiter {
        let _ = waiter.send(super::answer_of(message));
    }
    None
}
