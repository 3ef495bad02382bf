//! A person sees what they approve: a model's arguments that hold a key
//! twice (one value shown, another given to the tool) never start a call,
//! and a call waiting for approval is shown with its arguments whole.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::hostile::{completion, raw_call, Answer, HostileModel};
use mneme_e2e::*;
use serde_json::{json, Value};

fn user_text(request: &Value) -> String {
    (request["messages"].as_array().unwrap().iter())
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// JSON arguments whose `first` member comes before 400 newlines and the
/// `rest` after them: a small box shows the first alone.
fn padded(first: &str, rest: &str) -> String {
    format!("{{{first},{}{rest}}}", "\n".repeat(400))
}

/// A world and sink with a refund agent (each call waits for approval) on a
/// model whose first reply calls `refund` with `arguments` exactly as
/// written, and whose later ones are `then`'s (given the request); the run
/// of `mneme run --agent AGENT MESSAGE`.
async fn refund_called_with(
    arguments: String,
    message: &str,
    then: impl Fn(&Value) -> Answer + Send + Sync + 'static,
) -> (World, Sink, HostileModel, std::process::Output) {
    let world = World::new();
    let sink = Sink::start().await.unwrap();
    let model = HostileModel::start(move |n, request, _| match n {
        0 => raw_call("refund", &arguments),
        _ => then(request),
    })
    .await;
    let agent = world.write(
        "agent.toml",
        &agent_toml(&model.base_url(), &[refund_needing_approval(&sink)]),
    );
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), message])
        .await;
    (world, sink, model, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_that_hold_a_key_twice_never_start_a_call() {
    // What a person would read first, padded away from what the tool gets.
    let arguments = padded(
        r#""to": "alice""#,
        r#""to": "attacker-iban-DE00", "cents": 100"#,
    );
    let (world, sink, _model, out) = refund_called_with(arguments, "refund alice", |request| {
        let told = user_text(request);
        assert!(told.contains("hold the key \"to\" twice"), "{told}");
        Answer::Json(completion(Some("could not refund"), &[]))
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let kinds = event_kinds(&world, &session_id(&out)).await;
    for kind in ["ApprovalRequested", "ToolStarted"] {
        assert!(!kinds.contains(&kind.to_string()), "{kinds:?}");
    }
    assert_eq!(sink.stats().path("refund").hits, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_approval_is_shown_with_its_arguments_whole() {
    let world = World::new();
    let sink = Sink::start().await.unwrap();
    let long = "x".repeat(300);
    let arguments = json!({"order": 7, "to": "alice", "note": long});
    let model = MockModel::start(
        vec![MockReply::calls(&[("refund", arguments)])],
        Fault::None,
    )
    .await;
    let agent = world.write(
        "agent.toml",
        &agent_toml(&model.base_url(), &[refund_needing_approval(&sink)]),
    );
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "refund"])
        .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("refund requires approval, with these arguments:"),
        "{said}"
    );
    // One key a line, pretty-printed, nothing clipped.
    for line in [
        "\"order\": 7",
        "\"to\": \"alice\"",
        &format!("\"note\": \"{long}\""),
    ] {
        assert!(
            said.lines().any(|l| l.trim().trim_end_matches(',') == line),
            "{line}: {said}"
        );
    }
    // The API says the same.
    let json = world.run(&["resume", &session_id(&out), "--json"]).await;
    let outcome: Value = serde_json::from_str(stdout(&json).trim()).unwrap();
    let waiting = &outcome["awaiting_approval"][0];
    assert_eq!(waiting["tool"], "refund", "{outcome}");
    let given: Value = serde_json::from_str(waiting["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(given["to"], "alice");
}

/// Arguments padded to push a member out of sight, with a number too long
/// for a float, are laid out afresh wherever a person reads them before
/// the tool gets them: the pause message, `log` (the reply's row compact,
/// the approval's row with them whole under it) and `approve`, which says
/// what it approves and what the model was told of the tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn padded_arguments_are_laid_out_afresh_for_the_person_deciding() {
    let rest = r#""to": "mallory-iban", "cents": 12345678901234567890123"#;
    let arguments = padded(r#""note": "fine""#, rest);
    let (world, sink, _model, out) = refund_called_with(arguments, "refund", |_| {
        Answer::Json(completion(Some("refunded"), &[]))
    })
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let id = session_id(&out);
    let members = [
        "\"to\": \"mallory-iban\"",
        "\"cents\": 12345678901234567890123",
    ];
    let shows_each = |text: &str, what: &str| {
        for member in members {
            let found = text
                .lines()
                .any(|l| l.trim().trim_end_matches(',') == member);
            assert!(found, "{what} shows {member}: {text}");
        }
    };
    shows_each(&stderr(&out), "the pause message");
    let told = "what the model was told of refund: \"refund\"";
    assert!(stderr(&out).contains(told), "{}", stderr(&out));

    let log = stdout(&world.run(&["log", &id]).await);
    let reply = log.lines().find(|l| l.contains("ModelReplied")).unwrap();
    assert!(
        reply.contains(r#"refund(c1) {"note":"fine","to":"mallory-iban""#),
        "{reply}"
    );
    let under_the_approval: String = (log.lines())
        .skip_while(|l| !l.contains("ApprovalRequested"))
        .skip(1)
        .take_while(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    shows_each(&under_the_approval, "log, under ApprovalRequested");

    let out = world.run(&["approve", &id, "c1", "--by", "ada"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("approving c1 of session"), "{said}");
    assert!(
        said.contains("what the model was told of refund: \"refund\""),
        "{said}"
    );
    shows_each(&said, "approve");
    assert_eq!(sink.stats().path("refund").effects, 1);
}
