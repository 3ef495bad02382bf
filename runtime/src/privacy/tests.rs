use super::*;
use eventlog::SledLog;

const SECRET: &str = "a planted secret: 4111 1111 1111 1111";

fn master() -> MasterKey {
    MasterKey::from_bytes(&[7; 32])
}

fn events() -> Vec<NewEvent> {
    let event = |e: Event| NewEvent {
        kind: e.kind().into(),
        schema: replay::EVENT_SCHEMA,
        caused_by: None,
        payload: e.encode(),
    };
    vec![
        event(Event::UserMessage {
            text: SECRET.into(),
        }),
        event(Event::ApprovalRequested {
            call_id: "c1".into(),
            expires_at_ms: None,
        }),
    ]
}

fn decoded(records: &[Record]) -> Vec<Event> {
    records
        .iter()
        .map(|r| crate::session::decode(r).unwrap())
        .collect()
}

fn holds_secret(records: &[Record]) -> bool {
    records
        .iter()
        .any(|r| String::from_utf8_lossy(&r.envelope.payload).contains(SECRET))
}

#[tokio::test]
async fn content_is_stored_encrypted_and_reads_as_erased_once_the_key_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let raw: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path()).unwrap());
    let log = SealedLog::new(raw.clone(), Some(master()));
    let id = Uuid::now_v7();
    log.append(id, 1, events()).await.unwrap();
    log.side_store()
        .put_derived(id, "snapshot", SECRET.as_bytes())
        .await
        .unwrap();

    let stored = raw.read(id, 1, 2).await.unwrap();
    assert!(!holds_secret(&stored));
    assert_eq!(
        stored[0].envelope.schema,
        replay::EVENT_SCHEMA | SEALED_SCHEMA
    );
    assert_eq!(
        stored[1].envelope.schema,
        replay::EVENT_SCHEMA,
        "nothing to seal"
    );
    let derived = raw
        .side_store()
        .get_derived(id, "snapshot")
        .await
        .unwrap()
        .unwrap();
    assert!(!String::from_utf8_lossy(&derived).contains(SECRET));

    let read = log.read(id, 1, 2).await.unwrap();
    let original: Vec<Event> = events()
        .iter()
        .map(|e| Event::decode(e.schema, &e.payload).unwrap())
        .collect();
    assert_eq!(decoded(&read), original);
    assert_eq!(read[0].hash, stored[0].hash, "the hash is the stored one");
    assert_eq!(
        log.side_store()
            .get_derived(id, "snapshot")
            .await
            .unwrap()
            .as_deref(),
        Some(SECRET.as_bytes())
    );

    // Another process, without the master key, is told why it cannot read.
    let keyless = SealedLog::new(raw.clone(), None);
    let err = keyless.read(id, 1, 2).await.unwrap_err();
    assert!(err.to_string().contains("--master-key"), "{err}");

    log.side_store().destroy_key(id).await.unwrap();
    for reader in [&log, &SealedLog::new(raw.clone(), Some(master()))] {
        let erased = decoded(&reader.read(id, 1, 2).await.unwrap());
        assert_eq!(
            erased[0],
            Event::UserMessage {
                text: replay::ERASED.into()
            }
        );
        assert_eq!(erased[1], original[1]);
        assert_eq!(
            reader
                .side_store()
                .get_derived(id, "snapshot")
                .await
                .unwrap(),
            None
        );
    }
    assert_eq!(log.verify(id).await.unwrap(), 2, "the chain still holds");
}

/// A tenant's session's first append: its start (naming the tenant's
/// key slot) and a message.
fn tenant_session(slot: Uuid) -> Vec<NewEvent> {
    let spec: replay::AgentSpec =
        toml::from_str("name = \"t\"\n[model]\nprovider = \"scripted\"\nscript = \"x.json\"\n")
            .unwrap();
    let started = Event::SessionStarted {
        spec: Box::new(spec),
        tenant: Some(replay::Tenancy {
            name: "acme".into(),
            cache_salt: None,
            key: Some(slot),
        }),
    };
    let start = NewEvent {
        kind: started.kind().into(),
        schema: started.schema(),
        caused_by: None,
        payload: started.encode(),
    };
    [vec![start], events()].concat()
}

#[tokio::test]
async fn destroying_a_tenants_key_erases_every_session_of_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let raw: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path()).unwrap());
    let log = SealedLog::new(raw.clone(), Some(master()));
    let other = SealedLog::new(raw.clone(), Some(master()));
    let (slot, a, b, own) = (
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
    );
    log.append(a, 1, tenant_session(slot)).await.unwrap();
    log.append(b, 1, tenant_session(slot)).await.unwrap();
    log.append(own, 1, events()).await.unwrap();
    let wrapped = raw.side_store().get_key(a).await.unwrap().unwrap();
    assert_eq!(
        tenant_slot_of(&wrapped),
        Some(slot),
        "wrapped by the tenant's key"
    );
    assert!(raw.side_store().get_key(slot).await.unwrap().is_some());
    let text = |records: &[Record]| match crate::session::decode(&records[1]).unwrap() {
        Event::UserMessage { text } => text,
        other => panic!("{other:?}"),
    };
    for reader in [&log, &other] {
        for id in [a, b] {
            assert_eq!(text(&reader.read(id, 1, 3).await.unwrap()), SECRET);
        }
    }
    // The tenant's key goes: every session of it reads as erased, here
    // at once, in another process within the recheck.
    log.side_store().destroy_key(slot).await.unwrap();
    log.side_store()
        .put_key(slot, ERASED_TENANT_KEY)
        .await
        .unwrap();
    for id in [a, b] {
        assert_eq!(text(&log.read(id, 1, 3).await.unwrap()), replay::ERASED);
    }
    tokio::time::sleep(TENANT_KEY_RECHECK).await;
    for id in [a, b] {
        assert_eq!(text(&other.read(id, 1, 3).await.unwrap()), replay::ERASED);
        let fresh = SealedLog::new(raw.clone(), Some(master()));
        assert_eq!(text(&fresh.read(id, 1, 3).await.unwrap()), replay::ERASED);
        assert_eq!(log.verify(id).await.unwrap(), 3, "the chain still holds");
    }
    let stored: String = (raw.read(a, 1, 3).await.unwrap().iter())
        .map(|r| String::from_utf8_lossy(&r.envelope.payload).to_string())
        .collect();
    assert!(!stored.contains(SECRET));
    // The operator's own session is untouched; no session of the
    // tenant is written again.
    let own_first = crate::session::decode(&log.read(own, 1, 1).await.unwrap()[0]).unwrap();
    assert_eq!(
        own_first,
        Event::UserMessage {
            text: SECRET.into()
        }
    );
    let refused = log
        .append(Uuid::now_v7(), 1, tenant_session(slot))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("tenant was erased"),
        "{refused}"
    );
}

#[test]
fn hmac_sha256_is_rfc_4231s() {
    let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
    assert_eq!(
        hex::encode(mac),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

/// A reply to the request `body`, `bytes` long, with its digests.
fn reply_to(body: &str, bytes: u64) -> NewEvent {
    let event = Event::ModelReplied(replay::ModelReply {
        content: Some(SECRET.into()),
        request_digest: replay::digest_hex(body.as_bytes()),
        prefix_digest: replay::digest_hex(b"prefix"),
        request_bytes: bytes,
        ..Default::default()
    });
    NewEvent {
        kind: event.kind().into(),
        schema: replay::EVENT_SCHEMA,
        caused_by: None,
        payload: event.encode(),
    }
}

fn digests(records: &[Record]) -> Vec<(String, u64)> {
    (decoded(records).into_iter())
        .map(|event| match event {
            Event::ModelReplied(r) => (r.request_digest, r.request_bytes),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// The digest of an erased request must not be matched against
/// guesses (a 4-digit PIN was found in 10 ms from an unkeyed SHA-256):
/// a sealed session's digests are keyed by its key, equal within the
/// session, different across sessions, and its sizes rounded.
#[tokio::test]
async fn a_sealed_sessions_digests_are_keyed_and_its_sizes_rounded() {
    let dir = tempfile::tempdir().unwrap();
    let raw: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path()).unwrap());
    let log = SealedLog::new(raw.clone(), Some(master()));
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    let pin = "my pin is 4821";
    let plain = replay::digest_hex(pin.as_bytes());
    log.append(a, 1, vec![reply_to(pin, 1000), reply_to(pin, 1)])
        .await
        .unwrap();
    log.append(b, 1, vec![reply_to(pin, 256)]).await.unwrap();
    let (in_a, in_b) = (
        digests(&log.read(a, 1, 2).await.unwrap()),
        digests(&log.read(b, 1, 1).await.unwrap()),
    );
    assert_eq!(in_a[0].0, in_a[1].0, "equal requests, equal digests");
    assert_ne!(in_a[0].0, in_b[0].0, "another session, another key");
    assert_ne!(in_a[0].0, plain);
    assert_eq!([in_a[0].1, in_a[1].1, in_b[0].1], [1024, 256, 256]);
    log.side_store().destroy_key(a).await.unwrap();
    let outlines = raw.read(a, 1, 2).await.unwrap();
    let stored: String = outlines
        .iter()
        .map(|r| String::from_utf8_lossy(&r.envelope.payload).to_string())
        .collect();
    assert!(!stored.contains(&plain), "no unkeyed digest in the store");
    assert_eq!(digests(&log.read(a, 1, 2).await.unwrap())[0].0, in_a[0].0);
    // A session written in the clear keeps its plain digests.
    let clear = Uuid::now_v7();
    SealedLog::new(raw.clone(), None)
        .append(clear, 1, vec![reply_to(pin, 1000)])
        .await
        .unwrap();
    assert_eq!(
        digests(&raw.read(clear, 1, 1).await.unwrap()),
        [(plain, 1000)]
    );
}

#[tokio::test]
async fn without_a_master_key_sessions_are_written_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let raw: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path()).unwrap());
    let id = Uuid::now_v7();
    SealedLog::new(raw.clone(), None)
        .append(id, 1, events())
        .await
        .unwrap();
    assert!(holds_secret(&raw.read(id, 1, 2).await.unwrap()));
    assert_eq!(raw.side_store().get_key(id).await.unwrap(), None);
    // A master key given later leaves an older session in the clear.
    let later = SealedLog::new(raw.clone(), Some(master()));
    later.append(id, 3, events()).await.unwrap();
    assert!(holds_secret(&raw.read(id, 3, 4).await.unwrap()));
}

#[tokio::test]
async fn a_record_moved_to_another_seq_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let raw: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path()).unwrap());
    let log = SealedLog::new(raw.clone(), Some(master()));
    let id = Uuid::now_v7();
    log.append(id, 1, events()).await.unwrap();
    let mut record = raw.read(id, 1, 1).await.unwrap().remove(0);
    record.envelope.seq = 2;
    let key = log.key(id).await.unwrap();
    let err = SealedLog::open(&key, record).unwrap_err();
    assert!(err.to_string().contains("do not open"), "{err}");
}

#[test]
fn a_master_key_inside_the_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    MasterKey::generate(&path).unwrap();
    MasterKey::load(&path, None).unwrap();
    let err = MasterKey::load(&path, Some(dir.path())).unwrap_err();
    assert!(
        err.to_string().contains("inside the data directory"),
        "{err}"
    );
}
