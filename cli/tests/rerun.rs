//! `mneme rerun` through the real binary: a recorded two-turn session
//! re-run on another model. Calls that match a recorded one are answered
//! from the record (the sink sees no second hit); a side effect with no
//! record is not run, unless `--live-tools`; a read-only call runs; the
//! report names the first request that differs, both answers, tokens,
//! cost and cache hit ratios. A crash mid-rerun resumes like any session.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::{json, Value};

/// The original's model: charge and look up; answer; email; answer.
fn original_replies() -> Vec<MockReply> {
    vec![
        MockReply::calls(&[("charge", json!({"n": 1})), ("lookup", json!({"n": 2}))]),
        MockReply::answer("Charged."),
        MockReply::calls(&[("email", json!({"n": 3}))]),
        MockReply::answer("Emailed."),
    ]
}

/// The other model: the same first reply, then its own: another answer,
/// an email with other arguments and a lookup, another answer.
fn other_replies() -> Vec<MockReply> {
    vec![
        MockReply::calls(&[("charge", json!({"n": 1})), ("lookup", json!({"n": 2}))]),
        MockReply::answer("Charged, as asked."),
        MockReply::calls(&[("email", json!({"n": 4})), ("lookup", json!({"n": 5}))]),
        MockReply::answer("Not emailed."),
    ]
}

/// A recorded session and an agent file on the other model: (world, sink,
/// the other model's server, the original's id, the other agent file).
async fn recorded() -> (World, Sink, MockModel, MockModel, String, String) {
    let bed = Testbed::new()
        .replies(original_replies())
        .sink_tools(|sink| billing_tools(sink).to_vec())
        .await;
    let other = MockModel::start(other_replies(), Fault::None).await;
    let out = bed.run_agent("one").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Charged.");
    let original = session_id(&out);
    let out = bed.run(&["run", "--session", &original, "two"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Emailed.");
    let text = (bed.agent_toml)
        .replace(&bed.model.base_url(), &other.base_url())
        .replace("test-model", "other-model");
    let Testbed {
        world, sink, model, ..
    } = bed;
    let other_agent = world.write("other.toml", &text);
    let other_agent = other_agent.to_str().unwrap().to_string();
    (world, sink, model, other, original, other_agent)
}

/// The seq of a session's third model reply.
async fn third_reply(world: &World, id: &str) -> u64 {
    let out = world.run(&["log", "--json", id]).await;
    let rows = stdout(&out);
    let replies = (rows.lines())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["kind"] == "ModelReplied");
    replies.map(|v| v["seq"].as_u64().unwrap()).nth(2).unwrap()
}

fn hits(sink: &Sink, path: &str) -> u64 {
    sink.stats().path(path).hits
}

#[tokio::test]
async fn a_rerun_answers_recorded_calls_from_the_record_and_reports_where_it_parts() {
    let (world, sink, _model, other, original, agent) = recorded().await;
    assert_eq!((hits(&sink, "charge"), hits(&sink, "email")), (1, 1));

    let out = world
        .run(&["rerun", &original, "--agent", &agent, "--json"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let rerun = session_id(&out);
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["original"]["session"], original.as_str());
    assert_eq!(report["rerun"]["session"], rerun.as_str());
    assert_eq!(report["rerun"]["model"], "other-model");
    // The charge and the first lookup were answered from the record: the
    // sink saw no second charge; the email with other arguments was not
    // run; the second lookup (read-only) ran.
    assert_eq!((hits(&sink, "charge"), hits(&sink, "email")), (1, 1));
    let calls = &report["calls"];
    assert_eq!(calls["answered_from_record"], 2, "{report}");
    assert_eq!(calls["run_live"], 1, "{report}");
    assert_eq!(calls["not_run"], 1, "{report}");
    assert_eq!(report["live_tools"], false);
    assert_eq!(report["stopped"], Value::Null);
    // Requests 1 and 2 carry the same messages (the recorded results);
    // the third carries the other model's different answer.
    let first = &report["first_difference"];
    assert_eq!(first["request"], 3, "{report}");
    assert!(first["original_bytes"]
        .as_str()
        .unwrap()
        .contains("Charged."));
    assert!(first["rerun_bytes"]
        .as_str()
        .unwrap()
        .contains("Charged, as asked."));
    assert_eq!(first["original_seq"], third_reply(&world, &original).await);
    assert_eq!(first["rerun_seq"], third_reply(&world, &rerun).await);
    // Answers side by side.
    let turns = report["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[0]["message"], "one");
    assert_eq!(turns[0]["original"], "Charged.");
    assert_eq!(turns[0]["rerun"], "Charged, as asked.");
    assert_eq!(turns[1]["original"], "Emailed.");
    assert_eq!(turns[1]["rerun"], "Not emailed.");
    // Tokens, cost and cache hit ratios, as each session's log sums them.
    for side in ["original", "rerun"] {
        let s = &report[side];
        assert_eq!(s["requests"], 4, "{s}");
        let (prompt, cached) = (
            s["prompt_tokens"].as_f64().unwrap(),
            s["cached_tokens"].as_f64().unwrap(),
        );
        assert!(prompt > 0.0 && s["completion_tokens"] == 20, "{s}");
        let ratio = s["cache_hit_ratio"].as_f64().unwrap();
        assert!((ratio - cached / prompt).abs() < 1e-9 && ratio > 0.0, "{s}");
        assert!(s["cost"].is_number(), "{s}");
    }
    // The other model was told the email was not run, and why.
    let last: Value = serde_json::from_slice(other.bodies().last().unwrap()).unwrap();
    assert!(
        last.to_string().contains("not run: this is a rerun"),
        "{last}"
    );
    // The log says which calls were answered from the record, and links
    // the rerun to its original.
    let log = stdout(&world.run(&["log", &rerun]).await);
    assert!(log.contains(&format!("rerun of {original}")), "{log}");
    assert_eq!(log.matches("answered from the record").count(), 2, "{log}");
    assert!(log.contains("not run in a rerun"), "{log}");
    let text = world.run(&["rerun", &original, "--agent", &agent]).await;
    assert!(text.status.success(), "{}", stderr(&text));
    let text = stdout(&text);
    for needle in [
        "first request that differs: request 3",
        "turn 2 (differs): \"two\"",
        "cache hit ratio",
        "calls: 2 answered from the record, 1 run live, 1 not run",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    assert_eq!((hits(&sink, "charge"), hits(&sink, "email")), (1, 1));
}

#[tokio::test]
async fn with_live_tools_a_side_effect_no_record_answers_runs() {
    let (world, sink, _model, _other, original, agent) = recorded().await;
    let out = world
        .run(&[
            "rerun",
            &original,
            "--agent",
            &agent,
            "--live-tools",
            "--json",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["live_tools"], true);
    let calls = &report["calls"];
    assert_eq!(
        (
            &calls["answered_from_record"],
            &calls["run_live"],
            &calls["not_run"]
        ),
        (&json!(2), &json!(2), &json!(0)),
        "{report}"
    );
    // The recorded charge still never runs again; the new email does.
    assert_eq!((hits(&sink, "charge"), hits(&sink, "email")), (1, 2));
    assert_eq!(sink.bodies("email").last().unwrap(), &json!({"n": 4}));
}

#[tokio::test]
async fn a_rerun_killed_mid_turn_resumes_like_any_session() {
    let (world, sink, _model, _other, original, agent) = recorded().await;
    // The first tool a rerun starts is the second lookup, in turn 2.
    let out = world
        .run_crashing(
            &["rerun", &original, "--agent", &agent],
            "tool_started_durable",
        )
        .await;
    assert!(!out.status.success());
    let rerun = session_id(&out);
    let out = world.run(&["resume", &rerun]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Not emailed.");
    assert_eq!((hits(&sink, "charge"), hits(&sink, "email")), (1, 1));
    let log = stdout(&world.run(&["log", &rerun]).await);
    assert!(log.contains("not run in a rerun"), "{log}");
}

#[tokio::test]
async fn bad_input_is_refused_by_name() {
    let (world, _sink, _model, _other, original, agent) = recorded().await;
    let unknown = "0190a0a0-0000-7000-8000-000000000000";
    let out = world.run(&["rerun", unknown, "--agent", &agent]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains(unknown), "{}", stderr(&out));

    let missing = world.data().join("nowhere.toml");
    let missing = missing.to_str().unwrap();
    let out = world.run(&["rerun", &original, "--agent", missing]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("nowhere.toml"), "{}", stderr(&out));

    let bad = world.write("bad.toml", "name = \"x\"\n[model]\nprovider = ");
    let out = world
        .run(&["rerun", &original, "--agent", bad.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("bad.toml"), "{}", stderr(&out));
    // Nothing was started for any of them.
    let listed = stdout(&world.run(&["sessions", "--json"]).await);
    assert_eq!(listed.lines().count(), 1, "{listed}");
}

#[tokio::test]
async fn beside_a_daemon_the_rerun_runs_in_it_and_reports_the_same() {
    let (world, sink, _model, _other, original, agent) = recorded().await;
    let daemon = mneme_e2e::daemon::DaemonProcess::start(&world.data(), &[]).await;
    // The data directory is the daemon's: the command goes through its API.
    let out = world
        .mneme()
        .args(["rerun", &original, "--agent", &agent, "--json"])
        .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let rerun = session_id(&out);
    assert_eq!(report["rerun"]["session"], rerun.as_str());
    assert_eq!(report["first_difference"]["request"], 3, "{report}");
    assert_eq!(report["calls"]["answered_from_record"], 2, "{report}");
    assert_eq!(report["calls"]["not_run"], 1, "{report}");
    assert_eq!(report["turns"][1]["rerun"], "Not emailed.");
    assert_eq!((hits(&sink, "charge"), hits(&sink, "email")), (1, 1));
    // Its first event links it to the original (what the web view shows).
    let (status, events) = daemon.get(&format!("/sessions/{rerun}/events")).await;
    assert_eq!(status, 200);
    let link = &events[0]["event"]["SessionForked"];
    assert_eq!(link["parent"], original.as_str(), "{link}");
    assert_eq!(link["rerun"]["live_tools"], false, "{link}");
    assert_eq!(events[0]["schema"], 3);
    // An unknown session: 404, by name.
    let unknown = "0190a0a0-0000-7000-8000-000000000000";
    let spec = json!({"name": "x", "model": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}});
    let (status, body) = daemon
        .post(
            &format!("/sessions/{unknown}/rerun"),
            &json!({"spec": spec}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].as_str().unwrap().contains(unknown), "{body}");
    daemon.terminate().await;
}
