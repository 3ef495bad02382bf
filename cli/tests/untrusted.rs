//! The model server and the tools are untrusted input: what they send can be
//! huge, endless, hostile or full of escape sequences, and none of it may
//! steer mneme, break a session, exhaust the host or leak a secret. Each
//! test feeds the real binary the bad thing, the way it was found.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::hostile::{
    calls_of, completion, peak_rss, run_measured, Answer, HostileModel, RSS_BOUND,
};
use mneme_e2e::*;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The id a message's session was asked under: the request's cache key.
fn cache_key(request: &Value) -> String {
    request["prompt_cache_key"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The user messages of a request, joined.
fn user_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether the request already carries a tool result.
fn has_tool_result(request: &Value) -> bool {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["role"] == "tool")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_chosen_call_id_cannot_decide_another_sessions_call() {
    let sink = Sink::start().await.unwrap();
    let world = World::new();
    // The victim's call is named call_0; the attacker's reply names its own
    // call after a path to the victim's approval (it learns the victim's id
    // from the prefix-cache key every request carries).
    let victim: Arc<Mutex<String>> = Arc::default();
    let seen = victim.clone();
    let model = HostileModel::start(move |_, request, _| {
        if user_text(request).contains("victim") {
            *seen.lock().unwrap() = cache_key(request);
            return Answer::Json(completion(None, &[("call_0", "charge", json!({"n": 1}))]));
        }
        let path = format!(
            "../../../sessions/{}/calls/call_0/approve?",
            seen.lock().unwrap()
        );
        Answer::Json(completion(None, &[(&path, "charge", json!({"n": 2}))]))
    })
    .await;
    let charge =
        http_tool("charge", &sink.url("charge"), "side_effect") + "requires_approval = true\n";
    let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[charge]));
    let agent = agent.to_str().unwrap();
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let run = |message: &'static str| {
        let mut command = world.mneme();
        command
            .args(["run", "--agent", agent, message])
            .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN);
        async move { command.output().await.unwrap() }
    };
    let out = run("victim").await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let victim_id = session_id(&out);
    let out = run("attacker").await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let attacker_id = session_id(&out);
    let printed = stderr(&out);
    assert!(
        printed.contains(&format!(
            "mneme approve {attacker_id} call_0 [--deny | --edit-args JSON]"
        )),
        "the printed command names a normalised id: {printed}"
    );
    assert!(!printed.contains("../"), "{printed}");
    // Run as the attacker hoped, the command is refused for the attacker's
    // session and the victim's call still waits.
    let hostile = format!("../../../sessions/{victim_id}/calls/call_0/approve?");
    let out = world
        .mneme()
        .args(["approve", &attacker_id, &hostile])
        .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("does not wait for approval"),
        "{}",
        stderr(&out)
    );
    let (_, victim) = daemon.get(&format!("/sessions/{victim_id}")).await;
    assert_eq!(victim["status"], "paused", "{victim}");
    assert_eq!(
        sink.stats().path("charge").effects,
        0,
        "nothing was charged"
    );
    // The log keeps the normalised id, and the prompt uses it too.
    let (_, events) = daemon.get(&format!("/sessions/{attacker_id}/events")).await;
    let text = events.to_string();
    assert!(!text.contains("../"), "{text}");
    daemon.kill().await;
}

/// How many calls a trace of `start`/`end` lines saw, and the most that
/// ran at once.
fn concurrency(trace: &std::path::Path) -> (usize, i32) {
    let lines = std::fs::read_to_string(trace).unwrap();
    let (mut running, mut most, mut started) = (0i32, 0, 0);
    for line in lines.lines() {
        if line == "start" {
            running += 1;
            started += 1;
        } else {
            running -= 1;
        }
        most = most.max(running);
    }
    (started, most)
}

/// A command that records in `trace` when it starts and ends, 0.3 s apart.
fn nap_tool(trace: &std::path::Path) -> String {
    let nap = format!(
        "echo start >> {0}; sleep 0.3; echo end >> {0}",
        trace.display()
    );
    command_tool("nap", &["sh", "-c", &nap], "read_only", 10)
}

/// An agent on `model` with `tools`, and this text appended (tables such
/// as `[limits]` go last).
fn agent_with(model: &HostileModel, tools: &[String], extra: &str) -> String {
    agent_toml(&model.base_url(), tools) + extra
}

/// A testbed whose agent runs on `model` with `tools`.
async fn on_model(model: &HostileModel, tools: impl IntoIterator<Item = String>) -> Testbed {
    Testbed::new()
        .model_url(&model.base_url())
        .tools(tools)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_or_endless_model_reply_is_cut_off_in_bounded_memory() {
    for (what, answer) in [
        ("100 MiB", Answer::Bytes(100 << 20)),
        ("endless", Answer::Endless),
    ] {
        let world = World::new();
        let answer = Arc::new(Mutex::new(Some(answer)));
        let model = HostileModel::start(move |_, _, _| {
            answer
                .lock()
                .unwrap()
                .take()
                .unwrap_or(Answer::Status(500, "once only".into()))
        })
        .await;
        let agent = world.write("agent.toml", &agent_with(&model, &[], ""));
        let mut command = world.mneme_std();
        command.args(["run", "--agent", agent.to_str().unwrap(), "hello"]);
        let (out, rss) = tokio::task::spawn_blocking(move || run_measured(command))
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{what}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("sent more than 8388608 bytes (max_response_bytes)"),
            "{what}: {}",
            stderr(&out)
        );
        assert!(rss < RSS_BOUND, "{what}: mneme peaked at {} MiB", rss >> 20);
        // The failure is recorded, small, and the session can go on.
        let out = world.run(&["log", "--json", &session_id(&out)]).await;
        let last: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
        assert_eq!(last["kind"], "SessionFinished", "{what}");
        assert!(last.to_string().len() < 4096, "{what}: {last}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_tool_output_and_a_stderr_flood_are_kept_within_bounds() {
    let world = World::new();
    let model = HostileModel::start(|n, request, _| match n {
        0 => Answer::Json(completion(
            None,
            &[
                ("c1", "flood_out", json!({})),
                ("c2", "flood_err", json!({})),
            ],
        )),
        _ => {
            assert!(has_tool_result(request));
            Answer::Json(completion(Some("done"), &[]))
        }
    })
    .await;
    let tools = [
        command_tool(
            "flood_out",
            &["sh", "-c", "head -c 314572800 /dev/zero | tr '\\0' o"],
            "read_only",
            60,
        ),
        command_tool(
            "flood_err",
            &[
                "sh",
                "-c",
                "head -c 314572800 /dev/zero | tr '\\0' e >&2; echo the end >&2; exit 1",
            ],
            "read_only",
            60,
        ),
    ];
    let agent = world.write("agent.toml", &agent_with(&model, &tools, ""));
    let mut command = world.mneme_std();
    command.args(["run", "--agent", agent.to_str().unwrap(), "flood"]);
    let (out, rss) = tokio::task::spawn_blocking(move || run_measured(command))
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(rss < RSS_BOUND, "mneme peaked at {} MiB", rss >> 20);
    let requests = model.requests();
    let results: Vec<String> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    let kept: String = serde_json::from_str(&results[0]).unwrap();
    assert!(kept.starts_with(&"o".repeat(1 << 20)));
    assert!(
        kept.ends_with("[mneme] output truncated: kept the first 1048576 of 314572800 bytes (max_output_bytes)"),
        "{}",
        &kept[1 << 20..]
    );
    assert!(
        results[1].starts_with("error: tool flood_err failed: exit status: 1"),
        "{}",
        &results[1][..80]
    );
    assert!(
        results[1].ends_with("the end)"),
        "the end of stderr is kept"
    );
    assert!(results[1].len() < 1024, "stderr is quoted by its end only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_calls_in_a_reply_are_refused_and_parallel_calls_are_capped() {
    let world = World::new();
    let trace = world.dir.path().join("trace");
    let model = HostileModel::start(|n, request, _| match n {
        // 10,000 calls of a tool that would start a process each.
        0 => Answer::Json(calls_of("nap", 10_000, "c")),
        // Told, it asks for 20.
        1 => {
            assert!(
                user_text(request).contains("it made 10000 tool calls, and at most 64 are allowed"),
                "{}",
                user_text(request)
            );
            Answer::Json(calls_of("nap", 20, "d"))
        }
        _ => Answer::Json(completion(Some("rested"), &[])),
    })
    .await;
    let agent = world.write("agent.toml", &agent_with(&model, &[nap_tool(&trace)], ""));
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "nap"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "rested");
    let (started, most) = concurrency(&trace);
    assert_eq!(started, 20, "only the second reply's calls ran");
    assert!(
        most <= 8,
        "{most} calls ran at once (max_parallel_calls = 8)"
    );
    assert!(most > 1, "the calls still ran in parallel");
    let kinds = event_kinds(&world, &session_id(&out)).await;
    let started_events = kinds.iter().filter(|k| *k == "ToolStarted").count();
    assert_eq!(started_events, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_always_calls_a_tool_stops_at_the_turn_budget() {
    let world = World::new();
    let model = HostileModel::start(|n, _, _| {
        Answer::Json(completion(None, &[(&format!("c{n}"), "lookup", json!({}))]))
    })
    .await;
    let agent = world.write(
        "agent.toml",
        &agent_with(
            &model,
            &[lookup_tool()],
            "[limits]\nmax_steps_per_turn = 5\n",
        ),
    );
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "loop"])
        .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let id = session_id(&out);
    assert!(
        stderr(&out).contains(&format!("mneme resume {id} --extend")),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("max_steps_per_turn = 5"),
        "{}",
        stderr(&out)
    );
    assert_eq!(model.requests().len(), 5);
    // Recovery does not resume it, nor does a resume without --extend.
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    // Time, not a barrier: nothing may happen within 2 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, session) = daemon.get(&format!("/sessions/{id}")).await;
    assert_eq!(session["status"], "paused", "{session}");
    assert_eq!(session["waits_for_a_person"], true, "{session}");
    assert_eq!(model.requests().len(), 5, "recovery ran the loop again");
    let (status, end) = daemon
        .post(&format!("/sessions/{id}/resume"), &json!({"wait": true}))
        .await;
    assert_eq!((status, &end["budget"]), (200, &json!(true)), "{end}");
    assert_eq!(model.requests().len(), 5);
    daemon.terminate().await;
    // --extend gives the turn a new budget.
    let out = world.run(&["resume", &id, "--extend"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(model.requests().len(), 10);
    let kinds = event_kinds(&world, &id).await;
    assert_eq!(kinds.iter().filter(|k| *k == "SessionPaused").count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_stay_out_of_the_log_the_export_the_api_and_the_output() {
    const KEY: &str = "sk-planted-secret-0123456789";
    let world = World::new();
    // The server echoes the Authorization header in its first answer (an
    // error), then has a tool print its environment.
    let model = HostileModel::start(|n, request, headers| {
        let auth = headers
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        match n {
            0 => Answer::Status(
                400,
                format!("bad request; you sent Authorization: {auth}\nmneme serve: forged line"),
            ),
            1 => Answer::Json(completion(None, &[("c1", "printenv", json!({}))])),
            _ => {
                let result = request["messages"].to_string();
                Answer::Json(completion(
                    Some(&format!("echo {auth} {}", result.len())),
                    &[],
                ))
            }
        }
    })
    .await;
    let tools = [command_tool(
        "printenv",
        &["sh", "-c", "env"],
        "read_only",
        5,
    )];
    let agent = agent_with(&model, &tools, "").replace(
        "timeout_secs = 10\n",
        "timeout_secs = 10\napi_key_env = \"PLANTED_KEY\"\n",
    );
    let agent = world.write("agent.toml", &agent);
    let agent = agent.to_str().unwrap();
    let log = world.dir.path().join("daemon.log");
    let mut command = DaemonProcess::command(&world.data(), &[]);
    command.env("PLANTED_KEY", KEY);
    let daemon = DaemonProcess::launch_logged(command, &world.data(), &log).await;
    let run = |args: Vec<String>| {
        let mut command = world.mneme();
        command
            .args(args)
            .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN)
            .env("PLANTED_KEY", KEY);
        async move { command.output().await.unwrap() }
    };
    let out = run(vec![
        "run".into(),
        "--agent".into(),
        agent.into(),
        "hi".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let id = session_id(&out);
    let mut printed = stdout(&out) + &stderr(&out);
    let out = run(vec!["resume".into(), id.clone()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    printed += &(stdout(&out) + &stderr(&out));
    assert!(
        printed.contains("[redacted]"),
        "the echo was redacted: {printed}"
    );
    for args in [vec!["log", "--json"], vec!["log"], vec!["replay", "--json"]] {
        let mut args: Vec<String> = args.into_iter().map(String::from).collect();
        args.push(id.clone());
        let out = run(args).await;
        printed += &(stdout(&out) + &stderr(&out));
    }
    let (_, events) = daemon.get(&format!("/sessions/{id}/events")).await;
    let (_, session) = daemon.get(&format!("/sessions/{id}")).await;
    let request = daemon
        .http
        .get(daemon.url(&format!("/sessions/{id}/request")))
        .send()
        .await
        .unwrap();
    let api = events.to_string() + &session.to_string() + &request.text().await.unwrap();
    let daemon_output = daemon.terminate_with_output().await;
    // Export needs the directory: the daemon is gone now.
    let out = run(vec!["export".into(), id.clone()]).await;
    let export = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    let hex_key: String = KEY.bytes().map(|b| format!("{b:02x}")).collect();
    for (where_, text) in [
        ("printed", &printed),
        ("api", &api),
        ("daemon output", &daemon_output),
        ("export", &export),
    ] {
        assert!(!text.contains(KEY), "{where_} holds the key: {text}");
        assert!(!text.contains(&hex_key), "{where_} holds the key in hex");
        assert!(
            !text.contains(mneme_e2e::daemon::TOKEN),
            "{where_} holds the daemon token"
        );
    }
    // The server's newline forged no line of the daemon's log.
    assert!(
        daemon_output
            .lines()
            .all(|l| !l.starts_with("mneme serve: forged line")),
        "{daemon_output}"
    );
    assert!(
        daemon_output.contains("\\nmneme serve: forged line"),
        "{daemon_output}"
    );
    // The tool saw neither, and the data directory's files hold neither.
    assert!(
        api.contains("PATH="),
        "the tool's environment was recorded: {api}"
    );
    for entry in walk(&world.data()) {
        let bytes = std::fs::read(&entry).unwrap();
        for secret in [KEY, mneme_e2e::daemon::TOKEN] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{} holds a secret",
                entry.display()
            );
        }
    }
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_from_outside_cannot_drive_the_terminal() {
    // OSC 52 (write the clipboard), a screen clear, a C1 CSI and a bidi
    // override, in an answer, in a call id and in arguments.
    const HOSTILE: &str = "\u{1b}]52;c;aGVsbG8=\u{7}\u{1b}[2J\u{9b}31m\u{202e}";
    let model = HostileModel::start(|n, _, _| match n {
        0 => Answer::Json(completion(
            Some(HOSTILE),
            &[(HOSTILE, "lookup", json!({"q": HOSTILE}))],
        )),
        _ => Answer::Json(completion(
            Some(&format!("done {HOSTILE}\nsecond line")),
            &[],
        )),
    })
    .await;
    let bed = on_model(&model, [lookup_tool()]).await;
    let world = &bed.world;
    let out = bed.run_agent(HOSTILE).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let id = session_id(&out);
    let dangerous = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes);
        text.contains(['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}'])
    };
    assert!(!dangerous(&out.stdout), "{:?}", stdout(&out));
    assert_eq!(
        stdout(&out),
        "done \\u{1b}]52;c;aGVsbG8=\\u{7}\\u{1b}[2J\\u{9b}31m\\u{202e}\nsecond line\n"
    );
    for args in [vec!["log"], vec!["sessions"], vec!["replay"]] {
        let mut args = args;
        if args[0] != "sessions" {
            args.push(&id);
        }
        let out = world.run(&args).await;
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(!dangerous(&out.stdout), "{args:?}: {:?}", stdout(&out));
        // The log escapes it; replay prints JSON, which escapes it too.
        let shown = ["\\u{1b}]52", "\\u001b]52"];
        if args[0] != "sessions" {
            assert!(
                shown.iter().any(|s| stdout(&out).contains(s)),
                "{args:?} shows the text escaped: {}",
                stdout(&out)
            );
        }
    }
    // JSON output stays exact: the text parses back byte for byte.
    let out = world.run(&["log", "--json", &id]).await;
    let first_user = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["kind"] == "UserMessage")
        .unwrap();
    assert_eq!(first_user["event"]["UserMessage"]["text"], HOSTILE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_files_that_would_break_a_session_are_refused_at_load() {
    let world = World::new();
    let base = agent_toml("http://127.0.0.1:9/v1", &[lookup_tool()]);
    let zero_byte_script =
        "name = \"x\"\n[model]\nprovider = \"scripted\"\nscript = \"/dev/zero\"\n";
    let cases: Vec<(String, &str)> = vec![
        (base.replace("timeout_secs = 10\n", "timeout_secs = 0\n"), "timeout_secs must be greater than 0"),
        (base.replace("timeout_secs = 10\n[[tools]]", "[[tools]]").replace("timeout_secs = 10\n", "timeout_secs = 0\n"), "timeout_secs must be greater than 0"),
        (base.replace("name = \"test-agent\"", "name = \"\""), "name \"\""),
        (
            agent_toml("http://127.0.0.1:9/v1", &[http_tool("t", "file:///etc/passwd", "read_only")]),
            "only http and https",
        ),
        (
            agent_toml("http://127.0.0.1:9/v1", &[http_tool("t", "ftp://127.0.0.1/x", "read_only")]),
            "only http and https",
        ),
        (
            agent_toml("http://127.0.0.1:9/v1", &[http_tool("t", "http://exa mple/", "read_only")]),
            "not a URL",
        ),
        (
            agent_toml("http://127.0.0.1:9/v1", &[http_tool("t", "http://127.0.0.1:9/x", "read_only") + "method = \"BREW\"\n"]),
            "is not one of",
        ),
        (
            base.clone() + "[model.kv]\nlayers = 4611686018427387904\nkv_heads = 2\nhead_dim = 1\ndtype_bytes = 1\n",
            "fit in 64 bits",
        ),
        (agent_toml("http://user:hunter2@127.0.0.1:9/v1", &[]), "carries user information"),
        (zero_byte_script.to_string(), "not a regular file"),
    ];
    for (text, expected) in cases {
        let agent = world.write("agent.toml", &text);
        let out = world
            .run(&["run", "--agent", agent.to_str().unwrap(), "hi"])
            .await;
        assert_eq!(out.status.code(), Some(1), "{expected}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{expected}: {}",
            stderr(&out)
        );
        assert!(!stderr(&out).contains("hunter2"), "{}", stderr(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_model_times_out_by_name() {
    let world = World::new();
    let model = HostileModel::start(|_, _, _| Answer::Stall).await;
    let agent = agent_with(&model, &[], "").replace("timeout_secs = 10\n", "timeout_secs = 1\n");
    let agent = world.write("agent.toml", &agent);
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "hi"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no complete answer within 1 s (timeout_secs)"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("error decoding response body"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_processes_end_with_mneme_and_do_not_hold_it() {
    let world = World::new();
    let pids = world.dir.path().join("pids");
    let runs = world.dir.path().join("runs");
    let model = HostileModel::start(|n, _, _| match n {
        0 => Answer::Json(completion(None, &[("c1", "escape", json!({}))])),
        1 => Answer::Json(completion(None, &[("c2", "long", json!({}))])),
        _ => Answer::Json(completion(Some("done"), &[])),
    })
    .await;
    // `escape` leaves a descendant in a session of its own holding stdout;
    // `long` runs until mneme is killed.
    let escape = format!(
        "echo run >> {}; setsid sleep 30 & echo '{{\"ok\":1}}'",
        runs.display()
    );
    let long = format!("echo $$ >> {}; exec sleep 60", pids.display());
    let tools = [
        command_tool("escape", &["sh", "-c", &escape], "read_only", 5),
        command_tool("long", &["sh", "-c", &long], "read_only", 120),
    ];
    let agent = world.write("agent.toml", &agent_with(&model, &tools, ""));
    let mut child = world
        .mneme()
        .args(["run", "--agent", agent.to_str().unwrap(), "go"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = eventually(
        "the long tool to start",
        Duration::from_secs(30),
        || async {
            std::fs::read_to_string(&pids)
                .ok()
                .and_then(|t| t.trim().parse::<i32>().ok())
        },
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        1,
        "the escaping call finished at once and ran once"
    );
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let what = format!("the tool process {pid} to die with the SIGKILLed mneme");
    eventually(what, Duration::from_secs(2), || async {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z ") {
            Ok(())
        } else {
            Err(format!("alive: {stat}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_event_listings_do_not_hold_whole_sessions() {
    let world = World::new();
    // A long run of small events (64 lookups), then three replies of eight
    // calls, each returning 1 MiB: 24 MiB of events behind small ones, so a
    // reader cannot size its pages by what it read last.
    let model = HostileModel::start(|n, _, _| match n {
        0 => Answer::Json(calls_of("lookup", 64, "s")),
        1..=3 => Answer::Json(calls_of("big", 8, &format!("r{n}c"))),
        _ => Answer::Json(completion(Some("done"), &[])),
    })
    .await;
    let big = command_tool(
        "big",
        &["sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' b"],
        "read_only",
        10,
    );
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let id = daemon
        .create(&agent_with(&model, &[lookup_tool(), big], ""))
        .await;
    let (status, end) = daemon
        .post(
            &format!("/sessions/{id}/messages"),
            &json!({"text": "go", "wait": true}),
        )
        .await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("done")),
        "{end}"
    );
    let pid = daemon.child.id().unwrap();
    // Count only what the listings cost: reset the peak.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = peak_rss(pid);
    let listings = (0..5).map(|_| {
        let request = daemon
            .http
            .get(daemon.url(&format!("/sessions/{id}/events")));
        async move {
            let body = request.send().await.unwrap().bytes().await.unwrap();
            serde_json::from_slice::<Vec<Value>>(&body).unwrap().len()
        }
    });
    let counts = futures_util::future::join_all(listings).await;
    assert!(
        counts.iter().all(|&n| n == counts[0] && n > 50),
        "{counts:?}"
    );
    let peak = peak_rss(pid);
    assert!(peak < RSS_BOUND, "the daemon peaked at {} MiB", peak >> 20);
    assert!(
        peak - before < 32 << 20,
        "five listings of a 24 MiB session cost {} MiB",
        (peak - before) >> 20
    );
    daemon.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_caps_the_calls_running_across_its_sessions() {
    let world = World::new();
    let trace = world.dir.path().join("trace");
    let model = HostileModel::start(|_, request, _| {
        if has_tool_result(request) {
            return Answer::Json(completion(Some("rested"), &[]));
        }
        Answer::Json(calls_of("nap", 6, "c"))
    })
    .await;
    let daemon = DaemonProcess::start(&world.data(), &["--max-parallel-calls", "3"]).await;
    let agent = agent_with(&model, &[nap_tool(&trace)], "");
    let mut turns = Vec::new();
    for _ in 0..3 {
        let id = daemon.create(&agent).await;
        let path = format!("/sessions/{id}/messages");
        turns.push(daemon.post_owned(path, json!({"text": "nap", "wait": true})));
    }
    for (status, end) in futures_util::future::join_all(turns).await {
        assert_eq!(
            (status, end["answer"].as_str()),
            (200, Some("rested")),
            "{end}"
        );
    }
    let (started, most) = concurrency(&trace);
    assert_eq!(started, 18);
    assert!(
        most <= 3,
        "{most} calls ran at once in a daemon capped at 3"
    );
    daemon.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_grows_past_a_record_fails_the_turn_once() {
    // Arguments as a JSON object of 1e9s: 4 bytes each on the wire, 13 once
    // re-encoded, so a 6 MiB response becomes a reply over 16 MiB.
    let numbers = vec!["1e9"; 1_500_000].join(",");
    let body = format!(
        r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","content":null,"tool_calls":[{{"id":"c1","type":"function","function":{{"name":"lookup","arguments":{{"n":[{numbers}]}}}}}}]}},"finish_reason":"tool_calls"}}]}}"#
    );
    assert!(body.len() < 8 << 20);
    let model = HostileModel::start(move |_, _, _| Answer::Status(200, body.clone())).await;
    let bed = on_model(&model, [lookup_tool()]).await;
    let out = bed.run_agent("grow").await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("limit of 16777216"),
        "{}",
        stderr(&out)
    );
    let id = session_id(&out);
    // Recorded as failed: a daemon's recovery does not ask again.
    let daemon = DaemonProcess::start(&bed.world.data(), &[]).await;
    // Time, not a barrier: nothing may happen within 2 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, session) = daemon.get(&format!("/sessions/{id}")).await;
    assert_eq!(session["status"], "failed", "{session}");
    assert_eq!(model.requests().len(), 1, "the model was asked again");
    daemon.kill().await;
}
