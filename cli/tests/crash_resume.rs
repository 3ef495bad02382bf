//! Crash and resume, end to end: the real binary, a model server and a
//! side-effect sink on loopback, SIGKILL at the worst moments.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::json;

const MESSAGE: &str = "Charge customer 1, look them up, then email them.";

fn replies() -> Vec<MockReply> {
    vec![
        MockReply::calls(&[("charge", json!({"n": 1})), ("lookup", json!({"n": 2}))]),
        MockReply::calls(&[("email", json!({"n": 3}))]),
        MockReply::answer("Charged, looked up and emailed."),
    ]
}

/// The billing agent (charge, look up, email) in `world`.
async fn setup_in(world: World) -> Testbed {
    Testbed::new()
        .in_world(world)
        .replies(replies())
        .sink_tools(|sink| billing_tools(sink).to_vec())
        .await
}

async fn setup() -> Testbed {
    setup_in(World::new()).await
}

/// `mneme run` of the billing agent with crash point `point` armed; the
/// process must die there. Returns the session it named.
async fn run_crashing_at(s: &Testbed, point: &str) -> String {
    let out = (s.world)
        .run_crashing(&["run", "--agent", s.agent_arg(), MESSAGE], point)
        .await;
    assert!(
        !out.status.success(),
        "the crash point {point} must kill the run"
    );
    session_id(&out)
}

/// `mneme run` of the billing agent, SIGKILLed while the sink holds its
/// email (applied, not yet answered). Returns the session it named.
async fn killed_while_emailing(s: &Testbed) -> String {
    session_id(&s.run_killed_in("email", MESSAGE).await)
}

/// `mneme resume SESSION`, which must succeed.
async fn resume_ok(s: &Testbed, session: &str) -> std::process::Output {
    let out = s.run(&["resume", session]).await;
    assert!(out.status.success(), "resume failed: {}", stderr(&out));
    out
}

/// What an uncrashed run sends and ends with.
struct Reference {
    bodies: Vec<Vec<u8>>,
    final_request: Vec<u8>,
    answer: String,
    cache: (u64, u64),
}

/// (prompt tokens, cached prompt tokens) of a session, from `mneme sessions --json`.
async fn cache_tokens(world: &World, session: &str) -> (u64, u64) {
    let out = world.run(&["sessions", "--json"]).await;
    let row = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["session"] == session)
        .unwrap();
    (
        row["prompt_tokens"].as_u64().unwrap(),
        row["cached_tokens"].as_u64().unwrap(),
    )
}

async fn reference() -> Reference {
    let s = setup().await;
    let out = s.run_agent(MESSAGE).await;
    assert!(
        out.status.success(),
        "uncrashed run failed: {}",
        stderr(&out)
    );
    let session = session_id(&out);
    Reference {
        bodies: s.model.bodies(),
        final_request: rebuilt_request(&s.world, &session).await,
        answer: stdout(&out),
        cache: cache_tokens(&s.world, &session).await,
    }
}

/// Every request the crashed-and-resumed session sent is byte-identical to
/// the uncrashed run's request at the same point of the conversation.
fn assert_requests_match(crashed: &[Vec<u8>], reference: &Reference) {
    assert_eq!(reference.bodies.len(), 3);
    for body in crashed {
        let turn = serde_json::from_slice::<serde_json::Value>(body).unwrap()["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .count();
        assert!(
            body == &reference.bodies[turn],
            "request #{turn} after resume differs from the uncrashed run's:\n{}\nvs\n{}",
            String::from_utf8_lossy(body),
            String::from_utf8_lossy(&reference.bodies[turn])
        );
    }
}

async fn assert_finished_like_reference(
    s: &Testbed,
    session: &str,
    answer: &str,
    reference: &Reference,
) {
    assert_eq!(answer, reference.answer);
    assert_eq!(
        rebuilt_request(&s.world, session).await,
        reference.final_request,
        "final transcript differs"
    );
    assert_requests_match(&s.model.bodies(), reference);
    let stats = s.sink.stats();
    assert_eq!(
        stats.path("charge").effects,
        1,
        "charge applied {:?}",
        stats
    );
    assert_eq!(stats.path("email").effects, 1, "email applied {:?}", stats);
    assert_eq!(
        stats.hits_by_key.len(),
        2,
        "one idempotency key per call: {:?}",
        stats.hits_by_key
    );
    let verify = s.world.run(&["verify", session]).await;
    assert!(verify.status.success(), "verify: {}", stdout(&verify));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_side_effect_is_in_flight_then_resume() {
    let reference = reference().await;
    let s = setup().await;
    let session = killed_while_emailing(&s).await;
    assert_eq!(s.sink.stats().path("email").hits, 1);

    let out = resume_ok(&s, &session).await;
    assert_eq!(
        s.sink.stats().path("email").hits,
        2,
        "the email is re-sent once, with its key"
    );
    assert_eq!(
        s.sink.stats().path("charge").hits,
        1,
        "the finished charge is reused, not re-sent"
    );
    assert_finished_like_reference(&s, &session, &stdout(&out), &reference).await;
    // The server's prefix cache served the resumed session exactly as much.
    let cache = cache_tokens(&s.world, &session).await;
    assert_eq!(
        cache, reference.cache,
        "(prompt, cached) tokens after the resume"
    );
    assert!(cache.1 > 0, "the simulated prefix cache hit: {cache:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_tool_returned_before_tool_finished_then_resume() {
    let reference = reference().await;
    let s = setup().await;
    // The third tool return is the email (charge and lookup run first).
    let session = run_crashing_at(&s, "tool_returned:3").await;
    let kinds = event_kinds(&s.world, &session).await;
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("ToolStarted"),
        "{kinds:?}"
    );
    assert_eq!(s.sink.stats().path("email").effects, 1);

    let out = resume_ok(&s, &session).await;
    assert_finished_like_reference(&s, &session, &stdout(&out), &reference).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_model_reply_is_appended_asks_the_model_again() {
    let reference = reference().await;
    let s = setup().await;
    let session = run_crashing_at(&s, "model_replied_before_append:2").await;
    let out = resume_ok(&s, &session).await;
    assert_eq!(
        s.model.bodies().len(),
        4,
        "the lost reply is requested once more"
    );
    assert_finished_like_reference(&s, &session, &stdout(&out), &reference).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_tool_without_key_support_ends_in_doubt_and_resolve_continues() {
    let world = World::new();
    let effects = world.dir.path().join("effects.log");
    let script = format!(
        "cat >/dev/null; echo \"$MNEME_IDEMPOTENCY_KEY\" >> {}; echo '{{\"sent\":true}}'",
        effects.display()
    );
    let bed = Testbed::new()
        .in_world(world)
        .replies(vec![
            MockReply::calls(&[("notify", json!({"n": 1}))]),
            MockReply::answer("Notified."),
        ])
        .tools([command_tool(
            "notify",
            &["sh", "-c", &script],
            "side_effect",
            10,
        )])
        .await;
    let world = &bed.world;
    let out = world
        .run_crashing(
            &["run", "--agent", bed.agent_arg(), "notify them"],
            "tool_returned",
        )
        .await;
    assert!(!out.status.success());
    let session = session_id(&out);
    assert_eq!(
        std::fs::read_to_string(&effects).unwrap().lines().count(),
        1
    );

    let out = world.run(&["resume", &session]).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "stops for a decision: {}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("mneme resolve"), "{}", stderr(&out));
    let kinds = event_kinds(world, &session).await;
    assert_eq!(&kinds[kinds.len() - 2..], ["ToolInDoubt", "SessionPaused"]);
    let sessions = stdout(&world.run(&["sessions", "--json"]).await);
    assert!(sessions.contains("\"status\":\"paused\""), "{sessions}");
    // Resuming again changes nothing: still waiting for a person.
    let again = world.run(&["resume", &session]).await;
    assert_eq!(again.status.code(), Some(3));
    assert_eq!(event_kinds(world, &session).await.len(), kinds.len());

    let wrong = world
        .run(&["resolve", &session, "call_9_9", "--fail", "x"])
        .await;
    assert!(
        !wrong.status.success() && stderr(&wrong).contains("not in doubt"),
        "{}",
        stderr(&wrong)
    );
    let out = world
        .run(&[
            "resolve",
            &session,
            "call_0_0",
            "--skip",
            "--result",
            "{\"sent\":true}",
            "--by",
            "ops",
        ])
        .await;
    assert!(out.status.success(), "resolve: {}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Notified.");
    assert_eq!(
        std::fs::read_to_string(&effects).unwrap().lines().count(),
        1,
        "never run twice"
    );
    let log = stdout(
        &world
            .run(&["log", &session, "--kind", "ToolResolved"])
            .await,
    );
    assert!(log.contains("skip") && log.contains("by ops"), "{log}");
}

/// On PostgreSQL a killed `mneme run` leaves its lease behind, live until
/// it lapses. The next `mneme resume` on this host sees that its holder has
/// exited and takes the lease over at once (a minute's lease here: waiting
/// it out would show).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_right_after_a_sigkill_on_postgres_takes_the_dead_lease_over() {
    let lease = std::time::Duration::from_secs(60);
    let s = setup_in(World {
        lease_ttl_ms: lease.as_millis() as u64,
        ..World::on_postgres()
    })
    .await;
    let session = killed_while_emailing(&s).await;

    let started = std::time::Instant::now();
    let out = resume_ok(&s, &session).await;
    let took = started.elapsed();
    println!("resume after a same-host SIGKILL on PostgreSQL: {took:?}");
    assert!(
        took < lease / 2,
        "the dead holder's lease was waited out: {took:?}"
    );
    assert!(
        stderr(&out).contains("which has exited: taken over"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out).trim(), "Charged, looked up and emailed.");
    let stats = s.sink.stats();
    assert_eq!(stats.path("charge").effects, 1, "{stats:?}");
    assert_eq!(stats.path("email").effects, 1, "{stats:?}");
    let verify = s.world.run(&["verify", &session]).await;
    assert!(verify.status.success(), "verify: {}", stdout(&verify));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_resumers_at_once_one_wins_and_nothing_runs_twice() {
    let s = setup().await;
    // A session that crashed with the charge started but not finished.
    let session = run_crashing_at(&s, "tool_started_durable").await;
    let hold = s.sink.hold("charge");
    let first = s
        .world
        .spawn_until_applied(&["resume", &session], hold.applied)
        .await;
    let second = s.world.run(&["resume", &session]).await;
    assert_eq!(second.status.code(), Some(1));
    assert!(
        stderr(&second).contains("in use by another process"),
        "{}",
        stderr(&second)
    );
    hold.release.send(()).unwrap();
    let first = first.wait_with_output().await.unwrap();
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(s.sink.stats().path("charge").effects, 1);
    assert_eq!(s.sink.stats().path("email").effects, 1);
    assert!(s.world.run(&["verify", &session]).await.status.success());
}
