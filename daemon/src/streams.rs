//! The text of replies as they stream, for `/sessions/{id}/deltas`: each
//! session's reply so far, as clients are shown it (redacted, whole
//! characters), so a client opened mid-reply gets the text so far and one
//! that reconnects with `Last-Event-ID: SEQ:OFFSET` gets the rest, with no
//! gap and no repeat. Derived data, in memory only, never in the chain:
//! once a reply is recorded its record is the truth, and the text kept
//! here is dropped.

use eventlog::Record;
use replay::Event;
use runtime::text::StreamText;
use runtime::SessionObserver;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;
use uuid::Uuid;

/// Streamed pieces kept for slow readers; one further behind is told how
/// many it missed.
const PIECES_BUFFERED: usize = 1024;

/// One piece of a streamed reply, as clients are shown it.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    /// The session.
    pub(crate) session: Uuid,
    /// The seq its reply is expected at (see [`runtime::DeltaSink`]).
    pub(crate) seq: u64,
    /// Where the piece starts in the reply's shown text, in bytes.
    pub(crate) offset: usize,
    /// The text.
    pub(crate) text: Arc<str>,
}

impl Piece {
    /// Where the piece ends in its reply's shown text: the `OFFSET` of the
    /// event id `SEQ:OFFSET` that names everything up to it.
    pub(crate) fn end(&self) -> usize {
        self.offset + self.text.len()
    }
}

/// A reply streaming (or streamed, not yet recorded).
struct Open {
    seq: u64,
    shown: String,
    text: StreamText,
}

/// Every session's reply as it streams.
pub(crate) struct Streams {
    sender: broadcast::Sender<Piece>,
    open: Mutex<HashMap<Uuid, Open>>,
}

impl Streams {
    pub(crate) fn new() -> Streams {
        Streams {
            sender: broadcast::channel(PIECES_BUFFERED).0,
            open: Mutex::default(),
        }
    }

    /// Takes `piece` of the reply of session `id` expected at `seq` (an
    /// empty piece ends it: the text held back is shown) and tells every
    /// subscriber.
    pub(crate) fn publish(&self, id: Uuid, seq: u64, piece: &str) {
        let mut open = self.open.lock().expect("streams");
        let reply = open.entry(id).or_insert_with(|| Open::new(seq));
        if reply.seq != seq {
            *reply = Open::new(seq);
        }
        let shown = match piece.is_empty() {
            true => reply.text.finish(),
            false => reply.text.push(piece),
        };
        if shown.is_empty() {
            return;
        }
        let offset = reply.shown.len();
        reply.shown.push_str(&shown);
        // Sent under the lock: a subscriber gets each piece either in the
        // text so far or from its receiver, never both, never neither.
        let _ = self.sender.send(Piece {
            session: id,
            seq,
            offset,
            text: shown.into(),
        });
    }

    /// The pieces published from now on, and the reply of `id` streaming
    /// now (its seq and text so far), if one is.
    pub(crate) fn subscribe(
        &self,
        id: Uuid,
    ) -> (broadcast::Receiver<Piece>, Option<(u64, String)>) {
        let open = self.open.lock().expect("streams");
        let so_far = open.get(&id).map(|reply| (reply.seq, reply.shown.clone()));
        (self.sender.subscribe(), so_far)
    }
}

impl Open {
    fn new(seq: u64) -> Open {
        Open {
            seq,
            shown: String::new(),
            text: StreamText::for_json(),
        }
    }
}

impl SessionObserver for Streams {
    /// A recorded reply is the truth from now on: its streamed text goes;
    /// so does the text of a reply that will never be recorded (its turn
    /// failed, or was cancelled).
    fn appended(&self, records: &[Record], events: &[Event]) {
        let mut open = self.open.lock().expect("streams");
        for (record, event) in records.iter().zip(events) {
            let (session, seq) = (record.envelope.session, record.envelope.seq);
            let over = match event {
                Event::ModelReplied(_) => open.get(&session).is_some_and(|reply| reply.seq <= seq),
                Event::SessionFinished { .. } => true,
                _ => false,
            };
            if over {
                open.remove(&session);
            }
        }
    }

    fn durable(&self, _session: Uuid, _seq: u64, _took: Duration) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_subscriber_gets_the_text_so_far_and_then_only_what_follows() {
        let streams = Streams::new();
        let id = Uuid::nil();
        streams.publish(id, 7, "First words, ");
        streams.publish(id, 7, "then");
        let (mut receiver, so_far) = streams.subscribe(id);
        let (seq, text) = so_far.expect("a reply streams");
        assert_eq!(seq, 7);
        streams.publish(id, 7, " the rest.");
        streams.publish(id, 7, "");
        let mut whole = text.clone();
        while let Ok(piece) = receiver.try_recv() {
            assert_eq!(piece.offset, whole.len(), "no gap, no repeat");
            whole.push_str(&piece.text);
        }
        assert_eq!(whole, "First words, then the rest.");
        streams.publish(id, 9, "Next reply");
        let (_, so_far) = streams.subscribe(id);
        assert_eq!(
            so_far.map(|(seq, _)| seq),
            Some(9),
            "a new reply starts again"
        );
    }

    /// A record of `event` at `seq` of session `id`.
    fn record(id: Uuid, seq: u64, event: &Event) -> Record {
        let envelope = eventlog::Envelope {
            session: id,
            seq,
            event_id: Uuid::nil(),
            ts_ms: 0,
            caused_by: None,
            schema: 1,
            kind: event.kind().into(),
            prev_hash: eventlog::Hash::ZERO,
            payload: event.encode(),
            base: None,
        };
        Record::seal(envelope).unwrap().0
    }

    #[test]
    fn a_reply_is_forgotten_once_recorded_or_once_its_turn_ends_without_it() {
        let streams = Streams::new();
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        streams.publish(a, 3, "a reply long enough to be shown in part");
        streams.publish(b, 5, "another reply long enough to be shown");
        let replied = Event::ModelReplied(replay::ModelReply::default());
        let earlier = [record(a, 2, &replied)];
        streams.appended(&earlier, std::slice::from_ref(&replied));
        assert!(
            streams.subscribe(a).1.is_some(),
            "an earlier reply is not this one"
        );
        streams.appended(&[record(a, 3, &replied)], std::slice::from_ref(&replied));
        assert!(
            streams.subscribe(a).1.is_none(),
            "recorded: the record is the truth"
        );
        let failed = Event::SessionFinished {
            outcome: replay::SessionOutcome::Failed("the server went away".into()),
        };
        streams.appended(&[record(b, 5, &failed)], std::slice::from_ref(&failed));
        assert!(
            streams.subscribe(b).1.is_none(),
            "never to be recorded: gone"
        );
    }
}
