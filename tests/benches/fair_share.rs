//! Fair share among tenants: one tenant's turn latency while another
//! floods the daemon with 200 turns, against its latency alone.
//!
//! A daemon with `--max-running-turns 8` and a model that answers each
//! request after 50 ms. Tenant B runs 20 turns one after another, alone;
//! then tenant A asks for 200 turns at once (each its own session) and B
//! runs its 20 again while A's wait. Twice: A held to 4 running turns
//! (`max_running_turns = 4`), and A with no limit of its own (the round
//! alone: each free place goes to the next tenant that waits, so B waits
//! for at most one of A's turns to end). Prints each median and 95th
//! percentile, and the ratio of the medians (the claim: within 2x).
//!
//! Run: `cargo build -p mneme && cargo bench -p mneme-e2e --bench fair_share`.

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::slow::SlowModel;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const FLOOD: usize = 200;
const TURNS: usize = 20;
const DELAY: Duration = Duration::from_millis(100);

/// A tenant's client.
struct Tenant {
    http: reqwest::Client,
    base: String,
}

impl Tenant {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let response = self.http.post(url).json(body).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// A new session with its first message; its id.
    async fn session(&self) -> String {
        let first = json!({"agent": "helper", "first_message": "go"});
        let (status, created) = self.post("/sessions", &first).await;
        assert_eq!(status, 201, "{created}");
        created["session"].as_str().unwrap().to_string()
    }

    /// Runs the first turn of `id` to its end: how long it took.
    async fn turn(&self, id: &str) -> Duration {
        let started = Instant::now();
        let (status, end) = self
            .post(&format!("/sessions/{id}/resume"), &json!({"wait": true}))
            .await;
        assert_eq!(
            (status, end["answer"].as_str()),
            (200, Some("Done.")),
            "{end}"
        );
        started.elapsed()
    }
}

/// The median and 95th percentile of `times`, in milliseconds.
fn percentiles(mut times: Vec<Duration>) -> (f64, f64) {
    times.sort();
    let at = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;
    (at(0.5), at(0.95))
}

/// B's turns, one after another, up to [`TURNS`] (while `daemon` has
/// turns waiting, if `flooded`): their latencies.
async fn b_turns(b: &Tenant, daemon: &DaemonProcess, flooded: bool) -> Vec<Duration> {
    let mut times = Vec::with_capacity(TURNS);
    for _ in 0..TURNS {
        if flooded && queued(daemon).await == 0 {
            break;
        }
        let id = b.session().await;
        times.push(b.turn(&id).await);
    }
    times
}

/// Turns waiting for their place in `daemon`.
async fn queued(daemon: &DaemonProcess) -> u64 {
    daemon.metric("mneme_turns_queued").await
}

/// One run: a daemon, tenant A with `a_limit` running turns (or none),
/// tenant B. Prints B's latencies alone and under A's flood.
async fn run(a_limit: Option<u64>) -> f64 {
    let model = SlowModel::start(DELAY).await;
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    for tenant in ["a", "b"] {
        std::fs::create_dir_all(agents.join(tenant)).unwrap();
        let agent = format!(
            "name = \"helper\"\n[model]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_secs = 60\n",
            model.base_url()
        );
        std::fs::write(agents.join(tenant).join("helper.toml"), agent).unwrap();
    }
    let data = dir.path().join("data");
    let args = [
        "--agents",
        agents.to_str().unwrap(),
        "--max-running-turns",
        "8",
        "--durability",
        "flushed",
    ];
    let daemon = DaemonProcess::start(&data, &args).await;
    let mut tenants = Vec::new();
    for (name, limit) in [("a", a_limit), ("b", None)] {
        let (status, added) = daemon
            .post(
                "/tenants",
                &json!({"name": name, "max_running_turns": limit}),
            )
            .await;
        assert_eq!(status, 201, "{added}");
        tenants.push(Tenant {
            http: daemon.client_with(added["token"].as_str().unwrap()),
            base: daemon.base.clone(),
        });
    }
    let (a, b) = (&tenants[0], &tenants[1]);
    let alone = percentiles(b_turns(b, &daemon, false).await);
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        flood.push(a.session().await);
    }
    let asked = Instant::now();
    let resumes = flood
        .iter()
        .map(|id| async move { a.post(&format!("/sessions/{id}/resume"), &json!({})).await });
    for (status, body) in futures_util::future::join_all(resumes).await {
        assert_eq!(status, 202, "{body}");
    }
    let during = b_turns(b, &daemon, true).await;
    let measured = during.len();
    let waiting = queued(&daemon).await;
    let flooded = percentiles(during);
    let ratio = flooded.0 / alone.0;
    let limit = a_limit.map_or("no limit of its own".to_string(), |n| {
        format!("max_running_turns = {n}")
    });
    println!(
        "fair share (A: {limit}; the daemon: 8 at once; the model: {} ms a request): B's turn alone p50 {:.1} ms, p95 {:.1} ms ({TURNS} turns); while A's {FLOOD} turns waited ({measured} of B's turns in {:.1} s, every one started with A's turns waiting; {waiting} still waiting after), p50 {:.1} ms, p95 {:.1} ms; ratio of medians {ratio:.2} ({})",
        DELAY.as_millis(),
        alone.0,
        alone.1,
        asked.elapsed().as_secs_f64(),
        flooded.0,
        flooded.1,
        if ratio <= 2.0 { "within 2x" } else { "past 2x" },
    );
    daemon.terminate().await;
    ratio
}

fn main() {
    // The debug build: the figures are ratios of latencies, not speeds.
    mneme_e2e::bench::built_mneme("debug");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        run(Some(4)).await;
        run(None).await;
    });
}
