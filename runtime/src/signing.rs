//! Signed heads: tamper evidence that does not rest on the store alone.
//!
//! The hash chain shows a record changed in place, but someone with write
//! access to the store can rewrite a history and chain it again. A head
//! signed with a key kept outside the data directory (`mneme keygen`) says
//! "session S's record N had hash H at time T"; a rewritten history no
//! longer matches it, and nobody without the key can sign the new one.
//! Heads are signed at the end of each turn and every 1,000 events within
//! a long one (`runner::SIGN_EVERY`), as records of their own
//! (`HeadSigned`), so they travel with the log (export, import, PostgreSQL).

use crate::error::RuntimeError;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use replay::Event;
use std::path::Path;
use uuid::Uuid;

/// The bytes a head's signature covers.
pub(crate) fn statement(session: Uuid, seq: u64, hash: &str, at_ms: i64) -> Vec<u8> {
    format!("mneme signed head v1\n{session}\n{seq}\n{hash}\n{at_ms}\n").into_bytes()
}

/// A key that signs heads, read from a file only its owner can read.
pub struct HeadSigner {
    key: SigningKey,
}

impl std::fmt::Debug for HeadSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeadSigner({})", self.public_hex())
    }
}

fn error(path: &Path, reason: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Signing(format!("signing key {}: {reason}", path.display()))
}

impl HeadSigner {
    /// A new key from the kernel's random source, written (hex) to `path`,
    /// which must not exist, readable by its owner only.
    pub fn generate(path: &Path) -> Result<HeadSigner, RuntimeError> {
        let seed = crate::secret::generate(path).map_err(|e| error(path, e))?;
        Ok(HeadSigner {
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// The key in `path` (as [`HeadSigner::generate`] writes it); refused
    /// if its group or others can read it, or if it lies inside `data_dir`
    /// (whoever can rewrite the store must not hold the key).
    pub fn load(path: &Path, data_dir: Option<&Path>) -> Result<HeadSigner, RuntimeError> {
        let why = "whoever can rewrite the store holds the key that vouches for it";
        crate::secret::outside(path, data_dir, why).map_err(|e| error(path, e))?;
        let seed = crate::secret::load(path, "mneme keygen").map_err(|e| error(path, e))?;
        Ok(HeadSigner {
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// The public key, hex: what `mneme verify --key` takes.
    pub fn public_hex(&self) -> String {
        hex::encode(self.key.verifying_key().as_bytes())
    }

    /// The signed head of `session` at record `seq` with `hash`, now.
    pub fn sign(&self, session: Uuid, seq: u64, hash: &str) -> Event {
        let at_ms = chrono::Utc::now().timestamp_millis();
        let signature = self.key.sign(&statement(session, seq, hash, at_ms));
        Event::HeadSigned {
            seq,
            hash: hash.to_string(),
            at_ms,
            key: self.public_hex(),
            signature: hex::encode(signature.to_bytes()),
        }
    }
}

/// A public key that heads must be signed with (hex, or a file holding it).
pub struct HeadKey(VerifyingKey);

impl HeadKey {
    /// The key `given` names: 64 hex digits, or a file holding them.
    pub fn parse(given: &str) -> Result<HeadKey, RuntimeError> {
        let text = match Path::new(given).is_file() {
            true => crate::secret::read_key_file(Path::new(given))
                .map_err(|e| RuntimeError::Signing(format!("public key {given}: {e}")))?,
            false => given.to_string(),
        };
        let bytes: [u8; 32] = hex::decode(text.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                RuntimeError::Signing(format!(
                    "public key {given:?}: not 64 hex digits (as `mneme keygen` prints)"
                ))
            })?;
        VerifyingKey::from_bytes(&bytes)
            .map(HeadKey)
            .map_err(|e| RuntimeError::Signing(format!("public key {given:?}: {e}")))
    }

    /// Checks the signed heads among `records` ((seq, hash, event) of one
    /// session, in order): each must be this key's, its signature good,
    /// and the record it names must hold the hash it signed; and every
    /// record after the last one vouched for must be a signed head itself,
    /// else those records are named as not vouched for. Heads a fork
    /// copied from its parent vouch for the parent's history (they are
    /// checked against the parent's id) and the copy itself. An error
    /// names the first fault, or says no head is signed.
    pub fn check(
        &self,
        session: Uuid,
        records: &[(u64, String, Event)],
    ) -> Result<Vouched, String> {
        let mine = hex::encode(self.0.as_bytes());
        // A fork's records up to `copied` are its parent's history.
        let (parent, copied) = match records.first() {
            Some((1, _, Event::SessionForked { parent, at_seq, .. })) => {
                (Some(*parent), at_seq + 1)
            }
            _ => (None, 1),
        };
        // Where a fork shares its parent's records, they come first: the
        // first shared fork point past a record names who recorded it.
        let shared: Vec<(u64, Uuid)> = (records.iter())
            .filter_map(|(at, _, event)| match event {
                Event::SessionForked {
                    parent,
                    shared: true,
                    ..
                } => Some((*at, *parent)),
                _ => None,
            })
            .collect();
        let recorded_by = |at: u64| {
            let after = shared.iter().find(|(point, _)| *point > at);
            after.map_or(session, |(_, parent)| *parent)
        };
        let mut vouched = Vouched::default();
        for (at, _, event) in records {
            let Event::HeadSigned {
                seq,
                hash,
                at_ms,
                key,
                signature,
            } = event
            else {
                continue;
            };
            if *key != mine {
                return Err(format!("seq {at}: a head signed by another key ({key})"));
            }
            let in_copy = *at <= copied && parent.is_some();
            let of = match (in_copy, parent) {
                (true, Some(parent)) => parent,
                _ => recorded_by(*at),
            };
            let signature = hex::decode(signature)
                .ok()
                .and_then(|b| Signature::from_slice(&b).ok())
                .ok_or_else(|| format!("seq {at}: a malformed signature"))?;
            self.0
                .verify(&statement(of, *seq, hash, *at_ms), &signature)
                .map_err(|_| format!("seq {at}: the signature does not match its head"))?;
            if in_copy {
                // The parent's head: it vouches for the copy of its history.
                vouched.copied += 1;
                vouched.through = copied;
                continue;
            }
            let held = records.iter().find(|(s, _, _)| s == seq).map(|(_, h, _)| h);
            if held != Some(hash) {
                return Err(format!(
                    "seq {seq} does not hold the hash signed at seq {at}: the history was rewritten"
                ));
            }
            vouched.through = *seq;
            if of != session {
                // A head of the history a fork shares with its parent.
                vouched.copied += 1;
                continue;
            }
            vouched.heads += 1;
            vouched.at_ms = *at_ms;
        }
        if vouched.heads + vouched.copied == 0 {
            return Err("no head signed: nothing vouches for this history".into());
        }
        // A fork's first record of its own, right after the history its
        // parent's heads vouch for (heads themselves aside), only names
        // that history (as a copy's first did).
        for (point, _) in &shared {
            let between = records
                .iter()
                .filter(|(seq, _, _)| (vouched.through + 1..*point).contains(seq));
            if *point > vouched.through
                && between
                    .clone()
                    .all(|(_, _, e)| matches!(e, Event::HeadSigned { .. }))
            {
                vouched.through = *point;
            }
        }
        let unvouched: Vec<u64> = (records.iter())
            .filter(|(seq, _, event)| {
                *seq > vouched.through && !matches!(event, Event::HeadSigned { .. })
            })
            .map(|(seq, _, _)| *seq)
            .collect();
        vouched.unvouched = match (unvouched.first(), unvouched.last()) {
            (Some(first), Some(last)) => Some((*first, *last)),
            _ => None,
        };
        Ok(vouched)
    }
}

/// What the signed heads of a session vouch for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Vouched {
    /// Its own heads that check out.
    pub heads: usize,
    /// Heads a fork holds of its parent's history (shared, or copied by a
    /// fork made before forks shared) that check out.
    pub copied: usize,
    /// The last seq they vouch for.
    pub through: u64,
    /// When its last own head was signed (ms since the Unix epoch; 0: none).
    pub at_ms: i64,
    /// Records after that, not vouched for (first and last seq), if any.
    pub unvouched: Option<(u64, u64)>,
}

/// One signed head as a witness keeps it (`mneme heads`): enough to tell
/// later whether the store still extends what was seen.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Witnessed {
    /// The session.
    pub session: Uuid,
    /// The record it vouches for.
    pub seq: u64,
    /// That record's hash (hex).
    pub hash: String,
    /// When it was signed (ms since the Unix epoch).
    pub at_ms: i64,
    /// The public key (hex).
    pub key: String,
    /// The signature (hex).
    pub signature: String,
}

impl HeadKey {
    /// Whether `witnessed` is a head this key signed (not whether the store
    /// still holds it).
    pub fn signed(&self, witnessed: &Witnessed) -> bool {
        let statement = statement(
            witnessed.session,
            witnessed.seq,
            &witnessed.hash,
            witnessed.at_ms,
        );
        let signature = hex::decode(&witnessed.signature)
            .ok()
            .and_then(|b| Signature::from_slice(&b).ok());
        hex::encode(self.0.as_bytes()) == witnessed.key
            && signature.is_some_and(|signature| self.0.verify(&statement, &signature).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(session: Uuid, signer: &HeadSigner) -> Vec<(u64, String, Event)> {
        let message = Event::UserMessage { text: "hi".into() };
        vec![
            (1, "aa".into(), message),
            (2, "bb".into(), signer.sign(session, 1, "aa")),
        ]
    }

    #[test]
    fn records_after_the_last_signed_head_are_not_vouched_for() {
        let dir = tempfile::tempdir().unwrap();
        let signer = HeadSigner::generate(&dir.path().join("k")).unwrap();
        let key = HeadKey::parse(&signer.public_hex()).unwrap();
        let s = Uuid::now_v7();
        let mut log = records(s, &signer);
        for seq in 3..=5 {
            log.push((
                seq,
                format!("h{seq}"),
                Event::UserMessage {
                    text: "pay mallory".into(),
                },
            ));
        }
        let vouched = key.check(s, &log).unwrap();
        assert_eq!(vouched.unvouched, Some((3, 5)));
        log.push((6, "h6".into(), signer.sign(s, 5, "h5")));
        assert_eq!(key.check(s, &log).unwrap().unvouched, None);
    }

    #[test]
    fn a_forks_copied_heads_vouch_for_its_parents_history() {
        let dir = tempfile::tempdir().unwrap();
        let signer = HeadSigner::generate(&dir.path().join("k")).unwrap();
        let key = HeadKey::parse(&signer.public_hex()).unwrap();
        let (parent, child) = (Uuid::now_v7(), Uuid::now_v7());
        let mut log = vec![(
            1,
            "f".to_string(),
            Event::SessionForked {
                parent,
                at_seq: 2,
                rerun: None,
                shared: false,
            },
        )];
        // The parent's two records, re-chained in the child.
        log.push((2, "c2".into(), Event::UserMessage { text: "hi".into() }));
        log.push((3, "c3".into(), signer.sign(parent, 1, "p1")));
        let vouched = key.check(child, &log).unwrap();
        assert_eq!(
            (vouched.copied, vouched.through, vouched.unvouched),
            (1, 3, None)
        );
        log.push((
            4,
            "c4".into(),
            Event::UserMessage {
                text: "more".into(),
            },
        ));
        assert_eq!(key.check(child, &log).unwrap().unvouched, Some((4, 4)));
        // A parent's head is not one of the child's own.
        log[2].2 = signer.sign(child, 1, "p1");
        assert!(key
            .check(child, &log)
            .unwrap_err()
            .contains("does not match"));
    }

    #[test]
    fn a_signed_head_checks_out_and_a_rewritten_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let signer = HeadSigner::generate(&dir.path().join("k")).unwrap();
        let key = HeadKey::parse(&signer.public_hex()).unwrap();
        let s = Uuid::now_v7();
        let mut log = records(s, &signer);
        let vouched = key.check(s, &log).unwrap();
        assert_eq!(
            (vouched.heads, vouched.through, vouched.unvouched),
            (1, 1, None)
        );
        log[0].1 = "forged".into();
        assert!(key.check(s, &log).unwrap_err().contains("rewritten"));
        let other = HeadSigner::generate(&dir.path().join("k2")).unwrap();
        let log = records(s, &other);
        assert!(key.check(s, &log).unwrap_err().contains("another key"));
        assert!(key
            .check(s, &log[..1])
            .unwrap_err()
            .contains("no head signed"));
        assert!(
            HeadSigner::generate(&dir.path().join("k")).is_err(),
            "never overwritten"
        );
        assert_eq!(
            HeadSigner::load(&dir.path().join("k"), None)
                .unwrap()
                .public_hex(),
            signer.public_hex()
        );
        let big = dir.path().join("big");
        std::fs::write(&big, "a".repeat(5000)).unwrap();
        let refused = HeadKey::parse(big.to_str().unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(refused.contains("larger than 4096 bytes"), "{refused}");
    }
}
