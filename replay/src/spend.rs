//! Spend: what model requests cost, and the daily caps on it.
//!
//! Two folds, both pure (the time of each record is given, never read):
//! - [`SessionSpend`]: a session's own model requests (a fork's copy of
//!   its parent's history not counted again; a sub-agent's are its own
//!   session's), by UTC day, in its spec's prices. Summed over sessions,
//!   this is the spend per tenant, agent, session and day.
//! - [`Ledger`]: one cap on one UTC day (a log of its own per cap and day,
//!   [`ledger_id`], holding only the `Spend*` kinds): the worst cases
//!   reserved before requests were sent, and what each really cost once
//!   settled. A reservation is appended at the seq after the state it
//!   was checked against, so two processes sharing a store never both
//!   reserve the last of a cap: one append wins, the other is refused as a
//!   conflict, reads the ledger again and checks again.

use crate::event::{Event, Usage};
use crate::spec::{AgentSpec, ModelSpec};
use crate::state::{SessionState, Totals};
use chrono::{DateTime, Datelike, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use uuid::Uuid;

/// Completion tokens a request's worst case counts when its spec sets no
/// `max_tokens` (nor `max_completion_tokens`): the reply may be longer,
/// and then costs more than was reserved.
pub const UNBOUNDED_REPLY_TOKENS: u64 = 4096;

/// The UTC day of `ms` (milliseconds since the Unix epoch), `YYYY-MM-DD`.
pub fn utc_day(ms: i64) -> String {
    let at = DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default();
    format!("{:04}-{:02}-{:02}", at.year(), at.month(), at.day())
}

/// When the UTC day of `ms` ends (the next midnight, UTC, in
/// milliseconds since the Unix epoch): when a daily cap resets.
pub fn day_ends_ms(ms: i64) -> i64 {
    const DAY_MS: i64 = 86_400_000;
    ms.div_euclid(DAY_MS)
        .saturating_add(1)
        .saturating_mul(DAY_MS)
}

/// The id of the log of cap `key`'s ledger on UTC day `day`: the same in
/// every process, so every process sharing a store reserves on one log.
pub fn ledger_id(key: &str, day: &str) -> Uuid {
    crate::tenant::derived_id(b"mneme-ledger\0", format!("{key}\0{day}").as_bytes())
}

/// Whether `kind` is one of a ledger's (its log holds no other).
pub fn is_ledger_kind(kind: &str) -> bool {
    kind.starts_with("Spend")
}

/// A spec's prices, a million tokens each.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Prices {
    /// Prompt tokens.
    pub input: f64,
    /// Completion tokens.
    pub output: f64,
    /// Prompt tokens read from the server's cache.
    pub cached_input: f64,
    /// Prompt tokens written to the server's cache.
    pub cache_write: f64,
}

impl Prices {
    /// The prices `model` gives (0 where it gives none).
    pub fn of(model: &ModelSpec) -> Prices {
        let input = model.input_cost_per_mtok.unwrap_or(0.0);
        Prices {
            input,
            output: model.output_cost_per_mtok.unwrap_or(0.0),
            cached_input: model.cached_input_cost_per_mtok.unwrap_or(input),
            cache_write: model.cache_write_cost_per_mtok.unwrap_or(input),
        }
    }

    /// What `usage` costs at these prices.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let per = |price: f64, tokens: u64| price * tokens as f64 / 1e6;
        let read = usage.cached_tokens.min(usage.prompt_tokens);
        let written = usage.cache_write_tokens.min(usage.prompt_tokens - read);
        per(self.input, usage.prompt_tokens - read - written)
            + per(self.cached_input, read)
            + per(self.cache_write, written)
            + per(self.output, usage.completion_tokens)
    }
}

/// What one session's own model requests cost, by UTC day: a fold of its
/// log, each record with its time.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SessionSpend {
    /// Seq of the last record folded.
    pub seq: u64,
    /// Its tenant, if any.
    pub tenant: Option<String>,
    /// Its agent's name.
    pub agent: String,
    /// The prices of the spec it runs with.
    pub prices: Prices,
    /// The records up to this seq are a fork's copy of its parent's
    /// history (counted in the parent).
    pub copied_through: u64,
    /// Usage and cost by UTC day (`YYYY-MM-DD`).
    pub days: BTreeMap<String, Totals>,
}

impl SessionSpend {
    /// Folds record `seq`, written at `at_ms`, holding `event`.
    pub fn apply(&mut self, seq: u64, at_ms: i64, event: &Event) {
        self.seq = seq;
        let copied = seq <= self.copied_through;
        match event {
            // The history a fork shares precedes it: its parent spent it.
            Event::SessionForked { shared: true, .. } => self.days.clear(),
            Event::SessionForked { at_seq, .. } if seq == 1 => {
                self.copied_through = at_seq.saturating_add(1);
            }
            Event::SessionStarted { spec, tenant } => {
                // A fork's copy holds its parent's start, which is its own.
                if self.agent.is_empty() {
                    self.agent = spec.name.clone();
                    self.tenant = tenant.as_ref().map(|t| t.name.clone());
                }
                self.prices = Prices::of(&spec.model);
            }
            Event::SpecChanged { spec, .. } => self.prices = Prices::of(&spec.model),
            Event::ModelReplied(reply) if !copied => {
                let cost = self.prices.cost(&reply.usage);
                (self.days.entry(utc_day(at_ms)).or_default()).count(&reply.usage, cost);
            }
            _ => {}
        }
    }

    /// Everything it spent, over every day.
    pub fn total(&self) -> Totals {
        let mut total = Totals::default();
        for day in self.days.values() {
            total.merge(day);
        }
        total
    }
}

/// A reservation of a ledger not settled yet.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    /// The session whose request it is.
    pub session: Uuid,
    /// The worst case reserved.
    pub cost: f64,
}

/// One cap's ledger on one UTC day: a fold of its log.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Ledger {
    /// Seq of the last record folded.
    pub last_seq: u64,
    /// What settled requests cost.
    pub spent: f64,
    /// Requests settled.
    pub settled: u64,
    /// Reservations not settled, by the seq of their `SpendReserved`.
    pub open: BTreeMap<u64, Reservation>,
}

/// What a cap's sums may exceed it by and still be within it: the float
/// sums of many small costs.
const CAP_SLACK: f64 = 1e-12;

impl Ledger {
    /// Folds one more record of the ledger's log.
    pub fn apply(&mut self, seq: u64, event: &Event) {
        self.last_seq = seq;
        match event {
            Event::SpendReserved { session, cost, .. } => {
                let cost = if cost.is_finite() { cost.max(0.0) } else { 0.0 };
                let session = *session;
                self.open.insert(seq, Reservation { session, cost });
            }
            Event::SpendSettled { reserved, cost } if self.open.remove(reserved).is_some() => {
                self.settled += 1;
                self.spent += if cost.is_finite() { cost.max(0.0) } else { 0.0 };
            }
            _ => {}
        }
    }

    /// What open reservations hold.
    pub fn reserved(&self) -> f64 {
        self.open.values().map(|r| r.cost).sum()
    }

    /// Whether reserving `cost` more keeps what was spent and reserved
    /// within `cap`.
    pub fn admits(&self, cost: f64, cap: f64) -> bool {
        self.spent + self.reserved() + cost <= cap + CAP_SLACK
    }
}

/// A daily cap on spend that applies to a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Cap {
    /// What it caps, for people: `tenant acme`, `agent billing of tenant
    /// acme`.
    pub name: String,
    /// Where it is set, for people: `mneme tenant set acme
    /// --max-cost-per-day`, `[limits] max_cost_per_day`.
    pub set_by: String,
    /// Its ledgers' key (with the day, [`ledger_id`]).
    pub key: String,
    /// The most a UTC day may cost.
    pub limit: f64,
}

/// Every daily cap that applies to a request of the session in `state`:
/// its agent's (`[limits] max_cost_per_day`, per tenant), and its
/// tenant's, whose limits are `tenant` (looked up by the caller).
pub fn caps(state: &SessionState, tenant: Option<&crate::tenant::TenantLimits>) -> Vec<Cap> {
    let mut caps = Vec::new();
    let tenant_name = state.tenant.as_ref().map(|t| t.name.as_str());
    if let (Some(name), Some(limit)) = (tenant_name, tenant.and_then(|t| t.max_cost_per_day)) {
        caps.push(Cap {
            name: format!("tenant {name}"),
            set_by: format!("mneme tenant set {name} --max-cost-per-day"),
            key: format!("tenant\0{name}"),
            limit,
        });
    }
    if let Some(spec) = &state.spec {
        if let Some(limit) = spec.limits.max_cost_per_day {
            let of = tenant_name.map_or(String::new(), |t| format!(" of tenant {t}"));
            caps.push(Cap {
                name: format!("agent {}{of}", spec.name),
                set_by: "[limits] max_cost_per_day".into(),
                key: format!("agent\0{}\0{}", tenant_name.unwrap_or(""), spec.name),
                limit,
            });
        }
    }
    caps
}

/// The most a request of `request_bytes` bytes of the session in `state`
/// may cost: its prompt's tokens as [`SessionState::estimate_tokens`]
/// estimates them, all at the dearer of the uncached and cache-write
/// prices, and the reply's limit (`max_tokens`, doubled for a request
/// after a cut-off reply; [`UNBOUNDED_REPLY_TOKENS`] without one) at the
/// completion price.
pub fn worst_case(state: &SessionState, request_bytes: u64) -> f64 {
    let Some(spec) = &state.spec else { return 0.0 };
    let prices = Prices::of(&spec.model);
    let prompt = state.estimate_tokens(request_bytes);
    let reply = reply_limit(spec).saturating_mul(match state.cut_off_in_a_row {
        1 => 2,
        _ => 1,
    });
    let per = |price: f64, tokens: u64| price * tokens as f64 / 1e6;
    per(prices.input.max(prices.cache_write), prompt) + per(prices.output, reply)
}

/// The most tokens a reply of `spec` may have, as its requests say.
fn reply_limit(spec: &AgentSpec) -> u64 {
    let model = &spec.model;
    match (model.max_tokens, model.max_completion_tokens) {
        (Some(limit), _) | (None, Some(limit)) => limit,
        (None, None) if model.is_anthropic() => crate::anthropic::DEFAULT_MAX_TOKENS,
        (None, None) => UNBOUNDED_REPLY_TOKENS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ModelReply, Tenancy};

    const DAY_MS: i64 = 86_400_000;

    fn spec(max_tokens: Option<u64>) -> AgentSpec {
        let mut spec: AgentSpec = toml::from_str(
            "name = \"billing\"\n[model]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\ninput_cost_per_mtok = 1.0\noutput_cost_per_mtok = 2.0\n",
        )
        .unwrap();
        spec.model.max_tokens = max_tokens;
        spec
    }

    fn started(tenant: Option<&str>) -> Event {
        Event::SessionStarted {
            spec: Box::new(spec(Some(100))),
            tenant: tenant.map(|name| Tenancy {
                name: name.into(),
                cache_salt: None,
                key: None,
            }),
        }
    }

    fn reply(prompt: u64, completion: u64) -> Event {
        Event::ModelReplied(ModelReply {
            usage: Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                ..Usage::default()
            },
            ..ModelReply::default()
        })
    }

    #[test]
    fn days_are_utc_and_end_at_midnight() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(DAY_MS - 1), "1970-01-01");
        assert_eq!(utc_day(DAY_MS), "1970-01-02");
        assert_eq!(day_ends_ms(0), DAY_MS);
        assert_eq!(day_ends_ms(DAY_MS - 1), DAY_MS);
        assert_eq!(day_ends_ms(DAY_MS), 2 * DAY_MS);
        assert_eq!(utc_day(1_777_593_600_000), "2026-05-01");
    }

    #[test]
    fn a_session_spends_by_day_at_its_prices() {
        let mut spend = SessionSpend::default();
        spend.apply(1, 10, &started(Some("acme")));
        spend.apply(2, 20, &reply(1_000_000, 0));
        spend.apply(3, DAY_MS + 5, &reply(0, 1_000_000));
        assert_eq!(spend.tenant.as_deref(), Some("acme"));
        assert_eq!(spend.agent, "billing");
        assert_eq!(spend.days.len(), 2);
        assert!((spend.days["1970-01-01"].cost - 1.0).abs() < 1e-9);
        assert!((spend.days["1970-01-02"].cost - 2.0).abs() < 1e-9);
        assert_eq!(spend.total().model_calls, 2);
        assert_eq!(spend.total().prompt_tokens, 1_000_000);
    }

    #[test]
    fn a_forks_copy_of_its_parents_history_is_not_counted_again() {
        let mut spend = SessionSpend::default();
        let forked = |shared| Event::SessionForked {
            parent: Uuid::from_u128(1),
            at_seq: 2,
            rerun: None,
            shared,
        };
        spend.apply(1, 0, &forked(false));
        spend.apply(2, 0, &started(Some("acme")));
        spend.apply(3, 0, &reply(1_000_000, 0));
        spend.apply(4, 0, &reply(0, 1_000_000));
        assert_eq!(spend.total().model_calls, 1, "{spend:?}");
        assert!((spend.total().cost - 2.0).abs() < 1e-9);
        assert_eq!(spend.tenant.as_deref(), Some("acme"));
        // A fork that shares its parent's history comes after it.
        let mut spend = SessionSpend::default();
        spend.apply(1, 0, &started(Some("acme")));
        spend.apply(2, 0, &reply(1_000_000, 0));
        spend.apply(3, 0, &forked(true));
        spend.apply(4, 0, &reply(0, 1_000_000));
        assert_eq!(spend.total().model_calls, 1, "{spend:?}");
        assert!((spend.total().cost - 2.0).abs() < 1e-9);
        assert_eq!(spend.tenant.as_deref(), Some("acme"));
    }

    #[test]
    fn a_ledger_admits_what_fits_beside_what_was_spent_and_reserved() {
        let mut ledger = Ledger::default();
        let session = Uuid::from_u128(5);
        let reserve = |cost| Event::SpendReserved {
            session,
            cost,
            cap: 1.0,
        };
        assert!(ledger.admits(1.0, 1.0));
        ledger.apply(1, &reserve(0.6));
        assert!(!ledger.admits(0.6, 1.0));
        assert!(ledger.admits(0.4, 1.0));
        ledger.apply(
            2,
            &Event::SpendSettled {
                reserved: 1,
                cost: 0.1,
            },
        );
        assert!(ledger.admits(0.6, 1.0), "released to its real cost");
        assert!((ledger.spent - 0.1).abs() < 1e-12);
        // A second settlement of the same reservation counts nothing.
        ledger.apply(
            3,
            &Event::SpendSettled {
                reserved: 1,
                cost: 5.0,
            },
        );
        assert!((ledger.spent - 0.1).abs() < 1e-12);
        assert_eq!(ledger.settled, 1);
        // Nonsense from a damaged record counts as nothing.
        ledger.apply(4, &reserve(f64::NAN));
        ledger.apply(5, &reserve(-3.0));
        assert!(ledger.reserved().abs() < 1e-12);
    }

    #[test]
    fn caps_are_the_tenants_and_the_agents() {
        let mut state = SessionState::fold([(1, started(Some("acme")))]);
        assert!(caps(&state, None).is_empty());
        let tenant = crate::tenant::TenantLimits {
            max_cost_per_day: Some(20.0),
            ..crate::tenant::TenantLimits::default()
        };
        let found = caps(&state, Some(&tenant));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name, "tenant acme");
        state.spec.as_mut().unwrap().limits.max_cost_per_day = Some(5.0);
        let found = caps(&state, Some(&tenant));
        assert_eq!(found[1].name, "agent billing of tenant acme");
        assert_ne!(
            ledger_id(&found[0].key, "2026-05-01"),
            ledger_id(&found[1].key, "2026-05-01")
        );
        assert_ne!(
            ledger_id(&found[0].key, "2026-05-01"),
            ledger_id(&found[0].key, "2026-05-02")
        );
        // The operator's sessions: the agent's cap only.
        let mut own = SessionState::fold([(1, started(None))]);
        own.spec.as_mut().unwrap().limits.max_cost_per_day = Some(5.0);
        assert_eq!(caps(&own, Some(&tenant)).len(), 1);
        assert_eq!(caps(&own, None)[0].name, "agent billing");
    }

    #[test]
    fn the_worst_case_is_the_prompt_and_the_longest_reply() {
        let state = SessionState::fold([(1, started(None))]);
        // 300 bytes at 3 a token, then 100 reply tokens at 2 a million.
        let worst = worst_case(&state, 300);
        assert!((worst - (100.0 * 1.0 + 100.0 * 2.0) / 1e6).abs() < 1e-12);
        let mut unbounded = state.clone();
        unbounded.spec.as_mut().unwrap().model.max_tokens = None;
        let worst = worst_case(&unbounded, 300);
        let expected = (100.0 + UNBOUNDED_REPLY_TOKENS as f64 * 2.0) / 1e6;
        assert!((worst - expected).abs() < 1e-12);
    }
}
