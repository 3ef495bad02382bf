//! The floor under a durable agent step on this machine: what the
//! side-by-side bench's step costs with mneme's own work taken out.
//!
//! A step here is only what the write-ahead rules leave: a record written
//! and `fdatasync`ed (the call's intent, before the tool runs), the
//! tool's HTTP POST to the peers' Node sink (`tests/benches/sink.mjs`, a
//! copy of the one the side-by-side harness uses for mneme and Restate),
//! and a second record written and synced (the result, before the model
//! sees it). No model reply is built, no event encoded, hashed or folded,
//! no prompt rendered, no API served. A runtime that keeps those rules
//! cannot step faster than this; the side-by-side targets are ratios to
//! Restate, so this says which ratios this machine allows at all.
//!
//! Run: `cargo bench -p mneme-e2e --bench step_floor` (needs `node`; env
//! `MNEME_SINK` names another sink script, `MNEME_BENCH_DIR` another disk).
//! Prints steps/s for one session (500 steps, three rounds) and for 16
//! sessions of 200 steps at once, whose records share one file and its
//! `fdatasync`s (group commit, as mneme's log does).

use mneme_e2e::floor::{round, NodeSink, SESSIONS, SESSION_STEPS, SINGLE_STEPS};

const ROUNDS: usize = 3;

fn main() {
    let sink = NodeSink::start();
    // Warm the sink's JIT, the connection pool and the disk path first.
    round(&sink, 1, SINGLE_STEPS, "floor-warm-up");
    println!("## The floor under a durable step (write + fdatasync, the tool's POST to the Node sink, write + fdatasync; nothing of mneme's own)\n");
    println!("| round | 1 session × {SINGLE_STEPS} steps, steps/s | {SESSIONS} sessions × {SESSION_STEPS} steps, steps/s |\n|---:|---:|---:|");
    for r in 1..=ROUNDS {
        let single = round(&sink, 1, SINGLE_STEPS, &format!("floor-single-{r}"));
        let many = round(&sink, SESSIONS, SESSION_STEPS, &format!("floor-many-{r}"));
        println!("| {r} | {single:.0} | {many:.0} |");
    }
}
