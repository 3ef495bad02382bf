//! `mneme serve` at its edges (issue #10: the model and the tools are
//! untrusted input, and so are the daemon's clients). Each test drives the
//! real binary the way the finding was found.

use mneme_e2e::daemon::{DaemonProcess, TOKEN};
use mneme_e2e::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;
use uuid::Uuid;

/// Starts `command` (a `mneme serve` on the world's data directory) with its
/// stderr in a file; returns the daemon and the file.
async fn launch_logged(
    world: &World,
    mut command: tokio::process::Command,
) -> (DaemonProcess, PathBuf) {
    let log = world.dir.path().join("daemon.log");
    command.stderr(std::fs::File::create(&log).unwrap());
    (DaemonProcess::launch(command, &world.data()).await, log)
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
    let world = World::new();
    let model = MockModel::start(vec![MockReply::answer("hi")], Fault::None).await;
    let daemon = DaemonProcess::start(&world.data(), &["--max-body-bytes", "1024"]).await;
    let id = daemon.create(&agent_toml(&model.base_url(), &[])).await;
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
    let out = world
        .mneme()
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
