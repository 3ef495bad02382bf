//! The CLI's surface: help, usage errors and exit codes. (Behaviour under
//! crashes is tested end to end by the other files here, with the support
//! of the `mneme-e2e` crate in `tests/`.)

use std::process::Command;

fn mneme(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mneme"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn help_lists_every_command() {
    let out = mneme(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for command in [
        "run", "resume", "sessions", "log", "verify", "replay", "resolve", "demo",
    ] {
        assert!(text.contains(command), "--help lacks {command}: {text}");
    }
}

#[test]
fn usage_errors_exit_non_zero_and_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let out = mneme(&["--data-dir", data, "resolve", "not-a-uuid", "c1", "--retry"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not-a-uuid"));
    let out = mneme(&["--data-dir", data, "run", "hello"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--agent"));
    let out = mneme(&[
        "--data-dir",
        data,
        "log",
        "01900000-0000-7000-8000-000000000001",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session"));
}

#[test]
fn demo_tells_the_story_and_counts_each_effect_once() {
    let out = mneme(&["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("SIGKILL"), "{text}");
    assert!(
        text.contains("/email    requests 2  effects applied 1"),
        "{text}"
    );
    assert!(
        text.contains("/charge   requests 1  effects applied 1"),
        "{text}"
    );
}
