//! What the daemon last saw of each session: its status (what the metrics
//! count), and the earliest time something of it falls due on its own (an
//! approval's deadline, a sleeping call's wake: what the expiry loop looks
//! at).

use replay::{SessionState, Status};
use runtime::store::Summary;
use std::collections::HashMap;
use std::sync::Mutex;
use uuid::Uuid;

/// Each session's status and next deadline, as last seen.
#[derive(Default)]
pub(crate) struct Statuses {
    statuses: Mutex<HashMap<Uuid, Status>>,
    /// Milliseconds since the Unix epoch.
    deadlines: Mutex<HashMap<Uuid, i64>>,
}

impl Statuses {
    /// Notes `id` as `state` has it.
    pub(crate) fn saw(&self, id: Uuid, state: &SessionState) {
        self.set(id, Some(state.status()), state.next_deadline_ms());
    }

    /// Notes `id` as its stored `summary` has it.
    pub(crate) fn saw_summary(&self, id: Uuid, summary: &Summary) {
        self.set(id, summary.status.parse().ok(), summary.next_deadline_ms());
    }

    fn set(&self, id: Uuid, status: Option<Status>, deadline: Option<i64>) {
        if let Some(status) = status {
            self.statuses.lock().expect("statuses").insert(id, status);
        }
        self.set_deadline(id, deadline);
    }

    fn set_deadline(&self, id: Uuid, at: Option<i64>) {
        let mut deadlines = self.deadlines.lock().expect("deadlines");
        match at {
            Some(at) => deadlines.insert(id, at),
            None => deadlines.remove(&id),
        };
    }

    /// Sessions by status, as last seen.
    pub(crate) fn counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for status in self.statuses.lock().expect("statuses").values() {
            *counts.entry(status.to_string()).or_default() += 1;
        }
        counts
    }

    /// The sessions whose deadline is at or before `now_ms`.
    pub(crate) fn due(&self, now_ms: i64) -> Vec<Uuid> {
        (self.deadlines.lock().expect("deadlines").iter())
            .filter(|(_, at)| **at <= now_ms)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Forgets `id`'s deadline (the turn that expires its approvals notes
    /// it again if something still waits).
    pub(crate) fn forget_deadline(&self, id: Uuid) {
        self.set_deadline(id, None);
    }

    /// Every deadline, as read from the store (other daemons' too).
    pub(crate) fn read_deadlines(&self, read: impl Iterator<Item = (Uuid, i64)>) {
        *self.deadlines.lock().expect("deadlines") = read.collect();
    }
}
