//! A daemon keeps no records in memory once they are checkpointed: it reads
//! them from the segment files each time, whatever `--sled-cache-mib` says
//! (sled's page cache holds the segments' index, heads and snapshots).
//! Drives the real binary over a real data directory, and watches what the
//! daemon reads from its files (`/proc/PID/io`).

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use eventlog::{Durability, EventLog, SledLog};
use mneme_e2e::bench::{bench_spec, incompressible_message, to_new_event};
use mneme_e2e::daemon::DaemonProcess;
use std::path::Path;
use uuid::Uuid;

/// Messages in the session after its start, about 1 KiB each and
/// hardly compressible: ~28 MB of segment files. A verify is repeated, so a
/// cache that kept what it read would have it all by the last one.
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
async fn a_daemon_reads_records_from_the_segment_files_whatever_its_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let session = fill(&data).await;
    let segments: u64 = std::fs::read_dir(data.join("segments"))
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        segments > 20_000_000,
        "the records are in segment files: {segments} bytes"
    );
    for cache_mib in [4, 1024] {
        let read = last_verify_reads(&data, session, cache_mib).await;
        eprintln!(
            "bytes read by the last of {VERIFIES} verifies, {cache_mib} MiB of cache: {} MB \
             (segment files: {} MB)",
            read / 1_000_000,
            segments / 1_000_000
        );
        assert!(
            read >= segments,
            "with {cache_mib} MiB of cache, a verify of a session of {segments} bytes of \
             segments read only {read} bytes: records were kept in memory"
        );
    }
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
