//! `mneme serve` at its edges (issue #10: the model and the tools are
//! untrusted input, and so are the daemon's clients). Each test drives the
//! real binary the way the finding was found.

use mneme_e2e::daemon::TOKEN;
use mneme_e2e::*;
use std::time::Duration;

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
