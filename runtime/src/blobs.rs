//! Binary content tools return by reference (an MCP server's images,
//! audio, embedded files), kept beside the log under its SHA-256.
//!
//! A blob is derived data (`SideStore::put_derived`): outside the chain and
//! the barriers, so it may be missing after a crash, and it is checked
//! against the digest the log recorded whenever it is read. The event that
//! refers to it records its size and digest, never its bytes.

use crate::error::RuntimeError;
use async_trait::async_trait;
use eventlog::EventLog;
use std::sync::Arc;
use uuid::Uuid;

/// The derived-data name of the blob whose SHA-256 is `digest`.
fn name(digest: &str) -> String {
    format!("blob/{digest}")
}

/// The blobs of one session.
pub(crate) struct SessionBlobs {
    log: Arc<dyn EventLog>,
    session: Uuid,
}

impl SessionBlobs {
    /// The blobs `session` keeps in `log`, to hand its tool calls.
    pub(crate) fn of(log: Arc<dyn EventLog>, session: Uuid) -> tools::Blobs {
        tools::Blobs(Arc::new(SessionBlobs { log, session }))
    }
}

#[async_trait]
impl tools::BlobStore for SessionBlobs {
    async fn keep(&self, digest: &str, bytes: &[u8]) -> Result<(), String> {
        let stored = self
            .log
            .side_store()
            .put_derived(self.session, &name(digest), bytes)
            .await;
        stored.map_err(|e| e.to_string())
    }
}

/// The blob of `session` whose SHA-256 is `digest`, if it is kept and its
/// bytes still have that digest.
pub(crate) async fn read(
    log: &dyn EventLog,
    session: Uuid,
    digest: &str,
) -> Result<Option<Vec<u8>>, RuntimeError> {
    let bytes = log
        .side_store()
        .get_derived(session, &name(&digest.to_ascii_lowercase()))
        .await?;
    Ok(bytes.filter(|b| replay::digest_hex(b).eq_ignore_ascii_case(digest)))
}
