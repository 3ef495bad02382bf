//! The daemon's benchmark: agent steps across concurrent sessions, the
//! daemon's memory with many idle sessions in its log, its memory after
//! forks of a large session, and the memory of a process that reads a log
//! larger than sled's page cache.
//!
//! Run: `cargo bench -p mneme-e2e --bench daemon` (`MNEME_BENCH_DIR` sets the
//! disk; default `target/bench-data`).

use eventlog::{Durability, EventLog, SledLog};
use mneme_e2e::bench::{
    agent_steps, bench_dir, bench_spec, block, daemon_address, incompressible_message, to_new_event,
};
use mneme_e2e::eventually_blocking;
use replay::{Event, ModelReply};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "MNEME_BENCH_DAEMON_CHILD";
/// Set for a child that reads a whole log: "DIR CACHE_MIB".
const READER_ENV: &str = "MNEME_BENCH_READER_CHILD";
/// The log the reader reads: sessions of ~1 KiB messages that do not
/// compress, 400 MB in all.
const READ_SESSIONS: usize = 200;
const READ_MESSAGES: usize = 2_000;
/// The forked session: ~1 KiB messages that do not compress, ~48 MB.
const FORKED_MESSAGES: usize = 48_000;
/// Forks of it, each at its head.
const FORKS: usize = 20;
/// How long the daemon idles after the forks before its RSS is read.
const IDLE_AFTER_FORKS: Duration = Duration::from_secs(5);

/// Fills `n` idle sessions (started, asked, answered).
fn fill_idle(dir: &Path, n: usize) {
    let log = SledLog::open(dir).unwrap();
    let spec = Event::SessionStarted {
        spec: Box::new(bench_spec("http://127.0.0.1:9/v1", "http://127.0.0.1:9/x")),
        tenant: None,
    };
    let events = [
        spec,
        Event::UserMessage {
            text: "What is the balance of account 42?".repeat(4),
        },
        Event::ModelReplied(ModelReply {
            content: Some("It is 1,234.56.".repeat(8)),
            finish_reason: "stop".into(),
            ..Default::default()
        }),
    ];
    for _ in 0..n {
        let new = events.iter().map(to_new_event).collect();
        block(log.append(uuid::Uuid::now_v7(), 1, new)).unwrap();
    }
    block(log.barrier(Durability::Synced)).unwrap();
}

/// Fills `READ_SESSIONS` sessions of `READ_MESSAGES` messages each.
fn fill_large(dir: &Path) {
    let log = SledLog::open(dir).unwrap();
    let mut seed = 7;
    for _ in 0..READ_SESSIONS {
        let session = uuid::Uuid::now_v7();
        for seq in (1..=READ_MESSAGES as u64).step_by(500) {
            let events = (0..500)
                .map(|_| incompressible_message(&mut seed, 1_000))
                .collect();
            block(log.append(session, seq, events)).unwrap();
        }
    }
    block(log.barrier(Durability::Synced)).unwrap();
}

/// Fills one session of `FORKED_MESSAGES` ~1 KiB messages that do not
/// compress (~48 MB); its id.
fn fill_forked(dir: &Path) -> uuid::Uuid {
    let log = SledLog::open(dir).unwrap();
    let session = uuid::Uuid::now_v7();
    let start = Event::SessionStarted {
        spec: Box::new(bench_spec("http://127.0.0.1:9/v1", "http://127.0.0.1:9/x")),
        tenant: None,
    };
    block(log.append(session, 1, vec![to_new_event(&start)])).unwrap();
    let mut seed = 11;
    for seq in (2..=FORKED_MESSAGES as u64 + 1).step_by(1000) {
        let events = (0..1000)
            .map(|_| incompressible_message(&mut seed, 1_000))
            .collect();
        block(log.append(session, seq, events)).unwrap();
    }
    block(log.barrier(Durability::Synced)).unwrap();
    session
}

/// What a daemon on `dir` holds around `FORKS` forks of `session` (at its
/// head, through the API): (RSS KiB before, peak RSS KiB, RSS KiB after
/// idling `IDLE_AFTER_FORKS`, seconds a fork).
fn daemon_after_forks(dir: &Path, session: uuid::Uuid) -> (u64, u64, u64, f64) {
    let (mut child, addr) = daemon_child(dir);
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_kib(child.id());
    let body = serde_json::json!({"at": FORKED_MESSAGES + 1});
    let started = Instant::now();
    for _ in 0..FORKS {
        let url = format!("http://{addr}/sessions/{session}/fork");
        assert!(
            http_post(&url, &body).contains("\"session\""),
            "fork refused"
        );
    }
    let per_fork = started.elapsed().as_secs_f64() / FORKS as f64;
    std::thread::sleep(IDLE_AFTER_FORKS);
    let (peak, after) = (status_kib(child.id(), "VmHWM:"), rss_kib(child.id()));
    child.kill().unwrap();
    child.wait().unwrap();
    (before, peak, after, per_fork)
}

/// `field` of `/proc/PID/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The reader child: opens the log in `dir` with `cache_mib` of sled page
/// cache, reads every record of every session twice, and prints its peak
/// RSS in KiB.
fn run_reader(dir: &str, cache_mib: u64) {
    let log = SledLog::open_with(dir, "bench", cache_mib << 20).unwrap();
    for _ in 0..2 {
        for meta in block(log.sessions()).unwrap() {
            let head = block(log.head(meta.session)).unwrap();
            block(log.read(meta.session, 1, head.seq)).unwrap();
        }
    }
    println!("{}", status_kib(std::process::id(), "VmHWM:"));
}

/// Peak RSS (KiB) of a reader child of `dir` with `cache_mib` of page cache.
fn reader_peak(dir: &Path, cache_mib: u64) -> u64 {
    let mut reader = std::process::Command::new(std::env::current_exe().unwrap());
    reader.env(READER_ENV, format!("{} {cache_mib}", dir.display()));
    mneme_e2e::stdout_of_success(&mut reader)
        .trim()
        .parse()
        .unwrap()
}

/// This benchmark started as a daemon child on `dir`, and its address once
/// it listens.
fn daemon_child(dir: &Path) -> (std::process::Child, String) {
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, dir)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (child, daemon_address(dir))
}

/// Starts this benchmark as a daemon child on `dir`; returns (RSS KiB once
/// every session's status is known, time to know them).
fn daemon_memory(dir: &Path, sessions: usize) -> (u64, Duration) {
    let started = Instant::now();
    let (mut child, addr) = daemon_child(dir);
    let wanted = format!("mneme_sessions{{status=\"idle\"}} {sessions}");
    eventually_blocking(&wanted, Duration::from_secs(600), || {
        sessions == 0 || http_get(&format!("http://{addr}/metrics")).contains(&wanted)
    });
    let took = started.elapsed();
    // Time, not a barrier: let allocators settle before the measurement.
    std::thread::sleep(Duration::from_millis(300));
    let rss = rss_kib(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    (rss, took)
}

/// GET `url` with the bench token; empty on any failure.
fn http_get(url: &str) -> String {
    http(reqwest::Client::new().get(url))
}

/// POST `body` to `url` with the bench token; empty on any failure.
fn http_post(url: &str, body: &serde_json::Value) -> String {
    http(reqwest::Client::new().post(url).json(body))
}

fn http(request: reqwest::RequestBuilder) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        match request.bearer_auth("bench").send().await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    })
}

fn run_child(dir: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir).unwrap());
        let config = daemon::DaemonConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            allow_public: false,
            data_dir: dir.into(),
            token: "bench".into(),
            token_file: None,
            agents_dir: None,
            durability: Durability::Synced,
            snapshot_every: runtime::store::SNAPSHOT_EVERY,
            shutdown_grace: Duration::from_secs(1),
            max_body_bytes: 1 << 20,
            max_parallel_calls: 64,
            max_running_turns: usize::MAX,
            header_timeout: Duration::from_secs(daemon::DEFAULT_HEADER_TIMEOUT_SECS),
            idle_timeout: Duration::from_secs(daemon::DEFAULT_IDLE_TIMEOUT_SECS),
            max_connections: daemon::DEFAULT_MAX_CONNECTIONS,
            owner: runtime::control::owner_name("bench"),
            signer: None,
            retain: None,
            tracer: None,
            lease_ttl: runtime::control::DEFAULT_TTL,
        };
        daemon::serve(log, config).await.unwrap();
    });
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        return run_child(&dir);
    }
    if let Ok(args) = std::env::var(READER_ENV) {
        let (dir, cache) = args.rsplit_once(' ').unwrap();
        return run_reader(dir, cache.parse().unwrap());
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `cargo bench -p mneme-e2e --bench daemon -- forks` runs that section only.
    let wanted: Vec<String> = (std::env::args().skip(1))
        .filter(|a| !a.starts_with("--"))
        .collect();
    let runs =
        |section: &str| wanted.is_empty() || wanted.iter().any(|w| section.contains(w.as_str()));
    println!("# mneme daemon benchmark");
    if runs("steps") {
        steps();
    }
    if runs("idle") {
        idle();
    }
    if runs("forks") {
        forks();
    }
    if runs("reader") {
        reader();
    }
}

fn steps() {
    let rt = mneme_e2e::bench::runtime();
    println!("\n## Agent steps across concurrent sessions (model reply + one side_effect HTTP call a step; loopback; synced)\n");
    println!("| sessions | steps/s |\n|---:|---:|");
    for sessions in [1usize, 16] {
        let log: Arc<dyn EventLog> =
            Arc::new(SledLog::open(bench_dir(&format!("steps-{sessions}"))).unwrap());
        let rate = rt.block_on(agent_steps(log, sessions, 100));
        println!("| {sessions} | {rate:.0} |");
    }
}

fn idle() {
    println!("\n## Daemon memory with idle sessions in the log (RSS once every session's status is known)\n");
    println!("| idle sessions | RSS | recovery scan |\n|---:|---:|---:|");
    for sessions in [0usize, 10_000] {
        let dir = bench_dir(&format!("idle-{sessions}"));
        fill_idle(&dir, sessions);
        let (rss, took) = daemon_memory(&dir, sessions);
        println!(
            "| {sessions} | {:.1} MiB | {:.0} ms |",
            rss as f64 / 1024.0,
            took.as_secs_f64() * 1e3
        );
    }
}

fn forks() {
    println!("\n## Daemon memory around {FORKS} forks of a ~{} MB session (at its head, through the API; RSS after {} s idle)\n", FORKED_MESSAGES / 1000, IDLE_AFTER_FORKS.as_secs());
    println!("| RSS before | peak RSS | RSS after, idle | a fork |\n|---:|---:|---:|---:|");
    let dir = bench_dir("forks");
    let session = fill_forked(&dir);
    let (before, peak, after, per_fork) = daemon_after_forks(&dir, session);
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "| {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.2} s |",
        mib(before),
        mib(peak),
        mib(after),
        per_fork
    );
}

fn reader() {
    let mb = READ_SESSIONS * READ_MESSAGES / 1000;
    println!("\n## Memory of a process that reads a log larger than sled's page cache ({READ_SESSIONS} sessions of {READ_MESSAGES} ~1 KiB messages that do not compress, ~{mb} MB; every record read twice)\n");
    println!("| page cache (`--sled-cache-mib`) | peak RSS |\n|---:|---:|");
    let dir = bench_dir("large-log");
    fill_large(&dir);
    let default = eventlog::DEFAULT_CACHE_BYTES >> 20;
    for cache_mib in [16, default, 1024] {
        let peak = reader_peak(&dir, cache_mib);
        let note = match cache_mib {
            1024 => " (sled's own default)",
            c if c == default => " (mneme's default)",
            _ => "",
        };
        println!(
            "| {cache_mib} MiB{note} | {:.0} MiB |",
            peak as f64 / 1024.0
        );
    }
}
