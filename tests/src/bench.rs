//! Helpers shared by the benchmarks.

use std::path::{Path, PathBuf};

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

/// An agent whose one tool, `charge`, is a side-effecting HTTP call.
pub fn bench_spec(model_url: &str, tool_url: &str) -> replay::AgentSpec {
    let text = format!(
        "name = \"bench\"\nsystem = \"You are a benchmark.\"\n[model]\nprovider = \"openai\"\nbase_url = \"{model_url}\"\nmodel = \"m\"\n\
         [[tools]]\nname = \"charge\"\nkind = \"http\"\nurl = \"{tool_url}\"\neffect = \"side_effect\"\n"
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
