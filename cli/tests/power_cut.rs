//! Power cuts: every `mneme` process runs under an `LD_PRELOAD` shim that
//! journals what each write to the data directory replaced
//! (`tests/powercut/shim.c`); after a process dies (at a crash point, or
//! SIGKILLed at a random instant) every change no fsync covered is undone
//! (`mneme_e2e::powercut`), as a power cut would lose it, before the next
//! command. With `--durability synced`, everything a barrier acknowledged must
//! survive, the store must open and verify, and the session must resume to
//! the uncrashed result with every effect once. With `flushed`, records may be
//! lost (counted), but the store must still open and verify, and what is left
//! must be a prefix of what was there. The cuts after random instants keep
//! a random part of the unsynced writes (each file's oldest ones, the next
//! one maybe torn): a device writes back in its own order.
//!
//! `MNEME_POWERCUT_RUNS` (default 12) sets the number of random-instant runs
//! and `MNEME_POWERCUT_SEED` the seed (printed; a failure names it).

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::on_a_deep_stack;
use mneme_e2e::powercut::{self, PowerCut, Shim};
use mneme_e2e::scenario::{self, Faults, Scenario};
use mneme_e2e::{env_number, named_session, stderr, stdout, Rng, World};
use runtime::control::crash::{self, CrashPoint};
use std::time::Instant;

fn seed(name: &str) -> u64 {
    let seed = env_number("MNEME_POWERCUT_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    println!("{name} seed {seed} (MNEME_POWERCUT_SEED={seed} reproduces this run)");
    seed
}

/// Crash points right after a synced barrier returned: a cut there must not
/// take away any event the process had appended.
const ACKNOWLEDGED: &[CrashPoint] = &[
    crash::USER_MESSAGE_DURABLE,
    crash::TOOL_STARTED_DURABLE,
    crash::TURN_ANSWERED,
    eventlog::crash::LOG_CHECKPOINT_SYNCED,
];

/// How long an uncrashed run of `sc` takes per turn (with the shim), a
/// little more: the window random kills land in.
async fn window_ms(sc: &Scenario, cut: &PowerCut) -> u64 {
    let started = Instant::now();
    let env = sc.env().await;
    Box::pin(scenario::run_with(sc, &env, &Faults::default(), Some(cut)))
        .await
        .unwrap();
    (started.elapsed().as_millis() as u64 / sc.turns.len() as u64).max(20) * 6 / 5
}

/// Synced: cut at every crash point (its first occurrence; the two reached
/// only after a crash, after one at `tool_started_durable`) and at random
/// instants, resume like an operator, check the contract against an
/// uncrashed run.
#[test]
fn power_cuts_lose_nothing_a_synced_barrier_acknowledged() {
    on_a_deep_stack(|| async {
        Shim::enable_for_children();
        let runs = env_number("MNEME_POWERCUT_RUNS").unwrap_or(12);
        let seed = seed("power cut");
        let mut rng = Rng(seed);
        let cut = PowerCut::new(None);
        let mut violations = Vec::new();
        let mut processes = 0;
        let mut total_runs = 0;
        let sc = scenario::effects_scenario();
        let reference = Box::pin(scenario::reference(&sc)).await;
        for reach in &sc.points {
            let first = reach.after.unwrap_or(reach.point);
            let faults = Faults {
                crash_at: Some(format!("{first}:1")),
                nested: reach.after.map(|_| format!("{}:1", reach.point)),
                kill_after_ms: None,
            };
            let what = format!("{} at {}", sc.name, reach.point);
            let lost_before = cut.tally.lock().unwrap().events_lost;
            let env = sc.env().await;
            total_runs += 1;
            let outcome = match Box::pin(scenario::run_with(&sc, &env, &faults, Some(&cut))).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    violations.push(format!("{what}: {e}"));
                    continue;
                }
            };
            processes += outcome.crashes;
            if !outcome.points.contains(reach.point.name()) {
                violations.push(format!("{what}: the point was never reached"));
            }
            let lost = cut.tally.lock().unwrap().events_lost - lost_before;
            if reach.after.is_none() && ACKNOWLEDGED.contains(&reach.point) && lost > 0 {
                violations.push(format!(
                    "{what}: {lost} events a synced barrier had acknowledged were lost"
                ));
            }
            for v in Box::pin(scenario::violations(&env, &outcome, &reference)).await {
                violations.push(format!("{what}: {v}"));
            }
        }
        // Random instants, in every scenario the soak runs.
        let scenarios = scenario::all();
        let mut references = Vec::new();
        for sc in &scenarios {
            let reference = Box::pin(scenario::reference(sc)).await;
            references.push((reference, window_ms(sc, &cut).await));
        }
        let mut killed_at_random = 0;
        // From here on, cuts keep a random part of the unsynced writes.
        cut.randomize(Some(rng.next_u64()));
        for i in 0..runs {
            let pick = (rng.next_u64() % scenarios.len() as u64) as usize;
            let (sc, (reference, window)) = (&scenarios[pick], &references[pick]);
            let kill_after_ms = rng.next_u64() % window;
            let env = sc.env().await;
            let faults = Faults {
                kill_after_ms: Some(kill_after_ms),
                ..Faults::default()
            };
            total_runs += 1;
            let what = format!(
                "seed {seed} run {i} ({} killed at {kill_after_ms} ms)",
                sc.name
            );
            match Box::pin(scenario::run_with(sc, &env, &faults, Some(&cut))).await {
                Ok(outcome) => {
                    processes += outcome.crashes;
                    killed_at_random += outcome.crashes;
                    for v in Box::pin(scenario::violations(&env, &outcome, reference)).await {
                        violations.push(format!("{what}: {v}"));
                    }
                }
                Err(e) => violations.push(format!("{what}: {e}")),
            }
        }
        let tally = cut.tally.lock().unwrap();
        violations.extend(tally.problems.iter().cloned());
        scenario::report(&format!(
            "power cut (synced): seed {seed}, runs {total_runs} ({} at crash points, {runs} at random instants), processes killed {processes} ({killed_at_random} at random), {}, files unmade {}, renames undone {}, events lost {} (none acknowledged), violations {}",
            sc.points.len(),
            tally.cuts_line(),
            tally.dropped.created,
            tally.dropped.renames,
            tally.events_lost,
            violations.len()
        ));
        assert!(
            violations.is_empty(),
            "seed {seed}:\n{}",
            violations.join("\n")
        );
        assert!(
            killed_at_random > 0 || runs < 4,
            "no run was killed at random: the window is too wide"
        );
        // The cuts at the points between an append and its barrier drop the
        // appended records: a cut that never dropped any would prove nothing.
        assert!(
            tally.cuts_dropping > 0 && tally.events_lost > 0,
            "no cut dropped a write of the log ({} of {} cuts), or no event was lost",
            tally.cuts_dropping,
            tally.cuts
        );
    });
}

/// A turn `mneme run` answered (exit 0) was acknowledged whole: a cut after
/// the next turn's process dies, anywhere, leaves every event of it; one
/// right after a synced barrier leaves every event appended.
#[test]
fn an_answered_turn_survives_a_cut_during_the_next() {
    on_a_deep_stack(|| async {
        Shim::enable_for_children();
        let sc = scenario::multi_turn_scenario();
        let mut points: Vec<CrashPoint> = runtime::control::crash::all_points();
        points.retain(|p| *p != crash::IN_DOUBT_APPENDED && *p != crash::DECISION_APPENDED);
        let mut violations = Vec::new();
        let mut kept = 0;
        let mut lost_unsynced = 0;
        let mut dropped = powercut::CutReport::default();
        for point in &points {
            let env = sc.env().await;
            let world = &env.world;
            let agent = env.agent.to_str().unwrap();
            let first = world
                .mneme()
                .args(["run", "--agent", agent, sc.turns[0]])
                .output()
                .await
                .unwrap();
            assert!(first.status.success(), "turn 1: {}", stderr(&first));
            let session = named_session(&first).unwrap();
            let answered = log_lines(world, &session).await;
            let second = world
                .mneme()
                .env("MNEME_CRASH_AT", format!("{point}:1"))
                .args(["run", "--session", &session, sc.turns[1]])
                .output()
                .await
                .unwrap();
            if second.status.code().is_some() {
                violations.push(format!(
                    "{point}: turn 2 did not crash: {}",
                    stderr(&second)
                ));
                continue;
            }
            // What the process left in the page cache, read from a copy.
            let before_cut = world.dir.path().join("page-cache");
            copy_dir(&world.data(), &before_cut);
            let cached = log_lines_in(&before_cut, &session);
            powercut::settle(&before_cut);
            let report = powercut::cut(&world.data());
            dropped.add(&report);
            if std::env::var_os("MNEME_POWERCUT_VERBOSE").is_some() {
                println!("{point}: {report:?}");
            }
            let after = log_lines(world, &session).await;
            if after.len() < answered.len() || after[..answered.len()] != answered[..] {
                violations.push(format!(
                    "{point}: the answered turn's {} events are not all there after the cut ({} events; {report:?})",
                    answered.len(),
                    after.len()
                ));
            }
            if after.len() > cached.len() || after[..] != cached[..after.len()] {
                violations.push(format!(
                    "{point}: after the cut the log is not a prefix of what was written"
                ));
            }
            if ACKNOWLEDGED.contains(point) && after.len() < cached.len() {
                violations.push(format!(
                    "{point}: {} events a synced barrier acknowledged were lost ({report:?})",
                    cached.len() - after.len()
                ));
            }
            kept += after.len() - answered.len();
            lost_unsynced += cached.len() - after.len();
            let verify = world.run(&["verify", &session]).await;
            if !verify.status.success() {
                violations.push(format!("{point}: verify: {}", stdout(&verify)));
            }
        }
        scenario::report(&format!(
            "power cut (answered turn): crash points {}, writes dropped {} (bytes {}), events of the cut turn kept {kept} (of those written {}), violations {}",
            points.len(),
            dropped.writes,
            dropped.bytes,
            kept + lost_unsynced,
            violations.len()
        ));
        assert!(violations.is_empty(), "{}", violations.join("\n"));
    });
}

/// Flushed: a cut may lose records no barrier synced, but the store opens,
/// verifies, and holds a prefix of what was written.
#[test]
fn power_cuts_under_flushed_lose_records_but_corrupt_nothing() {
    on_a_deep_stack(|| async {
        Shim::enable_for_children();
        let runs = env_number("MNEME_POWERCUT_RUNS").unwrap_or(12);
        let seed = seed("power cut (flushed)");
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        let cut = PowerCut::new(Some("flushed"));
        let scenarios = scenario::all();
        let mut windows = Vec::new();
        for sc in &scenarios {
            windows.push(window_ms(sc, &cut).await);
        }
        let mut unfinished = Vec::new();
        for i in 0..runs {
            let pick = (rng.next_u64() % scenarios.len() as u64) as usize;
            let sc = &scenarios[pick];
            let kill_after_ms = rng.next_u64() % windows[pick];
            // Every other run, the cuts keep a random part of the unsynced writes.
            cut.randomize((i % 2 == 1).then(|| rng.next_u64()));
            let env = sc.env().await;
            let faults = Faults {
                kill_after_ms: Some(kill_after_ms),
                ..Faults::default()
            };
            // The session may not come back to the uncrashed result (a lost
            // ToolStarted makes a call run again): only the store is checked.
            if let Err(e) = Box::pin(scenario::run_with(sc, &env, &faults, Some(&cut))).await {
                unfinished.push(format!(
                    "run {i} ({} killed at {kill_after_ms} ms): {e}",
                    sc.name
                ));
            }
        }
        let tally = cut.tally.lock().unwrap();
        scenario::report(&format!(
            "power cut (flushed): seed {seed}, runs {runs}, {}, events lost {}, sessions not brought to an end {}, corruption {}",
            tally.cuts_line(),
            tally.events_lost,
            unfinished.len(),
            tally.problems.len()
        ));
        for u in &unfinished {
            println!("  {u}");
        }
        assert!(
            tally.problems.is_empty(),
            "seed {seed}:\n{}",
            tally.problems.join("\n")
        );
    });
}

async fn log_lines(world: &World, session: &str) -> Vec<String> {
    let out = world.run(&["log", "--json", session]).await;
    assert!(out.status.success(), "log: {}", stderr(&out));
    stdout(&out).lines().map(str::to_string).collect()
}

fn log_lines_in(data: &std::path::Path, session: &str) -> Vec<String> {
    let out = std::process::Command::new(mneme_e2e::mneme_bin())
        .arg("--data-dir")
        .arg(data)
        .args(["log", "--json", session])
        .output()
        .unwrap();
    assert!(out.status.success(), "log: {}", stderr(&out));
    stdout(&out).lines().map(str::to_string).collect()
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The model itself, on shell commands: an unsynced append is lost, a
/// synced file whose directory was not synced since its creation is not
/// there, a rename not made durable is undone (the replaced file back, with
/// its synced bytes), and so is an unlink.
#[test]
fn the_cut_drops_exactly_what_no_sync_covered() {
    let lib = Shim::build();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    // `sync FILE` is fsync(2), on a directory too.
    let script = "set -e
        printf A > a; sync a; printf D > c; sync c; printf F > d; sync d; sync .
        rm d
        printf B >> a
        printf C > b; sync b
        printf E > c.tmp; sync c.tmp; mv c.tmp c";
    let out = std::process::Command::new("sh")
        .args(["-c", script])
        .current_dir(&data)
        .env("LD_PRELOAD", &lib)
        .env("MNEME_POWERCUT", "1")
        .env("MNEME_POWERCUT_ROOT", &data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let read = |name: &str| std::fs::read_to_string(data.join(name)).ok();
    assert_eq!(read("a").as_deref(), Some("AB"));
    assert_eq!(read("c").as_deref(), Some("E"));
    assert_eq!(read("d"), None);
    let report = powercut::cut(&data);
    assert_eq!(read("a").as_deref(), Some("A"), "{report:?}");
    assert_eq!(read("b"), None, "{report:?}");
    assert_eq!(read("c").as_deref(), Some("D"), "{report:?}");
    assert_eq!(read("c.tmp"), None, "{report:?}");
    assert_eq!(read("d").as_deref(), Some("F"), "{report:?}");
    assert_eq!(
        (
            report.writes,
            report.created,
            report.renames,
            report.unlinks
        ),
        (1, 2, 1, 1),
        "{report:?}"
    );
    assert!(!powercut::journal_for(&data).exists());
}

/// A turn `mneme run` answered left a store that survives any cut after
/// it: the whole unsynced rest dropped, or (per seed) only part of it, the
/// next write torn. Each cut starts again from the same directory and
/// journal.
#[test]
fn a_store_left_by_an_answered_turn_survives_any_cut() {
    on_a_deep_stack(|| async {
        let sc = scenario::effects_scenario();
        survives_any_cut(&sc, sc.turns[0], "after an answered turn").await;
    });
}

/// The same with a message too big for sled's pages: sled keeps it in a
/// blob file of its own, whose name must be durable (its directory synced)
/// before the checkpoint empties the write-ahead file.
#[test]
fn a_store_holding_a_record_kept_in_a_blob_file_survives_any_cut() {
    on_a_deep_stack(|| async {
        let sc = scenario::effects_scenario();
        let mut rng = Rng(0x5eed_b10b);
        let noise: String = (0..48 << 10)
            .map(|_| char::from(b'!' + (rng.next_u64() % 94) as u8))
            .collect();
        let message = format!("{} {noise}", sc.turns[0]);
        survives_any_cut(&sc, &message, "a record in a blob file").await;
    });
}

/// Runs `message` as the first turn of `sc` to its answer, then cuts the
/// power over the store it left, with each of 17 seeds: every time the log
/// must open and hold every event of the answered turn.
async fn survives_any_cut(sc: &Scenario, message: &str, what: &str) {
    Shim::enable_for_children();
    let env = sc.env().await;
    let world = &env.world;
    let out = world
        .mneme()
        .args(["run", "--agent", env.agent.to_str().unwrap(), message])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "run: {}", stderr(&out));
    let session = named_session(&out).unwrap();
    let data = world.data();
    let journal = powercut::journal_for(&data);
    let saved = world.dir.path().join("saved");
    copy_dir(&data, &saved);
    let saved_journal = world.dir.path().join("saved.journal");
    std::fs::copy(&journal, &saved_journal).unwrap();
    let answered = log_lines_in(&saved, &session);
    powercut::settle(&saved);
    let mut failures = Vec::new();
    let seeds: Vec<Option<u64>> = std::iter::once(None).chain((1..=16).map(Some)).collect();
    for seed in &seeds {
        std::fs::remove_dir_all(&data).unwrap();
        copy_dir(&saved, &data);
        std::fs::copy(&saved_journal, &journal).unwrap();
        let report = powercut::cut_with(&data, *seed);
        let out = std::process::Command::new(mneme_e2e::mneme_bin())
            .arg("--data-dir")
            .arg(&data)
            .args(["log", "--json", &session])
            .output()
            .unwrap();
        let lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
        if !out.status.success() || lines != answered {
            failures.push(format!(
                "cut {seed:?} ({report:?}): log exited {:?}, {} of {} events: {}",
                out.status.code(),
                lines.len(),
                answered.len(),
                stderr(&out).trim()
            ));
        }
        powercut::settle(&data);
    }
    scenario::report(&format!(
        "power cut ({what}): cuts {}, failed {}",
        seeds.len(),
        failures.len()
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
