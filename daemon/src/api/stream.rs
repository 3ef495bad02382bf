//! The log as a stream: a page of records at a time, then each new one
//! once it is durable (Server-Sent Events).

use super::*;

/// The log as JSON (an array), or with `follow=true` as Server-Sent
/// Events: history first, then each new event once it is durable. Either
/// way the log is read a page of [`PAGE`] records at a time, so a client
/// costs one page of memory however long the session is. Each event's SSE
/// `id` is its seq; a `Last-Event-ID` header (a reconnecting EventSource
/// sends it) starts the stream after that seq, as `after` does.
#[utoipa::path(get, path = "/sessions/{id}/events", params(SessionPath, EventsQuery),
    responses((status = 200,
        description = "The audit trail; with `follow=true`, Server-Sent Events named by each event's kind, with the seq as their id and an `EventRecord` as their data",
        content((Vec<EventRecord> = "application/json"), (String = "text/event-stream")))))]
pub(super) async fn events(
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // A browser's EventSource reconnects with the id of the last event it
    // had: the stream goes on after it, losing and repeating nothing.
    let resumed = headers
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    bad_request("Last-Event-ID: expected the seq of an event (a number)")
                })
        })
        .transpose()?;
    let daemon = state.daemon.clone();
    let kinds: Option<Vec<String>> = q.kind.map(|k| k.split(',').map(String::from).collect());
    // Subscribe before reading the head, so nothing falls in between.
    let heads = daemon.heads.subscribe();
    let head = daemon.service.log().head(id).await?.seq;
    if head == 0 {
        return Err(RuntimeError::NoSuchSession(id).into());
    }
    if q.follow && q.until.is_some() {
        return Err(bad_request(
            "until= pages the log; a followed stream has no end: give one or the other",
        ));
    }
    let until = q.until.unwrap_or(u64::MAX);
    let next = (resumed.or(q.after).unwrap_or(0).checked_add(1))
        .ok_or_else(|| bad_request("after= (or Last-Event-ID) is past any seq there can be"))?;
    let mut stream = Follow {
        daemon,
        id,
        next,
        // Only durable events: a turn's latest appends wait for their barrier.
        target: 0,
        heads,
        stopped: state.stopped.clone(),
        buffer: VecDeque::new(),
        keep: Box::new(move |v: &Value| {
            kinds
                .as_ref()
                .is_none_or(|k| k.iter().any(|k| v["kind"] == k.as_str()))
        }),
        next_look: tokio::time::Instant::now() + LOOK_AT_HEAD_EVERY,
    };
    stream.target = stream.durable_head().await.unwrap_or(head).min(until);
    if !q.follow {
        return Ok((
            [(header::CONTENT_TYPE, "application/json")],
            axum::body::Body::from_stream(stream.into_json_array()),
        )
            .into_response());
    }
    Ok(Sse::new(stream.into_sse())
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Records read from the log at a time by a stream of events, at most.
const PAGE: u64 = 64;
/// Bytes of records a stream of events reads at a time, at most (or one
/// record, if it alone is bigger).
const PAGE_BYTES: usize = 1 << 20;

/// How long a quiet live stream waits before it reads the session's head
/// itself, in case an announcement from another daemon was lost.
const LOOK_AT_HEAD_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// A stream of one session's events, read a page at a time.
struct Follow {
    daemon: Shared,
    id: Uuid,
    /// The next seq to read.
    next: u64,
    /// The durable head known: events up to it are read.
    target: u64,
    heads: tokio::sync::broadcast::Receiver<(Uuid, u64)>,
    stopped: CancellationToken,
    /// Rows of the page read last that pass the filter.
    buffer: VecDeque<Value>,
    keep: Box<dyn Fn(&Value) -> bool + Send + Sync>,
    /// When to read the head if no announcement came.
    next_look: tokio::time::Instant,
}

impl Follow {
    /// The session's durable head: the log's, capped by this daemon's last
    /// barrier while one of its turns runs the session (elsewhere, what
    /// another daemon appended is in the store, committed).
    async fn durable_head(&self) -> Option<u64> {
        let head = self.daemon.service.log().head(self.id).await.ok()?.seq;
        if !self.daemon.scheduler.is_running(self.id) {
            return Some(head);
        }
        Some(
            self.daemon
                .heads
                .made_here(self.id)
                .map_or(head, |d| d.min(head)),
        )
    }

    /// Reads the next page up to the target into the buffer: at most
    /// [`PAGE`] records and [`PAGE_BYTES`] (or one record, if it alone is
    /// bigger); false when the target is reached.
    async fn read_page(&mut self) -> Result<bool, RuntimeError> {
        if self.next > self.target {
            return Ok(false);
        }
        let to = self.target.min(self.next + PAGE - 1);
        let log = self.daemon.service.log();
        for record in log.read_bounded(self.id, self.next, to, PAGE_BYTES).await? {
            let event = runtime::store::decode(&record)?;
            self.next = record.envelope.seq + 1;
            let row = store::record(&record, &event);
            if (self.keep)(&row) {
                self.buffer.push_back(row);
            }
        }
        Ok(true)
    }

    /// The events up to the target as one JSON array, written a page at a
    /// time. A record that cannot be read breaks the response off (the
    /// client sees an incomplete array, never a short one that parses).
    fn into_json_array(
        self,
    ) -> impl futures_util::Stream<Item = Result<axum::body::Bytes, RuntimeError>> {
        let opening =
            futures_util::stream::once(async { Ok(axum::body::Bytes::from_static(b"[")) });
        let pages = futures_util::stream::unfold((self, true), |(mut f, first)| async move {
            match f.read_page().await {
                Err(e) => {
                    f.target = 0; // the stream ends after the error
                    f.buffer.clear();
                    return Some((Err(e), (f, first)));
                }
                Ok(false) if f.buffer.is_empty() => return None,
                Ok(_) => {}
            }
            let mut out = Vec::new();
            let mut first = first;
            for row in f.buffer.drain(..) {
                if !first {
                    out.push(b',');
                }
                first = false;
                serde_json::to_writer(&mut out, &row).expect("rows serialize");
            }
            Some((Ok(axum::body::Bytes::from(out)), (f, first)))
        });
        let closing =
            futures_util::stream::once(async { Ok(axum::body::Bytes::from_static(b"]")) });
        futures_util::StreamExt::chain(futures_util::StreamExt::chain(opening, pages), closing)
    }

    /// History, then each new event once durable, as Server-Sent Events.
    fn into_sse(
        self,
    ) -> impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>> {
        futures_util::stream::unfold(self, |mut f| async move {
            loop {
                if let Some(row) = f.buffer.pop_front() {
                    let event = SseEvent::default()
                        .event(row["kind"].as_str().unwrap_or("event"))
                        .id(row["seq"].to_string())
                        .data(row.to_string());
                    return Some((Ok(event), f));
                }
                if f.read_page().await.ok()? {
                    continue;
                }
                let head = tokio::select! {
                    head = f.heads.recv() => head,
                    () = f.stopped.cancelled() => return None,
                    // Another daemon's announcement may be lost: look anyway.
                    _ = tokio::time::sleep_until(f.next_look) => {
                        f.next_look = tokio::time::Instant::now() + LOOK_AT_HEAD_EVERY;
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(0))
                    }
                };
                f.target = match head {
                    Ok((session, seq)) if session == f.id => seq.max(f.target),
                    Ok(_) => continue,
                    // Fell behind, or looking anyway: catch up to what is durable.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        f.durable_head().await?
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                };
            }
        })
    }
}
