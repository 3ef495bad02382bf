//! Stores written by an earlier build open in this one. The fixtures under
//! `tests/fixtures/upgrade/` are frozen, one directory a format: `v1/` was
//! written by the build of 2026-12-01 (event schema 1), `v2/` by the build
//! of 2026-12-05 (event schema 11, forks sharing their parent's records,
//! every record its own key in sled). Each holds a sled data directory, an
//! export, and a
//! PostgreSQL dump of the same sessions (one that went through a call in
//! doubt, a resolve, an approval and two turns; and a fork of it with
//! another agent). Every later build must: open each, `verify` it, rebuild
//! each session's prompt byte for byte, export every record byte for byte,
//! and continue the session.
//!
//! `MNEME_BLESS_UPGRADE=1` writes the fixtures of [`NEWEST`] (with
//! `scripts/with-postgres.sh`): only when a new format version starts a new
//! directory, never to make an old one pass.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The fixtures a blessing writes: the newest frozen format.
const NEWEST: &str = "v2";

/// Where the agent files lived when the fixtures of `version` were written:
/// the log records the scripts' absolute paths, so the test puts them back
/// there.
fn agent_dir(version: &str) -> String {
    format!("/tmp/mneme-upgrade-fixture-{version}")
}

fn fixture(version: &str) -> PathBuf {
    fixtures().join("upgrade").join(version)
}

/// The sessions of the fixture: (main, fork).
fn sessions(version: &str) -> (String, String) {
    let ids: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(version).join("sessions.json")).unwrap(),
    )
    .unwrap();
    let id = |k: &str| ids[k].as_str().unwrap().to_string();
    (id("main"), id("fork"))
}

/// Puts the agent files and scripts where the log says they are.
fn place_agent_files(version: &str) {
    let dir = agent_dir(version);
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["agent.toml", "branch.toml", "replies.json", "branch.json"] {
        std::fs::copy(fixture(version).join(name), Path::new(&dir).join(name)).unwrap();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        match entry.file_type().unwrap().is_dir() {
            true => copy_dir(&entry.path(), &target),
            false => {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
}

async fn ok(world: &World, args: &[&str]) -> String {
    let out = world.run(args).await;
    assert!(out.status.success(), "mneme {args:?}: {}", stderr(&out));
    stdout(&out)
}

async fn raw_request(world: &World, id: &str) -> Vec<u8> {
    let out = world.run(&["replay", "--raw", id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    out.stdout
}

/// What every later build must do with a store holding the fixture.
async fn holds_the_fixture(world: &World, version: &str, what: &str) {
    let (main, fork) = sessions(version);
    ok(world, &["verify"]).await;
    for (id, name) in [(&main, "request-main.bin"), (&fork, "request-fork.bin")] {
        let expected = std::fs::read(fixture(version).join(name)).unwrap();
        assert!(
            raw_request(world, id).await == expected,
            "{version} {what}: the prompt of {id} is not rebuilt byte for byte"
        );
    }
    let export = world.dir.path().join("export.jsonl");
    ok(world, &["export", "-o", export.to_str().unwrap()]).await;
    let expected = std::fs::read_to_string(fixture(version).join("export.jsonl")).unwrap();
    let exported = std::fs::read_to_string(&export).unwrap();
    assert!(
        exported == expected,
        "{version} {what}: the export differs from the one the fixture was written with"
    );
    // The session goes on: the script's next reply.
    let answer = ok(world, &["run", "--session", &main, "Still there?"]).await;
    assert_eq!(answer.trim(), "Still here.", "{version} {what}");
    ok(world, &["verify", &main]).await;
}

/// The frozen format versions, oldest first.
const VERSIONS: [&str; 2] = ["v1", NEWEST];

#[tokio::test]
async fn sled_data_directories_of_every_version_open_verify_and_go_on() {
    if bless() {
        return;
    }
    for version in VERSIONS {
        place_agent_files(version);
        let world = World::new();
        copy_dir(&fixture(version).join("sled"), &world.data());
        holds_the_fixture(&world, version, "sled").await;
    }
}

#[tokio::test]
async fn exports_of_every_version_import_and_go_on() {
    if bless() {
        return;
    }
    for version in VERSIONS {
        place_agent_files(version);
        let world = World::new();
        let export = fixture(version).join("export.jsonl");
        ok(&world, &["import", export.to_str().unwrap()]).await;
        holds_the_fixture(&world, version, "export").await;
    }
}

#[tokio::test]
async fn postgres_dumps_of_every_version_restore_verify_and_go_on() {
    if bless() {
        return;
    }
    for version in VERSIONS {
        place_agent_files(version);
        let world = World::on_postgres();
        let store = world.store.clone().unwrap();
        let dump = std::fs::read_to_string(fixture(version).join("pg.sql")).unwrap();
        psql(&store, &dump.replace(SCHEMA, schema_of(&store)));
        holds_the_fixture(&world, version, "PostgreSQL").await;
    }
}

/// The schema name the dump was written with, replaced on restore.
const SCHEMA: &str = "mneme_upgrade_fixture";

fn schema_of(store: &str) -> &str {
    store.split("schema=").nth(1).unwrap()
}

/// Runs `sql` on the server of `store` (psql, from the PostgreSQL that
/// `scripts/with-postgres.sh` installs).
fn psql(store: &str, sql: &str) {
    use std::io::Write;
    let server = store.split('?').next().unwrap();
    let mut child = std::process::Command::new("psql")
        .args([server, "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("psql (PostgreSQL's client) runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sql.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "psql failed");
}

fn bless() -> bool {
    std::env::var_os("MNEME_BLESS_UPGRADE").is_some()
}

/// Writes the fixtures (with `MNEME_BLESS_UPGRADE=1`).
#[tokio::test]
async fn write_the_fixtures_when_blessing() {
    if !bless() {
        return;
    }
    let dir = fixture(NEWEST);
    assert!(
        !dir.join("sled").exists(),
        "{} exists: fixtures are frozen; start a new version directory",
        dir.display()
    );
    std::fs::create_dir_all(&dir).unwrap();
    write_agent_files(&dir);
    place_agent_files(NEWEST);
    let world = World::new();
    let agent = format!("{}/agent.toml", agent_dir(NEWEST));
    // A call in doubt (a side effect that ignores keys, killed as it
    // started), resolved; then a call that waits for approval, approved.
    let crashed = world
        .run_crashing(
            &["run", "--agent", &agent, "Note it, then refund order 7."],
            "tool_started_durable",
        )
        .await;
    let main = session_id(&crashed);
    let resumed = world.run(&["resume", &main]).await;
    assert_eq!(resumed.status.code(), Some(3), "{}", stderr(&resumed));
    let resolved = world
        .run(&[
            "resolve",
            &main,
            "call_1_0",
            "--skip",
            "--result",
            "{\"noted\":true}",
        ])
        .await;
    assert_eq!(resolved.status.code(), Some(3), "{}", stderr(&resolved));
    let answer = ok(&world, &["approve", &main, "call_2_0"]).await;
    assert_eq!(answer.trim(), "Noted and refunded.");
    ok(&world, &["run", "--session", &main, "Thanks."]).await;
    // A fork after the first answer, on another agent.
    let first_answer = mneme_e2e::scenario::log_events(&world, &main)
        .await
        .into_iter()
        .find(|e| e["event"]["ModelReplied"]["content"] == "Noted and refunded.")
        .unwrap()["seq"]
        .to_string();
    let branch = format!("{}/branch.toml", agent_dir(NEWEST));
    let fork = ok(
        &world,
        &["fork", &main, "--at", &first_answer, "--agent", &branch],
    )
    .await;
    let fork = fork.trim().to_string();
    ok(&world, &["run", "--session", &fork, "And otherwise?"]).await;
    std::fs::write(
        dir.join("sessions.json"),
        serde_json::json!({"main": main, "fork": fork}).to_string(),
    )
    .unwrap();
    for (id, name) in [(&main, "request-main.bin"), (&fork, "request-fork.bin")] {
        std::fs::write(dir.join(name), raw_request(&world, id).await).unwrap();
    }
    let export = dir.join("export.jsonl");
    ok(&world, &["export", "-o", export.to_str().unwrap()]).await;
    copy_dir(&world.data(), &dir.join("sled"));
    let _ = std::fs::remove_file(dir.join("sled/mneme.holder"));
    // The same sessions in PostgreSQL, dumped with a schema name to replace.
    let pg = World::on_postgres();
    ok(&pg, &["import", export.to_str().unwrap()]).await;
    let store = pg.store.clone().unwrap();
    let dump = stdout_of_success(std::process::Command::new("pg_dump").args([
        store.split('?').next().unwrap(),
        "--schema",
        schema_of(&store),
        "--no-owner",
        "--no-privileges",
    ]));
    std::fs::write(dir.join("pg.sql"), dump.replace(schema_of(&store), SCHEMA)).unwrap();
}

/// The agent files and scripts the fixtures were written with.
fn write_agent_files(out: &Path) {
    let note = "cat >/dev/null; echo '{\"noted\":true}'";
    let refund = "cat >/dev/null; echo '{\"refunded\":7}'";
    let agent = format!(
        "name = \"upgrade\"\nsystem = \"You keep notes and refund orders.\"\n[model]\nprovider = \"scripted\"\nmodel = \"m\"\nscript = \"replies.json\"\n\
         [[tools]]\nname = \"note\"\ndescription = \"Keep a note\"\nkind = \"command\"\ncommand = [\"sh\", \"-c\", {note:?}]\neffect = \"side_effect\"\n\
         [[tools]]\nname = \"refund\"\ndescription = \"Refund an order\"\nkind = \"command\"\ncommand = [\"sh\", \"-c\", {refund:?}]\neffect = \"side_effect\"\nhonours_idempotency_key = true\nrequires_approval = true\n"
    );
    std::fs::write(out.join("agent.toml"), &agent).unwrap();
    let branch = agent
        .replace("You keep notes and refund orders.", "You only keep notes.")
        .replace("replies.json", "branch.json");
    std::fs::write(out.join("branch.toml"), branch).unwrap();
    let replies = serde_json::json!({"replies": [
        {"tool_calls": [{"name": "note", "arguments": {"text": "order 7"}}]},
        {"tool_calls": [{"name": "refund", "arguments": {"order": 7}}]},
        {"content": "Noted and refunded."},
        {"content": "You are welcome."},
        {"content": "Still here."},
    ]});
    std::fs::write(out.join("replies.json"), replies.to_string()).unwrap();
    let branch = serde_json::json!({"replies": [
        {}, {}, {},
        {"content": "Otherwise, only a note."},
    ]});
    std::fs::write(out.join("branch.json"), branch.to_string()).unwrap();
}
