//! The command tool: a local program, arguments as JSON on stdin, the
//! idempotency key in `MNEME_IDEMPOTENCY_KEY`, stdout as the result.
//!
//! The program is untrusted: it gets a minimal environment (no API keys, no
//! daemon token), its stdout is kept up to the tool's `max_output_bytes` and
//! its stderr's end only, and it runs in its own process group, which is
//! killed when the call ends, so nothing it started keeps running.

use crate::capture::{capture, truncation_note, Keep};
use crate::{json_or_text, with_timeout, CallContext, Tool, ToolError};
use async_trait::async_trait;
use replay::spec::ToolSpec;
use std::process::Stdio;
use tokio::io::AsyncWriteExt;

/// Variables of mneme's environment every command tool gets.
pub const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG"];
/// Characters of stderr's end quoted in an error.
const STDERR_TAIL_CHARS: usize = 500;
/// Bytes of stderr's end kept (enough for [`STDERR_TAIL_CHARS`] characters).
const STDERR_TAIL_BYTES: usize = 4 * STDERR_TAIL_CHARS;

/// How a program ran to its exit.
pub(crate) struct Ran {
    /// How it exited.
    pub(crate) status: std::process::ExitStatus,
    /// Its stdout as a call returns it (JSON where it parses, clipped).
    pub(crate) output: String,
    /// The end of its stderr.
    pub(crate) stderr_tail: String,
}

/// A tool that runs a program.
pub struct CommandTool {
    spec: ToolSpec,
    program: String,
    args: Vec<String>,
}

impl CommandTool {
    /// Builds the tool; fails if the spec names no program.
    pub fn new(spec: ToolSpec) -> Result<CommandTool, ToolError> {
        let mut words = spec.command.clone().unwrap_or_default().into_iter();
        let program = words.next().ok_or_else(|| ToolError::Config {
            tool: spec.name.clone(),
            reason: "command is empty".into(),
        })?;
        Ok(CommandTool {
            spec,
            program,
            args: words.collect(),
        })
    }

    /// The command, with the environment the call may see and nothing else.
    fn command(&self, ctx: &CallContext) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        command.args(&self.args).env_clear();
        let passed = BASE_ENV
            .iter()
            .copied()
            .chain(self.spec.env.iter().map(String::as_str));
        for name in passed {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command
            .env("MNEME_IDEMPOTENCY_KEY", &ctx.idempotency_key)
            .env("MNEME_SESSION_ID", ctx.session.to_string())
            .env("MNEME_CALL_ID", &ctx.call_id)
            .env("MNEME_ATTEMPT", ctx.attempt.to_string())
            // Its own process group, so the end of the call stops everything
            // it started.
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    async fn run(&self, ctx: &CallContext, input: &str) -> Result<String, ToolError> {
        let ran = self.execute(ctx, input).await?;
        if !ran.status.success() {
            return Err(ToolError::Failed {
                tool: self.spec.name.clone(),
                reason: format!("{} ({})", ran.status, ran.stderr_tail),
            });
        }
        Ok(ran.output)
    }

    /// Runs the program to its exit: how it exited, its output as a call
    /// returns it, and the end of its stderr. Killed by a signal, it was
    /// interrupted.
    pub(crate) async fn execute(&self, ctx: &CallContext, input: &str) -> Result<Ran, ToolError> {
        let failed = |reason: String| ToolError::Failed {
            tool: self.spec.name.clone(),
            reason,
        };
        let mut child = crate::spawn::spawn(self.command(ctx))
            .await
            .map_err(|e| failed(format!("cannot start {:?}: {e}", self.program)))?;
        let _group = child.id().map(crate::spawn::GroupKiller);
        let (exited, exit_seen) = tokio::sync::watch::channel(false);
        let limit = usize::try_from(self.spec.max_output_bytes()).unwrap_or(usize::MAX);
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let stdin = child.stdin.take();
        let mut feed_until_exit = exit_seen.clone();
        let feed = async move {
            let Some(mut stdin) = stdin else { return };
            // A program that ignores its input may close stdin early, or
            // exit leaving a descendant that holds it unread: neither is
            // an error, nor may it hold the call.
            tokio::select! {
                _ = stdin.write_all(input.as_bytes()) => {}
                _ = feed_until_exit.wait_for(|exited| *exited) => {}
            }
        };
        let wait = async {
            let status = child.wait().await;
            let _ = exited.send(true);
            status
        };
        let (_, status, out, err) = tokio::join!(
            feed,
            wait,
            capture(stdout, Keep::Head(limit), exit_seen.clone()),
            capture(stderr, Keep::Tail(STDERR_TAIL_BYTES), exit_seen),
        );
        let status = status.map_err(|e| failed(format!("waiting for {:?}: {e}", self.program)))?;
        if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
            // Killed by someone else: it may have acted before it died.
            return Err(ToolError::Interrupted {
                tool: self.spec.name.clone(),
                reason: format!("killed by signal {signal}"),
            });
        }
        let stderr = err.text(Keep::Tail(STDERR_TAIL_BYTES));
        let tail: String = stderr
            .trim()
            .chars()
            .rev()
            .take(STDERR_TAIL_CHARS)
            .collect();
        let text = out.text(Keep::Head(limit));
        let output = match out.truncated() {
            true => {
                let note = truncation_note(text.len(), out.total, true);
                serde_json::Value::String(text + &note).to_string()
            }
            false => json_or_text(text.trim_end()).to_string(),
        };
        Ok(Ran {
            status,
            output,
            stderr_tail: tail.chars().rev().collect(),
        })
    }
}

#[async_trait]
impl Tool for CommandTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &CallContext, args: &str) -> Result<String, ToolError> {
        with_timeout(&self.spec, self.run(ctx, args)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use replay::spec::{Effect, ToolKind};

    fn spec(command: &[&str], timeout: u64) -> ToolSpec {
        ToolSpec {
            name: "cmd".into(),
            description: String::new(),
            kind: ToolKind::Command,
            effect: Effect::SideEffect,
            parameters: serde_json::json!({}),
            honours_idempotency_key: None,
            timeout_secs: Some(timeout),
            requires_approval: false,
            approval_timeout: None,
            method: None,
            url: None,
            command: Some(command.iter().map(|s| s.to_string()).collect()),
            env: Vec::new(),
            max_output_bytes: None,
            mcp: None,
            check: None,
            check_command: None,
            agent: None,
            agent_spec: None,
        }
    }

    fn ctx() -> CallContext {
        CallContext {
            session: uuid::Uuid::nil(),
            call_id: "c1".into(),
            idempotency_key: "mneme-k1".into(),
            attempt: 1,
            blobs: None,
            cancel: None,
        }
    }

    #[tokio::test]
    async fn gets_args_on_stdin_and_key_in_env() {
        let tool = CommandTool::new(spec(
            &[
                "sh",
                "-c",
                "read a; printf '{\"in\":%s,\"key\":\"%s\"}' \"$a\" \"$MNEME_IDEMPOTENCY_KEY\"",
            ],
            5,
        ))
        .unwrap();
        let out = tool.call(&ctx(), "{\"x\":1}\n").await.unwrap();
        assert_eq!(out, r#"{"in":{"x":1},"key":"mneme-k1"}"#);
    }

    #[tokio::test]
    async fn gets_a_minimal_environment_plus_what_the_spec_allows() {
        std::env::set_var("MNEME_TEST_SECRET_KEY", "sk-very-secret");
        std::env::set_var("MNEME_TEST_ALLOWED", "visible");
        let mut spec = spec(&["sh", "-c", "env"], 5);
        spec.env = vec!["MNEME_TEST_ALLOWED".into()];
        let out = CommandTool::new(spec)
            .unwrap()
            .call(&ctx(), "{}")
            .await
            .unwrap();
        assert!(!out.contains("sk-very-secret"), "{out}");
        assert!(out.contains("MNEME_TEST_ALLOWED=visible"), "{out}");
        assert!(out.contains("MNEME_IDEMPOTENCY_KEY=mneme-k1"), "{out}");
        assert!(out.contains("PATH="), "{out}");
    }

    #[tokio::test]
    async fn output_past_the_limit_is_dropped_and_counted() {
        let mut spec = spec(&["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a"], 10);
        spec.max_output_bytes = Some(1000);
        let out = CommandTool::new(spec)
            .unwrap()
            .call(&ctx(), "{}")
            .await
            .unwrap();
        let text: String = serde_json::from_str(&out).unwrap();
        assert!(text.starts_with(&"a".repeat(1000)), "{}", &text[..50]);
        assert!(
            text.ends_with(
                "[mneme] output truncated: kept the first 1000 of 3000000 bytes (max_output_bytes)"
            ),
            "{}",
            &text[1000..]
        );
    }

    #[tokio::test]
    async fn a_descendant_holding_stdout_does_not_hold_the_call() {
        let started = std::time::Instant::now();
        let tool = CommandTool::new(spec(
            &["sh", "-c", "setsid sleep 30 & echo '{\"done\":true}'"],
            10,
        ))
        .unwrap();
        let out = tool.call(&ctx(), "{}").await.unwrap();
        assert_eq!(out, r#"{"done":true}"#);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "the call waited for the escaped sleep: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_descendant_holding_stdin_unread_does_not_hold_the_call() {
        let started = std::time::Instant::now();
        let tool = CommandTool::new(spec(
            &["sh", "-c", "setsid sleep 30 <&0 & echo '{\"done\":true}'"],
            10,
        ))
        .unwrap();
        let input = format!("{{\"pad\":\"{}\"}}", "x".repeat(1 << 20));
        let out = tool.call(&ctx(), &input).await.unwrap();
        assert_eq!(out, r#"{"done":true}"#);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "the call waited to feed the escaped sleep: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_command_killed_by_a_signal_has_an_unknown_outcome() {
        let tool = CommandTool::new(spec(&["sh", "-c", "kill -9 $$"], 5)).unwrap();
        let err = tool.call(&ctx(), "{}").await.unwrap_err();
        assert!(
            err.outcome_unknown() && err.to_string().contains("signal 9"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn failing_command_reports_status_and_stderr() {
        let tool = CommandTool::new(spec(&["sh", "-c", "echo nope >&2; exit 3"], 5)).unwrap();
        let err = tool.call(&ctx(), "{}").await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("exit status: 3") && text.contains("nope"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn hanging_command_times_out_and_everything_it_started_is_stopped() {
        let dir = std::env::temp_dir().join(format!("mneme-group-{}", std::process::id()));
        let script = format!("sleep 30 & echo $! > {}; wait", dir.display());
        let tool = CommandTool::new(spec(&["sh", "-c", &script], 1)).unwrap();
        let err = tool.call(&ctx(), "{}").await.unwrap_err();
        assert!(err.outcome_unknown(), "{err}");
        let grandchild: i32 = std::fs::read_to_string(&dir)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::fs::remove_file(&dir).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(grandchild, 0) } == 0
            && !std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .unwrap_or_default()
                .contains(") Z ");
        assert!(!alive, "the sleep the tool started outlived the timeout");
    }
}
