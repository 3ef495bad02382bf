//! The exhaustive crash test: every scenario, every crash point it declares,
//! every occurrence of it, with a second crash armed on the operator's
//! commands after it (resume, resolve, approve); then the contract's
//! invariants against an uncrashed run, and every declared point reached (a
//! point a run never reaches would otherwise count as done).
//!
//! CI runs the nested crash at the same point as the first; set
//! `MNEME_CRASH_FULL=1` to try every point for the nested crash too.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::on_a_deep_stack;
use mneme_e2e::scenario::{self, Faults, Reach, Scenario, Store};
use runtime::control::crash::{self, CrashPoint};
use std::collections::BTreeSet;

#[test]
fn every_crash_point_of_every_scenario_resumes_to_the_uncrashed_result() {
    on_a_deep_stack(|| async {
        let mut points = crash::all_points();
        points.extend(crash::SLEEP_POINTS);
        let tally = matrix(&points, Store::Sled).await;
        tally.check("crash matrix");
    });
}

/// The agent loop's crash points with the log on PostgreSQL, checked against
/// the same uncrashed runs on sled. (The log's own crash points are inside
/// sled's write path; on PostgreSQL an append is one transaction.)
#[test]
fn every_agent_crash_point_resumes_to_the_uncrashed_result_on_postgres() {
    on_a_deep_stack(|| async {
        let points = [crash::POINTS, crash::SLEEP_POINTS].concat();
        let tally = matrix(&points, Store::Postgres).await;
        tally.check("crash matrix on PostgreSQL");
    });
}

/// The schedules' crash point (right after a firing's append) at a
/// schedule's first, second and third firing, on sled and on PostgreSQL:
/// after the daemon's restart every tick fired once, and every firing's
/// session started once and answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_cut_at_the_schedule_crash_point_starts_its_session_once() {
    use mneme_e2e::daemon::DaemonProcess;
    use mneme_e2e::schedules::*;
    use mneme_e2e::{MockReply, Testbed};
    for postgres in [false, true] {
        for n in 1..=3u32 {
            let case = format!(
                "schedule_fired:{n} on {}",
                if postgres { "PostgreSQL" } else { "sled" }
            );
            let mut bed = Testbed::new().replies(vec![MockReply::answer("Done."); 50]);
            if postgres {
                bed = bed.on_postgres();
            }
            let bed = bed.await;
            let mut crashed = armed_daemon_at(&bed.world, n).await;
            let id = add(&bed, &["--every", "1s"]).await;
            died_at_the_crash_point(&mut crashed).await;
            let cut = firings(&schedule_log(&bed.world, &id).await);
            assert_eq!(cut.len(), n as usize, "{case}: {cut:?}");
            let daemon = DaemonProcess::start(&bed.world.data(), &store_args(&bed.world)).await;
            let mut fired = Vec::new();
            while fired.len() <= n as usize {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                fired = firings(&schedule_log(&bed.world, &id).await);
            }
            for (_, session) in &fired {
                until_idle(&daemon, session).await;
            }
            remove(&bed.world, &id).await;
            let answered: Vec<String> = fired.into_iter().map(|(_, s)| s).collect();
            let fired = firings(&schedule_log(&bed.world, &id).await);
            let ticks: Vec<i64> = fired.iter().map(|(t, _)| *t).collect();
            assert!(
                ticks.windows(2).all(|w| w[1] - w[0] == 1000),
                "{case}: {ticks:?}"
            );
            let sessions: std::collections::BTreeSet<&String> =
                fired.iter().map(|(_, s)| s).collect();
            assert_eq!(sessions.len(), fired.len(), "{case}: a session a tick");
            for (tick, session) in &fired {
                let log = schedule_log(&bed.world, session).await;
                assert_eq!(
                    log[1].1["tick_ms"], *tick,
                    "{case}: {session} names its tick"
                );
                let replies = (log.iter())
                    .filter(|(kind, _)| kind == "ModelReplied")
                    .count();
                // Those that answered before the removal, once; a firing
                // just before it may not have asked yet.
                let once = if answered.contains(session) {
                    1..=1
                } else {
                    0..=1
                };
                assert!(
                    once.contains(&replies),
                    "{case}: {session} asked the model {replies} times"
                );
            }
            assert!(daemon.terminate().await.success(), "{case}");
        }
    }
}

#[derive(Default)]
struct Tally {
    scenarios: usize,
    points: usize,
    runs: usize,
    crashes: usize,
    /// (scenario, point) pairs the scenarios declare, and those reached.
    declared: usize,
    reached: usize,
    violations: Vec<String>,
}

impl Tally {
    fn check(&self, name: &str) {
        scenario::report(&format!(
            "{name}: scenarios {}, crash points {}, declared points reached {}/{}, runs {}, crashes {}, violations {}",
            self.scenarios,
            self.points,
            self.reached,
            self.declared,
            self.runs,
            self.crashes,
            self.violations.len()
        ));
        assert!(self.violations.is_empty(), "{}", self.violations.join("\n"));
        assert!(
            self.crashes > self.runs / 2,
            "most runs must actually crash: {} of {}",
            self.crashes,
            self.runs
        );
    }
}

/// Every scenario × every point it declares × every occurrence, with a
/// nested crash armed on the operator's commands after it; the invariants
/// checked against an uncrashed sled run, and every declared point reached.
async fn matrix(points: &[CrashPoint], store: Store) -> Tally {
    let mut scenarios = scenario::all();
    scenarios.push(scenario::mcp_scenario());
    scenarios.push(scenario::approval_scenario());
    scenarios.push(scenario::checked_scenario());
    scenarios.push(scenario::sleep_scenario());
    let mut tally = Tally {
        scenarios: scenarios.len(),
        points: points.len(),
        ..Tally::default()
    };
    for sc in &scenarios {
        let reference = Box::pin(scenario::reference(sc)).await;
        let declared: Vec<Reach> = (sc.points.iter())
            .filter(|r| points.contains(&r.point))
            .copied()
            .collect();
        let mut reached = BTreeSet::new();
        for reach in &declared {
            Box::pin(crash_at_every_occurrence(
                sc,
                store,
                &reference,
                *reach,
                points,
                &mut tally,
                &mut reached,
            ))
            .await;
        }
        tally.declared += declared.len();
        for reach in &declared {
            match reached.contains(reach.point.name()) {
                true => tally.reached += 1,
                false => tally.violations.push(format!(
                    "{}: declared crash point {} never reached",
                    sc.name, reach.point
                )),
            }
        }
    }
    tally
}

/// Crashes runs of `sc` at each occurrence of `reach`'s point (or of the
/// crash that must come first), until the runs no longer reach it; notes
/// the points the processes died at in `reached`.
async fn crash_at_every_occurrence(
    sc: &Scenario,
    store: Store,
    reference: &scenario::Reference,
    reach: Reach,
    points: &[CrashPoint],
    tally: &mut Tally,
    reached: &mut BTreeSet<String>,
) {
    let full = std::env::var_os("MNEME_CRASH_FULL").is_some();
    let first = reach.after.unwrap_or(reach.point);
    for n in 1.. {
        let nested: Vec<String> = if full && reach.after.is_none() {
            points.iter().map(|p| format!("{p}:1")).collect()
        } else {
            vec![format!("{}:1", reach.point)]
        };
        let mut run_crashed = false;
        for nested in nested {
            let env = sc.env_on(store).await;
            let faults = Faults {
                crash_at: Some(format!("{first}:{n}")),
                nested: Some(nested.clone()),
                kill_after_ms: None,
            };
            let outcome = Box::pin(scenario::run(sc, &env, &faults)).await;
            tally.runs += 1;
            let what = format!("{} {first}:{n} then {nested}", sc.name);
            let outcome = match outcome {
                Ok(outcome) => outcome,
                Err(e) => {
                    tally.violations.push(format!("{what}: {e}"));
                    continue;
                }
            };
            run_crashed |= outcome.run_crashed;
            tally.crashes += outcome.crashes;
            reached.extend(outcome.points.iter().cloned());
            for v in Box::pin(scenario::violations(&env, &outcome, reference)).await {
                tally.violations.push(format!("{what}: {v}"));
            }
        }
        if !run_crashed {
            break; // the runs reach the point fewer than n times
        }
    }
}
