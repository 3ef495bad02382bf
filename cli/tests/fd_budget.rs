//! The daemon's open files (issue #32, medium 9): outbound connections are
//! inside its open-file budget. Found with one `reqwest::Client` per
//! session, each keeping its connection to the model server for 90 s: under
//! `nofile` 256 the 240th session failed with EMFILE and the daemon stopped
//! accepting connections. Each test runs a daemon under a low open-file
//! limit against one loopback model server and samples, throughout, the
//! daemon's open files (`/proc/PID/fd`) and its `/health`.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use futures_util::StreamExt;
use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::hostile::{completion, streamed_text, Answer, HostileModel};
use mneme_e2e::*;
use serde_json::Value;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The daemon's open-file limit (soft and hard) in these tests.
const FILES: u64 = 256;

/// Sessions each test runs a turn of.
const SESSIONS: usize = 300;

/// `mneme serve` on `data` under an open-file limit of `files`, its stderr
/// in `log`.
async fn limited_daemon(data: &Path, log: &Path, files: u64) -> DaemonProcess {
    let mut command = DaemonProcess::command(data, &[]);
    // SAFETY: setrlimit(2) is async-signal-safe and changes only the child.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: files,
                rlim_max: files,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    DaemonProcess::launch_logged(command, data, log).await
}

/// Files the process `pid` has open now.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| fds.count())
}

/// What a [`Watch`] saw.
#[derive(Debug)]
struct Seen {
    /// The most files the daemon had open at once.
    most_files: usize,
    /// `/health` answers, and the ones that were not 200 (or none came).
    health: usize,
    unhealthy: Vec<String>,
}

/// Samples the daemon's open files and asks its `/health` (a fresh
/// connection each time, as a load balancer does) every 20 ms until
/// stopped.
struct Watch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Seen>,
}

impl Watch {
    fn start(daemon: &DaemonProcess) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let (pid, health) = (daemon.pid(), daemon.url("/health"));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let probe = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap();
            let mut seen = Seen {
                most_files: 0,
                health: 0,
                unhealthy: Vec::new(),
            };
            while !stopped.load(Ordering::SeqCst) {
                seen.most_files = seen.most_files.max(open_files(pid));
                match probe.get(&health).send().await {
                    Ok(answer) if answer.status() == 200 => seen.health += 1,
                    Ok(answer) => seen.unhealthy.push(format!("HTTP {}", answer.status())),
                    Err(e) => seen.unhealthy.push(format!("{e:?}")),
                }
                // Time, not a barrier: the pace of the probe.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seen
        });
        Watch { stop, task }
    }

    async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// Creates [`SESSIONS`] sessions of `agent_toml`, a few at a time.
async fn sessions(daemon: &DaemonProcess, agent_toml: &str) -> Vec<String> {
    futures_util::stream::iter(0..SESSIONS)
        .map(|_| daemon.create(agent_toml))
        .buffer_unordered(8)
        .collect()
        .await
}

/// Asserts that a refusal is the open-file budget's: 503, naming the limit.
fn assert_refused_for_files(status: u16, body: &Value) {
    let said = body["error"].as_str().unwrap_or_default();
    assert_eq!(status, 503, "{body}");
    assert!(
        said.contains("near its open-file limit") && said.contains(&format!("of {FILES})")),
        "{body}"
    );
}

/// Asserts the daemon said nothing of running out of files.
fn assert_never_out_of_files(stderr: &str) {
    for sign in ["Too many open files", "os error 24", "EMFILE"] {
        assert!(
            !stderr.contains(sign),
            "the daemon ran out of files:\n{stderr}"
        );
    }
}

/// 300 sessions, each a model turn against one loopback model server, 16
/// at a time, under 256 open files: every turn is answered (model
/// connections come from one pool and few stay open between turns), no
/// file descriptor runs out, `/health` answers throughout, and the daemon's
/// open files stay under the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_sessions_under_256_open_files_each_get_their_turn() {
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("done")])
        .await;
    let log = bed.world.dir.path().join("daemon.log");
    let daemon = limited_daemon(&bed.world.data(), &log, FILES).await;
    let idle = open_files(daemon.pid());
    let watch = Watch::start(&daemon);
    let ids = sessions(&daemon, &bed.agent_toml).await;
    let ends: Vec<(u16, Value)> = futures_util::stream::iter(&ids)
        .map(|id| daemon.message_and_wait(id, "hello"))
        .buffer_unordered(16)
        .collect()
        .await;
    let seen = watch.stop().await;
    let after = open_files(daemon.pid());
    let stderr = daemon.terminate_with_output().await;
    assert_never_out_of_files(&stderr);
    for (status, end) in &ends {
        assert_eq!(
            (*status, end["status"].as_str(), end["answer"].as_str()),
            (200, Some("idle"), Some("done")),
            "{end}\n{stderr}"
        );
    }
    assert!(seen.unhealthy.is_empty() && seen.health > 0, "{seen:?}");
    assert!(seen.most_files < FILES as usize, "{seen:?}");
    // Between turns the pool keeps few connections to the model server
    // (at most 8 idle a host): not one a session.
    assert!(
        after < idle + 40,
        "{after} files open after the turns, {idle} before"
    );
    println!(
        "{SESSIONS} turns under nofile {FILES}: {idle} files open before, at most {} during, {after} after; /health answered {} times",
        seen.most_files, seen.health
    );
}

/// Turns against a model server that holds every answer, started one
/// after another until the daemon's open files would run out: the turn
/// that would is refused with 503 naming the limit (nothing recorded), as
/// is every one after; `/health` answers throughout, the daemon's open files
/// stay under the limit, and once the server answers, every accepted turn
/// is answered and a refused session takes its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_past_the_open_file_budget_are_refused_with_503_and_health_answers() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let open = Arc::new(AtomicBool::new(false));
    let (held, opened) = (gate.clone(), open.clone());
    let model = HostileModel::start(move |_, _, _| match opened.load(Ordering::SeqCst) {
        true => Answer::Json(completion(Some("done"), &[])),
        false => Answer::Stream {
            events: streamed_text(&["do", "ne"], "stop"),
            gate: Some(held.clone()),
            then_stall: false,
        },
    })
    .await;
    let bed = Testbed::new().model_url(&model.base_url()).await;
    let log = bed.world.dir.path().join("daemon.log");
    let daemon = limited_daemon(&bed.world.data(), &log, FILES).await;
    let ids = sessions(&daemon, &bed.agent_toml).await;
    let watch = Watch::start(&daemon);
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    for id in &ids {
        let (status, body) = daemon.message(id, "hello").await;
        match status {
            202 => accepted.push(id.clone()),
            _ => {
                assert_refused_for_files(status, &body);
                refused.push((id.clone(), body));
            }
        }
    }
    let held_files = open_files(daemon.pid());
    let seen = watch.stop().await;
    assert!(
        !refused.is_empty(),
        "all {SESSIONS} turns were accepted while the model server held every answer"
    );
    assert!(!accepted.is_empty(), "{:?}", refused[0].1);
    assert!(seen.unhealthy.is_empty() && seen.health > 0, "{seen:?}");
    assert!(seen.most_files < FILES as usize, "{seen:?}");
    // A refused session recorded nothing.
    let (first_refused, said) = &refused[0];
    let (_, session) = daemon.get(&format!("/sessions/{first_refused}")).await;
    assert_eq!(session["answer"], Value::Null, "{session}");
    println!(
        "with every answer held: {} turns accepted, {} refused ({}), {held_files} files open, at most {} sampled",
        accepted.len(),
        refused.len(),
        said["error"],
        seen.most_files
    );
    // The server answers: every accepted turn finishes.
    open.store(true, Ordering::SeqCst);
    for id in &accepted {
        let what = format!("session {id} to be answered");
        eventually(what, Duration::from_secs(30), || async {
            gate.notify_waiters();
            let (_, session) = daemon.get(&format!("/sessions/{id}")).await;
            match (session["status"].as_str(), session["answer"].as_str()) {
                (Some("idle"), Some("done")) => Ok(()),
                _ => Err(session.to_string()),
            }
        })
        .await;
    }
    let (status, end) = daemon.message_and_wait(first_refused, "hello").await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("done")),
        "{end}"
    );
    assert_never_out_of_files(&daemon.terminate_with_output().await);
}
