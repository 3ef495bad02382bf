//! `mneme serve`: the long-running home of many sessions.
//!
//! Turns run as tasks, one at a time per session (a per-session lock, and
//! the session's lease in the store, so that several daemons sharing a
//! PostgreSQL store never run one session twice); idle sessions are not kept
//! in memory, only their status. On start the daemon resumes, in the
//! background, every session that was running when the last process died;
//! it serves requests meanwhile. Every half lease it looks for leases that
//! lapsed (their daemon died or handed them over) and takes those sessions
//! over. On SIGTERM or ctrl-c it stops taking turns, lets each running
//! turn finish its current step (tool calls under way complete) up to a
//! deadline, pauses those turns with a SessionPaused, checkpoints and exits 0.

mod api;
mod fair;
mod heads;
mod http;
mod memory;
mod metrics;
mod openapi;
mod schedules;
mod statuses;
mod streams;
mod tenancy;
pub mod token;
mod ui;

pub use metrics::Metrics;

use eventlog::{Durability, EventLog};
use heads::DurableHeads;
use runtime::control::HeldLease;
use runtime::control::Inboxes;
use runtime::control::{pause_asked, Listening, PAUSED_ON_REQUEST};
use runtime::store::Summary;
use runtime::RuntimeError;
use runtime::Service;
use runtime::{Runner, TurnEnd};
use statuses::Statuses;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use streams::Streams;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

pub use runtime::control::SHUTDOWN_REASON;
use runtime::control::{Control, Hold, Opened, TurnStart, TurnTask, Turns};

/// The longest wait between two looks for lapsed leases: a lease handed
/// over at once (a shutdown, a failed turn) is taken over within it.
const LOOK_FOR_LAPSED_LEASES: Duration = Duration::from_secs(1);

/// How often the daemon looks for what fell due: approvals past their
/// deadline, sleeping calls whose time came.
const LOOK_FOR_DUE: Duration = Duration::from_millis(250);

/// How often, at the most, it looks for schedules other processes created
/// (those made through its own API it knows at once).
const LOOK_FOR_SCHEDULES: Duration = Duration::from_secs(1);

/// A look for schedules lists every session of the store: on a large store
/// the looks are spaced so that they take at most one part in this many of
/// the daemon's time (a store of 10,000 sessions takes about 8 ms a look).
const LOOK_FOR_SCHEDULES_SHARE: u32 = 50;

/// The wait before the next look for schedules, after one that took `took`.
fn next_look_for_schedules(took: Duration) -> Duration {
    LOOK_FOR_SCHEDULES.max(took * LOOK_FOR_SCHEDULES_SHARE)
}

/// How often it reads every session's deadline from the store (its own
/// turns and decisions tell it theirs at once; this finds those of other
/// daemons sharing the store).
const READ_APPROVAL_DEADLINES: Duration = Duration::from_secs(60);

/// Seconds a client has to send a request's head, by default.
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 10;

/// Seconds a keep-alive connection may wait for its next request, by default.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 60;

/// Connections open at most, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Name of the file in the data directory that tells the CLI where the
/// daemon listens.
pub const DAEMON_FILE: &str = "mneme.daemon";

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Whether `listen` may be an address other hosts can reach.
    pub allow_public: bool,
    /// The data directory (for the daemon file).
    pub data_dir: PathBuf,
    /// Bearer token every endpoint but `/health` requires.
    pub token: String,
    /// File the token is in, if any (named in the daemon file).
    pub token_file: Option<PathBuf>,
    /// Directory of named agent files (`NAME.toml`).
    pub agents_dir: Option<PathBuf>,
    /// What barriers wait for.
    pub durability: Durability,
    /// Events between two snapshots of a session (0: never).
    pub snapshot_every: u64,
    /// How long a shutdown waits for running turns.
    pub shutdown_grace: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Tool calls running at once across every session.
    pub max_parallel_calls: usize,
    /// Turns running at once across every session (`usize::MAX`: no
    /// limit); the others wait, served round-robin across tenants.
    pub max_running_turns: usize,
    /// How long a client has to send a request's head.
    pub header_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Connections open at most (lowered to what the open-file limit
    /// leaves room for).
    pub max_connections: usize,
    /// This daemon's name as the owner of session leases.
    pub owner: String,
    /// How long a session's lease lasts unless renewed: how soon another
    /// daemon takes over the sessions of one that died.
    pub lease_ttl: Duration,
    /// Signs each session's head at the end of each turn, if given.
    pub signer: Option<Arc<runtime::store::HeadSigner>>,
    /// Erase sessions idle longer than this (retention), if given.
    pub retain: Option<Duration>,
    /// Traces each turn in the OpenTelemetry format, if given.
    pub tracer: Option<Arc<runtime::Tracer>>,
}

/// Files a turn may open that are not open yet, estimated: its model
/// request's connection and the name lookup before it. (Counting what each
/// turn has open exactly would mean following every socket and pipe it
/// opens; what turns have open already is in the files counted open, so a
/// running turn is counted twice for what it holds, never not at all.) A
/// turn's model requests go one at a time, a retry's after the last one's
/// connection closed; between turns, connections go back to the process's
/// pool, which keeps few (`runtime::outbound`).
const FILES_PER_TURN: u64 = 2;

/// Files a tool call may open that are not open yet, estimated: a command
/// tool's pipes (stdin, stdout, stderr), or those of a session's MCP server
/// it starts (whose pipes stay open with the session, and are counted open
/// from then on), or an HTTP tool's or a sub-agent's connection. Calls run
/// at once across the daemon are at most `--max-parallel-calls`.
const FILES_PER_CALL: u64 = 3;

/// Files kept free of turns: for the log's own (a checkpoint, a
/// snapshot), new connections (`/health`), and the listing that counts
/// open files: a sixteenth of the limit, at least 16.
fn spare_files(limit: u64) -> u64 {
    (limit / 16).max(16)
}

/// Whether one more turn fits under the open-file `limit` beside the
/// files `open` now (None: they could not be counted) and the `turns`
/// running or admitted, of which `calls` tool calls may run at once: what
/// they may open ([`FILES_PER_TURN`] a turn, [`FILES_PER_CALL`] a call at
/// once) and [`spare_files`] must fit. If not, why, for a 503.
fn fits_one_more_turn(limit: u64, open: Option<u64>, turns: u64, calls: u64) -> Result<(), String> {
    let spare = spare_files(limit);
    let raise =
        "try again once turns have ended, or raise the limit (`ulimit -n`, systemd's LimitNOFILE=)";
    let Some(open) = open else {
        return Err(format!(
            "the daemon is near its open-file limit (? of {limit}): it cannot list its open files; {raise}"
        ));
    };
    let turns = turns + 1;
    let pending = turns * FILES_PER_TURN + turns.min(calls) * FILES_PER_CALL;
    let needed = open + pending;
    if needed + spare <= limit {
        return Ok(());
    }
    Err(format!(
        "the daemon is near its open-file limit ({needed} of {limit}): {open} files are open, {pending} more may be opened by the turns under way and this one ({turns} of them: {FILES_PER_TURN} a turn for its model request, {FILES_PER_CALL} a tool call at once) and {spare} are kept free; {raise}"
    ))
}

/// The daemon's open-file budget of turns (see [`Daemon::admit_turn`]).
struct FileBudget {
    /// The soft `RLIMIT_NOFILE` when the daemon started; None if unlimited.
    limit: Option<u64>,
    /// Tool calls running at once across every session.
    calls: u64,
    /// Turns admitted whose task has not started yet.
    admitting: std::sync::atomic::AtomicU64,
}

/// A turn's place in the open-file budget, from its admission until its
/// task runs (then the task counts); given back on drop.
pub(crate) struct Admitted<'a>(Option<&'a std::sync::atomic::AtomicU64>);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some(admitting) = self.0 {
            admitting.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// What the daemon shares between requests and turns.
pub(crate) struct Daemon {
    pub(crate) service: Service,
    /// How turns run: one per session at a time.
    pub(crate) scheduler: Scheduler,
    pub(crate) config: DaemonConfig,
    pub(crate) metrics: Arc<Metrics>,
    /// Each session's status and approval deadline, as last seen.
    pub(crate) statuses: Statuses,
    /// Cancelled on SIGTERM or ctrl-c: no new turns, running ones pause at
    /// their next step, live streams end.
    pub(crate) shutdown: CancellationToken,
    /// Each session's durable head, for live streams.
    pub(crate) heads: Arc<DurableHeads>,
    /// Each session's reply as it streams (never recorded as such: the
    /// whole reply is).
    pub(crate) streams: Arc<Streams>,
    /// What requests must carry in `Authorization`.
    bearer: token::Expected,
    /// Browsers signed in to the web view, and codes that sign one in.
    pub(crate) sign_ins: Arc<ui::SignIns>,
    /// What turns may open, against the open-file limit.
    files: FileBudget,
    /// The schedules this daemon fires.
    pub(crate) schedules: schedules::Schedules,
    /// The tenant of each session a request named (`None`: the
    /// operator's), as its start records it: it never changes.
    pub(crate) owners: Mutex<HashMap<Uuid, Option<String>>>,
    /// The turns running and waiting, a fair share for each tenant.
    pub(crate) fair: Arc<fair::FairShare>,
}

/// Bytes of hot sessions (folded state and rendered prompt, estimated)
/// the daemon keeps across turns.
const HOT_SESSION_BYTES: usize = 64 << 20;

/// A session kept between its turns: its fold, its rendered prompt, and
/// the model client and tools its spec asks for.
struct Hot {
    session: runtime::Session,
    parts: Arc<runtime::TurnParts>,
    bytes: usize,
}

/// Sessions kept between turns, least recently used first out, bounded in
/// bytes: a turn of a hot session costs what it appends, not what its
/// history holds. Each is used only while the log's head is still the one
/// it folded (seq and hash); anything else (another daemon, a decision
/// recorded meanwhile) loads the session again.
#[derive(Default)]
struct HotSessions {
    sessions: HashMap<Uuid, Hot>,
    order: std::collections::VecDeque<Uuid>,
    bytes: usize,
}

impl HotSessions {
    fn take(&mut self, id: Uuid) -> Option<Hot> {
        let hot = self.sessions.remove(&id)?;
        self.bytes -= hot.bytes;
        self.order.retain(|o| *o != id);
        Some(hot)
    }

    fn put(&mut self, id: Uuid, session: runtime::Session, parts: Arc<runtime::TurnParts>) {
        self.take(id);
        let bytes = session.approx_bytes();
        self.bytes += bytes;
        self.sessions.insert(
            id,
            Hot {
                session,
                parts,
                bytes,
            },
        );
        self.order.push_back(id);
        while self.bytes > HOT_SESSION_BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(evicted) = self.sessions.remove(&oldest) {
                self.bytes -= evicted.bytes;
            }
        }
    }
}

/// How the daemon runs turns: one per session at a time (each session's
/// turn lock), the turns under way (tracked, so a shutdown waits for them,
/// and listening for pause requests made through other processes),
/// messages posted while a turn of their session runs, and the sessions
/// kept folded between their turns.
pub(crate) struct Scheduler {
    pub(crate) runner: Runner,
    locks: Mutex<HashMap<Uuid, Arc<tokio::sync::Mutex<()>>>>,
    pause_requests: Arc<Mutex<HashSet<Uuid>>>,
    listening: Arc<Listening>,
    /// The turn tasks; a shutdown waits for them.
    pub(crate) turns: TaskTracker,
    /// Messages posted while a turn of their session runs here, for that
    /// turn to record.
    pub(crate) inboxes: Arc<Inboxes>,
    /// Recently active sessions, folded and ready for their next turn.
    hot: Mutex<HotSessions>,
}

impl Scheduler {
    fn lock_for(&self, id: Uuid) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .expect("locks")
            .entry(id)
            .or_default()
            .clone()
    }

    /// Turns of `id` asked for and not ended: the one running and those
    /// waiting for it.
    pub(crate) fn turns_of(&self, id: Uuid) -> usize {
        let locks = self.locks.lock().expect("locks");
        locks.get(&id).map_or(0, |lock| Arc::strong_count(lock) - 1)
    }

    /// Asks the running turn of `id` to pause at its next step boundary;
    /// false if no turn is running.
    pub(crate) fn request_pause(&self, id: Uuid) -> bool {
        let active = self.is_running(id);
        if active {
            self.pause_requests.lock().expect("pause lock").insert(id);
        }
        active
    }

    /// Whether a turn of `id` runs in this daemon now.
    pub(crate) fn is_running(&self, id: Uuid) -> bool {
        self.listening.has(id)
    }

    /// Withdraws a pause request no turn consumed.
    pub(crate) fn withdraw_pause(&self, id: Uuid) {
        self.pause_requests.lock().expect("pause lock").remove(&id);
    }

    /// Drops the turn locks of sessions nothing holds or waits for.
    pub(crate) fn forget_idle_locks(&self) {
        let mut locks = self.locks.lock().expect("locks");
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
    }
}

impl Daemon {
    fn new(
        service: Service,
        config: DaemonConfig,
        metrics: Arc<Metrics>,
        (heads, streams): (Arc<DurableHeads>, Arc<Streams>),
    ) -> Daemon {
        let shutdown = CancellationToken::new();
        let pause_requests: Arc<Mutex<HashSet<Uuid>>> = Arc::default();
        let listening: Arc<Listening> = Arc::default();
        let stop = {
            let shutdown = shutdown.clone();
            let pause_requests = pause_requests.clone();
            let listening = listening.clone();
            let log = service.log().clone();
            Arc::new(move |id: Uuid| {
                // A person's pause wins: recovery must not resume it.
                let asked_here = pause_requests.lock().expect("pause lock").remove(&id);
                let (shutdown, listening, log) = (shutdown.clone(), listening.clone(), log.clone());
                Box::pin(async move {
                    if asked_here || listening.asked(log.as_ref(), id).await {
                        return Some(PAUSED_ON_REQUEST.to_string());
                    }
                    shutdown.is_cancelled().then(|| SHUTDOWN_REASON.to_string())
                }) as runtime::StopFuture
            })
        };
        let published = streams.clone();
        let publish: runtime::DeltaSink =
            Arc::new(move |id, seq, text| published.publish(id, seq, text));
        let inboxes: Arc<Inboxes> = Arc::default();
        let runner = service
            .runner()
            .with_stop(stop)
            .with_call_cap(config.max_parallel_calls)
            .with_deltas(publish)
            .with_inboxes(inboxes.clone());
        let most_turns = config.max_running_turns;
        Daemon {
            files: FileBudget {
                limit: runtime::control::open_file_limit(),
                calls: config.max_parallel_calls as u64,
                admitting: Default::default(),
            },
            bearer: token::Expected::new(&config.token),
            sign_ins: Arc::default(),
            scheduler: Scheduler {
                runner,
                locks: Mutex::default(),
                pause_requests,
                listening,
                turns: TaskTracker::new(),
                inboxes,
                hot: Mutex::default(),
            },
            streams,
            service,
            config,
            metrics,
            statuses: Statuses::default(),
            schedules: schedules::Schedules::default(),
            owners: Mutex::default(),
            fair: Arc::new(fair::FairShare::new(most_turns)),
            shutdown,
            heads,
        }
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Admits one more turn asked for through the API if what it and the
    /// turns under way may open fits under the open-file limit beside the
    /// files open now (see [`fits_one_more_turn`]); else why not. Hold the
    /// answer until the turn's task is spawned. Turns the daemon starts on
    /// its own (recovery, a takeover, an expired approval, a message that
    /// waited) are not refused, and are counted.
    pub(crate) fn admit_turn(&self) -> Result<Admitted<'_>, String> {
        use std::sync::atomic::Ordering;
        let Some(limit) = self.files.limit else {
            return Ok(Admitted(None));
        };
        let admitting = &self.files.admitting;
        let others = admitting.fetch_add(1, Ordering::SeqCst);
        let admitted = Admitted(Some(admitting));
        // Turns waiting for their place (the fair share) hold no files.
        let (_, queued) = self.fair.counts();
        let tasks = (self.scheduler.turns.len() as u64).saturating_sub(queued as u64);
        let turns = tasks + others;
        let open = runtime::control::open_files();
        fits_one_more_turn(limit, open, turns, self.files.calls)?;
        Ok(admitted)
    }

    /// Asks the turn of `id` that another process sharing the store runs
    /// (a daemon or the CLI) to pause; see [`pause_asked`]. Returns the
    /// owner, or None if no turn runs anywhere.
    pub(crate) async fn ask_pause_elsewhere(
        &self,
        id: Uuid,
    ) -> Result<Option<String>, RuntimeError> {
        Ok(pause_asked(self.service.log().as_ref(), id).await?)
    }

    /// Pauses the turn of `id` another daemon runs, if any, and waits until
    /// it stopped (its lease released or lapsed), up to half a minute.
    pub(crate) async fn wait_for_turn_elsewhere(&self, id: Uuid) -> Result<(), RuntimeError> {
        let Some(owner) = self.ask_pause_elsewhere(id).await? else {
            return Ok(());
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.service.log().leases().lease(id).await?.is_some() {
            if std::time::Instant::now() > deadline {
                return Err(RuntimeError::InvalidRequest {
                    session: id,
                    reason: format!("its turn on {owner} did not stop within 30 s"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Takes `id`'s lease for this daemon (for a turn, a cancel, clearing
    /// a lapsed lease). A lease held by a process of this host that has
    /// exited (a predecessor killed before its restart) is taken over at
    /// once, fenced by a new token, rather than waited out.
    pub(crate) async fn hold(&self, id: Uuid) -> Result<HeldLease, eventlog::LogError> {
        let log = self.service.log().clone();
        let (owner, ttl) = (&self.config.owner, self.config.lease_ttl);
        HeldLease::acquire_taking_over_exited(log, id, owner, ttl).await
    }

    /// Runs one turn of `id` to its end, once `lock` (the session's, from
    /// [`Daemon::lock_for`]) is ours: one turn per session at a time.
    async fn turn(
        self: Arc<Self>,
        id: Uuid,
        start: TurnStart,
        lock: Arc<tokio::sync::Mutex<()>>,
    ) -> Result<TurnEnd, RuntimeError> {
        // Its place among the daemon's turns, its tenant's share, before
        // the session is its: a turn waiting for a place holds nothing a
        // person's pause or cancel of the session waits for.
        let (whose, limits) = self.share_of(id).await;
        let most = limits.max_running_turns.map_or(usize::MAX, |n| n as usize);
        let _place = self.fair.place(whose, most).await;
        let _turn = lock.lock().await;
        // Refused while another process runs it (a message's poster hears
        // of it from the turn's end).
        let lease = self.hold(id).await?;
        self.scheduler.listening.start(id, lease.token());
        self.scheduler.inboxes.open(id);
        let result = self.clone().turn_locked(id, start).await;
        // Normally the turn took everything posted to it already.
        self.scheduler.inboxes.close(
            id,
            "the turn ended before it could record the message: post it again",
        );
        self.scheduler.listening.stop(id);
        // A pause asked for during the turn's last step has nothing to pause.
        self.scheduler.withdraw_pause(id);
        match &result {
            // Interrupted (a shutdown, an error): the lease lapses on drop
            // and whichever daemon looks next takes the session over.
            Ok(TurnEnd::Paused(reason)) if reason == SHUTDOWN_REASON => lease.lapse().await,
            Err(_) => lease.lapse().await,
            Ok(_) => lease.release().await,
        }
        result
    }

    async fn turn_locked(
        self: Arc<Self>,
        id: Uuid,
        start: TurnStart,
    ) -> Result<TurnEnd, RuntimeError> {
        let hot = self.scheduler.hot.lock().expect("hot sessions").take(id);
        // Adopting other tools changes the spec: the hot copy will not do.
        let refresh = matches!(
            start,
            TurnStart::Message {
                refresh_tools: Some(_),
                ..
            }
        );
        let (mut session, mut parts) = match hot {
            Some(hot) if !refresh && hot.session.is_current().await? => (hot.session, hot.parts),
            _ => {
                let mut session = self.service.load(id).await?;
                let parts = Arc::new(self.scheduler.runner.parts(&mut session).await?);
                (session, parts)
            }
        };
        let recovering = matches!(start, TurnStart::Recover { .. });
        if recovering && runtime::control::was_interrupted(&Summary::of(session.state())) {
            self.metrics.recovered();
        }
        let opened = self.service.open_turn(&mut session, start).await?;
        if refresh {
            // Built again from the tools the session adopted.
            parts = Arc::new(self.scheduler.runner.parts(&mut session).await?);
        }
        if let Opened::Ended(end) = opened {
            self.statuses.saw(id, session.state());
            self.scheduler
                .hot
                .lock()
                .expect("hot sessions")
                .put(id, session, parts);
            return Ok(end);
        }
        self.statuses.saw(id, session.state());
        let mut end = self.scheduler.runner.drive_with(&mut session, &parts).await;
        // Messages posted as the turn ended are recorded before its inbox
        // closes: later ones start turns of their own.
        while end.is_ok() && !self.scheduler.inboxes.close_if_empty(id) {
            if let Err(e) = self.scheduler.runner.take_messages(&mut session).await {
                end = Err(e);
            }
        }
        // The turn is answered and messages wait: they get a turn of their
        // own (after this one lets go of the session).
        if end.is_ok() && replay::plan(session.state()).next == replay::NextStep::Deliver {
            self.spawn_turn(id, TurnStart::Deliver);
        }
        self.statuses.saw(id, session.state());
        self.scheduler
            .hot
            .lock()
            .expect("hot sessions")
            .put(id, session, parts);
        end
    }

    /// Starts a turn in the background, tracked: a shutdown waits for it.
    pub(crate) fn spawn_turn(
        self: &Arc<Self>,
        id: Uuid,
        start: TurnStart,
    ) -> tokio::task::JoinHandle<Result<TurnEnd, RuntimeError>> {
        let daemon = self.clone();
        // Taken now, so the turns of a session are counted from the moment
        // they are asked for (see `Daemon::turns_of`).
        let lock = self.scheduler.lock_for(id);
        self.scheduler.turns.spawn(async move {
            let result = daemon.clone().turn(id, start, lock).await;
            match &result {
                // Another daemon runs it: nothing went wrong here.
                Err(RuntimeError::Log(eventlog::LogError::LeaseHeld { .. })) => {}
                Err(e) if e.to_string().contains(&id.to_string()) => {
                    runtime::warn_line!("mneme serve: {e}")
                }
                Err(e) => runtime::warn_line!("mneme serve: session {id}: {e}"),
                Ok(_) => {}
            }
            result
        })
    }

    /// [`Daemon::spawn_turn`], as a turn to await (or not: it runs anyway).
    pub(crate) fn run_turn(self: &Arc<Self>, id: Uuid, start: TurnStart) -> TurnTask {
        let task = self.spawn_turn(id, start);
        Box::pin(async move {
            task.await
                .map_err(|e| RuntimeError::Daemon(format!("the turn's task failed: {e}")))?
        })
    }

    /// The operations on this daemon's sessions, their turns scheduled here.
    pub(crate) fn control(self: &Arc<Self>) -> Control<Scheduled> {
        Control::new(self.service.clone(), Scheduled(self.clone()))
    }

    /// The service acting for `caller`: what it creates is its tenant's.
    pub(crate) fn service_for(&self, caller: &tenancy::Caller) -> Service {
        match caller {
            tenancy::Caller::Operator => self.service.clone(),
            tenancy::Caller::Tenant(tenant) => self.service.for_tenant(Some((**tenant).clone())),
        }
    }

    /// Folds every session once to learn its status, and resumes those that
    /// were running when the last process died (or paused by a shutdown).
    async fn recover(self: Arc<Self>) {
        let listing = match self.service.listing().await {
            Ok(listing) => listing,
            Err(e) => {
                return runtime::warn_line!("mneme serve: recovery could not list sessions: {e}")
            }
        };
        let mut recovered = 0;
        for (meta, summary) in listing {
            let summary = match summary {
                Ok(summary) => summary,
                Err(e) => {
                    runtime::warn_line!("mneme serve: session {} not recovered: {e}", meta.session);
                    continue;
                }
            };
            self.statuses.saw_summary(meta.session, &summary);
            if self.resumes_on_its_own(meta.session, &summary).await {
                recovered += 1;
                self.spawn_turn(
                    meta.session,
                    TurnStart::Recover {
                        by: "daemon recovery",
                    },
                );
            }
        }
        runtime::log_line!("mneme serve: recovery found {recovered} interrupted sessions");
        // Recovery folded every session whose summary was stale: give back
        // what that took.
        memory::release_free();
    }

    /// Every half lease (at most a second): resumes the sessions whose leases lapsed (their
    /// daemon died or was cut off) and that were interrupted mid-turn; clears
    /// lapsed leases of sessions at rest, and of sessions the store does not
    /// hold (earlier versions took leases for those), once and quietly.
    /// Erases, from now on and about every tenth of `window` (at most
    /// hourly), the sessions idle longer than `window`.
    async fn retain(self: Arc<Self>, window: Duration) {
        let every = (window / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600));
        let reason = format!(
            "retention: idle longer than {}",
            runtime::text::window(window)
        );
        loop {
            let since = runtime::text::now_ms() - window.as_millis() as i64;
            match self.service.idle_since(since).await {
                Ok(idle) => {
                    for id in idle {
                        if self.is_shutting_down() || self.scheduler.is_running(id) {
                            continue;
                        }
                        match api::erase(&self, id, &reason, "mneme retention").await {
                            Ok(()) => {
                                runtime::log_line!("mneme serve: erased session {id} ({reason})")
                            }
                            Err(e) => runtime::warn_line!(
                                "mneme serve: cannot erase session {id}: {}",
                                e.1
                            ),
                        }
                    }
                }
                Err(e) => runtime::warn_line!("mneme serve: cannot look for idle sessions: {e}"),
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    }

    /// Every [`LOOK_FOR_DUE`]: each schedule records and starts its due
    /// ticks ([`Daemon::fire_schedules`]); each session whose wait for
    /// approval passed its deadline, or whose sleeping call's time came,
    /// gets a turn that denies the call as expired or wakes it, and goes on
    /// (`TurnStart::Expire`). A wake due while no daemon ran fires once,
    /// late, when one starts. Deadlines are noted by this daemon's turns
    /// and decisions, read at recovery, and read again from every
    /// session's summary every [`READ_APPROVAL_DEADLINES`] (for those other
    /// daemons sharing the store recorded).
    async fn fire_deadlines(self: Arc<Self>) {
        let mut read_at = tokio::time::Instant::now();
        let mut looked_for_schedules = None::<tokio::time::Instant>;
        let mut look_for_schedules = LOOK_FOR_SCHEDULES;
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(LOOK_FOR_DUE) => {}
            }
            self.scheduler.forget_idle_locks();
            let discover = looked_for_schedules.is_none_or(|at| at.elapsed() >= look_for_schedules);
            if discover {
                looked_for_schedules = Some(tokio::time::Instant::now());
            }
            if let Some(took) = self.fire_schedules(discover).await {
                look_for_schedules = next_look_for_schedules(took);
            }
            if read_at.elapsed() >= READ_APPROVAL_DEADLINES {
                read_at = tokio::time::Instant::now();
                // And once a minute, what large turns and reads freed.
                memory::release_free();
                match self.service.listing().await {
                    Ok(listing) => {
                        let read = listing.into_iter().filter_map(|(meta, summary)| {
                            Some((meta.session, summary.ok()?.next_deadline_ms()?))
                        });
                        self.statuses.read_deadlines(read);
                    }
                    Err(e) => runtime::warn_line!(
                        "mneme serve: cannot read the deadlines of approvals: {e}"
                    ),
                }
            }
            let now = runtime::text::now_ms();
            for id in self.statuses.due(now) {
                if self.is_shutting_down() || self.scheduler.is_running(id) {
                    continue;
                }
                self.statuses.forget_deadline(id);
                self.spawn_turn(id, TurnStart::Expire);
            }
        }
    }

    /// Forgets every copy of session `id`'s state this daemon keeps.
    pub(crate) fn forget(&self, id: Uuid) {
        self.scheduler.hot.lock().expect("hot sessions").take(id);
    }

    async fn take_over_lapsed(self: Arc<Self>) {
        let every = (self.config.lease_ttl / 2).min(LOOK_FOR_LAPSED_LEASES);
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let lapsed = match self.service.log().leases().expired_leases().await {
                Ok(lapsed) => lapsed,
                Err(e) => {
                    runtime::warn_line!("mneme serve: cannot list lapsed leases: {e}");
                    continue;
                }
            };
            for lease in lapsed {
                let id = lease.session;
                if self.is_shutting_down() || self.scheduler.is_running(id) {
                    continue;
                }
                match self.needs_takeover(id).await {
                    Ok(true) => {
                        runtime::log_line!(
                            "mneme serve: taking over session {id} from {}",
                            lease.owner
                        );
                        self.spawn_turn(
                            id,
                            TurnStart::Recover {
                                by: "lease takeover",
                            },
                        );
                    }
                    // Nothing to resume: clear the lapsed lease, unless a
                    // turn of this daemon is starting (it holds the
                    // session's lock). Look again under the lease: a turn
                    // elsewhere may have been interrupted meanwhile, and then
                    // the lease must lapse (the next look resumes the
                    // session), not be released.
                    Ok(false) => {
                        let lock = self.scheduler.lock_for(id);
                        let Ok(_turn) = lock.try_lock() else { continue };
                        let Ok(lease) = self.hold(id).await else {
                            continue;
                        };
                        if matches!(self.needs_takeover(id).await, Ok(false)) {
                            lease.release().await;
                        }
                    }
                    Err(e) => runtime::warn_line!("mneme serve: session {id} not taken over: {e}"),
                }
            }
        }
    }

    /// Whether whoever takes over `id`'s lapsed lease must resume it: it was
    /// interrupted mid-turn. False for a session at rest, and for one the
    /// store does not hold.
    async fn needs_takeover(&self, id: Uuid) -> Result<bool, RuntimeError> {
        if !self.service.exists(id).await? {
            return Ok(false);
        }
        Ok(self
            .resumes_on_its_own(id, &self.service.current_summary(id).await?)
            .await)
    }

    /// Whether whoever finds session `id` (with `summary`) must resume it:
    /// it was interrupted mid-turn, and no import of it is unfinished.
    async fn resumes_on_its_own(&self, id: Uuid, summary: &Summary) -> bool {
        let log = self.service.log().as_ref();
        runtime::control::was_interrupted(summary)
            && !runtime::store::importing(log, id).await.unwrap_or(true)
    }

    /// Stops taking turns, lets running ones pause at a step boundary, and
    /// waits for them up to what is `left` of the grace period.
    async fn drain(&self, left: Duration) {
        self.shutdown.cancel();
        self.scheduler.turns.close();
        if tokio::time::timeout(left, self.scheduler.turns.wait())
            .await
            .is_err()
        {
            runtime::warn_line!(
                "mneme serve: {} turns still running after {:?}; their calls resume on the next start",
                self.scheduler.turns.len(),
                self.config.shutdown_grace
            );
        }
    }
}

/// How the daemon runs its sessions' turns for [`Control`]: each as a task
/// of its own, one per session at a time, under the session's turn lock
/// and lease (see [`Daemon::spawn_turn`]).
pub(crate) struct Scheduled(Arc<Daemon>);

#[async_trait::async_trait]
impl Turns for Scheduled {
    async fn hold(&self, id: Uuid) -> Result<Hold, RuntimeError> {
        let guard = self.0.scheduler.lock_for(id).lock_owned().await;
        let lease = self.0.hold(id).await?;
        // No turn runs: a pause asked of one has nothing to pause.
        self.0.scheduler.withdraw_pause(id);
        Ok(Hold::new(lease, Some(Box::new(guard))))
    }

    async fn stop(&self, id: Uuid) -> Result<(), RuntimeError> {
        if !self.0.scheduler.request_pause(id) {
            self.0.wait_for_turn_elsewhere(id).await?;
        }
        Ok(())
    }

    fn run(&self, id: Uuid, start: TurnStart) -> TurnTask {
        self.0.run_turn(id, start)
    }

    fn changed(&self, session: &runtime::Session) {
        self.0.statuses.saw(session.id(), session.state());
    }
}

/// Runs the daemon on `log` until SIGTERM or ctrl-c; returns after a clean
/// shutdown.
pub async fn serve(log: Arc<dyn EventLog>, config: DaemonConfig) -> Result<(), RuntimeError> {
    let public = !config.listen.ip().to_canonical().is_loopback();
    if public && !config.allow_public {
        return Err(RuntimeError::Daemon(format!(
            "--listen {}: other hosts can reach this address, and the API is plain HTTP (its token and sessions would cross the network unencrypted); listen on loopback behind a TLS proxy, or pass --allow-public to serve it anyway",
            config.listen
        )));
    }
    let metrics = Arc::new(Metrics::new());
    let heads = Arc::new(DurableHeads::new());
    let streams = Arc::new(Streams::new());
    let service = Service::new(log, config.durability)
        .snapshot_every(config.snapshot_every)
        .signed_by(config.signer.clone())
        .traced_by(config.tracer.clone())
        .observed_by(Arc::new(heads::Observers(vec![
            metrics.clone(),
            heads.clone(),
            streams.clone(),
        ])));
    let parts = (heads, streams);
    let daemon = Arc::new(Daemon::new(service, config.clone(), metrics, parts));
    let cannot_listen = |source| RuntimeError::Listen {
        addr: config.listen,
        source,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(cannot_listen)?;
    let addr = listener.local_addr().map_err(cannot_listen)?;
    let limits = http::Limits {
        header_timeout: config.header_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: http::connection_cap(config.max_connections)?,
    };
    // Handled before anyone is told where the daemon listens: a SIGTERM
    // sent as soon as it answers is a shutdown, not a kill.
    let signals = ShutdownSignals::install();
    write_daemon_file(&config, addr);
    runtime::log_line!("mneme serve: listening on http://{addr}");
    if public {
        runtime::warn_line!("mneme serve: WARNING: --allow-public: the API is plain HTTP (no TLS) and reachable from the network on {addr}; its bearer token and every session cross it unencrypted. Put a TLS proxy in front of it, or keep it to a network you trust.");
    }
    tokio::spawn(daemon.clone().recover());
    tokio::spawn(daemon.clone().take_over_lapsed());
    tokio::spawn(daemon.clone().fire_deadlines());
    if let Some(window) = config.retain {
        tokio::spawn(daemon.clone().retain(window));
    }
    follow_other_daemons(&daemon);
    let app = api::router(daemon.clone(), daemon.shutdown.clone());
    let shutdown = daemon.shutdown.clone();
    tokio::spawn(async move {
        signals.wait().await;
        runtime::log_line!("mneme serve: shutting down");
        // Turns pause at their next step; live streams end; no new turns.
        shutdown.cancel();
    });
    // One deadline for the whole shutdown: open requests and running turns
    // share the grace period.
    let grace = config.shutdown_grace;
    let stopping_since = tokio::select! {
        () = http::serve(listener, app, limits, daemon.shutdown.clone()) => std::time::Instant::now(),
        since = async {
            daemon.shutdown.cancelled().await;
            let since = std::time::Instant::now();
            tokio::time::sleep(grace).await;
            since
        } => since,
    };
    daemon
        .drain(grace.saturating_sub(stopping_since.elapsed()))
        .await;
    let _ = std::fs::remove_file(config.data_dir.join(DAEMON_FILE));
    Ok(())
}

/// Live event streams follow sessions that other daemons sharing the
/// store run: their appends arrive as durable heads.
fn follow_other_daemons(daemon: &Arc<Daemon>) {
    let heads = daemon.heads.clone();
    daemon
        .service
        .log()
        .follow(Arc::new(move |session, seq| heads.announce(session, seq)));
}

/// Tells CLI processes where the daemon is and where its token lives. The
/// file appears whole (written aside, then renamed), so a CLI never reads
/// half of it.
fn write_daemon_file(config: &DaemonConfig, addr: SocketAddr) {
    let note = serde_json::json!({
        "addr": addr.to_string(),
        "pid": std::process::id(),
        "token_file": config.token_file,
    });
    let aside = config
        .data_dir
        .join(format!("{DAEMON_FILE}.{}", std::process::id()));
    if std::fs::write(&aside, note.to_string()).is_ok() {
        let _ = std::fs::rename(&aside, config.data_dir.join(DAEMON_FILE));
    }
}

/// SIGTERM and SIGINT (ctrl-c), handled from when they are installed.
struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> ShutdownSignals {
        use tokio::signal::unix::{signal, SignalKind};
        ShutdownSignals {
            term: signal(SignalKind::terminate()).expect("SIGTERM handler installs"),
            interrupt: signal(SignalKind::interrupt()).expect("SIGINT handler installs"),
        }
    }

    /// Until either arrives.
    async fn wait(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_for_schedules_are_spaced_by_what_a_look_costs() {
        // A small store is looked at every second.
        let quick = next_look_for_schedules(Duration::from_millis(8));
        assert_eq!(quick, LOOK_FOR_SCHEDULES);
        // A look of 80 ms (about 100,000 sessions) waits 4 s, one of 800 ms
        // 40 s: at most a fiftieth of the time goes to looking.
        let slow = next_look_for_schedules(Duration::from_millis(80));
        assert_eq!(slow, Duration::from_secs(4));
        let slower = next_look_for_schedules(Duration::from_millis(800));
        assert_eq!(slower, Duration::from_secs(40));
    }

    #[test]
    fn a_turn_fits_while_what_turns_may_open_and_the_spare_fit() {
        // 256 files: 16 kept free; 40 open; each turn 2, each call at once 3.
        assert!(fits_one_more_turn(256, Some(40), 0, 64).is_ok());
        // 40 turns and this one: 82 + 123 = 205 more, 245 + 16 > 256.
        assert!(fits_one_more_turn(256, Some(40), 40, 64).is_err());
        // 39 and this one: 80 + 120 = 200 more, 240 + 16 = 256.
        assert!(fits_one_more_turn(256, Some(40), 39, 64).is_ok());
        // Calls at once are capped across the daemon: past the cap a turn
        // costs only its model request.
        assert!(fits_one_more_turn(1024, Some(100), 300, 64).is_ok());
        assert!(fits_one_more_turn(1024, Some(100), 300, 1024).is_err());
    }

    #[test]
    fn a_refusal_says_how_near_the_limit_and_why() {
        let said = fits_one_more_turn(256, Some(250), 0, 64).unwrap_err();
        assert!(
            said.starts_with("the daemon is near its open-file limit (255 of 256): 250 files are open, 5 more may be opened by the turns under way and this one (1 of them"),
            "{said}"
        );
        assert!(
            said.contains("16 are kept free") && said.contains("ulimit -n"),
            "{said}"
        );
        let said = fits_one_more_turn(256, None, 0, 64).unwrap_err();
        assert!(
            said.contains("(? of 256): it cannot list its open files"),
            "{said}"
        );
    }

    #[test]
    fn the_spare_is_a_sixteenth_of_the_limit_and_at_least_16() {
        assert_eq!(spare_files(64), 16);
        assert_eq!(spare_files(256), 16);
        assert_eq!(spare_files(1024), 64);
    }
}
