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
    /// for schedules other processes created.
    pub(crate) async fn fire_schedules(self: &Arc<Self>, discover: bool) {
        if discover {
            match self.service.schedule_ids().await {
                Ok(ids) => ids.into_iter().for_each(|id| self.schedules.know(id)),
                Err(e) => runtime::warn_line!("mneme serve: cannot list the schedules: {e}"),
            }
        }
        let ids: Vec<Uuid> = self.schedules.lock().keys().copied().collect();
        for id in ids {
            if self.is_shutting_down() {
                return;
            }
            if let Err(e) = self.step_schedule(id).await {
                runtime::warn_line!("mneme serve: schedule {id}: {e}");
            }
        }
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
            if known.started != Some(firing.tick_ms) {
                self.finish_firing(id, &known.state, firing).await?;
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
            known.started = Some(firing.tick_ms);
            self.schedules.lock().insert(id, known);
        }
        Ok(())
    }

    /// Whether `session`'s turn has not ended: it runs, waits for a
    /// person, sleeps, or cannot take a message (erased).
    async fn turn_unended(&self, session: Uuid) -> Result<bool, RuntimeError> {
        if self.scheduler.is_running(session) {
            return Ok(true);
        }
        match self.service.current_summary(session).await {
            Ok(summary) => Ok(!matches!(
                summary.status.as_str(),
                "idle" | "failed" | "cancelled" | "empty"
            )),
            Err(RuntimeError::NoSuchSession(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Starts what `firing` of schedule `id` names, unless that was done.
    async fn finish_firing(
        self: &Arc<Self>,
        id: Uuid,
        state: &ScheduleState,
        firing: Firing,
    ) -> Result<(), RuntimeError> {
        let started = match state.spec.as_ref().map(|s| s.into) {
            Some(Target::New) => self.service.exists(firing.session).await?,
            Some(Target::Session(session)) => {
                let by = ScheduledBy {
                    schedule: id,
                    tick_ms: firing.tick_ms,
                };
                let held = self.service.load(session).await?;
                runtime::control::delivered(held.state(), by)
            }
            None => true,
        };
        if !started {
            runtime::log_line!(
                "mneme serve: schedule {id}: the firing for {} did not start {}; starting it",
                api::format_time(firing.tick_ms),
                firing.session
            );
            self.start_firing(id, state, firing).await?;
        }
        Ok(())
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
