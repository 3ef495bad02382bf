//! Bad input of every kind gets a clear error naming what and where, a
//! non-zero exit, and never a lost or rewritten event.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_agent_file_is_named_and_nothing_is_written() {
    let world = World::new();
    let agent = world.write(
        "agent.toml",
        "name = \"x\"\n[model]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n[[tools]]\nname = \"t\"\nkind = \"http\"\nurl = \"http://127.0.0.1:9/t\"\neffect = \"sometimes\"\n",
    );
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "hi"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("agent.toml") && err.contains("sometimes") && err.contains("line"),
        "{err}"
    );
    // Our own message keeps its lines: the file's line, a caret under it.
    assert!(!err.contains("\\n"), "newlines are not escaped: {err}");
    assert!(
        err.lines().any(|l| l.contains("effect = \"sometimes\"")),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.trim_start().starts_with("|") && l.contains('^')),
        "{err}"
    );
    assert_eq!(stdout(&world.run(&["sessions", "--json"]).await), "");
    let missing = world
        .run(&["run", "--agent", "/nonexistent/agent.toml", "hi"])
        .await;
    assert!(
        stderr(&missing).contains("/nonexistent/agent.toml"),
        "{}",
        stderr(&missing)
    );
}

/// A run of an agent whose model misbehaves with `fault`: the testbed and
/// the run's output.
async fn run_against(fault: Fault) -> (Testbed, std::process::Output) {
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("fine")])
        .fault(fault)
        .await;
    let out = bed.run_agent("hello").await;
    (bed, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_server_errors_are_retried_then_reported_and_logged() {
    let (bed, out) = run_against(Fault::Fail500(2)).await;
    assert!(
        out.status.success(),
        "two 500s are retried: {}",
        stderr(&out)
    );
    assert_eq!(bed.model.bodies().len(), 3);

    let (bed, out) = run_against(Fault::Fail500(100)).await;
    let world = &bed.world;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("/v1/chat/completions") && err.contains("500") && err.contains("4 attempts"),
        "{err}"
    );
    let session = session_id(&out);
    assert_eq!(
        event_kinds(world, &session).await,
        ["SessionStarted", "UserMessage", "SessionFinished"]
    );
    assert!(world.run(&["verify"]).await.status.success());
    let sessions = stdout(&world.run(&["sessions", "--json"]).await);
    assert!(sessions.contains("\"status\":\"failed\""), "{sessions}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_the_model_is_a_clear_error() {
    let (bed, out) = run_against(Fault::Garbage).await;
    let world = &bed.world;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("garbage") && err.contains("<html>this is not json"),
        "{err}"
    );
    assert!(world.run(&["verify"]).await.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_model_server_is_named() {
    let world = World::new();
    let agent = world.write("agent.toml", &agent_toml("http://127.0.0.1:1/v1", &[]));
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "hello"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("127.0.0.1:1"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_tools_time_out_read_only_as_error_side_effect_in_doubt() {
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("slow_read", json!({})), ("slow_write", json!({}))]),
            MockReply::answer("gave up"),
        ])
        .tools([
            command_tool("slow_read", &["sleep", "30"], "read_only", 1),
            command_tool("slow_write", &["sleep", "30"], "side_effect", 1),
        ])
        .await;
    let world = &bed.world;
    let started = Instant::now();
    let out = bed.run_agent("go").await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "timeouts must fire"
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let session = session_id(&out);
    let log = stdout(&world.run(&["log", &session]).await);
    // The read-only call is retried with its key, then the model is told.
    assert!(
        log.contains("call_0_0 error")
            && log.contains("timed out after 1 s; gave up after 3 attempts"),
        "{log}"
    );
    assert_eq!(
        log.matches("slow_read(call_0_0) read_only attempt").count(),
        3,
        "{log}"
    );
    assert!(
        log.contains("ToolInDoubt") && log.contains("call_0_1"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_is_told_who_holds_the_data_directory() {
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("hold", json!({}))]),
            MockReply::answer("ok"),
        ])
        .sink_tools(|sink| vec![http_tool("hold", &sink.url("hold"), "idempotent")])
        .await;
    let hold = bed.sink.hold("hold");
    let first = (bed.world)
        .spawn_until_applied(&["run", "--agent", bed.agent_arg(), "go"], hold.applied)
        .await;
    // A second writer is refused, told who holds the directory and what
    // to do (reads go through the holder: see front_door.rs).
    let out = bed.run_agent("again").await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("in use by another process")
            && err.contains(&format!("pid {}", first.id().unwrap()))
            && err.contains("mneme serve"),
        "{err}"
    );
    hold.release.send(()).unwrap();
    assert!(first.wait_with_output().await.unwrap().status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_resolve_arguments_change_nothing() {
    let bed = Testbed::new().replies(vec![MockReply::answer("ok")]).await;
    let world = &bed.world;
    let out = bed.run_agent("go").await;
    let session = session_id(&out);
    let before = event_kinds(world, &session).await;
    let out = world
        .run(&[
            "resolve",
            &session,
            "call_0_0",
            "--skip",
            "--result",
            "{not json",
        ])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let out = world
        .run(&["resolve", &session, "call_0_0", "--retry"])
        .await;
    assert!(stderr(&out).contains("not in doubt"), "{}", stderr(&out));
    assert_eq!(event_kinds(world, &session).await, before);
}

/// Commands naming a session the store does not hold are refused by name,
/// and leave no lease behind (a lapsed one would be listed, and looked at
/// by every daemon, forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_session_on_postgres_is_named_and_leaves_no_lease() {
    let world = World::on_postgres();
    let unknown = uuid::Uuid::now_v7().to_string();
    for args in [
        vec!["resume", &unknown],
        vec!["run", "--session", &unknown, "hi"],
        vec!["approve", &unknown, "call_0_0"],
        vec!["resolve", &unknown, "call_0_0", "--retry"],
        vec!["export", &unknown],
    ] {
        let out = world.run(&args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("no session {unknown} in the store postgres://")),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    let store = world.store.clone().unwrap();
    let log = pglog::PgLog::connect(&store).await.unwrap();
    let leftover = eventlog::EventLog::leases(&log)
        .expired_leases()
        .await
        .unwrap();
    assert!(leftover.is_empty(), "{leftover:?}");
}

/// Numbers no model server can take, and a file no agent file is: refused
/// at load, naming the file and the field or the bound, before any session
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_numbers_and_oversized_agent_files_are_refused_at_load() {
    let world = World::new();
    let model = agent_toml("http://127.0.0.1:9/v1", &[]); // ends in [model]
    let padding = format!("# {}\n", "x".repeat(1 << 20));
    for (extra, named) in [
        ("temperature = nan\n", "temperature = NaN"),
        ("temperature = -0.5\n", "temperature = -0.5"),
        ("input_cost_per_mtok = -1.0\n", "input_cost_per_mtok = -1"),
        ("output_cost_per_mtok = inf\n", "output_cost_per_mtok = inf"),
        (padding.as_str(), "larger than 1048576 bytes"),
    ] {
        let agent = world.write("agent.toml", &format!("{model}{extra}"));
        let out = world
            .run(&["run", "--agent", agent.to_str().unwrap(), "hi"])
            .await;
        assert_eq!(out.status.code(), Some(1), "{named}: {}", stderr(&out));
        let error = stderr(&out);
        assert!(
            error.contains("agent.toml") && error.contains(named),
            "{named}: {error}"
        );
    }
    assert_eq!(stdout(&world.run(&["sessions", "--json"]).await), "");
}

/// A program given as a path is the one beside the agent file, wherever
/// mneme starts (not whatever the working directory holds under that
/// name); a spec posted whole has no file to be beside, and is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_program_is_the_one_beside_its_agent_file() {
    use std::os::unix::fs::PermissionsExt;
    let mut bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("hello", json!({}))]),
            MockReply::answer("done"),
        ])
        .tools([command_tool("hello", &["./hello.sh"], "read_only", 10)])
        .await;
    let elsewhere = tempfile::tempdir().unwrap();
    let says =
        |place: &str| format!("#!/bin/sh\ncat >/dev/null\necho '{{\"from\":\"{place}\"}}'\n");
    for (dir, place) in [(bed.world.dir.path(), "beside"), (elsewhere.path(), "cwd")] {
        let script = dir.join("hello.sh");
        std::fs::write(&script, says(place)).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = (bed.world.mneme())
        .current_dir(elsewhere.path())
        .args(["run", "--agent", bed.agent_arg(), "hi"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let asked = String::from_utf8_lossy(&bed.model.bodies()[1]).to_string();
    assert!(
        asked.contains("beside") && !asked.contains("cwd"),
        "{asked}"
    );

    let daemon = bed.start_daemon(&[]).await;
    let posted = (daemon.http.post(daemon.url("/sessions")))
        .header("content-type", "application/toml")
        .body(bed.agent_toml.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 400);
    let error = posted.text().await.unwrap();
    assert!(
        error.contains(r#"\"./hello.sh\" is a relative path"#),
        "{error}"
    );
}
