//! A full disk: appends fail cleanly with a clear error, succeed again once
//! space returns, and nothing acknowledged is lost. Uses a real, small tmpfs
//! (CI runs as root; the test says so if it cannot mount one).

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use eventlog::{Durability, EventLog, LogError, NewEvent, SledLog};
use mneme_e2e::*;
use std::path::PathBuf;
use std::process::Command;

/// A tmpfs of `size` mounted on a fresh directory; unmounted when dropped.
struct SmallDisk {
    _dir: tempfile::TempDir,
    mount: PathBuf,
}

impl SmallDisk {
    fn new(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("disk");
        std::fs::create_dir(&mount).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mount)
            .output()
            .expect("the mount command");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs to fill a real disk and needs root (CI runs as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { _dir: dir, mount }
    }

    /// Bytes free on the disk (to an unprivileged user).
    fn free(&self) -> u64 {
        let path = std::ffi::CString::new(self.mount.as_os_str().as_encoded_bytes()).unwrap();
        let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: `path` is a C string; `stat` is read only after the call
        // succeeded and filled it.
        assert_eq!(
            unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) },
            0
        );
        let stat = unsafe { stat.assume_init() };
        stat.f_bavail * stat.f_frsize
    }

    /// Fills the disk with a file until at most `left` bytes are free.
    fn fill_leaving(&self, left: u64) -> PathBuf {
        use std::io::Write;
        let path = self.mount.join("filler-leaving");
        let mut file = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 64 << 10];
        while self.free() > left {
            file.write_all(&block).unwrap();
        }
        path
    }

    /// Fills the disk with a file until the kernel says ENOSPC.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.mount.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 4096];
        loop {
            if let Err(e) = file.write_all(&block) {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                return path;
            }
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

fn event(n: u64) -> NewEvent {
    NewEvent {
        kind: "Test".into(),
        schema: 1,
        caused_by: None,
        payload: vec![n as u8; 1000],
    }
}

/// What `error` says it comes from (the I/O error under a log error).
fn source_text(error: &LogError) -> String {
    std::error::Error::source(error)
        .map(|s| s.to_string())
        .unwrap_or_default()
}

async fn append_synced(log: &SledLog, session: uuid::Uuid, seq: u64) -> Result<(), LogError> {
    log.append(session, seq, vec![event(seq)]).await?;
    log.barrier(Durability::Synced).await
}

/// Reopens in this process. sled's background threads may hold its file
/// lock for a moment after the handle is dropped, so this waits up to 5 s.
fn reopen(data: &std::path::Path) -> SledLog {
    let what = format!("sled to release its lock on {}", data.display());
    eventually_blocking(
        what,
        std::time::Duration::from_secs(5),
        || match SledLog::open(data) {
            Err(e @ LogError::Locked { .. }) => Err(e),
            other => Ok(other.unwrap()),
        },
    )
}

#[tokio::test]
async fn appends_on_a_full_disk_fail_cleanly_and_resume_once_space_returns() {
    let disk = SmallDisk::new("8m");
    let data = disk.mount.join("data");
    let session = uuid::Uuid::now_v7();
    let log = SledLog::open(&data).unwrap();
    for seq in 1..=50 {
        append_synced(&log, session, seq).await.unwrap();
    }
    // Room for sled, and a little more than mneme keeps free: appends go
    // on, then are refused while sled still has that room.
    let filler = disk.fill_leaving(eventlog::MIN_FREE_BYTES + (512 << 10));
    let mut acknowledged = 50;
    let error = loop {
        match append_synced(&log, session, acknowledged + 1).await {
            Ok(()) => acknowledged += 1,
            Err(e) => break e,
        }
        assert!(acknowledged < 10_000, "the disk never filled");
    };
    let text = error.to_string();
    assert!(
        text.contains("mneme.wal"),
        "the error names the file: {text}"
    );
    let source = source_text(&error);
    assert!(source.contains("No space left on device"), "{source}");
    // Refused while sled still has room: sled cannot recover from a write
    // it could not make, and it must take the next append below.
    assert!(
        source.contains(&format!(
            "mneme keeps {} more free",
            eventlog::MIN_FREE_BYTES
        )),
        "{source}"
    );
    assert_eq!(
        log.head(session).await.unwrap().seq,
        acknowledged,
        "a failed append leaves no trace"
    );
    assert_eq!(
        log.read(session, 1, u64::MAX).await.unwrap().len() as u64,
        acknowledged
    );
    assert!(
        acknowledged > 50,
        "appends went on until the room kept free"
    );
    assert!(
        disk.free() >= eventlog::MIN_FREE_BYTES / 2,
        "sled still has room: {} bytes free",
        disk.free()
    );

    std::fs::remove_file(filler).unwrap();
    append_synced(&log, session, acknowledged + 1)
        .await
        .unwrap();
    drop(log);
    let log = reopen(&data);
    assert_eq!(
        log.verify(session).await.unwrap(),
        acknowledged + 1,
        "nothing acknowledged was lost"
    );
}

#[tokio::test]
async fn an_append_bigger_than_the_room_left_is_refused_before_sled_runs_out() {
    let disk = SmallDisk::new("48m");
    let data = disk.mount.join("data");
    let session = uuid::Uuid::now_v7();
    let log = SledLog::open(&data).unwrap();
    append_synced(&log, session, 1).await.unwrap();
    // Well above the room kept free, well below what a 9 MiB record takes
    // in the write-ahead file and in sled.
    disk.fill_leaving(14 << 20);
    let big = NewEvent {
        payload: (0..9u64 << 20)
            .map(|i| ((i * 2_654_435_761) >> 13) as u8)
            .collect(),
        ..event(2)
    };
    let error = log.append(session, 2, vec![big]).await.unwrap_err();
    let source = source_text(&error);
    assert!(
        source.contains("No space left on device") && source.contains("this append needs"),
        "{error}: {source}"
    );
    // sled never failed: appends go on, and the log closes (a checkpoint)
    // and opens again on the same nearly full disk.
    append_synced(&log, session, 2).await.unwrap();
    drop(log);
    let log = reopen(&data);
    assert_eq!(log.verify(session).await.unwrap(), 2);
}

#[tokio::test]
async fn a_disk_that_reports_no_size_is_not_taken_for_a_full_one() {
    // tmpfs with size=0 has no limit, and reports 0 blocks, 0 free.
    let disk = SmallDisk::new("0");
    assert_eq!(disk.free(), 0);
    let data = disk.mount.join("data");
    let session = uuid::Uuid::now_v7();
    let log = SledLog::open(&data).unwrap();
    for seq in 1..=3 {
        append_synced(&log, session, seq).await.unwrap();
    }
    assert_eq!(log.verify(session).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_on_a_full_disk_says_so_and_loses_nothing() {
    let disk = SmallDisk::new("8m");
    let data = disk.mount.join("data");
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("one"), MockReply::answer("two")])
        .await;
    let agent = &bed.agent;
    let run = |args: Vec<String>| {
        let mut command = tokio::process::Command::new(mneme_bin());
        command.arg("--data-dir").arg(&data).args(args);
        command
    };
    let out = run(vec![
        "run".into(),
        "--agent".into(),
        agent.display().to_string(),
        "hi".into(),
    ])
    .output()
    .await
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let session = session_id(&out);
    let filler = disk.fill();
    let out = run(vec![
        "run".into(),
        "--session".into(),
        session.clone(),
        "again".into(),
    ])
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("No space left on device"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(filler).unwrap();
    let out = run(vec!["verify".into(), session.clone()])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success() && stdout(&out).contains("3 events"),
        "{}",
        stdout(&out)
    );
    let out = run(vec![
        "run".into(),
        "--session".into(),
        session,
        "again".into(),
    ])
    .output()
    .await
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "two");
}
