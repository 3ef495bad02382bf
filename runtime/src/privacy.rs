//! Encryption at rest, one key per session, so that a session's content
//! can be erased (crypto-shredding) while its chain still verifies.
//!
//! [`SealedLog`] wraps a store. Given a [`MasterKey`], it gives each new
//! session a random key of its own, kept in the store's key store wrapped
//! by the master key (which lives outside the data directory). Every event
//! with personal fields ([`replay::Event::personal_fields_mut`]) is stored
//! as an *outline* (the event with those fields set to [`replay::ERASED`])
//! and the fields themselves, encrypted (XChaCha20-Poly1305, bound to the
//! session, seq and kind). The record's hash covers both, so the chain
//! proves what was there without showing it. Derived data of the session
//! (snapshots, summaries, blobs) is encrypted under the same key.
//!
//! Reading through a `SealedLog` gives back the events as written. Once
//! the session's key is destroyed ([`eventlog::SideStore::destroy_key`]), it gives
//! the outlines: the session's shape (kinds, times, tools, effects,
//! idempotency keys, tokens) with its content erased, and its derived data
//! reads as absent. Sessions written without a master key, or before one
//! was given, are stored and read as they always were.

use crate::error::RuntimeError;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use eventlog::{
    AppendListener, Durability, EventLog, Head, Leases, LogError, NewEvent, Record, SessionMeta,
    SideStore,
};
use replay::Event;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use uuid::Uuid;

/// The bit of an envelope's `schema` that marks a sealed payload (an
/// outline and encrypted fields); the other bits are the event schema.
pub(crate) const SEALED_SCHEMA: u16 = 0x8000;

/// The first bytes of encrypted derived data.
const DERIVED_MAGIC: &[u8; 4] = b"mnx1";

/// The format byte of a session key wrapped by the master key (and of a
/// tenant's key, wrapped by the master key too).
const WRAPPED_FORMAT: u8 = 1;

/// The format byte of a session key wrapped by its tenant's key: then the
/// 16 bytes of the tenant key's slot, then the wrapped key.
pub(crate) const TENANT_WRAPPED_FORMAT: u8 = 2;

/// What the key store keeps in an erased tenant's key slot once its key
/// is destroyed: so that no process makes the tenant a new key, and no
/// session of it is written again.
pub(crate) const ERASED_TENANT_KEY: &[u8] = b"mneme: this tenant was erased";

/// How long a process reads a tenant's session with the key it unwrapped
/// before it looks again whether the tenant's key still exists (another
/// process may have erased the tenant).
const TENANT_KEY_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

const NONCE_LEN: usize = 24;

/// The key that wraps every session key of a store. Kept outside the data
/// directory, so that a copy of the directory alone reads nothing, and so
/// that a destroyed session key cannot come back from a backup of the
/// key store without it.
pub struct MasterKey(XChaCha20Poly1305);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

fn key_error(path: &Path, reason: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::MasterKey(format!("master key {}: {reason}", path.display()))
}

impl MasterKey {
    /// A new master key from the kernel's random source, written (hex) to
    /// `path`, which must not exist, readable by its owner only.
    pub fn generate(path: &Path) -> Result<MasterKey, RuntimeError> {
        let secret = crate::secret::generate(path).map_err(|e| key_error(path, e))?;
        Ok(MasterKey::from_bytes(&secret))
    }

    /// The master key in `path` (as [`MasterKey::generate`] writes it);
    /// refused if its group or others can read it, or if it lies inside
    /// `data_dir` (a copy of the directory would carry its own key).
    pub fn load(path: &Path, data_dir: Option<&Path>) -> Result<MasterKey, RuntimeError> {
        let why = "a copy of the directory carries the key to all its content";
        crate::secret::outside(path, data_dir, why).map_err(|e| key_error(path, e))?;
        let secret =
            crate::secret::load(path, "mneme keygen --master").map_err(|e| key_error(path, e))?;
        Ok(MasterKey::from_bytes(&secret))
    }

    fn from_bytes(secret: &[u8; 32]) -> MasterKey {
        MasterKey(XChaCha20Poly1305::new(secret.into()))
    }

    fn wrap(&self, session: Uuid, key: &[u8; 32]) -> Result<Vec<u8>, LogError> {
        let mut wrapped = vec![WRAPPED_FORMAT];
        wrapped.extend(encrypt(&self.0, key, &wrap_aad(session), session)?);
        Ok(wrapped)
    }

    fn unwrap(&self, session: Uuid, wrapped: &[u8]) -> Result<SessionCipher, LogError> {
        let refused = |reason: &str| LogError::Encrypted {
            session,
            reason: reason.into(),
        };
        let Some((&WRAPPED_FORMAT, sealed)) = wrapped.split_first() else {
            return Err(refused("its key is in an unknown format"));
        };
        let key = unwrap_with(&self.0, sealed, &wrap_aad(session)).map_err(|why| {
            refused(match why {
                Unwrapped::WrongKey => {
                    "the master key given is not the one its key was wrapped with"
                }
                Unwrapped::WrongLength => "its key has the wrong length",
            })
        })?;
        Ok(SessionCipher::new(&key))
    }

    /// A tenant's key, wrapped for its slot `slot`.
    fn wrap_tenant(&self, slot: Uuid, key: &[u8; 32]) -> Result<Vec<u8>, LogError> {
        let mut wrapped = vec![WRAPPED_FORMAT];
        wrapped.extend(encrypt(&self.0, key, &tenant_aad(slot), slot)?);
        Ok(wrapped)
    }

    /// The tenant key kept in slot `slot` as `wrapped`, for session
    /// `session` (named in the error).
    fn unwrap_tenant(
        &self,
        session: Uuid,
        slot: Uuid,
        wrapped: &[u8],
    ) -> Result<XChaCha20Poly1305, LogError> {
        let refused = |reason: &str| LogError::Encrypted {
            session,
            reason: format!("its tenant's key (slot {slot}) {reason}"),
        };
        let Some((&WRAPPED_FORMAT, sealed)) = wrapped.split_first() else {
            return Err(refused("is in an unknown format"));
        };
        let key = unwrap_with(&self.0, sealed, &tenant_aad(slot)).map_err(|why| {
            refused(match why {
                Unwrapped::WrongKey => "was wrapped with another master key than the one given",
                Unwrapped::WrongLength => "has the wrong length",
            })
        })?;
        Ok(XChaCha20Poly1305::new(&key.into()))
    }
}

/// Why a wrapped key did not open.
enum Unwrapped {
    WrongKey,
    WrongLength,
}

/// The 32-byte key `sealed` holds under `cipher` and `aad`.
fn unwrap_with(
    cipher: &XChaCha20Poly1305,
    sealed: &[u8],
    aad: &[u8],
) -> Result<[u8; 32], Unwrapped> {
    let key = decrypt(cipher, sealed, aad).ok_or(Unwrapped::WrongKey)?;
    key.try_into().map_err(|_| Unwrapped::WrongLength)
}

fn tenant_aad(slot: Uuid) -> Vec<u8> {
    [b"mneme tenant key ".as_slice(), slot.as_bytes()].concat()
}

/// The tenant key slot a session's wrapped key names, if it is wrapped by
/// a tenant's key.
pub(crate) fn tenant_slot_of(wrapped: &[u8]) -> Option<Uuid> {
    match wrapped.split_first() {
        Some((&TENANT_WRAPPED_FORMAT, rest)) if rest.len() > 16 => {
            Some(Uuid::from_slice(&rest[..16]).expect("16 bytes"))
        }
        _ => None,
    }
}

/// What a session's key opens: its records' personal fields and derived
/// data (sealed with the key), and its digests (keyed by a subkey).
struct SessionCipher {
    aead: XChaCha20Poly1305,
    /// HMAC key of the session's request and prefix digests: equal
    /// requests still have equal digests within the session, and once the
    /// key is destroyed a digest says nothing of what was asked (an
    /// unkeyed SHA-256 of a request could be matched against guesses).
    digests: [u8; 32],
}

impl SessionCipher {
    fn new(key: &[u8; 32]) -> SessionCipher {
        SessionCipher {
            aead: XChaCha20Poly1305::new(key.into()),
            digests: hmac_sha256(key, b"mneme session digests"),
        }
    }

    /// Keys `event`'s digests of what was sent (a model reply's request and
    /// prefix digests) and rounds its request's size to [`SIZE_BUCKET`]
    /// bytes; whether it had any.
    fn key_digests(&self, event: &mut Event) -> bool {
        let Event::ModelReplied(reply) = event else {
            return false;
        };
        for digest in [&mut reply.request_digest, &mut reply.prefix_digest] {
            if !digest.is_empty() {
                *digest = hex::encode(hmac_sha256(&self.digests, digest.as_bytes()));
            }
        }
        reply.request_bytes = reply.request_bytes.div_ceil(SIZE_BUCKET) * SIZE_BUCKET;
        true
    }
}

/// The size a sealed session's request sizes are rounded up to.
const SIZE_BUCKET: u64 = 256;

/// HMAC-SHA-256 (RFC 2104) of `message` under `key` (at most a block).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    const BLOCK: usize = 64;
    let mut padded = [0u8; BLOCK];
    padded[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| padded.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

fn wrap_aad(session: Uuid) -> Vec<u8> {
    [b"mneme session key ".as_slice(), session.as_bytes()].concat()
}

fn record_aad(session: Uuid, seq: u64, kind: &str) -> Vec<u8> {
    [
        session.as_bytes().as_slice(),
        &seq.to_be_bytes(),
        kind.as_bytes(),
    ]
    .concat()
}

fn derived_aad(session: Uuid, name: &str) -> Vec<u8> {
    [session.as_bytes().as_slice(), b"derived ", name.as_bytes()].concat()
}

/// `nonce ‖ ciphertext` of `plain`, with a random nonce.
fn encrypt(
    cipher: &XChaCha20Poly1305,
    plain: &[u8],
    aad: &[u8],
    session: Uuid,
) -> Result<Vec<u8>, LogError> {
    let nonce = crate::secret::random::<NONCE_LEN>().map_err(|e| LogError::Encrypted {
        session,
        reason: format!("no nonce from the random source: {e}"),
    })?;
    let sealed = cipher
        .encrypt(XNonce::from_slice(&nonce), Payload { msg: plain, aad })
        .map_err(|_| LogError::Encrypted {
            session,
            reason: "encryption failed".into(),
        })?;
    Ok([nonce.as_slice(), &sealed].concat())
}

/// The plaintext of `nonce ‖ ciphertext`, if it opens with `cipher`.
fn decrypt(cipher: &XChaCha20Poly1305, sealed: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < NONCE_LEN {
        return None;
    }
    let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
    cipher
        .decrypt(
            XNonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad,
            },
        )
        .ok()
}

/// The tenant key slot named by the start among `events` (a session's or
/// a schedule's first append), if it starts a tenant's session or
/// schedule.
fn tenant_slot(events: &[NewEvent]) -> Option<Uuid> {
    events
        .iter()
        .filter(|e| e.kind == "SessionStarted" || e.kind == "ScheduleCreated")
        .find_map(|e| match Event::decode(e.schema, &e.payload) {
            Ok(Event::SessionStarted {
                tenant: Some(tenant),
                ..
            }) => tenant.key,
            Ok(Event::ScheduleCreated { schedule }) => schedule.tenant.and_then(|t| t.key),
            _ => None,
        })
}

/// A sealed payload: the event's outline, and its personal fields,
/// encrypted.
#[derive(Serialize, Deserialize)]
struct Sealed {
    #[serde(with = "serde_bytes")]
    outline: Vec<u8>,
    #[serde(with = "serde_bytes")]
    fields: Vec<u8>,
}

/// A session's key as this process knows it.
#[derive(Clone)]
enum SessionKey {
    /// Written without encryption, or its key was destroyed by another
    /// process (the store cannot tell the two apart).
    None,
    /// Its key.
    Some(Arc<SessionCipher>),
    /// This process destroyed its key: its records read as their outlines,
    /// and its derived data is neither read nor written (a snapshot taken
    /// before the erasure and stored after it would hold the erased text,
    /// in the clear).
    Destroyed,
}

/// A store whose sessions are encrypted at rest, each under its own key
/// wrapped by a [`MasterKey`], so that destroying a session's key erases
/// its content while its chain still verifies. Everything but the payloads
/// of records and derived data passes through to the store it wraps.
pub struct SealedLog {
    inner: Arc<dyn EventLog>,
    master: Option<MasterKey>,
    keys: Mutex<HashMap<Uuid, SessionKey>>,
    /// Of the sessions whose keys are cached, those wrapped by a tenant's
    /// key: its slot, and when this process last saw it there.
    tenant_wrapped: Mutex<HashMap<Uuid, (Uuid, std::time::Instant)>>,
}

impl SealedLog {
    /// `inner`, with new sessions encrypted under keys wrapped by `master`
    /// (none: new sessions are written in the clear; encrypted ones cannot
    /// be read).
    pub fn new(inner: Arc<dyn EventLog>, master: Option<MasterKey>) -> SealedLog {
        SealedLog {
            inner,
            master,
            keys: Mutex::default(),
            tenant_wrapped: Mutex::default(),
        }
    }

    /// The store underneath, whose records are as stored (encrypted):
    /// what an export carries.
    pub fn raw(&self) -> &Arc<dyn EventLog> {
        &self.inner
    }

    fn cached(&self, session: Uuid) -> Option<SessionKey> {
        self.keys.lock().expect("keys lock").get(&session).cloned()
    }

    fn remember(&self, session: Uuid, key: SessionKey) -> SessionKey {
        self.keys
            .lock()
            .expect("keys lock")
            .insert(session, key.clone());
        key
    }

    /// The key of `session`: `None` if it keeps none (written in the
    /// clear, or erased); an error if it keeps one this process cannot
    /// unwrap. A key wrapped by a tenant's key is given while that key
    /// exists: looked at again at most every [`TENANT_KEY_RECHECK`], so a
    /// tenant erased by another process is unreadable here within it.
    async fn key(&self, session: Uuid) -> Result<SessionKey, LogError> {
        if let Some(key) = self.cached(session) {
            let stale = (self.tenant_wrapped.lock().expect("keys lock"))
                .get(&session)
                .filter(|(_, seen)| seen.elapsed() >= TENANT_KEY_RECHECK)
                .map(|(slot, _)| *slot);
            let Some(slot) = stale else { return Ok(key) };
            if self.tenant_key_kept(slot).await? {
                let mut wrapped = self.tenant_wrapped.lock().expect("keys lock");
                wrapped.insert(session, (slot, std::time::Instant::now()));
                return Ok(key);
            }
            self.tenant_wrapped
                .lock()
                .expect("keys lock")
                .remove(&session);
            return Ok(self.remember(session, SessionKey::Destroyed));
        }
        let Some(wrapped) = self.inner.side_store().get_key(session).await? else {
            return Ok(self.remember(session, SessionKey::None));
        };
        self.unwrap_kept(session, &wrapped).await
    }

    /// Whether the key store keeps a tenant's key in `slot` (not erased).
    async fn tenant_key_kept(&self, slot: Uuid) -> Result<bool, LogError> {
        let kept = self.inner.side_store().get_key(slot).await?;
        Ok(kept.is_some_and(|k| k != ERASED_TENANT_KEY))
    }

    /// The key `wrapped` (as the key store keeps it for `session`) opens
    /// to, remembered: a session of an erased tenant reads as erased.
    async fn unwrap_kept(&self, session: Uuid, wrapped: &[u8]) -> Result<SessionKey, LogError> {
        let master = self.master.as_ref().ok_or_else(|| LogError::Encrypted {
            session,
            reason: "this process was not given the master key (--master-key)".into(),
        })?;
        let Some(slot) = tenant_slot_of(wrapped) else {
            let cipher = master.unwrap(session, wrapped)?;
            return Ok(self.remember(session, SessionKey::Some(Arc::new(cipher))));
        };
        let tenant = match self.inner.side_store().get_key(slot).await? {
            Some(kept) if kept != ERASED_TENANT_KEY => {
                master.unwrap_tenant(session, slot, &kept)?
            }
            // Its tenant was erased: its content is gone.
            _ => return Ok(self.remember(session, SessionKey::Destroyed)),
        };
        let key = unwrap_with(&tenant, &wrapped[17..], &wrap_aad(session)).map_err(|_| {
            LogError::Encrypted {
                session,
                reason: format!("its key does not open with its tenant's key (slot {slot})"),
            }
        })?;
        let seen = (slot, std::time::Instant::now());
        (self.tenant_wrapped.lock().expect("keys lock")).insert(session, seen);
        let cipher = SessionCipher::new(&key);
        Ok(self.remember(session, SessionKey::Some(Arc::new(cipher))))
    }

    /// The key appends to `session` are sealed with: a new one for a `new`
    /// session when a master key was given, wrapped by its tenant's key if
    /// `events` start a tenant's session or it `inherits` one (a fork of a
    /// tenant's session; the tenant's key made on its first session). The
    /// logs that hold nothing personal (the registry of tenants, the
    /// ledgers of caps) get none.
    async fn key_for_append(
        &self,
        session: Uuid,
        new: bool,
        events: &[NewEvent],
        inherits: Option<Uuid>,
    ) -> Result<SessionKey, LogError> {
        let Some(master) = &self.master else {
            return Ok(SessionKey::None);
        };
        if !new || self.cached(session).is_some() {
            return self.key(session).await;
        }
        let first = events.first().map_or("", |e| e.kind.as_str());
        if replay::tenant::is_tenant_kind(first) || replay::spend::is_ledger_kind(first) {
            return Ok(self.remember(session, SessionKey::None));
        }
        let fresh = crate::secret::random::<32>().map_err(|e| LogError::Encrypted {
            session,
            reason: format!("no key from the random source: {e}"),
        })?;
        let wrapped = match tenant_slot(events).or(inherits) {
            None => master.wrap(session, &fresh)?,
            Some(slot) => {
                let tenant = self.tenant_key_for_new_session(session, slot).await?;
                let mut wrapped = vec![TENANT_WRAPPED_FORMAT];
                wrapped.extend_from_slice(slot.as_bytes());
                wrapped.extend(encrypt(&tenant, &fresh, &wrap_aad(session), session)?);
                wrapped
            }
        };
        let kept = self.inner.side_store().put_key(session, &wrapped).await?;
        self.unwrap_kept(session, &kept).await
    }

    /// The key of the tenant whose key is in `slot`, for its new session
    /// `session`: made (and kept) if the tenant has none yet; refused if
    /// the tenant was erased.
    async fn tenant_key_for_new_session(
        &self,
        session: Uuid,
        slot: Uuid,
    ) -> Result<XChaCha20Poly1305, LogError> {
        let master = self.master.as_ref().expect("called with a master key");
        let store = self.inner.side_store();
        let kept = match store.get_key(slot).await? {
            Some(kept) => kept,
            None => {
                let fresh = crate::secret::random::<32>().map_err(|e| LogError::Encrypted {
                    session,
                    reason: format!("no key from the random source: {e}"),
                })?;
                store
                    .put_key(slot, &master.wrap_tenant(slot, &fresh)?)
                    .await?
            }
        };
        if kept == ERASED_TENANT_KEY {
            return Err(LogError::Encrypted {
                session,
                reason: "its tenant was erased (its key destroyed): no session of it is written"
                    .into(),
            });
        }
        master.unwrap_tenant(session, slot, &kept)
    }

    /// `event`, to be stored at `seq`, as an outline and its personal
    /// fields encrypted; unchanged if it has none.
    fn seal(
        cipher: &SessionCipher,
        session: Uuid,
        seq: u64,
        event: NewEvent,
    ) -> Result<NewEvent, LogError> {
        let refused = |reason: String| LogError::Encode {
            kind: event.kind.clone(),
            reason,
        };
        let mut outline = Event::decode(event.schema, &event.payload)
            .map_err(|e| refused(format!("cannot seal it: {e}")))?;
        let keyed = cipher.key_digests(&mut outline);
        let fields: Vec<String> = outline
            .personal_fields_mut()
            .into_iter()
            .map(|field| std::mem::replace(field, replay::ERASED.into()))
            .collect();
        match (fields.is_empty(), keyed) {
            (true, false) => return Ok(event),
            (true, true) => {
                let payload = outline.encode();
                return Ok(NewEvent { payload, ..event });
            }
            (false, _) => {}
        }
        let plain = rmp_serde::to_vec(&fields).map_err(|e| refused(e.to_string()))?;
        let sealed = Sealed {
            outline: outline.encode(),
            fields: encrypt(
                &cipher.aead,
                &plain,
                &record_aad(session, seq, &event.kind),
                session,
            )?,
        };
        Ok(NewEvent {
            schema: event.schema | SEALED_SCHEMA,
            payload: rmp_serde::to_vec_named(&sealed).map_err(|e| refused(e.to_string()))?,
            ..event
        })
    }

    /// `record` as its event was written, or as its outline if `key` is
    /// none (erased).
    fn open(key: &SessionKey, mut record: Record) -> Result<Record, LogError> {
        let envelope = &mut record.envelope;
        if envelope.schema & SEALED_SCHEMA == 0 {
            return Ok(record);
        }
        let corrupt = |reason: &str| LogError::Corrupt {
            session: envelope.session,
            seq: envelope.seq,
            reason: format!("sealed payload: {reason}"),
        };
        let schema = envelope.schema & !SEALED_SCHEMA;
        let sealed: Sealed =
            rmp_serde::from_slice(&envelope.payload).map_err(|_| corrupt("does not decode"))?;
        let payload = match key {
            SessionKey::None | SessionKey::Destroyed => sealed.outline,
            SessionKey::Some(cipher) => {
                let aad = record_aad(envelope.session, envelope.seq, &envelope.kind);
                let plain = decrypt(&cipher.aead, &sealed.fields, &aad)
                    .ok_or_else(|| corrupt("its fields do not open with the session's key"))?;
                let fields: Vec<String> =
                    rmp_serde::from_slice(&plain).map_err(|_| corrupt("fields do not decode"))?;
                let mut event = Event::decode(schema, &sealed.outline)
                    .map_err(|_| corrupt("outline does not decode"))?;
                let slots = event.personal_fields_mut();
                if slots.len() != fields.len() {
                    return Err(corrupt("its fields do not fit its outline"));
                }
                for (slot, value) in slots.into_iter().zip(fields) {
                    *slot = value;
                }
                event.encode()
            }
        };
        envelope.schema = schema;
        envelope.payload = payload;
        Ok(record)
    }

    /// `records` opened, each with the key of the session that stores it.
    async fn open_all(&self, records: Vec<Record>) -> Result<Vec<Record>, LogError> {
        let mut opened = Vec::with_capacity(records.len());
        let mut key: Option<(Uuid, SessionKey)> = None;
        for record in records {
            if record.envelope.schema & SEALED_SCHEMA == 0 {
                opened.push(record);
                continue;
            }
            let session = record.envelope.session;
            if key.as_ref().is_none_or(|(of, _)| *of != session) {
                key = Some((session, self.key(session).await?));
            }
            let (_, key) = key.as_ref().expect("just set");
            opened.push(Self::open(key, record)?);
        }
        Ok(opened)
    }

    async fn open_derived(
        &self,
        session: Uuid,
        name: &str,
        bytes: Option<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>, LogError> {
        let Some(bytes) = bytes else { return Ok(None) };
        // Derived data is optional: what cannot be opened (erased, or no
        // master key here) is as good as absent.
        let key = self.key(session).await;
        let Some(sealed) = bytes.strip_prefix(DERIVED_MAGIC.as_slice()) else {
            return Ok((!matches!(key, Ok(SessionKey::Destroyed))).then_some(bytes));
        };
        Ok(match key {
            Ok(SessionKey::Some(cipher)) => {
                decrypt(&cipher.aead, sealed, &derived_aad(session, name))
            }
            _ => None,
        })
    }
}

impl SealedLog {
    /// [`EventLog::append`] (or, `deferred`, [`EventLog::append_deferred`])
    /// of `events` sealed under the session's key, if it has one.
    async fn append_as(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
        deferred: bool,
    ) -> Result<Vec<Record>, LogError> {
        let (key, events) = (self.sealed_events(session, expected_seq, expected_seq == 1))
            .with(events)
            .await?;
        let records = match deferred {
            true => {
                self.inner
                    .append_deferred(session, expected_seq, events)
                    .await?
            }
            false => self.inner.append(session, expected_seq, events).await?,
        };
        Self::opened(&key, records)
    }

    /// How `events` to be stored in `session` from `first_seq` (a `new`
    /// session's first) are sealed: under its key, if it has one.
    fn sealed_events(&self, session: Uuid, first_seq: u64, new: bool) -> Sealing<'_> {
        Sealing {
            log: self,
            session,
            first_seq,
            new,
            inherits: None,
        }
    }

    /// `records` just stored under `key`, opened as their appender gave them.
    fn opened(key: &SessionKey, records: Vec<Record>) -> Result<Vec<Record>, LogError> {
        match key {
            SessionKey::Some(_) => records
                .into_iter()
                .map(|record| Self::open(key, record))
                .collect(),
            _ => Ok(records),
        }
    }
}

/// Events about to be stored, and where: see [`SealedLog::sealed_events`].
struct Sealing<'a> {
    log: &'a SealedLog,
    session: Uuid,
    first_seq: u64,
    new: bool,
    /// The tenant key slot a fork inherits from its parent, if any.
    inherits: Option<Uuid>,
}

impl Sealing<'_> {
    /// The key, and `events` sealed under it.
    async fn with(self, events: Vec<NewEvent>) -> Result<(SessionKey, Vec<NewEvent>), LogError> {
        let (session, new, inherits) = (self.session, self.new, self.inherits);
        let key = (self.log.key_for_append(session, new, &events, inherits)).await?;
        let events = match &key {
            SessionKey::Some(cipher) => events
                .into_iter()
                .zip(self.first_seq..)
                .map(|(event, seq)| SealedLog::seal(cipher, self.session, seq, event))
                .collect::<Result<Vec<_>, _>>()?,
            _ => events,
        };
        Ok((key, events))
    }
}

#[async_trait::async_trait]
impl EventLog for SealedLog {
    async fn append(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.append_as(session, expected_seq, events, false).await
    }
    async fn append_deferred(
        &self,
        session: Uuid,
        expected_seq: u64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        self.append_as(session, expected_seq, events, true).await
    }
    /// As stored: encrypted, as an export carries them.
    async fn read_sealed_own(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
    ) -> Result<(Vec<Record>, Vec<Vec<u8>>), LogError> {
        self.inner.read_sealed_own(session, from, to).await
    }
    async fn read_bounded_own(
        &self,
        session: Uuid,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        let records = self
            .inner
            .read_bounded_own(session, from, to, max_bytes)
            .await?;
        self.open_all(records).await
    }
    async fn base(&self, session: Uuid) -> Result<Option<eventlog::Base>, LogError> {
        self.inner.base(session).await
    }
    /// A fork's own records, sealed under a key of its own; those it
    /// shares stay under its parent's.
    async fn fork_after(
        &self,
        session: Uuid,
        base: eventlog::Base,
        base_head: Head,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Record>, LogError> {
        // A tenant's fork is its tenant's: its key is wrapped by the same.
        let parent_key = self.inner.side_store().get_key(base.parent).await?;
        let sealing = Sealing {
            inherits: parent_key.as_deref().and_then(tenant_slot_of),
            ..self.sealed_events(session, base.through + 1, true)
        };
        let (key, events) = sealing.with(events).await?;
        let records = (self.inner)
            .fork_after(session, base, base_head, events)
            .await?;
        Self::opened(&key, records)
    }
    async fn head(&self, session: Uuid) -> Result<Head, LogError> {
        self.inner.head(session).await
    }
    async fn sessions(&self) -> Result<Vec<SessionMeta>, LogError> {
        self.inner.sessions().await
    }
    async fn meta(&self, session: Uuid) -> Result<Option<SessionMeta>, LogError> {
        self.inner.meta(session).await
    }
    async fn barrier(&self, durability: Durability) -> Result<(), LogError> {
        self.inner.barrier(durability).await
    }
    async fn barrier_of(&self, session: Uuid, durability: Durability) -> Result<(), LogError> {
        self.inner.barrier_of(session, durability).await
    }
    async fn import_own(
        &self,
        session: Uuid,
        start: Head,
        sealed: Vec<Vec<u8>>,
    ) -> Result<Head, LogError> {
        self.inner.import_own(session, start, sealed).await
    }
    fn follow(&self, listener: AppendListener) {
        self.inner.follow(listener)
    }
    async fn verify(&self, session: Uuid) -> Result<u64, LogError> {
        self.inner.verify(session).await
    }

    fn leases(&self) -> &dyn Leases {
        self.inner.leases()
    }

    fn side_store(&self) -> &dyn SideStore {
        self
    }
}

#[async_trait::async_trait]
impl SideStore for SealedLog {
    async fn put_derived(&self, session: Uuid, name: &str, bytes: &[u8]) -> Result<(), LogError> {
        match self.key(session).await? {
            SessionKey::Destroyed => Ok(()),
            SessionKey::None => {
                self.inner
                    .side_store()
                    .put_derived(session, name, bytes)
                    .await
            }
            SessionKey::Some(cipher) => {
                let sealed = encrypt(&cipher.aead, bytes, &derived_aad(session, name), session)?;
                let stored = [DERIVED_MAGIC.as_slice(), &sealed].concat();
                self.inner
                    .side_store()
                    .put_derived(session, name, &stored)
                    .await
            }
        }
    }
    async fn get_derived(&self, session: Uuid, name: &str) -> Result<Option<Vec<u8>>, LogError> {
        let bytes = self.inner.side_store().get_derived(session, name).await?;
        self.open_derived(session, name, bytes).await
    }
    async fn get_derived_many(
        &self,
        name: &str,
        sessions: &[Uuid],
    ) -> Result<Vec<Option<Vec<u8>>>, LogError> {
        let found = self
            .inner
            .side_store()
            .get_derived_many(name, sessions)
            .await?;
        let mut out = Vec::with_capacity(found.len());
        for (session, bytes) in sessions.iter().zip(found) {
            out.push(self.open_derived(*session, name, bytes).await?);
        }
        Ok(out)
    }
    async fn get_key(&self, session: Uuid) -> Result<Option<Vec<u8>>, LogError> {
        self.inner.side_store().get_key(session).await
    }
    async fn put_key(&self, session: Uuid, key: &[u8]) -> Result<Vec<u8>, LogError> {
        self.keys.lock().expect("keys lock").remove(&session);
        self.inner.side_store().put_key(session, key).await
    }
    /// Destroys `session`'s key; if it is a tenant's key slot, every
    /// session of the tenant this process knows reads as erased at once.
    async fn destroy_key(&self, session: Uuid) -> Result<(), LogError> {
        self.remember(session, SessionKey::Destroyed);
        let wrapped_by_it: Vec<Uuid> = {
            let mut wrapped = self.tenant_wrapped.lock().expect("keys lock");
            let of_it: Vec<Uuid> = (wrapped.iter())
                .filter(|(_, (slot, _))| *slot == session)
                .map(|(id, _)| *id)
                .collect();
            of_it.iter().for_each(|id| {
                wrapped.remove(id);
            });
            of_it
        };
        for id in wrapped_by_it {
            self.remember(id, SessionKey::Destroyed);
        }
        self.inner.side_store().destroy_key(session).await
    }
}

#[cfg(test)]
mod tests {
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
}
