//! Damage to the log is detected and named; nothing is served from a
//! damaged record.

use eventlog::{Envelope, Record};
use mneme_e2e::*;
use serde_json::json;

/// A finished session of three tool-using turns; returns (world, session).
async fn finished_session() -> (World, String) {
    let world = World::new();
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("lookup", json!({"n": 1}))]),
            MockReply::answer("UNIQUE-ANSWER-MARKER"),
        ],
        Fault::None,
    )
    .await;
    let tools = [command_tool(
        "lookup",
        &["sh", "-c", "cat >/dev/null; echo 42"],
        "read_only",
        10,
    )];
    let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &tools));
    // No snapshots: the marker is then only in the records themselves.
    let out = world
        .mneme()
        .args([
            "run",
            "--agent",
            agent.to_str().unwrap(),
            "UNIQUE-MESSAGE-MARKER",
        ])
        .env("MNEME_SNAPSHOT_EVERY", "0")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let session = session_id(&out);
    let verify = world.run(&["verify"]).await;
    assert!(
        verify.status.success(),
        "a fresh log verifies: {}",
        stdout(&verify)
    );
    (world, session)
}

fn event_key(session: &uuid::Uuid, seq: u64) -> Vec<u8> {
    let mut key = vec![b'e'];
    key.extend_from_slice(session.as_bytes());
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// Rewrites the stored record at `seq` through the storage engine, as a
/// tamperer with access to the files would.
fn rewrite(world: &World, session: &str, seq: u64, change: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let id: uuid::Uuid = session.parse().unwrap();
    let db = sled::open(world.data()).unwrap();
    let old = db.get(event_key(&id, seq)).unwrap().unwrap().to_vec();
    db.insert(event_key(&id, seq), change(old)).unwrap();
    db.flush().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn altered_record_is_named_by_verify_and_refused_by_log() {
    let (world, session) = finished_session().await;
    rewrite(&world, &session, 2, |mut bytes| {
        let at = bytes.windows(6).position(|w| w == b"UNIQUE").unwrap();
        bytes[at] = b'X';
        bytes
    });
    let out = world.run(&["verify"]).await;
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains(&session) && text.contains("seq 2") && text.contains("hash mismatch"),
        "{text}"
    );
    let out = world.run(&["log", &session]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("seq 2"), "{}", stderr(&out));
    // A listing reads summaries, not records: it still lists the session
    // (verify and log are what check the records).
    let out = world.run(&["sessions", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&session));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_record_with_valid_hash_breaks_the_chain() {
    let (world, session) = finished_session().await;
    // A forger re-seals record 3 with a new payload and a correct hash of
    // its own, but cannot make record 4 point at it.
    rewrite(&world, &session, 3, |bytes| {
        let record = Record::open(session.parse().unwrap(), 3, &bytes).unwrap();
        let forged = Envelope {
            payload: record.envelope.payload.iter().rev().copied().collect(),
            ..record.envelope
        };
        Record::seal(forged).unwrap().1
    });
    let out = world.run(&["verify", &session, "--json"]).await;
    assert_eq!(out.status.code(), Some(1));
    let line: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(line["ok"], false);
    let error = line["error"].as_str().unwrap();
    assert!(
        error.contains("seq 4") && error.contains("chain broken"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_byte_in_the_data_file_is_reported() {
    let (world, _session) = finished_session().await;
    let path = world.data().join("db");
    let mut bytes = std::fs::read(&path).unwrap();
    let marker = b"UNIQUE-MESSAGE-MARKER";
    let hits: Vec<usize> = (0..bytes.len() - marker.len())
        .filter(|&i| &bytes[i..i + marker.len()] == marker)
        .collect();
    assert!(!hits.is_empty(), "the message is in sled's data file");
    for at in hits {
        bytes[at + 3] ^= 0x20;
    }
    std::fs::write(&path, bytes).unwrap();
    // sled either refuses the damaged page, or recovers only what precedes
    // it, which the checkpoint anchor then refuses as a shortened log.
    let out = world.run(&["verify"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("corrupt") || err.contains("lost records"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_from_a_newer_format_is_refused_with_its_version() {
    let (world, session) = finished_session().await;
    rewrite(&world, &session, 1, |mut bytes| {
        bytes[0] = 7;
        bytes
    });
    let out = world.run(&["verify", &session]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("unknown format version 7"),
        "{}",
        stdout(&out)
    );
}

/// A session whose process died right after its last synced barrier: every
/// record is in the write-ahead file, none was checkpointed into sled.
async fn session_only_in_the_write_ahead_file() -> (World, String, MockModel) {
    let world = World::new();
    let model =
        MockModel::start(vec![MockReply::answer("UNIQUE-ANSWER-MARKER")], Fault::None).await;
    let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[]));
    let out = world
        .run_crashing(
            &["run", "--agent", agent.to_str().unwrap(), "hello"],
            "turn_answered",
        )
        .await;
    assert!(!out.status.success(), "the crash point must fire");
    let session = session_id(&out);
    let wal = std::fs::metadata(world.data().join("mneme.wal"))
        .unwrap()
        .len();
    assert!(wal > 0, "the records are in the write-ahead file");
    (world, session, model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_only_in_the_write_ahead_file_are_recovered() {
    let (world, session, _model) = session_only_in_the_write_ahead_file().await;
    let out = world.run(&["verify", &session]).await;
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).contains("3 events"), "{}", stdout(&out));
    assert_eq!(
        std::fs::metadata(world.data().join("mneme.wal"))
            .unwrap()
            .len(),
        0,
        "checkpointed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_inside_the_write_ahead_file_refuses_the_directory() {
    let (world, _session, _model) = session_only_in_the_write_ahead_file().await;
    let path = world.data().join("mneme.wal");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[5] ^= 0x01; // the length field of the first frame
    std::fs::write(&path, &bytes).unwrap();
    let out = world.run(&["verify"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("write-ahead file damaged at byte 0"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "a refused file is left as it was"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_write_is_set_aside_named_and_the_turn_redone() {
    let (world, session, model) = session_only_in_the_write_ahead_file().await;
    let path = world.data().join("mneme.wal");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let out = world.run(&["resume", &session]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("partial write (") && stderr(&out).contains("mneme.wal.torn-"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out).trim(), "UNIQUE-ANSWER-MARKER");
    assert_eq!(
        model.bodies().len(),
        2,
        "the lost reply was asked for again"
    );
    assert!(world.run(&["verify"]).await.status.success());
}
