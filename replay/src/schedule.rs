//! Schedules: a schedule is a log of its own (its creation, each firing,
//! each skip, its removal); its state is a fold of that log, and what it
//! does at a moment is decided from that state and the moment alone.
//!
//! Exactly one firing per tick follows from the log: a firing or a skip
//! is appended at the seq after the state it was decided from, so of two
//! processes deciding the same tick one append wins and the other is
//! refused as a conflict.

use crate::event::Event;
use crate::spec::AgentSpec;
use chrono::{DateTime, FixedOffset, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A tick later than this (in milliseconds) is missed, not on time: with
/// `catch_up = "none"` it is skipped.
pub const ON_TIME_MS: i64 = 10_000;

/// The most ticks one decision looks at: after a long downtime the missed
/// ticks are recorded in runs of at most this many.
pub const MAX_TICKS_AT_ONCE: usize = 1000;

/// The shortest period of an `every` schedule.
pub const MIN_EVERY_SECONDS: u64 = 1;

/// When a schedule's ticks come.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// Every `seconds`, counted from the schedule's creation.
    Every {
        /// The period.
        seconds: u64,
    },
    /// At the times a cron expression (5 fields, or 6 with seconds first)
    /// names, in `timezone` (`UTC` or a fixed offset such as `+02:00`).
    Cron {
        /// The expression.
        expr: String,
        /// The zone it is read in.
        timezone: String,
    },
}

/// What a firing does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Starts a new session of the schedule's agent with the message.
    New,
    /// Sends the message to this session.
    Session(Uuid),
}

/// What a due tick does while the previous firing's turn (or the target
/// session's turn) has not ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// It is skipped (recorded as such).
    #[default]
    Skip,
    /// It waits for that turn to end, then fires.
    Queue,
}

/// Which of the ticks that came due at once (after a downtime, or while a
/// queued tick waited) fire; the others are recorded as missed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// None: only a tick on time ([`ON_TIME_MS`]) fires.
    None,
    /// The newest one.
    #[default]
    One,
    /// Every one, oldest first (each subject to `overlap`).
    All,
}

impl std::str::FromStr for Overlap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "skip" => Ok(Overlap::Skip),
            "queue" => Ok(Overlap::Queue),
            other => Err(format!("overlap {other:?}: expected skip or queue")),
        }
    }
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Overlap::Skip => "skip",
            Overlap::Queue => "queue",
        })
    }
}

impl std::str::FromStr for CatchUp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(CatchUp::None),
            "one" => Ok(CatchUp::One),
            "all" => Ok(CatchUp::All),
            other => Err(format!("catch_up {other:?}: expected none, one or all")),
        }
    }
}

impl std::fmt::Display for CatchUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CatchUp::None => "none",
            CatchUp::One => "one",
            CatchUp::All => "all",
        })
    }
}

impl std::fmt::Display for When {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            When::Every { seconds } => write!(
                f,
                "every {}",
                crate::spec::window(std::time::Duration::from_secs(*seconds))
            ),
            When::Cron { expr, timezone } => write!(f, "cron {expr:?} ({timezone})"),
        }
    }
}

/// Why ticks were skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// They came due while nothing fired them, and `catch_up` leaves them.
    Missed,
    /// The previous firing's turn still ran (`overlap = "skip"`).
    Overlap,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SkipReason::Missed => "missed",
            SkipReason::Overlap => "overlap",
        })
    }
}

/// A schedule as its creation records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// The agent's name, for people (`into = new`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The agent a firing starts a session of (`into = new`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Box<AgentSpec>>,
    /// When its ticks come.
    pub when: When,
    /// The user message each firing sends.
    pub message: String,
    /// What a firing does.
    pub into: Target,
    /// What a tick does while the previous firing's turn runs.
    pub overlap: Overlap,
    /// Which ticks that came due at once fire.
    pub catch_up: CatchUp,
    /// Ticks come after this moment (milliseconds since the Unix epoch).
    pub from_ms: i64,
    /// The tenant whose schedule it is: the sessions its firings start are
    /// that tenant's (absent: the operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<crate::event::Tenancy>,
}

impl ScheduleSpec {
    /// Whether the schedule can run: a period of at least
    /// [`MIN_EVERY_SECONDS`], a cron expression that parses, a zone it can
    /// read, a message, and an agent for `into = new`.
    pub fn validate(&self) -> Result<(), String> {
        match &self.when {
            When::Every { seconds } if *seconds < MIN_EVERY_SECONDS => {
                return Err(format!(
                    "every: at least {MIN_EVERY_SECONDS}s between ticks"
                ))
            }
            When::Every { .. } => {}
            When::Cron { expr, timezone } => {
                parse_cron(expr)?;
                parse_zone(timezone)?;
            }
        }
        if self.message.trim().is_empty() {
            return Err("message: empty (each firing sends it as the user message)".into());
        }
        match (&self.into, &self.spec) {
            (Target::New, None) => Err(
                "into = new needs an agent to start sessions of (--agent FILE; in the API, \"agent\" or \"spec\")".into(),
            ),
            (Target::New, Some(spec)) => {
                spec.validate()?;
                let started = Event::SessionStarted {
                    spec: spec.clone(),
                    tenant: self.tenant.clone(),
                };
                self.refuse_past_the_window(&crate::SessionState::fold([(1, started)]))
            }
            (Target::Session(_), _) => Ok(()),
        }
    }

    /// Refuses the schedule if its message would not fit in the context
    /// window of `session` (the session it sends to, or one as it starts),
    /// as [`crate::SessionState::past_the_window`] says: every firing
    /// would be refused.
    pub fn refuse_past_the_window(&self, session: &crate::SessionState) -> Result<(), String> {
        match session.past_the_window(&self.message) {
            Some(reason) => Err(format!("message: {reason}")),
            None => Ok(()),
        }
    }

    /// The ticks after `after_ms` up to `upto_ms` (both in milliseconds
    /// since the Unix epoch), oldest first, at most `limit` of them.
    pub fn ticks(&self, after_ms: i64, upto_ms: i64, limit: usize) -> Vec<i64> {
        let mut out = Vec::new();
        match &self.when {
            When::Every { seconds } => {
                let period = (*seconds).max(MIN_EVERY_SECONDS) as i64 * 1000;
                let passed = (after_ms - self.from_ms).max(0) / period;
                let mut tick = self.from_ms + (passed + 1) * period;
                while tick <= upto_ms && out.len() < limit {
                    out.push(tick);
                    tick += period;
                }
            }
            When::Cron { expr, timezone } => {
                let (Ok(cron), Ok(zone)) = (parse_cron(expr), parse_zone(timezone)) else {
                    return out;
                };
                let Some(start) =
                    DateTime::<Utc>::from_timestamp_millis(after_ms.max(self.from_ms))
                else {
                    return out;
                };
                let mut at = start.with_timezone(&zone);
                while out.len() < limit {
                    let Ok(next) = cron.find_next_occurrence(&at, false) else {
                        break;
                    };
                    let tick = next.timestamp_millis();
                    if tick > upto_ms {
                        break;
                    }
                    out.push(tick);
                    at = next;
                }
            }
        }
        out
    }

    /// The first tick after `after_ms`, if there is one.
    pub fn next_tick(&self, after_ms: i64) -> Option<i64> {
        self.ticks(after_ms, i64::MAX, 1).first().copied()
    }
}

fn parse_cron(expr: &str) -> Result<croner::Cron, String> {
    croner::Cron::new(expr)
        .with_seconds_optional()
        .parse()
        .map_err(|e| format!("cron {expr:?}: {e}"))
}

/// `UTC` (or `Z`), or a fixed offset `+HH:MM` / `-HH:MM`.
fn parse_zone(zone: &str) -> Result<FixedOffset, String> {
    let refuse = || {
        format!("timezone {zone:?}: give UTC or a fixed offset such as +02:00 (named zones are not read)")
    };
    if zone.eq_ignore_ascii_case("utc") || zone == "Z" {
        return Ok(FixedOffset::east_opt(0).expect("zero offset"));
    }
    let (sign, rest) = match zone.as_bytes().first() {
        Some(b'+') => (1, &zone[1..]),
        Some(b'-') => (-1, &zone[1..]),
        _ => return Err(refuse()),
    };
    let (h, m) = rest.split_once(':').ok_or_else(refuse)?;
    let (h, m): (i32, i32) = (
        h.parse().map_err(|_| refuse())?,
        m.parse().map_err(|_| refuse())?,
    );
    if h > 23 || m > 59 || h.to_string().len() > 2 {
        return Err(refuse());
    }
    FixedOffset::east_opt(sign * (h * 3600 + m * 60)).ok_or_else(refuse)
}

/// The session a firing of `schedule` for `tick_ms` starts (`into = new`):
/// derived from both (SHA-256, as a UUID of version 8), so every process
/// deciding that tick names the same session, and a second start of it is
/// refused as a conflict.
pub fn scheduled_session_id(schedule: Uuid, tick_ms: i64) -> Uuid {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"mneme-schedule\0");
    hasher.update(schedule.as_bytes());
    hasher.update(tick_ms.to_be_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hasher.finalize()[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// Whether a stream whose last record is of `kind` is a schedule (its
/// records are all of the schedule kinds, a session's never are).
pub fn is_schedule_kind(kind: &str) -> bool {
    matches!(
        kind,
        "ScheduleCreated" | "ScheduleFired" | "ScheduleSkipped" | "ScheduleRemoved"
    )
}

/// The last firing of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Firing {
    /// The tick it was for (milliseconds since the Unix epoch).
    pub tick_ms: i64,
    /// The session it started or messaged.
    pub session: Uuid,
}

/// A schedule's state: a fold of its log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScheduleState {
    /// What it does (none before its creation).
    pub spec: Option<ScheduleSpec>,
    /// The seq of its last record.
    pub last_seq: u64,
    /// The newest tick fired or skipped (ticks after it are still to come).
    pub handled_ms: i64,
    /// Ticks fired.
    pub fired: u64,
    /// Ticks skipped.
    pub skipped: u64,
    /// The last firing.
    pub last: Option<Firing>,
    /// Who removed it, once removed: it fires no more.
    pub removed: Option<String>,
}

impl ScheduleState {
    /// The state `events` (in seq order, with their seqs) give.
    pub fn fold(events: impl IntoIterator<Item = (u64, Event)>) -> ScheduleState {
        let mut state = ScheduleState::default();
        for (seq, event) in events {
            state.apply(seq, &event);
        }
        state
    }

    /// Applies one event at `seq`; events of sessions are ignored.
    pub fn apply(&mut self, seq: u64, event: &Event) {
        self.last_seq = seq;
        match event {
            Event::ScheduleCreated { schedule } => {
                self.handled_ms = schedule.from_ms;
                self.spec = Some((**schedule).clone());
            }
            Event::ScheduleFired { tick_ms, session } => {
                self.handled_ms = self.handled_ms.max(*tick_ms);
                self.fired += 1;
                self.last = Some(Firing {
                    tick_ms: *tick_ms,
                    session: *session,
                });
            }
            Event::ScheduleSkipped { to_ms, ticks, .. } => {
                self.handled_ms = self.handled_ms.max(*to_ms);
                self.skipped += ticks;
            }
            Event::ScheduleRemoved { by } => self.removed = Some(by.clone()),
            _ => {}
        }
    }

    /// The next tick to come after those handled, while it is not removed.
    pub fn next_ms(&self) -> Option<i64> {
        let spec = self.spec.as_ref().filter(|_| self.removed.is_none())?;
        spec.next_tick(self.handled_ms)
    }

    /// The session whose turn decides an overlap: the target session, or
    /// the one the last firing started. None: nothing can overlap.
    pub fn overlaps_with(&self) -> Option<Uuid> {
        match self.spec.as_ref()?.into {
            Target::Session(id) => Some(id),
            Target::New => self.last.map(|f| f.session),
        }
    }

    /// What schedule `id` records at `now_ms` (to append after this state;
    /// empty: nothing), given whether the turn [`ScheduleState::overlaps_with`]
    /// names has not ended (`busy`): the ticks `catch_up` leaves as one
    /// `ScheduleSkipped` (missed), then the oldest tick that fires as
    /// `ScheduleFired`, or, while `busy`, the ticks that would have fired
    /// as skipped (overlap) or nothing (they wait, with `overlap = queue`).
    pub fn decide(&self, id: Uuid, now_ms: i64, busy: bool) -> Vec<Event> {
        let Some(spec) = self.spec.as_ref().filter(|_| self.removed.is_none()) else {
            return Vec::new();
        };
        let due = spec.ticks(self.handled_ms, now_ms, MAX_TICKS_AT_ONCE);
        let Some(&newest) = due.last() else {
            return Vec::new();
        };
        // More ticks than one decision looks at: the newest is still to come.
        let more =
            due.len() == MAX_TICKS_AT_ONCE && spec.next_tick(newest).is_some_and(|t| t <= now_ms);
        let firing_from = match spec.catch_up {
            CatchUp::All => 0,
            _ if more => due.len(),
            CatchUp::One => due.len() - 1,
            CatchUp::None if now_ms - newest <= ON_TIME_MS => due.len() - 1,
            CatchUp::None => due.len(),
        };
        let (missed, candidates) = due.split_at(firing_from);
        let mut out = Vec::new();
        out.extend(skipped(missed, SkipReason::Missed));
        let Some(&tick_ms) = candidates.first() else {
            return out;
        };
        match (busy, spec.overlap) {
            (false, _) => out.push(Event::ScheduleFired {
                tick_ms,
                session: match spec.into {
                    Target::New => scheduled_session_id(id, tick_ms),
                    Target::Session(session) => session,
                },
            }),
            (true, Overlap::Skip) => out.extend(skipped(candidates, SkipReason::Overlap)),
            (true, Overlap::Queue) => {}
        }
        out
    }
}

/// One `ScheduleSkipped` for `ticks` (oldest first), none for no ticks.
fn skipped(ticks: &[i64], reason: SkipReason) -> Option<Event> {
    Some(Event::ScheduleSkipped {
        from_ms: *ticks.first()?,
        to_ms: *ticks.last()?,
        ticks: ticks.len() as u64,
        reason,
    })
}

/// The start of the schedule a session was started or messaged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledBy {
    /// The schedule.
    pub schedule: Uuid,
    /// The tick its firing was for (milliseconds since the Unix epoch).
    pub tick_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every(seconds: u64, catch_up: CatchUp, overlap: Overlap) -> ScheduleState {
        let spec = ScheduleSpec {
            agent: None,
            spec: None,
            when: When::Every { seconds },
            message: "go".into(),
            into: Target::Session(Uuid::from_u128(7)),
            overlap,
            catch_up,
            from_ms: 0,
            tenant: None,
        };
        ScheduleState::fold([(
            1,
            Event::ScheduleCreated {
                schedule: Box::new(spec),
            },
        )])
    }

    fn kinds(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::ScheduleFired { tick_ms, .. } => format!("fired {tick_ms}"),
                Event::ScheduleSkipped {
                    from_ms,
                    to_ms,
                    ticks,
                    reason,
                } => format!("{reason} {from_ms}..{to_ms} ({ticks})"),
                other => other.kind().to_string(),
            })
            .collect()
    }

    #[test]
    fn nothing_before_the_first_tick_then_that_tick_fires_once() {
        let state = every(2, CatchUp::One, Overlap::Skip);
        let id = Uuid::from_u128(1);
        assert!(state.decide(id, 1999, false).is_empty());
        let fired = state.decide(id, 2000, false);
        assert_eq!(kinds(&fired), ["fired 2000"]);
        let mut after = state.clone();
        after.apply(2, &fired[0]);
        assert!(
            after.decide(id, 3999, false).is_empty(),
            "the tick is handled"
        );
        assert_eq!(after.next_ms(), Some(4000));
    }

    #[test]
    fn catch_up_decides_which_missed_ticks_fire_and_records_the_rest() {
        let id = Uuid::from_u128(1);
        let now = 10_500; // ticks 2000, 4000, 6000, 8000, 10000 are due
        let one = every(2, CatchUp::One, Overlap::Skip).decide(id, now, false);
        assert_eq!(kinds(&one), ["missed 2000..8000 (4)", "fired 10000"]);
        let all = every(2, CatchUp::All, Overlap::Skip).decide(id, now, false);
        assert_eq!(kinds(&all), ["fired 2000"], "oldest first, one at a time");
        let none = every(2, CatchUp::None, Overlap::Skip).decide(id, now, false);
        assert_eq!(
            kinds(&none),
            ["missed 2000..8000 (4)", "fired 10000"],
            "on time"
        );
        // Ticks each minute; the newest came 20 s ago: late, so missed.
        let late = every(60, CatchUp::None, Overlap::Skip).decide(id, 200_000, false);
        assert_eq!(kinds(&late), ["missed 60000..180000 (3)"]);
    }

    #[test]
    fn overlap_skips_or_waits_while_the_previous_turn_runs() {
        let id = Uuid::from_u128(1);
        let skip = every(2, CatchUp::All, Overlap::Skip).decide(id, 4500, true);
        assert_eq!(kinds(&skip), ["overlap 2000..4000 (2)"]);
        let queue = every(2, CatchUp::One, Overlap::Queue).decide(id, 4500, true);
        assert_eq!(kinds(&queue), ["missed 2000..2000 (1)"], "the newest waits");
        let free = every(2, CatchUp::One, Overlap::Queue).decide(id, 4500, false);
        assert_eq!(kinds(&free), ["missed 2000..2000 (1)", "fired 4000"]);
    }

    #[test]
    fn a_long_downtime_is_recorded_in_bounded_runs() {
        let id = Uuid::from_u128(1);
        let mut state = every(1, CatchUp::One, Overlap::Skip);
        let now = 5_000_000; // 5,000 ticks due
        let mut decisions = 0;
        loop {
            let events = state.decide(id, now, false);
            decisions += 1;
            let fired = events
                .iter()
                .any(|e| matches!(e, Event::ScheduleFired { .. }));
            for event in &events {
                state.apply(state.last_seq + 1, event);
            }
            if fired {
                break;
            }
        }
        assert_eq!(
            decisions, 5,
            "four runs of 1000 missed, then 999 and the newest"
        );
        assert_eq!((state.skipped, state.fired), (4999, 1));
        assert_eq!(state.last.unwrap().tick_ms, now);
    }

    #[test]
    fn a_removed_schedule_decides_nothing() {
        let mut state = every(2, CatchUp::All, Overlap::Skip);
        state.apply(2, &Event::ScheduleRemoved { by: "ada".into() });
        assert!(state.decide(Uuid::from_u128(1), 10_000, false).is_empty());
        assert_eq!(state.next_ms(), None);
    }

    #[test]
    fn cron_ticks_read_in_the_zone_given() {
        let mut spec = every(2, CatchUp::One, Overlap::Skip).spec.unwrap();
        spec.when = When::Cron {
            expr: "0 9 * * *".into(),
            timezone: "+02:00".into(),
        };
        assert_eq!(spec.validate(), Ok(()));
        // 09:00 at +02:00 is 07:00 UTC.
        assert_eq!(spec.next_tick(0), Some(7 * 3600 * 1000));
        let seconds = When::Cron {
            expr: "*/5 * * * * *".into(),
            timezone: "UTC".into(),
        };
        spec.when = seconds;
        assert_eq!(spec.ticks(0, 12_000, 10), [5000, 10_000]);
        spec.when = When::Cron {
            expr: "0 9 * * *".into(),
            timezone: "Europe/Paris".into(),
        };
        assert!(spec.validate().unwrap_err().contains("Europe/Paris"));
        spec.when = When::Cron {
            expr: "61 * * * *".into(),
            timezone: "UTC".into(),
        };
        assert!(spec.validate().unwrap_err().contains("61 * * * *"));
    }

    #[test]
    fn a_tick_names_one_session_for_every_process() {
        let id = Uuid::from_u128(1);
        let a = scheduled_session_id(id, 2000);
        assert_eq!(a, scheduled_session_id(id, 2000));
        assert_ne!(a, scheduled_session_id(id, 4000));
        assert_ne!(a, scheduled_session_id(Uuid::from_u128(2), 2000));
    }
}
