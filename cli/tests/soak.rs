//! Random SIGKILL soak: the fault scenarios, each `mneme run` killed from
//! outside at a random instant, then resumed and resolved like an operator
//! would; the invariants are checked against an uncrashed run.
//!
//! `MNEME_SOAK_RUNS` (default 24) sets the number of runs and
//! `MNEME_SOAK_SEED` the seed; a failure prints the seed that reproduces it.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::scenario::{self, Faults, Store};
use mneme_e2e::{env_number, on_a_deep_stack, Rng};
use std::time::Instant;

#[test]
fn random_sigkills_never_lose_or_repeat_anything() {
    let runs = env_number("MNEME_SOAK_RUNS").unwrap_or(24);
    on_a_deep_stack(move || soak("soak", Store::Sled, runs));
}

/// The same on PostgreSQL, where a kill can land inside a transaction: the
/// server then commits or aborts it whole, and the resume must agree with
/// whichever it did.
#[test]
fn random_sigkills_on_postgres_never_lose_or_repeat_anything() {
    let runs = env_number("MNEME_SOAK_RUNS").map_or(12, |n| n / 2);
    on_a_deep_stack(move || soak("soak on PostgreSQL", Store::Postgres, runs));
}

/// `runs` runs of random scenarios on `store`, each `mneme` process killed
/// at a random instant, checked against uncrashed runs.
async fn soak(name: &str, store: Store, runs: u64) {
    let seed = env_number("MNEME_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    println!("{name} seed {seed} (MNEME_SOAK_SEED={seed} reproduces this run)");
    let mut rng = Rng(seed);
    let scenarios = scenario::all();
    let mut references = Vec::new();
    for sc in &scenarios {
        let reference = Box::pin(scenario::reference(sc)).await;
        // Kill anywhere from the start to a little past an uncrashed run's
        // end on this store.
        let started = Instant::now();
        let env = sc.env_on(store).await;
        Box::pin(scenario::run(sc, &env, &Faults::default()))
            .await
            .unwrap();
        let window_ms =
            (started.elapsed().as_millis() as u64 / sc.turns.len() as u64).max(20) * 6 / 5;
        references.push((reference, window_ms));
    }
    let mut crashes = 0;
    for i in 0..runs {
        let pick = (rng.next_u64() % scenarios.len() as u64) as usize;
        let (sc, (reference, window_ms)) = (&scenarios[pick], &references[pick]);
        let kill_after_ms = rng.next_u64() % window_ms;
        let env = sc.env_on(store).await;
        let faults = Faults {
            kill_after_ms: Some(kill_after_ms),
            ..Faults::default()
        };
        let outcome = Box::pin(scenario::run(sc, &env, &faults))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "seed {seed} run {i} ({} killed at {kill_after_ms} ms): {e}",
                    sc.name
                )
            });
        crashes += outcome.crashes;
        let violations = Box::pin(scenario::violations(&env, &outcome, reference)).await;
        assert!(
            violations.is_empty(),
            "seed {seed} run {i} ({} killed at {kill_after_ms} ms):\n{}",
            sc.name,
            violations.join("\n")
        );
    }
    scenario::report(&format!(
        "{name}: seed {seed}, runs {runs}, processes killed {crashes}, violations 0"
    ));
    assert!(crashes > 0, "no run was killed: the window is too wide");
}
