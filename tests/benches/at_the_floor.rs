//! mneme's durable step as a fraction of the floor under it, both measured
//! in this one run (issue 34's targets: one session at 70% or more of the
//! floor's median, 16 sessions at 90% or more).
//!
//! The floor ([`mneme_e2e::floor`]) is a step with nothing of mneme's in
//! it: two records written and `fdatasync`ed around the tool's POST to the
//! peers' Node sink. mneme's step is the side-by-side harness's: the real
//! release daemon, a scripted model reply that calls a side-effecting HTTP
//! tool, the same POST to the same sink, through the daemon's API (a
//! message sent with `wait`), one session × 500 steps and 16 sessions × 200
//! at once. The floor runs before each mneme pass and after the last, and
//! mneme is stated against the median of those floor rounds.
//!
//! For the one-session pass it also prints the daemon's CPU and context
//! switches a step, by thread (from `/proc`): where the handoffs of a step
//! are.
//!
//! Run: `cargo build --release --bin mneme && cargo bench -p mneme-e2e
//! --bench at_the_floor` (needs `node`; `MNEME_BIN` names another binary,
//! `MNEME_BENCH_DIR` another disk, `MNEME_BENCH_PASSES` the passes, default
//! 3).

use mneme_e2e::bench::{bench_dir, built_mneme};
use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::floor::{round, NodeSink, SESSIONS, SESSION_STEPS, SINGLE_STEPS};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// Issue 34's targets, as fractions of the floor's median.
const SINGLE_TARGET: f64 = 0.70;
const MANY_TARGET: f64 = 0.90;

/// An agent whose scripted model asks for `steps` POSTs to `sink_url`, one
/// a reply, then answers "done" (the side-by-side harness's agent).
fn write_agent(dir: &Path, name: &str, steps: usize, sink_url: &str) -> String {
    let replies: Vec<_> = (0..steps)
        .map(|i| serde_json::json!({"tool_calls": [{"name": "post", "arguments": {"i": i}}]}))
        .chain([serde_json::json!({"content": "done"})])
        .collect();
    let script = dir.join(format!("{name}.json"));
    std::fs::write(
        &script,
        serde_json::json!({ "replies": replies }).to_string(),
    )
    .unwrap();
    format!(
        r#"name = "{name}"
system = "You are a billing assistant. Use the tools."
[model]
provider = "scripted"
model = "scripted"
script = "{script}"
[[tools]]
name = "post"
description = "Post a charge"
kind = "http"
method = "POST"
url = "{sink_url}"
effect = "side_effect"
parameters = {{ type = "object", properties = {{ i = {{ type = "integer" }} }}, required = ["i"] }}
[limits]
max_steps_per_turn = {limit}
"#,
        script = script.display(),
        limit = steps + 10,
    )
}

/// CPU ticks and context switches of one named kind of thread.
#[derive(Default, Clone, Copy)]
struct Load {
    threads: usize,
    ticks: u64,
    voluntary: u64,
    involuntary: u64,
}

/// Each live thread of `pid`: (thread id, name, load).
fn threads(pid: u32) -> Vec<(String, String, Load)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(|task| {
            let dir = task.ok()?.path();
            let name = std::fs::read_to_string(dir.join("comm")).ok()?;
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            let field = |key: &str| -> u64 {
                (status.lines())
                    .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
                    .unwrap_or(0)
            };
            // utime and stime: fields 14 and 15, after the name's ")".
            let after_name: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks = after_name[11].parse::<u64>().ok()? + after_name[12].parse::<u64>().ok()?;
            let load = Load {
                threads: 1,
                ticks,
                voluntary: field("voluntary_ctxt_switches:"),
                involuntary: field("nonvoluntary_ctxt_switches:"),
            };
            let id = dir.file_name()?.to_string_lossy().into_owned();
            Some((id, name.trim().to_string(), load))
        })
        .collect()
}

/// What each kind of thread of `pid` did between `before` and now, by name
/// (threads that ended meanwhile are not counted; threads started meanwhile
/// count from zero).
fn load_since(pid: u32, before: &[(String, String, Load)]) -> BTreeMap<String, Load> {
    let mut by_name: BTreeMap<String, Load> = BTreeMap::new();
    for (id, name, now) in threads(pid) {
        let then = (before.iter())
            .find(|(was, _, _)| *was == id)
            .map_or(Load::default(), |(_, _, load)| *load);
        let sum = by_name.entry(name).or_default();
        sum.threads += 1;
        sum.ticks += now.ticks - then.ticks;
        sum.voluntary += now.voluntary - then.voluntary;
        sum.involuntary += now.involuntary - then.involuntary;
    }
    by_name
}

/// One mneme pass: (1-session steps/s, its per-thread load, 16-session
/// steps/s).
async fn mneme_pass(sink: &NodeSink, pass: usize) -> (f64, BTreeMap<String, Load>, f64) {
    let dir = bench_dir(&format!("at-the-floor-{pass}"));
    let agents = dir.join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    let single = write_agent(&agents, "single", SINGLE_STEPS, &sink.url);
    let many = write_agent(&agents, "many", SESSION_STEPS, &sink.url);
    let data = dir.join("data");
    let mut serve = DaemonProcess::command(&data, &[]);
    serve.stderr(std::process::Stdio::null());
    let daemon = DaemonProcess::launch(serve, &data).await;
    let id = daemon.create(&single).await;
    let before = threads(daemon.pid());
    let started = Instant::now();
    let (status, end) = daemon.message_and_wait(&id, "go").await;
    let single_rate = SINGLE_STEPS as f64 / started.elapsed().as_secs_f64();
    assert_answered(status, &end);
    let load = load_since(daemon.pid(), &before);
    let mut ids = Vec::new();
    for _ in 0..SESSIONS {
        ids.push(daemon.create(&many).await);
    }
    let started = Instant::now();
    let turns = ids.iter().map(|id| daemon.message_and_wait(id, "go"));
    for (status, end) in futures_util::future::join_all(turns).await {
        assert_answered(status, &end);
    }
    let many_rate = (SESSIONS * SESSION_STEPS) as f64 / started.elapsed().as_secs_f64();
    daemon.kill().await;
    (single_rate, load, many_rate)
}

/// Panics unless a turn ended answering "done" (every step was taken).
fn assert_answered(status: u16, end: &serde_json::Value) {
    assert!(status == 200 && end["answer"] == "done", "{status} {end}");
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    built_mneme("release");
    let passes: usize = std::env::var("MNEME_BENCH_PASSES").map_or(3, |p| p.parse().unwrap());
    let runtime = mneme_e2e::bench::runtime();
    let sink = NodeSink::start();
    // Warm the sink's JIT, the connection pool and the disk path first.
    round(&sink, 1, SINGLE_STEPS, "floor-warm-up");
    let floor = |sink: &NodeSink, floors: &mut Vec<(f64, f64)>| {
        let single = round(sink, 1, SINGLE_STEPS, "floor-single");
        let many = round(sink, SESSIONS, SESSION_STEPS, "floor-many");
        println!("| floor | {single:.0} | {many:.0} |");
        floors.push((single, many));
    };
    println!("## mneme's durable step against the floor under it, same run\n");
    println!("| pass | 1 session × {SINGLE_STEPS} steps, steps/s | {SESSIONS} sessions × {SESSION_STEPS} steps, steps/s |\n|---|---:|---:|");
    let (mut floors, mut singles, mut manys, mut loads) = (vec![], vec![], vec![], vec![]);
    for pass in 1..=passes {
        floor(&sink, &mut floors);
        let (single, load, many) = runtime.block_on(mneme_pass(&sink, pass));
        println!("| mneme {pass} | {single:.0} | {many:.0} |");
        singles.push(single);
        manys.push(many);
        loads.push(load);
    }
    floor(&sink, &mut floors);
    let floor_single = median(floors.iter().map(|f| f.0).collect());
    let floor_many = median(floors.iter().map(|f| f.1).collect());
    let verdict = |rate: f64, floor: f64, target: f64| {
        let share = rate / floor;
        let met = if share >= target {
            "met"
        } else {
            "**not met**"
        };
        format!(
            "{:.0}% (target ≥ {:.0}%: {met})",
            share * 100.0,
            target * 100.0
        )
    };
    println!("\n| | mneme, median | floor, median | mneme / floor |\n|---|---:|---:|---|");
    let (single, many) = (median(singles), median(manys));
    println!(
        "| 1 session | {single:.0} | {floor_single:.0} | {} |",
        verdict(single, floor_single, SINGLE_TARGET)
    );
    println!(
        "| {SESSIONS} sessions | {many:.0} | {floor_many:.0} | {} |",
        verdict(many, floor_many, MANY_TARGET)
    );
    print_load(&loads, SINGLE_STEPS);
}

/// The daemon's CPU and context switches a step, by kind of thread, for the
/// one-session passes (their median pass by switches).
fn print_load(loads: &[BTreeMap<String, Load>], steps: usize) {
    let switches = |load: &BTreeMap<String, Load>| -> u64 {
        load.values().map(|l| l.voluntary + l.involuntary).sum()
    };
    let mut sorted: Vec<&BTreeMap<String, Load>> = loads.iter().collect();
    sorted.sort_by_key(|load| switches(load));
    let load = sorted[sorted.len() / 2];
    let tick_ms = 1e3 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let per_step = |n: u64| n as f64 / steps as f64;
    println!("\n## The daemon, 1 session, a step (median pass by switches; from /proc)\n");
    println!(
        "| threads | CPU ms | switches, voluntary | switches, involuntary |\n|---|---:|---:|---:|"
    );
    for (name, l) in load {
        println!(
            "| {name} ×{} | {:.3} | {:.2} | {:.2} |",
            l.threads,
            per_step(l.ticks) * tick_ms,
            per_step(l.voluntary),
            per_step(l.involuntary)
        );
    }
    let total = load.values().fold(Load::default(), |a, l| Load {
        threads: a.threads + l.threads,
        ticks: a.ticks + l.ticks,
        voluntary: a.voluntary + l.voluntary,
        involuntary: a.involuntary + l.involuntary,
    });
    println!(
        "| all ×{} | {:.3} | {:.2} | {:.2} |",
        total.threads,
        per_step(total.ticks) * tick_ms,
        per_step(total.voluntary),
        per_step(total.involuntary)
    );
}
