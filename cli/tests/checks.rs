//! In-doubt calls settled by the tool's own check, through the real
//! binary: a payments API that ignores idempotency keys but can be asked
//! whether a charge happened (`GET /charges?key=…`). Interrupted after the
//! charge, the resume records the check's answer as the call's outcome;
//! interrupted before it, the charge runs again with the same key; a check
//! that cannot tell leaves the call in doubt for a person, as before.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use mneme_e2e::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Charges by idempotency key, each applied as often as it was asked
/// (the API ignores keys); `bad_answer` (status, body) answers the check
/// when set.
#[derive(Default)]
struct Payments {
    charges: Mutex<BTreeMap<String, usize>>,
    bad_answer: Mutex<Option<(u16, String)>>,
}

type Shared = Arc<Payments>;

async fn charge(State(p): State<Shared>, headers: axum::http::HeaderMap) -> Json<Value> {
    let key = headers["idempotency-key"].to_str().unwrap().to_string();
    *p.charges.lock().unwrap().entry(key.clone()).or_default() += 1;
    Json(json!({"charge": key}))
}

async fn lookup(
    State(p): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Some((status, body)) = p.bad_answer.lock().unwrap().clone() {
        return (StatusCode::from_u16(status).unwrap(), body).into_response();
    }
    let key = &query["key"];
    match p.charges.lock().unwrap().contains_key(key) {
        true => (
            StatusCode::OK,
            Json(json!({"applied": true, "result": {"charge": key, "found": "by check"}})),
        )
            .into_response(),
        false => (StatusCode::NOT_FOUND, Json(json!({}))).into_response(),
    }
}

async fn payments() -> (Shared, String, tokio::sync::oneshot::Sender<()>) {
    let payments = Shared::default();
    let app = Router::new()
        .route("/charge", post(charge))
        .route("/charges", get(lookup))
        .with_state(payments.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = serve_until_dropped(listener, app);
    (payments, base, stop)
}

/// A world whose agent charges once through a key-ignoring HTTP tool with
/// a check, then answers.
async fn charging_world(base: &str) -> Testbed {
    let tool = http_tool("charge", &format!("{base}/charge"), "side_effect")
        + "honours_idempotency_key = false\n"
        + &format!("check = {{ url = \"{base}/charges?key={{key}}&amount={{args.amount}}\" }}\n");
    Testbed::new()
        .replies(vec![
            MockReply::calls(&[("charge", json!({"amount": 500}))]),
            MockReply::answer("Charged."),
        ])
        .tools([tool])
        .await
}

/// `bed`'s agent run with crash point `at` armed, then resumed: the
/// session and the resume's answer.
async fn crash_then_resume(bed: &Testbed, at: &str) -> (String, String) {
    let world = &bed.world;
    let out = world
        .run_crashing(&["run", "--agent", bed.agent_arg(), "charge ada"], at)
        .await;
    assert!(
        !out.status.success(),
        "the crash point {at} was not reached"
    );
    let session = session_id(&out);
    let out = world.run(&["resume", &session]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    (session, stdout(&out))
}

/// After the resume: exactly one charge was applied; the session's log
/// (JSON lines) and its ToolChecked and ToolFinished events.
async fn charged_once(payments: &Payments, world: &World, session: &str) -> (String, Vec<Value>) {
    let charges = payments.charges.lock().unwrap().clone();
    assert_eq!(charges.values().sum::<usize>(), 1, "{charges:?}");
    let log = stdout(&world.run(&["log", session, "--json"]).await);
    let events = checked_events(&log);
    (log, events)
}

fn checked_events(log: &str) -> Vec<Value> {
    log.lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|e| matches!(e["kind"].as_str(), Some("ToolChecked" | "ToolFinished")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_interrupted_after_it_applied_is_settled_by_the_check() {
    let (payments, base, _stop) = payments().await;
    let bed = charging_world(&base).await;
    let (world, model) = (&bed.world, &bed.model);
    let (session, answer) = crash_then_resume(&bed, "tool_returned").await;
    assert!(answer.contains("Charged."), "{answer}");
    let (log, events) = charged_once(&payments, world, &session).await;
    assert_eq!(events.len(), 2, "{log}");
    let checked = &events[0]["event"]["ToolChecked"];
    assert_eq!(
        (checked["answer"].as_str(), checked["attempt"].as_u64()),
        (Some("Applied"), Some(1))
    );
    let finished = &events[1]["event"]["ToolFinished"];
    assert_eq!(finished["settled_by_check"], true, "{finished}");
    let key = payments
        .charges
        .lock()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    assert!(finished["outcome"]["Ok"]
        .as_str()
        .unwrap()
        .contains(key.as_str()));
    // The check's answer is kept as it gave it.
    let answered: Value = serde_json::from_str(checked["answered"].as_str().unwrap()).unwrap();
    assert_eq!(answered["found"], "by check", "{checked}");
    // The model was told the check's result, and that it came from the
    // check, not the tool; no person was asked.
    let last = String::from_utf8(model.bodies().last().unwrap().clone()).unwrap();
    assert!(last.contains("by check"), "{last}");
    assert!(
        last.contains(replay::prompt::SETTLED_BY_CHECK_PREFIX),
        "{last}"
    );
    let timeline = stdout(&world.run(&["log", &session]).await);
    assert!(timeline.contains("settled by its check"), "{timeline}");
    assert!(!timeline.contains("ToolInDoubt"), "{timeline}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_interrupted_before_it_applied_runs_again_with_its_key() {
    let (payments, base, _stop) = payments().await;
    let bed = charging_world(&base).await;
    let (session, answer) = crash_then_resume(&bed, "tool_started_durable").await;
    assert!(answer.contains("Charged."), "{answer}");
    let (log, events) = charged_once(&payments, &bed.world, &session).await;
    assert_eq!(
        events[0]["event"]["ToolChecked"]["answer"], "NotApplied",
        "{log}"
    );
    let finished = &events[1]["event"]["ToolFinished"];
    assert_eq!(
        finished.get("settled_by_check"),
        None,
        "ran, not settled: {finished}"
    );
    let starts: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["kind"] == "ToolStarted")
        .collect();
    assert_eq!(starts.len(), 2, "attempt 2 started");
    let key = |e: &Value| e["event"]["ToolStarted"]["idempotency_key"].clone();
    assert_eq!(key(&starts[0]), key(&starts[1]), "the same key");
}

/// A check that fails, answers garbage or answers without end cannot
/// tell: the call is in doubt (a person decides), and the answer read is
/// bounded by the tool's max_output_bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_cannot_tell_leaves_the_call_in_doubt() {
    let huge = format!(
        "{{\"applied\":true,\"result\":\"{}\"}}",
        "x".repeat(3 << 20)
    );
    for (status, body, why) in [
        (503, "{}".to_string(), "503"),
        (200, "<html>yes</html>".to_string(), "not JSON"),
        (200, "{\"applied\":\"maybe\"}".to_string(), "no boolean"),
        (200, huge, "longer than the tool's max_output_bytes"),
    ] {
        let (payments, base, _stop) = payments().await;
        *payments.bad_answer.lock().unwrap() = Some((status, body));
        let bed = charging_world(&base).await;
        let world = &bed.world;
        let out = world
            .run_crashing(
                &["run", "--agent", bed.agent_arg(), "charge ada"],
                "tool_returned",
            )
            .await;
        let session = session_id(&out);
        let out = world.run(&["resume", &session]).await;
        assert_eq!(out.status.code(), Some(3), "{why}: {}", stderr(&out));
        let log = stdout(&world.run(&["log", &session, "--json"]).await);
        let events = checked_events(&log);
        let answer = &events[0]["event"]["ToolChecked"]["answer"]["Unknown"];
        assert!(answer.as_str().unwrap().contains(why), "{why}: {answer}");
        assert!(log.len() < 1 << 20, "{why}: the answer was kept");
        assert!(log.contains("ToolInDoubt"), "{log}");
        assert_eq!(payments.charges.lock().unwrap().values().sum::<usize>(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_checks_are_refused_at_run() {
    let world = World::new();
    let model = MockModel::start(vec![MockReply::answer("never")], Fault::None).await;
    for (extra, why) in [
        ("check = { url = \"file:///etc/passwd\" }\n", "check.url"),
        (
            "check = { url = \"http://h/x\", method = \"BREW\" }\n",
            "check.method",
        ),
        ("check_command = []\n", "check_command is empty"),
        (
            "check = { url = \"http://h/x\" }\ncheck_command = [\"true\"]\n",
            "not both",
        ),
    ] {
        let tool = http_tool("charge", "http://127.0.0.1:9/charge", "side_effect") + extra;
        let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[tool]));
        let out = world
            .run(&["run", "--agent", agent.to_str().unwrap(), "go"])
            .await;
        assert_eq!(out.status.code(), Some(1), "{extra}");
        assert!(stderr(&out).contains(why), "{extra}: {}", stderr(&out));
    }
}
