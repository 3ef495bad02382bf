//! sled's page cache is bounded by `--sled-cache-mib`: a daemon that reads
//! more than the cache holds reads evicted pages from disk again instead of
//! keeping them. Drives the real binary over a real sled data directory,
//! and watches what the daemon reads from its files (`/proc/PID/io`).

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use eventlog::{Durability, EventLog, SledLog};
use mneme_e2e::bench::{bench_spec, incompressible_message, to_new_event};
use mneme_e2e::daemon::DaemonProcess;
use std::path::Path;
use uuid::Uuid;

/// Messages in the session after its start, about 1 KiB each: ~40 MB and
/// a few thousand of sled's pages. sled's cache evicts only once it has
/// counted about 16,000 page reads, so a verify (two passes over the
/// session) is repeated until it has.
const MESSAGES: u64 = 40_000;
const VERIFIES: usize = 6;

/// Writes a session of a start, `MESSAGES` messages and an answer (a
/// session at rest: the daemon has nothing to resume) into `dir`.
async fn fill(dir: &Path) -> Uuid {
    let log = SledLog::open(dir).unwrap();
    let session = Uuid::now_v7();
    let start = replay::Event::SessionStarted {
        spec: Box::new(bench_spec("http://127.0.0.1:9/v1", "http://127.0.0.1:9/x")),
        tenant: None,
    };
    log.append(session, 1, vec![to_new_event(&start)])
        .await
        .unwrap();
    let mut seed = 7;
    for seq in (2..MESSAGES + 2).step_by(500) {
        let events = (0..500)
            .map(|_| incompressible_message(&mut seed, 1_000))
            .collect();
        log.append(session, seq, events).await.unwrap();
    }
    let answer = replay::Event::ModelReplied(replay::ModelReply {
        content: Some("done".into()),
        finish_reason: "stop".into(),
        ..Default::default()
    });
    log.append(session, MESSAGES + 2, vec![to_new_event(&answer)])
        .await
        .unwrap();
    log.barrier(Durability::Synced).await.unwrap();
    session
}

/// Bytes process `pid` has read with read(2) and its kin.
fn bytes_read(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("rchar in /proc/PID/io")
}

/// A daemon on `data` with `cache_mib` of sled page cache verifies
/// `session` `VERIFIES` times: the bytes it read during the last verify.
async fn last_verify_reads(data: &Path, session: Uuid, cache_mib: u64) -> u64 {
    let daemon = DaemonProcess::start(data, &["--sled-cache-mib", &cache_mib.to_string()]).await;
    let mut last = 0;
    for _ in 0..VERIFIES {
        let before = bytes_read(daemon.pid());
        let (status, verified) = daemon.get(&format!("/sessions/{session}/verify")).await;
        assert_eq!(status, 200, "{verified}");
        assert_eq!(verified["ok"], true, "{verified}");
        assert_eq!(verified["events"], MESSAGES + 2, "{verified}");
        last = bytes_read(daemon.pid()) - before;
    }
    daemon.terminate().await;
    last
}

#[tokio::test]
async fn a_daemon_reads_pages_past_its_page_cache_from_disk_again_instead_of_keeping_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let session = fill(&data).await;
    let small = last_verify_reads(&data, session, 4).await;
    let large = last_verify_reads(&data, session, 1024).await;
    eprintln!(
        "bytes read by the last of {VERIFIES} verifies: {} MB with a 4 MiB cache, {} MB with 1 GiB",
        small / 1_000_000,
        large / 1_000_000
    );
    assert!(
        small > 20_000_000,
        "with a 4 MiB cache, a verify of a ~40 MB session read only {small} bytes: pages were kept"
    );
    assert!(
        large < 1_000_000,
        "with a 1 GiB cache, the session's pages stay cached, yet a verify read {large} bytes"
    );
}

#[test]
fn a_page_cache_of_nothing_or_past_a_tib_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (flag, env) in [
        (Some("0"), None),
        (Some("1048577"), None),
        (None, Some("lots")),
    ] {
        let mut command = std::process::Command::new(mneme_e2e::mneme_bin());
        command.arg("--data-dir").arg(&data).arg("sessions");
        if let Some(value) = flag {
            command.args(["--sled-cache-mib", value]);
        }
        if let Some(value) = env {
            command.env("MNEME_SLED_CACHE_MIB", value);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--sled-cache-mib"), "{stderr}");
        assert!(!data.exists(), "refused before the data directory is made");
    }
}
