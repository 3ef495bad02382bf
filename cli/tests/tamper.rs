//! Damage to the log is detected and named; nothing is served from a
//! damaged record.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use eventlog::{Envelope, Record};
use mneme_e2e::*;
use serde_json::json;

/// A finished session of three tool-using turns; returns (world, session).
async fn finished_session() -> (World, String) {
    let lookup = ["sh", "-c", "cat >/dev/null; echo 42"];
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("lookup", json!({"n": 1}))]),
            MockReply::answer("UNIQUE-ANSWER-MARKER"),
        ])
        .tools([command_tool("lookup", &lookup, "read_only", 10)])
        .await;
    let world = &bed.world;
    // No snapshots: the marker is then only in the records themselves.
    let out = world
        .mneme()
        .args(["run", "--agent", bed.agent_arg(), "UNIQUE-MESSAGE-MARKER"])
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
    (bed.world, session)
}

/// Rewrites the stored record at `seq` in its segment file and re-points
/// its index entry, as a tamperer with access to the files would.
fn rewrite(world: &World, session: &str, seq: u64, change: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let id: uuid::Uuid = session.parse().unwrap();
    let log = eventlog::SledLog::open(world.data()).unwrap();
    log.rewrite_stored(id, seq, |old| Some(change(old)))
        .unwrap();
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
async fn flipped_byte_in_a_segment_file_is_reported() {
    let (world, session) = finished_session().await;
    let path = world.data().join("segments/00000000");
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(!bytes.is_empty(), "the records are in the segment");
    // Every byte of a segment belongs to a run; its records are checked
    // by their hashes once decompressed, if they decompress at all.
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&path, bytes).unwrap();
    let out = world.run(&["verify"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        said.contains(&session) && said.contains("corrupt"),
        "{said}"
    );
}

/// A run's index entry in sled that claims 4 GiB: refused as corrupt
/// before anything is read or allocated for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_entry_claiming_a_huge_run_is_refused_by_name() {
    let (world, session) = finished_session().await;
    {
        let db = eventlog::sled_config(&world.data()).open().unwrap();
        let (key, entry) = db.scan_prefix([b'r']).next().unwrap().unwrap();
        let mut entry = entry.to_vec();
        // segment u32, offset u64, length u32, uncompressed length u32, ...
        entry[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        db.insert(key, entry).unwrap();
        db.flush().unwrap();
    }
    let out = world.run(&["verify", &session]).await;
    assert_eq!(out.status.code(), Some(1));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        said.contains(&session) && said.contains("a run takes at most"),
        "{said}"
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

/// Bytes of the write-ahead file's header (magic, version, salt, checksum):
/// all an emptied file holds.
const WAL_HEADER: u64 = 20;

/// A session whose process died right after its last synced barrier: every
/// record is in the write-ahead file, none was checkpointed into sled.
async fn session_only_in_the_write_ahead_file() -> (Testbed, String) {
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("UNIQUE-ANSWER-MARKER")])
        .await;
    let world = &bed.world;
    let out = world
        .run_crashing(
            &["run", "--agent", bed.agent_arg(), "hello"],
            "turn_answered",
        )
        .await;
    assert!(!out.status.success(), "the crash point must fire");
    let session = session_id(&out);
    let wal = std::fs::metadata(world.data().join("mneme.wal"))
        .unwrap()
        .len();
    assert!(wal > WAL_HEADER, "the records are in the write-ahead file");
    (bed, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_only_in_the_write_ahead_file_are_recovered() {
    let (bed, session) = session_only_in_the_write_ahead_file().await;
    let world = &bed.world;
    let out = world.run(&["verify", &session]).await;
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).contains("3 events"), "{}", stdout(&out));
    assert_eq!(
        std::fs::metadata(world.data().join("mneme.wal"))
            .unwrap()
            .len(),
        WAL_HEADER,
        "checkpointed: the header alone is left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_inside_the_write_ahead_file_refuses_the_directory() {
    let (bed, _session) = session_only_in_the_write_ahead_file().await;
    let world = &bed.world;
    let path = world.data().join("mneme.wal");
    let mut bytes = std::fs::read(&path).unwrap();
    let first_frame = WAL_HEADER as usize;
    bytes[first_frame + 8] ^= 0x01; // its length field
    std::fs::write(&path, &bytes).unwrap();
    let out = world.run(&["verify"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!("write-ahead file damaged at byte {first_frame}")),
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
    let (bed, session) = session_only_in_the_write_ahead_file().await;
    let (world, model) = (&bed.world, &bed.model);
    let path = world.data().join("mneme.wal");
    let mut bytes = std::fs::read(&path).unwrap();
    // The last frame's last 10 bytes never reached the preallocated zeros.
    let end = frames_end(&bytes);
    assert!(end < bytes.len(), "the file is grown ahead of its frames");
    bytes[end - 10..end].fill(0);
    std::fs::write(&path, &bytes).unwrap();
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

/// Where the frames of a write-ahead file end: the zeros after them are
/// space it grew ahead.
fn frames_end(wal: &[u8]) -> usize {
    let salt = &wal[8..16];
    let mut at = WAL_HEADER as usize;
    while wal.get(at..at + 8) == Some(salt) {
        let len = u32::from_le_bytes(wal[at + 8..at + 12].try_into().unwrap());
        at += 20 + len as usize;
    }
    at
}

/// What an attacker who read mneme's source, but cannot read its data
/// directory, can put into a model reply: write-ahead frames in the old
/// format (magic, length, CRC-32 of key and value) and in the new one with
/// everything right but what they cannot know, the file's salt and the
/// previous frame's checksum (guessed). A reply is text, so each frame's
/// value is varied until its checksum's bytes are ASCII (NULs pass as
/// `\u0000` in JSON).
struct Forgery;

impl Forgery {
    const SALT_GUESS: [u8; 8] = *b"guessed!";
    const PREV_GUESS: [u8; 4] = *b"prev";
    const KEY: &'static [u8; 25] = b"eforged-session-and-seq!!";

    /// A frame in the old format (`magic`, `len`, `crc32(key ‖ value)`).
    fn v1() -> Vec<u8> {
        Forgery::ascii(|value| {
            let mut crc = crc32fast::Hasher::new();
            crc.update(Forgery::KEY);
            crc.update(value);
            let mut frame = 0x4d57_4c31u32.to_le_bytes().to_vec();
            frame.extend_from_slice(&Forgery::len(value).to_le_bytes());
            frame.extend_from_slice(&crc.finalize().to_le_bytes());
            frame
        })
    }

    /// A frame in the new format, at byte `offset` of the file, under `salt`
    /// after a frame whose checksum was `prev`.
    fn v2(salt: [u8; 8], offset: u64, prev: [u8; 4]) -> Vec<u8> {
        Forgery::ascii(|value| Forgery::v2_header(salt, offset, prev, Forgery::KEY, value))
    }

    /// The header of a new-format frame: `salt`, `len`, `prev`,
    /// `crc32(salt ‖ offset ‖ prev ‖ len ‖ key ‖ value)`.
    fn v2_header(salt: [u8; 8], offset: u64, prev: [u8; 4], key: &[u8], value: &[u8]) -> Vec<u8> {
        let len = (key.len() + value.len()) as u32;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&salt);
        crc.update(&offset.to_le_bytes());
        crc.update(&prev);
        crc.update(&len.to_le_bytes());
        crc.update(key);
        crc.update(value);
        let mut header = salt.to_vec();
        header.extend_from_slice(&len.to_le_bytes());
        header.extend_from_slice(&prev);
        header.extend_from_slice(&crc.finalize().to_le_bytes());
        header
    }

    fn len(value: &[u8]) -> u32 {
        (Forgery::KEY.len() + value.len()) as u32
    }

    /// `header(value) ‖ key ‖ value` for the first value whose frame is
    /// ASCII throughout.
    fn ascii(header: impl Fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
        (0u32..)
            .map(|n| {
                let value = format!("{{forged record {n:08x}}}").into_bytes();
                let mut frame = header(&value);
                frame.extend_from_slice(Forgery::KEY);
                frame.extend_from_slice(&value);
                frame
            })
            .find(|frame| frame.is_ascii())
            .expect("some value gives an ASCII checksum")
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A session killed right after a model reply carrying forged frames
/// reached the write-ahead file (and no further), the new-format forgery
/// made for the byte it landed at. Returns the world, the session, the
/// write-ahead file and where the forged frames end in it.
async fn reply_carrying_forged_frames() -> (World, String, Vec<u8>, usize) {
    // Where the frame lands depends on the records before it, which the
    // same lengths make the same: aim, look where it landed, aim there.
    let mut aim = 0;
    for _ in 0..3 {
        let v2 = Forgery::v2(Forgery::SALT_GUESS, aim, Forgery::PREV_GUESS);
        let frames = [Forgery::v1(), v2.clone()].concat();
        let reply = format!("here you go: {}", String::from_utf8(frames).unwrap());
        let bed = Testbed::new()
            .replies(vec![MockReply::answer(&reply)])
            .await;
        let world = &bed.world;
        let out = world
            .run_crashing(
                &["run", "--agent", bed.agent_arg(), "hello"],
                "model_reply_appended",
            )
            .await;
        assert!(!out.status.success(), "the crash point must fire");
        let session = session_id(&out);
        let wal = std::fs::read(world.data().join("mneme.wal")).unwrap();
        let landed = find(&wal, &v2).expect("the reply is in the write-ahead file");
        if landed as u64 == aim {
            return (bed.world, session, wal, landed + v2.len());
        }
        aim = landed as u64;
    }
    panic!("the forged frame never landed where it was aimed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_frames_inside_a_torn_last_record_are_not_taken_for_whole_ones() {
    let (world, session, wal, forged_end) = reply_carrying_forged_frames().await;
    // The last write torn right after the forged frames: the real frame
    // around them does not check out, and nothing genuine follows it.
    let path = world.data().join("mneme.wal");
    std::fs::write(&path, &wal[..forged_end]).unwrap();
    let out = world.run(&["verify"]).await;
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains(&session) && stdout(&out).contains("2 events"),
        "every record before the torn one is kept: {}",
        stdout(&out)
    );
    let warning = stderr(&out);
    assert!(
        warning.contains("partial write (") && warning.contains("mneme.wal.torn-"),
        "{warning}"
    );
    let aside = std::fs::read_dir(world.data())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("mneme.wal.torn-"))
        .expect("the torn tail is kept aside");
    assert!(
        find(&std::fs::read(aside).unwrap(), &Forgery::v1()).is_some(),
        "the torn tail holds the forged frames"
    );
    let out = world.run(&["sessions", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        (listed["session"].as_str(), listed["events"].as_u64()),
        (Some(session.as_str()), Some(2)),
        "{listed}"
    );
    // The forgery was as good as the format allows: with the file's own salt
    // and chain, the attacker's encoder writes exactly the file's first frame.
    assert_eq!(
        &wal[..8],
        b"MWAL\x03\0\0\0",
        "a file header with the format version"
    );
    let salt: [u8; 8] = wal[8..16].try_into().unwrap();
    let header_sum: [u8; 4] = wal[16..20].try_into().unwrap();
    let (frame, body) = (WAL_HEADER as usize, WAL_HEADER as usize + 20);
    let len = u32::from_le_bytes(wal[frame + 8..frame + 12].try_into().unwrap()) as usize;
    let (key, value) = wal[body..body + len].split_at(25);
    assert_eq!(
        Forgery::v2_header(salt, WAL_HEADER, header_sum, key, value),
        wal[frame..body],
        "the forged frames follow the format byte for byte, all but the salt"
    );
}

/// Hex digits to bytes.
fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// A history rewritten and chained again, as someone with write access to
/// the store can: record 2's message replaced, every later record sealed
/// anew with its link to the one before. Written to `into` as an export.
fn rechained(export: &str, into: &std::path::Path) {
    let mut prev = None;
    let mut out = String::new();
    for line in export.lines() {
        let mut row: serde_json::Value = serde_json::from_str(line).unwrap();
        let (session, seq) = (
            row["session"].as_str().unwrap(),
            row["seq"].as_u64().unwrap(),
        );
        let record = Record::open(
            session.parse().unwrap(),
            seq,
            &unhex(row["sealed"].as_str().unwrap()),
        )
        .unwrap();
        let mut envelope = record.envelope;
        if seq == 2 {
            let forged = replay::Event::UserMessage {
                text: "forged".into(),
            };
            envelope.payload = forged.encode();
        }
        envelope.prev_hash = prev.unwrap_or(envelope.prev_hash);
        let (record, sealed) = Record::seal(envelope).unwrap();
        row["prev_hash"] = json!(record.envelope.prev_hash.to_hex());
        row["hash"] = json!(record.hash.to_hex());
        row["sealed"] = json!(sealed
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>());
        prev = Some(record.hash);
        out.push_str(&format!("{row}\n"));
    }
    std::fs::write(into, out).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_chained_again_passes_verify_but_not_its_signed_heads() {
    let world = World::new();
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("signing.key");
    // The key stays outside the data directory.
    let inside = world.data().join("signing.key");
    let out = world
        .run(&["keygen", "--out", inside.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("outside the data directory"));
    let out = world.run(&["keygen", "--out", key.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let public = stdout(&out).trim().to_string();
    let other = keys.path().join("other.key");
    let other_public = stdout(
        &world
            .run(&["keygen", "--out", other.to_str().unwrap()])
            .await,
    )
    .trim()
    .to_string();

    let bed = Testbed::new()
        .in_world(world)
        .replies(vec![MockReply::answer("Hello.")])
        .await;
    let (world, agent) = (&bed.world, bed.agent_arg());
    let out = world
        .mneme()
        .args([
            "run",
            "--signing-key",
            key.to_str().unwrap(),
            "--agent",
            agent,
            "hi",
        ])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let session = session_id(&out);
    let out = world.run(&["verify", &session, "--key", &public]).await;
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("1 signed heads check out"),
        "{}",
        stdout(&out)
    );
    // A device named as the key is never read: refused as a key.
    let out = world.run(&["verify", &session, "--key", "/dev/zero"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("\"/dev/zero\": not 64 hex digits"),
        "{}",
        stderr(&out)
    );
    let out = world
        .run(&["verify", &session, "--key", &other_public])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("another key"), "{}", stdout(&out));

    // Rewritten and chained again: the chain holds, the signed head does not.
    let export = world.dir.path().join("export.jsonl");
    let out = world.run(&["export", "-o", export.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let forged = World::new();
    let forged_export = forged.dir.path().join("forged.jsonl");
    rechained(&std::fs::read_to_string(&export).unwrap(), &forged_export);
    let out = forged
        .run(&["import", forged_export.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = forged.run(&["verify", &session]).await;
    assert!(
        out.status.success(),
        "the chain alone is fooled: {}",
        stdout(&out)
    );
    let out = forged.run(&["verify", &session, "--key", &public]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("rewritten"), "{}", stdout(&out));
    // A session never signed is not vouched for.
    let unsigned = bed.run_agent("again").await;
    let unsigned = session_id(&unsigned);
    let out = world.run(&["verify", &unsigned, "--key", &public]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("no head signed"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_signs_each_turn_and_verify_through_it_checks_the_heads() {
    let world = World::new();
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("signing.key");
    let out = world.run(&["keygen", "--out", key.to_str().unwrap()]).await;
    let public = stdout(&out).trim().to_string();
    let mut bed = Testbed::new()
        .in_world(world)
        .replies(vec![
            MockReply::answer("Hello."),
            MockReply::answer("Again."),
        ])
        .daemon_with(&["--signing-key", key.to_str().unwrap()])
        .await;
    let id = bed.create().await;
    let (daemon, world) = (bed.take_daemon(), &bed.world);
    for text in ["one", "two"] {
        let (status, _) = daemon.message_and_wait(&id, text).await;
        assert_eq!(status, 200);
    }
    // Through the daemon that holds the data directory.
    let out = world
        .mneme()
        .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN)
        .args(["verify", &id, "--key", &public])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("2 signed heads check out"),
        "{}",
        stdout(&out)
    );
    assert!(daemon.terminate().await.success());
}
