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
