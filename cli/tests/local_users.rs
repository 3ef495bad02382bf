//! What other local users can see: nothing. The data directory is its
//! owner's alone (0700, every file in it 0600), so is an export, and the
//! holder note names the command, never its arguments. A data directory
//! mneme cannot write is refused with what to do about it.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const MESSAGE: &str = "my api key is SECRET-MESSAGE-MARKER";

/// A world with one finished session.
async fn world_with_a_session() -> World {
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("noted")])
        .await;
    let out = bed.run_agent(MESSAGE).await;
    assert!(out.status.success(), "{}", stderr(&out));
    bed.world
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every file and directory under `dir` whose mode is not 0600 (files) or
/// 0700 (directories), with its mode.
fn loose(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let want = if path.is_dir() {
            found.extend(loose(&path));
            0o700
        } else {
            0o600
        };
        if mode(&path) != want {
            found.push((path.clone(), mode(&path)));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_an_export_and_the_holder_note_keep_to_their_owner() {
    let world = world_with_a_session().await;
    let data = world.data();
    assert_eq!(mode(&data), 0o700);
    let files = std::fs::read_dir(&data).unwrap().count();
    assert!(files >= 4, "sled's files and mneme's are there to check");
    assert_eq!(
        loose(&data),
        vec![],
        "every file 0600, every directory 0700"
    );
    let holder = std::fs::read_to_string(data.join("mneme.holder")).unwrap();
    assert!(
        holder.starts_with("pid ") && holder.ends_with(": mneme run"),
        "the pid, the program and the subcommand: {holder:?}"
    );
    assert!(!holder.contains("SECRET"), "{holder:?}");

    let export = world.dir.path().join("export.jsonl");
    let out = world.run(&["export", "-o", export.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let records = std::fs::read_to_string(&export).unwrap().lines().count();
    assert!(
        records >= 3,
        "the session's records are exported: {records}"
    );
    assert_eq!(mode(&export), 0o600);
    // An existing export file open to others is tightened as it is rewritten.
    std::fs::set_permissions(&export, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = world.run(&["export", "-o", export.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(&export), 0o600);

    // A data directory others can enter (made by an older mneme) is
    // tightened when it is opened.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = world.run(&["sessions"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(&data), 0o700);
    assert_eq!(loose(&data), vec![]);
}

/// The data directory made unwritable for mneme until dropped: mode 0500
/// for a user; for root, whom permissions do not stop, a read-only bind
/// mount of the directory onto itself.
struct Unwritable {
    dir: PathBuf,
    mounted: bool,
}

impl Unwritable {
    fn new(dir: &Path) -> Unwritable {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o500)).unwrap();
            return Unwritable {
                dir: dir.to_path_buf(),
                mounted: false,
            };
        }
        let mount = |args: &[&str]| {
            let out = std::process::Command::new("mount")
                .args(args)
                .arg(dir)
                .arg(dir)
                .output()
                .expect("the mount command");
            assert!(
                out.status.success(),
                "as root this test makes the data directory read-only with a bind mount (mount {}): {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        mount(&["--bind"]);
        let unwritable = Unwritable {
            dir: dir.to_path_buf(),
            mounted: true,
        };
        mount(&["-o", "remount,ro,bind"]);
        unwritable
    }
}

impl Drop for Unwritable {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount").arg(&self.dir).status();
        } else {
            let _ = std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_mneme_cannot_write_is_refused_saying_why_and_what_to_do() {
    let world = world_with_a_session().await;
    let data = world.data();
    let _unwritable = Unwritable::new(&data);
    let probe = data.join("probe");
    assert!(
        std::fs::write(&probe, "x").is_err(),
        "the data directory is unwritable for this test"
    );
    for command in [&["verify"][..], &["export"]] {
        let out = world.run(command).await;
        assert_eq!(out.status.code(), Some(1), "{command:?}");
        let err = stderr(&out);
        for expected in [
            &format!("data directory {} is not writable", data.display())[..],
            "opens a data directory read-write even to read it",
            "write-ahead file",
            "copy it somewhere writable",
        ] {
            assert!(err.contains(expected), "{command:?}: {expected:?} in {err}");
        }
        assert!(stdout(&out).is_empty(), "{command:?}: {}", stdout(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_tool_creates_files_with_its_users_umask_not_mnemes() {
    let umask = ["sh", "-c", "cat >/dev/null; umask"];
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("umask", serde_json::json!({}))]),
            MockReply::answer("done"),
        ])
        .tools([command_tool("umask", &umask, "read_only", 5)])
        .await;
    let out = bed.run_agent("go").await;
    assert!(out.status.success(), "{}", stderr(&out));
    // This process's umask, which the mneme it started inherited.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .unwrap()
        .trim()
        .to_string();
    assert_ne!(
        ours, "0077",
        "the test needs a umask other than mneme's own"
    );
    let bodies = bed.model.bodies();
    let last = String::from_utf8_lossy(bodies.last().unwrap());
    assert!(
        last.contains(&format!("\"content\":\"\\\"{ours}\\\"\"")),
        "the tool saw umask {ours}: {last}"
    );
}
