//! The daemon's HTTP server: an accept loop over hyper that bounds what a
//! client can hold.
//!
//! A request head must arrive within the header timeout, counted from the
//! connection's start for its first request and from the first byte of
//! each later one; between requests a keep-alive connection may wait up to
//! the idle timeout. (hyper's own `header_read_timeout` also runs while a
//! keep-alive connection waits, so it cannot tell the two apart.) At most
//! `max_connections` are open: at the cap, the connection quiet the longest
//! (no request under way: a slow head, an idle keep-alive) is closed to
//! admit the new one, so slow clients cannot lock others out; connections
//! with a request under way (a long poll, a live stream) are never closed,
//! and while every one is busy a new connection is refused. Reaching the
//! cap is said on stderr, at most once a minute.

use axum::body::{Body, Bytes};
use axum::Router;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use runtime::RuntimeError;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a client may hold of the daemon.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// How long a request head may take to arrive.
    pub(crate) header_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub(crate) idle_timeout: Duration,
    /// Connections open at most (see [`connection_cap`]).
    pub(crate) max_connections: usize,
}

/// The shortest time between two reports of the cap, or of failing accepts.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// Serves `app` on `listener` within `limits` until `stop` is cancelled; then
/// stops accepting, lets the requests under way finish (live streams end on
/// `stop` too), closes the connections waiting for a request and returns
/// once every connection is closed.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let connections = Arc::new(Connections::new(limits.max_connections));
    let mut accept_failed = Every::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // The client gave up before its connection was accepted.
            Err(e) if is_the_clients(&e) => continue,
            // Out of files or memory: wait a little rather than spin.
            Err(e) => {
                if accept_failed.due() {
                    runtime::warn_line!("mneme serve: cannot accept connections: {e}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some((number, connection)) = connections.admit() else {
            refuse(&stream, limits.max_connections);
            continue;
        };
        tokio::spawn(serve_connection(
            connections.clone(),
            number,
            connection,
            stream,
            app.clone(),
            limits,
            stop.clone(),
        ));
    }
    drop(listener);
    connections.all_closed().await;
}

/// Whether an accept failed because of the client, not of this process.
fn is_the_clients(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
    )
}

/// Tells a connection over the cap, while every open one is busy, to come
/// back later, as far as its socket takes the answer at once; then closes it.
fn refuse(stream: &TcpStream, cap: usize) {
    let body = format!(
        "{{\"error\":\"all {cap} connections of this daemon are busy with requests under way (--max-connections); try again later\"}}"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}

/// Runs one connection until it ends, is closed by a timeout or for a newer
/// connection, or a shutdown lets its last request finish.
async fn serve_connection(
    connections: Arc<Connections>,
    number: u64,
    connection: Arc<Connection>,
    stream: TcpStream,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let io = hyper_util::rt::TokioIo::new(Watched {
        stream,
        connection: connection.clone(),
    });
    let service = Tracked {
        app,
        connection: connection.clone(),
    };
    let served = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    tokio::pin!(served);
    let mut stopping = false;
    loop {
        let deadline = connection.deadline(&limits);
        tokio::select! {
            _ = served.as_mut() => break,
            () = until(deadline) => {
                if connection.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    break;
                }
            }
            () = connection.changed.notified() => {}
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                served.as_mut().graceful_shutdown();
                if connection.is_quiet() {
                    break;
                }
            }
        }
    }
    connections.remove(number);
}

/// Sleeps until `deadline`, or forever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The open connections, by number.
struct Connections {
    open: Mutex<Open>,
    cap: usize,
    /// Wakes a shutdown waiting for the last connection to close.
    none_open: Notify,
    report: Mutex<CapReport>,
}

#[derive(Default)]
struct Open {
    by_number: HashMap<u64, Arc<Connection>>,
    next: u64,
}

/// What happened at the cap since it was last reported, each kind on its
/// own line at most once a minute: an eviction never hides a refusal.
#[derive(Default)]
struct CapReport {
    closed: Tally,
    refused: Tally,
}

/// Events of one kind since their last report.
#[derive(Default)]
struct Tally {
    every: Every,
    count: u64,
}

impl Tally {
    /// Counts one; the count to report (and starts again) when a report is due.
    fn count(&mut self) -> Option<u64> {
        self.count += 1;
        if !self.every.due() {
            return None;
        }
        Some(std::mem::take(&mut self.count))
    }
}

impl Connections {
    fn new(cap: usize) -> Connections {
        Connections {
            open: Mutex::default(),
            cap,
            none_open: Notify::new(),
            report: Mutex::default(),
        }
    }

    /// Registers a new connection; at the cap, first closes the one quiet
    /// the longest. None if every open connection has a request under way.
    fn admit(&self) -> Option<(u64, Arc<Connection>)> {
        let mut open = self.open.lock().expect("connections");
        if open.by_number.len() >= self.cap {
            let closed = open.close_quiet_longest();
            self.reached_cap(closed);
            if !closed {
                return None;
            }
        }
        let number = open.next;
        open.next += 1;
        let connection = Arc::new(Connection::new());
        open.by_number.insert(number, connection.clone());
        Some((number, connection))
    }

    /// Counts what the cap did, and says so at most once a minute a kind.
    fn reached_cap(&self, closed: bool) {
        let mut report = self.report.lock().expect("cap report");
        let cap = self.cap;
        if closed {
            if let Some(n) = report.closed.count() {
                runtime::warn_line!(
                    "mneme serve: connection cap reached ({cap} open): closed the connection quiet the longest (a slow or idle client) to admit a new one; {n} since the last such line (at most one a minute; see --max-connections)"
                );
            }
        } else if let Some(n) = report.refused.count() {
            runtime::warn_line!(
                "mneme serve: connection cap reached ({cap} open) with every connection busy: refused a new one; {n} refused since the last such line (at most one a minute; see --max-connections)"
            );
        }
    }

    fn remove(&self, number: u64) {
        let mut open = self.open.lock().expect("connections");
        open.by_number.remove(&number);
        if open.by_number.is_empty() {
            self.none_open.notify_waiters();
        }
    }

    async fn all_closed(&self) {
        loop {
            let closed = self.none_open.notified();
            if self.open.lock().expect("connections").by_number.is_empty() {
                return;
            }
            closed.await;
        }
    }
}

impl Open {
    /// Closes the connection without a request under way that has been
    /// quiet the longest; false if there is none.
    fn close_quiet_longest(&mut self) -> bool {
        loop {
            let quiet_longest = self
                .by_number
                .iter()
                .filter_map(|(number, c)| Some((c.quiet_since()?, *number)))
                .min();
            let Some((_, number)) = quiet_longest else {
                return false;
            };
            let connection = self.by_number.remove(&number).expect("listed");
            // A request may have started meanwhile: then look again.
            if connection.evict() {
                return true;
            }
            self.by_number.insert(number, connection);
        }
    }
}

/// One client connection, as the limits see it.
struct Connection {
    state: Mutex<State>,
    /// Wakes the connection's task: its deadline moved, or it was evicted.
    changed: Notify,
}

struct State {
    /// Requests under way, from their head to the end of their response.
    under_way: usize,
    /// Since when no request has been under way: the connection's start,
    /// or the end of its last response.
    quiet_since: Instant,
    /// When the head of the next request began to arrive (for the first
    /// request, the connection's start).
    head_since: Option<Instant>,
    /// Closed to admit a newer connection.
    evicted: bool,
}

impl Connection {
    fn new() -> Connection {
        let now = Instant::now();
        Connection {
            state: Mutex::new(State {
                under_way: 0,
                quiet_since: now,
                head_since: Some(now),
                evicted: false,
            }),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("connection state")
    }

    /// When to close the connection if nothing changes; None while a
    /// request is under way, even on an evicted connection (a request that
    /// started as it was evicted is answered, then the connection closes:
    /// a handler that ran is never left without its response).
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        let state = self.state();
        if state.under_way > 0 {
            return None;
        }
        if state.evicted {
            return Some(state.quiet_since);
        }
        Some(match state.head_since {
            Some(since) => since + limits.header_timeout,
            None => state.quiet_since + limits.idle_timeout,
        })
    }

    /// Since when the connection has had no request under way; None while
    /// one is.
    fn quiet_since(&self) -> Option<Instant> {
        let state = self.state();
        (state.under_way == 0 && !state.evicted).then_some(state.quiet_since)
    }

    fn is_quiet(&self) -> bool {
        self.quiet_since().is_some()
    }

    /// Closes the connection unless a request is under way; whether it did.
    fn evict(&self) -> bool {
        let mut state = self.state();
        if state.under_way > 0 {
            return false;
        }
        state.evicted = true;
        drop(state);
        self.changed.notify_one();
        true
    }

    /// Bytes came in: if no request is under way, the next one's head began.
    fn bytes_arrived(&self) {
        let mut state = self.state();
        if state.under_way == 0 && state.head_since.is_none() {
            state.head_since = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// A request's head arrived: the request is under way until the guard
    /// is dropped.
    fn request_started(self: &Arc<Connection>) -> UnderWay {
        let mut state = self.state();
        state.under_way += 1;
        state.head_since = None;
        UnderWay(self.clone())
    }
}

/// A request under way on its connection, for as long as this lives.
struct UnderWay(Arc<Connection>);

impl Drop for UnderWay {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.under_way -= 1;
        if state.under_way == 0 {
            state.quiet_since = Instant::now();
        }
        drop(state);
        self.0.changed.notify_one();
    }
}

/// A client's socket that tells its connection when bytes arrive.
struct Watched {
    stream: TcpStream,
    connection: Arc<Connection>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.connection.bytes_arrived();
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The routes, with each request counted as under way from its head until
/// its response body is done.
struct Tracked {
    app: Router,
    connection: Arc<Connection>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = hyper::Response<Counted>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let under_way = self.connection.request_started();
        let mut app = self.app.clone();
        Box::pin(async move {
            let response = tower_service::Service::call(&mut app, request).await?;
            Ok(response.map(|body| Counted {
                body,
                _under_way: under_way,
            }))
        })
    }
}

/// A response body that keeps its request under way until it is done.
struct Counted {
    body: Body,
    _under_way: UnderWay,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A report made at most once every [`REPORT_EVERY`].
#[derive(Default)]
struct Every {
    last: Option<Instant>,
}

impl Every {
    /// Whether a report is due now; if so, counts it as made.
    fn due(&mut self) -> bool {
        let due = self.last.is_none_or(|last| last.elapsed() >= REPORT_EVERY);
        if due {
            self.last = Some(Instant::now());
        }
        due
    }
}

/// Files kept free of connections for the log, the store's connections,
/// tools and model calls: an eighth of the limit, and at least 32.
fn reserved_files(limit: u64) -> u64 {
    (limit / 8).max(32)
}

/// The connections this process may hold: `asked`, lowered (and said so)
/// to what its open-file limit leaves beside the files open now and those
/// kept for everything else; an error if that is none.
pub(crate) fn connection_cap(asked: usize) -> Result<usize, RuntimeError> {
    let Some(limit) = runtime::control::open_file_limit() else {
        return Ok(asked);
    };
    let open = runtime::control::open_files().unwrap_or(0);
    let reserved = reserved_files(limit);
    let room = usize::try_from(limit.saturating_sub(open + reserved)).unwrap_or(usize::MAX);
    if room == 0 {
        return Err(RuntimeError::Daemon(format!(
            "the open-file limit (RLIMIT_NOFILE) is {limit}: with {open} files open and {reserved} kept for the log and tools, no connection fits; raise it (`ulimit -n`)"
        )));
    }
    if room < asked {
        runtime::warn_line!(
            "mneme serve: at most {room} connections (--max-connections {asked} lowered): the open-file limit (RLIMIT_NOFILE) is {limit}, {open} files are open and {reserved} are kept for the log and tools; raise it with `ulimit -n`"
        );
    }
    Ok(asked.min(room))
}
