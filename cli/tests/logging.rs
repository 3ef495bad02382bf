//! Log events on stderr: human lines by default, JSON objects on request.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::*;
use serde_json::Value;

async fn daemon_output(world: &World, extra: &[&str]) -> (String, String) {
    let data = world.dir.path().join(format!("data{}", extra.len()));
    let log = world.dir.path().join(format!("stderr{}", extra.len()));
    let command = DaemonProcess::command(&data, extra);
    let daemon = DaemonProcess::launch_logged(command, &data, &log).await;
    let addr = daemon.base.clone();
    (addr, daemon.terminate_with_output().await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_logs_human_lines_by_default_and_json_on_request() {
    let world = World::new();
    let (base, human) = daemon_output(&world, &[]).await;
    assert!(
        human
            .lines()
            .any(|l| l == format!("mneme serve: listening on {base}")),
        "{human}"
    );
    assert!(
        human.lines().any(|l| l == "mneme serve: shutting down"),
        "{human}"
    );

    let (base, json) = daemon_output(&world, &["--log-format", "json"]).await;
    let events: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let listening = events
        .iter()
        .find(|e| e["message"] == format!("mneme serve: listening on {base}"))
        .unwrap_or_else(|| panic!("{json}"));
    assert_eq!(listening["level"], "INFO");
    assert_eq!(listening["target"], "mneme");
    assert!(listening["timestamp"].as_str().unwrap().ends_with('Z'));
    assert!(events
        .iter()
        .any(|e| e["message"] == "mneme serve: shutting down"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_log_format_is_refused_naming_the_choices() {
    let world = World::new();
    let out = world.run(&["--log-format", "xml", "sessions"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("expected human or json"),
        "{}",
        stderr(&out)
    );
}
