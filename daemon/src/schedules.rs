//! The daemon's schedules: at each look for what is due
//! ([`crate::Daemon`]'s deadline loop) every schedule known here reads
//! what its log gained, records what its due ticks do, and starts what a
//! firing starts. Any number of daemons sharing a store may do this at
//! once: each record is appended at the seq after the state it was decided
//! from, so one daemon records a tick and the others read it.

use crate::Daemon;
use replay::schedule::{Firing, ScheduleState, ScheduledBy, Target};
use runtime::control::TurnStart;
use runtime::RuntimeError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;

/// The schedules this daemon knows, each with its state as last read.
#[derive(Default)]
pub(crate) struct Schedules {
    known: Mutex<HashMap<Uuid, Known>>,
}

#[derive(Clone, Default)]
struct Known {
    state: ScheduleState,
    /// The tick of the last firing this daemon started or found started.
    started: Option<i64>,
}

impl Schedules {
    /// Makes `id` known (a schedule created here, or found in the store).
    pub(crate) fn know(&self, id: Uuid) {
        self.lock().entry(id).or_default();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Known>> {
        self.known.lock().expect("schedules")
    }
}

impl Daemon {
    /// Steps every schedule known here once; with `discover`, first looks
    /// for schedules other processes created, and returns how long that
    /// look took.
    pub(crate) async fn fire_schedules(self: &Arc<Self>, discover: bool) -> Option<Duration> {
        let mut looked = None;
        if discover {
            let started = std::time::Instant::now();
            match self.service.schedule_ids().await {
                Ok(ids) => ids.into_iter().for_each(|id| self.schedules.know(id)),
                Err(e) => runtime::warn_line!("mneme serve: cannot list the schedules: {e}"),
            }
            looked = Some(started.elapsed());
        }
        let ids: Vec<Uuid> = self.schedules.lock().keys().copied().collect();
        for id in ids {
            if self.is_shutting_down() {
                break;
            }
            if let Err(e) = self.step_schedule(id).await {
                runtime::warn_line!("mneme serve: schedule {id}: {e}");
            }
        }
        looked
    }

    /// Schedule `id`'s state, read from where this daemon last read it (a
    /// schedule it did not know is read whole, and known from then on).
    pub(crate) async fn schedule_state(&self, id: Uuid) -> Result<ScheduleState, RuntimeError> {
        let mut known = self.schedules.lock().get(&id).cloned().unwrap_or_default();
        if known.state.last_seq == 0 {
            known.state = self.service.schedule(id).await?;
        } else {
            self.service.read_schedule(id, &mut known.state).await?;
        }
        let state = known.state.clone();
        if state.removed.is_none() {
            self.schedules.lock().insert(id, known);
        }
        Ok(state)
    }

    async fn step_schedule(self: &Arc<Self>, id: Uuid) -> Result<(), RuntimeError> {
        let Some(mut known) = self.schedules.lock().get(&id).cloned() else {
            return Ok(());
        };
        self.service.read_schedule(id, &mut known.state).await?;
        if known.state.removed.is_some() {
            self.schedules.lock().remove(&id);
            return Ok(());
        }
        // A firing recorded (here before a crash, or by another daemon)
        // that may not have started what it names.
        if let Some(firing) = known.state.last {
            if known.started != Some(firing.tick_ms)
                && self.finish_firing(id, &known.state, firing).await?
            {
                known.started = Some(firing.tick_ms);
            }
        }
        let busy = match known.state.overlaps_with() {
            Some(session) => self.turn_unended(session).await?,
            None => false,
        };
        let now = runtime::text::now_ms();
        let fired = self
            .service
            .schedule_step(id, &mut known.state, now, busy)
            .await;
        // What was read and recorded is kept, whatever the start does: a
        // firing not marked started is finished at the next step.
        self.schedules.lock().insert(id, known.clone());
        if let Some(firing) = fired? {
            self.start_firing(id, &known.state, firing).await?;
            // A message's delivery is confirmed by the next step, from the
            // session's record (its turn may yet fail to get the lease).
            if known
                .state
                .spec
                .as_ref()
                .is_some_and(|s| s.into == Target::New)
            {
                known.started = Some(firing.tick_ms);
                self.schedules.lock().insert(id, known);
            }
        }
        Ok(())
    }

    /// Whether `session`'s turn has not ended: it runs, waits for a
    /// person, sleeps, or cannot take a message (erased).
    async fn turn_unended(&self, session: Uuid) -> Result<bool, RuntimeError> {
        Ok(self.scheduler.turns_of(session) > 0
            || (self.status_of(session).await?).is_some_and(|s| unended(&s)))
    }

    /// `session`'s status, none if the store does not hold it.
    async fn status_of(&self, session: Uuid) -> Result<Option<String>, RuntimeError> {
        match self.service.current_summary(session).await {
            Ok(summary) => Ok(Some(summary.status)),
            Err(RuntimeError::NoSuchSession(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether what `firing` of schedule `id` names is done: its session
    /// started, its message in the target session's record (or the target
    /// erased: then it never will be). If not, starts it, unless the
    /// target's turn has not ended (a turn here, maybe this firing's, or
    /// elsewhere): the next step looks again.
    async fn finish_firing(
        self: &Arc<Self>,
        id: Uuid,
        state: &ScheduleState,
        firing: Firing,
    ) -> Result<bool, RuntimeError> {
        let unstarted = |what: &str| {
            runtime::log_line!(
                "mneme serve: schedule {id}: the firing for {} did not {what} {}; now it does",
                api::format_time(firing.tick_ms),
                firing.session
            )
        };
        match state.spec.as_ref().map(|s| s.into) {
            Some(Target::New) => {
                if !self.service.exists(firing.session).await? {
                    unstarted("start");
                    self.start_firing(id, state, firing).await?;
                }
                Ok(true)
            }
            Some(Target::Session(session)) => {
                let status = self.status_of(session).await?.unwrap_or_default();
                if status == "erased" {
                    let tick = api::format_time(firing.tick_ms);
                    runtime::warn_line!("mneme serve: schedule {id}: session {session} was erased; the firing for {tick} is not delivered");
                    return Ok(true);
                }
                if self.scheduler.turns_of(session) > 0 || unended(&status) {
                    return Ok(false);
                }
                let by = ScheduledBy {
                    schedule: id,
                    tick_ms: firing.tick_ms,
                };
                let held = self.service.load(session).await?;
                if runtime::control::delivered(held.state(), by) {
                    return Ok(true);
                }
                if let Some(Err(reason)) = state
                    .spec
                    .as_ref()
                    .map(|s| s.refuse_past_the_window(held.state()))
                {
                    let tick = api::format_time(firing.tick_ms);
                    runtime::warn_line!("mneme serve: schedule {id}: session {session} cannot take the firing for {tick}, which is not delivered: {reason}");
                    return Ok(true);
                }
                unstarted("message");
                self.start_firing(id, state, firing).await?;
                Ok(false)
            }
            None => Ok(true),
        }
    }

    /// Starts the session `firing` names (or sends it the message), and
    /// its turn.
    async fn start_firing(
        self: &Arc<Self>,
        id: Uuid,
        state: &ScheduleState,
        firing: Firing,
    ) -> Result<(), RuntimeError> {
        let Some(spec) = state.spec.as_ref() else {
            return Ok(());
        };
        match spec.into {
            Target::New => {
                if let Some(session) = self.service.start_firing(id, spec, firing).await? {
                    self.statuses.saw(session.id(), session.state());
                    self.spawn_turn(session.id(), TurnStart::First);
                }
            }
            Target::Session(session) => {
                let by = ScheduledBy {
                    schedule: id,
                    tick_ms: firing.tick_ms,
                };
                let text = spec.message.clone();
                self.spawn_turn(session, TurnStart::Scheduled { text, by });
            }
        }
        Ok(())
    }
}

/// Whether a session of `status` has a turn that has not ended (or, erased,
/// can take no message).
fn unended(status: &str) -> bool {
    !matches!(status, "idle" | "failed" | "cancelled" | "empty" | "")
}
