//! Sub-agents: a call of a tool of kind `agent` runs a child session.
//!
//! The child's id derives from its parent's id and the call's idempotency
//! key ([`replay::child_session_id`]), so every attempt of the call, in any
//! process, finds the same child: the first starts it (its spec, its
//! `SpawnedBy` and its user message in one append at seq 1, which a second
//! writer could only lose as a conflict); a later one continues it where
//! it stands (a child that answered is not asked again). The child's own
//! calls follow the ordinary rules (keys, checks, doubt, approvals). Its
//! answer is the call's result, recorded with what the child's tree spent
//! (`ToolFinished::child`), which the parent's fold counts once.

use crate::error::RuntimeError;
use crate::lease::HeldLease;
use crate::runner::{Runner, TurnEnd};
use crate::session::Session;
use eventlog::EventLog;
use replay::{child_session_id, AgentSpec, ChildRun, Event, Remaining, SessionState, Status};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// How long the lease a parent's turn takes on a child it drives lasts
/// unless renewed (it is renewed while the child runs).
pub(crate) const CHILD_LEASE_TTL: Duration = Duration::from_secs(30);

/// Who resumes a child its parent's call continues (`SessionResumed::by`).
pub(crate) const RESUMED_BY_PARENT: &str = "parent session";

/// One call of an agent tool, about to run its child.
pub(crate) struct ChildCall {
    /// The store both sessions are in.
    pub log: Arc<dyn EventLog>,
    /// Drives the child (the parent's runner, streaming nothing).
    pub runner: Runner,
    /// The parent session.
    pub parent: Uuid,
    /// Seq of the parent's `ToolStarted` of this attempt.
    pub started_seq: u64,
    /// The parent's call.
    pub call_id: String,
    /// The call's idempotency key.
    pub key: String,
    /// The child's spec, as the parent's tool pins it.
    pub spec: AgentSpec,
    /// What the parent's turn has left of its budgets.
    pub remaining: Remaining,
    /// The call's arguments (the person's, where they edited them).
    pub args: String,
    /// The parent's tenant: the child is that tenant's too.
    pub tenant: Option<replay::Tenancy>,
}

/// How a child's run ended, for its parent's call.
#[derive(Debug)]
pub(crate) enum ChildEnd {
    /// It answered: the call's result, and what the child's tree spent.
    Answered(String, Box<ChildRun>),
    /// It failed, was cancelled or erased: the call fails with this.
    Failed(String, Box<ChildRun>),
    /// It waits for a person or a resume: the parent's call stays started
    /// and the parent pauses, saying why.
    Waiting(String),
}

impl ChildCall {
    /// The child's id.
    pub(crate) fn child_id(&self) -> Uuid {
        child_session_id(self.parent, &self.key)
    }

    /// Starts or continues the child, under its own lease, until it
    /// answers, fails or waits.
    pub(crate) async fn run(self) -> Result<ChildEnd, RuntimeError> {
        let id = self.child_id();
        let mut session = self.open_or_start(id).await?;
        let owner = crate::lease::owner_name("subagent");
        let lease =
            HeldLease::acquire_taking_over_exited(self.log.clone(), id, &owner, CHILD_LEASE_TTL)
                .await?;
        match self.go_on(&mut session).await {
            Ok(end) => {
                lease.release().await;
                Ok(end)
            }
            Err(e) => {
                lease.lapse().await;
                Err(e)
            }
        }
    }

    /// The child as the log holds it, started if it is not there yet.
    async fn open_or_start(&self, id: Uuid) -> Result<Session, RuntimeError> {
        if self.log.head(id).await?.seq > 0 {
            let child = Session::load(self.log.clone(), id).await?;
            return self.own(child);
        }
        let spec = crate::mcp::pin(self.spec.bounded_by(&self.remaining), "sub-agent").await?;
        let first = vec![
            Event::SessionStarted {
                spec: Box::new(spec),
                tenant: self.tenant.clone(),
            },
            Event::SpawnedBy {
                parent: self.parent,
                seq: self.started_seq,
                call_id: self.call_id.clone(),
            },
            Event::UserMessage {
                text: child_message(&self.args),
            },
        ];
        let first = first.into_iter().map(|e| (e, None)).collect();
        match Session::create_as(id, self.log.clone(), first, None).await {
            Ok(mut session) => {
                session.barrier(self.runner.durability()).await?;
                Ok(session)
            }
            // Started meanwhile by another attempt: that one is the child.
            Err(RuntimeError::Log(eventlog::LogError::Conflict { .. })) => {
                self.own(Session::load(self.log.clone(), id).await?)
            }
            Err(e) => Err(e),
        }
    }

    /// `child`, the session the store holds at the child's id, if it is
    /// this call's own: started by this parent's call, and of the parent's
    /// tenant. Anything else (a session of another tenant, or one no call
    /// of this parent started) is refused, never driven.
    fn own(&self, child: Session) -> Result<Session, RuntimeError> {
        let state = child.state();
        let parent = state.parent.as_ref().map(|p| p.session);
        let tenant = |t: &Option<replay::Tenancy>| t.as_ref().map(|t| t.name.clone());
        if parent == Some(self.parent) && tenant(&state.tenant) == tenant(&self.tenant) {
            return Ok(child);
        }
        Err(RuntimeError::Forbidden(format!(
            "call {}: session {} is not a sub-agent this session started, and is not run as one",
            self.call_id,
            child.id()
        )))
    }

    /// Continues the child from where it stands.
    async fn go_on(&self, session: &mut Session) -> Result<ChildEnd, RuntimeError> {
        let state = session.state();
        match state.status() {
            Status::Idle => return Ok(self.ended(session, TurnEnd::Answered(answer(state)))),
            Status::Paused if state.waits_for_a_person() => {
                return Ok(ChildEnd::Waiting(
                    self.waiting(session.id(), &waits_for(state)),
                ))
            }
            Status::Paused => {
                let event = Event::SessionResumed {
                    by: format!("{RESUMED_BY_PARENT} {}", self.parent),
                    extend_budget: false,
                    after_crash: false,
                };
                session.append(vec![event], None).await?;
                session.barrier(self.runner.durability()).await?;
            }
            Status::Failed
            | Status::Cancelled
            | Status::Erased
            | Status::Empty
            | Status::Sleeping => {
                let why = format!("it is {}", state.status());
                return Ok(ChildEnd::Failed(
                    self.failure(session.id(), &why),
                    run_of(session),
                ));
            }
            Status::Running => {}
        }
        let end = drive_boxed(&self.runner, session).await;
        let end = match end {
            Ok(end) => end,
            // A failed turn is recorded in the child: its parent's call
            // fails with it. Anything else (the log) is the parent's error.
            Err(e) if session.state().status() == Status::Failed => TurnEnd::Failed(e.to_string()),
            Err(e) => return Err(e),
        };
        Ok(self.ended(session, end))
    }

    /// What the parent's call makes of the child's turn ending in `end`.
    fn ended(&self, session: &Session, end: TurnEnd) -> ChildEnd {
        let id = session.id();
        match end {
            TurnEnd::Answered(answer) | TurnEnd::CutOffAnswer(answer) => {
                crate::control::crash::point(crate::control::crash::SUBAGENT_ANSWERED);
                ChildEnd::Answered(answer, run_of(session))
            }
            TurnEnd::Failed(why) => ChildEnd::Failed(
                self.failure(id, &format!("its turn failed: {why}")),
                run_of(session),
            ),
            TurnEnd::Cancelled(by) => ChildEnd::Failed(
                self.failure(id, &format!("it was cancelled by {by}")),
                run_of(session),
            ),
            // Refused when the spec is checked: a child's turn is its
            // parent's, which cannot sleep for it.
            TurnEnd::Sleeping { .. } => ChildEnd::Failed(
                self.failure(id, "it sleeps, and a sub-agent may not"),
                run_of(session),
            ),
            // Stopped by its runner's stop (the parent's: a shutdown, a
            // person's pause of the parent): the parent stops for the same
            // reason, so whoever resumes stopped sessions resumes it.
            TurnEnd::Paused(reason) if !session.state().waits_for_a_person() => {
                ChildEnd::Waiting(reason)
            }
            TurnEnd::NeedsDecision(_)
            | TurnEnd::NeedsApproval(_)
            | TurnEnd::BudgetSpent(_)
            | TurnEnd::Paused(_) => {
                ChildEnd::Waiting(self.waiting(id, &waits_for(session.state())))
            }
        }
    }

    fn waiting(&self, child: Uuid, why: &str) -> String {
        format!(
            "call {} waits for its sub-agent session {child}: {why}",
            self.call_id
        )
    }

    fn failure(&self, child: Uuid, why: &str) -> String {
        format!("sub-agent session {child}: {why}")
    }
}

/// Drives `session` behind a box: a child's drive runs inside its
/// parent's, so the future's type would otherwise contain itself.
fn drive_boxed<'a>(
    runner: &'a Runner,
    session: &'a mut Session,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<TurnEnd, RuntimeError>> + Send + 'a>>
{
    Box::pin(runner.drive(session))
}

/// The child's user message from the call's arguments: the `message`
/// string where there is one, else the arguments as the model sent them.
pub(crate) fn child_message(args: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(args).ok();
    match parsed.as_ref().and_then(|v| v.get("message")) {
        Some(serde_json::Value::String(text)) => text.clone(),
        _ => args.to_string(),
    }
}

/// The child's answer (empty when it has none).
fn answer(state: &SessionState) -> String {
    state.answer().unwrap_or_default().to_string()
}

/// What the child's run spent, for its parent's call.
fn run_of(session: &Session) -> Box<ChildRun> {
    Box::new(ChildRun {
        session: session.id(),
        totals: session.state().tree_totals(),
    })
}

/// Why a paused child waits, in a few words.
fn waits_for(state: &SessionState) -> String {
    let in_doubt = state.calls_in_doubt();
    let approvals = state.calls_awaiting_approval();
    let ids = |calls: &[replay::Waiting]| {
        (calls.iter())
            .map(|w| w.call_id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !approvals.is_empty() {
        return format!("its calls wait for approval ({})", ids(&approvals));
    }
    if !in_doubt.is_empty() {
        return format!("its calls are in doubt ({})", ids(&in_doubt));
    }
    match &state.paused {
        Some(reason) => format!("it is paused ({reason})"),
        None => format!("it is {}", state.status()),
    }
}

/// What the parent's turn has left of its budgets, for a child it starts.
pub(crate) fn remaining(state: &SessionState) -> Remaining {
    let limits = state.spec.as_ref().map(|s| s.limits).unwrap_or_default();
    Remaining {
        steps: limits.steps_per_turn().saturating_sub(state.turn.steps),
        cost: limits.max_cost_per_turn.map(|max| max - state.turn.cost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenancy(name: &str) -> Option<replay::Tenancy> {
        Some(replay::Tenancy {
            name: name.into(),
            cache_salt: None,
            key: None,
        })
    }

    /// A session whose first append says a call of `parent` started it,
    /// for `tenant`.
    async fn spawned(
        log: &Arc<dyn EventLog>,
        id: Uuid,
        parent: Uuid,
        tenant: Option<replay::Tenancy>,
    ) -> Session {
        let spec: AgentSpec = toml::from_str(
            "name = \"child\"\n[model]\nprovider = \"scripted\"\nscript = \"x.json\"\n",
        )
        .unwrap();
        let first = vec![
            (
                Event::SessionStarted {
                    spec: Box::new(spec),
                    tenant,
                },
                None,
            ),
            (
                Event::SpawnedBy {
                    parent,
                    seq: 3,
                    call_id: "call_0".into(),
                },
                None,
            ),
        ];
        Session::create_as(id, log.clone(), first, None)
            .await
            .unwrap()
    }

    /// A tenant's agent cannot run another tenant's session (or one its
    /// own call did not start) as its sub-agent: the store's session at
    /// the child's id is driven only if it is this call's own.
    #[tokio::test]
    async fn a_child_is_driven_only_if_this_calls_own_and_of_its_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn EventLog> = Arc::new(eventlog::SledLog::open(dir.path()).unwrap());
        let parent = Uuid::now_v7();
        let call = |tenant: Option<replay::Tenancy>| ChildCall {
            log: log.clone(),
            runner: Runner::new(eventlog::Durability::Flushed),
            parent,
            started_seq: 3,
            call_id: "call_0".into(),
            key: "k".into(),
            spec: toml::from_str(
                "name = \"child\"\n[model]\nprovider = \"scripted\"\nscript = \"x.json\"\n",
            )
            .unwrap(),
            remaining: Remaining {
                steps: 1,
                cost: None,
            },
            args: "{}".into(),
            tenant,
        };
        let own = spawned(&log, Uuid::now_v7(), parent, tenancy("acme")).await;
        assert!(call(tenancy("acme")).own(own).is_ok());
        let others = spawned(&log, Uuid::now_v7(), parent, tenancy("beta")).await;
        let refused = call(tenancy("acme")).own(others).err().unwrap();
        assert!(matches!(refused, RuntimeError::Forbidden(_)), "{refused}");
        let strangers = spawned(&log, Uuid::now_v7(), Uuid::now_v7(), tenancy("acme")).await;
        assert!(
            call(tenancy("acme")).own(strangers).is_err(),
            "another parent's"
        );
        let operators = spawned(&log, Uuid::now_v7(), parent, None).await;
        assert!(
            call(tenancy("acme")).own(operators).is_err(),
            "the operator's"
        );
    }

    #[test]
    fn the_childs_message_is_the_message_argument_or_the_whole_arguments() {
        assert_eq!(child_message(r#"{"message":"sum 2 and 3"}"#), "sum 2 and 3");
        assert_eq!(child_message(r#"{"task":"x"}"#), r#"{"task":"x"}"#);
        assert_eq!(child_message("not json"), "not json");
    }
}
