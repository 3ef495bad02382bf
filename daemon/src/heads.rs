//! What live event streams know of durability: each session's durable
//! head, as the barriers of this daemon's turns made it, and as other
//! daemons sharing the store announce theirs.

use eventlog::Record;
use replay::Event;
use runtime::SessionObserver;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;
use uuid::Uuid;

/// Announcements kept for slow live streams; one further behind reads the
/// head again.
const HEADS_BUFFERED: usize = 4096;

/// Publishes (session, seq) each time a session's records up to seq are
/// durable, only after the barrier that made them so.
pub(crate) struct DurableHeads {
    announced: broadcast::Sender<(Uuid, u64)>,
    /// The last seq made durable in this process, by session.
    made_here: Mutex<HashMap<Uuid, u64>>,
}

impl DurableHeads {
    pub(crate) fn new() -> DurableHeads {
        DurableHeads {
            announced: broadcast::channel(HEADS_BUFFERED).0,
            made_here: Mutex::default(),
        }
    }

    /// Every durable head announced from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<(Uuid, u64)> {
        self.announced.subscribe()
    }

    /// Tells live streams that `session` is durable up to `seq` (another
    /// daemon appended and committed it).
    pub(crate) fn announce(&self, session: Uuid, seq: u64) {
        // Nobody listening is fine.
        let _ = self.announced.send((session, seq));
    }

    /// The last seq of `session` a barrier in this process made durable;
    /// `None` if no turn ran here (then every record is durable: opening the
    /// log checkpointed it).
    pub(crate) fn made_here(&self, session: Uuid) -> Option<u64> {
        self.made_here.lock().expect("heads").get(&session).copied()
    }
}

impl SessionObserver for DurableHeads {
    fn appended(&self, _records: &[Record], _events: &[Event]) {}

    fn durable(&self, session: Uuid, seq: u64, _took: Duration) {
        self.made_here.lock().expect("heads").insert(session, seq);
        self.announce(session, seq);
    }
}

/// Tells each of several observers, in order.
pub(crate) struct Observers(pub(crate) Vec<Arc<dyn SessionObserver>>);

impl SessionObserver for Observers {
    fn appended(&self, records: &[Record], events: &[Event]) {
        for observer in &self.0 {
            observer.appended(records, events);
        }
    }

    fn appended_to(&self, before: &replay::SessionState, records: &[Record], events: &[Event]) {
        for observer in &self.0 {
            observer.appended_to(before, records, events);
        }
    }

    fn durable(&self, session: Uuid, seq: u64, took: Duration) {
        for observer in &self.0 {
            observer.durable(session, seq, took);
        }
    }
}
