//! PostgreSQL stopped at once (`pg_ctl -m immediate`, its crash) while a
//! daemon on it takes sessions: after the server comes back, every session
//! and message the daemon acknowledged is there, every chain verifies, and
//! the daemon goes on. The server's own durability is PostgreSQL's; this is
//! mneme's view of it. The test runs on a cluster of its own
//! (`scripts/with-postgres.sh` around a command that waits), since it stops
//! the server.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::scenario::log_events;
use mneme_e2e::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

/// A PostgreSQL cluster of this test's own, stopped with its wrapper.
struct Cluster {
    wrapper: tokio::process::Child,
    url: String,
    ctl: String,
    options: String,
}

impl Cluster {
    async fn start() -> Cluster {
        let script = repo_root().join("scripts/with-postgres.sh");
        let mut wrapper = tokio::process::Command::new(script)
            .args([
                "sh",
                "-c",
                "env | grep '^MNEME_TEST_PG'; echo ready; exec sleep 600",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(wrapper.stdout.take().unwrap()).lines();
        let mut vars = BTreeMap::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "ready" {
                break;
            }
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.to_string(), v.to_string());
            }
        }
        let var = |k: &str| {
            vars.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("{k} not exported: {vars:?}"))
        };
        Cluster {
            url: format!("{}?schema=immediate", var("MNEME_TEST_PG")),
            ctl: var("MNEME_TEST_PG_CTL"),
            options: var("MNEME_TEST_PG_OPTIONS"),
            wrapper,
        }
    }

    fn pg_ctl(&self, args: &str) {
        let status = std::process::Command::new("sh")
            .args(["-c", &format!("{} {args} >/dev/null", self.ctl)])
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl {args}");
    }
}

impl Drop for Cluster {
    /// SIGTERM: the wrapper stops the cluster and removes its files.
    fn drop(&mut self) {
        if let Some(pid) = self.wrapper.id() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_stop_mid_load_loses_nothing_acknowledged() {
    let cluster = Cluster::start().await;
    let world = World {
        store: Some(cluster.url.clone()),
        ..World::new()
    };
    let model = MockModel::start(vec![MockReply::answer("Hello.")], Fault::None).await;
    let daemon = DaemonProcess::start(&world.data(), &["--store", &cluster.url]).await;
    let spec: Value = toml::from_str(&agent_toml(&model.base_url(), &[])).unwrap();
    // Workers start sessions with their first message, then run their
    // turns; what the daemon acknowledged (201) is noted.
    let acknowledged = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let refused = Arc::new(Mutex::new(0usize));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (http, base, spec) = (daemon.http.clone(), daemon.base.clone(), spec.clone());
        let (acknowledged, refused, stop) = (acknowledged.clone(), refused.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let text = format!("worker {worker} message {n}");
                let created = http
                    .post(format!("{base}/sessions"))
                    .json(&json!({"spec": spec, "first_message": text}))
                    .send()
                    .await;
                match created {
                    Ok(r) if r.status() == 201 => {
                        let id = r.json::<Value>().await.unwrap()["session"]
                            .as_str()
                            .unwrap()
                            .to_string();
                        let _ = http
                            .post(format!("{base}/sessions/{id}/resume"))
                            .json(&json!({}))
                            .send()
                            .await;
                        acknowledged.lock().unwrap().push((id, text));
                    }
                    _ => {
                        *refused.lock().unwrap() += 1;
                        // Time, not a barrier: a refused client waits a
                        // moment before it tries again, as a real one would.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    // Time, not a barrier: the load runs for a while before the stop, and
    // the server stays down for a while, so the stop lands mid-load and
    // requests meet a server that is gone.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = acknowledged.lock().unwrap().len();
    tokio::task::block_in_place(|| cluster.pg_ctl("-m immediate stop"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| cluster.pg_ctl(&format!("-o \"{}\" start", cluster.options)));
    // The daemon goes on once the server is back.
    let what = "8 sessions acknowledged after the restart";
    eventually(what, Duration::from_secs(20), || async {
        let now = acknowledged.lock().unwrap().len();
        if now >= before + 8 {
            Ok(())
        } else {
            Err(format!("{} since the stop", now - before))
        }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    let refused = *refused.lock().unwrap();
    assert!(
        refused > 0,
        "the stop landed mid-load: some requests failed"
    );
    for (id, text) in &acknowledged {
        let events = log_events(&world, id).await;
        let kinds: Vec<&Value> = events.iter().take(2).map(|e| &e["kind"]).collect();
        assert_eq!(kinds, ["SessionStarted", "UserMessage"], "{id}");
        assert_eq!(
            events[1]["event"]["UserMessage"]["text"],
            text.as_str(),
            "{id}"
        );
    }
    let verify = world.run(&["verify"]).await;
    assert!(verify.status.success(), "{}", stdout(&verify));
    mneme_e2e::scenario::report(&format!(
        "PostgreSQL immediate stop: sessions acknowledged {} ({before} before the stop), requests refused while it was down {refused}, acknowledged lost 0",
        acknowledged.len()
    ));
    drop(daemon);
}
