//! Errors of the runtime, each naming what and where.

use eventlog::LogError;
use uuid::Uuid;

/// Everything the runtime can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The log failed or refused a record.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A stored event is not one this build understands.
    #[error("session {session} seq {seq}: {source}")]
    Decode {
        /// The session.
        session: Uuid,
        /// The seq.
        seq: u64,
        /// Why.
        #[source]
        source: replay::DecodeError,
    },
    /// No such session in the log.
    #[error("no session {0} in this store")]
    NoSuchSession(Uuid),
    /// The session keeps no blob with this digest (never kept, lost in a
    /// crash, or its bytes no longer match).
    #[error("session {session} keeps no blob with SHA-256 {digest}")]
    NoSuchBlob {
        /// The session.
        session: Uuid,
        /// The digest asked for.
        digest: String,
    },
    /// The agent file or spec is unusable.
    #[error("agent spec {origin}: {reason}")]
    Spec {
        /// File or session the spec came from.
        origin: String,
        /// Why.
        reason: String,
    },
    /// The model could not be reached or answered garbage.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The request does not fit the session's state.
    #[error("session {session}: {reason}")]
    InvalidRequest {
        /// The session.
        session: Uuid,
        /// Why.
        reason: String,
    },
    /// A new session's first message cannot be taken; nothing was recorded.
    #[error("the session was not started: {reason}")]
    NotStarted {
        /// Why.
        reason: String,
    },
    /// A signing key or a public key is unusable.
    /// No schedule of this id in the store.
    #[error("no schedule {0} in this store")]
    NoSuchSchedule(Uuid),
    /// A schedule asked for cannot run as given.
    #[error("schedule: {0}")]
    Schedule(String),
    #[error("{0}")]
    Signing(String),
    /// A master key is unusable.
    #[error("{0}")]
    MasterKey(String),
    /// The session's content was erased: nothing runs in it again.
    #[error("session {session} was erased by {by} ({reason}): its content is gone, and nothing runs in it again")]
    Erased {
        /// The session.
        session: Uuid,
        /// Who erased it.
        by: String,
        /// Why.
        reason: String,
    },
    /// A tool could not be set up.
    #[error(transparent)]
    Tool(#[from] tools::ToolError),
    /// The daemon cannot listen on its address.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No tenant of this name (never added), or not one the caller may
    /// name.
    #[error("no tenant {0:?}")]
    NoSuchTenant(String),
    /// What was asked of a tenant cannot be done: a name that is not one,
    /// a name taken, limits that are not numbers; the message says why.
    #[error("tenant: {0}")]
    Tenant(String),
    /// A tenant's session was asked for something only the operator may
    /// do, or names what the tenant may not reach; the message says why.
    #[error("{0}")]
    Forbidden(String),
    /// The daemon cannot run as asked (its token, its address, its limits,
    /// its server); the message says what and how to fix it.
    #[error("{0}")]
    Daemon(String),
}
