//! Schedules through the real binary: a schedule added with `mneme
//! schedule add` (beside a daemon, or with none running) fires once per
//! tick, each firing starting a session marked `ScheduledBy` and recorded
//! in the schedule's own log; two daemons sharing PostgreSQL fire each
//! tick once, one of them SIGKILLed midway; `catch_up` decides what a
//! daemon started after a downtime fires; `overlap` what a tick does while
//! the previous firing's turn runs; a daemon killed right after a firing's
//! append starts what it names once after its restart; bad schedules are
//! refused naming what is wrong.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::schedules::*;
use mneme_e2e::*;
use serde_json::{json, Value};
use std::time::Duration;

/// An agent that answers "Done." to every message (each firing's session
/// asks once; a session messaged N times asks N times).
fn answering() -> TestbedBuilder {
    Testbed::new().replies(vec![MockReply::answer("Done."); 50])
}

/// An agent whose turn takes about `seconds`: a read-only command tool
/// that sleeps, then the answer.
fn slow(seconds: u32) -> TestbedBuilder {
    let nap = command_tool(
        "nap",
        &[
            "sh",
            "-c",
            &format!("cat >/dev/null; sleep {seconds}; echo ok"),
        ],
        "read_only",
        30,
    );
    Testbed::new()
        .replies(vec![
            MockReply::calls(&[("nap", json!({}))]),
            MockReply::answer("Done."),
        ])
        .tools([nap])
}

#[tokio::test]
async fn a_schedule_fires_once_a_tick_each_firing_a_session_its_log_says_why() {
    let bed = answering().daemon().await;
    let id = add(&bed, &["--every", "1s"]).await;
    let daemon = bed.daemon();
    let world = &bed.world;
    eventually("three firings", Duration::from_secs(20), || async {
        (firings(&schedule_log(world, &id).await).len() >= 3).then_some(())
    })
    .await;
    remove(world, &id).await;
    let row = listed(world, &id).await;
    assert_eq!(row["removed_by"], "api", "{row}");
    assert!(
        row.get("next").is_none(),
        "a removed schedule has no next tick: {row}"
    );
    // What was due before the removal may still start: then nothing more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = schedule_log(world, &id).await;
    let fired = firings(&log);
    assert_eq!(log.last().unwrap().0, "ScheduleRemoved", "{log:?}");
    let ticks: Vec<i64> = fired.iter().map(|(t, _)| *t).collect();
    consecutive(&ticks, 1000);
    assert_eq!(row["fired"].as_u64(), Some(fired.len() as u64), "{row}");

    for (tick, session) in &fired {
        let view = until_idle(daemon, session).await;
        assert_eq!(view["answer"], "Done.");
        assert_eq!(view["scheduled_by"]["schedule"], id.as_str(), "{view}");
        let kinds = kinds_of(world, session).await;
        assert_eq!(
            kinds[..3],
            ["SessionStarted", "ScheduledBy", "UserMessage"],
            "{kinds:?}"
        );
        let events = schedule_log(world, session).await;
        let by = &events[1].1;
        assert_eq!(
            (by["schedule"].as_str(), by["tick_ms"].as_i64()),
            (Some(id.as_str()), Some(*tick))
        );
    }
    assert_eq!(bed.model.bodies().len(), fired.len(), "one turn a firing");
    let (_, sessions) = daemon.get("/sessions").await;
    let sessions = sessions.as_array().unwrap();
    assert_eq!(sessions.len(), fired.len(), "a schedule is not a session");
    assert!(sessions.iter().all(|s| s["session"] != id.as_str()));
    let timeline = stdout(&client(world, &["log", &id]).await);
    assert!(
        timeline.contains("ScheduleCreated") && timeline.contains("every 1s"),
        "{timeline}"
    );
    assert!(timeline.contains("ScheduleFired"), "{timeline}");
    let verified = client(world, &["verify", &id]).await;
    assert!(verified.status.success(), "{}", stderr(&verified));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_on_postgres_fire_each_tick_once_one_of_them_sigkilled_midway() {
    let bed = answering().on_postgres().await;
    let store = bed.world.store.clone().expect("a PostgreSQL store");
    let start = |name: &'static str| {
        let data = bed.world.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        let store = store.clone();
        async move { DaemonProcess::start(&data, &["--store", &store, "--lease-ttl-ms", "1500"]).await }
    };
    let doomed = start("a").await;
    let survivor = start("b").await;
    let request = json!({"spec": toml::from_str::<Value>(&bed.agent_toml).unwrap(),
        "every": "2s", "message": "tick"});
    let (status, created) = doomed.post("/schedules", &request).await;
    assert_eq!(status, 201, "{created}");
    let id = created["schedule"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_secs(5)).await;
    doomed.kill().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(survivor.delete(&format!("/schedules/{id}")).await, 204);
    let log = schedule_log(&bed.world, &id).await;
    let fired = firings(&log);
    let ticks: Vec<i64> = fired.iter().map(|(t, _)| *t).collect();
    assert!(ticks.len() >= 5, "about 11 s of 2 s ticks: {ticks:?}");
    consecutive(&ticks, 2000);
    assert!(skips(&log).is_empty(), "{:?}", skips(&log));
    for (_, session) in &fired {
        let view = until_idle(&survivor, session).await;
        assert_eq!(view["answer"], "Done.", "{view}");
    }
    assert_eq!(bed.model.bodies().len(), fired.len(), "one turn a tick");
    assert!(survivor.terminate().await.success());
}

#[tokio::test]
async fn after_a_downtime_catch_up_one_fires_the_newest_tick_and_all_fires_each() {
    let mut bed = answering().await;
    // Added with no daemon running: nothing fires until one starts.
    let one = add(&bed, &["--every", "1s", "--catch-up", "one"]).await;
    let all = add(
        &bed,
        &["--every", "1s", "--catch-up", "all", "--overlap", "queue"],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(3600)).await;
    assert!(firings(&schedule_log(&bed.world, &one).await).is_empty());
    bed.start_daemon(&[]).await;
    let world = &bed.world;
    eventually(
        "the missed ticks of all to fire",
        Duration::from_secs(20),
        || async { (firings(&schedule_log(world, &all).await).len() >= 4).then_some(()) },
    )
    .await;
    let (_, ()) = (remove(world, &one).await, remove(world, &all).await);
    let log = schedule_log(world, &one).await;
    let fired = firings(&log);
    let missed: u64 = (skips(&log).iter())
        .filter(|(reason, _)| reason == "missed")
        .map(|(_, n)| n)
        .sum();
    assert!(missed >= 2, "the older missed ticks are recorded: {log:?}");
    let first = fired.first().expect("the newest fired").0;
    let (_, created) = &log[0];
    let from = created["schedule"]["from_ms"].as_i64().unwrap();
    assert_eq!(
        first - from,
        (missed as i64 + 1) * 1000,
        "the newest due tick fired, the older ones are the missed"
    );

    let log = schedule_log(world, &all).await;
    let ticks: Vec<i64> = firings(&log).iter().map(|(t, _)| *t).collect();
    consecutive(&ticks, 1000);
    let from = log[0].1["schedule"]["from_ms"].as_i64().unwrap();
    assert_eq!(
        ticks[0] - from,
        1000,
        "all: the first missed tick fires first"
    );
    assert!(
        skips(&log).is_empty(),
        "queue with catch_up all skips none: {log:?}"
    );
}

#[tokio::test]
async fn overlap_skip_records_ticks_that_meet_a_running_turn_queue_waits_for_it() {
    let bed = slow(3).daemon().await;
    let skip = add(&bed, &["--every", "1s", "--overlap", "skip"]).await;
    let world = &bed.world;
    eventually(
        "a tick skipped for overlap",
        Duration::from_secs(20),
        || async {
            let log = schedule_log(world, &skip).await;
            skips(&log)
                .iter()
                .any(|(r, _)| r == "overlap")
                .then_some(())
        },
    )
    .await;
    remove(world, &skip).await;
    let fired = firings(&schedule_log(world, &skip).await);
    let daemon = bed.daemon();
    // No two firings' turns ran at once: each started after the previous
    // one's answer.
    let mut ended = 0;
    for (tick, session) in &fired {
        assert!(
            *tick >= ended,
            "tick {tick} fired while the previous turn ran (ended {ended})"
        );
        let view = until_idle(daemon, session).await;
        ended = chrono::DateTime::parse_from_rfc3339(view["last_activity"].as_str().unwrap())
            .unwrap()
            .timestamp_millis()
            - 1000;
    }

    let queue = add(
        &bed,
        &["--every", "1s", "--overlap", "queue", "--catch-up", "all"],
    )
    .await;
    eventually("two queued firings", Duration::from_secs(30), || async {
        (firings(&schedule_log(world, &queue).await).len() >= 2).then_some(())
    })
    .await;
    remove(world, &queue).await;
    let log = schedule_log(world, &queue).await;
    assert!(
        skips(&log).is_empty(),
        "a queued tick waits, never skipped: {log:?}"
    );
    let ticks: Vec<i64> = firings(&log).iter().map(|(t, _)| *t).collect();
    consecutive(&ticks, 1000);
}

#[tokio::test]
async fn a_daemon_killed_right_after_a_firings_append_starts_its_session_once_after_restart() {
    let mut bed = answering().await;
    let mut crashed = armed_daemon(&bed.world).await;
    let id = add(&bed, &["--every", "1s"]).await;
    died_at_the_crash_point(&mut crashed).await;
    let fired = firings(&schedule_log(&bed.world, &id).await);
    assert_eq!(fired.len(), 1, "{fired:?}");
    let (tick, session) = fired[0].clone();
    let absent = client(&bed.world, &["log", "--json", &session]).await;
    assert!(!absent.status.success(), "not started before the crash");

    bed.start_daemon(&[]).await;
    let daemon = bed.daemon();
    let view = until_idle(daemon, &session).await;
    remove(&bed.world, &id).await;
    assert_eq!(view["answer"], "Done.");
    let log = schedule_log(&bed.world, &session).await;
    assert_eq!(
        log[1],
        (
            "ScheduledBy".to_string(),
            json!({"schedule": id, "tick_ms": tick})
        )
    );
    let replies = log
        .iter()
        .filter(|(kind, _)| kind == "ModelReplied")
        .count();
    assert_eq!(replies, 1, "started once, asked once: {log:?}");
}

#[tokio::test]
async fn a_daemon_killed_right_after_a_firings_append_sends_its_message_once_after_restart() {
    let mut bed = answering().daemon().await;
    let session = bed.create().await;
    let (status, end) = bed.daemon().message_and_wait(&session, "hello").await;
    assert_eq!(status, 200, "{end}");
    bed.take_daemon().terminate().await;
    let mut crashed = armed_daemon(&bed.world).await;
    let args = [
        "schedule", "add", "--into", &session, "--every", "1s", "tick",
    ];
    let out = client(&bed.world, &args).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out)
        .trim()
        .strip_prefix("schedule ")
        .unwrap()
        .to_string();
    died_at_the_crash_point(&mut crashed).await;
    let fired = firings(&schedule_log(&bed.world, &id).await);
    assert_eq!(fired.len(), 1, "{fired:?}");
    let marks = |kinds: Vec<String>| kinds.iter().filter(|k| *k == "ScheduledBy").count();
    assert_eq!(
        marks(kinds_of(&bed.world, &session).await),
        0,
        "not delivered before the crash"
    );

    bed.start_daemon(&[]).await;
    let world = &bed.world;
    eventually(
        "the crashed firing delivered",
        Duration::from_secs(20),
        || async { (marks(kinds_of(world, &session).await) >= 1).then_some(()) },
    )
    .await;
    remove(world, &id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let events = schedule_log(world, &session).await;
    let delivered: Vec<i64> = (events.iter())
        .filter(|(kind, _)| kind == "ScheduledBy")
        .map(|(_, e)| e["tick_ms"].as_i64().unwrap())
        .collect();
    assert_eq!(
        delivered[0], fired[0].0,
        "the crashed firing is delivered first"
    );
    let mut unique = delivered.clone();
    unique.dedup();
    assert_eq!(
        unique, delivered,
        "each firing delivered once: {delivered:?}"
    );
    let ticks: Vec<i64> = firings(&schedule_log(world, &id).await)
        .iter()
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(
        delivered.len(),
        ticks.len(),
        "every firing delivered: {delivered:?} {ticks:?}"
    );
}

#[tokio::test]
async fn bad_schedules_are_refused_naming_what_is_wrong() {
    let bed = answering().daemon().await;
    let daemon = bed.daemon();
    let spec = toml::from_str::<Value>(&bed.agent_toml).unwrap();
    // A message no firing could send: past the model's context window.
    let mut narrow = toml::from_str::<toml::Table>(&bed.agent_toml).unwrap();
    let model = narrow["model"].as_table_mut().unwrap();
    model.insert("context_window".into(), 16.into());
    let narrow_session = daemon.create(&toml::to_string(&narrow).unwrap()).await;
    let long = "word ".repeat(200);
    let cases = [
        (
            json!({"spec": narrow, "every": "1s", "message": long}),
            400,
            "context window",
        ),
        (
            json!({"every": "1s", "message": long, "into": narrow_session}),
            400,
            "context window",
        ),
        (
            json!({"spec": spec, "every": "0s", "message": "x"}),
            400,
            "\"0s\"",
        ),
        (
            json!({"spec": spec, "cron": "61 * * * *", "message": "x"}),
            400,
            "61 * * * *",
        ),
        (
            json!({"spec": spec, "cron": "0 9 * * *", "timezone": "Mars/Base", "message": "x"}),
            400,
            "Mars/Base",
        ),
        (
            json!({"spec": spec, "every": "1s", "cron": "* * * * *", "message": "x"}),
            400,
            "exactly one of every",
        ),
        (
            json!({"spec": spec, "every": "1s", "message": "  "}),
            400,
            "message",
        ),
        (
            json!({"every": "1s", "message": "x"}),
            400,
            "needs an agent",
        ),
        (
            json!({"every": "1s", "message": "x", "into": uuid::Uuid::now_v7()}),
            404,
            "no session",
        ),
        (
            json!({"spec": spec, "every": "1s", "message": "x", "overlap": "both"}),
            400,
            "overlap \"both\"",
        ),
        (
            json!({"spec": spec, "every": "1s", "message": "x", "colour": "red"}),
            422,
            "colour",
        ),
    ];
    for (body, status, says) in cases {
        let (got, error) = daemon.post("/schedules", &body).await;
        assert_eq!(got, status, "{body}: {error}");
        let error = error["error"].as_str().unwrap_or_default().to_string();
        assert!(error.contains(says), "{body}: {error}");
    }
    let (_, listed) = daemon.get("/schedules").await;
    assert_eq!(listed, json!([]), "nothing was created");
    let out = client(
        &bed.world,
        &[
            "schedule",
            "add",
            "--agent",
            bed.agent_arg(),
            "--every",
            "1x",
            "x",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("\"1x\""), "{}", stderr(&out));
    let missing = format!("/schedules/{}", uuid::Uuid::now_v7());
    assert_eq!(daemon.delete(&missing).await, 404);
}
