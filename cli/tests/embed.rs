//! A Rust program that embeds mneme (`runtime/examples/embed.rs`): its
//! native tool runs once, and the session it leaves is an ordinary one the
//! `mneme` binary reads and verifies.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_runs_an_agent_with_a_rust_tool_and_the_cli_reads_its_session() {
    let world = World::new();
    let example = mneme_bin().parent().unwrap().join("examples/embed");
    assert!(
        example.exists(),
        "{} is missing: `cargo test --workspace` builds it",
        example.display()
    );
    let dir = world.dir.path().join("embedded");
    let out = Command::new(&example).arg(&dir).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("answer: 2 + 3 = 5"), "{said}");
    assert!(said.contains("add ran 1 time(s)"), "{said}");
    let session = said
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .unwrap()
        .to_string();

    let data = dir.join("data");
    let cli = |args: &[&str]| {
        stdout_of_success(
            Command::new(mneme_bin())
                .arg("--data-dir")
                .arg(&data)
                .args(args),
        )
    };
    cli(&["verify", &session]);
    let log = cli(&["log", "--json", &session]);
    let finished: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["kind"] == "ToolFinished")
        .collect();
    assert_eq!(finished.len(), 1, "{log}");
    assert!(finished[0].to_string().contains("sum"), "{log}");
    // The recorded spec names the tool native: `mneme` itself has no code
    // for it, so the turn fails naming it (the embedding program resumes it).
    let out = Command::new(mneme_bin())
        .arg("--data-dir")
        .arg(&data)
        .args(["run", "--session", &session, "And 4 + 4?"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(error.contains("add") && error.contains("native"), "{error}");
}
