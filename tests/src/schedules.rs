//! Helpers for the tests of schedules: adding and removing one through the
//! CLI, reading its log, and a daemon armed to die right after a firing.

use crate::daemon::{DaemonProcess, TOKEN};
use crate::{eventually, log_lines, stderr, stdout, Testbed, World};
use serde_json::Value;
use std::time::Duration;

/// Runs `mneme ARGS` on `world`, as a client of its daemon if one runs.
pub async fn client(world: &World, args: &[&str]) -> std::process::Output {
    let mut command = world.mneme();
    command.args(args).env("MNEME_TOKEN", TOKEN);
    command.output().await.unwrap()
}

/// `mneme schedule add --agent AGENT ARGS.. MESSAGE`; the schedule's id.
pub async fn add(bed: &Testbed, args: &[&str]) -> String {
    let mut all = vec!["schedule", "add", "--agent", bed.agent_arg()];
    all.extend_from_slice(args);
    all.push("tick");
    let out = client(&bed.world, &all).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stdout(&out);
    let id = line.trim().strip_prefix("schedule ").expect("schedule ID");
    id.to_string()
}

/// The records of a schedule or session, as `mneme log --json` lists them
/// (through the daemon, if one runs): (kind, event).
pub async fn schedule_log(world: &World, id: &str) -> Vec<(String, Value)> {
    let out = client(world, &["log", "--json", id]).await;
    (log_lines(&out).into_iter())
        .map(|(_, kind, event)| (kind, event))
        .collect()
}

/// The kinds of `id`'s records.
pub async fn kinds_of(world: &World, id: &str) -> Vec<String> {
    let log = schedule_log(world, id).await;
    log.into_iter().map(|(kind, _)| kind).collect()
}

/// The ticks the schedule's log records as fired, and the sessions they
/// started, in order.
pub fn firings(log: &[(String, Value)]) -> Vec<(i64, String)> {
    (log.iter())
        .filter(|(kind, _)| kind == "ScheduleFired")
        .map(|(_, e)| {
            let tick = e["tick_ms"].as_i64().unwrap();
            (tick, e["session"].as_str().unwrap().to_string())
        })
        .collect()
}

/// The skips the log records: (reason, ticks).
pub fn skips(log: &[(String, Value)]) -> Vec<(String, u64)> {
    (log.iter())
        .filter(|(kind, _)| kind == "ScheduleSkipped")
        .map(|(_, e)| {
            let reason = e["reason"].as_str().unwrap().to_string();
            (reason, e["ticks"].as_u64().unwrap())
        })
        .collect()
}

/// The schedule's row in `mneme schedule list --json`.
pub async fn listed(world: &World, id: &str) -> Value {
    let out = client(world, &["schedule", "list", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    (stdout(&out).lines())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["schedule"] == id)
        .unwrap_or_else(|| panic!("{id} is not listed: {}", stdout(&out)))
}

/// Waits (up to 30 s) until `daemon` shows `session` idle (its turn
/// answered); its view then.
pub async fn until_idle(daemon: &DaemonProcess, session: &str) -> Value {
    let what = format!("session {session} to answer");
    eventually(what, Duration::from_secs(30), || async {
        let (_, view) = daemon.get(&format!("/sessions/{session}")).await;
        (view["status"] == "idle").then_some(view)
    })
    .await
}

/// Removes schedule `id` through the CLI.
pub async fn remove(world: &World, id: &str) {
    let out = client(world, &["schedule", "remove", id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Asserts that every tick of `ticks` is `period_ms` after the one before.
pub fn consecutive(ticks: &[i64], period_ms: i64) {
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            period_ms,
            "no tick twice, none lost: {ticks:?}"
        );
    }
}

/// A daemon on `world` that dies right after its first firing's append.
pub async fn armed_daemon(world: &World) -> DaemonProcess {
    armed_daemon_at(world, 1).await
}

/// A daemon on `world` (its store, sled or PostgreSQL) that dies right
/// after its `n`-th firing's append.
pub async fn armed_daemon_at(world: &World, n: u32) -> DaemonProcess {
    let mut armed = DaemonProcess::command(&world.data(), &store_args(world));
    armed.env("MNEME_CRASH_AT", format!("schedule_fired:{n}"));
    DaemonProcess::launch(armed, &world.data()).await
}

/// `--store STORE` for a daemon on `world`'s store, if it is not the
/// data directory.
pub fn store_args(world: &World) -> Vec<&str> {
    match &world.store {
        Some(store) => vec!["--store", store],
        None => vec![],
    }
}

/// Waits (up to 20 s) for `daemon` to die at its crash point.
pub async fn died_at_the_crash_point(daemon: &mut DaemonProcess) {
    let exited = tokio::time::timeout(Duration::from_secs(20), daemon.child.wait())
        .await
        .expect("the daemon dies at the crash point")
        .unwrap();
    assert!(!exited.success());
}
