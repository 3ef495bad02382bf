//! The core benchmark: durable appends, replay, resume and agent steps,
//! each next to a baseline measured in the same run on the same disk.
//!
//! Run: `cargo bench -p mneme-e2e --bench core` (set `MNEME_BENCH_DIR` to
//! measure another disk; default `target/bench-data`).

use eventlog::{Durability, EventLog, NewEvent, SledLog};
use mneme_e2e::bench::{
    bench_dir, bench_spec, block, charging_model, event, new_event, run_to_done, to_new_event,
};
use mneme_e2e::eventually_blocking;
use replay::{Event, ModelReply, SessionState, ToolCall, ToolOutcome};
use runtime::{Runner, Session};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

const APPENDS: usize = 3000;
const BATCH: usize = 64;
/// Events per row of the group-commit section (split between the writers).
const GROUP_EVENTS: usize = 6000;

struct Rate {
    per_sec: f64,
    p50_us: f64,
}

/// Runs `op` `n` times (each op counting `per_op` events) and reports events/s and p50 per op.
fn measure(n: usize, per_op: usize, mut op: impl FnMut(usize)) -> Rate {
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        op(i);
        lat.push(t.elapsed());
    }
    let total = start.elapsed();
    lat.sort();
    Rate {
        per_sec: (n * per_op) as f64 / total.as_secs_f64(),
        p50_us: lat[n / 2].as_secs_f64() * 1e6,
    }
}

fn row(name: &str, r: &Rate, base: f64) {
    println!(
        "| {name:<52} | {:>10.0} | {:>8.1} | {:>6.2}x |",
        r.per_sec,
        r.p50_us,
        r.per_sec / base
    );
}

/// Per-event rates measured by [`appends`], for the sections after it.
struct Floors {
    /// Raw write + fdatasync per event.
    raw: f64,
    /// mneme append + barrier(synced) per event, one writer.
    per_event: f64,
}

fn appends() -> Floors {
    println!("\n## Durable appends ({APPENDS} events of ~1 KiB; ratio to raw write+fdatasync per event)\n");
    println!("| mode | events/s | p50 µs/op | ratio |\n|---|---:|---:|---:|");
    // The same bytes mneme stores, written raw.
    let session = Uuid::now_v7();
    let payloads: Vec<Vec<u8>> = (0..APPENDS).map(|i| new_event(i).payload).collect();

    let dir = bench_dir("raw-fsync");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log"))
        .unwrap();
    let raw = measure(APPENDS, 1, |i| {
        file.write_all(&payloads[i]).unwrap();
        file.sync_data().unwrap();
    });
    let base = raw.per_sec;
    row("raw write + fdatasync per event (floor)", &raw, base);
    let raw_batch = measure(APPENDS / BATCH, BATCH, |b| {
        for p in &payloads[b * BATCH..(b + 1) * BATCH] {
            file.write_all(p).unwrap();
        }
        file.sync_data().unwrap();
    });
    row("raw write + fdatasync per 64 events", &raw_batch, base);
    let zeroed = preallocated_floor(&payloads);
    row(
        "raw write + fdatasync per event over written zeros (preallocated floor)",
        &zeroed,
        base,
    );
    // What a flushed append costs at its two parts: the write-ahead
    // file's write, and sled's insert (with the settings mneme gives it).
    let raw_write = measure(APPENDS, 1, |i| file.write_all(&payloads[i]).unwrap());
    row("raw write per event (no fsync)", &raw_write, base);
    let dir = bench_dir("raw-sled-mneme-settings");
    let db = eventlog::sled_config(&dir).open().unwrap();
    let sled_insert = measure(APPENDS, 1, |i| {
        db.insert((i as u64).to_be_bytes(), payloads[i].as_slice())
            .unwrap();
    });
    row(
        "raw sled insert per event, mneme's sled (no flush)",
        &sled_insert,
        base,
    );
    drop(db);

    let dir = bench_dir("raw-sled");
    let db = sled::open(&dir).unwrap();
    let data = std::fs::File::open(dir.join("db")).unwrap();
    let sled_flush = measure(APPENDS, 1, |i| {
        db.insert((i as u64).to_be_bytes(), payloads[i].as_slice())
            .unwrap();
        db.flush().unwrap();
    });
    row(
        "raw sled insert + flush per event (no fsync)",
        &sled_flush,
        base,
    );
    let sled_sync = measure(APPENDS, 1, |i| {
        db.insert(
            (APPENDS as u64 + i as u64).to_be_bytes(),
            payloads[i].as_slice(),
        )
        .unwrap();
        db.flush().unwrap();
        data.sync_data().unwrap();
    });
    row(
        "raw sled insert + flush + fdatasync per event",
        &sled_sync,
        base,
    );
    drop(db);

    let log = SledLog::open(bench_dir("mneme-append")).unwrap();
    let synced = measure(APPENDS, 1, |i| {
        block(log.append(session, i as u64 + 1, vec![new_event(i)])).unwrap();
        block(log.barrier(Durability::Synced)).unwrap();
    });
    row("mneme append + barrier(synced) per event", &synced, base);
    let s2 = Uuid::now_v7();
    let flushed = measure(APPENDS, 1, |i| {
        block(log.append(s2, i as u64 + 1, vec![new_event(i)])).unwrap();
        block(log.barrier(Durability::Flushed)).unwrap();
    });
    row("mneme append + barrier(flushed) per event", &flushed, base);
    let s3 = Uuid::now_v7();
    let batched = measure(APPENDS / BATCH, BATCH, |b| {
        let events = (b * BATCH..(b + 1) * BATCH).map(new_event).collect();
        block(log.append(s3, (b * BATCH) as u64 + 1, events)).unwrap();
        block(log.barrier(Durability::Synced)).unwrap();
    });
    row("mneme append 64 + barrier(synced)", &batched, base);
    let again = measure(APPENDS, 1, |i| {
        file.write_all(&payloads[i]).unwrap();
        file.sync_data().unwrap();
    });
    row(
        "raw write + fdatasync per event, measured again",
        &again,
        base,
    );
    println!(
        "\nmneme synced per event / raw fdatasync per event: {:.2}x slower (target ≤ 1.5x); \
         / raw fdatasync over written zeros, as mneme's write-ahead file writes: {:.2}x",
        raw.per_sec / synced.per_sec,
        zeroed.per_sec / synced.per_sec
    );
    Floors {
        raw: raw.per_sec,
        per_event: synced.per_sec,
    }
}

/// Raw `pwrite` + `fdatasync` of each payload over zeros written (and
/// synced) beforehand, as a preallocated file is written: no sync has a
/// file size to commit.
fn preallocated_floor(payloads: &[Vec<u8>]) -> Rate {
    use std::os::unix::fs::FileExt;
    let dir = bench_dir("raw-fsync-preallocated");
    let file = std::fs::File::create(dir.join("log")).unwrap();
    let total: usize = payloads.iter().map(Vec::len).sum();
    file.write_all_at(&vec![0; total], 0).unwrap();
    file.sync_all().unwrap();
    let mut at = 0u64;
    measure(payloads.len(), 1, |i| {
        file.write_all_at(&payloads[i], at).unwrap();
        file.sync_data().unwrap();
        at += payloads[i].len() as u64;
    })
}

/// What [`run_writers`] measured.
struct Concurrent {
    /// Events per second over all writers.
    per_sec: f64,
    /// Median time of one append + barrier.
    p50_us: f64,
    /// fdatasyncs the log issued.
    syncs: u64,
    events: usize,
}

/// `writers` tasks on one fresh log, each appending one event at a time
/// to its own session and calling a barrier of `durability` after each;
/// [`GROUP_EVENTS`] events in all.
fn run_writers(writers: usize, durability: Durability) -> Concurrent {
    let log = Arc::new(SledLog::open(bench_dir(&format!("group-{writers}-{durability}"))).unwrap());
    let per_writer = GROUP_EVENTS / writers;
    let (lat, total) = block(async {
        let start = Arc::new(tokio::sync::Barrier::new(writers + 1));
        let tasks: Vec<_> = (0..writers)
            .map(|w| {
                let (log, start) = (log.clone(), start.clone());
                tokio::spawn(async move {
                    let session = Uuid::now_v7();
                    let mut lat = Vec::with_capacity(per_writer);
                    start.wait().await;
                    for i in 0..per_writer {
                        let t = Instant::now();
                        log.append(session, i as u64 + 1, vec![new_event(w + i)])
                            .await
                            .unwrap();
                        log.barrier(durability).await.unwrap();
                        lat.push(t.elapsed());
                    }
                    lat
                })
            })
            .collect();
        start.wait().await;
        let t = Instant::now();
        let mut lat: Vec<Duration> = Vec::with_capacity(per_writer * writers);
        for task in tasks {
            lat.extend(task.await.unwrap());
        }
        (lat, t.elapsed())
    });
    let mut lat = lat;
    lat.sort();
    let events = per_writer * writers;
    Concurrent {
        per_sec: events as f64 / total.as_secs_f64(),
        p50_us: lat[lat.len() / 2].as_secs_f64() * 1e6,
        syncs: log.syncs(),
        events,
    }
}

/// Concurrent writers, each appending one event to its own session and then
/// calling barrier(synced), all on one log: synced barriers share fdatasyncs.
/// Next to it, the same writers with barrier(flushed): no fdatasync at all,
/// the ceiling group commit can approach on this machine.
fn group_commit(floors: &Floors) {
    println!("\n## Group commit ({GROUP_EVENTS} events of ~1 KiB per row, split between the writers; each writer: append one event to its own session, then barrier(synced), repeatedly)\n");
    println!(
        "per-event flush (1 writer, above): {:.0} events/s; raw write + fdatasync floor: {:.0} events/s\n",
        floors.per_event, floors.raw
    );
    println!("| writers | events/s | p50 µs/event | vs per-event flush | vs raw fdatasync | fdatasyncs | events/fdatasync | same writers, barrier(flushed) (no fsync) | synced / flushed |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut at_64 = 0.0;
    for n in [1usize, 16, 64, 256] {
        let synced = run_writers(n, Durability::Synced);
        let flushed = run_writers(n, Durability::Flushed);
        if n == 64 {
            at_64 = synced.per_sec;
        }
        println!(
            "| {n} | {:.0} | {:.0} | {:.2}x | {:.2}x | {} | {:.1} | {:.0} | {:.2} |",
            synced.per_sec,
            synced.p50_us,
            synced.per_sec / floors.per_event,
            synced.per_sec / floors.raw,
            synced.syncs,
            synced.events as f64 / synced.syncs.max(1) as f64,
            flushed.per_sec,
            synced.per_sec / flushed.per_sec,
        );
    }
    println!(
        "\ngroup commit, 64 writers / per-event flush: {:.1}x (target ≥ 20x)",
        at_64 / floors.per_event
    );
}

/// Fills a session of `n` events (buffered appends, one barrier at the end).
fn fill(dir: &Path, n: usize) -> Uuid {
    let log = SledLog::open(dir).unwrap();
    let session = Uuid::now_v7();
    let spec_event = Event::SessionStarted {
        spec: Box::new(bench_spec("http://127.0.0.1:9/v1", "http://127.0.0.1:9/x")),
        tenant: None,
    };
    let first = to_new_event(&spec_event);
    block(log.append(session, 1, vec![first])).unwrap();
    let mut seq = 2;
    for chunk in (0..n - 1).collect::<Vec<_>>().chunks(1000) {
        let events: Vec<NewEvent> = chunk.iter().map(|&i| new_event(i)).collect();
        let len = events.len() as u64;
        block(log.append(session, seq, events)).unwrap();
        seq += len;
    }
    block(log.barrier(Durability::Synced)).unwrap();
    session
}

/// The records of the run an index entry points at (segment u32, offset
/// u64, length u32, uncompressed length u32, little-endian), read and
/// decompressed with no checks: what a raw read of the files costs.
fn raw_run(dir: &std::path::Path, entry: &[u8]) -> Vec<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let word = |at: usize| u32::from_le_bytes(entry[at..at + 4].try_into().unwrap());
    let offset = u64::from_le_bytes(entry[4..12].try_into().unwrap());
    let file = std::fs::File::open(dir.join(format!("segments/{:08}", word(0)))).unwrap();
    let mut frame = vec![0u8; word(12) as usize];
    file.read_exact_at(&mut frame, offset).unwrap();
    let raw = zstd::block::decompress(&frame, word(16) as usize).unwrap();
    let mut records = Vec::new();
    let mut at = 0;
    while at < raw.len() {
        let len = u32::from_le_bytes(raw[at..at + 4].try_into().unwrap()) as usize;
        records.push(raw[at + 4..at + 4 + len].to_vec());
        at += 4 + len;
    }
    records
}

fn replay_and_resume() {
    println!("\n## Replay and resume (reopen the data directory, read, decode, fold)\n");
    println!("| events | raw sled scan + decode | mneme read + verify + decode + fold | ratio | resume (open + load + plan) |\n|---:|---:|---:|---:|---:|");
    for n in [10_000usize, 100_000] {
        let dir = bench_dir(&format!("replay-{n}"));
        let session = fill(&dir, n);
        // Baseline: the same records, read from the segment files through
        // sled's index, decompressed and decoded; no checks, no fold.
        let t = Instant::now();
        let db = eventlog::sled_config(&dir).open().unwrap();
        let mut count = 0usize;
        for item in db.scan_prefix([b'r']) {
            let (_, entry) = item.unwrap();
            for value in raw_run(&dir, &entry) {
                let body = &value[1..value.len() - 32];
                let envelope: eventlog::Envelope = rmp_serde::from_slice(body).unwrap();
                let event = Event::decode(envelope.schema, &envelope.payload).unwrap();
                std::hint::black_box(&event);
                count += 1;
            }
        }
        let raw = t.elapsed();
        assert_eq!(count, n);
        drop(db);
        // mneme: open, read with hash and chain checks, decode, fold, plan.
        let t = Instant::now();
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(&dir).unwrap());
        let loaded = block(Session::load(log, session)).unwrap();
        let plan = replay::plan(loaded.state());
        std::hint::black_box(&plan);
        let resume = t.elapsed();
        assert_eq!(loaded.state().last_seq, n as u64);
        let raw_rate = n as f64 / raw.as_secs_f64();
        let mneme_rate = n as f64 / resume.as_secs_f64();
        println!(
            "| {n} | {:.0}/s | {:.0}/s | {:.2}x | {:.1} ms |",
            raw_rate,
            mneme_rate,
            raw_rate / mneme_rate,
            resume.as_secs_f64() * 1e3
        );
    }
    // The fold alone, over decoded events (no I/O): the pure part.
    let events: Vec<Event> = (0..100_000).map(event).collect();
    let t = Instant::now();
    let state = SessionState::fold(
        events
            .into_iter()
            .enumerate()
            .map(|(i, e)| (i as u64 + 1, e)),
    );
    std::hint::black_box(&state);
    println!(
        "\nfold alone: {:.0} events/s",
        100_000.0 / t.elapsed().as_secs_f64()
    );
}

fn agent_steps(rt: &tokio::runtime::Runtime) {
    const SESSIONS: usize = 5;
    const STEPS: usize = 100;
    println!("\n## Agent steps (one session at a time; a step = model reply + one side_effect HTTP call, both on loopback, durability synced)\n");
    let (steps_per_sec, p50) = rt.block_on(async {
        let (model, sink) = charging_model(STEPS).await;
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(bench_dir("steps")).unwrap());
        let runner = Runner::new(Durability::Synced);
        let mut per_session = Vec::new();
        let start = Instant::now();
        for _ in 0..SESSIONS {
            let t = Instant::now();
            let spec = bench_spec(&model.base_url(), &sink.url("charge"));
            run_to_done(log.clone(), runner.clone(), spec).await;
            per_session.push(t.elapsed() / STEPS as u32);
        }
        let total = start.elapsed();
        assert_eq!(
            sink.stats().path("charge").effects as usize,
            SESSIONS * STEPS
        );
        per_session.sort();
        (
            (SESSIONS * STEPS) as f64 / total.as_secs_f64(),
            per_session[SESSIONS / 2],
        )
    });
    println!("{SESSIONS} sessions x {STEPS} steps: {steps_per_sec:.0} steps/s (median {:.0} µs per step; target ≥ 900 steps/s)", p50.as_secs_f64() * 1e6);
    let _: Duration = p50;
}

/// Resume with a snapshot 100 events behind the head, next to a full fold of
/// the same log, each from a freshly opened data directory.
fn snapshot_resume() {
    println!(
        "\n## Resume with a snapshot (100 events behind the head) and by full replay, same log\n"
    );
    println!(
        "| events | full replay | snapshot + 100-event tail | speed-up |\n|---:|---:|---:|---:|"
    );
    for n in [1_000usize, 10_000, 100_000] {
        let dir = bench_dir(&format!("snapshot-{n}"));
        let session = fill(&dir, n - 100);
        {
            let log: Arc<dyn EventLog> = Arc::new(SledLog::open(&dir).unwrap());
            let loaded = block(Session::load(log.clone(), session)).unwrap();
            let hash = block(log.head(session)).unwrap().hash;
            block(runtime::store::store_snapshot(
                log.as_ref(),
                session,
                hash,
                loaded.state(),
            ))
            .unwrap();
            let tail: Vec<NewEvent> = (0..100).map(new_event).collect();
            block(log.append(session, (n - 100) as u64 + 1, tail)).unwrap();
            block(log.barrier(Durability::Synced)).unwrap();
        }
        let resume = || {
            let t = Instant::now();
            let log: Arc<dyn EventLog> = Arc::new(SledLog::open(&dir).unwrap());
            let loaded = block(Session::load(log, session)).unwrap();
            assert_eq!(loaded.state().last_seq, n as u64);
            (t.elapsed(), loaded.snapshot_seq())
        };
        let (with_snapshot, from) = resume();
        assert_eq!(from, (n - 100) as u64, "the snapshot was used");
        {
            let log = SledLog::open(&dir).unwrap();
            // An unusable snapshot: ignored.
            block(log.side_store().put_derived(session, "snapshot", b"")).unwrap();
        }
        let (full, from) = resume();
        assert_eq!(from, 0, "no snapshot was used");
        println!(
            "| {n} | {:.1} ms | {:.1} ms | {:.1}x |",
            full.as_secs_f64() * 1e3,
            with_snapshot.as_secs_f64() * 1e3,
            full.as_secs_f64() / with_snapshot.as_secs_f64()
        );
    }
}

/// Time to build the next request as a session grows: a full render of the
/// history against extending the rendered prefix.
fn prompt_rebuild() {
    use replay::{next_request, next_request_incremental, RenderedPrefix, SessionState};
    println!(
        "\n## Prompt rebuild per turn (a turn: user message, reply with one call, its result)\n"
    );
    println!("| turns | full render | incremental | bytes built |\n|---:|---:|---:|---:|");
    let spec = bench_spec("http://127.0.0.1:9/v1", "http://127.0.0.1:9/x");
    let mut state = SessionState::default();
    state.apply(
        1,
        Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        },
    );
    let mut prefix = RenderedPrefix::default();
    let mut seq = 1;
    for turn in 1..=1000usize {
        for event in [
            Event::UserMessage {
                text: format!("turn {turn}: {}", "x".repeat(200)),
            },
            Event::ModelReplied(ModelReply {
                content: Some("y".repeat(200)),
                tool_calls: vec![ToolCall {
                    id: format!("call_{turn}"),
                    name: "charge".into(),
                    arguments: "{\"n\":1}".into(),
                    invented: None,
                }],
                ..Default::default()
            }),
            Event::ToolStarted {
                call_id: format!("call_{turn}"),
                tool: "charge".into(),
                args: "{}".into(),
                effect: replay::Effect::SideEffect,
                idempotency_key: "k".into(),
                attempt: 1,
            },
            Event::ToolFinished {
                call_id: format!("call_{turn}"),
                outcome: ToolOutcome::Ok("{\"ok\":true}".into()),
                duration_ms: 1,
                settled_by_check: false,
                rerun: None,
                child: None,
            },
        ] {
            seq += 1;
            state.apply(seq, event);
        }
        let incremental = next_request_incremental("s", &state, &mut prefix)
            .unwrap()
            .to_vec();
        if [10, 100, 1000].contains(&turn) {
            let t = Instant::now();
            let full = next_request("s", &state).unwrap();
            let full_digest = replay::digest_hex(&full);
            let full_time = t.elapsed();
            assert_eq!(full, incremental);
            // One more render on the warm prefix: what the next step costs.
            let t = Instant::now();
            let again = next_request_incremental("s", &state, &mut prefix).unwrap();
            let incremental_time = t.elapsed();
            assert_eq!(again.digest, full_digest);
            assert_eq!(again.to_vec(), full);
            println!(
                "| {turn} | {:.1} µs | {:.1} µs | {} |",
                full_time.as_secs_f64() * 1e6,
                incremental_time.as_secs_f64() * 1e6,
                full.len()
            );
        }
    }
}

/// A session of `n` short events, compacted every 100 events as a context
/// window would force; snapshotted 100 events before its head.
fn fill_compacted(dir: &Path, n: usize) -> Uuid {
    let log = SledLog::open(dir).unwrap();
    let session = Uuid::now_v7();
    let mut state = SessionState::default();
    let mut pending: Vec<Event> = Vec::new();
    let push = |event: Event, state: &mut SessionState, pending: &mut Vec<Event>| {
        state.apply(state.last_seq + 1, event.clone());
        pending.push(event);
    };
    let spec = bench_spec("http://127.0.0.1:9/v1", "http://127.0.0.1:9/x");
    push(
        Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        },
        &mut state,
        &mut pending,
    );
    let mut snapshot = None;
    let mut written = 0u64;
    while (state.last_seq as usize) < n {
        let seq = state.last_seq;
        let event = if seq % 2 == 1 {
            Event::UserMessage {
                text: format!("question {seq}"),
            }
        } else {
            Event::ModelReplied(ModelReply {
                content: Some(format!("answer {seq}")),
                ..Default::default()
            })
        };
        push(event, &mut state, &mut pending);
        let seq = state.last_seq;
        if seq % 100 == 0 && (seq as usize) < n {
            if let Some((entries, covers)) = state.compactable() {
                let event = Event::ContextCompacted {
                    entries: entries as u64,
                    covers,
                    summary: format!("summary up to {seq}"),
                };
                push(event, &mut state, &mut pending);
            }
        }
        if state.last_seq as usize >= n - 100 && snapshot.is_none() {
            snapshot = Some(state.clone());
        }
        if pending.len() >= 1000 || state.last_seq as usize >= n {
            let events: Vec<NewEvent> = pending.drain(..).map(|e| to_new_event(&e)).collect();
            let count = events.len() as u64;
            block(log.append(session, written + 1, events)).unwrap();
            written += count;
        }
    }
    let snapshot = snapshot.expect("the fill passes head - 100");
    let at = block(log.read(session, snapshot.last_seq, snapshot.last_seq))
        .unwrap()
        .remove(0)
        .hash;
    block(runtime::store::store_snapshot(&log, session, at, &snapshot)).unwrap();
    block(log.barrier(Durability::Synced)).unwrap();
    session
}

/// Resume of long sessions whose prompt a context window keeps compacted:
/// the snapshot holds only what the prompt still needs.
fn long_session_resume() {
    println!("\n## Resume of long, compacted sessions (a snapshot 100 events behind the head)\n");
    println!("| events | open data directory | load (snapshot + tail) | full replay (load without the snapshot) |\n|---:|---:|---:|---:|");
    for n in [1_000usize, 10_000, 100_000, 1_000_000] {
        let dir = bench_dir(&format!("long-{n}"));
        let session = fill_compacted(&dir, n);
        // sled's threads may hold its lock a moment after the fill closed it.
        let what = format!("sled to release its lock on {}", dir.display());
        let (log, open) = eventually_blocking(what, Duration::from_secs(30), || {
            let t = Instant::now();
            match SledLog::open(&dir) {
                Ok(log) => Ok((log, t.elapsed())),
                Err(e @ eventlog::LogError::Locked { .. }) => Err(e),
                Err(e) => panic!("{e}"),
            }
        });
        let log: Arc<dyn EventLog> = Arc::new(log);
        let t = Instant::now();
        let loaded = block(Session::load(log.clone(), session)).unwrap();
        let load = t.elapsed();
        assert!(
            loaded.snapshot_seq() as usize >= n - 100,
            "resumed from the snapshot"
        );
        assert_eq!(loaded.state().last_seq as usize, n);
        block(log.side_store().put_derived(session, "snapshot", b"")).unwrap();
        let t = Instant::now();
        let full = block(Session::load(log, session)).unwrap();
        let replay = t.elapsed();
        assert_eq!(full.state(), loaded.state(), "the same state either way");
        println!(
            "| {n} | {:.1} ms | {:.2} ms | {:.1} ms |",
            open.as_secs_f64() * 1e3,
            load.as_secs_f64() * 1e3,
            replay.as_secs_f64() * 1e3
        );
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing we need.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = mneme_e2e::bench::runtime();
    println!("# mneme core benchmark");
    // `MNEME_BENCH_ONLY=steps` or `appends`: only those rows (a quick look).
    if let Some(only) = std::env::var_os("MNEME_BENCH_ONLY") {
        match only.to_str() {
            Some("steps") => return agent_steps(rt),
            Some("appends") => return group_commit(&appends()),
            _ => panic!("MNEME_BENCH_ONLY={only:?}: expected `steps` or `appends`"),
        }
    }
    let floors = appends();
    group_commit(&floors);
    replay_and_resume();
    snapshot_resume();
    long_session_resume();
    prompt_rebuild();
    agent_steps(rt);
}
