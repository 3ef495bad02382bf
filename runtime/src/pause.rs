//! Pauses asked for across processes that share a store. A request is kept
//! by the store with the session's lease ([`eventlog::Leases::request_pause`]),
//! naming the holding of the lease the turn runs under; the process running
//! that turn (a daemon or the CLI) looks for it between steps, at most once
//! a second. A request names one holding of the lease, so one left over
//! never pauses a later turn. It is not derived data: nothing rebuilds it.

use eventlog::{EventLog, LogError};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Why a turn paused at a person's request.
pub const PAUSED_ON_REQUEST: &str = "paused on request";

/// How the reason of a turn's own pause for calls that wait for a person
/// (an approval, a call in doubt) begins; the calls' ids follow.
pub(crate) const WAITING_FOR_A_PERSON: &str = "tool calls wait for a person";

/// Whether the session is paused for another reason than its calls
/// waiting for a person (a person's pause, a spent budget): a decision on
/// the last waiting call, or its approval expiring, must not lift it.
pub(crate) fn paused_otherwise(state: &replay::SessionState) -> bool {
    (state.paused.as_deref()).is_some_and(|reason| !reason.starts_with(WAITING_FOR_A_PERSON))
}

/// How often a turn looks in the store for a pause request.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Asks the turn running session `id` under a live lease, wherever it runs,
/// to pause. Returns that lease's owner, or `None` if no turn runs.
pub async fn ask(log: &dyn EventLog, id: Uuid) -> Result<Option<String>, LogError> {
    Ok(log
        .leases()
        .request_pause(id)
        .await?
        .map(|lease| lease.owner))
}

/// The turns of this process that listen for pause requests, each by the
/// token of the lease it runs under.
#[derive(Default)]
pub struct Listening {
    turns: Mutex<HashMap<Uuid, Turn>>,
}

struct Turn {
    token: u64,
    looked: Instant,
}

impl Listening {
    /// From now on, the turn of `id` under the lease `token` hears requests.
    pub fn start(&self, id: Uuid, token: u64) {
        let turn = Turn {
            token,
            looked: Instant::now(),
        };
        self.turns.lock().expect("pause lock").insert(id, turn);
    }

    /// The turn of `id` has ended.
    pub fn stop(&self, id: Uuid) {
        self.turns.lock().expect("pause lock").remove(&id);
    }

    /// Whether a turn of `id` listens here now.
    pub fn has(&self, id: Uuid) -> bool {
        self.turns.lock().expect("pause lock").contains_key(&id)
    }

    /// Whether a pause was asked for the listening turn of `id`; looks in
    /// `log` at most once a second. A request heard is cleared.
    pub async fn asked(&self, log: &dyn EventLog, id: Uuid) -> bool {
        let token = {
            let mut turns = self.turns.lock().expect("pause lock");
            let Some(turn) = turns.get_mut(&id) else {
                return false;
            };
            if turn.looked.elapsed() < LOOK_EVERY {
                return false;
            }
            turn.looked = Instant::now();
            turn.token
        };
        log.leases()
            .take_pause_request(id, token)
            .await
            .unwrap_or(false)
    }
}
