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
pub fn statement(session: Uuid, seq: u64, hash: &str, at_ms: i64) -> Vec<u8> {
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
    /// if its group or others can read it.
    pub fn load(path: &Path) -> Result<HeadSigner, RuntimeError> {
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
    /// session, in order): each must be this key's, its signature good, and
    /// the record it names must hold the hash it signed. Returns how many
    /// check out and the last seq they vouch for; an error names the first
    /// that does not, or says there is none.
    pub fn check(
        &self,
        session: Uuid,
        records: &[(u64, String, Event)],
    ) -> Result<(usize, u64), String> {
        let mine = hex::encode(self.0.as_bytes());
        let mut vouched = (0, 0);
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
            let signature = hex::decode(signature)
                .ok()
                .and_then(|b| Signature::from_slice(&b).ok())
                .ok_or_else(|| format!("seq {at}: a malformed signature"))?;
            self.0
                .verify(&statement(session, *seq, hash, *at_ms), &signature)
                .map_err(|_| format!("seq {at}: the signature does not match its head"))?;
            let held = records.iter().find(|(s, _, _)| s == seq).map(|(_, h, _)| h);
            if held != Some(hash) {
                return Err(format!(
                    "seq {seq} does not hold the hash signed at seq {at}: the history was rewritten"
                ));
            }
            vouched = (vouched.0 + 1, *seq);
        }
        match vouched {
            (0, _) => Err("no head signed: nothing vouches for this history".into()),
            found => Ok(found),
        }
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
    fn a_signed_head_checks_out_and_a_rewritten_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let signer = HeadSigner::generate(&dir.path().join("k")).unwrap();
        let key = HeadKey::parse(&signer.public_hex()).unwrap();
        let s = Uuid::now_v7();
        let mut log = records(s, &signer);
        assert_eq!(key.check(s, &log), Ok((1, 1)));
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
            HeadSigner::load(&dir.path().join("k"))
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
