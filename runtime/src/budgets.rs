//! Daily caps on spend, held across sessions, days and processes.
//!
//! Before each model request the runner asks [`Budgets::reserve`] for the
//! request's worst case ([`replay::spend::worst_case`]) against every cap
//! that applies ([`replay::spend::caps`]: its agent's, its tenant's). Each
//! cap has a ledger per UTC day, a log of its own: a reservation is
//! appended at the seq after the ledger it was checked against, so of two
//! processes sharing a store (a fleet on PostgreSQL) reserving the last of
//! a cap at once, one append wins and the other, refused as a conflict,
//! reads the ledger again and checks again. What is reserved and spent
//! never exceeds the cap; the spend itself exceeds it only by what a reply
//! costs beyond its reservation (a prompt longer than estimated, a reply
//! past its `max_tokens`). The reply settles the reservation at its real
//! cost; a request that got no reply settles at 0. A process that dies
//! between the two leaves the reservation open: counted at its worst case
//! for the rest of the day, never less.

use crate::error::RuntimeError;
use crate::session::{decode, new_event};
use crate::tenants::Tenants;
use eventlog::{Durability, EventLog, LogError};
use replay::spend::{caps, day_ends_ms, ledger_id, utc_day, Cap, Ledger};
use replay::{Event, SessionState};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;

/// How old the registry of tenants a cap's lookup reads may be: a tenant's
/// new cap holds everywhere within it.
const TENANT_LIMITS_AGE: Duration = Duration::from_secs(1);

/// Ledgers of one UTC day kept folded in memory, at most (older days are
/// dropped first).
const LEDGERS_KEPT: usize = 4096;

/// The caps of one store's sessions, and their ledgers.
pub(crate) struct Budgets {
    log: Arc<dyn EventLog>,
    durability: Durability,
    tenants: Arc<Tenants>,
    /// Each ledger as last read here, behind its own lock: reservations of
    /// one process on one ledger go one at a time (across processes, the
    /// append's expected seq decides).
    ledgers: Mutex<HashMap<Uuid, Arc<tokio::sync::Mutex<Ledger>>>>,
}

/// Reservations a request holds until it is settled.
#[derive(Debug, Default)]
pub(crate) struct Held(Vec<(Uuid, u64)>);

/// Why a request may not be sent: a cap it would cross, and what its
/// ledger holds (the reason a budget pause records).
#[derive(Debug)]
pub(crate) struct OverCap(pub(crate) String);

impl Budgets {
    pub(crate) fn new(
        log: Arc<dyn EventLog>,
        durability: Durability,
        tenants: Arc<Tenants>,
    ) -> Budgets {
        Budgets {
            log,
            durability,
            tenants,
            ledgers: Mutex::default(),
        }
    }

    /// The caps that apply to a request of session `state`, now.
    async fn caps_of(&self, state: &SessionState) -> Result<Vec<Cap>, RuntimeError> {
        let limits = match &state.tenant {
            Some(tenant) => {
                let registry = self.tenants.registry_within(TENANT_LIMITS_AGE).await?;
                registry.tenants.get(&tenant.name).map(|t| t.limits)
            }
            None => None,
        };
        Ok(caps(state, limits.as_ref()))
    }

    /// Reserves `worst` (the most the next request of `session`, in
    /// `state`, may cost) against every cap that applies, at `now_ms`,
    /// durable before it returns; or, when one would be crossed, reserves
    /// nothing and says which and why.
    pub(crate) async fn reserve(
        &self,
        session: Uuid,
        state: &SessionState,
        worst: f64,
        now_ms: i64,
    ) -> Result<Result<Held, OverCap>, RuntimeError> {
        let caps = self.caps_of(state).await?;
        let mut held = Held::default();
        if caps.is_empty() {
            return Ok(Ok(held));
        }
        let day = utc_day(now_ms);
        for cap in &caps {
            match self.reserve_on(session, cap, &day, worst, now_ms).await {
                Ok(Ok(at)) => held.0.push(at),
                refused => {
                    // What this request reserved on other caps goes back.
                    self.settle(held, 0.0).await?;
                    return refused.map(|r| r.map(|_| Held::default()));
                }
            }
        }
        self.log.barrier(self.durability).await?;
        Ok(Ok(held))
    }

    /// Reserves `worst` on `cap`'s ledger of `day`: its id and the seq of
    /// the reservation, or why not.
    async fn reserve_on(
        &self,
        session: Uuid,
        cap: &Cap,
        day: &str,
        worst: f64,
        now_ms: i64,
    ) -> Result<Result<(Uuid, u64), OverCap>, RuntimeError> {
        let id = ledger_id(&cap.key, day);
        let lock = self.ledger_lock(id);
        let mut ledger = lock.lock().await;
        loop {
            self.catch_up(id, &mut ledger).await?;
            if !ledger.admits(worst, cap.limit) {
                return Ok(Err(over_cap(cap, &ledger, day, worst, now_ms)));
            }
            let reserved = Event::SpendReserved {
                session,
                cost: worst,
                cap: cap.limit,
            };
            let at = ledger.last_seq + 1;
            match self
                .log
                .append(id, at, vec![new_event(reserved, None).1])
                .await
            {
                Ok(_) => {
                    ledger.apply(
                        at,
                        &Event::SpendReserved {
                            session,
                            cost: worst,
                            cap: cap.limit,
                        },
                    );
                    return Ok(Ok((id, at)));
                }
                // Another process reserved (or settled) first: look again.
                Err(LogError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Settles every reservation `held` at `cost` (a request's real cost;
    /// 0 for one that got no reply). Not made durable here: the next
    /// barrier covers it, and a settlement lost leaves its reservation
    /// counted at its worst case, never less.
    pub(crate) async fn settle(&self, held: Held, cost: f64) -> Result<(), RuntimeError> {
        for (id, reserved) in held.0 {
            let lock = self.ledger_lock(id);
            let mut ledger = lock.lock().await;
            loop {
                self.catch_up(id, &mut ledger).await?;
                let settled = Event::SpendSettled { reserved, cost };
                let at = ledger.last_seq + 1;
                match self
                    .log
                    .append(id, at, vec![new_event(settled.clone(), None).1])
                    .await
                {
                    Ok(_) => {
                        ledger.apply(at, &settled);
                        break;
                    }
                    Err(LogError::Conflict { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// The lock over ledger `id` as this process knows it.
    fn ledger_lock(&self, id: Uuid) -> Arc<tokio::sync::Mutex<Ledger>> {
        let mut ledgers = self.ledgers.lock().expect("ledgers lock");
        if ledgers.len() >= LEDGERS_KEPT && !ledgers.contains_key(&id) {
            // Forget those nothing holds (yesterday's, mostly).
            ledgers.retain(|_, l| Arc::strong_count(l) > 1);
        }
        ledgers.entry(id).or_default().clone()
    }

    /// Folds what other processes appended to ledger `id` since `ledger`.
    async fn catch_up(&self, id: Uuid, ledger: &mut Ledger) -> Result<(), RuntimeError> {
        let head = self.log.head(id).await?.seq;
        if head > ledger.last_seq {
            for record in self.log.read(id, ledger.last_seq + 1, head).await? {
                ledger.apply(record.envelope.seq, &decode(&record)?);
            }
        }
        Ok(())
    }
}

/// Why a request of worst case `worst` does not fit `cap`, whose ledger of
/// `day` holds `ledger`: the cap, what was spent and reserved, and when it
/// resets.
fn over_cap(cap: &Cap, ledger: &Ledger, day: &str, worst: f64, now_ms: i64) -> OverCap {
    let resets = api::format_time(day_ends_ms(now_ms));
    OverCap(format!(
        "budget: the daily cap of {} ({} = {}) would be crossed: {:.6} spent and {:.6} reserved on {day} (UTC), and this request may cost up to {worst:.6}; it was not sent. The cap resets at {resets}: resume with --extend then (or raise the cap)",
        cap.name,
        cap.set_by,
        cap.limit,
        ledger.spent,
        ledger.reserved(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped_state(cap: f64) -> SessionState {
        let spec: replay::AgentSpec = toml::from_str(&format!(
            "name = \"billing\"\n[model]\nprovider = \"scripted\"\nscript = \"x.json\"\ninput_cost_per_mtok = 1.0\noutput_cost_per_mtok = 1.0\n[limits]\nmax_cost_per_day = {cap}\n"
        ))
        .unwrap();
        SessionState::fold([(
            1,
            Event::SessionStarted {
                spec: Box::new(spec),
                tenant: None,
            },
        )])
    }

    fn budgets(log: &Arc<dyn EventLog>) -> Budgets {
        let tenants = Arc::new(Tenants::new(log.clone(), Durability::Flushed));
        Budgets::new(log.clone(), Durability::Flushed, tenants)
    }

    /// Two processes sharing a store (two `Budgets`, each with its own
    /// view of the ledgers) reserving at once never reserve past the cap.
    #[tokio::test]
    async fn reservations_racing_from_two_processes_never_pass_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn EventLog> = Arc::new(eventlog::SledLog::open(dir.path()).unwrap());
        let (one, two) = (budgets(&log), budgets(&log));
        let state = capped_state(1.0);
        let now = 1_777_593_600_000;
        let attempts = (0..12).flat_map(|_| [&one, &two]).map(|b| {
            let state = &state;
            async move { b.reserve(Uuid::now_v7(), state, 0.1, now).await.unwrap() }
        });
        let results = futures_join_all(attempts).await;
        let admitted = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(admitted, 10, "1.0 holds ten reservations of 0.1");
        let refused = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(refused.0.contains("agent billing"), "{}", refused.0);
        assert!(
            refused.0.contains("resets at 2026-05-02T00:00:00.000Z"),
            "{}",
            refused.0
        );
        // Settling at the real cost gives the rest back.
        let held: Vec<Held> = results.into_iter().filter_map(Result::ok).collect();
        for h in held {
            one.settle(h, 0.05).await.unwrap();
        }
        let more = two.reserve(Uuid::now_v7(), &state, 0.5, now).await.unwrap();
        assert!(more.is_ok(), "0.5 spent, 0.5 left");
        let full = one
            .reserve(Uuid::now_v7(), &state, 0.01, now)
            .await
            .unwrap();
        assert!(full.is_err(), "nothing left");
        // The next day has a ledger of its own.
        let tomorrow = now + 86_400_000;
        assert!(one
            .reserve(Uuid::now_v7(), &state, 0.9, tomorrow)
            .await
            .unwrap()
            .is_ok());
    }

    async fn futures_join_all<F: std::future::Future>(
        futures: impl Iterator<Item = F>,
    ) -> Vec<F::Output> {
        let handles: Vec<_> = futures.collect();
        let mut out = Vec::with_capacity(handles.len());
        let mut pinned: Vec<std::pin::Pin<Box<F>>> = handles.into_iter().map(Box::pin).collect();
        // Poll them together: each awaits the store, so they interleave.
        let mut done: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
        std::future::poll_fn(|cx| {
            let mut pending = false;
            for (i, f) in pinned.iter_mut().enumerate() {
                if done[i].is_none() {
                    match f.as_mut().poll(cx) {
                        std::task::Poll::Ready(v) => done[i] = Some(v),
                        std::task::Poll::Pending => pending = true,
                    }
                }
            }
            if pending {
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(())
            }
        })
        .await;
        out.extend(done.into_iter().map(|d| d.expect("done")));
        out
    }
}
