//! What the commands do to sessions, whoever holds the store: the log
//! opened here ([`crate::local::Local`]) or the daemon that holds the data
//! directory ([`crate::remote::Remote`]). Each command is written once
//! against [`Sessions`] (in `commands.rs`), so it prints the same and
//! exits the same either way; the answers are the API's own types
//! ([`runtime::api`]), the ones the daemon's handlers give.

use crate::commands::StreamToStdout;
use anyhow::Result;
use replay::AgentSpec;
use runtime::api::{
    Approve, DecisionAnswer, Forked, PostMessage, ReplayView, RerunReport, Resolve, SessionDiff,
    SessionSummary, TurnOutcome, Verified,
};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use uuid::Uuid;

/// A person's decision on one call, as the API takes it.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub enum Decision {
    /// Settles a call in doubt (retry, skip with a result, fail).
    Resolve(Resolve),
    /// Approves or denies a call that waits for approval.
    Approve(Approve),
}

impl Decision {
    /// Whether the session is to go on once the decision is recorded.
    pub fn proceeds(&self) -> bool {
        match self {
            Decision::Resolve(d) => d.proceed,
            Decision::Approve(d) => d.proceed,
        }
    }

    /// The API's name for this kind of decision (the last path segment).
    pub fn action(&self) -> &'static str {
        match self {
            Decision::Resolve(_) => "resolve",
            Decision::Approve(_) => "approve",
        }
    }
}

/// Where a turn's streamed text goes as it comes (none with `--json`).
pub type Stream = Option<Arc<StreamToStdout>>;

/// Called once a person's decision on a call is recorded, before the
/// session goes on.
pub type Recorded<'a> = &'a (dyn Fn() + Send + Sync);

/// Called with a new session's id as soon as it exists.
pub type Started<'a> = &'a (dyn Fn(Uuid) + Send + Sync);

/// The sessions of one store, as the commands use them. A method that runs
/// a turn runs it to its end (taking the session's lease for it, or asking
/// the daemon that runs it) and tells how it ended.
#[async_trait::async_trait]
pub trait Sessions: Send + Sync {
    /// Starts a session with `spec`, with its first user message in the
    /// same append if given (its turn then runs on a `resume`).
    async fn create(&self, spec: AgentSpec, first_message: Option<String>) -> Result<Uuid>;

    /// Every session's row, in id order.
    async fn list(&self) -> Result<Vec<SessionSummary>>;

    /// Every session's id, in id order.
    async fn ids(&self) -> Result<Vec<Uuid>>;

    /// Session `id`'s events, as [`runtime::api::EventRecord`] objects.
    async fn events(&self, id: Uuid) -> Result<Vec<Value>>;

    /// Checks session `id`'s hash chain.
    async fn verify(&self, id: Uuid) -> Result<Verified>;

    /// The dry run of session `id`.
    async fn replay(&self, id: Uuid) -> Result<ReplayView>;

    /// Session `id`'s prefix-cache misses, each explained.
    async fn cache_report(&self, id: Uuid) -> Result<runtime::api::CacheReport>;

    /// The exact bytes of session `id`'s next model request.
    async fn next_request(&self, id: Uuid) -> Result<Vec<u8>>;

    /// A new session holding session `id`'s events up to seq `at`.
    /// With `spec`, the fork runs with it from there on.
    async fn fork(&self, id: Uuid, at: u64, spec: Option<AgentSpec>) -> Result<Forked>;

    /// Erases session `id`'s content (see `Service::erase`), and unless
    /// `erase.cascade` is false every session derived from it (see
    /// `Control::erase_with_derived`); a running turn stops first.
    async fn erase(&self, id: Uuid, erase: runtime::api::Erase) -> Result<runtime::api::Erased>;

    /// Sessions `a` and `b` compared.
    async fn diff(&self, a: Uuid, b: Uuid) -> Result<SessionDiff>;

    /// Re-runs session `id`'s user messages on `spec` in a new session
    /// linked to it (`started` is told its id as soon as it exists), one
    /// turn each, until one does not end answered; then compares the two.
    async fn rerun(
        &self,
        id: Uuid,
        spec: AgentSpec,
        live_tools: bool,
        started: Started<'_>,
    ) -> Result<RerunReport>;

    /// The bytes of a blob the session keeps (binary content a tool
    /// returned by reference), by its SHA-256.
    async fn blob(&self, id: Uuid, digest: &str) -> Result<Vec<u8>>;

    /// Records a user message and runs the turn it starts.
    async fn post_message(
        &self,
        id: Uuid,
        message: PostMessage,
        stream: Stream,
    ) -> Result<TurnOutcome>;

    /// Runs the first turn of session `id`, just created with its first
    /// message ([`Sessions::create`]).
    async fn start(&self, id: Uuid, stream: Stream) -> Result<TurnOutcome>;

    /// Continues session `id`'s pending work (`extend`: start a spent
    /// budget of its turn again); a turn whose process died is recorded
    /// as resumed after the crash.
    async fn resume(&self, id: Uuid, extend: bool, stream: Stream) -> Result<TurnOutcome>;

    /// Creates the schedule `request` asks for (its agent, if any, given
    /// as `spec`); returns its id.
    async fn create_schedule(
        &self,
        request: runtime::api::CreateSchedule,
        spec: Option<AgentSpec>,
    ) -> Result<Uuid>;

    /// Every schedule, removed ones too.
    async fn schedules(&self) -> Result<Vec<runtime::api::ScheduleView>>;

    /// Removes schedule `id`: it fires no more.
    async fn remove_schedule(&self, id: Uuid) -> Result<()>;

    /// Delivers `wake`'s event to session `id`, which sleeps until it;
    /// then runs the turn that goes on.
    async fn wake(&self, id: Uuid, wake: runtime::api::Wake, stream: Stream)
        -> Result<TurnOutcome>;

    /// Records `decision` on call `call` of session `id`; then, as the
    /// decision asks (`continue`) and unless other calls still wait, runs
    /// the session on.
    async fn decide(
        &self,
        id: Uuid,
        call: &str,
        decision: Decision,
        recorded: Recorded<'_>,
        stream: Stream,
    ) -> Result<DecisionAnswer>;

    /// Adds the tenant `request` names, as `by` asks; its first token.
    async fn add_tenant(
        &self,
        request: runtime::api::CreateTenant,
        by: &str,
    ) -> Result<runtime::api::TenantToken>;

    /// Every tenant, erased ones too.
    async fn tenants(&self) -> Result<Vec<runtime::api::TenantView>>;

    /// Issues another token of tenant `name`.
    async fn issue_token(&self, name: &str, by: &str) -> Result<runtime::api::TenantToken>;

    /// Revokes every token of tenant `name`.
    async fn revoke_tokens(&self, name: &str, by: &str) -> Result<runtime::api::TokensRevoked>;

    /// Sets tenant `name`'s limits as `set` says.
    async fn set_tenant(
        &self,
        name: &str,
        set: runtime::api::SetTenant,
        by: &str,
    ) -> Result<runtime::api::TenantView>;

    /// Erases tenant `name` (see `Control::erase_tenant`).
    async fn erase_tenant(
        &self,
        name: &str,
        erase: runtime::api::EraseTenant,
    ) -> Result<runtime::api::TenantErased>;

    /// Spend, as `query` asks.
    async fn spend(&self, query: runtime::api::SpendQuery) -> Result<runtime::api::SpendReport>;

    /// Writes session `session`'s records (default: every session's) as
    /// JSON lines to `output` (default: stdout).
    async fn export(&self, session: Option<Uuid>, output: Option<&Path>) -> Result<Exported>;

    /// Reads JSON lines written by `export` from `input` (default: stdin)
    /// into the store as `policy` allows, verifies every session it wrote
    /// to, and puts each at rest (see `Service::at_rest_after_import`).
    async fn import(
        &self,
        input: Option<&Path>,
        policy: runtime::store::Policy,
    ) -> Result<ImportReport>;
}

/// What an import stored, and of each session it stored records of, what
/// a session of it reaches and whether it was put at rest.
pub struct ImportReport {
    /// Records and sessions.
    pub imported: runtime::store::Imported,
    /// Each session stored to: its id, what it reaches (a line each), why
    /// its spec is refused if it is, and its status now.
    pub sessions: Vec<(Uuid, Vec<String>, Option<String>, String)>,
}

/// What an export wrote.
pub struct Exported {
    /// Records written.
    pub records: u64,
    /// Sessions they belong to.
    pub sessions: usize,
}

/// A session as a person names it: its id, or any prefix of it that no
/// other session of the store shares (`mneme sessions` shows the shortest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRef(String);

impl std::str::FromStr for SessionRef {
    type Err = String;

    fn from_str(text: &str) -> Result<SessionRef, String> {
        let text = text.trim().to_ascii_lowercase();
        let fits = |c: char| c.is_ascii_hexdigit() || c == '-';
        if text.is_empty() || text.len() > 36 || !text.chars().all(fits) {
            return Err(format!(
                "{text:?} is not a session id, nor the start of one (hex digits and dashes, as `mneme sessions` shows them)"
            ));
        }
        Ok(SessionRef(text))
    }
}

impl std::fmt::Display for SessionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl SessionRef {
    /// The one session of `sessions` this names. A whole id is taken as it
    /// is (whether the session exists is for the command to find); a
    /// prefix must name exactly one session.
    pub async fn resolve(&self, sessions: &dyn Sessions) -> Result<Uuid> {
        if let (36, Ok(id)) = (self.0.len(), Uuid::parse_str(&self.0)) {
            return Ok(id);
        }
        let ids = sessions.ids().await?;
        let matching: Vec<Uuid> = (ids.into_iter())
            .filter(|id| id.to_string().starts_with(&self.0))
            .collect();
        match matching.as_slice() {
            [id] => Ok(*id),
            [] => Err(NoSession(self.0.clone()).into()),
            [first, second, ..] => anyhow::bail!(
                "{} sessions begin with {} ({first}, {second}, …): give more of the id",
                matching.len(),
                self.0
            ),
        }
    }
}

/// No session has the id (or the start of one) given.
#[derive(Debug, thiserror::Error)]
#[error("no session {0}")]
pub struct NoSession(pub String);
