//! What encryption at rest costs: appends (one event each, as a turn makes
//! them, `buffered` so the disk does not hide the CPU) and a whole
//! session's read and decode, through a `SealedLog` with a master key,
//! against the same sled log without one in the same run. The ratios are
//! the figures.
//!
//! Run: `cargo bench -p mneme-e2e --bench privacy` (`MNEME_BENCH_EVENTS`
//! sets the events, default 20000; `MNEME_BENCH_DIR` the disk).

use eventlog::{Durability, EventLog, SledLog};
use mneme_e2e::bench::{bench_dir, block, new_event};
use runtime::store::{MasterKey, SealedLog};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

const RUNS: usize = 3;

/// (appends per second, milliseconds to read and decode the session).
fn measure(log: &Arc<dyn EventLog>, events: usize) -> (f64, f64) {
    let id = Uuid::now_v7();
    let started = Instant::now();
    for seq in 1..=events {
        block(log.append(id, seq as u64, vec![new_event(seq)])).unwrap();
    }
    block(log.barrier(Durability::Buffered)).unwrap();
    let appends = events as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    let read = block(runtime::store::read_events(log.as_ref(), id)).unwrap();
    let read_ms = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(read.len(), events);
    (appends, read_ms)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() {
    let events: usize = std::env::var("MNEME_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let keys = bench_dir("privacy-keys");
    let master_file = keys.join("master.key");
    MasterKey::generate(&master_file).unwrap();
    let mut plain = (Vec::new(), Vec::new());
    let mut sealed = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        let raw: Arc<dyn EventLog> =
            Arc::new(SledLog::open(bench_dir(&format!("privacy-plain-{run}"))).unwrap());
        let (a, r) = measure(&raw, events);
        plain.0.push(a);
        plain.1.push(r);
        let inner: Arc<dyn EventLog> =
            Arc::new(SledLog::open(bench_dir(&format!("privacy-sealed-{run}"))).unwrap());
        let master = MasterKey::load(&master_file, None).unwrap();
        let log: Arc<dyn EventLog> = Arc::new(SealedLog::new(inner, Some(master)));
        let (a, r) = measure(&log, events);
        sealed.0.push(a);
        sealed.1.push(r);
        // Time, not a barrier: the dropped stores' threads wind down before
        // the next run is measured.
        std::thread::sleep(Duration::from_millis(100));
    }
    let (pa, pr) = (median(plain.0), median(plain.1));
    let (sa, sr) = (median(sealed.0), median(sealed.1));
    println!("encryption at rest, {events} events of about 1 KiB, median of {RUNS} runs:");
    println!("| | sled | sled + master key | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| appends/s (one event each, buffered) | {pa:.0} | {sa:.0} | {:.2}x |",
        sa / pa
    );
    println!(
        "| read + decode the session | {pr:.1} ms | {sr:.1} ms | {:.2}x |",
        sr / pr
    );
}
