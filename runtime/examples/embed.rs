//! Embedding mneme in a Rust program: an agent whose tool is a Rust type.
//!
//! The agent file declares the tool (`kind = "native"`: its name,
//! description, parameters and effect are recorded in the session's log
//! like any tool's); the program hands the runner the code that runs it.
//! The session lives in a sled data directory that the `mneme` binary reads
//! like any other (`mneme --data-dir DIR log ID`).
//!
//! Run: `cargo run -p mneme-runtime --example embed -- DATA_DIR`
//! (a scripted model stands in for a server, so it runs anywhere).

use async_trait::async_trait;
use eventlog::{Durability, SledLog};
use mneme_runtime::load_agent_file;
use mneme_runtime::Service;
use mneme_runtime::TurnEnd;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tools::{CallContext, Tool, ToolError};

/// Adds two integers. Read-only: running it twice changes nothing, so a
/// resume may run an unfinished call again.
struct Add {
    spec: replay::ToolSpec,
    calls: AtomicU64,
}

#[async_trait]
impl Tool for Add {
    fn spec(&self) -> &replay::ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: &CallContext, args: &str) -> Result<String, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let bad = |reason: String| ToolError::BadArguments {
            tool: self.spec.name.clone(),
            reason,
        };
        let args: Value = serde_json::from_str(args).map_err(|e| bad(e.to_string()))?;
        let term = |name: &str| {
            args[name]
                .as_i64()
                .ok_or_else(|| bad(format!("{name} must be an integer")))
        };
        Ok(serde_json::json!({ "sum": term("a")? + term("b")? }).to_string())
    }
}

const AGENT: &str = r#"
name = "adder"
system = "You add numbers with the add tool."
[model]
provider = "scripted"
model = "scripted"
script = "script.json"
[[tools]]
name = "add"
description = "Adds two integers"
kind = "native"
effect = "read_only"
parameters = { type = "object", properties = { a = { type = "integer" }, b = { type = "integer" } }, required = ["a", "b"] }
"#;

const SCRIPT: &str = r#"{"replies": [
  {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
  {"content": "2 + 3 = 5"}
]}"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).ok_or("usage: embed DATA_DIR")?);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("agent.toml"), AGENT)?;
    std::fs::write(dir.join("script.json"), SCRIPT)?;
    let spec = load_agent_file(&dir.join("agent.toml"))?;
    // The code of each native tool, under the spec the agent declares.
    let declared = spec
        .tools
        .iter()
        .find(|t| t.name == "add")
        .ok_or("no add tool")?;
    let add = Arc::new(Add {
        spec: declared.clone(),
        calls: AtomicU64::new(0),
    });

    let log = Arc::new(SledLog::open(dir.join("data"))?);
    let service = Service::new(log, Durability::Synced);
    let mut session = service.create(spec).await?;
    service
        .post_message(&mut session, "What is 2 + 3?".into())
        .await?;
    let runner = service.runner();
    let parts = runner
        .parts_with_native(&mut session, vec![add.clone()])
        .await?;
    let end = runner.drive_with(&mut session, &parts).await?;

    println!("session {}", session.id());
    match end {
        TurnEnd::Answered(answer) => println!("answer: {answer}"),
        other => return Err(format!("the turn ended otherwise: {other:?}").into()),
    }
    println!("add ran {} time(s)", add.calls.load(Ordering::SeqCst));
    Ok(())
}
