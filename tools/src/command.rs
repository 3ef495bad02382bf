//! The command tool: a local program, arguments as JSON on stdin, the
//! idempotency key in `MNEME_IDEMPOTENCY_KEY`, stdout as the result.

use crate::{json_or_text, with_timeout, CallContext, Tool, ToolError};
use async_trait::async_trait;
use replay::spec::ToolSpec;
use std::process::Stdio;
use tokio::io::AsyncWriteExt;

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

    async fn run(&self, ctx: &CallContext, input: &str) -> Result<String, ToolError> {
        let failed = |reason: String| ToolError::Failed {
            tool: self.spec.name.clone(),
            reason,
        };
        let mut command = tokio::process::Command::new(&self.program);
        // Its own process group, so a timeout stops everything it started.
        // (Not PR_SET_PDEATHSIG: it fires when the spawning *thread* exits,
        // and the async runtime retires threads.)
        command.process_group(0);
        let mut child = command
            .args(&self.args)
            .env("MNEME_IDEMPOTENCY_KEY", &ctx.idempotency_key)
            .env("MNEME_SESSION_ID", ctx.session.to_string())
            .env("MNEME_CALL_ID", &ctx.call_id)
            .env("MNEME_ATTEMPT", ctx.attempt.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("cannot start {:?}: {e}", self.program)))?;
        let _group = child.id().map(GroupKiller);
        if let Some(mut stdin) = child.stdin.take() {
            // A program that ignores its input may close stdin early: not an error.
            let _ = stdin.write_all(input.as_bytes()).await;
        }
        let output = child
            .wait_with_output()
            .await
            .map_err(|e| failed(format!("waiting for {:?}: {e}", self.program)))?;
        if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&output.status) {
            // Killed by someone else: it may have acted before it died.
            return Err(ToolError::Interrupted {
                tool: self.spec.name.clone(),
                reason: format!("killed by signal {signal}"),
            });
        }
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: String = stderr
                .trim()
                .chars()
                .rev()
                .take(500)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return Err(failed(format!("{} ({tail})", output.status)));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        Ok(json_or_text(stdout.trim_end()).to_string())
    }
}

/// Kills a process group when dropped: when the call ends, times out or is
/// abandoned, nothing it started keeps running.
struct GroupKiller(u32);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions. The group id is
        // the pid of our child, which cannot be reused while the group lives.
        unsafe {
            libc::kill(-(self.0 as i32), libc::SIGKILL);
        }
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
            method: None,
            url: None,
            command: Some(command.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn ctx() -> CallContext {
        CallContext {
            session: uuid::Uuid::nil(),
            call_id: "c1".into(),
            idempotency_key: "mneme-k1".into(),
            attempt: 1,
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
