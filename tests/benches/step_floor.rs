//! The floor under a durable agent step on this machine: what the
//! side-by-side bench's step costs with mneme's own work taken out.
//!
//! A step here is only what the write-ahead rules leave: a record written
//! and `fdatasync`ed (the call's intent, before the tool runs), the
//! tool's HTTP POST to the peers' Node sink (`tests/benches/sink.mjs`, a
//! copy of the one the side-by-side harness uses for mneme and Restate),
//! and a second record written and synced (the result, before the model
//! sees it). No model reply is built, no event encoded, hashed or folded,
//! no prompt rendered, no API served. A runtime that keeps those rules
//! cannot step faster than this; the side-by-side targets are ratios to
//! Restate, so this says which ratios this machine allows at all.
//!
//! Run: `cargo bench -p mneme-e2e --bench step_floor` (needs `node`; env
//! `MNEME_SINK` names another sink script, `MNEME_BENCH_DIR` another disk).
//! Prints steps/s for one session (500 steps, three rounds) and for 16
//! sessions of 200 steps at once, whose records share one file and its
//! `fdatasync`s (group commit, as mneme's log does).

use mneme_e2e::bench::bench_dir;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// About the size of a sealed ModelReplied or ToolFinished record.
const RECORD: usize = 700;
const SINGLE_STEPS: usize = 500;
const SESSIONS: usize = 16;
const SESSION_STEPS: usize = 200;
const ROUNDS: usize = 3;

/// One file that records are appended to, with group commit: a sync
/// covers every record written before it started.
struct Log {
    file: std::fs::File,
    written: AtomicU64,
    synced: tokio::sync::Mutex<u64>,
    append: Mutex<()>,
}

impl Log {
    fn create(dir: &Path) -> Log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.join("floor.log"))
            .unwrap();
        Log {
            file,
            written: AtomicU64::new(0),
            synced: tokio::sync::Mutex::new(0),
            append: Mutex::new(()),
        }
    }

    /// Writes one record and returns once it is on stable storage.
    async fn durable(self: &Arc<Log>, record: &[u8]) {
        let end = {
            let _one_writer = self.append.lock().unwrap();
            let at = self.written.load(Ordering::Relaxed);
            self.file.write_all_at(record, at).unwrap();
            let end = at + record.len() as u64;
            self.written.store(end, Ordering::Relaxed);
            end
        };
        let mut synced = self.synced.lock().await;
        if *synced >= end {
            return;
        }
        let target = self.written.load(Ordering::Relaxed);
        let log = self.clone();
        tokio::task::spawn_blocking(move || log.file.sync_data().unwrap())
            .await
            .unwrap();
        *synced = target;
    }
}

/// The peers' Node sink, started on a free port; killed when dropped.
struct NodeSink {
    child: std::process::Child,
    url: String,
}

impl NodeSink {
    fn start() -> NodeSink {
        let script = std::env::var_os("MNEME_SINK")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/sink.mjs"));
        assert!(
            script.exists(),
            "the sink script {} is missing (set MNEME_SINK)",
            script.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("node")
            .arg(&script)
            .arg(port.to_string())
            .spawn()
            .unwrap_or_else(|e| panic!("starting `node {}`: {e}", script.display()));
        let address = format!("127.0.0.1:{port}");
        let what = format!("the node sink to listen on {address}");
        mneme_e2e::eventually_blocking(what, std::time::Duration::from_secs(30), || {
            std::net::TcpStream::connect(&address)
                .map(drop)
                .map_err(|e| e.to_string())
        });
        NodeSink {
            child,
            url: format!("http://{address}/post"),
        }
    }
}

impl Drop for NodeSink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `steps` floor steps of one session; `key` keeps idempotency keys apart.
async fn session(log: Arc<Log>, client: reqwest::Client, url: String, key: String, steps: usize) {
    let record = vec![b'r'; RECORD];
    for i in 0..steps {
        log.durable(&record).await;
        let reply = client
            .post(&url)
            .header("idempotency-key", format!("{key}-{i}"))
            .json(&serde_json::json!({ "i": i }))
            .send()
            .await
            .unwrap();
        assert!(
            reply.status().is_success(),
            "the sink answered {}",
            reply.status()
        );
        reply.bytes().await.unwrap();
        log.durable(&record).await;
    }
}

/// Steps/s of `sessions` sessions of `steps` steps each, run at once.
fn round(sink: &NodeSink, sessions: usize, steps: usize, name: &str) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let log = Arc::new(Log::create(&bench_dir(name)));
    let client = reqwest::Client::new();
    runtime.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..sessions)
            .map(|s| {
                let key = format!("{name}-{s}");
                tokio::spawn(session(
                    log.clone(),
                    client.clone(),
                    sink.url.clone(),
                    key,
                    steps,
                ))
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        (sessions * steps) as f64 / start.elapsed().as_secs_f64()
    })
}

fn main() {
    let sink = NodeSink::start();
    // Warm the sink's JIT, the connection pool and the disk path first.
    round(&sink, 1, SINGLE_STEPS, "floor-warm-up");
    println!("## The floor under a durable step (write + fdatasync, the tool's POST to the Node sink, write + fdatasync; nothing of mneme's own)\n");
    println!("| round | 1 session × {SINGLE_STEPS} steps, steps/s | {SESSIONS} sessions × {SESSION_STEPS} steps, steps/s |\n|---:|---:|---:|");
    for r in 1..=ROUNDS {
        let single = round(&sink, 1, SINGLE_STEPS, &format!("floor-single-{r}"));
        let many = round(&sink, SESSIONS, SESSION_STEPS, &format!("floor-many-{r}"));
        println!("| {r} | {single:.0} | {many:.0} |");
    }
}
