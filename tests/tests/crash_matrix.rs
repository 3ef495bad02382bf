//! The exhaustive crash test: every scenario, every crash point of the write
//! path, every occurrence of it, with a second crash during the resume; then
//! the contract's invariants against an uncrashed run.
//!
//! CI runs the nested crash at the same point as the first; set
//! `MNEME_CRASH_FULL=1` to try every point for the nested crash too.

use mneme_e2e::scenario::{self, Faults, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_of_every_scenario_resumes_to_the_uncrashed_result() {
    let tally = matrix(&runtime::crash::all_points(), Store::Sled).await;
    tally.check("crash matrix");
}

/// The agent loop's crash points with the log on PostgreSQL, checked against
/// the same uncrashed runs on sled. (The log's own crash points are inside
/// sled's write path; on PostgreSQL an append is one transaction.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_crash_point_resumes_to_the_uncrashed_result_on_postgres() {
    let tally = matrix(runtime::crash::POINTS, Store::Postgres).await;
    tally.check("crash matrix on PostgreSQL");
}

#[derive(Default)]
struct Tally {
    scenarios: usize,
    points: usize,
    runs: usize,
    crashes: usize,
    violations: Vec<String>,
}

impl Tally {
    fn check(&self, name: &str) {
        scenario::report(&format!(
            "{name}: scenarios {}, crash points {}, runs {}, crashes {}, violations {}",
            self.scenarios,
            self.points,
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

/// Every scenario × every point × every occurrence, with a nested crash in
/// the first resume; the invariants checked against an uncrashed sled run.
async fn matrix(points: &[&str], store: Store) -> Tally {
    let full = std::env::var_os("MNEME_CRASH_FULL").is_some();
    let mut scenarios = scenario::all();
    scenarios.push(scenario::mcp_scenario());
    let mut tally = Tally {
        scenarios: scenarios.len(),
        points: points.len(),
        ..Tally::default()
    };
    for sc in &scenarios {
        let reference = Box::pin(scenario::reference(sc)).await;
        for point in points {
            for n in 1.. {
                let nested: Vec<String> = if full {
                    points.iter().map(|p| format!("{p}:1")).collect()
                } else {
                    vec![format!("{point}:1")]
                };
                let mut reached = false;
                for nested in nested {
                    let env = sc.env_on(store).await;
                    let faults = Faults {
                        crash_at: Some(format!("{point}:{n}")),
                        nested: Some(nested.clone()),
                        kill_after_ms: None,
                    };
                    let outcome = Box::pin(scenario::run(sc, &env, &faults)).await;
                    tally.runs += 1;
                    let what = format!("{} {point}:{n} then {nested}", sc.name);
                    let outcome = match outcome {
                        Ok(outcome) => outcome,
                        Err(e) => {
                            tally.violations.push(format!("{what}: {e}"));
                            continue;
                        }
                    };
                    reached |= outcome.crashes > 0;
                    tally.crashes += outcome.crashes;
                    for v in Box::pin(scenario::violations(&env, &outcome, &reference)).await {
                        tally.violations.push(format!("{what}: {v}"));
                    }
                }
                if !reached {
                    break; // the point is reached fewer than n times
                }
            }
        }
    }
    tally
}
