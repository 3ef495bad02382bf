//! `mneme serve` at its edges (issue #10: the model and the tools are
//! untrusted input, and so are the daemon's clients). Each test drives the
//! real binary the way the finding was found.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::{read_until, DaemonProcess, TOKEN};
use mneme_e2e::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uuid::Uuid;

/// Starts `command` (a `mneme serve` on the world's data directory) with its
/// stderr in a file; returns the daemon and the file.
async fn launch_logged(
    world: &World,
    command: tokio::process::Command,
) -> (DaemonProcess, PathBuf) {
    let log = world.dir.path().join("daemon.log");
    let daemon = DaemonProcess::launch_logged(command, &world.data(), &log).await;
    (daemon, log)
}

/// `host:port` of the daemon.
fn address(daemon: &DaemonProcess) -> String {
    daemon.base.trim_start_matches("http://").to_string()
}

/// An HTTP client that opens a new connection for every request and sends
/// the test token.
fn fresh_client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {TOKEN}").parse().unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A client that sends half a request head and then nothing.
async fn slow_client(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: mneme\r\nX-Slow: ")
        .await
        .unwrap();
    stream
}

/// How long after `since` the daemon closed `stream`; fails after 10 s.
async fn time_to_close(mut stream: TcpStream, since: Instant) -> Duration {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return since.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the daemon never closed the connection"),
        }
    }
}

/// Asks `/health` over `stream` (keep-alive) and reads the answer.
async fn health_over(stream: &mut TcpStream) {
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: mneme\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("{\"status\":\"ok\"}") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("/health answers")
            .unwrap();
        assert!(
            n > 0,
            "closed before answering: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
}

/// Runs `command` (a `mneme serve` that must refuse to start) and returns
/// its output; fails if it is still running after 20 s.
async fn refusal(mut command: tokio::process::Command) -> std::process::Output {
    command.kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(20), command.output())
        .await
        .expect("the daemon started instead of refusing")
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    out
}

/// A line of `/proc/PID/status`, in kB.
fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

/// Slow clients against a daemon allowed 64 open files (finding 6): 80
/// connections that send half a head and stall. `/health` answers at once
/// all the same, the daemon says once that it reached its connection cap,
/// stays small, and closes stalled heads after `--header-timeout-secs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_under_a_low_open_file_limit_do_not_lock_out_health() {
    const FILES: u64 = 64;
    let world = World::new();
    let mut command = DaemonProcess::command(&world.data(), &["--header-timeout-secs", "2"]);
    // SAFETY: setrlimit(2) is async-signal-safe and changes only the child.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: FILES,
                rlim_max: FILES,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (daemon, log) = launch_logged(&world, command).await;
    let addr = address(&daemon);
    let mut slow = Vec::new();
    for _ in 0..80 {
        slow.push(slow_client(&addr).await);
    }
    let plain = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let asked = Instant::now();
        let response = plain
            .get(daemon.url("/health"))
            .send()
            .await
            .expect("/health answers while slow clients hold connections");
        assert_eq!(response.status(), 200);
        slowest = slowest.max(asked.elapsed());
    }
    assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");
    let pid = daemon.pid();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(fds < FILES as usize, "{fds} files open");
    let rss = proc_status_kib(pid, "VmRSS:");
    assert!(rss < 256 * 1024, "VmRSS {rss} kB");
    println!("under the probe: /health in at most {slowest:?}, {fds} files open, VmRSS {rss} kB");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("connection cap reached").count(), 1, "{text}");
    // New stalled heads: nothing evicts them, the header timeout closes them.
    let mut fresh = Vec::new();
    for _ in 0..3 {
        fresh.push((slow_client(&addr).await, Instant::now()));
    }
    for (stream, opened) in fresh {
        let took = time_to_close(stream, opened).await;
        assert!(
            took > Duration::from_millis(1500) && took < Duration::from_secs(4),
            "closed after {took:?}, the header timeout is 2 s"
        );
    }
    drop(slow);
    assert!(daemon.terminate().await.success());
}

/// The header timeout runs from the connection's start for its first
/// request and from the first byte of each later one; between keep-alive
/// requests the idle timeout applies instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_timeout_bounds_each_head_and_the_idle_timeout_the_wait_between() {
    let world = World::new();
    let daemon = DaemonProcess::start(
        &world.data(),
        &["--header-timeout-secs", "1", "--idle-timeout-secs", "3"],
    )
    .await;
    let addr = address(&daemon);
    let within = |took: Duration, low: u64, high: u64| {
        assert!(
            took > Duration::from_millis(low) && took < Duration::from_millis(high),
            "closed after {took:?}, expected {low}..{high} ms"
        )
    };
    // The first request: silent, or half a head.
    let opened = Instant::now();
    let silent = TcpStream::connect(&addr).await.unwrap();
    let partial = slow_client(&addr).await;
    within(time_to_close(silent, opened).await, 800, 2500);
    within(time_to_close(partial, opened).await, 800, 2500);
    // Between keep-alive requests, longer than a head may take is fine.
    let mut kept = TcpStream::connect(&addr).await.unwrap();
    health_over(&mut kept).await;
    // Time, not a barrier: 2 s between requests, past the header timeout.
    tokio::time::sleep(Duration::from_secs(2)).await;
    health_over(&mut kept).await;
    let answered = Instant::now();
    within(time_to_close(kept, answered).await, 2500, 4500);
    // A later head that stalls is bound by the header timeout.
    let mut stalled = TcpStream::connect(&addr).await.unwrap();
    health_over(&mut stalled).await;
    // Time, not a barrier: the next head starts after a pause.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stalled
        .write_all(b"GET /health HTTP/1.1\r\nHost: mneme\r\n")
        .await
        .unwrap();
    let began = Instant::now();
    within(time_to_close(stalled, began).await, 800, 2200);
    assert!(daemon.terminate().await.success());
}

/// At the cap, connections with a request in flight (a live stream, a long
/// poll) are never closed, nor cut by the idle timeout; with every
/// connection busy, a new one is refused and the daemon says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_connections_are_never_closed_and_a_full_house_refuses() {
    let slow = ["sh", "-c", "cat >/dev/null; sleep 4; echo ok"];
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("slow", json!({}))]),
            MockReply::answer("done"),
        ])
        .tools([command_tool("slow", &slow, "read_only", 10)])
        .await;
    let (world, agent) = (&bed.world, bed.agent_toml.clone());
    let command = DaemonProcess::command(
        &world.data(),
        &[
            "--max-connections",
            "2",
            "--header-timeout-secs",
            "1",
            "--idle-timeout-secs",
            "1",
        ],
    );
    let (daemon, log) = launch_logged(world, command).await;
    let http = fresh_client();
    let created: Value = http
        .post(daemon.url("/sessions"))
        .header("content-type", "application/toml")
        .body(agent)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["session"].as_str().unwrap().to_string();
    let streaming = reqwest::Client::builder()
        .build()
        .unwrap()
        .get(daemon.url(&format!("/sessions/{id}/events?follow=true")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let mut stream = streaming.bytes_stream();
    let mut seen = String::new();
    read_until(&mut stream, &mut seen, "SessionStarted").await;
    let poll = tokio::spawn(
        http.post(daemon.url(&format!("/sessions/{id}/messages")))
            .json(&json!({"text": "go", "wait": true}))
            .send(),
    );
    read_until(&mut stream, &mut seen, "ToolStarted").await;
    // Past the idle timeout: only the two busy connections are left.
    // Time, not a barrier: the idle timeout (1 s) runs out.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    match reqwest::Client::new()
        .get(daemon.url("/health"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
    {
        Ok(response) => {
            assert_eq!(response.status(), 503);
            let body: Value = response.json().await.unwrap();
            assert!(body["error"].as_str().unwrap().contains("busy"), "{body}");
        }
        Err(e) => assert!(!e.is_timeout(), "refused at once, not left waiting: {e}"),
    }
    let answered = poll.await.unwrap().unwrap();
    assert_eq!(answered.status(), 200);
    let end: Value = answered.json().await.unwrap();
    assert_eq!(end["answer"], "done", "{end}");
    read_until(&mut stream, &mut seen, "\"done\"").await;
    let text = std::fs::read_to_string(&log).unwrap();
    // An eviction may come first (the session's creation may still hold
    // its connection): it has a line of its own.
    let refusals: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("connection cap reached") && l.contains("every connection busy"))
        .collect();
    assert_eq!(refusals.len(), 1, "{text}");
    assert!(refusals[0].contains("1 refused"), "{text}");
    let health = http.get(daemon.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200, "room again once the long poll ended");
    drop(stream);
    assert!(daemon.terminate().await.success());
}

/// 100 approvals and 100 resolutions of sessions that do not exist
/// (finding 7): each a 404 naming the session, and nothing about them in
/// the daemon's output in the seconds after (it took a lease on each, then
/// tried to take each over once a second, forever). Returns the ids.
async fn decide_on_unknown_sessions(daemon: &DaemonProcess, log: &PathBuf) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for action in ["approve", "resolve"] {
        for _ in 0..100 {
            let id = Uuid::now_v7();
            let body = match action {
                "approve" => json!({"approved": true, "by": "ops"}),
                _ => json!({"retry": true, "by": "ops"}),
            };
            let (status, answer) = daemon
                .post(&format!("/sessions/{id}/calls/call_0_0/{action}"), &body)
                .await;
            assert_eq!(status, 404, "{action}: {answer}");
            assert!(
                answer["error"].as_str().unwrap().contains(&id.to_string()),
                "{answer}"
            );
            ids.push(id);
        }
    }
    // Time, not a barrier: nothing may be logged in the seconds after.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let text = std::fs::read_to_string(log).unwrap();
    for id in &ids {
        assert!(
            !text.contains(&id.to_string()),
            "{id} in the daemon's output: {text}"
        );
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_on_unknown_sessions_take_no_lease_and_log_nothing() {
    let world = World::new();
    let (daemon, log) = launch_logged(&world, DaemonProcess::command(&world.data(), &[])).await;
    decide_on_unknown_sessions(&daemon, &log).await;
    assert!(daemon.terminate().await.success());
}

/// The same on PostgreSQL, where leases are rows: none is written for the
/// unknown sessions, and a lapsed lease of a session without events, as
/// earlier versions left behind, is cleared once and quietly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_on_unknown_sessions_on_postgres_leave_no_lease_row() {
    let world = World::new();
    let store = pg_store();
    let (server, schema) = store.split_once("?schema=").unwrap();
    let command = DaemonProcess::command(&world.data(), &["--store", &store]);
    let (daemon, log) = launch_logged(&world, command).await;
    let (db, connection) = tokio_postgres::connect(server, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let leftover = Uuid::now_v7();
    db.execute(
        &format!(
            "INSERT INTO \"{schema}\".mneme_leases VALUES \
             ($1, 'daemon@gone:1:0', 1, now() - interval '1 minute', false)"
        ),
        &[&leftover],
    )
    .await
    .unwrap();
    let ids = decide_on_unknown_sessions(&daemon, &log).await;
    let rows: i64 = db
        .query_one(
            &format!("SELECT count(*) FROM \"{schema}\".mneme_leases WHERE session = ANY($1)"),
            &[&ids],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "lease rows of sessions that do not exist");
    let released: bool = db
        .query_one(
            &format!("SELECT released FROM \"{schema}\".mneme_leases WHERE session = $1"),
            &[&leftover],
        )
        .await
        .unwrap()
        .get(0);
    assert!(released, "the leftover lapsed lease was cleared");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(&leftover.to_string()), "{text}");
    assert!(daemon.terminate().await.success());
}

/// A non-loopback address is refused unless asked for, and then warned
/// about (finding 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_listen_address_needs_allow_public_and_is_warned_about() {
    let world = World::new();
    let mut command = world.mneme();
    command
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env("MNEME_TOKEN", TOKEN);
    let said = stderr(&refusal(command).await);
    assert!(
        said.contains("0.0.0.0:0") && said.contains("--allow-public"),
        "{said}"
    );
    let mut command = world.mneme();
    command
        .args(["serve", "--listen", "0.0.0.0:0", "--allow-public"])
        .env("MNEME_TOKEN", TOKEN)
        .kill_on_drop(true);
    let (daemon, log) = launch_logged(&world, command).await;
    let (status, _) = daemon.get("/sessions").await;
    assert_eq!(status, 200);
    assert!(daemon.terminate().await.success());
    let said = std::fs::read_to_string(log).unwrap();
    assert!(
        said.contains("plain HTTP") && said.contains("reachable from the network"),
        "{said}"
    );
}

/// Short tokens, from a file or the environment, and token files others
/// can read are refused, naming what (finding 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weak_tokens_and_readable_token_files_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let world = World::new();
    let serve = |token_file: Option<&PathBuf>, env: &str| {
        let mut command = world.mneme();
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("MNEME_TOKEN", env);
        if let Some(file) = token_file {
            command.arg("--token-file").arg(file);
        }
        refusal(command)
    };
    let out = serve(None, "x").await;
    assert!(
        stderr(&out).contains("MNEME_TOKEN") && stderr(&out).contains("16 bytes"),
        "{}",
        stderr(&out)
    );
    let short = world.write("short.token", "x\n");
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = serve(Some(&short), "").await;
    assert!(
        stderr(&out).contains(short.to_str().unwrap()) && stderr(&out).contains("16 bytes"),
        "{}",
        stderr(&out)
    );
    let open = world.write("open.token", "a-long-enough-token-0123456789\n");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = serve(Some(&open), "").await;
    let said = stderr(&out);
    assert!(
        said.contains(open.to_str().unwrap()) && said.contains("644") && said.contains("chmod 600"),
        "{said}"
    );
    // The same file, readable by its owner only, is taken.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut command =
        DaemonProcess::command(&world.data(), &["--token-file", open.to_str().unwrap()]);
    command.env_remove("MNEME_TOKEN");
    let daemon = DaemonProcess::launch(command, &world.data()).await;
    let response = reqwest::Client::new()
        .get(daemon.url("/sessions"))
        .bearer_auth("a-long-enough-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(daemon.terminate().await.success());
}

/// Extractor rejections answer `{"error": ...}` with the reason like every
/// other error (finding 14), and the CLI shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_json_with_its_reason() {
    let mut bed = Testbed::new()
        .replies(vec![MockReply::answer("hi")])
        .daemon_with(&["--max-body-bytes", "1024"])
        .await;
    let id = bed.create().await;
    let daemon = bed.take_daemon();
    let messages = daemon.url(&format!("/sessions/{id}/messages"));
    let http = &daemon.http;
    let cases = [
        (
            "too large",
            http.post(&messages)
                .header("content-type", "application/json")
                .body(format!("{{\"text\": \"{}\"}}", "x".repeat(2000))),
            413,
            "1024",
        ),
        (
            "wrong content type",
            http.post(&messages)
                .header("content-type", "text/plain")
                .body("{\"text\": \"hi\"}"),
            415,
            "application/json",
        ),
        (
            "wrong field type",
            http.post(&messages).json(&json!({"text": 5})),
            422,
            "text",
        ),
        (
            "not JSON",
            http.post(&messages)
                .header("content-type", "application/json")
                .body("{not json"),
            400,
            "key must be a string",
        ),
        (
            "not a session id",
            http.get(daemon.url("/sessions/not-a-uuid")),
            400,
            "UUID",
        ),
        (
            "bad query",
            http.get(daemon.url(&format!("/sessions/{id}/events?after=soon"))),
            400,
            "after",
        ),
        (
            "no such route",
            http.get(daemon.url("/nowhere")),
            404,
            "/nowhere",
        ),
        (
            "wrong method",
            http.delete(daemon.url("/health")),
            405,
            "DELETE",
        ),
    ];
    for (what, request, status, reason) in cases {
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{what}");
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(content_type, "application/json", "{what}");
        let body: Value = response.json().await.unwrap();
        let error = body["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: {body}"));
        assert!(error.contains(reason), "{what}: {error}");
    }
    let out = (bed.world.mneme())
        .args(["run", "--session", &id, &"y".repeat(2000)])
        .env("MNEME_TOKEN", TOKEN)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--max-body-bytes") && stderr(&out).contains("1024"),
        "the CLI shows the reason: {}",
        stderr(&out)
    );
    assert!(daemon.terminate().await.success());
}

/// The scheme is case-insensitive, tokens are trimmed on both sides, and
/// anything else is refused (finding 15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_check_takes_any_case_and_trims_tokens() {
    let world = World::new();
    let mut command = DaemonProcess::command(&world.data(), &[]);
    command.env("MNEME_TOKEN", format!("  {TOKEN} \n"));
    let daemon = DaemonProcess::launch(command, &world.data()).await;
    let plain = reqwest::Client::new();
    let status_with = |auth: String| {
        let request = plain
            .get(daemon.url("/sessions"))
            .header("authorization", auth);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    for scheme in ["Bearer", "bearer", "BEARER"] {
        assert_eq!(
            status_with(format!("{scheme} {TOKEN}")).await,
            200,
            "{scheme}"
        );
    }
    assert_eq!(status_with(format!("Bearer   {TOKEN}")).await, 200);
    let wrong_same_length = format!("{}X", &TOKEN[..TOKEN.len() - 1]);
    for refused in [
        format!("Basic {TOKEN}"),
        format!("Bearer{TOKEN}"),
        format!("Bearer {wrong_same_length}"),
        format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]),
        format!("Bearer {TOKEN}{TOKEN}"),
        "Bearer".to_string(),
    ] {
        assert_eq!(status_with(refused.clone()).await, 401, "{refused}");
    }
    // The CLI beside it, with the same spaced token, gets in too.
    let out = world
        .mneme()
        .arg("sessions")
        .env("MNEME_TOKEN", format!(" {TOKEN}  "))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(daemon.terminate().await.success());
}

/// A port already taken is reported by address, not as a session
/// (finding 16).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_is_named() {
    let world = World::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut command = world.mneme();
    command
        .args(["serve", "--listen", &addr])
        .env("MNEME_TOKEN", TOKEN);
    let said = stderr(&refusal(command).await);
    assert!(said.contains(&format!("cannot listen on {addr}")), "{said}");
    assert!(!said.contains("00000000"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_at_seq_0_says_what_to_give() {
    let mut bed = Testbed::new()
        .replies(vec![MockReply::answer("hi")])
        .daemon()
        .await;
    let id = bed.create().await;
    let daemon = bed.take_daemon();
    let (status, body) = daemon
        .post(&format!("/sessions/{id}/fork"), &json!({"at": 0}))
        .await;
    assert_eq!(status, 409, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("cannot fork at seq 0: give the seq of an event"),
        "{error}"
    );
    assert!(!error.contains("has 0 events"), "{error}");
    daemon.kill().await;
}

/// A signed-in browser may resume, but not queue turns without bound:
/// while a turn runs, resumes without `wait` are taken until four turns of
/// the session are asked for, then refused with 429 (each would have been a
/// task waiting for the session, about 12 KiB apiece, 20,000 of them
/// before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_while_a_turn_runs_are_refused_past_a_few() {
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("slow", json!({}))]),
            MockReply::answer("done"),
        ])
        .tools([command_tool(
            "slow",
            &["sh", "-c", "sleep 10; echo ok"],
            "read_only",
            30,
        )])
        .daemon()
        .await;
    let (daemon, id) = (bed.daemon(), bed.create().await);
    let (status, _) = daemon.message(&id, "go").await;
    assert_eq!(status, 202);
    let browser = daemon.sign_in("ada").await;
    let mut statuses = Vec::new();
    for _ in 0..40 {
        let (status, _) = browser
            .post(&format!("/sessions/{id}/resume"), &json!({}))
            .await;
        statuses.push(status);
    }
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((accepted, refused), (3, 37), "{statuses:?}");
    assert!(daemon.metric("mneme_turns_running").await <= 4);
}

/// `after` (or `Last-Event-ID`) at the largest seq there can be is a clear
/// 400, not an overflow (a panic that cut the connection in a debug build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_after_is_a_clear_error() {
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("done")])
        .daemon()
        .await;
    let (daemon, id) = (bed.daemon(), bed.create().await);
    let answer = (daemon.http)
        .get(daemon.url(&format!("/sessions/{id}/events?after={}", u64::MAX)))
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 400);
    let body = answer.text().await.unwrap();
    assert!(body.contains("after="), "{body}");
}
