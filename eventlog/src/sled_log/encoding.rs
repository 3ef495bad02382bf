//! How records and metas are keyed and encoded in sled's tree.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredMeta {
    pub(super) head_seq: u64,
    pub(super) head_hash: Hash,
    pub(super) created_ms: i64,
    pub(super) updated_ms: i64,
    pub(super) last_kind: String,
    /// The records it shares, if it shares another session's (its first
    /// record of its own names them; kept here to be found in one lookup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) base: Option<crate::Base>,
}

/// The session and seq of a key made by [`seq_key`] (a record's or a
/// run's).
pub(super) fn parse_seq_key(key: &[u8]) -> (Uuid, u64) {
    let session = Uuid::from_slice(&key[1..17]).expect("a seq key holds a uuid");
    let seq = u64::from_be_bytes(key[17..25].try_into().expect("a seq key is 25 bytes"));
    (session, seq)
}

/// `prefix ‖ session ‖ seq` (big-endian): a session's keys of one kind
/// sort by seq.
pub(super) fn seq_key(prefix: u8, session: Uuid, seq: u64) -> [u8; 25] {
    let mut key = [0u8; 25];
    key[0] = prefix;
    key[1..17].copy_from_slice(session.as_bytes());
    key[17..].copy_from_slice(&seq.to_be_bytes());
    key
}

impl StoredMeta {
    pub(super) fn new(now: i64) -> StoredMeta {
        StoredMeta {
            head_seq: 0,
            head_hash: Hash::ZERO,
            created_ms: now,
            updated_ms: now,
            last_kind: String::new(),
            base: None,
        }
    }

    /// Records it stores as its own (not those it shares).
    pub(super) fn own_records(&self) -> u64 {
        self.head_seq - self.base.map_or(0, |b| b.through)
    }

    pub(super) fn advance(&mut self, record: &Record) {
        if let Some(base) = record.envelope.base {
            self.base = Some(base);
        }
        self.head_seq = record.envelope.seq;
        self.head_hash = record.hash;
        self.updated_ms = record.envelope.ts_ms;
        self.last_kind.clone_from(&record.envelope.kind);
    }
}

pub(super) fn event_key(session: Uuid, seq: u64) -> [u8; 25] {
    seq_key(EVENT_PREFIX, session, seq)
}

pub(super) fn derived_key(session: Uuid, name: &str) -> Vec<u8> {
    let mut key = vec![DERIVED_PREFIX];
    key.extend_from_slice(session.as_bytes());
    key.extend_from_slice(name.as_bytes());
    key
}

pub(super) fn meta_key(session: Uuid) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[0] = META_PREFIX;
    key[1..].copy_from_slice(session.as_bytes());
    key
}

pub(super) fn session_meta(session: Uuid, meta: StoredMeta) -> SessionMeta {
    SessionMeta {
        session,
        events: meta.head_seq,
        created_ms: meta.created_ms,
        updated_ms: meta.updated_ms,
        last_kind: meta.last_kind,
    }
}

pub(super) fn encode_meta(meta: &StoredMeta) -> Vec<u8> {
    rmp_serde::to_vec_named(meta).expect("session metadata always encodes")
}
