//! What a new user meets at the command line, through the real binary: a
//! closed pipe, a server that is down or silent, a
//! killed run, reads beside a running one, ids by prefix, a preflight, the
//! help of each command.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::*;
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A world with the billing agent (charge, lookup, email) on a scripted
/// model and a sink.
async fn billing() -> Testbed {
    Testbed::new()
        .replies(billing_replies())
        .sink_tools(|sink| billing_tools(sink).to_vec())
        .await
}

/// A session of `b`'s agent run to its answer.
async fn answered(b: &Testbed) -> String {
    let out = b.run_agent("go").await;
    assert!(out.status.success(), "{}", stderr(&out));
    session_id(&out)
}

/// `mneme run` of `b`'s agent, inside its charge: the sink holds the
/// charge's answer back until the sender fires or is dropped.
async fn inside_the_charge(
    b: &Testbed,
) -> (tokio::process::Child, tokio::sync::oneshot::Sender<()>) {
    let hold = b.sink.hold("charge");
    let child = (b.world)
        .spawn_until_applied(&["run", "--agent", b.agent_arg(), "go"], hold.applied)
        .await;
    (child, hold.release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_output_quietly() {
    let b = billing().await;
    let id = answered(&b).await;
    let commands: [&[&str]; 6] = [
        &["log", &id],
        &["log", &id, "--json"],
        &["sessions", "--json"],
        &["sessions"],
        &["replay", &id],
        &["export"],
    ];
    for args in commands {
        let mut child = b
            .world
            .mneme()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before the first line is written.
        drop(child.stdout.take());
        let out = child.wait_with_output().await.unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}

/// A port that accepts connections and never answers.
async fn silent_port() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (addr, task)
}

fn agent_on(url: &str, model_lines: &str) -> String {
    format!("name = \"x\"\n[model]\nprovider = \"openai\"\nbase_url = \"{url}\"\nmodel = \"m\"\n{model_lines}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_url_on_a_silent_port_fails_fast_saying_each_retry() {
    let world = World::new();
    let (addr, _server) = silent_port().await;
    let agent = world.write(
        "agent.toml",
        &agent_on(&format!("https://{addr}/v1"), "connect_timeout_secs = 1\n"),
    );
    let started = Instant::now();
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "hi"])
        .await;
    // Four attempts of one second each and the waits between them; the
    // request timeout (120 s) never comes into it.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let id = session_id(&out);
    for attempt in 1..=3 {
        assert!(
            err.contains(&format!("(attempt {attempt} of 4); trying again in")),
            "{err}"
        );
    }
    assert!(err.contains("no connection within 1 s"), "{err}");
    assert!(err.contains("is the scheme right?"), "{err}");
    assert!(
        err.contains(&format!("`mneme resume {id}` continues it")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_named_as_refusing() {
    let world = World::new();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let agent = world.write("agent.toml", &agent_on(&format!("http://{addr}/v1"), ""));
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "hi"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("connection refused: nothing listens there"),
        "{err}"
    );
    assert!(err.contains(&addr.to_string()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_missing_from_the_daemon_names_the_daemons_environment() {
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("hi")])
        .model_options("api_key_env = \"MNEME_TEST_KEY_NOBODY_SET\"\n")
        .daemon()
        .await;
    let daemon = bed.daemon();
    // The variable is set where the command runs, not where the daemon does.
    let out = (bed.world.mneme())
        .args(["run", "--agent", bed.agent_arg(), "hi"])
        .env(
            "MNEME_TEST_KEY_NOBODY_SET",
            "sk-the-shell-has-it-0123456789",
        )
        .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let named = format!("mneme serve, pid {}", daemon.pid());
    assert!(
        err.contains("MNEME_TEST_KEY_NOBODY_SET") && err.contains(&named),
        "{err}"
    );
    assert!(!err.contains("sk-the-shell-has-it"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_is_interrupted_and_its_resume_is_recorded() {
    let b = billing().await;
    let (mut run, _hold) = inside_the_charge(&b).await;
    run.start_kill().unwrap();
    run.wait().await.unwrap();
    let rows = stdout(&b.world.run(&["sessions", "--json"]).await);
    let row: Value = serde_json::from_str(rows.lines().next().unwrap()).unwrap();
    let id = row["session"].as_str().unwrap().to_string();
    assert_eq!(row["status"], "running", "{row}");
    assert_eq!(row["interrupted"], true, "{row}");
    let listing = stdout(&b.world.run(&["sessions"]).await);
    assert!(listing.contains("interrupted"), "{listing}");
    assert!(listing.contains("process died: mneme resume "), "{listing}");
    assert!(
        listing.contains("\"go\""),
        "the first message as the title: {listing}"
    );

    let out = b.world.run(&["resume", &id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let events = logged_events(&b.world, &id).await;
    let resumed: Vec<&Value> = (events.iter())
        .filter(|(_, kind, _)| kind == "SessionResumed")
        .map(|(_, _, event)| event)
        .collect();
    assert_eq!(resumed.len(), 1, "{events:?}");
    assert_eq!(resumed[0]["after_crash"], true, "{events:?}");
    assert_eq!(resumed[0]["by"], "mneme resume");
    let log = stdout(&b.world.run(&["log", &id]).await);
    assert!(
        log.contains("after the process running the turn died"),
        "{log}"
    );
    let rows = stdout(&b.world.run(&["sessions", "--json"]).await);
    assert!(!rows.contains("\"interrupted\""), "{rows}");
    assert_billed_once(&b.sink, 1);

    // A fork at the first message runs, but nothing ever ran it: it is
    // pending, not interrupted, and its resume records no crash.
    let fork = stdout(&b.world.run(&["fork", &id, "--at", "2"]).await);
    let fork = fork.trim();
    let rows = stdout(&b.world.run(&["sessions", "--json"]).await);
    let row: Value = (rows.lines())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["session"] == fork)
        .unwrap();
    assert_eq!(row["status"], "running", "{row}");
    assert_eq!(
        (&row["interrupted"], &row["pending"]),
        (&json!(false), &json!(true))
    );
    let listing = stdout(&b.world.run(&["sessions"]).await);
    assert!(
        listing.contains("pending") && listing.contains("no step recorded yet: mneme resume"),
        "{listing}"
    );
    let out = b.world.run(&["resume", fork]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let kinds = event_kinds(&b.world, fork).await;
    assert!(!kinds.contains(&"SessionResumed".to_string()), "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_work_beside_a_running_run_and_writes_say_what_to_do() {
    let b = billing().await;
    let (run, hold) = inside_the_charge(&b).await;
    let pid = run.id().unwrap();
    let rows = b.world.run(&["sessions", "--json"]).await;
    assert!(rows.status.success(), "{}", stderr(&rows));
    let row: Value = serde_json::from_str(stdout(&rows).lines().next().unwrap()).unwrap();
    let id = row["session"].as_str().unwrap().to_string();
    assert_eq!(row["status"], "running");
    assert!(
        row.get("interrupted") == Some(&json!(false)),
        "it runs: {row}"
    );
    let prefix = &id[..13];
    for args in [
        vec!["sessions"],
        vec!["log", prefix],
        vec!["log", prefix, "--json"],
        vec!["verify"],
        vec!["verify", prefix],
        vec!["replay", prefix],
        vec!["replay", prefix, "--raw"],
    ] {
        let out = b.world.run(&args).await;
        assert!(
            out.status.success(),
            "{args:?} beside the run: {}",
            stderr(&out)
        );
        assert!(!stdout(&out).is_empty(), "{args:?}");
    }
    let log = stdout(&b.world.run(&["log", prefix]).await);
    assert!(
        log.contains("ToolStarted") && log.contains("charge"),
        "{log}"
    );
    for args in [
        vec!["run", "--agent", b.agent_arg(), "again"],
        vec!["export"],
    ] {
        let out = b.world.run(&args).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(&format!("mneme run, pid {pid}")),
            "{args:?}: {err}"
        );
        assert!(err.contains("wait for it to finish"), "{args:?}: {err}");
    }
    drop(hold);
    let out = run.wait_with_output().await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !b.world.data().join("mneme.reader").exists(),
        "the note is gone"
    );
    assert_billed_once(&b.sink, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_named_by_any_unique_prefix() {
    let b = billing().await;
    let first = answered(&b).await;
    let second = answered(&b).await;
    let shared = first
        .chars()
        .zip(second.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let unique = &second[..shared + 1];
    let out = b.world.run(&["log", unique, "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&second) && !stdout(&out).contains(&first));
    let out = b
        .world
        .run(&["replay", &second.to_uppercase()[..shared + 1]])
        .await;
    assert!(out.status.success(), "upper case too: {}", stderr(&out));

    let ambiguous = b.world.run(&["log", &second[..shared]]).await;
    assert_eq!(ambiguous.status.code(), Some(1));
    assert!(
        stderr(&ambiguous).contains("2 sessions begin with"),
        "{}",
        stderr(&ambiguous)
    );
    let data = b.world.data().display().to_string();
    for missing in ["fff", "01a2ffff-0000-7000-8000-000000000000"] {
        let out = b.world.run(&["log", missing]).await;
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert!(
            err.contains(&format!(
                "no session {missing} in the data directory {data}"
            )),
            "{err}"
        );
    }
    let bad = b.world.run(&["log", "not-an-id!"]).await;
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    // The listing shows each id as the prefix commands take.
    let listing = stdout(&b.world.run(&["sessions"]).await);
    let shown: Vec<&str> = (listing.lines().skip(1))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(shown.len(), 2, "{listing}");
    for short in shown {
        let out = b.world.run(&["verify", short]).await;
        assert!(out.status.success(), "{short}: {}", stderr(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_never_creates_a_data_directory() {
    let world = World::new();
    let out = world.run(&["sessions"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("does not exist yet"),
        "{}",
        stderr(&out)
    );
    let out = world.run(&["log", "01a2"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no session 01a2 in the data directory"),
        "{}",
        stderr(&out)
    );
    for args in [vec!["verify"], vec!["export"], vec!["sessions", "--json"]] {
        let out = world.run(&args).await;
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "", "{args:?}");
    }
    assert!(!world.data().exists(), "nothing was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_is_required_where_the_server_picks_one_by_name() {
    let world = World::new();
    let agent = world.write(
        "agent.toml",
        "name = \"x\"\n[model]\nprovider = \"anthropic\"\napi_key_env = \"ANTHROPIC_API_KEY\"\n",
    );
    let started = Instant::now();
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "hi"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = stderr(&out);
    assert!(
        err.contains("provider = \"anthropic\" needs model"),
        "{err}"
    );
    assert_eq!(stdout(&world.run(&["sessions", "--json"]).await), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_what_a_session_would_fail_on_and_runs_no_tool() {
    let world = World::new();
    let model = MockModel::start(
        vec![MockReply::calls(&[("charge", json!({"n": 1}))])],
        Fault::None,
    )
    .await;
    let sink = Sink::start().await.unwrap();
    let good = world.write(
        "good.toml",
        &agent_toml(&model.base_url(), &billing_tools(&sink)),
    );
    let out = world
        .run(&["check", "--agent", good.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let report = stdout(&out);
    assert!(report.contains("with a tool call: charge("), "{report}");
    assert!(report.contains("tool \"lookup\": runs /"), "{report}");
    assert!(
        report.contains(&format!("{} accepts connections", sink.url("charge"))),
        "{report}"
    );
    assert!(!report.contains("FAIL"), "{report}");
    assert_eq!(sink.stats().path("charge").hits, 0, "no tool was called");
    assert!(!world.data().exists(), "a check needs no data directory");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = closed.local_addr().unwrap();
    drop(closed);
    let tools = [
        http_tool("charge", &format!("http://{down}/charge"), "side_effect"),
        command_tool("lookup", &["./no-such-script.sh"], "read_only", 5),
    ];
    let broken = world.write(
        "broken.toml",
        &agent_toml(&format!("http://{down}/v1"), &tools),
    );
    let out = world
        .run(&["check", "--agent", broken.to_str().unwrap(), "--json"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let findings: Vec<Value> = (stdout(&out).lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let verdict = |what: &str| {
        findings
            .iter()
            .find(|f| f["what"].as_str().unwrap().starts_with(what))
            .unwrap_or_else(|| panic!("{what}: {findings:?}"))
            .clone()
    };
    assert_eq!(verdict("tool \"charge\"")["verdict"], "fail");
    let lookup = verdict("tool \"lookup\"");
    assert_eq!(lookup["verdict"], "fail");
    assert!(
        lookup["detail"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{lookup}"
    );
    let server = verdict("model server");
    assert_eq!(server["verdict"], "fail");
    assert!(
        server["detail"]
            .as_str()
            .unwrap()
            .contains("connection refused"),
        "{server}"
    );
    assert!(stderr(&out).contains("3 of 3 checks"), "{}", stderr(&out));

    // A model that answers in words is a warning, not a failure.
    let talker = MockModel::start(vec![MockReply::answer("Hello!")], Fault::None).await;
    let talks = world.write("talks.toml", &agent_toml(&talker.base_url(), &[]));
    let out = world
        .run(&["check", "--agent", talks.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("warn"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("instead of a tool call"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_commands_help_shows_its_own_options_and_an_example() {
    let world = World::new();
    // The options a command's help lists (not the words of its text).
    let help = |command: &'static str| {
        let out = std::process::Command::new(mneme_bin())
            .args([command, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{command}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let options: Vec<String> = (text.lines())
            .map(str::trim_start)
            .filter(|l| l.starts_with("--"))
            .map(|l| l.split([' ', ',']).next().unwrap().to_string())
            .collect();
        (text, options)
    };
    let lists = |options: &[String], option: &str| options.iter().any(|o| o == option);
    let store_only = [
        "--sled-cache-mib",
        "--lease-ttl-ms",
        "--durability",
        "--master-key",
    ];
    let turns_only = ["--otlp-endpoint", "--signing-key"];
    for command in ["keygen", "check", "demo", "ui"] {
        let (text, options) = help(command);
        for option in store_only.iter().chain(&turns_only) {
            assert!(
                !lists(&options, option),
                "{command} --help lists {option}: {text}"
            );
        }
    }
    for command in ["sessions", "log", "verify", "export"] {
        let (text, options) = help(command);
        assert!(
            lists(&options, "--durability") && lists(&options, "--store"),
            "{text}"
        );
        assert!(
            !lists(&options, "--otlp-endpoint"),
            "{command} runs no turn: {text}"
        );
    }
    for command in ["run", "resume", "approve", "serve"] {
        let (text, options) = help(command);
        assert!(
            lists(&options, "--durability") && lists(&options, "--otlp-endpoint"),
            "{text}"
        );
    }
    let commands = [
        "run", "resume", "sessions", "log", "verify", "replay", "fork", "diff", "rerun", "blob",
        "resolve", "approve", "export", "import", "demo", "serve", "keygen", "erase", "check",
        "ui",
    ];
    for command in commands {
        let (text, _) = help(command);
        assert!(text.contains("Examples:\n  mneme "), "{command}: {text}");
    }
    // The store may still come before the command, as it always could.
    let out = world
        .mneme_std()
        .args(["sessions", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
}

/// What `mneme ARGS` (on `world`'s data directory) writes to a terminal:
/// script(1), from util-linux, gives it one. Its exit code, and the text.
async fn on_a_terminal(
    world: &World,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let mut line = vec![
        mneme_bin().display().to_string(),
        "--data-dir".into(),
        world.data().display().to_string(),
    ];
    line.extend(args.iter().map(|a| a.to_string()));
    let mut command = tokio::process::Command::new("script");
    command.args(["-qec", &line.join(" "), "/dev/null"]);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().await.expect("script(1), from util-linux");
    let shown = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    (out.status.code(), shown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_told_on_a_terminal_and_not_in_a_pipe() {
    let b = billing().await;
    let out = b.world.run(&["run", "--agent", b.agent_arg(), "go"]).await;
    assert!(out.status.success());
    assert!(
        !stderr(&out).contains("mneme: step"),
        "piped: {}",
        stderr(&out)
    );

    let args = ["run", "--agent", b.agent_arg(), "go"];
    let (code, shown) = on_a_terminal(&b.world, &args, &[("MNEME_SNAPSHOT_EVERY", "3")]).await;
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains("mneme: step 1: calls charge, lookup;"),
        "{shown}"
    );
    assert!(
        shown.contains("mneme: running charge (call call_0_0)"),
        "{shown}"
    );
    // The end of a call names its tool and its id, as its start does.
    assert!(
        shown.contains("mneme: charge (call call_0_0) finished in"),
        "{shown}"
    );
    assert!(shown.contains("mneme: step 3: answered;"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_turn_goes_on_counting_its_steps() {
    let b = billing().await;
    let (mut run, _hold) = inside_the_charge(&b).await;
    run.start_kill().unwrap();
    run.wait().await.unwrap();
    let id = stdout(&b.world.run(&["sessions", "--json"]).await);
    let row: Value = serde_json::from_str(id.lines().next().unwrap()).unwrap();
    let id = row["session"].as_str().unwrap().to_string();

    // Step 1 (charge, lookup) was the dead process's: the resume's first
    // reply is the turn's second step, not a new first.
    let (code, shown) = on_a_terminal(&b.world, &["resume", &id], &[]).await;
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains("mneme: charge (call call_0_0) finished in"),
        "{shown}"
    );
    assert!(shown.contains("mneme: step 2: calls email;"), "{shown}");
    assert!(shown.contains("mneme: step 3: answered;"), "{shown}");
    assert!(!shown.contains("mneme: step 1:"), "{shown}");
    assert_billed_once(&b.sink, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_says_what_a_create_takes_and_where_things_are() {
    let world = World::new();
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let http = reqwest::Client::new();
    let answer = http
        .post(daemon.url("/sessions"))
        .bearer_auth(mneme_e2e::daemon::TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let error: Value = answer.json().await.unwrap();
    let error = error["error"].as_str().unwrap();
    assert!(
        error.contains("no request body") && error.contains("{\"agent\": \"NAME\"}"),
        "{error}"
    );
    assert!(error.contains("application/toml"), "{error}");
    let (status, index) = daemon.get("/").await;
    assert_eq!(status, 200, "{index}");
    assert_eq!(index["openapi"], "/openapi.json");
    assert!(
        index["web_view"].as_str().unwrap().starts_with("/ui/"),
        "{index}"
    );
    // Without a token too.
    let open = http.get(daemon.url("/")).send().await.unwrap();
    assert_eq!(open.status(), 200);
}

/// Two ids as llama-server makes them: 32 random characters, sharing
/// their first two.
const FIRST_CALL: &str = "VdVg9Yx2eYoC3Y8arnZlKtMtQKbogsBY";
const SECOND_CALL: &str = "VdXa0mQ1pLk7sT2wYc9eRbN4uJfHzG6d";

/// A session killed with two `save_note` calls started: a command that
/// ignores idempotency keys, so a resume puts both in doubt. The world,
/// the model (kept serving) and the session's id.
async fn two_calls_cut_off() -> (World, mneme_e2e::hostile::HostileModel, String) {
    use mneme_e2e::hostile::{completion, Answer, HostileModel};
    let world = World::new();
    let model = HostileModel::start(|n, _, _| {
        Answer::Json(match n {
            0 => completion(
                Some(""),
                &[
                    (FIRST_CALL, "save_note", json!({"text": "milk"})),
                    (SECOND_CALL, "save_note", json!({"text": "eggs"})),
                ],
            ),
            _ => completion(Some("Saved both."), &[]),
        })
    })
    .await;
    let tool = command_tool(
        "save_note",
        &["sh", "-c", "cat >/dev/null; echo saved"],
        "side_effect",
        10,
    );
    let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[tool]));
    let out = world
        .run_crashing(
            &[
                "run",
                "--agent",
                agent.to_str().unwrap(),
                "Note: milk, eggs",
            ],
            "tool_started_durable",
        )
        .await;
    assert!(!out.status.success(), "{}", stderr(&out));
    let id = session_id(&out);
    (world, model, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_says_what_a_resume_will_do_and_decisions_take_a_calls_prefix() {
    let (world, _model, id) = two_calls_cut_off().await;
    let kinds = event_kinds(&world, &id).await;
    let started = kinds.iter().filter(|k| *k == "ToolStarted").count();
    assert_eq!(started, 2, "both calls started before the kill: {kinds:?}");

    // The status as `sessions` says it, and what the resume will do: not
    // run the calls, but stop for a person.
    let listing = stdout(&world.run(&["sessions"]).await);
    assert!(listing.contains("interrupted"), "{listing}");
    let shown = stdout(&world.run(&["replay", &id]).await);
    assert!(shown.contains("status interrupted"), "{shown}");
    let plan = (shown.lines())
        .find(|l| l.starts_with("Resume plan: "))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(!plan.contains("run tools"), "{plan}");
    assert!(
        plan.contains("record save_note, save_note in doubt")
            && plan.contains("stop and ask a person: 2 calls in doubt")
            && plan.contains(&format!("mneme resolve {id} CALL")),
        "{plan}"
    );
    assert!(
        shown.contains(&format!(
            "  save_note (call {FIRST_CALL}): in doubt, a person decides (mneme resolve): "
        )),
        "{shown}"
    );
    assert!(!shown.contains("in_doubt"), "plain words: {shown}");
    let view: Value =
        serde_json::from_str(&stdout(&world.run(&["replay", &id, "--json"]).await)).unwrap();
    assert_eq!(
        (&view["status"], &view["interrupted"]),
        (&json!("running"), &json!(true))
    );
    assert_eq!(
        view["calls"][0]["decision"], "in_doubt",
        "the JSON keeps its names"
    );

    let out = world.run(&["resume", &id]).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let shown = stdout(&world.run(&["replay", &id]).await);
    assert!(shown.contains("status paused"), "{shown}");
    assert!(
        shown.contains("Resume plan: stop and ask a person: 2 calls in doubt"),
        "{shown}"
    );
    let out = world.run(&["resume", "--all"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing to resume without a person: 1 session waits"),
        "{}",
        stderr(&out)
    );

    // A start shared by both calls names neither; one that starts no call
    // in doubt is refused, naming those that are.
    let before = event_kinds(&world, &id).await;
    let out = world.run(&["resolve", &id, "Vd", "--fail", "no"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("2 calls of session")
            && err.contains(&format!("{FIRST_CALL} (save_note)"))
            && err.contains(&format!("{SECOND_CALL} (save_note)")),
        "{err}"
    );
    let out = world.run(&["resolve", &id, "zz", "--fail", "no"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("not in doubt") && err.contains(FIRST_CALL),
        "{err}"
    );
    assert_eq!(event_kinds(&world, &id).await, before, "nothing recorded");

    // A unique start is the call; what still waits is said, with its command.
    let out = world
        .run(&["resolve", &id, "VdVg", "--skip", "--result", "\"saved\""])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("session {id}: call {FIRST_CALL} resolved")),
        "{err}"
    );
    assert!(
        err.contains("goes on once this call is decided too")
            && err.contains(&format!("mneme resolve {id} {SECOND_CALL} --retry")),
        "{err}"
    );
    let out = world.run(&["resolve", &id, "VdX", "--retry"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Saved both.");
    let resolved: Vec<Value> = (logged_events(&world, &id).await.into_iter())
        .filter(|(_, kind, _)| kind == "ToolResolved")
        .map(|(_, _, event)| event)
        .collect();
    assert_eq!(resolved.len(), 2);
    assert_eq!(
        (&resolved[0]["call_id"], &resolved[1]["call_id"]),
        (&json!(FIRST_CALL), &json!(SECOND_CALL))
    );

    let out = world.run(&["resume", "--all"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim(), "mneme: nothing to resume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_names_the_calls_it_puts_in_doubt_by_tool() {
    let (world, _model, id) = two_calls_cut_off().await;
    let (code, shown) = on_a_terminal(&world, &["resume", &id], &[]).await;
    assert_eq!(code, Some(3), "{shown}");
    for call in [FIRST_CALL, SECOND_CALL] {
        assert!(
            shown.contains(&format!("mneme: save_note (call {call}) is in doubt: ")),
            "{shown}"
        );
    }
}

/// `GET /props` as llama-server answers it, captured
/// (`tests/fixtures/llama-cpp/`).
fn captured_props(name: &str) -> Value {
    let path = fixtures().join("llama-cpp").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_why_a_model_answered_in_words_and_where_to_read_on() {
    use mneme_e2e::hostile::{completion, Answer, HostileModel};
    let world = World::new();
    let tool = command_tool("save_note", &["sh", "-c", "cat"], "side_effect", 5);
    let words = || |_, _: &Value, _: &_| Answer::Json(completion(Some("I saved your note."), &[]));
    let check = |agent: std::path::PathBuf| {
        let world = &world;
        async move {
            let out = world
                .run(&["check", "--agent", agent.to_str().unwrap(), "--json"])
                .await;
            let model: Value = (stdout(&out).lines())
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|f| f["what"].as_str().unwrap().starts_with("model server"))
                .unwrap_or_else(|| panic!("{}", stdout(&out)));
            (out.status.code(), model)
        }
    };

    // llama.cpp's server says its template has no tools: they never reach
    // the model, and no prompt can make it call one. A failure.
    let no_tools =
        HostileModel::start_with_props(Some(captured_props("props-own-template.json")), words())
            .await;
    let agent = world.write(
        "own.toml",
        &agent_toml(&no_tools.base_url(), std::slice::from_ref(&tool)),
    );
    let (code, model) = check(agent).await;
    assert_eq!(code, Some(1), "{model}");
    assert_eq!(model["verdict"], "fail");
    let detail = model["detail"].as_str().unwrap();
    assert!(
        detail.contains("has no tools")
            && detail.contains("--chat-template-file")
            && detail.contains("docs/guide/local-models.md"),
        "{detail}"
    );

    // Its template has tools: the model saw them and chose words.
    let has_tools =
        HostileModel::start_with_props(Some(captured_props("props-qwen-template.json")), words())
            .await;
    let agent = world.write(
        "qwen.toml",
        &agent_toml(&has_tools.base_url(), std::slice::from_ref(&tool)),
    );
    let (code, model) = check(agent).await;
    assert_eq!(code, Some(0), "{model}");
    assert_eq!(model["verdict"], "warn");
    let detail = model["detail"].as_str().unwrap();
    assert!(
        detail.contains("has tools")
            && detail.contains("example of a call in the system prompt")
            && detail.contains("docs/guide/local-models.md")
            && !detail.contains("--chat-template-file"),
        "{detail}"
    );

    // A server that cannot tell: both causes, and where to read.
    let other = HostileModel::start(words()).await;
    let agent = world.write("other.toml", &agent_toml(&other.base_url(), &[tool]));
    let (code, model) = check(agent).await;
    assert_eq!(code, Some(0), "{model}");
    assert_eq!(model["verdict"], "warn");
    let detail = model["detail"].as_str().unwrap();
    assert!(
        detail.contains("--chat-template-file") && detail.contains("docs/guide/local-models.md"),
        "{detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_sends_its_own_message_or_a_sessions_first_request() {
    let world = World::new();
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("lookup", json!({"n": 1}))]),
            MockReply::calls(&[("lookup", json!({"n": 1}))]),
            MockReply::calls(&[("lookup", json!({"n": 1}))]),
            MockReply::answer("Ada."),
        ],
        Fault::None,
    )
    .await;
    let agent = world.write(
        "agent.toml",
        &agent_toml(&model.base_url(), &[lookup_tool()]),
    );
    let agent = agent.to_str().unwrap();
    let out = world.run(&["check", "--agent", agent]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let message = "Note: buy milk";
    let out = world
        .run(&["check", "--agent", agent, "--message", message])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = world.run(&["run", "--agent", agent, message]).await;
    assert!(out.status.success(), "{}", stderr(&out));

    let bodies = model.bodies();
    let user = |body: &[u8]| {
        let request: Value = serde_json::from_slice(body).unwrap();
        request["messages"][1]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        user(&bodies[0]),
        "This is a connection check (mneme check). Call one of your tools now, with example arguments."
    );
    // With --message: the session's first request, its cache key aside.
    assert_eq!(
        String::from_utf8_lossy(&bodies[1]),
        String::from_utf8_lossy(&bodies[2])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_takes_a_calls_prefix_through_a_daemon_too() {
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("refund", json!({"n": 1}))]),
            MockReply::answer("Refunded."),
        ])
        .sink_tools(|sink| vec![refund_needing_approval(sink)])
        .daemon()
        .await;
    let through_the_daemon = |args: &[&str]| {
        let mut command = bed.world.mneme();
        command
            .args(args)
            .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN);
        async move { command.output().await.unwrap() }
    };
    let out = through_the_daemon(&["run", "--agent", bed.agent_arg(), "refund ada"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let id = session_id(&out);
    let out = through_the_daemon(&["approve", &id, "call_0", "--by", "ada"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("session {id}: call call_0_0 approved")),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out).trim(), "Refunded.");
    assert_eq!(bed.sink.stats().path("refund").effects, 1);
}
