//! A session's first record and its first message are one append: a
//! `mneme run --agent` killed as it starts leaves no session, or one that
//! holds its message (and resumes to its answer), never a session with
//! only its start. Through the daemon, `first_message` does the same.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::scenario::log_events;
use mneme_e2e::*;
use serde_json::{json, Value};

/// Kills `mneme run --agent` at `point` and checks what the store holds.
async fn killed_as_it_starts(world: World, point: &str) {
    let bed = Testbed::new()
        .in_world(world)
        .replies(vec![MockReply::answer("Hello.")])
        .await;
    let world = &bed.world;
    let out = world
        .run_crashing(&["run", "--agent", bed.agent_arg(), "hi"], point)
        .await;
    assert_eq!(
        out.status.code(),
        None,
        "killed at {point}: {}",
        stderr(&out)
    );
    let listed = world.run(&["sessions", "--json"]).await;
    let rows: Vec<Value> = stdout(&listed)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(rows.len() <= 1, "{rows:?}");
    for row in rows {
        let id = row["session"].as_str().unwrap();
        let kinds: Vec<Value> = (log_events(world, id).await.iter())
            .map(|e| e["kind"].clone())
            .collect();
        assert_eq!(kinds, ["SessionStarted", "UserMessage"], "{point}");
        let out = world.run(&["resume", id]).await;
        assert_eq!(stdout(&out).trim(), "Hello.", "{}", stderr(&out));
    }
}

#[tokio::test]
async fn a_run_killed_as_it_starts_leaves_its_message_or_nothing() {
    // The first of them is the session's first write: with a start and a
    // message in two appends, it held the start alone.
    for point in [
        "log_wal_written",
        "user_message_appended",
        "user_message_durable",
    ] {
        killed_as_it_starts(World::new(), point).await;
    }
}

#[tokio::test]
async fn a_run_killed_as_it_starts_on_postgres_leaves_its_message_or_nothing() {
    for point in ["user_message_appended", "user_message_durable"] {
        killed_as_it_starts(World::on_postgres(), point).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_starts_a_session_with_its_first_message() {
    let mut bed = Testbed::new()
        .replies(vec![MockReply::answer("Hello.")])
        .daemon()
        .await;
    let daemon = bed.take_daemon();
    let spec: Value = toml::from_str(&bed.agent_toml).unwrap();
    let (status, created) = daemon
        .post("/sessions", &json!({"spec": spec, "first_message": "hi"}))
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["session"].as_str().unwrap();
    let (_, records) = daemon.get(&format!("/sessions/{id}/events")).await;
    let kinds: Vec<&Value> = records
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["kind"])
        .collect();
    assert_eq!(kinds, ["SessionStarted", "UserMessage"]);
    assert_eq!(records[1]["prev_hash"], records[0]["hash"]);
    let (_, end) = daemon
        .post(&format!("/sessions/{id}/resume"), &json!({"wait": true}))
        .await;
    assert_eq!(end["answer"], "Hello.", "{end}");
    assert!(daemon.terminate().await.success());
}
