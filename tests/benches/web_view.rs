//! The web view on a long session: what a session's page costs on a
//! 100,000-event session, against the same page on a 200-event session in
//! the same run (the ratio is the figure). Each request the page makes is
//! timed through the real daemon, then the whole page in headless Chromium
//! (sign-in to timeline drawn).
//!
//! Run: `cargo build --release --bin mneme && cargo bench -p mneme-e2e --bench web_view`
//! (`MNEME_BENCH_EVENTS` sets the long session's events, default 100000;
//! `MNEME_BENCH_DIR` the disk).

use eventlog::{Durability, EventLog, SledLog};
use mneme_e2e::bench::{
    bench_dir, bench_spec, block, built_mneme, daemon_address, new_event, to_new_event,
};
use mneme_e2e::browser::Browser;
use runtime::Session;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

const TOKEN: &str = "bench-token-0123456789";
const SHORT: usize = 200;
const RUNS: usize = 5;

/// A session of `events` events (a start, then the benchmark mix), with a
/// snapshot at its head as a session that ran would have.
fn fill(log: &Arc<dyn EventLog>, events: usize) -> Uuid {
    let id = Uuid::now_v7();
    let start = replay::Event::SessionStarted {
        spec: Box::new(bench_spec("http://127.0.0.1:9/v1", "http://127.0.0.1:9/x")),
        tenant: None,
    };
    block(log.append(id, 1, vec![to_new_event(&start)])).unwrap();
    let mut seq = 2;
    while seq <= events as u64 {
        let batch: Vec<_> = (seq..=(seq + 999).min(events as u64))
            .map(|s| new_event(s as usize))
            .collect();
        let n = batch.len() as u64;
        block(log.append(id, seq, batch)).unwrap();
        seq += n;
    }
    block(log.barrier(Durability::Synced)).unwrap();
    let session = block(Session::load(log.clone(), id)).unwrap();
    let head = block(log.head(id)).unwrap();
    block(runtime::store::store_snapshot(
        &**log,
        id,
        head.hash,
        session.state(),
    ))
    .unwrap();
    id
}

/// Starts `mneme serve` on `dir`; its child process and address.
fn serve(dir: &Path) -> (std::process::Child, String) {
    let child = std::process::Command::new(built_mneme("release"))
        .arg("--data-dir")
        .arg(dir)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("MNEME_TOKEN", TOKEN)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = daemon_address(dir);
    (child, format!("http://{addr}"))
}

/// The median of `RUNS` timings of `work`, in milliseconds.
fn median_ms(mut work: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            work();
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[RUNS / 2]
}

fn get(client: &reqwest::Client, url: &str) -> usize {
    block(async {
        let response = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
        assert!(
            response.status().is_success(),
            "{url}: {}",
            response.status()
        );
        response.bytes().await.unwrap().len()
    })
}

/// The requests a session's page makes, each timed: (what, ms).
fn page_requests(
    client: &reqwest::Client,
    base: &str,
    id: Uuid,
    events: usize,
) -> Vec<(String, f64)> {
    let last_page = format!("events?after={}&until={events}", events.saturating_sub(200));
    [
        "".to_string(),
        "/verify".into(),
        "/replay".into(),
        format!("/{last_page}"),
    ]
    .into_iter()
    .map(|path| {
        let url = format!("{base}/sessions/{id}{path}");
        let ms = median_ms(|| {
            get(client, &url);
        });
        (
            format!("GET /sessions/{{id}}{}", path.split('?').next().unwrap()),
            ms,
        )
    })
    .collect()
}

/// Signs a new browser in to the daemon at `base`.
fn signed_in_browser(client: &reqwest::Client, base: &str) -> (Browser, mneme_e2e::browser::Page) {
    let code: serde_json::Value = block(async {
        let response = client
            .post(format!("{base}/ui/codes"))
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({"name": "bench"}))
            .send()
            .await
            .unwrap();
        response.json().await.unwrap()
    });
    let browser = Browser::start().unwrap();
    let page = browser.new_page().unwrap();
    page.goto(&format!("{base}{}", code["login"].as_str().unwrap()))
        .unwrap();
    page.wait_for(
        "document.getElementById('sessions')",
        Duration::from_secs(30),
    )
    .unwrap();
    (browser, page)
}

/// Milliseconds from asking for session `id`'s page to its last page of
/// events drawn (median).
fn page_ms(page: &mneme_e2e::browser::Page, base: &str, id: Uuid, events: usize) -> f64 {
    let drawn =
        format!("document.getElementById('e{events}') && document.getElementById('verified')");
    median_ms(|| {
        page.goto(&format!("{base}/ui/#/")).unwrap();
        page.wait_for(
            "document.getElementById('sessions')",
            Duration::from_secs(60),
        )
        .unwrap();
        page.eval(&format!("location.hash = '#/s/{id}'")).unwrap();
        page.wait_for(&drawn, Duration::from_secs(120)).unwrap();
    })
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let long: usize = std::env::var("MNEME_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let dir = bench_dir("web-view");
    let started = Instant::now();
    let (short_id, long_id) = {
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(&dir).unwrap());
        (fill(&log, SHORT), fill(&log, long))
    };
    println!(
        "filled sessions of {SHORT} and {long} events in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (mut daemon, base) = serve(&dir);
    let client = reqwest::Client::new();
    let short = page_requests(&client, &base, short_id, SHORT);
    let long_rows = page_requests(&client, &base, long_id, long);
    println!(
        "{:<36} {:>12} {:>12} {:>8}",
        "what",
        format!("{SHORT} ev ms"),
        format!("{long} ev ms"),
        "ratio"
    );
    for ((what, a), (_, b)) in short.iter().zip(&long_rows) {
        println!("{what:<36} {a:>12.1} {b:>12.1} {:>8.1}", b / a);
    }
    let (_browser, page) = signed_in_browser(&client, &base);
    let (a, b) = (
        page_ms(&page, &base, short_id, SHORT),
        page_ms(&page, &base, long_id, long),
    );
    println!(
        "{:<36} {a:>12.1} {b:>12.1} {:>8.1}",
        "session page drawn (Chromium)",
        b / a
    );
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}
