//! The floor under a durable agent step on this machine: the side-by-side
//! harness's step with mneme's own work taken out, for benchmarks that
//! state mneme as a fraction of it, measured in the same run.
//!
//! A floor step is only what the write-ahead rules leave: a record written
//! and `fdatasync`ed (the call's intent, before the tool runs), the tool's
//! HTTP POST to the peers' Node sink (`tests/benches/sink.mjs`, a copy of
//! the one the side-by-side harness uses), and a second record written and
//! synced (the result, before the model sees it). No model reply is built,
//! no event encoded, hashed or folded, no prompt rendered, no API served.
//! Sessions run at once share one file and its `fdatasync`s (group commit,
//! as mneme's log does).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A floor record's bytes: about a sealed ModelReplied or ToolFinished.
const RECORD: usize = 700;
/// Steps of the one-session round (as the side-by-side harness runs).
pub const SINGLE_STEPS: usize = 500;
/// Sessions of the concurrent round.
pub const SESSIONS: usize = 16;
/// Steps of each session of the concurrent round.
pub const SESSION_STEPS: usize = 200;

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
pub struct NodeSink {
    child: std::process::Child,
    /// Where a step POSTs (`http://127.0.0.1:PORT/post`).
    pub url: String,
}

impl NodeSink {
    /// Starts `node tests/benches/sink.mjs PORT` (`MNEME_SINK` names another
    /// script) and returns once it listens.
    pub fn start() -> NodeSink {
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
        crate::eventually_blocking(what, std::time::Duration::from_secs(30), || {
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

/// Floor steps/s of `sessions` sessions of `steps` steps each, run at
/// once, in a fresh file of the bench directory `name`.
pub fn round(sink: &NodeSink, sessions: usize, steps: usize, name: &str) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let log = Arc::new(Log::create(&crate::bench::bench_dir(name)));
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
