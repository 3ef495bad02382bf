//! What can be asked of a session, whoever asks: the command line running
//! it in place, or the daemon scheduling it among many. Each operation is
//! written once, here: hold the session (its lease, and whatever the face
//! keeps so that none of its turns runs meanwhile), load it, record what
//! the operation records, give it up, and have the turn that follows run
//! by the face ([`Turns`]). What a turn records before its drive, by how
//! it starts, is written once too ([`Service::open_turn`]).

pub mod crash;
pub use crate::inbox::{Answer, Inboxes, Refused};
pub use crate::lease::{owner_name, HeldLease, DEFAULT_TTL};
pub use crate::outbound::{open_file_limit, open_files};
pub use crate::pause::{ask as pause_asked, Listening, PAUSED_ON_REQUEST};
pub use crate::preflight::{check as preflight, check_with as preflight_with, reach, Verdict};
pub use crate::schedule::delivered;
pub use crate::service::{edited_arguments, resolution};
pub use crate::sleep::is_event_name;

use crate::error::RuntimeError;
use crate::service::Service;
use crate::session::Session;
use crate::snapshot::Summary;
use api::TurnEnd;
use replay::{AgentSpec, Resolution};
use std::future::Future;
use std::pin::Pin;
use uuid::Uuid;

/// The reason recorded in derived session `found`'s erasure, erased with
/// session `root` for `reason`: that reason, and what it was erased with.
pub fn erased_with(reason: &str, root: Uuid, found: &crate::service::Derived) -> String {
    let how = if found.from == root {
        format!("its {}", found.link)
    } else {
        format!("a {} of {}, derived from it", found.link, found.from)
    };
    format!("{reason} (erased with session {root}: {how})")
}

/// Reason recorded when a shutdown pauses a turn; such sessions are resumed
/// when a daemon starts again.
pub const SHUTDOWN_REASON: &str = "daemon shutting down";

/// How a turn starts: what is recorded before its drive.
#[derive(Debug)]
pub enum TurnStart {
    /// The first turn of a session created with its first message:
    /// nothing more to record.
    First,
    /// A new user message, after adopting the tools the session's MCP
    /// servers list now when `refresh_tools` names who asks. `recorded` is
    /// told the message's seq as soon as it is durable.
    Message {
        /// What the user said.
        text: String,
        /// Who asks to adopt the MCP servers' current tools first, if anyone.
        refresh_tools: Option<String>,
        /// Told the seq the message was recorded at.
        recorded: Option<tokio::sync::oneshot::Sender<u64>>,
    },
    /// Continue pending work as `by` asks (a paused, failed or interrupted
    /// session); `extend_budget` starts a spent budget of the turn again.
    Resume {
        /// Who asks.
        by: String,
        /// Start the turn's budgets again.
        extend_budget: bool,
    },
    /// Continue a session whose process died mid-turn (or whose daemon's
    /// shutdown paused it), found by `by` (recovery, a lease takeover).
    Recover {
        /// What found it.
        by: &'static str,
    },
    /// What fell due: deny the calls whose approval expired, wake the
    /// sleeping calls whose time (or deadline) came, and go on if nothing
    /// else waits.
    Expire,
    /// Deliver the messages that arrived mid-turn, if they still wait.
    Deliver,
    /// Go on after an event woke a sleeping call ([`Control::wake`]):
    /// nothing more to record.
    Woken,
    /// A schedule's firing sends `text` (marked as `by`'s), unless the
    /// session holds it already (a firing started again after a crash):
    /// then nothing is recorded, and nothing runs.
    Scheduled {
        /// The message.
        text: String,
        /// The firing.
        by: replay::schedule::ScheduledBy,
    },
}

/// What opening a turn found.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// The turn goes on: drive it.
    Drive,
    /// Nothing to drive: the turn ends as this says (approvals expired,
    /// but other calls still wait).
    Ended(TurnEnd),
}

/// Whether a session stopped mid-turn without a person's say: its process
/// died, or a shutdown paused it. Such a session is resumed by whoever
/// takes it over. Never a sub-agent (its parent's turn resumes it), nor a
/// fork whose turn nobody started (it was opened in the history the fork
/// copied: recovery ran such forks' model turns, and their tools).
pub fn was_interrupted(summary: &Summary) -> bool {
    let shut_down = summary.paused.as_deref() == Some(SHUTDOWN_REASON);
    let stopped = summary.status == "running" || (shut_down && !summary.waits_for_a_person);
    stopped && summary.parent.is_none() && !summary.never_started_fork()
}

impl Service {
    /// Records in `session` (held under its lease) what `start` records
    /// before a drive, and says whether the turn goes on.
    pub async fn open_turn(
        &self,
        session: &mut Session,
        start: TurnStart,
    ) -> Result<Opened, RuntimeError> {
        match start {
            TurnStart::First | TurnStart::Deliver | TurnStart::Woken => {}
            TurnStart::Message {
                text,
                refresh_tools,
                recorded,
            } => {
                if let Some(by) = refresh_tools {
                    crate::mcp::refresh(session, &by).await?;
                }
                let seq = self.post_message(session, text).await?;
                if let Some(recorded) = recorded {
                    let _ = recorded.send(seq);
                }
            }
            TurnStart::Scheduled { text, by } => {
                if crate::schedule::delivered(session.state(), by) {
                    let status = session.state().status();
                    let why = format!("the firing's message is held already ({status})");
                    return Ok(Opened::Ended(TurnEnd::Paused(why)));
                }
                self.post_scheduled(session, text, by).await?;
            }
            TurnStart::Resume { .. } | TurnStart::Recover { .. }
                if crate::transfer::importing(self.log().as_ref(), session.id()).await? =>
            {
                return Err(RuntimeError::InvalidRequest {
                    session: session.id(),
                    reason: "an import of it did not finish: nothing runs it until that import is run again to its end".into(),
                });
            }
            TurnStart::Resume { by, extend_budget } => {
                // Not stopped, yet running, and its lease ours: what ran
                // it died (a turn no step of which was recorded just runs).
                if !self.reopen(session, &by, extend_budget).await? {
                    self.resume_interrupted(session, &by).await?;
                }
            }
            // Another process may have finished it, or a person paused it,
            // before this one got the lease: then there is nothing to do.
            TurnStart::Recover { by } => {
                if was_interrupted(&Summary::of(session.state()))
                    && !self.reopen(session, by, false).await?
                {
                    self.resume_interrupted(session, by).await?;
                }
            }
            TurnStart::Expire => {
                let now = crate::text::now_ms();
                let expired = self.expire_approvals(session, now).await?;
                let woke = self.wake_due(session, now).await?;
                match session.state().status() {
                    replay::Status::Running => {}
                    replay::Status::Sleeping => {
                        return Ok(Opened::Ended(crate::sleep::turn_end(session.state())))
                    }
                    // Nothing expired (a person decided meanwhile), or
                    // other calls still wait: nothing runs.
                    _ => {
                        let reason = format!("{} approvals expired", expired.len());
                        return Ok(Opened::Ended(TurnEnd::Paused(reason)));
                    }
                }
                let id = session.id();
                if !expired.is_empty() {
                    let calls = expired.join(", ");
                    crate::log_line!(
                        "mneme: session {id}: the approval of {calls} expired; the turn goes on"
                    );
                }
                if !woke.is_empty() {
                    crate::log_line!(
                        "mneme: session {id}: {} woke; the turn goes on",
                        woke.join(", ")
                    );
                }
            }
        }
        Ok(Opened::Drive)
    }
}

/// A turn under way (or to be run when awaited), ending as it ends.
pub type TurnTask = Pin<Box<dyn Future<Output = Result<TurnEnd, RuntimeError>> + Send>>;

/// A session held for a change: its lease, and what the face keeps so
/// that none of its own turns runs meanwhile (the daemon's turn lock).
pub struct Hold {
    lease: HeldLease,
    _guard: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Hold {
    /// `lease` held, with `guard` kept as long as the hold.
    pub fn new(lease: HeldLease, guard: Option<Box<dyn std::any::Any + Send + Sync>>) -> Hold {
        Hold {
            lease,
            _guard: guard,
        }
    }
}

/// How a face runs the turns of its sessions.
#[async_trait::async_trait]
pub trait Turns: Send + Sync {
    /// Holds session `id` for a change (see [`Hold`]); refused, naming
    /// the owner, while another process runs it.
    async fn hold(&self, id: Uuid) -> Result<Hold, RuntimeError>;

    /// Stops a turn of `id` that runs, here at its next step, elsewhere
    /// waited out (before a cancel or an erasure).
    async fn stop(&self, id: Uuid) -> Result<(), RuntimeError>;

    /// The turn `start` opens, run to its end (by the time it is awaited,
    /// or at once in the background).
    fn run(&self, id: Uuid, start: TurnStart) -> TurnTask;

    /// Told that `session` changed outside a turn (a decision, a fork).
    fn changed(&self, _session: &Session) {}
}

/// A person's decision on one call.
#[derive(Debug, Clone)]
pub enum Decision {
    /// Settles a call in doubt.
    Resolve(Resolution),
    /// Approves (with the arguments to run it with, if edited) or denies
    /// a call that waits for approval.
    Approve {
        /// Approved, or denied.
        approved: bool,
        /// Arguments the tool runs with instead of the model's.
        args: Option<String>,
    },
}

/// The operations on sessions of a service, with their turns run by `T`.
pub struct Control<T> {
    service: Service,
    turns: T,
}

impl<T: Turns> Control<T> {
    /// Operations on `service`'s sessions, their turns run by `turns`.
    pub fn new(service: Service, turns: T) -> Control<T> {
        Control { service, turns }
    }

    /// The service the operations use.
    pub fn service(&self) -> &Service {
        &self.service
    }

    /// How turns run.
    pub fn turns(&self) -> &T {
        &self.turns
    }

    /// A new session of `spec`, with its first message in the same append
    /// if given (its turn then runs on [`Control::start`]).
    pub async fn create(
        &self,
        spec: AgentSpec,
        first_message: Option<String>,
    ) -> Result<Uuid, RuntimeError> {
        let session = match first_message {
            Some(text) => self.service.start(spec, text).await?,
            None => self.service.create(spec).await?,
        };
        self.turns.changed(&session);
        Ok(session.id())
    }

    /// The first turn of session `id`, created with its first message.
    pub fn start(&self, id: Uuid) -> TurnTask {
        self.turns.run(id, TurnStart::First)
    }

    /// Records a user message and runs the turn it starts.
    pub fn post_message(&self, id: Uuid, message: TurnStart) -> TurnTask {
        self.turns.run(id, message)
    }

    /// Continues session `id`'s pending work as `by` asks.
    pub fn resume(&self, id: Uuid, by: &str, extend_budget: bool) -> TurnTask {
        let by = by.to_string();
        self.turns.run(id, TurnStart::Resume { by, extend_budget })
    }

    /// Records `decision` by `by` on call `call` of session `id`. Returns
    /// whether the session may go on now (no other call waits for a person,
    /// no pause of its own): then [`Control::resume`] it, as `by`.
    pub async fn decide(
        &self,
        id: Uuid,
        call: &str,
        decision: Decision,
        by: &str,
    ) -> Result<bool, RuntimeError> {
        let (hold, mut session) = self.held(id).await?;
        let recorded = match decision {
            Decision::Resolve(resolution) => {
                (self.service)
                    .resolve(&mut session, call, resolution, by)
                    .await
            }
            Decision::Approve { approved, args } => {
                (self.service)
                    .decide_approval(&mut session, call, approved, by, args.as_deref())
                    .await
            }
        };
        self.done(hold, &session, recorded).await
    }

    /// Delivers event `name` with `payload` to session `id`: wakes the
    /// call sleeping until it ([`Service::wake_by_event`]; refused when none
    /// does). Returns the call it woke; the turn then goes on with
    /// [`Control::go_on`].
    pub async fn wake(
        &self,
        id: Uuid,
        name: &str,
        payload: &serde_json::Value,
    ) -> Result<String, RuntimeError> {
        let (hold, mut session) = self.held(id).await?;
        let woke = self
            .service
            .wake_by_event(&mut session, name, payload)
            .await;
        self.done(hold, &session, woke).await
    }

    /// Pauses session `id`, which sleeps ([`Service::pause_sleeping`]).
    pub async fn pause_sleeping(&self, id: Uuid) -> Result<(), RuntimeError> {
        self.service.refuse_unless_asleep(id).await?;
        let (hold, mut session) = self.held(id).await?;
        let paused = self.service.pause_sleeping(&mut session).await;
        self.done(hold, &session, paused).await
    }

    /// The turn of session `id` that goes on after [`Control::wake`].
    pub fn go_on(&self, id: Uuid) -> TurnTask {
        self.turns.run(id, TurnStart::Woken)
    }

    /// Cancels session `id` as `by` asks: a running turn stops first.
    pub async fn cancel(&self, id: Uuid, by: &str) -> Result<(), RuntimeError> {
        self.turns.stop(id).await?;
        let (hold, mut session) = self.held(id).await?;
        let cancelled = self.service.cancel(&mut session, by).await;
        self.done(hold, &session, cancelled).await
    }

    /// Erases session `id`'s content for good, as `by` asks and why: a
    /// running turn stops first.
    pub async fn erase(&self, id: Uuid, reason: &str, by: &str) -> Result<(), RuntimeError> {
        self.turns.stop(id).await?;
        let (hold, mut session) = self.held(id).await?;
        let erased = self.service.erase(&mut session, reason, by).await;
        self.done(hold, &session, erased).await
    }

    /// Erases session `id` as `request` asks, and with it (unless
    /// `request.cascade` is false) every session derived from it
    /// ([`Service::derived`]: its forks, reruns and sub-agents, and
    /// theirs), each of which holds a copy of its content under a key of
    /// its own. Each derived session records its own `SessionErased`, its
    /// reason saying it was erased with `id` ([`erased_with`]); one erased
    /// already is skipped (a key a crash left is destroyed), one that
    /// cannot be erased is named with why, and the rest go on. `id` is
    /// erased first: a crash between erasures leaves a state a second call
    /// finishes, the links being kept after an erasure. `each` is told
    /// each session this touched (erased, or failed), as soon as it has.
    /// Without cascade, the answer names the derived sessions that still
    /// hold copies; it is refused, erasing nothing, where a fork shares
    /// `id`'s records (its history would go with them).
    pub async fn erase_with_derived(
        &self,
        id: Uuid,
        request: &api::Erase,
        each: &(dyn Fn(Uuid) + Send + Sync),
    ) -> Result<api::Erased, RuntimeError> {
        use api::DerivedOutcome as Outcome;
        self.service.ensure_exists(id).await?;
        let derived = self.service.derived(id).await?;
        if !request.cascade {
            self.service.refuse_if_shared(id, &derived).await?;
        }
        let erased = self.erase(id, &request.reason, &request.by).await;
        each(id);
        erased?;
        let mut answer = api::Erased {
            session: id,
            status: api::SessionStatus::Erased,
            erased: vec![id],
            derived: Vec::with_capacity(derived.len()),
        };
        for found in derived {
            let (outcome, error) = match (found.erased, request.cascade) {
                (true, false) => (Outcome::AlreadyErased, None),
                (false, false) => (Outcome::Kept, None),
                (already, true) => {
                    let reason = erased_with(&request.reason, id, &found);
                    let erased = self.erase(found.session, &reason, &request.by).await;
                    each(found.session);
                    match erased {
                        Err(e) => (Outcome::Failed, Some(e.to_string())),
                        Ok(()) if already => (Outcome::AlreadyErased, None),
                        Ok(()) => {
                            answer.erased.push(found.session);
                            (Outcome::Erased, None)
                        }
                    }
                }
            };
            answer.derived.push(api::DerivedSession {
                session: found.session,
                from: found.from,
                link: found.link,
                outcome,
                error,
            });
        }
        Ok(answer)
    }

    /// Erases tenant `name` for good, as `by` asks and why: records it
    /// erased in the registry (its tokens revoked: nothing of it is done
    /// again), then destroys its key (every session of it, wrapped by that
    /// key, unreadable at once, its chain still verifying), then erases each
    /// of its sessions on its own (a running turn stops first; each records
    /// its `SessionErased` and its own key is destroyed), telling `each`.
    /// Refused, before anything is recorded, when the tenant has sessions
    /// and no key: they were written without encryption, and records are
    /// never rewritten.
    pub async fn erase_tenant(
        &self,
        name: &str,
        reason: &str,
        by: &str,
        each: &(dyn Fn(Uuid) + Send + Sync),
    ) -> Result<api::TenantErased, RuntimeError> {
        let service = &self.service;
        let registry = service.tenants().registry().await?;
        let tenant = (registry.tenants.get(name))
            .ok_or_else(|| RuntimeError::NoSuchTenant(name.to_string()))?
            .clone();
        let sessions = service.sessions_of_tenant(name).await?;
        let store = service.log().side_store();
        let kept = store.get_key(tenant.key).await?;
        let had_key = kept
            .as_deref()
            .is_some_and(|k| k != crate::privacy::ERASED_TENANT_KEY);
        if kept.is_none() && !sessions.is_empty() {
            return Err(RuntimeError::Tenant(format!(
                "cannot erase tenant {name}: its {} sessions were written without encryption (mneme had no --master-key when they began), so their content cannot be erased: records are never rewritten",
                sessions.len()
            )));
        }
        service.tenants().mark_erased(name, reason, by).await?;
        // Its schedules start nothing more.
        for id in service.schedule_ids().await? {
            let state = service.schedule(id).await?;
            let spec = state.spec.as_ref();
            let whose = spec
                .and_then(|s| s.tenant.as_ref())
                .map(|t| t.name.as_str());
            if whose == Some(name) && state.removed.is_none() {
                service.remove_schedule(id, by).await?;
            }
        }
        // The one key: once it is gone, every session of the tenant reads
        // as erased. Its slot then holds a mark, so no process makes the
        // tenant a key again (one made meanwhile is destroyed in turn).
        loop {
            store.destroy_key(tenant.key).await?;
            let mark = crate::privacy::ERASED_TENANT_KEY;
            if store.put_key(tenant.key, mark).await? == mark {
                break;
            }
        }
        let mut answer = api::TenantErased {
            tenant: name.to_string(),
            key_destroyed: had_key,
            erased: Vec::new(),
            not_erased: Vec::new(),
        };
        let why = format!("{reason} (tenant {name} erased)");
        for id in sessions {
            let erased = self.erase(id, &why, by).await;
            each(id);
            match erased {
                Ok(()) => answer.erased.push(id),
                Err(e) => answer.not_erased.push(api::NotErased {
                    session: id,
                    error: e.to_string(),
                }),
            }
        }
        Ok(answer)
    }

    /// A new session holding session `id`'s events up to seq `at`, run
    /// with `spec` from there on if given (`by` recorded as who changed it).
    pub async fn fork(
        &self,
        id: Uuid,
        at: u64,
        spec: Option<(AgentSpec, &str)>,
    ) -> Result<Uuid, RuntimeError> {
        let child = self.service.fork(id, at, spec).await?;
        self.turns.changed(&child);
        Ok(child.id())
    }

    /// Re-runs session `id`'s user messages on `spec` in a new session
    /// linked to it (`started` is told its id as soon as it exists), one
    /// turn each, until one does not end answered; then compares the two.
    /// A turn that failed is in the log: the report says where it stopped.
    pub async fn rerun(
        &self,
        id: Uuid,
        spec: AgentSpec,
        live_tools: bool,
        started: &(dyn Fn(Uuid) + Send + Sync),
    ) -> Result<api::RerunReport, RuntimeError> {
        let (session, rest) = self.service.start_rerun(id, spec, live_tools).await?;
        let new = session.id();
        self.turns.changed(&session);
        drop(session);
        started(new);
        let mut end = self.start(new).await;
        for text in rest {
            if !matches!(end, Ok(TurnEnd::Answered(_) | TurnEnd::CutOffAnswer(_))) {
                break;
            }
            let message = TurnStart::Message {
                text,
                refresh_tools: None,
                recorded: None,
            };
            end = self.post_message(new, message).await;
        }
        if let Err(e) = end {
            crate::warn_line!("mneme: rerun {new}: {e}");
        }
        crate::rerun::report(self.service.log().as_ref(), id, new).await
    }

    /// Session `id`, held for a change and loaded.
    async fn held(&self, id: Uuid) -> Result<(Hold, Session), RuntimeError> {
        self.service.ensure_exists(id).await?;
        let hold = self.turns.hold(id).await?;
        let session = self.service.load(id).await?;
        Ok((hold, session))
    }

    /// Gives `hold` up once the change to `session` is `recorded` (or
    /// failed: then nothing is under way, and whoever looks next may take
    /// it over).
    async fn done<R>(
        &self,
        hold: Hold,
        session: &Session,
        recorded: Result<R, RuntimeError>,
    ) -> Result<R, RuntimeError> {
        match &recorded {
            Ok(_) => hold.lease.release().await,
            Err(_) => hold.lease.lapse().await,
        }
        self.turns.changed(session);
        recorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::{Derivation, DerivedOutcome, Erase};
    use eventlog::{Durability, EventLog, SledLog};
    use replay::Event;
    use std::sync::Arc;
    use std::time::Duration;

    /// Holds sessions under a lease of its own; runs no turn.
    struct NoTurns(Arc<dyn EventLog>);

    #[async_trait::async_trait]
    impl Turns for NoTurns {
        async fn hold(&self, id: Uuid) -> Result<Hold, RuntimeError> {
            let lease =
                HeldLease::acquire(self.0.clone(), id, "test", Duration::from_secs(30)).await?;
            Ok(Hold::new(lease, None))
        }

        async fn stop(&self, _id: Uuid) -> Result<(), RuntimeError> {
            Ok(())
        }

        fn run(&self, _id: Uuid, _start: TurnStart) -> TurnTask {
            unreachable!("no turn runs in these tests")
        }
    }

    fn spec() -> AgentSpec {
        toml::from_str("name = \"t\"\n[model]\nprovider = \"scripted\"\nscript = \"unused.json\"\n")
            .unwrap()
    }

    /// A session `root` with a message; its fork `fork` (at that message),
    /// the fork's own fork `grandchild`, a rerun `rerun` of `root`, a
    /// sub-agent `child` of it, and a session of its own, `other`. Each but
    /// `plain` has a key, as under a master key.
    struct Family {
        control: Control<NoTurns>,
        root: Uuid,
        fork: Uuid,
        grandchild: Uuid,
        rerun: Uuid,
        child: Uuid,
        other: Uuid,
    }

    async fn family(dir: &std::path::Path) -> Family {
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir).unwrap());
        let service = Service::new(log.clone(), Durability::Flushed);
        let mut root = service.create(spec()).await.unwrap();
        let text = "my card is 4111".to_string();
        service.post_message(&mut root, text).await.unwrap();
        let root = root.id();
        let fork = service.fork(root, 2, None).await.unwrap().id();
        let grandchild = service.fork(fork, 3, None).await.unwrap().id();
        let (rerun, _) = service.start_rerun(root, spec(), false).await.unwrap();
        let mut child = service.create(spec()).await.unwrap();
        let spawned = Event::SpawnedBy {
            parent: root,
            seq: 2,
            call_id: "call_0_0".into(),
        };
        child.append(vec![spawned], None).await.unwrap();
        let other = service.create(spec()).await.unwrap().id();
        let family = Family {
            control: Control::new(service, NoTurns(log.clone())),
            root,
            fork,
            grandchild,
            rerun: rerun.id(),
            child: child.id(),
            other,
        };
        for id in family.all() {
            log.side_store().put_key(id, b"wrapped").await.unwrap();
        }
        family
    }

    impl Family {
        fn all(&self) -> [Uuid; 6] {
            let (root, fork, grandchild) = (self.root, self.fork, self.grandchild);
            [root, fork, grandchild, self.rerun, self.child, self.other]
        }

        fn log(&self) -> &Arc<dyn EventLog> {
            self.control.service().log()
        }

        async fn erasure(&self, id: Uuid) -> Option<(String, String)> {
            let session = self.control.service().load(id).await.unwrap();
            session.state().erased.clone()
        }

        async fn keyed(&self, id: Uuid) -> bool {
            self.log().side_store().get_key(id).await.unwrap().is_some()
        }
    }

    fn erase(cascade: bool) -> Erase {
        Erase {
            reason: "asked".into(),
            by: "dpo".into(),
            cascade,
        }
    }

    fn outcomes(erased: &api::Erased) -> Vec<(Uuid, DerivedOutcome)> {
        erased
            .derived
            .iter()
            .map(|d| (d.session, d.outcome))
            .collect()
    }

    #[tokio::test]
    async fn the_derived_sessions_are_found_transitively_nearest_first() {
        let dir = tempfile::tempdir().unwrap();
        let f = family(dir.path()).await;
        let derived = f.control.service().derived(f.root).await.unwrap();
        let found: Vec<_> = derived
            .iter()
            .map(|d| (d.session, d.from, d.link))
            .collect();
        let mut first = vec![
            (f.fork, f.root, Derivation::Fork),
            (f.rerun, f.root, Derivation::Rerun),
            (f.child, f.root, Derivation::SubAgent),
        ];
        first.sort_by_key(|(id, _, _)| *id);
        let mut near = found[..3].to_vec();
        near.sort_by_key(|(id, _, _)| *id);
        assert_eq!(near, first);
        assert_eq!(found[3..], [(f.grandchild, f.fork, Derivation::Fork)]);
        assert!(derived.iter().all(|d| !d.erased));
        let of_fork = f.control.service().derived(f.fork).await.unwrap();
        assert_eq!(of_fork.len(), 1);
        assert_eq!(of_fork[0].session, f.grandchild);
        assert!(f
            .control
            .service()
            .derived(f.other)
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn an_erasure_reaches_every_derived_session_each_recording_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = family(dir.path()).await;
        let touched = std::sync::Mutex::new(Vec::new());
        let each = |id| touched.lock().unwrap().push(id);
        let erased = (f.control.erase_with_derived(f.root, &erase(true), &each))
            .await
            .unwrap();
        assert_eq!(erased.erased[0], f.root);
        assert_eq!(erased.erased.len(), 5, "{erased:?}");
        assert_eq!(*touched.lock().unwrap(), erased.erased);
        assert!(erased
            .derived
            .iter()
            .all(|d| d.outcome == DerivedOutcome::Erased));
        for id in &erased.erased {
            assert!(!f.keyed(*id).await, "{id} keeps its key");
        }
        let (by, reason) = f.erasure(f.grandchild).await.unwrap();
        assert_eq!(by, "dpo");
        let said = format!(
            "asked (erased with session {}: a fork of {}, derived from it)",
            f.root, f.fork
        );
        assert_eq!(reason, said);
        let (_, reason) = f.erasure(f.child).await.unwrap();
        assert_eq!(
            reason,
            format!("asked (erased with session {}: its sub-agent)", f.root)
        );
        assert_eq!(f.erasure(f.root).await.unwrap().1, "asked");
        assert!(f.erasure(f.other).await.is_none() && f.keyed(f.other).await);

        // Again: nothing left to do, each derived one named as erased before.
        let again = (f.control.erase_with_derived(f.root, &erase(true), &|_| {}))
            .await
            .unwrap();
        assert_eq!(again.erased, [f.root]);
        assert!(again
            .derived
            .iter()
            .all(|d| d.outcome == DerivedOutcome::AlreadyErased));
        let log = crate::session::read_events(f.log().as_ref(), f.fork).await;
        let erasures = log
            .unwrap()
            .iter()
            .filter(|(_, e)| matches!(e, Event::SessionErased { .. }))
            .count();
        assert_eq!(erasures, 1, "recorded once");
    }

    #[tokio::test]
    async fn without_cascade_only_the_named_is_erased_and_the_rest_are_named_as_kept() {
        let dir = tempfile::tempdir().unwrap();
        let f = family(dir.path()).await;
        // Its forks share its records (the grandchild through the fork):
        // erased alone, it would take their history with it.
        let refused = (f.control.erase_with_derived(f.root, &erase(false), &|_| {}))
            .await
            .unwrap_err()
            .to_string();
        for id in [f.fork, f.grandchild] {
            assert!(refused.contains(&id.to_string()), "{refused}");
        }
        for id in f.all() {
            assert!(f.erasure(id).await.is_none() && f.keyed(id).await);
        }
        // An erasure of the fork reaches its own fork, and not the root
        // (it is not derived from the fork).
        let fork = (f.control.erase_with_derived(f.fork, &erase(true), &|_| {}))
            .await
            .unwrap();
        assert_eq!(fork.erased, [f.fork, f.grandchild]);
        assert!(f.erasure(f.root).await.is_none());
        // Then the root alone: its rerun and sub-agent hold copies, kept.
        let erased = (f.control.erase_with_derived(f.root, &erase(false), &|_| {}))
            .await
            .unwrap();
        assert_eq!(erased.erased, [f.root]);
        let mut said = outcomes(&erased);
        said.sort_by_key(|(id, _)| *id);
        let mut wanted = vec![
            (f.fork, DerivedOutcome::AlreadyErased),
            (f.grandchild, DerivedOutcome::AlreadyErased),
            (f.rerun, DerivedOutcome::Kept),
            (f.child, DerivedOutcome::Kept),
        ];
        wanted.sort_by_key(|(id, _)| *id);
        assert_eq!(said, wanted);
        for id in [f.rerun, f.child] {
            assert!(f.erasure(id).await.is_none() && f.keyed(id).await);
        }
    }

    /// A crash between erasures: the root erased, its fork's erasure
    /// recorded but its key not yet destroyed, the rest untouched; a
    /// second erasure finishes every one.
    #[tokio::test]
    async fn a_second_erasure_finishes_what_a_crash_left() {
        let dir = tempfile::tempdir().unwrap();
        let f = family(dir.path()).await;
        f.control.erase(f.root, "asked", "dpo").await.unwrap();
        let mut fork = f.control.service().load(f.fork).await.unwrap();
        let event = Event::SessionErased {
            reason: "asked".into(),
            by: "dpo".into(),
        };
        fork.append(vec![event], None).await.unwrap();
        let erased = (f.control.erase_with_derived(f.root, &erase(true), &|_| {}))
            .await
            .unwrap();
        let mut said = outcomes(&erased);
        said.sort_by_key(|(id, _)| *id);
        let mut wanted = vec![
            (f.fork, DerivedOutcome::AlreadyErased),
            (f.grandchild, DerivedOutcome::Erased),
            (f.rerun, DerivedOutcome::Erased),
            (f.child, DerivedOutcome::Erased),
        ];
        wanted.sort_by_key(|(id, _)| *id);
        assert_eq!(said, wanted);
        for id in [f.root, f.fork, f.grandchild, f.rerun, f.child] {
            assert!(!f.keyed(id).await, "{id} keeps its key");
        }
    }

    /// A derived session that cannot be erased (written without a key) is
    /// named with why; the others are erased all the same.
    #[tokio::test]
    async fn a_derived_session_that_cannot_be_erased_is_named_and_the_rest_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let f = family(dir.path()).await;
        f.log().side_store().destroy_key(f.rerun).await.unwrap();
        let erased = (f.control.erase_with_derived(f.root, &erase(true), &|_| {}))
            .await
            .unwrap();
        let failed = erased
            .derived
            .iter()
            .find(|d| d.session == f.rerun)
            .unwrap();
        assert_eq!(failed.outcome, DerivedOutcome::Failed);
        let error = failed.error.as_deref().unwrap();
        assert!(error.contains("without encryption"), "{error}");
        assert_eq!(erased.erased.len(), 4, "{erased:?}");
        assert!(!erased.erased.contains(&f.rerun));
    }
}
