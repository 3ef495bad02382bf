//! Messages posted while a turn of a session runs ("double texting"),
//! handed to that turn.
//!
//! A process that runs turns (the daemon) opens a session's inbox when a
//! turn of it starts and closes it when the turn ends. A message posted
//! while the inbox is open goes to the running turn, which records it at
//! once (`MidTurnMessage`, durable before the poster hears back), whatever
//! it is doing: waiting for the model, or for tools. The agent's
//! `mid_turn_messages` then decides when it enters the conversation (see
//! [`replay::spec::MidTurn`]). A message posted while no inbox is open
//! starts a turn of its own, as always.

use replay::spec::MidTurn;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, Notify};
use uuid::Uuid;

/// The open inboxes of the sessions whose turns run in this process.
#[derive(Default)]
pub struct Inboxes {
    open: Mutex<HashMap<Uuid, Arc<Inbox>>>,
}

#[derive(Default)]
struct Inbox {
    waiting: Mutex<Vec<Incoming>>,
    arrived: Notify,
}

/// A message for a running turn, and where to tell its poster the outcome.
pub struct Incoming {
    /// What was said.
    pub text: String,
    answer: oneshot::Sender<Result<Accepted, Refused>>,
}

/// Why a running turn did not record a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The message itself cannot be taken (too long for the model's
    /// context window), or recording it failed.
    #[error("{0}")]
    Invalid(String),
    /// Too many messages wait already (`max_waiting_messages`).
    #[error("{0}")]
    Full(String),
}

/// A message a running turn recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The seq of its `MidTurnMessage`.
    pub seq: u64,
    /// What the agent does with it.
    pub policy: MidTurn,
}

/// What a poster waits on: the recorded message, or why it was not
/// recorded.
pub type Answer = oneshot::Receiver<Result<Accepted, Refused>>;

impl Incoming {
    /// Tells the poster how it went.
    pub fn answer(self, outcome: Result<Accepted, Refused>) {
        let _ = self.answer.send(outcome);
    }
}

impl Inboxes {
    /// Opens the inbox of `id`, whose turn starts here.
    pub fn open(&self, id: Uuid) {
        self.lock().insert(id, Arc::default());
    }

    /// Hands `text` to the running turn of `id`; gives it back when no turn
    /// of `id` runs in this process.
    pub fn post(&self, id: Uuid, text: String) -> Result<Answer, String> {
        let open = self.lock();
        let Some(inbox) = open.get(&id) else {
            return Err(text);
        };
        let (answer, answered) = oneshot::channel();
        inbox
            .waiting
            .lock()
            .expect("inbox lock poisoned")
            .push(Incoming { text, answer });
        inbox.arrived.notify_one();
        Ok(answered)
    }

    /// Takes the messages waiting for the running turn of `id`.
    pub fn take(&self, id: Uuid) -> Vec<Incoming> {
        match self.lock().get(&id) {
            Some(inbox) => std::mem::take(&mut *inbox.waiting.lock().expect("inbox lock poisoned")),
            None => Vec::new(),
        }
    }

    /// Resolves once a message may wait for `id` (never, while its inbox
    /// is closed).
    pub async fn arrived(&self, id: Uuid) {
        let inbox = self.lock().get(&id).cloned();
        match inbox {
            Some(inbox) => inbox.arrived.notified().await,
            None => std::future::pending().await,
        }
    }

    /// Closes the inbox of `id` if nothing waits in it (then later posts
    /// start turns of their own); false, leaving it open, if something does.
    pub fn close_if_empty(&self, id: Uuid) -> bool {
        let mut open = self.lock();
        let empty = open.get(&id).is_none_or(|inbox| {
            inbox
                .waiting
                .lock()
                .expect("inbox lock poisoned")
                .is_empty()
        });
        if empty {
            open.remove(&id);
        }
        empty
    }

    /// Closes the inbox of `id`, telling whoever still waits in it why.
    pub fn close(&self, id: Uuid, why: &str) {
        let Some(inbox) = self.lock().remove(&id) else {
            return;
        };
        let left = std::mem::take(&mut *inbox.waiting.lock().expect("inbox lock poisoned"));
        for incoming in left {
            incoming.answer(Err(Refused::Invalid(why.to_string())));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<Inbox>>> {
        self.open.lock().expect("inboxes lock poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_post_reaches_an_open_inbox_only_and_wakes_its_turn() {
        let inboxes = Inboxes::default();
        let id = Uuid::now_v7();
        assert_eq!(inboxes.post(id, "early".into()).unwrap_err(), "early");
        inboxes.open(id);
        let answered = inboxes.post(id, "hello".into()).unwrap();
        // The notification is kept for a turn that looks later.
        inboxes.arrived(id).await;
        assert!(!inboxes.close_if_empty(id), "a message waits");
        let taken = inboxes.take(id);
        assert_eq!(taken.len(), 1);
        let accepted = Accepted {
            seq: 7,
            policy: MidTurn::Queue,
        };
        taken.into_iter().for_each(|m| m.answer(Ok(accepted)));
        assert_eq!(answered.await.unwrap(), Ok(accepted));
        assert!(inboxes.close_if_empty(id));
        assert!(inboxes.post(id, "late".into()).is_err());
    }

    #[tokio::test]
    async fn closing_tells_the_posters_left_why() {
        let inboxes = Inboxes::default();
        let id = Uuid::now_v7();
        inboxes.open(id);
        let answered = inboxes.post(id, "hello".into()).unwrap();
        inboxes.close(id, "the turn failed");
        let why = Refused::Invalid("the turn failed".into());
        assert_eq!(answered.await.unwrap(), Err(why));
    }
}
