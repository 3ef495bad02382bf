//! `mneme fork` and `mneme diff` through the real binary: a session forked
//! at an event runs on with another message, and the diff shows the common
//! history, where each side parts and what differs.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::Value;

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
