//! The exhaustive crash test: every scenario, every crash point of the write
//! path, every occurrence of it, with a second crash during the resume; then
//! the contract's invariants against an uncrashed run.
//!
//! CI runs the nested crash at the same point as the first; set
//! `MNEME_CRASH_FULL=1` to try every point for the nested crash too.

use mneme_e2e::scenario::{self, Faults};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_of_every_scenario_resumes_to_the_uncrashed_result() {
    let full = std::env::var_os("MNEME_CRASH_FULL").is_some();
    let points = runtime::crash::all_points();
    let scenarios = scenario::all();
    let (mut runs, mut crashes, mut violations) = (0, 0, Vec::new());
    for sc in &scenarios {
        let reference = Box::pin(scenario::reference(sc)).await;
        for point in &points {
            for n in 1.. {
                let nested: Vec<String> = if full {
                    points.iter().map(|p| format!("{p}:1")).collect()
                } else {
                    vec![format!("{point}:1")]
                };
                let mut reached = false;
                for nested in nested {
                    let env = sc.env().await;
                    let faults = Faults {
                        crash_at: Some(format!("{point}:{n}")),
                        nested: Some(nested.clone()),
                        kill_after_ms: None,
                    };
                    let outcome = Box::pin(scenario::run(sc, &env, &faults)).await;
                    runs += 1;
                    let outcome = match outcome {
                        Ok(outcome) => outcome,
                        Err(e) => {
                            violations.push(format!("{} {point}:{n} then {nested}: {e}", sc.name));
                            continue;
                        }
                    };
                    reached |= outcome.crashes > 0;
                    crashes += outcome.crashes;
                    for v in Box::pin(scenario::violations(&env, &outcome, &reference)).await {
                        violations.push(format!("{} {point}:{n} then {nested}: {v}", sc.name));
                    }
                }
                if !reached {
                    break; // the point is reached fewer than n times
                }
            }
        }
    }
    scenario::report(&format!(
        "crash matrix: scenarios {}, crash points {}, runs {runs}, crashes {crashes}, violations {}",
        scenarios.len(),
        points.len(),
        violations.len()
    ));
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    assert!(
        crashes > runs / 2,
        "most runs must actually crash: {crashes} of {runs}"
    );
}
