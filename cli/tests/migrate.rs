//! `mneme export` and `mneme import` through the real binary: the way from
//! sled to PostgreSQL. The imported log verifies, rebuilds the same prompt
//! byte for byte, exports identically, and goes on running there.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::{json, Value};

async fn run_ok(world: &World, args: &[&str]) -> std::process::Output {
    let out = world.run(args).await;
    assert!(out.status.success(), "mneme {args:?}: {}", stderr(&out));
    out
}

/// `mneme --store STORE ARGS`.
async fn on_store(world: &World, store: &str, args: &[&str]) -> std::process::Output {
    let all: Vec<&str> = ["--store", store].iter().chain(args).copied().collect();
    world.run(&all).await
}

async fn on_store_ok(world: &World, store: &str, args: &[&str]) -> std::process::Output {
    let out = on_store(world, store, args).await;
    assert!(out.status.success(), "mneme {args:?}: {}", stderr(&out));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_log_exported_and_imported_into_postgres_verifies_and_runs_on() {
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("charge", json!({"n": 1})), ("lookup", json!({"n": 2}))]),
            MockReply::answer("Charged."),
            MockReply::answer("Still here."),
        ])
        .sink_tools(|sink| billing_tools(sink).to_vec())
        .await;
    let (world, sink) = (&bed.world, &bed.sink);
    let out = run_ok(world, &["run", "--agent", bed.agent_arg(), "charge"]).await;
    let id = session_id(&out);
    let dump = world.dir.path().join("dump.jsonl");
    run_ok(world, &["export", "-o", dump.to_str().unwrap()]).await;
    let sled_export = std::fs::read_to_string(&dump).unwrap();
    let sled_prompt = run_ok(world, &["replay", &id, "--raw"]).await.stdout;

    let pg = pg_store();
    let dump_path = dump.to_str().unwrap();
    let imported = on_store_ok(world, &pg, &["import", dump_path]).await;
    let records = sled_export.lines().count();
    assert!(
        stderr(&imported).contains(&format!(
            "imported {records} records into 1 sessions (0 already held)"
        )),
        "{}",
        stderr(&imported)
    );
    let verified = on_store_ok(world, &pg, &["verify", "--json"]).await;
    let verdict: Value = serde_json::from_slice(&verified.stdout).unwrap();
    assert_eq!(verdict["ok"], true, "{verdict}");
    let pg_prompt = on_store_ok(world, &pg, &["replay", &id, "--raw"]).await;
    assert_eq!(pg_prompt.stdout, sled_prompt);
    let pg_export = on_store_ok(world, &pg, &["export"]).await;
    assert_eq!(stdout(&pg_export), sled_export);

    // Importing the same dump again adds nothing: every record is held.
    let again = on_store_ok(world, &pg, &["import", dump_path]).await;
    let expected = format!("imported 0 records into 1 sessions ({records} already held)");
    assert!(stderr(&again).contains(&expected), "{}", stderr(&again));

    // The session goes on on PostgreSQL, its earlier effect not repeated.
    let answer = on_store_ok(world, &pg, &["run", "--session", &id, "still there?"]).await;
    assert_eq!(stdout(&answer).trim(), "Still here.");
    assert_eq!(sink.stats().path("charge").effects, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_dump_is_refused_at_its_line_and_what_preceded_it_verifies() {
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("hello")])
        .await;
    let world = &bed.world;
    run_ok(world, &["run", "--agent", bed.agent_arg(), "hi"]).await;
    let text = stdout(&run_ok(world, &["export"]).await);
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    assert!(lines.len() >= 3, "{text}");
    // Flip one hex digit of the third record's sealed bytes.
    let mut line: Value = serde_json::from_str(&lines[2]).unwrap();
    let sealed = line["sealed"].as_str().unwrap().to_string();
    let at = sealed.len() / 2;
    let flipped = if &sealed[at..at + 1] == "0" { "1" } else { "0" };
    line["sealed"] = json!(format!("{}{flipped}{}", &sealed[..at], &sealed[at + 1..]));
    lines[2] = line.to_string();
    let dump = world.write("altered.jsonl", &(lines.join("\n") + "\n"));

    let store = pg_store();
    let out = on_store(world, &store, &["import", dump.to_str().unwrap()]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("line 3"), "{}", stderr(&out));
    let listed = on_store_ok(world, &store, &["verify", "--json"]).await;
    let verdict: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(
        (&verdict["ok"], &verdict["events"]),
        (&json!(true), &json!(2)),
        "the two records before the bad line are stored and verify: {verdict}"
    );
}
