//! Helpers shared by the benchmarks.

use crate::{Fault, MockModel, MockReply, Sink};
use eventlog::{Durability, EventLog};
use runtime::{Runner, Session};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// A fresh directory for one benchmark section under `MNEME_BENCH_DIR`
/// (default `target/bench-data`), so every measure runs on the same disk.
pub fn bench_dir(name: &str) -> PathBuf {
    let root = std::env::var_os("MNEME_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data"));
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The address (`IP:PORT`) of the daemon started on `dir`, once its note
/// (`mneme.daemon`) says where it listens.
pub fn daemon_address(dir: &Path) -> String {
    let note = dir.join("mneme.daemon");
    let what = format!("the daemon to write its address in {}", note.display());
    // A daemon on a large store may take long to open it.
    crate::eventually_blocking(what, std::time::Duration::from_secs(600), || {
        std::fs::read_to_string(&note)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["addr"].as_str().map(String::from))
    })
}

/// An agent whose one tool, `charge`, is a side-effecting HTTP call; its
/// turns may take as many steps as a benchmark runs.
pub fn bench_spec(model_url: &str, tool_url: &str) -> replay::AgentSpec {
    let text = format!(
        "name = \"bench\"\nsystem = \"You are a benchmark.\"\n[model]\nprovider = \"openai\"\nbase_url = \"{model_url}\"\nmodel = \"m\"\n\
         [[tools]]\nname = \"charge\"\nkind = \"http\"\nurl = \"{tool_url}\"\neffect = \"side_effect\"\n\
         [limits]\nmax_steps_per_turn = 1000000000\n"
    );
    let spec: replay::AgentSpec = toml::from_str(&text).unwrap();
    spec.validate().unwrap();
    spec
}

/// `event` as the log takes it, with the current schema and no cause.
pub fn to_new_event(event: &replay::Event) -> eventlog::NewEvent {
    eventlog::NewEvent {
        kind: event.kind().into(),
        schema: replay::EVENT_SCHEMA,
        caused_by: None,
        payload: event.encode(),
    }
}

/// A realistic event mix: a user message, a reply with a tool call, its
/// start and its finish, about 1 KiB per event on average.
pub fn event(i: usize) -> replay::Event {
    let text = "x".repeat(700 + i % 300);
    let call_id = format!("call_{i}");
    match i % 4 {
        0 => replay::Event::UserMessage { text },
        1 => replay::Event::ModelReplied(replay::ModelReply {
            content: Some(text),
            tool_calls: vec![replay::ToolCall {
                id: call_id,
                name: "charge".into(),
                arguments: "{\"n\":1}".into(),
                invented: None,
            }],
            usage: replay::Usage {
                prompt_tokens: 1000,
                completion_tokens: 50,
                cached_tokens: 900,
                ..Default::default()
            },
            finish_reason: "tool_calls".into(),
            latency_ms: 12,
            request_digest: "d".repeat(64),
            ..Default::default()
        }),
        2 => replay::Event::ToolStarted {
            call_id: format!("call_{}", i - 1),
            tool: "charge".into(),
            args: text,
            effect: replay::Effect::SideEffect,
            idempotency_key: "mneme-0123456789abcdef0123456789abcdef".into(),
            attempt: 1,
        },
        _ => replay::Event::ToolFinished {
            call_id: format!("call_{}", i - 2),
            outcome: replay::ToolOutcome::Ok(text),
            duration_ms: 3,
            settled_by_check: false,
            rerun: None,
            child: None,
        },
    }
}

pub fn new_event(i: usize) -> eventlog::NewEvent {
    to_new_event(&event(i))
}

/// A user message of `bytes` of text that does not compress, drawn from
/// `seed` (sled counts its page cache in the pages' compressed bytes).
pub fn incompressible_message(seed: &mut u64, bytes: usize) -> eventlog::NewEvent {
    let text = (0..bytes)
        .map(|_| {
            *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            char::from(b"abcdefghijklmnopqrstuvwxyz ,.'"[(*seed >> 59) as usize % 30])
        })
        .collect();
    to_new_event(&replay::Event::UserMessage { text })
}

/// A model scripted to ask for `steps` charges, one per reply, then answer
/// "done"; and the sink the charges go to.
pub async fn charging_model(steps: usize) -> (MockModel, Sink) {
    let mut replies: Vec<MockReply> = (0..steps)
        .map(|i| MockReply::calls(&[("charge", json!({"n": i}))]))
        .collect();
    replies.push(MockReply::answer("done"));
    let model = MockModel::start(replies, Fault::None).await;
    (model, Sink::start().await.unwrap())
}

/// Starts a session of `spec` on `log`, says "go", and drives it with
/// `runner` until it answers, which must be "done".
pub async fn run_to_done(log: Arc<dyn EventLog>, runner: Runner, spec: replay::AgentSpec) {
    let mut session = Session::create(log, spec).await.unwrap();
    session
        .append(vec![replay::Event::UserMessage { text: "go".into() }], None)
        .await
        .unwrap();
    let end = runner.drive(&mut session).await.unwrap();
    assert_eq!(end, runtime::TurnEnd::Answered("done".into()));
}

/// Agent steps/s on `log` with `sessions` sessions running at once, each
/// `steps` steps (a model reply, then one side-effecting HTTP call; two
/// synced barriers), against a loopback model and sink.
pub async fn agent_steps(log: Arc<dyn EventLog>, sessions: usize, steps: usize) -> f64 {
    let (model, sink) = charging_model(steps).await;
    let runner = Runner::new(Durability::Synced);
    let started = Instant::now();
    let tasks: Vec<_> = (0..sessions)
        .map(|_| {
            let spec = bench_spec(&model.base_url(), &sink.url("charge"));
            tokio::spawn(run_to_done(log.clone(), runner.clone(), spec))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let rate = (sessions * steps) as f64 / started.elapsed().as_secs_f64();
    assert_eq!(
        sink.stats().path("charge").effects as usize,
        sessions * steps
    );
    rate
}

/// The benches' tokio runtime (multi-threaded, one worker per core), built
/// once.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Runtime::new().expect("tokio runtime starts"))
}

/// Runs `work` (a call of the async log, say) on [`runtime`] and waits for
/// it: for a bench's synchronous parts. Not within the runtime.
pub fn block<F: std::future::Future>(work: F) -> F::Output {
    runtime().block_on(work)
}

/// The `mneme` binary of cargo's `profile` ("release", "debug") for
/// benchmarks that drive the real binary: `MNEME_BIN`, else the one in the
/// target directory beside this benchmark's executable (the benchmarks'
/// package does not build the binary: `cargo build [--release] --bin
/// mneme` does). Sets `MNEME_BIN` to it, for [`crate::mneme_bin`].
pub fn built_mneme(profile: &str) -> PathBuf {
    if let Some(bin) = std::env::var_os("MNEME_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap();
    // target/PROFILE/deps/BENCH: three levels up is the target directory.
    let target = exe.ancestors().nth(3).unwrap();
    let bin = target.join(profile).join("mneme");
    let flag = if profile == "release" {
        " --release"
    } else {
        ""
    };
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build{flag} --bin mneme` first",
        bin.display()
    );
    std::env::set_var("MNEME_BIN", &bin);
    bin
}
