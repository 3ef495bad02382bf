//! The agent loop: drives a session by its resume plan, obeying the
//! write-ahead rules:
//! 1. a UserMessage is durable before the model is called;
//! 2. a ModelReplied is durable before any of its tool calls starts;
//! 3. a ToolStarted is durable before its tool runs;
//! 4. a ToolFinished is durable before its result reaches the model;
//! 5. results reach the model in call order (the prompt rebuild sees to it).

use crate::control::crash;
use crate::error::RuntimeError;
use crate::inbox::{Accepted, Inboxes, Refused};
use crate::model::{client_for, ModelCall, ModelClient, ModelError};
use crate::session::Session;
use crate::subagent::{ChildCall, ChildEnd};
use eventlog::Durability;
use replay::spec::MidTurn;
use replay::{
    idempotency_key, plan, CallDecision, CallPlan, CheckAnswer, ChildRun, Event, NextStep,
    SessionOutcome, ToolOutcome,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio::time::Interval;
use tools::check::Checked;
use tools::{CallContext, Tool, ToolError, Toolbox};

/// Where every drive ends, however it ended: once the session is at rest
/// (not running) and all it appended is durable, the summary a listing
/// shows is written. The one place a turn writes it; a barrier only makes
/// things durable. Derived data: if it is not written (an operation other
/// than a turn brought the session to rest, a failure), a listing folds the
/// session once and stores it.
async fn come_to_rest(session: &Session) {
    if session.state().status() != replay::Status::Running && session.is_durable() {
        let _ = session.store_summary().await;
    }
}

pub use api::TurnEnd;

/// Drives sessions with a model client and tools built from their spec.
#[derive(Clone)]
pub struct Runner {
    durability: Durability,
    stop: Option<StopCheck>,
    /// Tool calls running at once across every session this runner drives,
    /// and how many that is.
    calls: Option<(Arc<tokio::sync::Semaphore>, u32)>,
    /// Where streamed replies' text goes as it arrives.
    deltas: Option<DeltaSink>,
    /// Signs each session's head at the end of each turn, and within a
    /// turn once this many events were appended since the last signed head.
    signer: Option<(Arc<crate::signing::HeadSigner>, u64)>,
    /// Traces each drive (see [`crate::telemetry`]).
    tracer: Option<Arc<crate::telemetry::Tracer>>,
    /// Messages posted while a turn runs (see [`crate::inbox`]).
    inboxes: Option<Arc<Inboxes>>,
    /// The daily caps every model request is reserved against.
    budgets: Option<Arc<crate::budgets::Budgets>>,
    /// Each tenant's room for tool calls at once (its `max_parallel_calls`).
    tenant_calls: Option<Arc<TenantCalls>>,
}

/// Tool calls of each tenant's sessions running at once across the
/// sessions a runner (and its clones) drives: at most the tenant's
/// `max_parallel_calls`, read from the registry at most a second old.
pub(crate) struct TenantCalls {
    tenants: Arc<crate::tenants::Tenants>,
    /// Each tenant's room, and the limit it was made for.
    rooms: std::sync::Mutex<HashMap<String, (Arc<tokio::sync::Semaphore>, u64)>>,
}

impl TenantCalls {
    pub(crate) fn new(tenants: Arc<crate::tenants::Tenants>) -> TenantCalls {
        TenantCalls {
            tenants,
            rooms: Default::default(),
        }
    }

    /// Tenant `name`'s room and its size, if its limits give one. A limit
    /// changed makes a new room (calls under way keep the old one's).
    async fn room_of(
        &self,
        name: &str,
    ) -> Result<Option<(Arc<tokio::sync::Semaphore>, u64)>, RuntimeError> {
        let registry = (self.tenants)
            .registry_within(Duration::from_secs(1))
            .await?;
        let limit = (registry.tenants.get(name)).and_then(|t| t.limits.max_parallel_calls);
        let Some(limit) = limit else { return Ok(None) };
        let mut rooms = self.rooms.lock().expect("rooms lock");
        let room = match rooms.get(name) {
            Some((room, size)) if *size == limit => room.clone(),
            _ => {
                let permits = limit.min(tokio::sync::Semaphore::MAX_PERMITS as u64) as usize;
                let room = Arc::new(tokio::sync::Semaphore::new(permits));
                rooms.insert(name.to_string(), (room.clone(), limit));
                room
            }
        };
        Ok(Some((room, limit)))
    }
}

/// The room tool calls of a wave hold: the runner's cap's, and their
/// tenant's; each call takes one of each and gives them back when it ends.
#[derive(Default)]
struct Room {
    cap: Option<tokio::sync::OwnedSemaphorePermit>,
    tenant: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Room {
    /// One call's room, split from this one.
    fn one(&mut self) -> Room {
        Room {
            cap: self.cap.as_mut().and_then(|p| p.split(1)),
            tenant: self.tenant.as_mut().and_then(|p| p.split(1)),
        }
    }
}

/// Events a long turn appends between two signed heads, by default.
pub(crate) const SIGN_EVERY: u64 = 1000;

/// What a session's turns run with: its model client and its tools (and,
/// for a rerun, the original's recorded calls).
pub struct TurnParts {
    model: Box<dyn ModelClient>,
    toolbox: Toolbox,
    record: Option<Arc<replay::Record>>,
}

/// Receives the text of a session's streamed replies as it arrives:
/// (session, the seq its reply is expected at, text); an empty piece ends
/// a reply. The seq is the session's head when the request went out, plus
/// one: a message recorded while the reply streams comes before it.
pub type DeltaSink = Arc<dyn Fn(uuid::Uuid, u64, &str) + Send + Sync>;

/// Asked before every step of a session: a reason to pause it there (a
/// shutdown, a person's request), or `None` to go on.
pub type StopCheck = Arc<dyn Fn(uuid::Uuid) -> StopFuture + Send + Sync>;

/// What a [`StopCheck`] answers, once it has looked (it may ask the store).
pub type StopFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send>>;

impl Runner {
    /// A runner whose barriers give `durability`.
    pub fn new(durability: Durability) -> Runner {
        Runner {
            durability,
            stop: None,
            calls: None,
            deltas: None,
            signer: None,
            tracer: None,
            inboxes: None,
            budgets: None,
            tenant_calls: None,
        }
    }

    /// The durability its barriers give.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The runner a child session of `parent` runs with: this one, with
    /// nothing streamed (the parent's stream is the parent's), and asked
    /// to stop when the parent is (a person's pause of the parent pauses
    /// the child it waits for).
    fn for_child(&self, parent: uuid::Uuid) -> Runner {
        let mut runner = self.clone();
        runner.deltas = None;
        runner.stop = self
            .stop
            .clone()
            .map(|stop| Arc::new(move |_child: uuid::Uuid| stop(parent)) as StopCheck);
        runner
    }

    /// Traces each drive with `tracer`: a span for the turn, one for each
    /// model reply and one for each tool run, from the events it appends.
    pub fn with_tracer(mut self, tracer: Arc<crate::telemetry::Tracer>) -> Runner {
        self.tracer = Some(tracer);
        self
    }

    /// Signs each session's head with `signer` (a `HeadSigned` record,
    /// durable like the rest) at the end of each turn, and at checkpoints
    /// within a long one: every `every` events (1,000 by default).
    pub fn with_signer(mut self, signer: Arc<crate::signing::HeadSigner>, every: u64) -> Runner {
        self.signer = Some((signer, every.max(1)));
        self
    }

    /// Hands the text of streamed replies to `sink` as it arrives (it is
    /// recorded only whole, with the reply).
    pub fn with_deltas(mut self, sink: DeltaSink) -> Runner {
        self.deltas = Some(sink);
        self
    }

    /// Lets at most `max` tool calls run at once across every session
    /// driven by this runner (and its clones): a daemon's cap.
    pub fn with_call_cap(mut self, max: usize) -> Runner {
        let max = max.clamp(1, u32::MAX as usize) as u32;
        self.calls = Some((Arc::new(tokio::sync::Semaphore::new(max as usize)), max));
        self
    }

    /// Pauses a session between steps when `stop` gives a reason; a step
    /// under way (a model request, running tools) finishes first.
    pub fn with_stop(mut self, stop: StopCheck) -> Runner {
        self.stop = Some(stop);
        self
    }

    /// Reserves every model request's worst case against the daily caps
    /// that apply to its session, and pauses the session (a budget pause
    /// naming the cap) instead of sending one that would cross a cap.
    pub(crate) fn with_budgets(mut self, budgets: Arc<crate::budgets::Budgets>) -> Runner {
        self.budgets = Some(budgets);
        self
    }

    /// Lets a tenant's sessions run at most its `max_parallel_calls` tool
    /// calls at once, across every session this runner (and its clones)
    /// drives.
    pub(crate) fn with_tenant_calls(mut self, calls: Arc<TenantCalls>) -> Runner {
        self.tenant_calls = Some(calls);
        self
    }

    /// A runner whose turns record the messages posted to `inboxes` for
    /// their session as they arrive, whatever the turn is doing.
    pub fn with_inboxes(mut self, inboxes: Arc<Inboxes>) -> Runner {
        self.inboxes = Some(inboxes);
        self
    }

    /// Records the messages posted for the session's running turn, if any
    /// (durable before their posters hear back); whether there were any.
    /// One that would not fit the model's context window is refused, not
    /// recorded.
    pub async fn take_messages(&self, session: &mut Session) -> Result<bool, RuntimeError> {
        let Some(inboxes) = &self.inboxes else {
            return Ok(false);
        };
        let spec = session.spec()?;
        let (policy, room) = (spec.mid_turn_messages, spec.limits.waiting_messages());
        // Rejected messages are recorded too: bounded as waiting ones are.
        let (mut counted, held) = match policy {
            MidTurn::Reject => (
                session.state().turn.rejected_messages,
                "were rejected this turn",
            ),
            _ => (session.state().mailbox.len() as u64, "wait for this turn"),
        };
        let mut incoming = Vec::new();
        for m in inboxes.take(session.id()) {
            let refused = match session.state().past_the_window(&m.text) {
                Some(reason) => Some(Refused::Invalid(reason)),
                None if counted >= room => Some(Refused::Full(format!(
                    "{counted} messages {held} already ([limits] max_waiting_messages = {room}): \
                     it was not recorded; send it once the turn has ended"
                ))),
                None => None,
            };
            match refused {
                Some(refused) => m.answer(Err(refused)),
                None => {
                    counted += 1;
                    incoming.push(m);
                }
            }
        }
        if incoming.is_empty() {
            return Ok(false);
        }
        let events = incoming
            .iter()
            .map(|m| Event::MidTurnMessage {
                text: m.text.clone(),
                policy,
            })
            .collect();
        let recorded = match session.append(events, None).await {
            Ok(first) => session.barrier(self.durability).await.map(|()| first),
            Err(e) => Err(e),
        };
        for (i, m) in incoming.into_iter().enumerate() {
            let outcome = match &recorded {
                Ok(first) => Ok(Accepted {
                    seq: first + i as u64,
                    policy,
                }),
                Err(e) => Err(Refused::Invalid(e.to_string())),
            };
            m.answer(outcome);
        }
        recorded.map(|_| true)
    }

    /// Resolves once a message may wait for the running turn of `id`.
    async fn message_arrived(&self, id: uuid::Uuid) {
        match &self.inboxes {
            Some(inboxes) => inboxes.arrived(id).await,
            None => std::future::pending().await,
        }
    }

    /// Records the delivery of every waiting message: each enters the
    /// conversation as a user message.
    async fn deliver(&self, session: &mut Session) -> Result<(), RuntimeError> {
        let events = session
            .state()
            .mailbox
            .iter()
            .map(|m| Event::MidTurnDelivered { arrived: m.seq })
            .collect();
        session.append(events, None).await?;
        Ok(())
    }

    async fn stop_requested(&self, session: &mut Session) -> Result<Option<String>, RuntimeError> {
        let Some(reason) = self.stop_heard(session.id()).await else {
            return Ok(None);
        };
        let event = Event::SessionPaused {
            reason: reason.clone(),
            budget: false,
        };
        session.append(vec![event], None).await?;
        session.barrier(self.durability).await?;
        Ok(Some(reason))
    }

    /// Runs `session` until it is answered, paused or failed.
    pub async fn drive(&self, session: &mut Session) -> Result<TurnEnd, RuntimeError> {
        // The turn starts here, before its parts record what changed in
        // its MCP servers' tools.
        let start = session.head().0;
        let parts = self.parts(session).await?;
        self.drive_from(session, &parts, start).await
    }

    /// The model client and the tools `session`'s spec asks for. Failing
    /// to build them is recorded as a failed turn, so the session shows
    /// failed instead of running.
    pub async fn parts(&self, session: &mut Session) -> Result<TurnParts, RuntimeError> {
        self.parts_with_native(session, Vec::new()).await
    }

    /// [`Runner::parts`], with the `native` tools the spec declares: Rust
    /// code of the program that embeds mneme (see `tools::Toolbox::with_native`).
    pub async fn parts_with_native(
        &self,
        session: &mut Session,
        native: Vec<Arc<dyn Tool>>,
    ) -> Result<TurnParts, RuntimeError> {
        let spec = session.spec()?.clone();
        let with_tools = |model| {
            let http = crate::outbound::client(crate::outbound::TOOL_CONNECT_TIMEOUT).map_err(
                |reason| tools::ToolError::Config {
                    tool: "*".into(),
                    reason: format!("cannot build HTTP client: {reason}"),
                },
            )?;
            Ok((model, Toolbox::for_agent(&spec, native, http)?))
        };
        let setup = match client_for(&spec)
            .map_err(RuntimeError::from)
            .and_then(with_tools)
        {
            Ok((model, toolbox)) if !spec.mcp.is_empty() => match toolbox.check_mcp(&spec).await {
                Ok(report) => crate::mcp::record_changes(session, report)
                    .await
                    .map(|()| (model, toolbox)),
                Err(e) => Err(RuntimeError::Spec {
                    origin: format!("session {}", session.id()),
                    reason: e.to_string(),
                }),
            },
            other => other,
        };
        let setup = match (setup, session.state().rerun.clone()) {
            (Ok((model, toolbox)), Some(rerun)) => {
                crate::rerun::record(session.log().as_ref(), &rerun)
                    .await
                    .map(|record| (model, toolbox, Some(Arc::new(record))))
            }
            (setup, _) => setup.map(|(model, toolbox)| (model, toolbox, None)),
        };
        match setup {
            Ok((model, toolbox, record)) => Ok(TurnParts {
                model,
                toolbox,
                record,
            }),
            Err(error) => {
                self.record_failure(session, None, error.to_string())
                    .await?;
                Err(error)
            }
        }
    }

    /// [`Runner::drive`] with parts built earlier for this session's spec
    /// (a spec never changes, so they serve every turn of the session).
    pub async fn drive_with(
        &self,
        session: &mut Session,
        parts: &TurnParts,
    ) -> Result<TurnEnd, RuntimeError> {
        let start = session.head().0;
        self.drive_from(session, parts, start).await
    }

    /// A drive of a turn that started with the log at `start` (for its trace).
    async fn drive_from(
        &self,
        session: &mut Session,
        parts: &TurnParts,
        start: u64,
    ) -> Result<TurnEnd, RuntimeError> {
        if let Some(tracer) = &self.tracer {
            let trace = tracer.begin(session.id(), session.state(), start);
            session.traced_by(Some(trace));
        }
        let mut end = self.steps(session, parts).await;
        // Whatever ended the turn, what it recorded (a deferred reply too)
        // is durable before its end is told.
        if end.is_ok() {
            if let Err(error) = session.barrier(self.durability).await {
                end = Err(error);
            }
        }
        // A turn that failed is signed too: what it recorded is history.
        // (A turn cut off from its lease or its store cannot sign: its
        // own error stands.)
        match (self.sign_head(session).await, &end) {
            (Ok(()), _) => come_to_rest(session).await,
            (Err(error), Ok(_)) => end = Err(error),
            (Err(_), Err(_)) => {}
        }
        if let Some(trace) = session.traced_by(None) {
            trace.end(end.as_ref(), session.state());
        }
        end
    }

    /// Appends a signed statement of the session's head, if this runner
    /// signs.
    async fn sign_head(&self, session: &mut Session) -> Result<(), RuntimeError> {
        let Some((signer, _)) = &self.signer else {
            return Ok(());
        };
        let (seq, hash) = session.head();
        let signed = signer.sign(session.id(), seq, &hash.to_hex());
        session.append(vec![signed], None).await?;
        session.barrier(self.durability).await
    }

    /// The steps of a drive, until the plan says it cannot go on.
    async fn steps(
        &self,
        session: &mut Session,
        parts: &TurnParts,
    ) -> Result<TurnEnd, RuntimeError> {
        let (model, toolbox) = (&parts.model, &parts.toolbox);
        let mut signed_at = session.head().0;
        let mut stepped = false;
        let mut look = None;
        loop {
            if let Some((_, every)) = &self.signer {
                if session.head().0 >= signed_at + every {
                    self.sign_head(session).await?;
                    signed_at = session.head().0;
                }
            }
            self.take_messages(session).await?;
            let plan = plan(session.state());
            let working = matches!(
                plan.next,
                NextStep::CallModel | NextStep::RunTools | NextStep::Deliver
            );
            if working {
                if let Some(reason) = self.stop_requested(session).await? {
                    return Ok(TurnEnd::Paused(reason));
                }
            }
            match plan.next {
                NextStep::Nothing => return self.answered(session).await,
                // A turn that was answered ends here; the waiting messages
                // open a turn of their own, in the next drive.
                NextStep::Deliver if stepped && session.state().answer().is_some() => {
                    return self.answered(session).await
                }
                NextStep::Deliver => self.deliver(session).await?,
                NextStep::CallModel => {
                    stepped = true;
                    let step = self.call_model(session, model.as_ref()).await;
                    self.fail_on_refused_record(session, step).await?
                }
                NextStep::RunTools => {
                    stepped = true;
                    let record = parts.record.as_deref();
                    let step = self
                        .run_tools(session, (toolbox, record), &plan.calls, &mut look)
                        .await;
                    self.fail_on_refused_record(session, step).await?
                }
                // A pause with calls in doubt is theirs: only a decision ends it.
                NextStep::AwaitDecision | NextStep::Paused(_)
                    if !session.state().calls_in_doubt().is_empty() =>
                {
                    return Ok(TurnEnd::NeedsDecision(session.state().calls_in_doubt()))
                }
                NextStep::AwaitDecision | NextStep::Paused(_)
                    if !session.state().calls_awaiting_approval().is_empty() =>
                {
                    return Ok(TurnEnd::NeedsApproval(
                        session.state().calls_awaiting_approval(),
                    ))
                }
                NextStep::AwaitDecision => return Ok(TurnEnd::NeedsDecision(Vec::new())),
                NextStep::Paused(reason) if session.state().budget_paused => {
                    return Ok(TurnEnd::BudgetSpent(reason))
                }
                NextStep::Paused(reason) => return Ok(TurnEnd::Paused(reason)),
                NextStep::OverBudget(reason) => {
                    let event = Event::SessionPaused {
                        reason: reason.clone(),
                        budget: true,
                    };
                    session.append(vec![event], None).await?;
                    session.barrier(self.durability).await?;
                    return Ok(TurnEnd::BudgetSpent(reason));
                }
                // A sleep already due (`{"seconds": 0}`, a time past) wakes
                // here, and the turn goes on.
                NextStep::Sleep => {
                    let (due, _) = crate::sleep::due(session.state(), crate::text::now_ms());
                    if due.is_empty() {
                        session.barrier(self.durability).await?;
                        return Ok(crate::sleep::turn_end(session.state()));
                    }
                    crate::sleep::record(session, due, self.durability).await?;
                }
                NextStep::Failed(error) => return Ok(TurnEnd::Failed(error)),
                NextStep::Cancelled(by) => return Ok(TurnEnd::Cancelled(by)),
                NextStep::Erased(_) => return Err(crate::service::erased(session)),
            }
        }
    }

    /// The end of a turn that is answered, once it is durable.
    async fn answered(&self, session: &mut Session) -> Result<TurnEnd, RuntimeError> {
        session.barrier(self.durability).await?;
        crash::point(crash::TURN_ANSWERED);
        let answer = session.state().answer().unwrap_or_default().to_string();
        Ok(match session.state().last_reply_cut_off() {
            true => TurnEnd::CutOffAnswer(answer),
            false => TurnEnd::Answered(answer),
        })
    }

    /// Sends the session's next request; the request and the reply, or why
    /// no reply came. Messages posted meanwhile are recorded as they come
    /// (they wait outside the prompt, so the request stays what it was).
    async fn request_reply(
        &self,
        session: &mut Session,
        model: &dyn ModelClient,
    ) -> Result<Result<(replay::PreparedRequest, replay::ModelReply), ModelError>, RuntimeError>
    {
        let request = session.next_request()?;
        let id = session.id();
        // Unless a message posted meanwhile is recorded first.
        let seq = session.head().0 + 1;
        let deltas: Option<Box<crate::model::Deltas>> = self.deltas.clone().map(|sink| {
            Box::new(move |text: &str| sink(id, seq, text)) as Box<crate::model::Deltas>
        });
        let call = ModelCall::next(session.state());
        let reply = {
            let reply = model.complete(call, &request, deltas.as_deref());
            tokio::pin!(reply);
            loop {
                tokio::select! {
                    reply = &mut reply => break reply,
                    () = self.message_arrived(id) => {
                        self.take_messages(session).await?;
                    }
                }
            }
        };
        Ok(reply.map(|reply| (request, reply)))
    }

    /// Records that the turn failed, for `reason`, and makes it durable:
    /// the session shows failed, and only an explicit resume runs it again.
    async fn record_failure(
        &self,
        session: &mut Session,
        cause: Option<u64>,
        reason: String,
    ) -> Result<(), RuntimeError> {
        let outcome = SessionOutcome::Failed(reason);
        session
            .append(vec![Event::SessionFinished { outcome }], cause)
            .await?;
        session.barrier(self.durability).await
    }

    /// A record the log refused for its size (an output or a reply past
    /// what one record holds) would be refused again on every retry: the
    /// turn is recorded as failed, so nothing (recovery, a takeover) runs
    /// it again on its own.
    async fn fail_on_refused_record(
        &self,
        session: &mut Session,
        step: Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let Err(error @ RuntimeError::Log(eventlog::LogError::RecordTooLarge { .. })) = step else {
            return step;
        };
        self.record_failure(session, None, error.to_string())
            .await?;
        Err(error)
    }

    /// Reserves `bytes`' worth of request of `session` (its worst case)
    /// against the daily caps that apply: the reservations, or, when one
    /// would be crossed, none: the session is then paused on its budget,
    /// naming the cap (durable), and the request is not sent.
    async fn reserve_or_pause(
        &self,
        session: &mut Session,
        bytes: u64,
    ) -> Result<Option<crate::budgets::Held>, RuntimeError> {
        let Some(budgets) = &self.budgets else {
            return Ok(Some(Default::default()));
        };
        let worst = replay::spend::worst_case(session.state(), bytes);
        let now = crate::text::now_ms();
        match budgets
            .reserve(session.id(), session.state(), worst, now)
            .await?
        {
            Ok(held) => Ok(Some(held)),
            Err(crate::budgets::OverCap(reason)) => {
                let event = Event::SessionPaused {
                    reason,
                    budget: true,
                };
                session.append(vec![event], None).await?;
                session.barrier(self.durability).await?;
                Ok(None)
            }
        }
    }

    /// Settles `held` at what `usage` cost at the session's prices (none: a
    /// request that got no reply, at 0).
    async fn settle(
        &self,
        session: &Session,
        held: crate::budgets::Held,
        usage: Option<&replay::Usage>,
    ) -> Result<(), RuntimeError> {
        let Some(budgets) = &self.budgets else {
            return Ok(());
        };
        let cost = usage.map_or(0.0, |u| {
            replay::state::cost(u, session.state().spec.as_ref())
        });
        budgets.settle(held, cost).await
    }

    /// [`Runner::request_reply`] under a reservation of the request's worst
    /// case, settled by the reply; `None` when a cap paused the session
    /// instead (nothing sent).
    async fn budgeted_request(
        &self,
        session: &mut Session,
        model: &dyn ModelClient,
    ) -> Result<
        Option<Result<(replay::PreparedRequest, replay::ModelReply), ModelError>>,
        RuntimeError,
    > {
        let bytes = session.next_request()?.len() as u64;
        let Some(held) = self.reserve_or_pause(session, bytes).await? else {
            return Ok(None);
        };
        let asked = self.request_reply(session, model).await?;
        let usage = asked.as_ref().ok().map(|(_, reply)| reply.usage);
        self.settle(session, held, usage.as_ref()).await?;
        Ok(Some(asked))
    }

    async fn call_model(
        &self,
        session: &mut Session,
        model: &dyn ModelClient,
    ) -> Result<(), RuntimeError> {
        session.barrier(self.durability).await?;
        if !self.compact_if_needed(session, model).await? {
            return Ok(()); // paused on a cap
        }
        crash::point(crash::BEFORE_MODEL_CALL);
        let cause = session.state().last_seq;
        let Some(asked) = self.budgeted_request(session, model).await? else {
            return Ok(()); // paused on a cap
        };
        let asked = match asked {
            // The server says the prompt exceeds its context: summarize all
            // but the newest entry, once, and ask again.
            Err(error) if error.is_context_overflow() => {
                match session.state().compactable_keeping(1) {
                    Some(coverage) => {
                        if !self.compact(session, model, coverage).await? {
                            return Ok(());
                        }
                        match self.budgeted_request(session, model).await? {
                            Some(asked) => asked,
                            None => return Ok(()),
                        }
                    }
                    None => Err(error),
                }
            }
            asked => asked,
        };
        let (request, mut reply) = match asked {
            Ok(asked) => asked,
            Err(error) => {
                self.record_failure(session, Some(cause), error.to_string())
                    .await?;
                return Err(error.into());
            }
        };
        crash::point(crash::MODEL_REPLIED_BEFORE_APPEND);
        reply.request_digest = request.digest.clone();
        reply.request_bytes = request.len() as u64;
        reply.prefix_digest = session.prefix_digest();
        replay::event::normalize_call_ids(&mut reply.tool_calls);
        let spec = session.spec()?;
        let known = |name: &str| spec.tool(name).is_some();
        replay::event::set_invented_names_aside(&mut reply.tool_calls, known);
        let max_calls = session.spec()?.limits.calls_per_reply();
        reply.refused = refusal(&reply, max_calls);
        let cut_off = reply.cut_off();
        // Made durable with what follows it (its calls' ToolStarted, an
        // approval asked, the turn's end), before anything acts on it.
        session
            .append_deferred(vec![Event::ModelReplied(reply)], Some(cause))
            .await?;
        if cut_off && session.state().cut_off_in_a_row >= 2 {
            let error = ModelError::CutOff {
                max_tokens: session
                    .spec()?
                    .model
                    .max_tokens
                    .map(|l| l.saturating_mul(2)),
            };
            self.record_failure(session, Some(cause), error.to_string())
                .await?;
            return Err(error.into());
        }
        crash::point(crash::MODEL_REPLY_APPENDED);
        Ok(())
    }

    /// When the next prompt would fill more than [`COMPACT_AT`] of the
    /// model's context window, asks the model to summarize the oldest entries
    /// and records the summary (ContextCompacted). The log keeps everything;
    /// only the prompt changes. A failed summary request fails the turn.
    /// False when a cap paused the session instead (nothing sent).
    async fn compact_if_needed(
        &self,
        session: &mut Session,
        model: &dyn ModelClient,
    ) -> Result<bool, RuntimeError> {
        let Some(window) = session.spec()?.model.context_window else {
            return Ok(true);
        };
        let bytes = session.next_request()?.len() as u64;
        let tokens = session.state().estimate_tokens(bytes);
        if (tokens as f64) < window as f64 * COMPACT_AT {
            return Ok(true);
        }
        let Some(coverage) = session.state().compactable() else {
            return Ok(true);
        };
        self.compact(session, model, coverage).await
    }

    /// Asks the model to summarize the first `upto` entries (spanning the
    /// seqs `covers`) and records the summary (ContextCompacted). A failed
    /// summary request fails the turn. The request is reserved against the
    /// daily caps like any other: false when a cap paused the session
    /// instead (nothing sent).
    async fn compact(
        &self,
        session: &mut Session,
        model: &dyn ModelClient,
        (upto, covers): (usize, (u64, u64)),
    ) -> Result<bool, RuntimeError> {
        let request = replay::compaction_request(session.state(), upto).ok_or(
            RuntimeError::InvalidRequest {
                session: session.id(),
                reason: "the log has no SessionStarted event".into(),
            },
        )?;
        let cause = session.state().last_seq;
        let request = replay::PreparedRequest::whole(request);
        let Some(held) = self.reserve_or_pause(session, request.len() as u64).await? else {
            return Ok(false);
        };
        let replied = model
            .complete(ModelCall::next(session.state()), &request, None)
            .await;
        let usage = replied.as_ref().ok().map(|reply| reply.usage);
        self.settle(session, held, usage.as_ref()).await?;
        let reply = match replied {
            Ok(reply) => reply,
            Err(error) => {
                self.record_failure(
                    session,
                    Some(cause),
                    format!("compacting the prompt: {error}"),
                )
                .await?;
                return Err(error.into());
            }
        };
        let summary = reply.content.unwrap_or_default();
        let event = Event::ContextCompacted {
            entries: upto as u64,
            covers,
            summary,
        };
        session.append(vec![event], Some(cause)).await?;
        session.barrier(self.durability).await?;
        Ok(true)
    }

    async fn run_tools(
        &self,
        session: &mut Session,
        (toolbox, record): (&Toolbox, Option<&replay::Record>),
        calls: &[CallPlan],
        look: &mut Option<Interval>,
    ) -> Result<(), RuntimeError> {
        let reply_seq = session.state().latest_reply_seq().unwrap_or_default();
        // Outcomes known without running anything: calls in doubt, unknown
        // tools, a rerun's calls answered from the record or not run.
        let mut settled: Vec<Event> = Vec::new();
        let mut starts: Vec<(Arc<dyn Tool>, CallContext, String)> = Vec::new();
        let rerun = session.state().rerun.as_ref().zip(record);
        let mut used = rerun.map(|(r, _)| r.used.clone()).unwrap_or_default();
        for (plan, state) in calls.iter().zip(session.state().open_calls()) {
            let fresh = matches!(
                plan.decision,
                CallDecision::Run | CallDecision::NeedsApproval
            ) && state.attempts == 0
                && !state.approved;
            let answered = rerun.filter(|_| fresh).and_then(|(rerun, record)| {
                let spec = session
                    .state()
                    .spec
                    .as_ref()
                    .and_then(|s| s.tool(&plan.tool));
                let call = (plan.tool.as_str(), state.call.arguments.as_str());
                record.answer(rerun, call, spec, &mut used)
            });
            if let Some((outcome, answer)) = answered {
                settled.push(Event::ToolFinished {
                    call_id: plan.call_id.clone(),
                    outcome,
                    duration_ms: 0,
                    settled_by_check: false,
                    rerun: Some(answer),
                    child: None,
                });
                continue;
            }
            let context = |attempt| CallContext {
                session: session.id(),
                call_id: plan.call_id.clone(),
                // The key recorded at the first start wins.
                idempotency_key: state
                    .idempotency_key
                    .clone()
                    .unwrap_or_else(|| idempotency_key(session.id(), reply_seq, &plan.call_id)),
                attempt,
                blobs: Some(session.blobs()),
                cancel: None,
            };
            match &plan.decision {
                CallDecision::InDoubt(reason) => settled.push(Event::ToolInDoubt {
                    call_id: plan.call_id.clone(),
                    reason: reason.clone(),
                }),
                CallDecision::NeedsApproval => settled.push(Event::ApprovalRequested {
                    call_id: plan.call_id.clone(),
                    // The wait ends at the request's time plus the tool's
                    // approval_timeout, recorded so it is one fact for
                    // every process that looks.
                    expires_at_ms: (session.spec()?.tool(&plan.tool))
                        .and_then(|t| t.approval_timeout())
                        .map(|timeout| {
                            crate::text::now_ms().saturating_add(
                                i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX),
                            )
                        }),
                }),
                CallDecision::Check => {
                    let ctx = context(state.attempts);
                    let started = std::time::Instant::now();
                    let answer = toolbox.check(&plan.tool, &ctx, state.arguments()).await;
                    let duration_ms = started.elapsed().as_millis() as u64;
                    settled.extend(checked(&ctx, answer, duration_ms));
                }
                CallDecision::Run | CallDecision::Rerun if is_sleep(session, &plan.tool) => {
                    let ctx = context(state.attempts + 1);
                    settled.extend(crate::sleep::fall_asleep(
                        &ctx,
                        &plan.tool,
                        state.arguments(),
                    ));
                }
                CallDecision::Run | CallDecision::Rerun => match toolbox.get(&plan.tool) {
                    Some(tool) => starts.push((
                        tool.clone(),
                        context(state.attempts + 1),
                        // A person's edited arguments, where they gave some.
                        state.arguments().to_string(),
                    )),
                    None => settled.push(Event::ToolFinished {
                        call_id: plan.call_id.clone(),
                        outcome: ToolOutcome::Err(format!(
                            "no tool named {:?}",
                            state.call.sent_name()
                        )),
                        duration_ms: 0,
                        settled_by_check: false,
                        rerun: None,
                        child: None,
                    }),
                },
                CallDecision::Reuse
                | CallDecision::AwaitingDecision(_)
                | CallDecision::AwaitingApproval
                | CallDecision::Sleeping => {}
            }
        }
        if !settled.is_empty() {
            let asleep = (settled.iter()).any(|e| matches!(e, Event::WakeScheduled { .. }));
            session.append(settled, Some(reply_seq)).await?;
            if asleep {
                session.barrier(self.durability).await?;
                crash::point(crash::WAKE_SCHEDULED_DURABLE);
            }
        }
        // At most max_parallel_calls (and the daemon's cap) run at once:
        // each wave is started (durably) only when it can run, so a crash
        // never leaves a call recorded as started that was only queued. A
        // call of a sub-agent takes no room under the cap (its child's
        // calls take theirs; one it held would be one its child waits
        // for), and each call gives its room back when it ends.
        let tenant_room = match (&self.tenant_calls, &session.state().tenant) {
            (Some(calls), Some(tenant)) => calls.room_of(&tenant.name).await?,
            _ => None,
        };
        let per_session = session.spec()?.limits.parallel_calls();
        let per_tenant = tenant_room.as_ref().map_or(u64::MAX, |(_, size)| *size);
        let wave = self.wave_size(per_session.min(per_tenant));
        let mut starts = starts.into_iter().peekable();
        while starts.peek().is_some() {
            let batch: Vec<_> = starts.by_ref().take(wave).collect();
            let working = batch.iter().filter(|(tool, ..)| !is_agent(tool)).count();
            let permits = self.permits(working, tenant_room.as_ref()).await;
            if let Some(reason) = self
                .start_and_run(session, batch, reply_seq, permits, look)
                .await?
            {
                // Asked to stop while calls ran: the rest wait for the resume.
                let event = Event::SessionPaused {
                    reason,
                    budget: false,
                };
                session.append(vec![event], Some(reply_seq)).await?;
                return session.barrier(self.durability).await;
            }
        }
        // Pause for the calls that wait for a person once nothing else is
        // left to run.
        let mut doubtful = session.state().calls_in_doubt();
        doubtful.extend(session.state().calls_awaiting_approval());
        let runnable = plan(session.state())
            .calls
            .iter()
            .any(|c| matches!(c.decision, CallDecision::Run | CallDecision::Rerun));
        if !doubtful.is_empty() && !runnable {
            let ids: Vec<&str> = doubtful.iter().map(|w| w.call_id.as_str()).collect();
            let reason = format!("{}: {}", crate::pause::WAITING_FOR_A_PERSON, ids.join(", "));
            let event = Event::SessionPaused {
                reason,
                budget: false,
            };
            session.append(vec![event], Some(reply_seq)).await?;
            session.barrier(self.durability).await?;
            crash::point(crash::IN_DOUBT_APPENDED);
        }
        Ok(())
    }

    /// Calls run at once: the session's limit, within the runner's cap.
    fn wave_size(&self, per_session: u64) -> usize {
        let cap = self.calls.as_ref().map_or(u32::MAX, |(_, size)| *size);
        per_session.clamp(1, u64::from(cap)) as usize
    }

    /// Waits for `n` calls' room: under their tenant's room first (`tenant`,
    /// if it has one), then under the runner's cap (never more than either:
    /// see [`Runner::wave_size`]). A tenant waiting for its own room holds
    /// none of the cap meanwhile.
    async fn permits(&self, n: usize, tenant: Option<&(Arc<tokio::sync::Semaphore>, u64)>) -> Room {
        let mut room = Room::default();
        if let Some((own, _)) = tenant {
            let permits = own.clone().acquire_many_owned(n as u32).await;
            room.tenant = Some(permits.expect("a tenant's room is never closed"));
        }
        if let Some((cap, _)) = self.calls.as_ref() {
            let permits = cap.clone().acquire_many_owned(n as u32).await;
            room.cap = Some(permits.expect("the cap is never closed"));
        }
        room
    }

    /// Starts `starts` (durably), runs them and records their outcomes.
    /// Meanwhile it looks for a stop when `look` (the turn's clock, see
    /// [`look_for_stop`]) ticks, every [`LOOK_FOR_STOP`]: a person's
    /// pause cancels the calls that can give up (MCP calls); the reason of
    /// a stop heard is returned, for the turn to pause on.
    async fn start_and_run(
        &self,
        session: &mut Session,
        starts: Vec<(Arc<dyn Tool>, CallContext, String)>,
        reply_seq: u64,
        mut permits: Room,
        look: &mut Option<Interval>,
    ) -> Result<Option<String>, RuntimeError> {
        let events = starts
            .iter()
            .map(|(tool, ctx, args)| Event::ToolStarted {
                call_id: ctx.call_id.clone(),
                tool: tool.spec().name.clone(),
                args: args.clone(),
                effect: tool.spec().effect,
                idempotency_key: ctx.idempotency_key.clone(),
                attempt: ctx.attempt,
            })
            .collect();
        let first_seq = session.append(events, Some(reply_seq)).await?;
        crash::point(crash::TOOL_STARTED_APPENDED);
        session.barrier(self.durability).await?;
        crash::point(crash::TOOL_STARTED_DURABLE);
        let mut running = JoinSet::new();
        let mut calls = HashMap::new();
        let (fire, cancel) = tools::Cancel::new();
        let remaining = crate::subagent::remaining(session.state());
        for (i, (tool, mut ctx, args)) in starts.into_iter().enumerate() {
            ctx.cancel = Some(cancel.clone());
            let started_seq = first_seq + i as u64;
            let call = (started_seq, tool.clone(), ctx.call_id.clone(), ctx.attempt);
            let child = tool.spec().child_spec().map(|spec| ChildCall {
                log: session.log().clone(),
                runner: self.for_child(session.id()),
                parent: session.id(),
                started_seq,
                call_id: ctx.call_id.clone(),
                key: ctx.idempotency_key.clone(),
                spec: spec.clone(),
                remaining,
                args: args.clone(),
                tenant: session.state().tenant.clone(),
            });
            let room = match child {
                Some(_) => Room::default(),
                None => permits.one(),
            };
            let task = running.spawn(async move {
                let _room = room;
                let started = Instant::now();
                match child {
                    Some(child) => Ran::of_child(&tool.spec().name, child.run().await, started),
                    None => Ran::of(tool.call(&ctx, &args).await, started),
                }
            });
            calls.insert(task.id(), call);
        }
        let mut retry = false;
        let mut stopping: Option<String> = None;
        let mut waiting: Option<String> = None;
        let look = look.get_or_insert_with(look_for_stop);
        loop {
            let joined = tokio::select! {
                joined = running.join_next_with_id() => match joined {
                    Some(joined) => joined,
                    None => break,
                },
                () = self.message_arrived(session.id()) => {
                    self.take_messages(session).await?;
                    continue;
                }
                _ = look.tick(), if stopping.is_none() => {
                    stopping = self.stop_heard(session.id()).await;
                    if stopping.as_deref() == Some(crate::pause::PAUSED_ON_REQUEST) {
                        let _ = fire.send(true);
                    }
                    continue;
                }
            };
            let (id, ran) = match joined {
                Ok(done) => done,
                Err(e) => {
                    let reason = format!("the tool's task ended abnormally: {e}");
                    let result = Err(ToolError::Interrupted {
                        tool: "?".into(),
                        reason,
                    });
                    (e.id(), Ran::of(result, Instant::now()))
                }
            };
            let (started_seq, tool, call_id, attempt) =
                calls.remove(&id).expect("every task is a call");
            crash::point(crash::TOOL_RETURNED);
            if let Some(why) = ran.waiting {
                // Its child waits: the call stays started, and the turn
                // pauses once the other calls are done.
                waiting.get_or_insert(why);
                continue;
            }
            let ms = ran.took.as_millis() as u64;
            let cancelled = matches!(ran.result, Err(ToolError::Cancelled { .. }));
            if cancelled && tool.spec().safe_to_rerun() {
                // Given up on a person's pause: the call stays started and
                // runs again when the turn resumes, however often that
                // happened (only a call that may not run again is in doubt).
                continue;
            }
            let end = (ran.result, ran.child);
            match finish_event(tool.as_ref(), call_id, attempt, end, ms) {
                Some(event) => {
                    session.append(vec![event], Some(started_seq)).await?;
                    crash::point(crash::TOOL_FINISHED_APPENDED);
                }
                None => retry = true,
            }
        }
        if retry && stopping.is_none() && waiting.is_none() {
            // The plan re-runs the unfinished calls with their keys.
            tokio::time::sleep(RETRY_BACKOFF).await;
        }
        Ok(stopping.or(waiting))
    }

    /// The reason of a stop asked for `id`, if any (nothing is recorded).
    async fn stop_heard(&self, id: uuid::Uuid) -> Option<String> {
        match &self.stop {
            Some(stop) => stop(id).await,
            None => None,
        }
    }
}

/// Whether the last entry is a reply the token limit cut off.
/// The events that record what the check of call `ctx`'s attempt
/// answered (no answer: the tool has no check here, which is unknown).
fn checked(ctx: &CallContext, answer: Option<Checked>, duration_ms: u64) -> Vec<Event> {
    let answer =
        answer.unwrap_or_else(|| Checked::Unknown("this process has no check for the tool".into()));
    let (answer, answered) = match answer {
        Checked::Applied(result) => (CheckAnswer::Applied, Some(result)),
        Checked::NotApplied => (CheckAnswer::NotApplied, None),
        // Bounded by its sources: a status line, the end of stderr.
        Checked::Unknown(why) => (CheckAnswer::Unknown(why), None),
    };
    let call_id = ctx.call_id.clone();
    let settled = answered.clone().map(|result| Event::ToolFinished {
        call_id: call_id.clone(),
        outcome: ToolOutcome::Ok(format!(
            "{}{result}",
            replay::prompt::SETTLED_BY_CHECK_PREFIX
        )),
        duration_ms,
        settled_by_check: true,
        rerun: None,
        child: None,
    });
    let check = Event::ToolChecked {
        call_id,
        attempt: ctx.attempt,
        answer,
        duration_ms,
        answered,
    };
    std::iter::once(check).chain(settled).collect()
}

/// Why mneme will not act on `reply`, if it will not: its tool calls were
/// cut off by the token limit, or their arguments are not JSON (a server
/// would refuse every later request that carries them), or there are more
/// than `max_calls`. None of a refused reply's calls run; the next request
/// tells the model why.
fn refusal(reply: &replay::ModelReply, max_calls: u64) -> Option<String> {
    let calls = &reply.tool_calls;
    let answered = reply.content.as_deref().is_some_and(|t| !t.is_empty());
    if reply.cut_off() && calls.is_empty() && !answered && !reply.thinking.is_empty() {
        return Some(
            "the token limit cut it off while it was still thinking, before it answered or \
             called a tool, so none of it was used. Answer again, thinking more briefly."
                .into(),
        );
    }
    if calls.is_empty() {
        return None;
    }
    if reply.cut_off() {
        return Some(
            "the token limit cut it off in the middle of its tool calls (finish_reason \
             length), so none of them ran. Make the calls again, with shorter arguments if \
             you can."
                .into(),
        );
    }
    let unparsed = calls.iter().find_map(|c| {
        serde_json::from_str::<OnceEach>(&c.arguments)
            .err()
            .map(|e| (c, e))
    });
    if let Some((call, error)) = unparsed {
        return Some(match error.is_data() {
            // A person approving could be shown one value and the tool
            // given the other.
            true => format!(
                "the arguments of call {} ({}) {error}, so none of its calls ran. \
                 Make the calls again with each key once.",
                call.id, call.name
            ),
            false => format!(
                "the arguments of call {} ({}) are not valid JSON, so none of its calls ran. \
                 Make the calls again with JSON arguments.",
                call.id, call.name
            ),
        });
    }
    (calls.len() as u64 > max_calls).then(|| {
        format!(
            "it made {} tool calls, and at most {max_calls} are allowed in one reply \
             (max_calls_per_reply); none of them ran. Make at most {max_calls} calls at a time.",
            calls.len()
        )
    })
}

/// JSON that parses, and in which no object holds a key twice (parsers
/// differ on which of the two they keep).
struct OnceEach;

impl<'de> serde::Deserialize<'de> for OnceEach {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OnceEach, D::Error> {
        d.deserialize_any(OnceEachVisitor)
    }
}

struct OnceEachVisitor;

impl<'de> serde::de::Visitor<'de> for OnceEachVisitor {
    type Value = OnceEach;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }

    fn visit_bool<E>(self, _: bool) -> Result<OnceEach, E> {
        Ok(OnceEach)
    }

    fn visit_i64<E>(self, _: i64) -> Result<OnceEach, E> {
        Ok(OnceEach)
    }

    fn visit_u64<E>(self, _: u64) -> Result<OnceEach, E> {
        Ok(OnceEach)
    }

    fn visit_f64<E>(self, _: f64) -> Result<OnceEach, E> {
        Ok(OnceEach)
    }

    fn visit_str<E>(self, _: &str) -> Result<OnceEach, E> {
        Ok(OnceEach)
    }

    fn visit_unit<E>(self) -> Result<OnceEach, E> {
        Ok(OnceEach)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<OnceEach, A::Error> {
        while seq.next_element::<OnceEach>()?.is_some() {}
        Ok(OnceEach)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<OnceEach, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!(
                    "hold the key {key:?} twice"
                )));
            }
            map.next_value::<OnceEach>()?;
        }
        Ok(OnceEach)
    }
}

/// Share of the context window a prompt may fill before it is compacted.
pub(crate) const COMPACT_AT: f64 = 0.8;

/// How many times a call whose outcome is unknown is run, with the same
/// idempotency key, before the model is told it failed.
pub(crate) const MAX_TOOL_ATTEMPTS: u32 = 3;
/// How often a turn with calls running looks for a stop.
const LOOK_FOR_STOP: Duration = Duration::from_secs(1);

/// A turn's clock for looking for a stop while its calls run, first due
/// [`LOOK_FOR_STOP`] from now: one timer a turn, armed when its first
/// calls start. (A timer armed afresh for every step woke the runtime's
/// parked worker to re-arm its own, a context switch a step.)
fn look_for_stop() -> Interval {
    let first = tokio::time::Instant::now() + LOOK_FOR_STOP;
    let mut look = tokio::time::interval_at(first, LOOK_FOR_STOP);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    look
}
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// What running one call gave.
struct Ran {
    /// Its output, or why there is none.
    result: Result<String, ToolError>,
    /// How long it ran.
    took: Duration,
    /// The child session an agent call ran, and what its tree spent.
    child: Option<Box<ChildRun>>,
    /// Why the call waits (its child does): it stays started.
    waiting: Option<String>,
}

impl Ran {
    /// A tool's call, started at `started`.
    fn of(result: Result<String, ToolError>, started: Instant) -> Ran {
        Ran {
            result,
            took: started.elapsed(),
            child: None,
            waiting: None,
        }
    }

    /// An agent call of tool `tool`, started at `started`, whose child
    /// ended with `end`. A child that could not be run for a reason of the
    /// log is an interrupted call: it runs again (safe: the same child).
    fn of_child(tool: &str, end: Result<ChildEnd, RuntimeError>, started: Instant) -> Ran {
        let failed = |reason: String| ToolError::Failed {
            tool: tool.to_string(),
            reason,
        };
        let (result, child, waiting) = match end {
            Ok(ChildEnd::Answered(answer, run)) => (Ok(answer), Some(run), None),
            Ok(ChildEnd::Failed(why, run)) => (Err(failed(why)), Some(run), None),
            Ok(ChildEnd::Waiting(why)) => (Err(failed(why.clone())), None, Some(why)),
            Err(e) => {
                let reason = e.to_string();
                let error = ToolError::Interrupted {
                    tool: tool.to_string(),
                    reason,
                };
                (Err(error), None, None)
            }
        };
        Ran {
            result,
            took: started.elapsed(),
            child,
            waiting,
        }
    }
}

/// Whether the session's tool `name` sleeps (kind `sleep`): the runner
/// records its wake instead of running anything.
fn is_sleep(session: &Session, name: &str) -> bool {
    (session.state().spec.as_ref())
        .and_then(|spec| spec.tool(name))
        .is_some_and(|tool| tool.kind == replay::ToolKind::Sleep)
}

/// Whether `tool` runs a sub-agent (a child session) rather than doing
/// work of its own.
fn is_agent(tool: &Arc<dyn Tool>) -> bool {
    tool.spec().child_spec().is_some()
}

/// The event that ends a call: its outcome; or doubt when the tool may have
/// acted and cannot safely run again; or nothing when its outcome is unknown
/// and it is safe to run again with the same key (the call stays started).
fn finish_event(
    tool: &dyn Tool,
    call_id: String,
    attempt: u32,
    (result, child): (Result<String, ToolError>, Option<Box<ChildRun>>),
    duration_ms: u64,
) -> Option<Event> {
    let failed = |message: String| Event::ToolFinished {
        call_id: call_id.clone(),
        outcome: ToolOutcome::Err(message),
        duration_ms,
        settled_by_check: false,
        rerun: None,
        child: child.clone(),
    };
    match result {
        Ok(output) => Some(Event::ToolFinished {
            call_id,
            outcome: ToolOutcome::Ok(output),
            duration_ms,
            settled_by_check: false,
            rerun: None,
            child,
        }),
        Err(error) if !error.outcome_unknown() => Some(failed(error.to_string())),
        Err(error) if !tool.spec().safe_to_rerun() => Some(Event::ToolInDoubt {
            call_id,
            reason: format!("{error}; whether it took effect is unknown"),
        }),
        Err(_) if attempt < MAX_TOOL_ATTEMPTS => None,
        Err(error) => Some(failed(format!(
            "{error}; gave up after {attempt} attempts with the same idempotency key, \
             so whether it took effect is unknown"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::fresh_summary;
    use eventlog::{EventLog, SledLog};

    /// A session of `spec` on a fresh log in `dir`, with the user's `text`.
    async fn with_message(
        dir: &std::path::Path,
        spec: replay::AgentSpec,
        text: &str,
    ) -> (Arc<dyn EventLog>, Session) {
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.join("data")).unwrap());
        let mut session = Session::create(log.clone(), spec).await.unwrap();
        let message = Event::UserMessage { text: text.into() };
        session.append(vec![message], None).await.unwrap();
        (log, session)
    }

    /// An agent on the scripted model answering `replies` (JSON) in turn,
    /// with `tools` (TOML `[[tools]]` tables), its script kept in `dir`.
    fn scripted_spec(dir: &std::path::Path, replies: &str, tools: &str) -> replay::AgentSpec {
        let script = dir.join("script.json");
        std::fs::write(&script, format!(r#"{{"replies": [{replies}]}}"#)).unwrap();
        toml::from_str(&format!(
            "name = \"t\"\n[model]\nprovider = \"scripted\"\nscript = {:?}\n{tools}",
            script.to_str().unwrap()
        ))
        .unwrap()
    }

    #[tokio::test]
    async fn a_long_turn_is_signed_at_checkpoints_and_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let call = r#"{"tool_calls": [{"name": "echo", "arguments": {}}]}"#;
        let spec = scripted_spec(
            dir.path(),
            &format!(r#"{call}, {call}, {call}, {{"content": "done"}}"#),
            "[[tools]]\nname = \"echo\"\nkind = \"command\"\ncommand = [\"sh\", \"-c\", \"echo 1\"]\neffect = \"read_only\"\n",
        );
        let (log, mut session) = with_message(dir.path(), spec, "go").await;
        let signer = crate::signing::HeadSigner::generate(&dir.path().join("key")).unwrap();
        let runner = Runner::new(Durability::Flushed).with_signer(Arc::new(signer), 4);
        let end = runner.drive(&mut session).await.unwrap();
        assert_eq!(end, TurnEnd::Answered("done".into()));
        let records = crate::session::read_events(log.as_ref(), session.id())
            .await
            .unwrap();
        let signed: Vec<u64> = (records.iter())
            .filter_map(|(_, e)| match e {
                Event::HeadSigned { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        // From seq 2, a step at a time (a reply; a call's start and finish):
        // at seq 6 four events were appended (signed, as seq 7); at 12 five
        // more since 7; the answer at 14 ends the turn.
        assert_eq!(signed, [6, 12, 14]);
    }

    /// A parent and a child agent (scripted) in `dir`: the parent calls its
    /// sub-agent `ask` once, the child calls `echo` (read only) once.
    fn tree_spec(dir: &std::path::Path) -> replay::AgentSpec {
        let call = |name: &str| {
            format!(r#"{{"tool_calls": [{{"name": "{name}", "arguments": {{"message": "go"}}}}]}}"#)
        };
        let answer = r#"{"content": "done"}"#;
        std::fs::write(
            dir.join("parent.json"),
            format!(r#"{{"replies": [{}, {answer}]}}"#, call("ask")),
        )
        .unwrap();
        std::fs::write(
            dir.join("child.json"),
            format!(r#"{{"replies": [{}, {answer}]}}"#, call("echo")),
        )
        .unwrap();
        std::fs::write(
            dir.join("child.toml"),
            "name = \"child\"\n[model]\nprovider = \"scripted\"\nmodel = \"m\"\nscript = \"child.json\"\n\
             [[tools]]\nname = \"echo\"\nkind = \"command\"\ncommand = [\"sh\", \"-c\", \"echo 1\"]\neffect = \"read_only\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("parent.toml"),
            "name = \"parent\"\n[model]\nprovider = \"scripted\"\nmodel = \"m\"\nscript = \"parent.json\"\n\
             [[tools]]\nname = \"ask\"\nkind = \"agent\"\nagent = \"child.toml\"\neffect = \"side_effect\"\n",
        )
        .unwrap();
        crate::agent::load_agent_file(&dir.join("parent.toml")).unwrap()
    }

    /// The daemon's cap on calls at once (`--max-parallel-calls`), here 1:
    /// the parent's call of its sub-agent must not hold the one permit
    /// while its child's call waits for it.
    #[tokio::test]
    async fn a_sub_agent_under_a_cap_of_one_call_at_once_answers() {
        for runner in [
            Runner::new(Durability::Flushed),
            Runner::new(Durability::Flushed).with_call_cap(1),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let spec = tree_spec(dir.path());
            let (_, mut session) = with_message(dir.path(), spec, "go").await;
            let end =
                tokio::time::timeout(Duration::from_secs(10), runner.drive(&mut session)).await;
            assert_eq!(
                end.expect("the turn hangs: the child waits for its parent's permit")
                    .unwrap(),
                TurnEnd::Answered("done".into())
            );
        }
    }

    /// A native tool that runs until the turn's pause cancels it.
    struct UntilPaused(replay::spec::ToolSpec, Arc<std::sync::atomic::AtomicBool>);

    #[async_trait::async_trait]
    impl Tool for UntilPaused {
        fn spec(&self) -> &replay::spec::ToolSpec {
            &self.0
        }
        async fn call(&self, ctx: &CallContext, _args: &str) -> Result<String, ToolError> {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            ctx.cancel.as_ref().unwrap().cancelled().await;
            self.1.store(false, std::sync::atomic::Ordering::SeqCst);
            Err(ToolError::Cancelled {
                tool: self.0.name.clone(),
                reason: "the turn was paused while it ran".into(),
            })
        }
    }

    /// A call a person's pause cancels is given up, not failed: paused
    /// three times (past the attempts an unknown outcome gets), it is
    /// still open, and runs again when the turn resumes.
    #[tokio::test]
    async fn a_call_given_up_on_a_pause_runs_again_however_often_it_was_paused() {
        let dir = tempfile::tempdir().unwrap();
        let spec = scripted_spec(
            dir.path(),
            r#"{"tool_calls": [{"name": "slow", "arguments": {}}]}, {"content": "done"}"#,
            "[[tools]]\nname = \"slow\"\ndescription = \"d\"\nkind = \"native\"\neffect = \"read_only\"\nparameters = { type = \"object\" }\n",
        );
        let running = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tool = Arc::new(UntilPaused(spec.tools[0].clone(), running.clone()));
        let (log, mut session) = with_message(dir.path(), spec, "go").await;
        // A person asks for a pause whenever the call runs.
        let asked = running.clone();
        let stop: StopCheck = Arc::new(move |_| {
            let paused = asked.load(std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move { paused.then(|| crate::pause::PAUSED_ON_REQUEST.to_string()) })
        });
        let runner = Runner::new(Durability::Flushed).with_stop(stop);
        let parts = runner
            .parts_with_native(&mut session, vec![tool])
            .await
            .unwrap();
        // Paused three times while the call ran, resumed after each.
        for _ in 0..3 {
            let end = runner.drive_with(&mut session, &parts).await.unwrap();
            assert_eq!(end, TurnEnd::Paused(crate::pause::PAUSED_ON_REQUEST.into()));
            let resumed = Event::SessionResumed {
                by: "ada".into(),
                extend_budget: false,
                after_crash: false,
            };
            session.append(vec![resumed], None).await.unwrap();
        }
        let records = crate::session::read_events(log.as_ref(), session.id())
            .await
            .unwrap();
        let finished: Vec<&Event> = (records.iter())
            .map(|(_, e)| e)
            .filter(|e| matches!(e, Event::ToolFinished { .. }))
            .collect();
        assert!(
            finished.is_empty(),
            "a call given up on a pause is recorded as failed: {finished:?}"
        );
        let next = plan(session.state());
        assert!(
            (next.calls.iter()).any(|c| matches!(c.decision, CallDecision::Rerun)),
            "the call runs again on the resume: {:?}",
            next.calls
        );
    }

    #[tokio::test]
    async fn a_drive_that_comes_to_rest_writes_the_summary_and_one_mid_turn_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let spec = scripted_spec(dir.path(), r#"{"content": "hello"}"#, "");
        let (log, mut session) = with_message(dir.path(), spec, "hi").await;
        session.barrier(Durability::Flushed).await.unwrap();
        let id = session.id();
        let head = log.head(id).await.unwrap().seq;
        assert!(
            fresh_summary(log.as_ref(), id, head).await.is_none(),
            "a barrier writes no summary"
        );
        let runner = Runner::new(Durability::Flushed);
        let end = runner.drive(&mut session).await.unwrap();
        assert_eq!(end, TurnEnd::Answered("hello".into()));
        let head = log.head(id).await.unwrap().seq;
        let summary = fresh_summary(log.as_ref(), id, head)
            .await
            .expect("written as the turn came to rest");
        assert_eq!(summary.status, "idle");
    }
}
