//! A session as a process sees it: its log and the fold of it, kept in step.

use crate::error::RuntimeError;
use eventlog::{Durability, EventLog, NewEvent, Record};
use replay::{AgentSpec, Event, SessionState};
use std::sync::Arc;
use uuid::Uuid;

/// A session loaded into memory. Every change goes to the log first and is
/// folded into `state` only once the log accepted it.
pub struct Session {
    id: Uuid,
    log: Arc<dyn EventLog>,
    state: SessionState,
    /// Seq up to which a barrier of the session's durability has returned.
    durable_seq: u64,
    observer: Option<Arc<dyn SessionObserver>>,
    /// Hash of the last record.
    last_hash: eventlog::Hash,
    /// Events between two snapshots (0: none).
    snapshot_every: u64,
    /// Seq of the last snapshot written or loaded.
    snapshot_seq: u64,
    /// The rendered prompt so far, extended rather than rebuilt.
    prompt: PromptCache,
    /// The trace of the drive under way, fed what it appends.
    trace: Option<crate::telemetry::TurnTrace>,
}

/// The prompt rendered so far, and the last request built from it.
#[derive(Default)]
struct PromptCache {
    /// The rendered prompt so far, extended rather than rebuilt.
    rendered: replay::RenderedPrefix,
    /// The last request built, and the seq of the state it was built from.
    last: Option<(u64, replay::PreparedRequest)>,
}

/// Told what sessions append and make durable (metrics, live streams).
pub trait SessionObserver: Send + Sync {
    /// `events` were appended as `records` (not durable yet).
    fn appended(&self, records: &[Record], events: &[Event]);
    /// `events` were appended as `records` (not durable yet) to a session
    /// whose fold, before them, is `before`: what an observer that tells
    /// of a turn needs to know of it so far (its steps, its calls' tools),
    /// even when this process did not start it. This is what a session
    /// calls; by default it is [`SessionObserver::appended`].
    fn appended_to(&self, before: &SessionState, records: &[Record], events: &[Event]) {
        let _ = before;
        self.appended(records, events);
    }
    /// Everything of `session` up to `seq` is durable; the barrier took `took`.
    fn durable(&self, session: Uuid, seq: u64, took: std::time::Duration);
}

/// Decodes a stored record into an event, naming the place on failure.
pub fn decode(record: &Record) -> Result<Event, RuntimeError> {
    let envelope = &record.envelope;
    Event::decode(envelope.schema, &envelope.payload).map_err(|source| RuntimeError::Decode {
        session: envelope.session,
        seq: envelope.seq,
        source,
    })
}

/// Reads and decodes every event of `session`, in seq order.
pub async fn read_events(
    log: &dyn EventLog,
    session: Uuid,
) -> Result<Vec<(Record, Event)>, RuntimeError> {
    let head = log.head(session).await?;
    if head.seq == 0 {
        return Err(RuntimeError::NoSuchSession(session));
    }
    log.read(session, 1, head.seq)
        .await?
        .into_iter()
        .map(|record| decode(&record).map(|event| (record, event)))
        .collect()
}

/// `event` (its secrets redacted) and the record that stores it.
pub(crate) fn new_event(event: Event, caused_by: Option<u64>) -> (Event, NewEvent) {
    let (event, payload) = crate::text::redact_event(event);
    let new = NewEvent {
        kind: event.kind().to_string(),
        schema: event.schema(),
        caused_by,
        payload,
    };
    (event, new)
}

/// Records of a session read and decoded at a time by [`decode_every_event`].
const DECODE_CHUNK: u64 = 4096;

/// Checks that every event of `session` up to `head` decodes, reading a
/// chunk of records at a time: what it holds stays bounded, whatever the
/// session's length. Returns the first that does not.
pub(crate) async fn decode_every_event(
    log: &dyn EventLog,
    session: Uuid,
    head: u64,
) -> Result<(), RuntimeError> {
    let mut from = 1;
    while from <= head {
        let to = head.min(from + DECODE_CHUNK - 1);
        for record in log.read(session, from, to).await? {
            decode(&record)?;
        }
        from = to + 1;
    }
    Ok(())
}

/// Below this many records, decoding on one thread is faster.
const PARALLEL_DECODE_MIN: usize = 2048;

/// Decodes records into (seq, event), on every core (rayon's pool) for
/// long logs, in seq order.
fn decode_all(records: Vec<Record>) -> Result<Vec<(u64, Event)>, RuntimeError> {
    use rayon::prelude::*;
    let decode_one = |r: Record| decode(&r).map(|e| (r.envelope.seq, e));
    if records.len() < PARALLEL_DECODE_MIN {
        return records.into_iter().map(decode_one).collect();
    }
    records
        .into_par_iter()
        .with_min_len(PARALLEL_DECODE_MIN / 2)
        .map(decode_one)
        .collect()
}

/// Decodes `tail` and folds it into `state`: a long tail (decoded on every
/// core, then folded) on tokio's blocking pool, so that the caller's worker
/// goes on serving other tasks meanwhile; a short one in place.
async fn fold_tail(
    mut state: SessionState,
    tail: Vec<Record>,
) -> Result<SessionState, RuntimeError> {
    let short = tail.len() < PARALLEL_DECODE_MIN;
    let fold = move || {
        for (seq, event) in decode_all(tail)? {
            state.apply(seq, event);
        }
        Ok(state)
    };
    if short {
        return fold();
    }
    match tokio::task::spawn_blocking(fold).await {
        Ok(folded) => folded,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

impl Session {
    /// Starts a new session with `spec` (appends SessionStarted).
    pub async fn create(log: Arc<dyn EventLog>, spec: AgentSpec) -> Result<Session, RuntimeError> {
        Session::create_observed(log, spec, None).await
    }

    /// Starts a new session with `spec`, reporting to `observer` from its
    /// first event on.
    pub async fn create_observed(
        log: Arc<dyn EventLog>,
        spec: AgentSpec,
        observer: Option<Arc<dyn SessionObserver>>,
    ) -> Result<Session, RuntimeError> {
        let start = Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        };
        Session::create_observed_with(log, vec![(start, None)], observer).await
    }

    /// Starts a new session whose first events are `first` (each with its
    /// cause), in one append.
    pub async fn create_observed_with(
        log: Arc<dyn EventLog>,
        first: Vec<(Event, Option<u64>)>,
        observer: Option<Arc<dyn SessionObserver>>,
    ) -> Result<Session, RuntimeError> {
        Session::create_as(Uuid::now_v7(), log, first, observer).await
    }

    /// Starts session `id` (an id derived elsewhere, such as a child's)
    /// whose first events are `first`, in one append at seq 1: if the log
    /// already holds `id`, the append is refused as a conflict and nothing
    /// changes.
    pub async fn create_as(
        id: Uuid,
        log: Arc<dyn EventLog>,
        first: Vec<(Event, Option<u64>)>,
        observer: Option<Arc<dyn SessionObserver>>,
    ) -> Result<Session, RuntimeError> {
        let mut session = Session {
            id,
            log,
            state: SessionState::default(),
            durable_seq: 0,
            observer,
            last_hash: eventlog::Hash::ZERO,
            snapshot_every: crate::snapshot::DEFAULT_EVERY,
            snapshot_seq: 0,
            prompt: PromptCache::default(),
            trace: None,
        };
        session.append_caused(first).await?;
        Ok(session)
    }

    /// Starts a new session that shares `parent`'s first records, whose
    /// fold is `history` (through its `last_seq`), and goes on with `own`
    /// in one append (see [`EventLog::fork`]): it stores only `own`.
    pub(crate) async fn fork_observed(
        log: Arc<dyn EventLog>,
        parent: Uuid,
        history: SessionState,
        own: Vec<(Event, Option<u64>)>,
        observer: Option<Arc<dyn SessionObserver>>,
    ) -> Result<Session, RuntimeError> {
        let id = Uuid::now_v7();
        let at = history.last_seq;
        let (events, new): (Vec<Event>, Vec<NewEvent>) = own
            .into_iter()
            .map(|(e, caused_by)| new_event(e, caused_by))
            .unzip();
        let records = log.fork(id, parent, at, new).await?;
        let mut session = Session {
            id,
            log,
            state: history,
            durable_seq: 0,
            observer,
            last_hash: eventlog::Hash::ZERO,
            snapshot_every: crate::snapshot::DEFAULT_EVERY,
            snapshot_seq: 0,
            prompt: PromptCache::default(),
            trace: None,
        };
        session.fold_appended(at + 1, &records, events);
        Ok(session)
    }

    /// Loads `id`: from its newest valid snapshot and the events after it,
    /// or, without one, by folding its whole log.
    pub async fn load(log: Arc<dyn EventLog>, id: Uuid) -> Result<Session, RuntimeError> {
        let head = log.head(id).await?;
        if head.seq == 0 {
            return Err(RuntimeError::NoSuchSession(id));
        }
        let mut state = crate::snapshot::load(log.as_ref(), id)
            .await
            .ok()
            .filter(|s| s.last_seq <= head.seq)
            .unwrap_or_default();
        let snapshot_seq = state.last_seq;
        if state.last_seq < head.seq {
            let tail = log.read(id, state.last_seq + 1, head.seq).await?;
            if let (Some(first), true) = (tail.first(), snapshot_seq > 0) {
                let at = log.read(id, snapshot_seq, snapshot_seq).await?;
                let prev = eventlog::Head {
                    seq: snapshot_seq,
                    hash: at.first().map_or(eventlog::Hash::ZERO, |r| r.hash),
                };
                eventlog::check_link(id, &prev, first)?;
            }
            state = fold_tail(state, tail).await?;
        }
        Ok(Session {
            id,
            log,
            // Not known to be durable in this process: the first barrier
            // checks (and costs nothing when the log already synced them).
            durable_seq: 0,
            state,
            observer: None,
            last_hash: head.hash,
            snapshot_every: crate::snapshot::DEFAULT_EVERY,
            snapshot_seq,
            prompt: PromptCache::default(),
            trace: None,
        })
    }

    /// Seq of the snapshot this session was loaded from or last wrote (0: none).
    pub fn snapshot_seq(&self) -> u64 {
        self.snapshot_seq
    }

    /// Takes a snapshot every `every` events (0: never), off the append path.
    pub fn snapshot_every(mut self, every: u64) -> Session {
        self.snapshot_every = every;
        self
    }

    /// Reports this session's appends and barriers to `observer` from now on.
    pub fn observed_by(mut self, observer: Arc<dyn SessionObserver>) -> Session {
        self.observer = Some(observer);
        self
    }

    /// Feeds what this session appends to `trace` from now on, or stops
    /// (`None`); returns the trace it fed before.
    pub(crate) fn traced_by(
        &mut self,
        trace: Option<crate::telemetry::TurnTrace>,
    ) -> Option<crate::telemetry::TurnTrace> {
        std::mem::replace(&mut self.trace, trace)
    }

    /// The log the session is in.
    pub fn log(&self) -> &Arc<dyn EventLog> {
        &self.log
    }

    /// The session's id.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The folded state, up to the last accepted append.
    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// The session's next model request (its exact bytes and digest),
    /// extending the prompt rendered so far instead of rendering the
    /// history again; built once for a given state (a copy shares the
    /// rendered history).
    pub fn next_request(&mut self) -> Result<replay::PreparedRequest, RuntimeError> {
        let seq = self.state.last_seq;
        if let Some((built_at, request)) = &self.prompt.last {
            if *built_at == seq {
                return Ok(request.clone());
            }
        }
        // Dropped first, so the history it shares grows in place.
        self.prompt.last = None;
        let id = self.id.to_string();
        let request = replay::next_request_incremental(&id, &self.state, &mut self.prompt.rendered)
            .ok_or(RuntimeError::InvalidRequest {
                session: self.id,
                reason: "the log has no SessionStarted event".into(),
            })?;
        self.prompt.last = Some((seq, request.clone()));
        Ok(request)
    }

    /// Chained digest of the stable prefix of the last request built.
    pub fn prefix_digest(&self) -> String {
        self.prompt.rendered.digest_hex()
    }

    /// Whether this session is the log's session as it stands: no record
    /// was appended elsewhere since it was loaded (the head's seq and hash
    /// are the ones it folded).
    pub async fn is_current(&self) -> Result<bool, RuntimeError> {
        let head = self.log.head(self.id).await?;
        Ok(head.seq == self.state.last_seq && head.hash == self.last_hash)
    }

    /// About how many bytes the session holds in memory (its rendered
    /// prompt, the last request built from it, and a fold about as large).
    pub fn approx_bytes(&self) -> usize {
        3 * self.prompt.rendered.len() + 4096
    }

    /// The spec the session started with.
    pub fn spec(&self) -> Result<&AgentSpec, RuntimeError> {
        self.state
            .spec
            .as_ref()
            .ok_or(RuntimeError::InvalidRequest {
                session: self.id,
                reason: "the log has no SessionStarted event".into(),
            })
    }
    /// The seq and hash of the last record this session appended or read.
    pub fn head(&self) -> (u64, eventlog::Hash) {
        (self.state.last_seq, self.last_hash)
    }

    /// Where this session's tool calls keep binary content.
    pub fn blobs(&self) -> tools::Blobs {
        crate::blobs::SessionBlobs::of(self.log.clone(), self.id)
    }

    /// Appends `events` atomically after the last known seq and folds them,
    /// with every secret this process knows redacted from them first.
    /// Returns the seq of the first. Not durable until [`Session::barrier`].
    pub async fn append(
        &mut self,
        events: Vec<Event>,
        caused_by: Option<u64>,
    ) -> Result<u64, RuntimeError> {
        let events = events.into_iter().map(|e| (e, caused_by)).collect();
        self.append_caused(events).await
    }

    /// [`Session::append`], each event with its own cause.
    pub async fn append_caused(
        &mut self,
        events: Vec<(Event, Option<u64>)>,
    ) -> Result<u64, RuntimeError> {
        self.append_as(events, false).await
    }

    /// [`Session::append`] of events that nothing acts on before a later
    /// append is made durable by a barrier (a model reply, before its
    /// calls' `ToolStarted`): see [`EventLog::append_deferred`].
    pub(crate) async fn append_deferred(
        &mut self,
        events: Vec<Event>,
        caused_by: Option<u64>,
    ) -> Result<u64, RuntimeError> {
        let events = events.into_iter().map(|e| (e, caused_by)).collect();
        self.append_as(events, true).await
    }

    async fn append_as(
        &mut self,
        events: Vec<(Event, Option<u64>)>,
        deferred: bool,
    ) -> Result<u64, RuntimeError> {
        let first = self.state.last_seq + 1;
        let (events, new): (Vec<Event>, Vec<NewEvent>) = events
            .into_iter()
            .map(|(e, caused_by)| new_event(e, caused_by))
            .unzip();
        let records = match deferred {
            true => self.log.append_deferred(self.id, first, new).await?,
            false => self.log.append(self.id, first, new).await?,
        };
        self.fold_appended(first, &records, events);
        Ok(first)
    }

    /// Tells the observer and the trace of `events`, just appended as
    /// `records` from seq `first`, and folds them.
    fn fold_appended(&mut self, first: u64, records: &[Record], events: Vec<Event>) {
        if let Some(observer) = &self.observer {
            observer.appended_to(&self.state, records, &events);
        }
        if let Some(trace) = &mut self.trace {
            trace.appended(records, &events);
        }
        let pausing = events
            .iter()
            .any(|e| matches!(e, Event::SessionPaused { .. }));
        for (i, event) in events.into_iter().enumerate() {
            self.state.apply(first + i as u64, event);
        }
        self.last_hash = records.last().map_or(self.last_hash, |r| r.hash);
        if pausing || self.snapshot_due() {
            self.snapshot_in_background();
        }
    }

    fn effective_snapshot_every(&self) -> u64 {
        match self.snapshot_every {
            crate::snapshot::AUTO => {
                let bounded = self
                    .state
                    .spec
                    .as_ref()
                    .is_some_and(|s| s.model.context_window.is_some());
                if bounded {
                    crate::snapshot::BOUNDED_EVERY
                } else {
                    0
                }
            }
            every => every,
        }
    }

    fn snapshot_due(&self) -> bool {
        let every = self.effective_snapshot_every();
        every > 0 && self.state.last_seq - self.snapshot_seq >= every
    }

    /// Writes a snapshot of the current state in another task: the append
    /// path only pays for a copy of the state.
    fn snapshot_in_background(&mut self) {
        if self.effective_snapshot_every() == 0 {
            return;
        }
        self.snapshot_seq = self.state.last_seq;
        let (log, id, hash, state) = (
            self.log.clone(),
            self.id,
            self.last_hash,
            self.state.clone(),
        );
        tokio::spawn(async move {
            // Derived data: a failed snapshot only costs speed.
            let _ = crate::snapshot::store(log.as_ref(), id, hash, &state).await;
        });
    }

    /// Whether every append this session accepted is covered by a barrier
    /// of this process.
    pub fn is_durable(&self) -> bool {
        self.durable_seq >= self.state.last_seq
    }

    /// Writes the summary a listing shows of this session as it stands
    /// (derived data: see [`crate::snapshot::store_summary`]).
    pub(crate) async fn store_summary(&self) -> Result<(), eventlog::LogError> {
        crate::snapshot::store_summary(self.log.as_ref(), self.id, &self.state).await
    }

    /// Makes every accepted append at least as durable as `durability`.
    /// Costs nothing when nothing was appended since the last barrier.
    pub async fn barrier(&mut self, durability: Durability) -> Result<(), RuntimeError> {
        if self.durable_seq >= self.state.last_seq {
            return Ok(());
        }
        let started = std::time::Instant::now();
        self.log.barrier_of(self.id, durability).await?;
        self.durable_seq = self.state.last_seq;
        if let Some(observer) = &self.observer {
            observer.durable(self.id, self.durable_seq, started.elapsed());
        }
        Ok(())
    }
}
