//! Two sessions compared (a session and its fork, say): where their
//! histories hold the same events, where they part, and what differs after:
//! each side's events, answer, tool calls, tokens and cost. What `mneme
//! diff` prints and the daemon's `/sessions/{a}/diff/{b}` answers.

use crate::api::{DiffEvent, DiffSide, SessionDiff};
use crate::describe::summary;
use crate::error::RuntimeError;
use crate::session::read_events;
use eventlog::EventLog;
use replay::{Event, SessionState};
use uuid::Uuid;

/// One session's events in log order, with their seqs.
pub(crate) type Events = [(u64, Event)];

/// Sessions `a` and `b` of `log`, compared.
pub async fn sessions(log: &dyn EventLog, a: Uuid, b: Uuid) -> Result<SessionDiff, RuntimeError> {
    let read = |id| async move {
        let events = read_events(log, id).await?;
        Ok::<_, RuntimeError>(
            events
                .into_iter()
                .map(|(record, event)| (record.envelope.seq, event))
                .collect::<Vec<_>>(),
        )
    };
    let (left, right) = (read(a).await?, read(b).await?);
    Ok(diff((a, &left), (b, &right)))
}

/// The events that make up a session's history: a fork's own first event
/// (naming its parent: first in a copy, right after the history it
/// shares) is left out, so a fork lines up with its parent.
fn history(events: &Events) -> impl Iterator<Item = &(u64, Event)> {
    let copied = matches!(events.first(), Some((_, Event::SessionForked { .. })));
    (events.iter().skip(usize::from(copied)))
        .filter(|(_, e)| !matches!(e, Event::SessionForked { shared: true, .. }))
}

/// How many history events the two sessions hold alike, from the first.
pub(crate) fn common_prefix(a: &Events, b: &Events) -> usize {
    history(a)
        .zip(history(b))
        .take_while(|((_, x), (_, y))| x == y)
        .count()
}

/// One side of a diff: the session, its events after the common prefix,
/// its answer, its tool calls after the prefix, tokens and cost.
fn side(id: Uuid, events: &Events, common: usize) -> DiffSide {
    let state = SessionState::fold(events.iter().cloned());
    let after: Vec<&(u64, Event)> = history(events).skip(common).collect();
    let tool_calls = after
        .iter()
        .filter_map(|(_, e)| match e {
            Event::ToolStarted { tool, args, .. } => Some(format!("{tool} {args}")),
            _ => None,
        })
        .collect();
    DiffSide {
        session: id,
        events: events.len() as u64,
        diverges_at_seq: after.first().map(|(seq, _)| *seq),
        after: after
            .iter()
            .map(|(seq, e)| DiffEvent {
                seq: *seq,
                kind: e.kind().to_string(),
                summary: summary(e),
            })
            .collect(),
        answer: state.answer().map(str::to_string),
        tool_calls,
        prompt_tokens: state.totals.prompt_tokens,
        completion_tokens: state.totals.completion_tokens,
        cost: state.totals.cost,
    }
}

/// Sessions `a` and `b`, given their events, compared.
pub(crate) fn diff(a: (Uuid, &Events), b: (Uuid, &Events)) -> SessionDiff {
    let common = common_prefix(a.1, b.1);
    SessionDiff {
        common_events: common as u64,
        a: side(a.0, a.1, common),
        b: side(b.0, b.1, common),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Event {
        Event::UserMessage { text: text.into() }
    }

    #[test]
    fn a_fork_lines_up_with_its_parent_and_parts_where_it_differs() {
        let parent = vec![(1, user("a")), (2, user("b")), (3, user("c"))];
        let fork = vec![
            (
                1,
                Event::SessionForked {
                    parent: Uuid::nil(),
                    at_seq: 2,
                    rerun: None,
                    shared: false,
                },
            ),
            (2, user("a")),
            (3, user("b")),
            (4, user("other")),
        ];
        assert_eq!(common_prefix(&parent, &fork), 2);
        let d = diff((Uuid::nil(), &parent), (Uuid::max(), &fork));
        assert_eq!(d.a.diverges_at_seq, Some(3));
        assert_eq!(d.b.diverges_at_seq, Some(4));
        assert_eq!(d.b.after[0].summary, "\"other\"");
        assert_eq!(common_prefix(&parent, &parent), 3);
    }
}
