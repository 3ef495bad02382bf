//! The text of a session's streamed replies as it arrives, resumable: each
//! frame's id names how far into which reply it reaches.

use super::*;
use crate::streams::Piece;
use futures_util::StreamExt;
use tokio::sync::broadcast::error::RecvError;

/// Records read after a `Last-Event-ID`'s seq for the reply it names
/// (messages posted while the reply streamed come before it).
const REPLY_SEARCH: u64 = 64;

/// The text of the session's streamed replies as it arrives, as
/// Server-Sent Events (`delta` events of `{"text": ...}`), until the client
/// or the daemon goes. Each frame's `id` is `SEQ:OFFSET`: the seq its
/// reply is expected at (the session's head when the request went out,
/// plus one) and how many bytes of the reply's text it reaches. A client
/// opened mid-reply gets the text so far first; one reconnecting with
/// `Last-Event-ID` gets the rest of that reply from that offset (from its
/// record, once it is recorded), with no gap and no repeat. A reader too
/// slow for the pieces kept gets a `lagged` event naming how many it
/// missed. Nothing here is recorded: the whole reply is, in `/events`.
#[utoipa::path(get, path = "/sessions/{id}/deltas", params(SessionPath),
    responses((status = 200,
        description = "Server-Sent Events: `delta` events of `{\"text\": ...}` with ids `SEQ:OFFSET`, `lagged` events of `{\"missed\": N}`",
        body = String, content_type = "text/event-stream")))]
pub(super) async fn deltas(
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let daemon = state.daemon.clone();
    daemon.service.ensure_exists(id).await?;
    let last = (headers.get("last-event-id"))
        .and_then(|v| v.to_str().ok())
        .and_then(position);
    let (receiver, so_far) = daemon.streams.subscribe(id);
    let mut first = Vec::new();
    if let Some((seq, offset)) =
        last.filter(|(seq, _)| so_far.as_ref().is_none_or(|(now, _)| now != seq))
    {
        // The reply it followed is recorded by now (or never will be).
        if let Some((seq, text)) = recorded_reply(&daemon, id, seq).await? {
            first.push(delta(seq, text.len(), rest(&text, offset)));
        }
    }
    let mut reached = None;
    if let Some((seq, text)) = so_far {
        let from = last
            .filter(|(at, _)| *at == seq)
            .map_or(0, |(_, offset)| offset);
        first.push(delta(seq, text.len(), rest(&text, from)));
        reached = Some((seq, text.len()));
    }
    let first = first
        .into_iter()
        .flatten()
        .map(Ok::<_, std::convert::Infallible>);
    let live = futures_util::stream::unfold(
        (receiver, reached, state.stopped.clone()),
        move |(mut receiver, mut reached, stopped)| async move {
            loop {
                let next = tokio::select! {
                    next = receiver.recv() => next,
                    () = stopped.cancelled() => return None,
                };
                let event = match next {
                    Ok(piece) if piece.session == id => {
                        let Some(event) = unseen(&piece, reached) else {
                            continue;
                        };
                        reached = Some((piece.seq, piece.end()));
                        event
                    }
                    Ok(_) => continue,
                    Err(RecvError::Lagged(missed)) => SseEvent::default()
                        .event("lagged")
                        .data(json!({ "missed": missed }).to_string()),
                    Err(RecvError::Closed) => return None,
                };
                return Some((Ok(event), (receiver, reached, stopped)));
            }
        },
    );
    let stream = futures_util::stream::iter(first).chain(live);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// `SEQ:OFFSET`, as a frame's id names a position in a reply.
fn position(id: &str) -> Option<(u64, usize)> {
    let (seq, offset) = id.trim().split_once(':')?;
    Some((seq.parse().ok()?, offset.parse().ok()?))
}

/// `text` from byte `offset` (or the next character boundary after it).
fn rest(text: &str, offset: usize) -> &str {
    let from = (offset..=text.len())
        .find(|&at| text.is_char_boundary(at))
        .unwrap_or(text.len());
    &text[from..]
}

/// A `delta` frame of `text`, reaching `end` bytes into reply `seq`;
/// nothing for no text.
fn delta(seq: u64, end: usize, text: &str) -> Option<SseEvent> {
    (!text.is_empty()).then(|| {
        SseEvent::default()
            .event("delta")
            .id(format!("{seq}:{end}"))
            .data(json!({ "text": text }).to_string())
    })
}

/// The frame for `piece`, less what the client has `reached` of its reply.
fn unseen(piece: &Piece, reached: Option<(u64, usize)>) -> Option<SseEvent> {
    let from = match reached {
        Some((seq, end)) if seq == piece.seq => end.saturating_sub(piece.offset),
        _ => 0,
    };
    delta(piece.seq, piece.end(), rest(&piece.text, from))
}

/// The recorded reply of session `id` that was expected at `seq`: the first
/// at or after it, with its text.
async fn recorded_reply(
    daemon: &Daemon,
    id: Uuid,
    seq: u64,
) -> Result<Option<(u64, String)>, ApiError> {
    let log = daemon.service.log();
    for record in log
        .read_bounded(id, seq, seq + REPLY_SEARCH, 16 << 20)
        .await?
    {
        if let replay::Event::ModelReplied(reply) = runtime::store::decode(&record)? {
            return Ok(Some((
                record.envelope.seq,
                reply.content.unwrap_or_default(),
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_names_a_seq_and_an_offset_and_the_rest_starts_on_a_character() {
        assert_eq!(position("12:340"), Some((12, 340)));
        for bad in ["12", "x:1", "1:-2", ""] {
            assert_eq!(position(bad), None, "{bad}");
        }
        assert_eq!(rest("héllo", 2), "llo", "the é's second byte is skipped");
        assert_eq!(rest("abc", 9), "");
    }
}
