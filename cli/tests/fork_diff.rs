//! `mneme fork` and `mneme diff` through the real binary: a session forked
//! at an event runs on with another message, and the diff shows the common
//! history, where each side parts and what differs.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::{json, Value};

#[tokio::test]
async fn a_fork_runs_on_from_its_seq_and_the_diff_shows_where_it_parted() {
    let bed = Testbed::new()
        .replies(vec![
            MockReply::answer("First answer."),
            MockReply::answer("Second answer."),
        ])
        .await;
    let (world, model) = (&bed.world, &bed.model);
    let out = bed.run_agent("one").await;
    assert!(out.status.success(), "{}", stderr(&out));
    let parent = named_session(&out).unwrap();
    let out = world.run(&["run", "--session", &parent, "two"]).await;
    assert!(out.status.success(), "{}", stderr(&out));

    // Fork after the first answer (seq 3), and send another message.
    let out = world.run(&["fork", &parent, "--at", "3"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let child = stdout(&out).trim().to_string();
    let out = world.run(&["run", "--session", &child, "three"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Second answer.");

    let out = world.run(&["diff", &parent, &child, "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let diff: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(diff["common_events"], 3, "{diff}");
    assert_eq!(diff["a"]["diverges_at_seq"], 4);
    assert_eq!(
        diff["b"]["diverges_at_seq"], 5,
        "after the fork's own first event"
    );
    assert_eq!(diff["a"]["after"][0]["summary"], "\"two\"");
    assert_eq!(diff["b"]["after"][0]["summary"], "\"three\"");
    assert_eq!(diff["a"]["answer"], diff["b"]["answer"]);
    let text = stdout(&world.run(&["diff", &parent, &child]).await);
    assert!(
        text.contains("hold the same first 3 events") && text.contains("answer (same)"),
        "{text}"
    );

    // A branch on another model: recorded, and its requests name it.
    let other = bed.agent_toml.replace("test-model", "other-model");
    let other = world.write("other.toml", &other);
    let out = world
        .run(&[
            "fork",
            &parent,
            "--at",
            "3",
            "--agent",
            other.to_str().unwrap(),
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let branch = stdout(&out).trim().to_string();
    let out = world.run(&["run", "--session", &branch, "four"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let last: Value = serde_json::from_slice(model.bodies().last().unwrap()).unwrap();
    assert_eq!(last["model"], "other-model");
    let kinds = stdout(&world.run(&["log", "--json", &branch]).await);
    assert!(kinds.contains("\"SpecChanged\""), "{kinds}");
    let diff = stdout(&world.run(&["diff", &child, &branch, "--json"]).await);
    let diff: Value = serde_json::from_str(diff.trim()).unwrap();
    assert_eq!(diff["common_events"], 3, "{diff}");
    assert_eq!(diff["b"]["after"][0]["kind"], "SpecChanged");

    // A fork needs an event to fork after, inside the session.
    for at in ["0", "99"] {
        let out = world.run(&["fork", &parent, "--at", at]).await;
        assert_eq!(out.status.code(), Some(1), "{at}: {}", stdout(&out));
        assert!(
            stderr(&out).contains(&format!("cannot fork at seq {at}")),
            "{}",
            stderr(&out)
        );
    }
}

/// Bytes of every file under `dir`.
fn bytes_under(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// Text that does not compress: `n` bytes of a hex stream.
fn incompressible(n: usize, seed: u64) -> String {
    let mut state = seed | 1;
    let mut text = String::with_capacity(n);
    while text.len() < n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push_str(&format!("{state:016x}"));
    }
    text.truncate(n);
    text
}

/// A fork shares its parent's records instead of copying them: twenty
/// forks of a session holding 1.5 MB cost the data directory little more
/// than sled's rewrite of the pages their first events land in (copies
/// cost 30 MB); each reads its parent's history as its own, verifies,
/// and runs on by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_share_their_parents_records_and_store_only_their_own() {
    let replies = (0..20)
        .map(|i| MockReply::answer(&format!("ok {i}")))
        .collect();
    let mut bed = Testbed::new().replies(replies).daemon().await;
    let parent = bed.create().await;
    let daemon = bed.take_daemon();
    for i in 0..6 {
        let (status, end) = daemon
            .message_and_wait(&parent, &incompressible(256 << 10, i + 1))
            .await;
        assert_eq!(status, 200, "{end}");
    }
    let (_, view) = daemon.get(&format!("/sessions/{parent}")).await;
    let at = view["events"].as_u64().unwrap();
    let before = bytes_under(&bed.world.data());
    let mut forks = Vec::new();
    for _ in 0..20 {
        let (status, forked) = daemon
            .post(&format!("/sessions/{parent}/fork"), &json!({ "at": at }))
            .await;
        assert_eq!(status, 201, "{forked}");
        forks.push(forked["session"].as_str().unwrap().to_string());
    }
    let grown = bytes_under(&bed.world.data()).saturating_sub(before);
    assert!(
        grown < 5 << 20,
        "twenty forks of a 1.5 MB session took {grown} bytes"
    );
    for fork in &forks {
        let (_, view) = daemon.get(&format!("/sessions/{fork}")).await;
        assert_eq!(view["events"], at + 1, "{view}");
        let (_, verified) = daemon.get(&format!("/sessions/{fork}/verify")).await;
        assert_eq!(verified["ok"], true, "{verified}");
    }
    let (status, end) = daemon.message_and_wait(&forks[0], "and now?").await;
    assert_eq!(status, 200, "{end}");
    let (_, parent_view) = daemon.get(&format!("/sessions/{parent}")).await;
    assert_eq!(parent_view["events"], at, "the parent goes on by itself");
    let (_, records) = daemon
        .get(&format!("/sessions/{}/events?after={}", forks[0], at - 2))
        .await;
    let seqs: Vec<u64> = (records.as_array().unwrap().iter())
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs[..3], [at - 1, at, at + 1], "{records}");
}
