//! Schedules over the log: creating one, reading and removing it, and the
//! step that records a tick's firing (or skip) and starts what it starts.
//! What a tick does is decided by the pure fold
//! ([`replay::schedule::ScheduleState::decide`]); this module only reads
//! and appends, each append at the seq after the state it was decided from.

use crate::error::RuntimeError;
use crate::service::Service;
use crate::session::{decode, new_event, Session};
use eventlog::{LogError, SessionMeta};
use replay::schedule::{
    is_schedule_kind, Firing, ScheduleSpec, ScheduleState, ScheduledBy, Target, When,
};
use replay::{AgentSpec, Event};
use uuid::Uuid;

/// The schedule `request` asks for, created at `now_ms`, its agent
/// `spec` (resolved by the face from the request's `agent`, or the
/// request's own): checked as [`ScheduleSpec::validate`] says, but not yet
/// against the store.
pub(crate) fn spec_of(
    request: &api::CreateSchedule,
    spec: Option<AgentSpec>,
    now_ms: i64,
) -> Result<ScheduleSpec, String> {
    let when = match (&request.every, &request.cron) {
        (Some(every), None) => When::Every {
            seconds: replay::spec::parse_window(every)
                .map_err(|e| format!("every {e}"))?
                .as_secs(),
        },
        (None, Some(cron)) => When::Cron {
            expr: cron.clone(),
            timezone: request.timezone.clone().unwrap_or_else(|| "UTC".into()),
        },
        _ => {
            return Err(
                "give exactly one of every (such as 30s) or cron (such as \"0 9 * * *\")".into(),
            )
        }
    };
    if request.timezone.is_some() && request.every.is_some() {
        return Err("timezone is read only with cron".into());
    }
    let into = match request.into.as_deref() {
        None | Some("new") => Target::New,
        Some(id) => Target::Session(
            id.parse()
                .map_err(|_| format!("into {id:?}: expected new or a session id"))?,
        ),
    };
    if matches!(into, Target::Session(_)) && spec.is_some() {
        return Err("into a session sends it the message: give no agent".into());
    }
    let schedule = ScheduleSpec {
        agent: spec
            .as_ref()
            .map(|s| request.agent.clone().unwrap_or(s.name.clone())),
        spec: spec.map(Box::new),
        when,
        message: request.message.clone(),
        into,
        overlap: request.overlap.as_deref().unwrap_or("skip").parse()?,
        catch_up: request.catch_up.as_deref().unwrap_or("one").parse()?,
        from_ms: now_ms,
        tenant: None,
    };
    schedule.validate()?;
    Ok(schedule)
}

/// Whether stream `meta` of the log is a schedule.
pub(crate) fn is_schedule(meta: &SessionMeta) -> bool {
    is_schedule_kind(&meta.last_kind)
}

/// Whether stream `meta` of the log is a session: not a schedule's log,
/// the registry of tenants' or a ledger's (each holds only kinds of its
/// own, so its last one says what it is).
pub(crate) fn is_session(meta: &SessionMeta) -> bool {
    let kind = meta.last_kind.as_str();
    !(is_schedule_kind(kind)
        || replay::tenant::is_tenant_kind(kind)
        || replay::spend::is_ledger_kind(kind))
}

impl Service {
    /// Creates the schedule `request` asks for (its agent `spec` resolved
    /// by the caller), durable when this returns: its log's first record.
    /// Refused, saying why, when it cannot run as given (a period under a
    /// second, a cron expression or zone that does not parse, an agent
    /// spec that does not check, a target session the store does not hold,
    /// a message past the model's context window).
    pub async fn create_schedule(
        &self,
        request: &api::CreateSchedule,
        spec: Option<AgentSpec>,
    ) -> Result<Uuid, RuntimeError> {
        let mut schedule =
            spec_of(request, spec, crate::text::now_ms()).map_err(RuntimeError::Schedule)?;
        if let Some(spec) = schedule.spec.take() {
            schedule.spec = Some(Box::new(self.checked(*spec).await?));
        }
        schedule.tenant = self.live_tenancy().await?;
        if let Target::Session(id) = schedule.into {
            let meta = self.log.meta(id).await?;
            if meta.as_ref().is_none_or(|m| !is_session(m)) {
                return Err(RuntimeError::NoSuchSession(id));
            }
            let session = self.load(id).await?;
            // A tenant's schedule sends only to its own sessions.
            let whose = |t: Option<&replay::Tenancy>| t.map(|t| t.name.clone());
            if whose(session.state().tenant.as_ref()) != whose(schedule.tenant.as_ref()) {
                return Err(RuntimeError::NoSuchSession(id));
            }
            schedule
                .refuse_past_the_window(session.state())
                .map_err(RuntimeError::Schedule)?;
        }
        let id = Uuid::now_v7();
        let created = Event::ScheduleCreated {
            schedule: Box::new(schedule),
        };
        self.log
            .append(id, 1, vec![new_event(created, None).1])
            .await?;
        self.log.barrier(self.durability).await?;
        Ok(id)
    }

    /// Every session's metadata, in id order (the log's streams but the
    /// schedules').
    pub async fn session_metas(&self) -> Result<Vec<SessionMeta>, RuntimeError> {
        let mut metas = self.log.sessions().await?;
        metas.retain(is_session);
        Ok(metas)
    }

    /// Every schedule of the store (removed ones too), in id order.
    pub async fn schedule_ids(&self) -> Result<Vec<Uuid>, RuntimeError> {
        let metas = self.log.sessions().await?;
        Ok(metas
            .iter()
            .filter(|m| is_schedule(m))
            .map(|m| m.session)
            .collect())
    }

    /// Brings `state`, the fold of schedule `id`'s log up to some seq, up
    /// to its head; returns whether anything was read. A stream that is
    /// not a schedule is refused as no such schedule.
    pub async fn read_schedule(
        &self,
        id: Uuid,
        state: &mut ScheduleState,
    ) -> Result<bool, RuntimeError> {
        let head = self.log.head(id).await?;
        if head.seq <= state.last_seq {
            return Ok(false);
        }
        for record in self.log.read(id, state.last_seq + 1, head.seq).await? {
            let event = decode(&record)?;
            if record.envelope.seq == 1 && !matches!(event, Event::ScheduleCreated { .. }) {
                return Err(RuntimeError::NoSuchSchedule(id));
            }
            state.apply(record.envelope.seq, &event);
        }
        Ok(true)
    }

    /// Schedule `id`'s state, folded from its whole log.
    pub async fn schedule(&self, id: Uuid) -> Result<ScheduleState, RuntimeError> {
        if !self.log.meta(id).await?.is_some_and(|m| is_schedule(&m)) {
            return Err(RuntimeError::NoSuchSchedule(id));
        }
        let mut state = ScheduleState::default();
        if !self.read_schedule(id, &mut state).await? {
            return Err(RuntimeError::NoSuchSchedule(id));
        }
        Ok(state)
    }

    /// Records that `by` removed schedule `id`: it fires no more. Removing
    /// a removed schedule changes nothing.
    pub async fn remove_schedule(&self, id: Uuid, by: &str) -> Result<(), RuntimeError> {
        loop {
            let state = self.schedule(id).await?;
            if state.removed.is_some() {
                return Ok(());
            }
            let removed = Event::ScheduleRemoved { by: by.into() };
            match self.append_to_schedule(id, &state, vec![removed]).await {
                Err(RuntimeError::Log(LogError::Conflict { .. })) => continue,
                other => return other.map(|_| ()),
            }
        }
    }

    /// Records what schedule `id` (whose log `state` folds to its head)
    /// does at `now_ms`, `busy` telling whether the turn it would overlap
    /// has not ended (see [`ScheduleState::decide`]), and brings `state`
    /// along. Returns the firing recorded, if any: the caller then starts
    /// it ([`Service::start_firing`]). `Ok(None)` also when another
    /// process recorded first (`state` is then behind: read it again).
    pub async fn schedule_step(
        &self,
        id: Uuid,
        state: &mut ScheduleState,
        now_ms: i64,
        busy: bool,
    ) -> Result<Option<Firing>, RuntimeError> {
        let events = state.decide(id, now_ms, busy);
        if events.is_empty() {
            return Ok(None);
        }
        match self.append_to_schedule(id, state, events.clone()).await {
            Err(RuntimeError::Log(LogError::Conflict { .. })) => return Ok(None),
            other => other?,
        }
        let first = state.last_seq + 1;
        let fired = state.fired;
        for (i, event) in events.iter().enumerate() {
            state.apply(first + i as u64, event);
        }
        if state.fired > fired {
            crate::control::crash::point(crate::control::crash::SCHEDULE_FIRED);
        }
        Ok(state.last.filter(|_| state.fired > fired))
    }

    async fn append_to_schedule(
        &self,
        id: Uuid,
        state: &ScheduleState,
        events: Vec<Event>,
    ) -> Result<(), RuntimeError> {
        let new = events.into_iter().map(|e| new_event(e, None).1).collect();
        self.log.append(id, state.last_seq + 1, new).await?;
        self.log.barrier(self.durability).await?;
        Ok(())
    }

    /// Starts the session `firing` of schedule `id` names (`into = new`):
    /// its start, the schedule's mark and the message in one append, so a
    /// crash leaves all or nothing. `Ok(None)` when it was started already
    /// (by this firing before a crash, or by another process).
    pub async fn start_firing(
        &self,
        id: Uuid,
        schedule: &ScheduleSpec,
        firing: Firing,
    ) -> Result<Option<Session>, RuntimeError> {
        let Some(spec) = schedule.spec.clone() else {
            return Err(RuntimeError::Schedule(format!(
                "schedule {id} names no agent to start a session of"
            )));
        };
        // A tenant's schedule starts sessions only while the tenant is.
        if let Some(tenant) = &schedule.tenant {
            self.tenants().live(&tenant.name).await?;
        }
        let first = vec![
            Event::SessionStarted {
                spec,
                tenant: schedule.tenant.clone(),
            },
            Event::ScheduledBy {
                schedule: id,
                tick_ms: firing.tick_ms,
            },
            Event::UserMessage {
                text: schedule.message.clone(),
            },
        ];
        let first = first.into_iter().map(|e| (e, None)).collect();
        match Session::create_as(firing.session, self.log.clone(), first, None).await {
            Ok(mut session) => {
                session.barrier(self.durability).await?;
                Ok(Some(self.observe(session)))
            }
            Err(RuntimeError::Log(LogError::Conflict { .. })) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Schedule `id` (whose log `state` folds) as `GET /schedules` lists it;
/// none before its creation.
pub fn schedule_view(id: Uuid, state: &ScheduleState) -> Option<api::ScheduleView> {
    let spec = state.spec.as_ref()?;
    Some(api::ScheduleView {
        schedule: id,
        when: spec.when.to_string(),
        agent: spec.agent.clone(),
        into: match spec.into {
            Target::New => "new".into(),
            Target::Session(session) => session.to_string(),
        },
        message: api::describe::clip(&spec.message, 80),
        overlap: spec.overlap.to_string(),
        catch_up: spec.catch_up.to_string(),
        next: state.next_ms().map(api::format_time),
        last: state.last.map(|f| api::LastFiring {
            tick: api::format_time(f.tick_ms),
            session: f.session,
        }),
        fired: state.fired,
        skipped: state.skipped,
        removed_by: state.removed.clone(),
    })
}

/// Whether session `state` holds the message of `by`'s firing already.
pub fn delivered(state: &replay::SessionState, by: ScheduledBy) -> bool {
    state
        .scheduled_by
        .is_some_and(|b| b.schedule == by.schedule && b.tick_ms >= by.tick_ms)
}
