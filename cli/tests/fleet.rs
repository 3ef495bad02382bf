//! Several daemons, one PostgreSQL store: sessions move to a surviving
//! daemon when their owner dies, every side effect still happens once, and
//! live streams follow sessions that another daemon runs.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::{all_accepted, follow_two_turns, kill_mid_load, DaemonProcess};
use mneme_e2e::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// Short leases, so that a takeover happens within the test.
const LEASE_TTL_MS: &str = "1500";

async fn daemon_on(world: &World, name: &str, store: &str) -> DaemonProcess {
    daemon_with_ttl(world, name, store, LEASE_TTL_MS).await
}

async fn daemon_with_ttl(world: &World, name: &str, store: &str, ttl_ms: &str) -> DaemonProcess {
    let data = world.dir.path().join(name);
    std::fs::create_dir_all(&data).unwrap();
    DaemonProcess::start(&data, &["--store", store, "--lease-ttl-ms", ttl_ms]).await
}

/// The billing agent on a fresh PostgreSQL store (for daemons given
/// [`store_of`] it).
fn billing() -> TestbedBuilder {
    Testbed::new()
        .on_postgres()
        .replies(billing_replies())
        .sink_tools(|sink| billing_tools(sink).to_vec())
}

/// The billing agent on a fresh PostgreSQL store, its lookup slow enough
/// that every turn is under way when the daemon running it stops.
fn slow_billing() -> TestbedBuilder {
    let slow_lookup = command_tool(
        "lookup",
        &[
            "sh",
            "-c",
            "cat >/dev/null; sleep 2; echo '{\"name\":\"Ada\"}'",
        ],
        "read_only",
        10,
    );
    Testbed::new()
        .on_postgres()
        .replies(billing_replies())
        .sink_tools(|sink| {
            let [charge, _, email] = billing_tools(sink);
            vec![charge, slow_lookup, email]
        })
}

/// The PostgreSQL store of `bed`.
fn store_of(bed: &Testbed) -> &str {
    bed.world.store.as_deref().expect("a testbed on PostgreSQL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_one_of_two_daemons_mid_load_and_the_other_finishes_every_session_once() {
    const SESSIONS: usize = 50;
    let bed = billing().await;
    let (store, sink, agent) = (store_of(&bed), &bed.sink, &bed.agent_toml);
    let doomed = daemon_on(&bed.world, "a", store).await;
    let survivor = daemon_on(&bed.world, "b", store).await;
    let mut ids = Vec::new();
    for i in 0..SESSIONS {
        let daemon = if i % 2 == 0 { &doomed } else { &survivor };
        ids.push(daemon.create(agent).await);
    }
    let posts = ids.iter().enumerate().map(|(i, id)| {
        let daemon = if i % 2 == 0 { &doomed } else { &survivor };
        daemon.message(id, "charge and email")
    });
    all_accepted(posts).await;
    kill_mid_load(doomed, sink, SESSIONS).await;

    survivor
        .wait_all_idle(SESSIONS, Duration::from_secs(120))
        .await;
    assert_billed_once(sink, SESSIONS);
    survivor
        .assert_verified_with_answer(&ids, "Charged and emailed.")
        .await;
    let taken_over = survivor.metric("mneme_sessions_recovered_total").await;
    assert!(
        (1..=SESSIONS as u64 / 2).contains(&taken_over),
        "the survivor takes over the dead daemon's unfinished sessions, and only those: {taken_over}"
    );
    assert!(survivor.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_frozen_past_its_leases_is_fenced_when_it_wakes() {
    const SESSIONS: usize = 8;
    let bed = slow_billing().await;
    let (store, sink) = (store_of(&bed), &bed.sink);
    let frozen = daemon_on(&bed.world, "a", store).await;
    let survivor = daemon_on(&bed.world, "b", store).await;
    let mut ids = Vec::new();
    for _ in 0..SESSIONS {
        ids.push(frozen.create(&bed.agent_toml).await);
    }
    for id in &ids {
        let (status, body) = frozen.message(id, "go").await;
        assert_eq!(status, 202, "{body}");
    }
    let pid = frozen.child.id().unwrap() as i32;
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Until its leases lapse, the frozen daemon still owns its sessions.
    let (status, refused) = survivor
        .post(
            &format!("/sessions/{}/messages", ids[0]),
            &json!({"text": "me too"}),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    let (_, view) = survivor.get(&format!("/sessions/{}", ids[0])).await;
    let owner = view["running_on"].as_str().unwrap_or_default().to_string();
    assert!(owner.starts_with("daemon@"), "{view}");
    assert!(
        refused["error"].as_str().unwrap().contains(&owner),
        "{refused} {view}"
    );
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("is leased to daemon@"),
        "{refused}"
    );
    survivor
        .wait_all_idle(SESSIONS, Duration::from_secs(60))
        .await;
    let mut before = Vec::new();
    for id in &ids {
        let (_, events) = survivor.get(&format!("/sessions/{id}/events")).await;
        before.push(events.as_array().unwrap().len());
    }
    assert_eq!(
        survivor.metric("mneme_sessions_recovered_total").await,
        SESSIONS as u64,
        "every turn was under way when its daemon froze"
    );
    let (_, view) = survivor.get(&format!("/sessions/{}", ids[0])).await;
    assert_eq!(
        view["running_on"],
        serde_json::Value::Null,
        "at rest: {view}"
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    // Time, not a barrier: the woken daemon may append nothing within 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (id, count) in ids.iter().zip(before) {
        let (_, events) = survivor.get(&format!("/sessions/{id}/events")).await;
        assert_eq!(
            events.as_array().unwrap().len(),
            count,
            "the woken daemon appended to {id} after it was taken over"
        );
    }
    assert_billed_once(sink, SESSIONS);
    survivor
        .assert_verified_with_answer(&ids, "Charged and emailed.")
        .await;
    assert!(frozen.terminate().await.success());
    assert!(survivor.terminate().await.success());
}

/// A daemon fenced out of a session (frozen past its lease while running
/// it, then woken) can still record a person's decision on it later: the
/// decision is taken under a fresh lease, not with the fenced turn's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_fenced_out_of_a_session_still_records_a_decision_on_it() {
    let slow_lookup = ["sh", "-c", "cat >/dev/null; sleep 2; echo '{}'"];
    let bed = Testbed::new()
        .on_postgres()
        .replies(vec![
            MockReply::calls(&[("lookup", json!({"n": 1}))]),
            MockReply::calls(&[("refund", json!({"n": 2}))]),
            MockReply::answer("refunded"),
        ])
        .tools([command_tool("lookup", &slow_lookup, "read_only", 10)])
        .sink_tools(|sink| vec![refund_needing_approval(sink)])
        .await;
    let (store, sink) = (store_of(&bed), &bed.sink);
    let fenced = daemon_on(&bed.world, "a", store).await;
    let survivor = daemon_on(&bed.world, "b", store).await;
    let id = fenced.create(&bed.agent_toml).await;
    let (status, body) = fenced.message(&id, "refund").await;
    assert_eq!(status, 202, "{body}");
    let pid = fenced.child.id().unwrap() as i32;
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let call = awaiting_approval(&survivor, &id).await;
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    // The woken turn's next append is refused as fenced; the turn ends.
    eventually(
        "the fenced turn to end",
        Duration::from_secs(20),
        || async {
            let running = fenced.metric("mneme_turns_running").await;
            if running == 0 {
                Ok(())
            } else {
                Err(format!("{running} turns running"))
            }
        },
    )
    .await;

    let (status, end) = fenced
        .post(
            &format!("/sessions/{id}/calls/{call}/approve"),
            &json!({"approved": true, "by": "ops", "wait": true}),
        )
        .await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("refunded")),
        "{end}"
    );
    assert_eq!(sink.stats().path("refund").effects, 1);
    fenced.assert_verified_with_answer(&[id], "refunded").await;
    assert!(fenced.terminate().await.success());
    assert!(survivor.terminate().await.success());
}

/// Waits (up to a minute) until `daemon` shows session `id` waiting for an
/// approval; returns that call's id.
async fn awaiting_approval(daemon: &DaemonProcess, id: &str) -> String {
    let what = format!("{id} to wait for an approval");
    eventually(what, Duration::from_secs(60), || async {
        let (_, plan) = daemon.get(&format!("/sessions/{id}/replay")).await;
        let waiting = plan["calls"].as_array().and_then(|calls| {
            calls
                .iter()
                .find(|c| c["decision"] == "awaiting_approval")
                .and_then(|c| c["call_id"].as_str())
        });
        waiting.map(String::from).ok_or(plan)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_on_one_daemon_and_the_other_streams_it_live() {
    let bed = Testbed::new()
        .on_postgres()
        .replies(vec![MockReply::answer("one"), MockReply::answer("two")])
        .await;
    let runner = daemon_on(&bed.world, "a", store_of(&bed)).await;
    let watcher = daemon_on(&bed.world, "b", store_of(&bed)).await;
    let (_, seen) = follow_two_turns(&runner, &watcher, &bed.agent_toml).await;
    assert_eq!(seen.matches("event: UserMessage").count(), 2, "{seen}");
    assert!(runner.terminate().await.success());
    assert!(watcher.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_sigkilled_mid_turn_and_restarted_takes_its_sessions_back_at_once() {
    const SESSIONS: usize = 4;
    // Leases far longer than the test: waiting them out would fail it.
    const LONG_TTL_MS: &str = "120000";
    let bed = slow_billing().await;
    let (store, sink) = (store_of(&bed), &bed.sink);
    let killed = daemon_with_ttl(&bed.world, "a", store, LONG_TTL_MS).await;
    let mut ids = Vec::new();
    for _ in 0..SESSIONS {
        let id = killed.create(&bed.agent_toml).await;
        let (status, body) = killed.message(&id, "go").await;
        assert_eq!(status, 202, "{body}");
        ids.push(id);
    }
    let under_way = ids.clone();
    eventually("every turn under way", Duration::from_secs(30), || async {
        for id in &under_way {
            let (_, events) = killed
                .get(&format!("/sessions/{id}/events?kind=ToolStarted"))
                .await;
            if events.as_array().map_or(0, Vec::len) == 0 {
                return Err(format!("{id}: no tool started"));
            }
        }
        Ok(())
    })
    .await;
    let (_, view) = killed.get(&format!("/sessions/{}", ids[0])).await;
    let dead_owner = view["running_on"].as_str().unwrap().to_string();
    let started = Instant::now();
    killed.kill().await;
    let restarted = daemon_with_ttl(&bed.world, "a", store, LONG_TTL_MS).await;
    let took = restarted
        .wait_all_idle(SESSIONS, Duration::from_secs(60))
        .await;
    eprintln!(
        "kill to {SESSIONS} sessions finished on the restarted daemon: {:?} (restart and the rest of each turn included)",
        started.elapsed()
    );
    assert!(
        took < Duration::from_secs(60),
        "taken over long before the leases' 120 s"
    );
    assert_eq!(
        restarted.metric("mneme_sessions_recovered_total").await,
        SESSIONS as u64,
        "every session its dead predecessor ran"
    );
    assert_billed_once(sink, SESSIONS);
    restarted
        .assert_verified_with_answer(&ids, "Charged and emailed.")
        .await;
    let (_, view) = restarted.get(&format!("/sessions/{}", ids[0])).await;
    assert_eq!(
        view["running_on"],
        serde_json::Value::Null,
        "{view} (was {dead_owner})"
    );
    assert!(restarted.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_shut_down_mid_turn_hands_its_sessions_over_at_once() {
    const SESSIONS: usize = 6;
    // Leases far longer than the test: only a handover can explain a takeover.
    const LONG_TTL_MS: &str = "120000";
    let bed = slow_billing().await;
    let (store, sink) = (store_of(&bed), &bed.sink);
    let leaving = daemon_with_ttl(&bed.world, "a", store, LONG_TTL_MS).await;
    let staying = daemon_with_ttl(&bed.world, "b", store, LONG_TTL_MS).await;
    let mut ids = Vec::new();
    for _ in 0..SESSIONS {
        let id = leaving.create(&bed.agent_toml).await;
        let (status, body) = leaving.message(&id, "go").await;
        assert_eq!(status, 202, "{body}");
        ids.push(id);
    }
    let started = Instant::now();
    assert!(leaving.terminate().await.success());
    staying
        .wait_all_idle(SESSIONS, Duration::from_secs(60))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "taken over long before the leases' 120 s"
    );
    assert_eq!(
        staying.metric("mneme_sessions_recovered_total").await,
        SESSIONS as u64,
        "every session paused by the shutdown moved to the other daemon"
    );
    assert_billed_once(sink, SESSIONS);
    staying
        .assert_verified_with_answer(&ids, "Charged and emailed.")
        .await;
    assert!(staying.terminate().await.success());
}

/// Two daemons on one store; `runner` is in the slow lookup of a turn of
/// session `id`, `other` runs nothing.
struct Fleet {
    bed: Testbed,
    runner: DaemonProcess,
    other: DaemonProcess,
    id: String,
}

impl Fleet {
    async fn with_a_turn_running() -> Fleet {
        let bed = slow_billing().await;
        let runner = daemon_on(&bed.world, "a", store_of(&bed)).await;
        let other = daemon_on(&bed.world, "b", store_of(&bed)).await;
        let id = runner.create(&bed.agent_toml).await;
        let (status, body) = runner.message(&id, "go").await;
        assert_eq!(status, 202, "{body}");
        Fleet {
            bed,
            runner,
            other,
            id,
        }
    }

    /// SIGTERM both daemons; each exits 0.
    async fn stop(self) {
        assert!(self.runner.terminate().await.success());
        assert!(self.other.terminate().await.success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_asked_of_one_daemon_stops_the_turn_running_on_another() {
    let fleet = Fleet::with_a_turn_running().await;
    let (other, sink, id) = (&fleet.other, &fleet.bed.sink, &fleet.id);
    let (status, asked) = other
        .post(&format!("/sessions/{id}/pause"), &json!({}))
        .await;
    assert_eq!(status, 200, "{asked}");
    assert!(
        asked["running_on"].as_str().unwrap().starts_with("daemon@"),
        "{asked}"
    );
    eventually("the turn to pause", Duration::from_secs(20), || async {
        let (_, view) = other.get(&format!("/sessions/{id}")).await;
        if view["status"] == "paused" {
            Ok(())
        } else {
            Err(view)
        }
    })
    .await;
    let (_, paused) = other
        .get(&format!("/sessions/{id}/events?kind=SessionPaused"))
        .await;
    assert_eq!(
        paused[0]["event"]["SessionPaused"]["reason"], "paused on request",
        "{paused}"
    );
    // Either daemon continues it.
    resumes_after_a_pause_before_the_email(other, sink, id).await;
    fleet.stop().await;
}

/// A turn that `mneme run` runs on the shared store hears a pause asked of
/// a daemon, as a daemon's turn would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_asked_of_a_daemon_stops_a_turn_the_cli_runs() {
    let bed = slow_billing().await;
    let (world, sink) = (&bed.world, &bed.sink);
    let daemon = daemon_on(world, "a", store_of(&bed)).await;
    let id = daemon.create(&bed.agent_toml).await;
    let cli = world
        .mneme()
        .args(["run", "--session", &id, "go"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let what = "a pause to reach the turn the CLI runs";
    let asked = eventually(what, Duration::from_secs(20), || async {
        let (_, asked) = daemon
            .post(&format!("/sessions/{id}/pause"), &json!({}))
            .await;
        if asked["running_on"]
            .as_str()
            .is_some_and(|o| o.starts_with("cli@"))
        {
            Ok(asked)
        } else {
            Err(asked)
        }
    })
    .await;
    assert_eq!(asked["pause_requested"], true, "{asked}");
    let out = tokio::time::timeout(Duration::from_secs(30), cli.wait_with_output())
        .await
        .expect("the CLI's turn stops")
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is paused (paused on request)"),
        "{}",
        stderr(&out)
    );
    resumes_after_a_pause_before_the_email(&daemon, sink, &id).await;
    assert!(daemon.terminate().await.success());
}

/// Session `id` of the slow billing agent, paused before its email, is
/// resumed by `daemon` to its answer; nothing runs twice.
async fn resumes_after_a_pause_before_the_email(daemon: &DaemonProcess, sink: &Sink, id: &str) {
    assert_eq!(
        sink.stats().path("email").effects,
        0,
        "paused before the email"
    );
    let (status, end) = daemon
        .post(&format!("/sessions/{id}/resume"), &json!({"wait": true}))
        .await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("Charged and emailed.")),
        "{end}"
    );
    assert_billed_once(sink, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_asked_of_one_daemon_stops_the_turn_on_another_then_records_it() {
    let fleet = Fleet::with_a_turn_running().await;
    let (runner, other, sink, id) = (&fleet.runner, &fleet.other, &fleet.bed.sink, &fleet.id);
    let (status, cancelled) = other
        .post(&format!("/sessions/{id}/cancel"), &json!({"by": "ops"}))
        .await;
    assert_eq!(status, 200, "{cancelled}");
    let (_, view) = runner.get(&format!("/sessions/{id}")).await;
    assert_eq!(view["status"], "cancelled", "{view}");
    assert_eq!(view["running_on"], serde_json::Value::Null, "{view}");
    let (_, verified) = runner.get(&format!("/sessions/{id}/verify")).await;
    assert_eq!(verified["ok"], true, "{verified}");
    assert_eq!(
        sink.stats().path("email").effects,
        0,
        "stopped before the email"
    );
    fleet.stop().await;
}
