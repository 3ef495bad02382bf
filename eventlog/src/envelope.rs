//! The envelope around every event, its stored form and its hash.
//!
//! Stored form of a record: one format byte ([`RECORD_FORMAT`], or
//! [`RECORD_FORMAT_BASED`] for the first record of a session that shares
//! another's records), the envelope
//! as MessagePack with named fields, then the 32-byte SHA-256 hash of
//! `prev_hash ‖ envelope bytes`. The hash covers the exact stored bytes, never
//! a re-encoding. SHA-256 rather than BLAKE3: records are about one KiB, where
//! BLAKE3's parallelism does not apply and SHA-256 runs on the CPU's SHA
//! instructions, about three times faster (measured on this project's VMs),
//! and every record is hashed again on every read.

use crate::LogError;
use serde::{Deserialize, Serialize};
use std::fmt;
use uuid::Uuid;

/// Version of the stored record layout this build writes and reads.
pub const RECORD_FORMAT: u8 = 1;

/// The stored layout of a record whose envelope names a [`Base`]: the first
/// record of a session that shares another's records up to a seq. A build
/// that knows only [`RECORD_FORMAT`] refuses it by its version instead of
/// reading the session as if its history were missing.
pub const RECORD_FORMAT_BASED: u8 = 2;

/// Where a session's history begins when it shares another session's
/// records: `parent`'s records 1..=`through` are its own first ones, as
/// stored (each still names `parent`, or the session `parent` shares them
/// from), and its first record of its own, at `through + 1`, links to the
/// hash of `parent`'s record at `through`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Base {
    /// The session whose records it shares.
    pub parent: Uuid,
    /// The last seq it shares (at least 1).
    pub through: u64,
}

/// The largest record, in stored bytes (format byte, envelope, hash), that
/// the log accepts: 16 MiB. An append or import with a bigger record is
/// refused whole with [`LogError::RecordTooLarge`] and stores nothing, so
/// no event, whatever a model or a tool sent, makes a write-ahead frame
/// anywhere near its 4 GiB bound.
pub const MAX_RECORD_BYTES: usize = 16 << 20;

const HASH_LEN: usize = 32;

/// A SHA-256 hash in a session's chain.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Hash(pub [u8; HASH_LEN]);

impl Hash {
    /// The `prev_hash` of a session's first record.
    pub const ZERO: Hash = Hash([0; HASH_LEN]);

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", &self.to_hex()[..16])
    }
}

impl Serialize for Hash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::Bytes::new(&self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(d)?;
        let array: [u8; HASH_LEN] = bytes
            .as_ref()
            .try_into()
            .map_err(|_| serde::de::Error::invalid_length(bytes.len(), &"32 bytes"))?;
        Ok(Hash(array))
    }
}

/// An event as a caller hands it to the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// What kind of event this is (the caller's vocabulary).
    pub kind: String,
    /// Version of the payload's schema (the caller's vocabulary).
    pub schema: u16,
    /// Seq of the event that caused this one, if any.
    pub caused_by: Option<u64>,
    /// The encoded event.
    pub payload: Vec<u8>,
}

/// `events` as the records that follow `head` in `session`, sealed (each
/// chained to the one before, stamped `ts_ms`, given a fresh event id),
/// with their stored bytes: how every backend turns an append into records.
pub fn seal_after(
    session: uuid::Uuid,
    head: crate::Head,
    events: Vec<NewEvent>,
    ts_ms: i64,
) -> Result<(Vec<Record>, Vec<Vec<u8>>), crate::LogError> {
    seal_from(session, None, head, events, ts_ms)
}

/// `events` as the first records of `session`, which shares `base`, whose
/// record at `base.through` is `base_head`: sealed as [`seal_after`] seals
/// them, the first naming its base.
pub fn seal_after_base(
    session: uuid::Uuid,
    base: Base,
    base_head: crate::Head,
    events: Vec<NewEvent>,
    ts_ms: i64,
) -> Result<(Vec<Record>, Vec<Vec<u8>>), crate::LogError> {
    seal_from(session, Some(base), base_head, events, ts_ms)
}

fn seal_from(
    session: uuid::Uuid,
    mut base: Option<Base>,
    head: crate::Head,
    events: Vec<NewEvent>,
    ts_ms: i64,
) -> Result<(Vec<Record>, Vec<Vec<u8>>), crate::LogError> {
    let mut prev = head;
    let mut records = Vec::with_capacity(events.len());
    let mut sealed = Vec::with_capacity(events.len());
    for event in events {
        let (record, bytes) = Record::seal(Envelope {
            session,
            seq: prev.seq + 1,
            event_id: uuid::Uuid::now_v7(),
            ts_ms,
            caused_by: event.caused_by,
            schema: event.schema,
            kind: event.kind,
            prev_hash: prev.hash,
            payload: event.payload,
            base: base.take(),
        })?;
        prev = crate::Head {
            seq: record.envelope.seq,
            hash: record.hash,
        };
        records.push(record);
        sealed.push(bytes);
    }
    Ok((records, sealed))
}

/// The envelope of a stored event: everything but its own hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The session (UUID v7).
    pub session: Uuid,
    /// Position in the session, from 1, gapless.
    pub seq: u64,
    /// Identity of this event (UUID v7).
    pub event_id: Uuid,
    /// When it was appended, milliseconds since the Unix epoch (UTC).
    pub ts_ms: i64,
    /// Seq of the event that caused this one, if any.
    pub caused_by: Option<u64>,
    /// Version of the payload's schema.
    pub schema: u16,
    /// What kind of event this is.
    pub kind: String,
    /// Hash of the previous record in the session ([`Hash::ZERO`] for seq 1).
    pub prev_hash: Hash,
    /// The encoded event.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// On the first record of a session that shares another's records:
    /// whose, and through which seq (this record's `prev_hash` is the hash
    /// of that record). `None` on every other record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<Base>,
}

/// A stored event: its envelope and its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The envelope.
    pub envelope: Envelope,
    /// SHA-256 of `prev_hash ‖ encoded envelope`.
    pub hash: Hash,
}

impl Record {
    /// The base named by the record in `bytes` (stored bytes, not checked:
    /// [`Record::open`] checks them), if it names one.
    pub fn peek_base(bytes: &[u8]) -> Option<Base> {
        match bytes.split_first() {
            Some((&RECORD_FORMAT_BASED, rest)) if rest.len() > HASH_LEN => {
                let body = &rest[..rest.len() - HASH_LEN];
                rmp_serde::from_slice::<Envelope>(body).ok()?.base
            }
            _ => None,
        }
    }

    /// How many bytes the record takes stored (format byte, envelope,
    /// hash), as a read's byte budget counts it.
    pub fn stored_len(&self) -> usize {
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0 += buf.len();
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut count = Count(1 + HASH_LEN);
        let _ = rmp_serde::encode::write_named(&mut count, &self.envelope);
        count.0
    }

    /// Seals `envelope`: encodes it and computes its hash. Returns the record
    /// and its exact stored bytes, at most [`MAX_RECORD_BYTES`] of them
    /// ([`LogError::RecordTooLarge`] otherwise).
    pub fn seal(envelope: Envelope) -> Result<(Record, Vec<u8>), LogError> {
        let format = match envelope.base {
            None => RECORD_FORMAT,
            Some(_) => RECORD_FORMAT_BASED,
        };
        let mut bytes = vec![format];
        rmp_serde::encode::write_named(&mut bytes, &envelope).map_err(|e| LogError::Encode {
            kind: envelope.kind.clone(),
            reason: e.to_string(),
        })?;
        check_size(envelope.session, envelope.seq, bytes.len() + HASH_LEN)?;
        let hash = chain_hash(&envelope.prev_hash, &bytes[1..]);
        bytes.extend_from_slice(&hash.0);
        Ok((Record { envelope, hash }, bytes))
    }

    /// Decodes and checks stored bytes that the store keeps under
    /// (`session`, `seq`): format version, hash, and that the envelope names
    /// the same session and seq.
    pub fn open(session: Uuid, seq: u64, bytes: &[u8]) -> Result<Record, LogError> {
        let corrupt = |reason: String| LogError::Corrupt {
            session,
            seq,
            reason,
        };
        let Some((&version, rest)) = bytes.split_first() else {
            return Err(corrupt("empty record".into()));
        };
        if version != RECORD_FORMAT && version != RECORD_FORMAT_BASED {
            return Err(LogError::UnknownVersion {
                session,
                seq,
                version,
            });
        }
        if rest.len() < HASH_LEN {
            return Err(corrupt(format!(
                "record truncated to {} bytes",
                bytes.len()
            )));
        }
        let (body, stored_hash) = rest.split_at(rest.len() - HASH_LEN);
        let envelope: Envelope = rmp_serde::from_slice(body)
            .map_err(|e| corrupt(format!("envelope does not decode: {e}")))?;
        let hash = chain_hash(&envelope.prev_hash, body);
        if hash.0 != stored_hash {
            return Err(corrupt(
                "hash mismatch: the stored bytes were altered".into(),
            ));
        }
        if envelope.session != session || envelope.seq != seq {
            return Err(corrupt(format!(
                "record stored under this key names session {} seq {}",
                envelope.session, envelope.seq
            )));
        }
        if (version == RECORD_FORMAT_BASED) != envelope.base.is_some() {
            return Err(corrupt(format!(
                "format version {version} with {} base",
                if envelope.base.is_some() { "a" } else { "no" }
            )));
        }
        if envelope
            .base
            .is_some_and(|b| b.through == 0 || b.through + 1 != seq)
        {
            return Err(corrupt("its base does not end right before it".into()));
        }
        Ok(Record { envelope, hash })
    }
}

/// Refuses a record of `size` stored bytes over [`MAX_RECORD_BYTES`].
pub(crate) fn check_size(session: Uuid, seq: u64, size: usize) -> Result<(), LogError> {
    if size > MAX_RECORD_BYTES {
        return Err(LogError::RecordTooLarge {
            session,
            seq,
            size: size as u64,
            limit: MAX_RECORD_BYTES as u64,
        });
    }
    Ok(())
}

fn chain_hash(prev: &Hash, body: &[u8]) -> Hash {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(prev.0);
    hasher.update(body);
    Hash(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope() -> Envelope {
        Envelope {
            session: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001),
            seq: 1,
            event_id: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0002),
            ts_ms: 1_700_000_000_000,
            caused_by: None,
            schema: 1,
            kind: "Test".into(),
            prev_hash: Hash::ZERO,
            payload: vec![1, 2, 3],
            base: None,
        }
    }

    #[test]
    fn sealed_record_opens_to_itself() {
        let (record, bytes) = Record::seal(envelope()).unwrap();
        let opened = Record::open(record.envelope.session, 1, &bytes).unwrap();
        assert_eq!(opened, record);
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let (record, bytes) = Record::seal(envelope()).unwrap();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            let result = Record::open(record.envelope.session, 1, &bad);
            assert!(result.is_err(), "flip at byte {i} went unnoticed");
        }
    }

    #[test]
    fn record_under_wrong_key_is_refused() {
        let (record, bytes) = Record::seal(envelope()).unwrap();
        let err = Record::open(record.envelope.session, 2, &bytes).unwrap_err();
        assert!(err.to_string().contains("seq 2"), "{err}");
    }

    #[test]
    fn unknown_format_is_named() {
        let (record, mut bytes) = Record::seal(envelope()).unwrap();
        bytes[0] = 9;
        let err = Record::open(record.envelope.session, 1, &bytes).unwrap_err();
        assert!(matches!(err, LogError::UnknownVersion { version: 9, .. }));
    }

    #[test]
    fn a_record_of_the_size_limit_seals_and_one_byte_more_is_refused() {
        let sized = |payload: usize| Envelope {
            payload: vec![0; payload],
            ..envelope()
        };
        let probe = MAX_RECORD_BYTES - 1000;
        let (_, bytes) = Record::seal(sized(probe)).unwrap();
        let exact = probe + MAX_RECORD_BYTES - bytes.len();
        let (_, bytes) = Record::seal(sized(exact)).unwrap();
        assert_eq!(bytes.len(), MAX_RECORD_BYTES);
        match Record::seal(sized(exact + 1)).unwrap_err() {
            LogError::RecordTooLarge {
                session,
                seq: 1,
                size,
                limit,
            } => {
                assert_eq!(session, envelope().session);
                assert_eq!((size, limit), (limit + 1, MAX_RECORD_BYTES as u64));
            }
            other => panic!("{other}"),
        }
    }

    /// The stored bytes of a record are part of the on-disk format: a change
    /// here breaks every existing log. Update the fixture only with a new
    /// [`RECORD_FORMAT`].
    #[test]
    fn golden_bytes() {
        let (_, bytes) = Record::seal(envelope()).unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/record_v1.hex");
        let hex = hex::encode(&bytes);
        if std::env::var_os("MNEME_BLESS").is_some() {
            std::fs::write(path, format!("{hex}\n")).unwrap();
        }
        let golden =
            std::fs::read_to_string(path).expect("fixture missing: run with MNEME_BLESS=1");
        assert_eq!(hex, golden.trim(), "record encoding changed");
    }
}
