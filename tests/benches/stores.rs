//! PostgreSQL next to sled: durable appends/s, resume latency and agent
//! steps/s by number of concurrent sessions, with raw baselines (fdatasync,
//! a bare PostgreSQL INSERT) from the same run.
//!
//! Run: `scripts/with-postgres.sh cargo bench -p mneme-e2e --bench stores`,
//! or name a server with `MNEME_BENCH_PG` (else `MNEME_TEST_PG`); every case
//! gets a fresh schema in it. Without a server only sled is measured.

use eventlog::{Durability, EventLog, NewEvent, SledLog};
use mneme_e2e::bench::{agent_steps, bench_dir, bench_spec, block, new_event, to_new_event};
use pglog::PgLog;
use replay::Event;
use runtime::Session;
use std::fs::OpenOptions;
use std::io::Write;
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Concurrent sessions per case.
const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Sessions filled for the resume cases.
const SESSIONS: usize = 64;
/// Events per filled session.
const EVENTS: usize = 1000;
/// Agent steps per session in the steps section.
const STEPS: usize = 50;
/// Ops of the raw fdatasync baseline.
const RAW_OPS: usize = 2000;

/// A backend under test.
enum Store {
    Sled,
    Pg(String),
}

impl Store {
    /// A fresh, empty log for the case `case`.
    fn open(&self, case: &str) -> Arc<dyn EventLog> {
        match self {
            Store::Sled => {
                Arc::new(SledLog::open(bench_dir(&format!("stores-sled-{case}"))).unwrap())
            }
            Store::Pg(url) => {
                let sep = if url.contains('?') { '&' } else { '?' };
                let schema = format!("bench_{case}_{}", Uuid::now_v7().simple());
                Arc::new(block(PgLog::connect(&format!("{url}{sep}schema={schema}"))).unwrap())
            }
        }
    }
}

/// Runs `work(thread, start)` on `c` threads released together at `start`;
/// returns their results and the wall time from `start` until the last one
/// finished.
fn on_threads<T: Send>(c: usize, work: impl Fn(usize, Instant) -> T + Sync) -> (Vec<T>, Duration) {
    let (ready, start) = (Barrier::new(c + 1), OnceLock::new());
    thread::scope(|s| {
        let threads: Vec<_> = (0..c)
            .map(|w| {
                let (ready, start, work) = (&ready, &start, &work);
                s.spawn(move || {
                    ready.wait();
                    work(w, *start.get_or_init(Instant::now))
                })
            })
            .collect();
        ready.wait();
        let t = *start.get_or_init(Instant::now);
        let results = threads.into_iter().map(|h| h.join().unwrap()).collect();
        (results, t.elapsed())
    })
}

/// Raw write of 300 bytes + fdatasync per op, in the bench directory: ops/s.
fn raw_fdatasync() -> f64 {
    let dir = bench_dir("stores-raw-fsync");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log"))
        .unwrap();
    let t = Instant::now();
    for _ in 0..RAW_OPS {
        file.write_all(&[b'x'; 300]).unwrap();
        file.sync_data().unwrap();
    }
    RAW_OPS as f64 / t.elapsed().as_secs_f64()
}

/// Raw PostgreSQL on the same server: `c` connections, each inserting `n`
/// rows of 1 KiB into a plain table under its own key, one autocommitted
/// INSERT per row: rows/s. The floor under mneme's appends there.
fn raw_pg_inserts(url: &str, c: usize, n: usize) -> f64 {
    use tokio_postgres::NoTls;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let connect = || async {
            let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
            tokio::spawn(connection);
            client
        };
        let table = format!("bench_raw_{}", Uuid::now_v7().simple());
        connect()
            .await
            .batch_execute(&format!(
                "CREATE TABLE {table} (session uuid, seq bigint, record bytea, PRIMARY KEY (session, seq))"
            ))
            .await
            .unwrap();
        let clients = futures_util::future::join_all((0..c).map(|_| connect())).await;
        let insert = format!("INSERT INTO {table} VALUES ($1, $2, $3)");
        let record = vec![b'x'; 1024];
        let t = Instant::now();
        futures_util::future::join_all(clients.iter().map(|client| async {
            let session = Uuid::now_v7();
            for seq in 0..n as i64 {
                client
                    .execute(&insert, &[&session, &seq, &record])
                    .await
                    .unwrap();
            }
        }))
        .await;
        (c * n) as f64 / t.elapsed().as_secs_f64()
    })
}

/// `c` threads, each appending one event at a time to its own session and
/// calling barrier(synced) after each, `n` appends per thread: appends/s.
fn durable_appends(log: &dyn EventLog, c: usize, n: usize) -> f64 {
    let (_, took) = on_threads(c, |w, _| {
        let session = Uuid::now_v7();
        for i in 0..n {
            block(log.append(session, i as u64 + 1, vec![new_event(w + i)])).unwrap();
            block(log.barrier(Durability::Synced)).unwrap();
        }
    });
    (c * n) as f64 / took.as_secs_f64()
}

/// [`SESSIONS`] sessions of [`EVENTS`] events each, appended straight to the
/// log (so without snapshots), synced.
fn fill(log: &dyn EventLog) -> Vec<Uuid> {
    let spec = bench_spec("http://127.0.0.1:9/v1", "http://127.0.0.1:9/x");
    let first = to_new_event(&Event::SessionStarted {
        spec: Box::new(spec),
        tenant: None,
    });
    let rest: Vec<NewEvent> = (0..EVENTS - 1).map(new_event).collect();
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::now_v7()).collect();
    for &session in &sessions {
        block(log.append(session, 1, vec![first.clone()])).unwrap();
        block(log.append(session, 2, rest.clone())).unwrap();
    }
    block(log.barrier(Durability::Synced)).unwrap();
    sessions
}

/// Every session of `sessions` loaded once by `c` threads, each loading its
/// share in turn (so `c` loads are in flight): each load's time, sorted. A
/// load is timed from when its thread asked for it (the common start, then
/// the end of its previous load), so waiting for a core counts too.
fn resume(log: &Arc<dyn EventLog>, sessions: &[Uuid], c: usize) -> Vec<Duration> {
    let (times, _) = on_threads(c, |w, start| {
        let mut asked = start;
        let mine = sessions.iter().skip(w).step_by(c);
        mine.map(|&id| {
            let loaded = block(Session::load(log.clone(), id)).unwrap();
            let done = Instant::now();
            assert_eq!(loaded.snapshot_seq(), 0, "no snapshot involved");
            assert_eq!(loaded.state().last_seq, EVENTS as u64);
            let took = done - asked;
            asked = done;
            took
        })
        .collect::<Vec<_>>()
    });
    let mut times: Vec<Duration> = times.into_iter().flatten().collect();
    times.sort();
    times
}

/// The `p`th percentile (nearest rank) of sorted `times`, in ms.
fn percentile_ms(times: &[Duration], p: usize) -> f64 {
    times[(times.len() * p).div_ceil(100) - 1].as_secs_f64() * 1e3
}

/// Appends per thread at concurrency `c`: 2000 alone, 200 each when concurrent.
fn appends_per_thread(c: usize) -> usize {
    if c == 1 {
        2000
    } else {
        200
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` may pass --list.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    println!("# mneme stores benchmark: sled next to PostgreSQL\n");
    let mut stores = vec![("sled", Store::Sled)];
    match std::env::var("MNEME_BENCH_PG").or_else(|_| std::env::var("MNEME_TEST_PG")) {
        Ok(url) => stores.push(("PostgreSQL", Store::Pg(url))),
        Err(_) => println!(
            "PostgreSQL skipped: no server given. Set MNEME_BENCH_PG (or MNEME_TEST_PG) to \
             postgres://user@host:port/db, or run \
             `scripts/with-postgres.sh cargo bench -p mneme-e2e --bench stores`.\n"
        ),
    }
    let both = stores.len() == 2;
    let raw = raw_fdatasync();
    println!(
        "raw write of 300 B + fdatasync in the bench directory: {raw:.0} ops/s ({:.0} µs/op)",
        1e6 / raw
    );

    println!("\n## Durable appends/s (one ~1 KiB event per append, then barrier(synced); each session its own thread)\n");
    let mut head = "| sessions | appends |".to_string();
    for (name, _) in &stores {
        head += &format!(" {name} |");
    }
    let pg_url = stores.iter().find_map(|(_, store)| match store {
        Store::Pg(url) => Some(url.clone()),
        Store::Sled => None,
    });
    let extra = if both {
        " pg / sled | raw PostgreSQL INSERT + commit | pg / raw pg |"
    } else {
        ""
    };
    println!("{head}{extra}");
    println!(
        "|---:|---:|{}",
        "---:|".repeat(stores.len() + 3 * both as usize)
    );
    for c in CONCURRENCY {
        let n = appends_per_thread(c);
        let rates: Vec<f64> = stores
            .iter()
            .map(|(_, store)| durable_appends(store.open(&format!("append{c}")).as_ref(), c, n))
            .collect();
        let mut row = format!("| {c} | {} |", c * n);
        for rate in &rates {
            row += &format!(" {rate:.0} |");
        }
        if let ([sled, pg], Some(url)) = (&rates[..], &pg_url) {
            let raw = raw_pg_inserts(url, c, n);
            row += &format!(" {:.2}x | {raw:.0} | {:.2}x |", pg / sled, pg / raw);
        }
        println!("{row}");
    }

    println!("\n## Resume (Session::load of a {EVENTS}-event session, no snapshot; {SESSIONS} loads per row, `sessions` of them at once)\n");
    let filled: Vec<_> = stores
        .iter()
        .map(|(name, store)| {
            let log = store.open("resume");
            let t = Instant::now();
            let sessions = fill(log.as_ref());
            let secs = t.elapsed().as_secs_f64();
            println!("{name}: filled {SESSIONS} sessions in {secs:.1} s");
            (log, sessions)
        })
        .collect();
    let mut head = "\n| sessions |".to_string();
    for (name, _) in &stores {
        head += &format!(" {name} median ms | {name} p99 ms |");
    }
    println!("{head}{}", if both { " pg / sled (median) |" } else { "" });
    println!("|---:|{}", "---:|".repeat(2 * stores.len() + both as usize));
    for c in CONCURRENCY {
        let mut row = format!("| {c} |");
        let medians: Vec<f64> = filled
            .iter()
            .map(|(log, sessions)| {
                let times = resume(log, sessions, c);
                let median = percentile_ms(&times, 50);
                row += &format!(" {median:.1} | {:.1} |", percentile_ms(&times, 99));
                median
            })
            .collect();
        if let [sled, pg] = medians[..] {
            row += &format!(" {:.2}x |", pg / sled);
        }
        println!("{row}");
    }

    println!("\n## Agent steps/s (model reply + one side-effecting HTTP call a step, two synced barriers; loopback model and sink; {STEPS} steps a session)\n");
    let mut head = "| sessions |".to_string();
    for (name, _) in &stores {
        head += &format!(" {name} |");
    }
    println!("{head}{}", if both { " pg / sled |" } else { "" });
    println!("|---:|{}", "---:|".repeat(stores.len() + both as usize));
    let rt = mneme_e2e::bench::runtime();
    for c in CONCURRENCY {
        let rates: Vec<f64> = stores
            .iter()
            .map(|(_, store)| rt.block_on(agent_steps(store.open(&format!("steps{c}")), c, STEPS)))
            .collect();
        let mut row = format!("| {c} |");
        for rate in &rates {
            row += &format!(" {rate:.0} |");
        }
        if let [sled, pg] = rates[..] {
            row += &format!(" {:.2}x |", pg / sled);
        }
        println!("{row}");
    }
}
