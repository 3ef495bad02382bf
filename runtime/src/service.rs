//! Operations on sessions, shared by the command line and the daemon, so
//! both obey the same rules and report the same data.

use crate::error::RuntimeError;
use crate::runner::Runner;
use crate::session::read_events;
use crate::session::{Session, SessionObserver};
use crate::snapshot::{self, Summary};
use eventlog::SessionMeta;
use eventlog::{Durability, EventLog};
use replay::{AgentSpec, Event, Resolution, SessionOutcome, SessionState, Status};
use std::sync::Arc;
use uuid::Uuid;

/// Forks one session may have. Each holds a copy of its parent's history up
/// to its fork point (a 48 MiB session forked 20 times took 2.8 GB), so the
/// count is bounded, as a sign-in's rate of forking is in the daemon.
pub(crate) const MAX_FORKS: usize = 64;

/// Sessions of one log, driven with one durability.
#[derive(Clone)]
pub struct Service {
    pub(crate) log: Arc<dyn EventLog>,
    pub(crate) durability: Durability,
    observer: Option<Arc<dyn SessionObserver>>,
    snapshot_every: u64,
    signer: Option<Arc<crate::signing::HeadSigner>>,
    tracer: Option<Arc<crate::telemetry::Tracer>>,
    /// The store's tenants.
    tenants: Arc<crate::tenants::Tenants>,
    /// The daily caps its runners reserve requests against.
    budgets: Arc<crate::budgets::Budgets>,
    /// Each tenant's room for tool calls at once, shared by its runners.
    tenant_calls: Arc<crate::runner::TenantCalls>,
    /// The tenant this service acts for (`None`: the operator): the
    /// sessions and schedules it creates are that tenant's.
    tenant: Option<replay::tenant::Tenant>,
}

impl Service {
    /// Sessions of `log`; barriers give `durability`.
    pub fn new(log: Arc<dyn EventLog>, durability: Durability) -> Service {
        let tenants = Arc::new(crate::tenants::Tenants::new(log.clone(), durability));
        let budgets = Arc::new(crate::budgets::Budgets::new(
            log.clone(),
            durability,
            tenants.clone(),
        ));
        let tenant_calls = Arc::new(crate::runner::TenantCalls::new(tenants.clone()));
        Service {
            log,
            durability,
            observer: None,
            snapshot_every: snapshot::DEFAULT_EVERY,
            signer: None,
            tracer: None,
            tenants,
            budgets,
            tenant_calls,
            tenant: None,
        }
    }

    /// This service acting for `tenant` (`None`: the operator): the
    /// sessions and schedules it creates are the tenant's, and record it.
    pub fn for_tenant(&self, tenant: Option<replay::tenant::Tenant>) -> Service {
        Service {
            tenant,
            ..self.clone()
        }
    }

    /// The tenant this service acts for, if any.
    pub fn tenant(&self) -> Option<&replay::tenant::Tenant> {
        self.tenant.as_ref()
    }

    /// The store's tenants.
    pub fn tenants(&self) -> &Arc<crate::tenants::Tenants> {
        &self.tenants
    }

    /// Traces each turn its runners drive (see [`crate::Tracer`]).
    pub fn traced_by(mut self, tracer: Option<Arc<crate::telemetry::Tracer>>) -> Service {
        self.tracer = tracer;
        self
    }

    /// Signs each session's head at the end of each turn its runners drive
    /// (see [`crate::store::HeadSigner`]).
    pub fn signed_by(mut self, signer: Option<Arc<crate::signing::HeadSigner>>) -> Service {
        self.signer = signer;
        self
    }

    /// Reports every session's appends and barriers to `observer`.
    pub fn observed_by(mut self, observer: Arc<dyn SessionObserver>) -> Service {
        self.observer = Some(observer);
        self
    }

    /// The log.
    pub fn log(&self) -> &Arc<dyn EventLog> {
        &self.log
    }

    pub(crate) fn observe(&self, session: Session) -> Session {
        let session = session.snapshot_every(self.snapshot_every);
        match &self.observer {
            Some(observer) => session.observed_by(observer.clone()),
            None => session,
        }
    }

    /// Snapshots every `every` events (0: never); default
    /// [`snapshot::DEFAULT_EVERY`].
    pub fn snapshot_every(mut self, every: u64) -> Service {
        self.snapshot_every = every;
        self
    }

    /// Whether the store holds session `id`.
    pub async fn exists(&self, id: Uuid) -> Result<bool, RuntimeError> {
        Ok(self.log.head(id).await?.seq > 0)
    }

    /// Refuses, by name, a session the store does not hold (before a lease
    /// is taken for it: a lease of nothing would lapse and be looked at by
    /// every daemon).
    pub async fn ensure_exists(&self, id: Uuid) -> Result<(), RuntimeError> {
        if !self.exists(id).await? {
            return Err(RuntimeError::NoSuchSession(id));
        }
        Ok(())
    }

    /// Loads `id` from the log.
    pub async fn load(&self, id: Uuid) -> Result<Session, RuntimeError> {
        Ok(self.observe(Session::load(self.log.clone(), id).await?))
    }

    /// The dry run of `id`: its next request rebuilt and what resuming
    /// would do with each open call (`mneme replay`), a running session
    /// marked interrupted or pending as [`Service::mark_running`] marks
    /// its listing row. Nothing is recorded.
    pub async fn replay_view(&self, id: Uuid) -> Result<api::ReplayView, RuntimeError> {
        let session = self.load(id).await?;
        let state = session.state();
        let mut view = crate::views::replay_view(id, state);
        let top = state.parent.is_none();
        if view.status == api::SessionStatus::Running && top {
            let idle = self.log.leases().lease(id).await?.is_none();
            view.interrupted = Some(idle && state.turn_driven);
            view.pending = Some(idle && !state.turn_driven);
        }
        Ok(view)
    }

    /// Session `id`'s prefix-cache misses, each explained, from its whole
    /// log (`mneme replay --cache`). Nothing is recorded.
    pub async fn cache_report(&self, id: Uuid) -> Result<api::CacheReport, RuntimeError> {
        let events = read_events(self.log.as_ref(), id).await?;
        let events = events.into_iter().map(|(r, e)| (r.envelope.seq, e));
        Ok(api::CacheReport {
            session: id,
            misses: replay::cache::cache_misses(events),
        })
    }

    /// Session `id` as `GET /sessions/{id}` shows it: its listing row
    /// (marked interrupted or pending when running with no live lease), its
    /// answer, the owner of its live lease, the calls in doubt or waiting,
    /// and its family. Nothing is recorded.
    pub async fn session_view(&self, id: Uuid) -> Result<api::SessionView, RuntimeError> {
        let session = self.load(id).await?;
        let meta = (self.log.meta(id).await?).ok_or(RuntimeError::NoSuchSession(id))?;
        let summary = Summary::of(session.state());
        let mut row = crate::views::summary_of(&meta, &summary);
        self.mark_running(&mut row, summary.turn_driven).await?;
        let running_on = self.log.leases().lease(id).await?.map(|lease| lease.owner);
        Ok(crate::views::session_view(
            row,
            running_on,
            id,
            session.state(),
        ))
    }

    /// The exact bytes of `id`'s next model request, as it would be sent
    /// (`mneme replay --raw`). Nothing is recorded.
    pub async fn next_request(&self, id: Uuid) -> Result<Vec<u8>, RuntimeError> {
        Ok(self.load(id).await?.next_request()?.to_vec())
    }

    /// The blob of session `id` whose SHA-256 is `digest` (binary content a
    /// tool returned by reference).
    pub async fn blob(&self, id: Uuid, digest: &str) -> Result<Vec<u8>, RuntimeError> {
        self.ensure_exists(id).await?;
        crate::blobs::read(self.log.as_ref(), id, digest)
            .await?
            .ok_or_else(|| RuntimeError::NoSuchBlob {
                session: id,
                digest: digest.to_string(),
            })
    }

    /// Starts a session with `spec`; checks the spec first, and pins the
    /// tools of its MCP servers.
    pub async fn create(&self, spec: AgentSpec) -> Result<Session, RuntimeError> {
        self.begin(spec, None).await
    }

    /// Starts a session with `spec` and its first user message in one
    /// append: a crash leaves both or neither, never a session without its
    /// message. The turn runs on the next drive (a resume).
    pub async fn start(&self, spec: AgentSpec, text: String) -> Result<Session, RuntimeError> {
        self.begin(spec, Some(text)).await
    }

    async fn begin(&self, spec: AgentSpec, text: Option<String>) -> Result<Session, RuntimeError> {
        let spec = self.checked(spec).await?;
        let tenant = self.live_tenancy().await?;
        let mut first = vec![Event::SessionStarted {
            spec: Box::new(spec),
            tenant,
        }];
        if let Some(text) = &text {
            let started = SessionState::fold([(1, first[0].clone())]);
            if let Some(reason) = started.past_the_window(text) {
                return Err(RuntimeError::NotStarted { reason });
            }
            first.push(Event::UserMessage { text: text.clone() });
        }
        let first = first.into_iter().map(|e| (e, None)).collect();
        let session =
            Session::create_observed_with(self.log.clone(), first, self.observer.clone()).await?;
        let mut session = session.snapshot_every(self.snapshot_every);
        let message = text.is_some();
        if message {
            crate::control::crash::point(crate::control::crash::USER_MESSAGE_APPENDED);
        }
        session.barrier(self.durability).await?;
        if message {
            crate::control::crash::point(crate::control::crash::USER_MESSAGE_DURABLE);
        }
        Ok(session)
    }

    /// What a session this service starts records of its tenant: the
    /// tenant as the registry says now (refused once it is erased).
    pub(crate) async fn live_tenancy(&self) -> Result<Option<replay::Tenancy>, RuntimeError> {
        match &self.tenant {
            None => Ok(None),
            Some(tenant) => Ok(Some(self.tenants.live(&tenant.name).await?.tenancy())),
        }
    }

    /// `spec` checked, with its MCP tools pinned, as a session records it.
    pub(crate) async fn checked(&self, spec: AgentSpec) -> Result<AgentSpec, RuntimeError> {
        let spec = crate::mcp::pin(spec, "request").await?;
        spec.validate().map_err(|reason| RuntimeError::Spec {
            origin: "request".into(),
            reason,
        })?;
        Ok(spec)
    }

    /// Records a user message, durable before anything else happens (the
    /// first write-ahead rule). Refused while a turn is unfinished.
    pub async fn post_message(
        &self,
        session: &mut Session,
        text: String,
    ) -> Result<u64, RuntimeError> {
        self.post(session, text, None).await
    }

    /// [`Service::post_message`] of a schedule's firing: marked as `by`'s
    /// in the same append, so that a firing started again finds it.
    pub(crate) async fn post_scheduled(
        &self,
        session: &mut Session,
        text: String,
        by: replay::schedule::ScheduledBy,
    ) -> Result<u64, RuntimeError> {
        self.post(session, text, Some(by)).await
    }

    async fn post(
        &self,
        session: &mut Session,
        text: String,
        by: Option<replay::schedule::ScheduledBy>,
    ) -> Result<u64, RuntimeError> {
        let mark = by.map(|by| Event::ScheduledBy {
            schedule: by.schedule,
            tick_ms: by.tick_ms,
        });
        refuse_erased(session)?;
        if let Some(reason) = session.state().past_the_window(&text) {
            let session = session.id();
            return Err(RuntimeError::InvalidRequest { session, reason });
        }
        // Messages that arrived mid-turn wait for a turn of their own: this
        // one joins them, and that turn takes them all.
        if replay::plan(session.state()).next == replay::NextStep::Deliver {
            let policy = replay::spec::MidTurn::Queue;
            let event = Event::MidTurnMessage { text, policy };
            let seq = session
                .append(mark.into_iter().chain([event]).collect(), None)
                .await?;
            session.barrier(self.durability).await?;
            return Ok(seq);
        }
        let status = session.state().status();
        if !matches!(status, Status::Idle | Status::Failed | Status::Cancelled) {
            let id = session.id();
            return Err(RuntimeError::InvalidRequest {
                session: id,
                reason: format!(
                    "it is {status} with an unfinished turn: resume it (or resolve its calls) before sending a new message"
                ),
            });
        }
        let message = Event::UserMessage { text };
        let seq = session
            .append(mark.into_iter().chain([message]).collect(), None)
            .await?;
        crate::control::crash::point(crate::control::crash::USER_MESSAGE_APPENDED);
        session.barrier(self.durability).await?;
        crate::control::crash::point(crate::control::crash::USER_MESSAGE_DURABLE);
        Ok(seq)
    }

    /// Makes a paused or failed session runnable again, unless a person
    /// must first decide on calls in doubt, or it spent a budget of its turn
    /// and `extend_budget` is not given (which starts the budget again).
    /// Calls whose approval expired are denied first (see
    /// [`Service::expire_approvals`]). Returns whether it appended.
    pub async fn reopen(
        &self,
        session: &mut Session,
        by: &str,
        extend_budget: bool,
    ) -> Result<bool, RuntimeError> {
        refuse_erased(session)?;
        // Approvals past their deadline are denied first: the turn then
        // goes on if nothing else waits.
        let now = crate::text::now_ms();
        let expired = !self.expire_approvals(session, now).await?.is_empty();
        let state = session.state();
        let stopped = state.paused.is_some() || state.failed.is_some();
        let budget_holds = state.budget_paused && !extend_budget;
        if !stopped || budget_holds || state.a_call_waits_for_a_person() {
            // A sleep whose time came wakes; one whose time has not come
            // goes on sleeping (the turn then ends as it sleeps).
            let woke = !self.wake_due(session, now).await?.is_empty();
            return Ok(expired || woke);
        }
        let event = Event::SessionResumed {
            by: by.into(),
            extend_budget,
            after_crash: false,
        };
        session.append(vec![event], None).await?;
        session.barrier(self.durability).await?;
        self.wake_due(session, now).await?;
        Ok(true)
    }

    /// Records that `by` takes up the turn of a session whose process died
    /// in the middle of it (it is running and a process drove its turn; the
    /// caller holds its lease and knows nothing of this process runs it),
    /// so the log shows the crash and who resumed it; the turn itself goes
    /// on unchanged. Returns whether it appended (not for a session at
    /// rest, nor for a turn no process started).
    pub async fn resume_interrupted(
        &self,
        session: &mut Session,
        by: &str,
    ) -> Result<bool, RuntimeError> {
        let state = session.state();
        let interrupted = state.status() == Status::Running && state.turn_driven;
        if !interrupted || state.a_call_waits_for_a_person() {
            return Ok(false);
        }
        let event = Event::SessionResumed {
            by: by.into(),
            extend_budget: false,
            after_crash: true,
        };
        session.append(vec![event], None).await?;
        session.barrier(self.durability).await?;
        Ok(true)
    }

    /// Puts session `id`, which an import (from `origin`) just stored
    /// records of, at rest: if something would run it (it is running,
    /// failed or paused otherwise), or its agent spec is not one an agent
    /// file could give, a pause is recorded that only a person's resume
    /// (by id) ends. Returns its spec, and why it was refused if it was.
    pub async fn at_rest_after_import(
        &self,
        id: Uuid,
        origin: &str,
    ) -> Result<(Option<AgentSpec>, Option<String>), RuntimeError> {
        let mut session = self.load(id).await?;
        let state = session.state();
        let spec = state.spec.clone();
        let refused = spec.as_ref().and_then(|s| s.validate().err());
        let at_rest = matches!(
            state.status(),
            Status::Idle | Status::Cancelled | Status::Erased | Status::Empty
        );
        let already = state
            .paused
            .as_deref()
            .is_some_and(crate::transfer::at_rest_after_import);
        if (at_rest && refused.is_none()) || already || state.parent.is_some() {
            return Ok((spec, refused));
        }
        let why = match &refused {
            Some(reason) => {
                format!("; its agent spec is refused as an agent file would be: {reason}")
            }
            None => String::new(),
        };
        let event = Event::SessionPaused {
            reason: format!(
                "{} from {origin}{why}: nothing runs it until a person resumes it by id",
                crate::transfer::IMPORTED
            ),
            budget: false,
        };
        session.append(vec![event], None).await?;
        session.barrier(self.durability).await?;
        Ok((spec, refused))
    }

    /// A runner with this service's durability.
    pub fn runner(&self) -> Runner {
        let mut runner = Runner::new(self.durability)
            .with_budgets(self.budgets.clone())
            .with_tenant_calls(self.tenant_calls.clone());
        if let Some(signer) = &self.signer {
            runner = runner.with_signer(signer.clone(), crate::runner::SIGN_EVERY);
        }
        if let Some(tracer) = &self.tracer {
            runner = runner.with_tracer(tracer.clone());
        }
        runner
    }

    /// Records a person's decision on a call in doubt. Returns whether the
    /// session can continue (no other call waits for a person).
    pub async fn resolve(
        &self,
        session: &mut Session,
        call_id: &str,
        resolution: Resolution,
        by: &str,
    ) -> Result<bool, RuntimeError> {
        let decision = Event::ToolResolved {
            call_id: call_id.into(),
            resolution,
            by: by.into(),
        };
        self.decide(
            session,
            call_id,
            session.state().calls_in_doubt(),
            "is not in doubt",
            decision,
            by,
        )
        .await
    }

    /// Records a person's approval or denial of a call waiting for one; an
    /// approval may give the arguments the tool runs with instead of the
    /// model's (`args`, a JSON text, bounded like a model's reply: see
    /// [`edited_arguments`]). Refused, recording nothing, once the call's
    /// approval expired. Returns whether the session can continue (nothing
    /// else waits).
    pub async fn decide_approval(
        &self,
        session: &mut Session,
        call_id: &str,
        approved: bool,
        by: &str,
        args: Option<&str>,
    ) -> Result<bool, RuntimeError> {
        let refuse = |reason: String| RuntimeError::InvalidRequest {
            session: session.id(),
            reason,
        };
        let call = (session.state().open_calls().iter()).find(|c| c.call.id == call_id);
        if let Some(call) = call.filter(|c| c.approval_expired(crate::text::now_ms())) {
            let at = call.approval_expires_at_ms.unwrap_or_default();
            return Err(refuse(format!(
                "the approval of call {call_id:?} expired at {} (approval_timeout), so it can no \
                 longer be decided on: resuming the session records it as denied and tells the model",
                crate::views::format_time(at)
            )));
        }
        let args = match (args, approved) {
            (None, _) => None,
            (Some(_), false) => {
                return Err(refuse(format!(
                    "call {call_id:?}: edited arguments are for an approval, not a denial"
                )))
            }
            (Some(args), true) => {
                let limit = session.spec()?.model.max_response_bytes();
                Some(edited_arguments(call_id, args, limit).map_err(refuse)?)
            }
        };
        let decision = Event::ApprovalDecided {
            call_id: call_id.into(),
            approved,
            by: by.into(),
            reason: None,
            args,
        };
        let waiting = session.state().calls_awaiting_approval();
        self.decide(
            session,
            call_id,
            waiting,
            "does not wait for approval",
            decision,
            by,
        )
        .await
    }

    /// Wakes every call of `session` (held under its lease) whose time or
    /// deadline is at or before `now_ms`, unless the session is paused,
    /// cancelled or erased: records each call's `Woken` and `ToolFinished`
    /// (saying how late), durably. Returns the calls it woke.
    pub async fn wake_due(
        &self,
        session: &mut Session,
        now_ms: i64,
    ) -> Result<Vec<String>, RuntimeError> {
        let (events, woke) = crate::sleep::due(session.state(), now_ms);
        if !events.is_empty() {
            crate::sleep::record(session, events, self.durability).await?;
        }
        Ok(woke)
    }

    /// Delivers event `name` with `payload` to `session` (held under its
    /// lease): the call sleeping until it wakes, with the payload in its
    /// result. Refused when no call of the session waits for that event,
    /// or the payload is larger than the call's tool keeps of a result.
    /// Returns the call it woke.
    pub async fn wake_by_event(
        &self,
        session: &mut Session,
        name: &str,
        payload: &serde_json::Value,
    ) -> Result<String, RuntimeError> {
        refuse_erased(session)?;
        let now = crate::text::now_ms();
        let (events, woke) =
            crate::sleep::by_event(session.state(), name, payload, now).map_err(|reason| {
                RuntimeError::InvalidRequest {
                    session: session.id(),
                    reason,
                }
            })?;
        crate::sleep::record(session, events, self.durability).await?;
        Ok(woke)
    }

    /// Pauses `session` (held under its lease), which sleeps, as a person
    /// asks: nothing wakes it until a resume (which wakes it at once if its
    /// time came meanwhile). Refused for a session that does not sleep.
    pub async fn pause_sleeping(&self, session: &mut Session) -> Result<(), RuntimeError> {
        refuse_unless_sleeping(session.id(), &session.state().status().to_string())?;
        let event = Event::SessionPaused {
            reason: crate::pause::PAUSED_ON_REQUEST.into(),
            budget: false,
        };
        session.append(vec![event], None).await?;
        session.barrier(self.durability).await
    }

    /// Denies, as expired, every call of `session` whose approval was due at
    /// or before `now_ms` (milliseconds since the Unix epoch; see
    /// `approval_timeout`), recorded by mneme with the reason
    /// [`replay::EXPIRED`]; when nothing else then waits for a person, the
    /// session is resumed in the same append, so its turn goes on and tells
    /// the model. Returns the calls it denied. The caller holds the lease.
    pub async fn expire_approvals(
        &self,
        session: &mut Session,
        now_ms: i64,
    ) -> Result<Vec<String>, RuntimeError> {
        let expired = session.state().approvals_expired(now_ms);
        if expired.is_empty() || session.state().erased.is_some() {
            return Ok(Vec::new());
        }
        let mut events: Vec<Event> = (expired.iter())
            .map(|call_id| Event::ApprovalDecided {
                call_id: call_id.clone(),
                approved: false,
                by: replay::EXPIRY_BY.into(),
                reason: Some(replay::EXPIRED.into()),
                args: None,
            })
            .collect();
        let waiting = session.state().calls_in_doubt().len()
            + session.state().calls_awaiting_approval().len();
        if waiting == expired.len() && !crate::pause::paused_otherwise(session.state()) {
            events.push(Event::SessionResumed {
                by: replay::EXPIRY_BY.into(),
                extend_budget: false,
                after_crash: false,
            });
        }
        session.append(events, None).await?;
        session.barrier(self.durability).await?;
        Ok(expired)
    }

    /// Records `decision` on `call_id`, one of `waiting`; resumes the session
    /// when no other call waits for a person, unless it is paused for
    /// another reason as well (a person's pause, a spent budget).
    async fn decide(
        &self,
        session: &mut Session,
        call_id: &str,
        waiting: Vec<replay::Waiting>,
        refusal: &str,
        decision: Event,
        by: &str,
    ) -> Result<bool, RuntimeError> {
        if !waiting.iter().any(|w| w.call_id == call_id) {
            let open: Vec<&str> = waiting.iter().map(|w| w.call_id.as_str()).collect();
            let open = if open.is_empty() {
                "none".to_string()
            } else {
                open.join(", ")
            };
            return Err(RuntimeError::InvalidRequest {
                session: session.id(),
                reason: format!("call {call_id:?} {refusal} (waiting: {open})"),
            });
        }
        let all_waiting = session.state().calls_in_doubt().len()
            + session.state().calls_awaiting_approval().len();
        let last = all_waiting == 1 && !crate::pause::paused_otherwise(session.state());
        let mut events = vec![decision];
        if last {
            events.push(Event::SessionResumed {
                by: by.into(),
                extend_budget: false,
                after_crash: false,
            });
        }
        session.append(events, None).await?;
        session.barrier(self.durability).await?;
        crate::control::crash::point(crate::control::crash::DECISION_APPENDED);
        Ok(last)
    }

    /// Cancels the session: nothing runs until a new user message. The
    /// caller makes sure no turn runs at the same time.
    pub async fn cancel(&self, session: &mut Session, by: &str) -> Result<(), RuntimeError> {
        let outcome = SessionOutcome::Cancelled { by: by.into() };
        session
            .append(vec![Event::SessionFinished { outcome }], None)
            .await?;
        session.barrier(self.durability).await
    }

    /// Erases the content of `session` for good: records who asked and why
    /// (`SessionErased`, durable), then destroys the session's key, so the
    /// personal fields of every event it holds read as erased from then on
    /// and its derived data as absent. The state in memory is the last copy
    /// of its content: the caller drops `session` (and any copy of its
    /// state) once this returns. The caller holds the
    /// session's lease (no turn runs). Erasing an erased session finishes
    /// what a crash may have interrupted (its key destroyed). Refused for a
    /// session written without encryption (no master key when it began):
    /// its content is in the clear in its records, and records are never
    /// rewritten.
    pub async fn erase(
        &self,
        session: &mut Session,
        reason: &str,
        by: &str,
    ) -> Result<(), RuntimeError> {
        let id = session.id();
        if session.state().erased.is_none() {
            if self.log.side_store().get_key(id).await?.is_none() {
                return Err(RuntimeError::InvalidRequest {
                    session: id,
                    reason: "it was written without encryption (mneme had no --master-key when it began), so its content cannot be erased: records are never rewritten".into(),
                });
            }
            let event = Event::SessionErased {
                reason: reason.into(),
                by: by.into(),
            };
            session.append(vec![event], None).await?;
            session.barrier(self.durability).await?;
            crate::control::crash::point(crate::control::crash::ERASE_RECORDED);
        }
        self.log.side_store().destroy_key(id).await?;
        Ok(())
    }

    /// How many forks of session `id` the store holds (not reruns, not
    /// forks of its forks).
    async fn forks_of(&self, id: Uuid) -> Result<usize, RuntimeError> {
        let listed = self.listing().await?;
        let fork_of_it =
            |summary: &Summary| summary.forked_from == Some(id) && summary.rerun_of.is_none();
        Ok(listed
            .iter()
            .filter(|(_, s)| s.as_ref().is_ok_and(fork_of_it))
            .count())
    }

    /// Every session derived from session `id`, transitively (a fork of
    /// its fork too), nearest first: its forks and reruns (their first
    /// event names it) and its sub-agents (their `SpawnedBy` names it),
    /// each holding a copy of some of its content under a key of its own.
    /// From the listing's summaries, which keep these links after an
    /// erasure, so a second erasure finds what a first one did not finish.
    pub async fn derived(&self, id: Uuid) -> Result<Vec<Derived>, RuntimeError> {
        let mut links = Vec::new();
        let mut erased = std::collections::HashSet::new();
        for (meta, summary) in self.listing().await? {
            // An unreadable session names no link that can be read.
            let Ok(summary) = summary else { continue };
            if summary.status == Status::Erased.to_string() {
                erased.insert(meta.session);
            }
            if summary.forked_from.is_some() || summary.parent.is_some() {
                links.extend(self.own_links(meta.session, &summary).await);
            }
        }
        Ok(derived_from(id, &links)
            .into_iter()
            .map(|(session, from, link)| Derived {
                session,
                from,
                link,
                erased: erased.contains(&session),
            })
            .collect())
    }

    /// Refuses, naming them, where any of `derived` (sessions derived from
    /// `id`) is a fork that shares `id`'s records, directly or through a
    /// fork between: erasing `id` alone would take their history with it.
    pub async fn refuse_if_shared(
        &self,
        id: Uuid,
        derived: &[Derived],
    ) -> Result<(), RuntimeError> {
        let mut sharing = Vec::new();
        for found in derived.iter().filter(|d| !d.erased) {
            let mut base = self.log.base(found.session).await?;
            while let Some(b) = base {
                if b.parent == id {
                    sharing.push(found.session.to_string());
                    break;
                }
                base = self.log.base(b.parent).await?;
            }
        }
        if sharing.is_empty() {
            return Ok(());
        }
        Err(RuntimeError::InvalidRequest {
            session: id,
            reason: format!(
                "{} fork(s) share its records ({}): erasing it alone would erase their history \
                 too; erase it with them (without --only-this), or erase them first",
                sharing.len(),
                sharing.join(", ")
            ),
        })
    }

    /// The links session `id` (which `summary` describes) has to the
    /// session it was derived from: read from its first append, which
    /// holds them (a fork's copy of its parent's history holds the
    /// parent's own links, which the fold also sees); from `summary` if
    /// that cannot be read.
    async fn own_links(&self, id: Uuid, summary: &Summary) -> Vec<Link> {
        // A fork that shares its parent's records starts past them.
        let base = self.log.base(id).await.ok().flatten();
        let from = base.map_or(1, |b| b.through + 1);
        let first = self
            .log
            .read(id, from, from + 1)
            .await
            .ok()
            .and_then(|records| {
                let events = records.iter().map(crate::session::decode);
                events.collect::<Result<Vec<Event>, _>>().ok()
            });
        match first {
            Some(first) => links_of(id, &first),
            None => summary_links_of(id, summary),
        }
    }

    /// Sessions last changed before `idle_since_ms` (milliseconds since
    /// the Unix epoch) whose content can still be erased: encrypted, and
    /// not erased with their key destroyed.
    pub async fn idle_since(&self, idle_since_ms: i64) -> Result<Vec<Uuid>, RuntimeError> {
        let mut idle = Vec::new();
        for meta in self.session_metas().await? {
            if meta.updated_ms < idle_since_ms
                && self.log.side_store().get_key(meta.session).await?.is_some()
            {
                idle.push(meta.session);
            }
        }
        Ok(idle)
    }

    /// Starts a new session that shares `parent`'s first `at_seq` events
    /// (its records, read through the log: nothing is copied) and goes on
    /// from there, its first own event naming them. Only at a point where
    /// no tool call is under way, so the branch never shares a call with
    /// its parent. With `spec`, the branch runs with it from there on
    /// (recorded as `SpecChanged`, its MCP tools pinned as at a start), so
    /// one history can be run on with another model or agent.
    pub async fn fork(
        &self,
        parent: Uuid,
        at_seq: u64,
        spec: Option<(AgentSpec, &str)>,
    ) -> Result<Session, RuntimeError> {
        let spec = match spec {
            None => None,
            Some((spec, by)) => Some(Event::SpecChanged {
                spec: Box::new(self.checked(spec).await?),
                by: by.to_string(),
            }),
        };
        let refuse = |reason: String| RuntimeError::InvalidRequest {
            session: parent,
            reason,
        };
        let forks = self.forks_of(parent).await?;
        if forks >= MAX_FORKS {
            return Err(refuse(format!(
                "it has {forks} forks already, the most one session may have ({MAX_FORKS}); \
                 erase one (`mneme erase`) to fork again"
            )));
        }
        if self.current_summary(parent).await?.status == Status::Erased.to_string() {
            return Err(refuse(
                "it was erased: its content is gone, there is nothing to fork".into(),
            ));
        }
        let head = self.log.head(parent).await?.seq;
        if at_seq == 0 {
            return Err(refuse(
                "cannot fork at seq 0: give the seq of an event (1 or more) to fork after".into(),
            ));
        }
        if at_seq > head {
            return Err(refuse(format!(
                "cannot fork at seq {at_seq}: the session has {head} events"
            )));
        }
        let history = self.log.read(parent, 1, at_seq).await?;
        let events = history
            .iter()
            .map(|r| crate::session::decode(r).map(|e| (r.envelope.seq, e)));
        let state = SessionState::fold(events.collect::<Result<Vec<_>, _>>()?);
        if !state
            .open_calls()
            .iter()
            .all(|c| matches!(c.phase, replay::CallPhase::Finished(_)))
        {
            return Err(refuse(format!(
                "cannot fork at seq {at_seq}: a tool call is under way there"
            )));
        }
        let forked = Event::SessionForked {
            parent,
            at_seq,
            rerun: None,
            shared: true,
        };
        // Its first event and its spec, if another, are one append.
        let own = std::iter::once(forked)
            .chain(spec)
            .map(|e| (e, None))
            .collect();
        let mut child =
            Session::fork_observed(self.log.clone(), parent, state, own, self.observer.clone())
                .await?;
        child.barrier(self.durability).await?;
        Ok(child)
    }

    /// Starts a rerun of session `original` on `spec` (`mneme rerun`): a
    /// new session linked to it (a fork at seq 0 that names the original's
    /// head and whether calls run live), started with `spec` and the
    /// original's first user message, in one append. Returns it with the
    /// original's other messages, which the caller posts one turn at a time.
    /// Its calls are answered from the original's record where one matches
    /// (see `replay::Record::answer`).
    pub async fn start_rerun(
        &self,
        original: Uuid,
        spec: AgentSpec,
        live_tools: bool,
    ) -> Result<(Session, Vec<String>), RuntimeError> {
        let all = read_events(self.log.as_ref(), original).await?;
        let refuse = |reason: &str| RuntimeError::InvalidRequest {
            session: original,
            reason: reason.to_string(),
        };
        if all
            .iter()
            .any(|(_, e)| matches!(e, Event::SessionErased { .. }))
        {
            return Err(refuse("it was erased: there is nothing to re-run"));
        }
        let through_seq = all.last().map_or(0, |(r, _)| r.envelope.seq);
        let numbered: Vec<(u64, Event)> =
            all.into_iter().map(|(r, e)| (r.envelope.seq, e)).collect();
        // The rerun is its original's tenant's, like a fork.
        let tenant = numbered.iter().find_map(|(_, e)| match e {
            Event::SessionStarted { tenant, .. } => Some(tenant.clone()),
            _ => None,
        });
        let mut messages = replay::rerun::user_messages(&numbered, through_seq).into_iter();
        let first = messages
            .next()
            .ok_or_else(|| refuse("it holds no user message to re-run"))?;
        let spec = self.checked(spec).await?;
        let rerun = replay::RerunOf {
            through_seq,
            live_tools,
        };
        let forked = Event::SessionForked {
            parent: original,
            at_seq: 0,
            rerun: Some(rerun),
            shared: false,
        };
        let started = Event::SessionStarted {
            spec: Box::new(spec),
            tenant: tenant.flatten(),
        };
        // Its link, its start and its first message are one append.
        let first = [forked, started, Event::UserMessage { text: first }];
        let first = first.into_iter().map(|e| (e, None)).collect();
        let session =
            Session::create_observed_with(self.log.clone(), first, self.observer.clone()).await?;
        let mut session = session.snapshot_every(self.snapshot_every);
        session.barrier(self.durability).await?;
        Ok((session, messages.collect()))
    }

    /// What a listing shows of a session: its stored summary while that is
    /// current, else computed from the session (snapshot and tail) and stored.
    pub async fn summary(&self, meta: &SessionMeta) -> Result<Summary, RuntimeError> {
        self.summary_at(meta.session, meta.events).await
    }

    /// Refuses session `id` unless it sleeps, read from its summary without
    /// its lease: a refused pause never holds the lease a process about to
    /// run the session's turn needs.
    pub async fn refuse_unless_asleep(&self, id: Uuid) -> Result<(), RuntimeError> {
        refuse_unless_sleeping(id, &self.current_summary(id).await?.status)
    }

    /// Refuses session `id` by name if its content was erased: nothing may
    /// be started for it.
    pub async fn refuse_if_erased(&self, id: Uuid) -> Result<(), RuntimeError> {
        if self.current_summary(id).await?.status != Status::Erased.to_string() {
            return Ok(());
        }
        refuse_erased(&self.load(id).await?)
    }

    /// The summary of session `id` as its log stands now.
    pub async fn current_summary(&self, id: Uuid) -> Result<Summary, RuntimeError> {
        self.summary_at(id, self.log.head(id).await?.seq).await
    }

    async fn summary_at(&self, id: Uuid, head: u64) -> Result<Summary, RuntimeError> {
        match snapshot::fresh_summary(self.log.as_ref(), id, head).await {
            Some(summary) => Ok(summary),
            None => self.rebuilt_summary(id).await,
        }
    }

    /// The summary of session `id` folded from its log, and stored.
    async fn rebuilt_summary(&self, id: Uuid) -> Result<Summary, RuntimeError> {
        let session = self.load(id).await?;
        // Derived data: a failure only costs speed next time.
        let _ = snapshot::store_summary(self.log.as_ref(), id, session.state()).await;
        Ok(Summary::of(session.state()))
    }

    /// Every session's metadata and summary, in id order; stored summaries
    /// are read together (a few queries on a shared store, not one per
    /// session), stale ones rebuilt from the log.
    pub async fn listing(&self) -> Result<Vec<Listed>, RuntimeError> {
        const CHUNK: usize = 1000;
        let metas = self.session_metas().await?;
        let mut out = Vec::with_capacity(metas.len());
        for chunk in metas.chunks(CHUNK) {
            let heads: Vec<(Uuid, u64)> = chunk.iter().map(|m| (m.session, m.events)).collect();
            let stored = snapshot::fresh_summaries(self.log.as_ref(), &heads).await;
            for (meta, summary) in chunk.iter().zip(stored) {
                let summary = match summary {
                    Some(summary) => Ok(summary),
                    None => self.rebuilt_summary(meta.session).await,
                };
                out.push((meta.clone(), summary));
            }
        }
        Ok(out)
    }

    /// Every session's listing row, in id order, as the API gives it, each
    /// running one marked as [`Service::mark_running`] says.
    pub async fn rows(&self) -> Result<Vec<crate::api::SessionSummary>, RuntimeError> {
        let listing = self.listing().await?;
        let mut rows = Vec::with_capacity(listing.len());
        for (meta, summary) in listing {
            let driven = summary.as_ref().is_ok_and(|s| s.turn_driven);
            let mut row = crate::views::row_of(&meta, summary);
            self.mark_running(&mut row, driven).await?;
            rows.push(row);
        }
        Ok(rows)
    }

    /// Marks `row`, if it is of a running session nothing runs (no live
    /// lease), as `interrupted` when a process drove its turn (`driven`:
    /// it died mid-turn) or `pending` when none recorded a step of it. A sub-agent is
    /// its parent's to resume, and is left unmarked.
    pub async fn mark_running(
        &self,
        row: &mut crate::api::SessionSummary,
        driven: bool,
    ) -> Result<(), RuntimeError> {
        if row.status != crate::api::SessionStatus::Running || row.parent.is_some() {
            return Ok(());
        }
        let idle = self.log.leases().lease(row.session).await?.is_none();
        row.interrupted = Some(idle && driven);
        row.pending = Some(idle && !driven);
        Ok(())
    }

    /// Sessions with pending work that no person has to decide on.
    pub async fn resumable(&self) -> Result<Vec<Uuid>, RuntimeError> {
        let mut out = Vec::new();
        for (meta, summary) in self.listing().await? {
            if summary?.resumable() {
                out.push(meta.session);
            }
        }
        Ok(out)
    }
}

/// A session derived from another (see [`Service::derived`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// The derived session.
    pub session: Uuid,
    /// The session it was derived from.
    pub from: Uuid,
    /// How.
    pub link: crate::api::Derivation,
    /// Whether it was erased already.
    pub erased: bool,
}

/// A link from a derived session to the one it was derived from:
/// (derived, from, how).
pub(crate) type Link = (Uuid, Uuid, crate::api::Derivation);

/// The link session `id` has to the session it was derived from, as its
/// `first` events (its first two of its own: a fork that shares its
/// parent's records starts past them) record it: a fork's or a rerun's
/// first event names its parent; a sub-agent's `SpawnedBy` follows its
/// start. Whatever comes later (a fork's copy of its parent's own links)
/// is not its own.
pub(crate) fn links_of(id: Uuid, first: &[Event]) -> Vec<Link> {
    use crate::api::Derivation;
    match first {
        [Event::SessionForked { parent, rerun, .. }, ..] => {
            let how = match rerun {
                Some(_) => Derivation::Rerun,
                None => Derivation::Fork,
            };
            vec![(id, *parent, how)]
        }
        [Event::SessionStarted { .. }, Event::SpawnedBy { parent, .. }, ..] => {
            vec![(id, *parent, Derivation::SubAgent)]
        }
        _ => Vec::new(),
    }
}

/// The links of session `id` as its summary tells them, where its first
/// events cannot be read: the last fork link its fold saw (for a fork of
/// a fork, the first fork's parent: an ancestor all the same), and the
/// sub-agent's parent.
fn summary_links_of(id: Uuid, summary: &Summary) -> Vec<Link> {
    use crate::api::Derivation;
    let mut links = Vec::new();
    match (summary.rerun_of, summary.forked_from) {
        (Some(of), _) => links.push((id, of, Derivation::Rerun)),
        (None, Some(of)) => links.push((id, of, Derivation::Fork)),
        (None, None) => {}
    }
    if let Some(parent) = summary.parent {
        links.push((id, parent, Derivation::SubAgent));
    }
    links
}

/// The sessions derived from `root` through `links` ((derived, from,
/// how), in any order), transitively, nearest first (breadth first, each
/// level in the order of `links`): each named once, by the first link that
/// reaches it, and never `root` itself, whatever cycles the links hold.
pub(crate) fn derived_from(root: Uuid, links: &[Link]) -> Vec<Link> {
    let mut seen = std::collections::HashSet::from([root]);
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for from in frontier {
            for &(derived, of, link) in links {
                if of == from && seen.insert(derived) {
                    found.push((derived, from, link));
                    next.push(derived);
                }
            }
        }
        frontier = next;
    }
    found
}

/// A session in a listing: its metadata and its summary (or why it could
/// not be read).
pub(crate) type Listed = (SessionMeta, Result<Summary, RuntimeError>);

/// Refuses a pause of session `id`, whose status is `status`, unless it
/// sleeps.
fn refuse_unless_sleeping(id: Uuid, status: &str) -> Result<(), RuntimeError> {
    if status == Status::Sleeping.to_string() {
        return Ok(());
    }
    Err(RuntimeError::InvalidRequest {
        session: id,
        reason: "it has no turn running to pause, and does not sleep".into(),
    })
}

/// Parses a resolution as the CLI and the API take it: exactly one of
/// retry, skip with a JSON result, or fail with a message.
pub fn resolution(
    retry: bool,
    skip_result: Option<&str>,
    fail: Option<&str>,
) -> Result<Resolution, String> {
    match (retry, skip_result, fail) {
        (true, None, None) => Ok(Resolution::Retry),
        (false, Some(result), None) => serde_json::from_str::<serde_json::Value>(result)
            .map(|value| Resolution::Skip(value.to_string()))
            .map_err(|e| format!("the result is not JSON ({e}): {result:?}")),
        (false, None, Some(message)) => Ok(Resolution::Fail(message.into())),
        _ => Err("give exactly one of: retry, skip with a JSON result, fail with a message".into()),
    }
}

/// The arguments a person gave call `call_id` when approving it, as they
/// are recorded: valid JSON (else refused, naming the call), in compact
/// form, and no longer than a model's reply may be (`limit`: the spec's
/// `max_response_bytes`), so they fit where the model's would.
pub fn edited_arguments(call_id: &str, args: &str, limit: u64) -> Result<String, String> {
    let value: serde_json::Value = serde_json::from_str(args).map_err(|e| {
        format!("call {call_id:?}: the edited arguments are not JSON ({e}); nothing was recorded")
    })?;
    let args = value.to_string();
    if args.len() as u64 > limit {
        return Err(format!(
            "call {call_id:?}: the edited arguments are {} bytes, more than a model's reply may \
             hold ({limit} bytes, max_response_bytes); nothing was recorded",
            args.len()
        ));
    }
    Ok(args)
}

/// The refusal of anything that would run erased `session`.
pub(crate) fn erased(session: &Session) -> RuntimeError {
    let (by, reason) = session.state().erased.clone().unwrap_or_default();
    RuntimeError::Erased {
        session: session.id(),
        by,
        reason,
    }
}

fn refuse_erased(session: &Session) -> Result<(), RuntimeError> {
    match session.state().erased {
        Some(_) => Err(erased(session)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventlog::SledLog;
    use replay::{ModelReply, ToolCall};

    /// A session's own link is in its first append; what a fork copied of
    /// its parent's history (the parent's own links) is not its own.
    #[test]
    fn a_sessions_own_link_is_the_one_its_first_append_holds() {
        use crate::api::Derivation::{Fork, Rerun, SubAgent};
        let [id, parent, grandparent] = [1, 2, 3].map(Uuid::from_u128);
        let spec: AgentSpec = toml::from_str(
            "name = \"t\"\n[model]\nprovider = \"scripted\"\nscript = \"unused.json\"\n",
        )
        .unwrap();
        let started = Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        };
        let forked = |parent, rerun| Event::SessionForked {
            parent,
            at_seq: 2,
            rerun,
            shared: false,
        };
        let spawned = Event::SpawnedBy {
            parent: grandparent,
            seq: 4,
            call_id: "call_0_0".into(),
        };
        let rerun = replay::RerunOf {
            through_seq: 3,
            live_tools: false,
        };
        let of_fork = [forked(parent, None), forked(grandparent, None)];
        assert_eq!(links_of(id, &of_fork), [(id, parent, Fork)]);
        let of_child = [forked(parent, None), started.clone(), spawned.clone()];
        assert_eq!(links_of(id, &of_child), [(id, parent, Fork)]);
        let a_rerun = [forked(parent, Some(rerun)), started.clone()];
        assert_eq!(links_of(id, &a_rerun), [(id, parent, Rerun)]);
        let a_child = [started.clone(), spawned];
        assert_eq!(links_of(id, &a_child), [(id, grandparent, SubAgent)]);
        let message = Event::UserMessage { text: "hi".into() };
        assert!(links_of(id, &[started, message]).is_empty());
        assert!(links_of(id, &[]).is_empty());
    }

    #[test]
    fn derived_sessions_are_found_transitively_each_once_nearest_first() {
        use crate::api::Derivation::{Fork, Rerun, SubAgent};
        let [root, a, b, c, d, other] = [1, 2, 3, 4, 5, 6].map(Uuid::from_u128);
        let links = [
            (c, a, Fork),        // a fork of a fork
            (a, root, Fork),     // a fork
            (b, root, Rerun),    // a rerun
            (c, b, SubAgent),    // reached twice: named by the first link
            (d, c, SubAgent),    // three levels down
            (other, d, Fork),    // ...
            (root, other, Fork), // a cycle no store holds: root never named
        ];
        let found = derived_from(root, &links);
        assert_eq!(
            found,
            [
                (a, root, Fork),
                (b, root, Rerun),
                (c, a, Fork),
                (d, c, SubAgent),
                (other, d, Fork)
            ]
        );
        assert_eq!(derived_from(d, &links[4..6]), [(other, d, Fork)]);
        assert!(derived_from(other, &links[..6]).is_empty());
    }

    /// A session whose call `refund` (approval needed, its approval
    /// expiring at `expires_at_ms`) waits for a person, and which a person
    /// then paused too.
    async fn paused_with_a_call_waiting(
        dir: &std::path::Path,
        expires_at_ms: Option<i64>,
    ) -> Session {
        let spec: AgentSpec = toml::from_str(
            "name = \"t\"\n[model]\nprovider = \"scripted\"\nscript = \"unused.json\"\n\
             [[tools]]\nname = \"refund\"\nkind = \"command\"\ncommand = [\"true\"]\n\
             effect = \"side_effect\"\nrequires_approval = true\n",
        )
        .unwrap();
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir).unwrap());
        let mut session = Session::create(log, spec).await.unwrap();
        let call = ToolCall {
            id: "call_0_0".into(),
            name: "refund".into(),
            arguments: "{}".into(),
            invented: None,
        };
        let events = vec![
            Event::UserMessage { text: "go".into() },
            Event::ModelReplied(ModelReply {
                tool_calls: vec![call],
                finish_reason: "tool_calls".into(),
                ..ModelReply::default()
            }),
            Event::ApprovalRequested {
                call_id: "call_0_0".into(),
                expires_at_ms,
            },
            Event::SessionPaused {
                reason: crate::pause::PAUSED_ON_REQUEST.into(),
                budget: false,
            },
        ];
        session.append(events, None).await.unwrap();
        session
    }

    /// A person's pause outlives the last waiting call: its approval
    /// expiring, or a person deciding on it, records the decision and
    /// leaves the session paused (before, both resumed it and the daemon
    /// drove the turn on).
    #[tokio::test]
    async fn a_persons_pause_outlives_the_last_waiting_call() {
        let paused = Some(crate::pause::PAUSED_ON_REQUEST);
        let dir = tempfile::tempdir().unwrap();
        let mut session = paused_with_a_call_waiting(dir.path(), Some(1)).await;
        let service = Service::new(session.log().clone(), Durability::Flushed);
        let expired = service.expire_approvals(&mut session, 2).await.unwrap();
        assert_eq!(expired, ["call_0_0"]);
        assert_eq!(session.state().paused.as_deref(), paused);
        let dir = tempfile::tempdir().unwrap();
        let mut session = paused_with_a_call_waiting(dir.path(), None).await;
        let service = Service::new(session.log().clone(), Durability::Flushed);
        let continuing = (service.decide_approval(&mut session, "call_0_0", true, "ada", None))
            .await
            .unwrap();
        assert!(!continuing);
        assert_eq!(session.state().paused.as_deref(), paused);
    }
}
