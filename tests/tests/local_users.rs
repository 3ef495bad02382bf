//! What other local users can see: nothing. The data directory is its
//! owner's alone (0700, every file in it 0600), so is an export, and the
//! holder note names the command, never its arguments.

use mneme_e2e::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const MESSAGE: &str = "my api key is SECRET-MESSAGE-MARKER";

/// A world with one finished session.
async fn world_with_a_session() -> World {
    let world = World::new();
    let model = MockModel::start(vec![MockReply::answer("noted")], Fault::None).await;
    let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[]));
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), MESSAGE])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    world
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
