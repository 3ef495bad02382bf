//! What this process opens toward others: one pool of HTTP connections to
//! model servers and HTTP tools, shared by every session, and what it can
//! tell of its open files.
//!
//! A `reqwest::Client` is a connection pool, keyed by scheme, host and
//! port. One client per session kept each session's last connection open
//! for reqwest's 90 s: under `nofile` 256 a daemon's 240th session failed
//! with EMFILE. Every model client of the process now takes its client
//! from [`client`]: one pool per connect timeout (the one setting that is
//! the client's and not the request's; a request's own timeout is set on
//! the request), each keeping at most [`MAX_IDLE_PER_HOST`] idle
//! connections to a server for at most [`IDLE_TIMEOUT`]. Everything else
//! is reqwest's default, as each session's client had it: redirects (at
//! most 10), proxies from the environment, TLS with rustls and its roots.
//! Connections in use are not bounded here: a daemon bounds the turns that
//! use them (its open-file budget).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Idle connections a pool keeps to one server (scheme, host and port).
pub(crate) const MAX_IDLE_PER_HOST: usize = 8;

/// How long an idle connection is kept before it is closed.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connect timeout of HTTP tools and checks, which share the pool of
/// that timeout (a call's own `timeout_secs` bounds it too).
pub(crate) const TOOL_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Pools kept, one per distinct connect timeout. Past it (specs naming
/// more distinct timeouts than that), a client gets a pool of its own,
/// bounded alike, that lives as long as it does.
const MOST_POOLS: usize = 16;

/// A pool and the runtime its connections are driven on.
struct Pool {
    client: reqwest::Client,
    /// A task on the runtime that built the pool, which never ends unless
    /// that runtime shuts down: then the connections it drove are gone,
    /// and the next caller gets a pool of its own runtime. None when built
    /// outside any runtime.
    runtime: Option<tokio::task::JoinHandle<()>>,
}

impl Pool {
    fn new(connect_timeout: Duration) -> Result<Pool, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .pool_max_idle_per_host(MAX_IDLE_PER_HOST)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .build()
            .map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .map(|runtime| runtime.spawn(std::future::pending()));
        Ok(Pool { client, runtime })
    }

    fn usable(&self) -> bool {
        self.runtime.as_ref().is_none_or(|task| !task.is_finished())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(task) = &self.runtime {
            task.abort();
        }
    }
}

/// The shared client for requests that connect within `connect_timeout`
/// (see the module's documentation). Set each request's own timeout with
/// `RequestBuilder::timeout`.
pub(crate) fn client(connect_timeout: Duration) -> Result<reqwest::Client, String> {
    static POOLS: OnceLock<Mutex<HashMap<Duration, Pool>>> = OnceLock::new();
    let mut pools = POOLS.get_or_init(Mutex::default).lock().expect("pools");
    pools.retain(|_, pool| pool.usable());
    if let Some(pool) = pools.get(&connect_timeout) {
        return Ok(pool.client.clone());
    }
    let pool = Pool::new(connect_timeout)?;
    let client = pool.client.clone();
    if pools.len() < MOST_POOLS {
        pools.insert(connect_timeout, pool);
    }
    Ok(client)
}

/// This process's soft limit of open files; None if unlimited or unknown.
pub fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one rlimit through a valid pointer.
    let failed = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0;
    (!failed && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Files this process has open now; None if that cannot be told (when no
/// file is left to list them with, say).
pub fn open_files() -> Option<u64> {
    let listing = std::fs::read_dir("/proc/self/fd")
        .or_else(|_| std::fs::read_dir("/dev/fd"))
        .ok()?;
    // The listing holds a descriptor of its own.
    Some(listing.count().saturating_sub(1) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether two clients share one pool: a connection one made and let
    /// go is the one the other's next request uses.
    async fn share_a_pool(a: &reqwest::Client, b: &reqwest::Client) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let mut accepted = 0;
            loop {
                let Ok(Ok((mut stream, _))) =
                    tokio::time::timeout(Duration::from_millis(200), listener.accept()).await
                else {
                    return accepted;
                };
                accepted += 1;
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut buffer).await {
                        if n == 0 {
                            break;
                        }
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        for client in [a, b] {
            let answer = client.get(&url).send().await.unwrap();
            assert_eq!(answer.text().await.unwrap(), "ok");
        }
        server.await.unwrap() == 1
    }

    #[tokio::test]
    async fn clients_of_one_connect_timeout_share_a_pool_others_do_not() {
        let one = client(Duration::from_secs(7)).unwrap();
        let again = client(Duration::from_secs(7)).unwrap();
        let other = client(Duration::from_secs(8)).unwrap();
        assert!(share_a_pool(&one, &again).await);
        assert!(!share_a_pool(&one, &other).await);
    }

    #[test]
    fn a_pool_of_a_runtime_that_shut_down_is_not_handed_out() {
        let first = tokio::runtime::Runtime::new().unwrap();
        let pool = first.block_on(async { Pool::new(Duration::from_secs(3)).unwrap() });
        assert!(pool.usable());
        drop(first);
        assert!(!pool.usable());
        assert!(Pool::new(Duration::from_secs(3)).unwrap().usable());
    }

    #[test]
    fn open_files_are_counted_under_the_limit() {
        // Other tests open files meanwhile: only the bounds are sure.
        let open = open_files().unwrap();
        assert!(open >= 1, "{open}");
        assert!(open_file_limit().is_none_or(|limit| open < limit));
    }
}
