//! A chat-completions server's reasoning (`reasoning_content`, as llama.cpp,
//! vLLM and DeepSeek return it beside the reply), end to end: recorded
//! with its reply either way; not sent back by default, sent back as
//! received with `[model] reasoning = "keep"`; and the requests after a
//! SIGKILL and a resume are byte for byte those of the uncrashed run.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::json;

const MESSAGE: &str = "Charge customer 1, then email them.";
const CHARGE_THOUGHT: &str = "THOUGHT-1: charge first, then the email";
const EMAIL_THOUGHT: &str = "THOUGHT-2: charged; now \"email\" them";

fn replies() -> Vec<MockReply> {
    vec![
        MockReply::calls(&[("charge", json!({"n": 1}))]).reasoning(CHARGE_THOUGHT),
        MockReply::calls(&[("email", json!({"n": 2}))]).reasoning(EMAIL_THOUGHT),
        MockReply::answer("Charged and emailed."),
    ]
}

/// The billing agent, its model thinking aloud, under `model_options`.
async fn thinking(model_options: &str) -> Testbed {
    Testbed::new()
        .replies(replies())
        .model_options(model_options)
        .sink_tools(|sink| billing_tools(sink).to_vec())
        .await
}

/// The assistant messages' `reasoning_content` of each request, in order.
fn sent_back(bodies: &[Vec<u8>]) -> Vec<Vec<Option<String>>> {
    bodies
        .iter()
        .map(|body| {
            let request: serde_json::Value = serde_json::from_slice(body).unwrap();
            let messages = request["messages"].as_array().unwrap();
            messages
                .iter()
                .filter(|m| m["role"] == "assistant")
                .map(|m| m["reasoning_content"].as_str().map(String::from))
                .collect()
        })
        .collect()
}

/// Each reply's recorded reasoning, from `mneme log --json`.
async fn recorded(world: &World, session: &str) -> Vec<Option<String>> {
    let events = logged_events(world, session).await;
    events
        .iter()
        .filter(|(_, kind, _)| kind == "ModelReplied")
        .map(|(_, _, e)| e["reasoning"].as_str().map(String::from))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_recorded_and_by_default_not_sent_back() {
    let bed = thinking("").await;
    let out = bed.run_agent(MESSAGE).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let session = session_id(&out);
    assert_eq!(
        recorded(&bed.world, &session).await,
        [
            Some(CHARGE_THOUGHT.into()),
            Some(EMAIL_THOUGHT.into()),
            None
        ]
    );
    let bodies = bed.model.bodies();
    assert_eq!(bodies.len(), 3);
    assert_eq!(
        sent_back(&bodies),
        [vec![], vec![None], vec![None, None]],
        "dropped from every request"
    );
    for body in &bodies {
        assert!(!String::from_utf8_lossy(body).contains("THOUGHT"));
    }
    let log = stdout(&bed.run(&["log", &session]).await);
    assert!(log.contains("reasoning \"THOUGHT-1: charge first"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_reasoning_is_sent_back_as_received_and_the_same_after_a_sigkill() {
    let keep = "reasoning = \"keep\"\n";
    let reference = thinking(keep).await;
    let out = reference.run_agent(MESSAGE).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = reference.model.bodies();
    let (charge, email) = (Some(CHARGE_THOUGHT.into()), Some(EMAIL_THOUGHT.into()));
    assert_eq!(
        sent_back(&expected),
        [vec![], vec![charge.clone()], vec![charge, email]],
        "each reply's reasoning on its own assistant message"
    );

    let crashed = thinking(keep).await;
    let killed = crashed.run_killed_in("email", MESSAGE).await;
    let session = session_id(&killed);
    let resumed = crashed.run(&["resume", &session]).await;
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let bodies = crashed.model.bodies();
    assert_eq!(bodies.len(), expected.len());
    for (i, (got, want)) in bodies.iter().zip(&expected).enumerate() {
        assert!(
            got == want,
            "request {i} differs from the uncrashed run's:\n{}\n{}",
            String::from_utf8_lossy(got),
            String::from_utf8_lossy(want)
        );
    }
    // The prompt a later turn would build is the same too.
    let uncrashed = rebuilt_request(&reference.world, &session_id(&out)).await;
    assert!(rebuilt_request(&crashed.world, &session).await == uncrashed);
}
