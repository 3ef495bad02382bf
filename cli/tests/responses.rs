//! OpenAI's Responses API (`provider = "openai-responses"`) against a
//! loopback server that speaks its documented shapes, whole and streamed:
//! stateless requests (`store: false`, encrypted reasoning included, the
//! session id as `prompt_cache_key`); every output item (a reasoning item
//! with its id and `encrypted_content`, a message with its `phase`, a
//! function call) sent back unchanged and in order, followed by the call's
//! `function_call_output`, byte for byte the same after a SIGKILL inside
//! the call and a resume; usage with cached and reasoning tokens counted;
//! an `incomplete` response handled like a cut-off reply; and malformed
//! responses and events refused by name.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::hostile::{Answer, HostileModel};
use mneme_e2e::responses_api as api;
use mneme_e2e::*;
use serde_json::{json, Value};

const KEY: &str = "sk-responses-test-0123456789abcdef";
const ENCRYPTED: &str = "gAAAAABpRESP-encrypted-reasoning+/==";
const SUMMARY: &str = "Charging ada once, then saying so.";

/// An agent on the Responses API at `model`, with `tools`.
fn agent(model: &HostileModel, tools: &[String], extra: &str) -> String {
    agent_toml(&model.base_url(), tools)
        .replace("provider = \"openai\"", "provider = \"openai-responses\"")
        .replace(
            "timeout_secs = 10\n",
            &format!("timeout_secs = 10\n{extra}"),
        )
}

/// The first reply: it reasons, says so (commentary), and charges.
fn reasoned_charge() -> Vec<Value> {
    vec![
        api::reasoning("rs_0001", SUMMARY, ENCRYPTED),
        api::message("msg_0001", "Charging ada.", Some("commentary")),
        api::function_call("call_A1", "charge", json!({"n": 1})),
    ]
}

/// The last reply: it reasons again and answers.
fn charged() -> Vec<Value> {
    vec![
        api::reasoning("rs_0002", "Charged; say so.", "gAAAAAB-second=="),
        api::message("msg_0002", "Charged ada once.", Some("final_answer")),
    ]
}

/// One run of the reasoned charge: its requests as sent, its session.
struct Run {
    bodies: Vec<Vec<u8>>,
    session: String,
    world: World,
}

/// `mneme run` of an agent that reasons, then charges ada (a side effect
/// that honours idempotency keys), then answers: uncrashed, or SIGKILLed
/// inside the charge and resumed.
async fn reasoned_charge_run(streamed: bool, killed_in_the_call: bool) -> Run {
    let sink = Sink::start().await.unwrap();
    let world = World::new();
    let model = HostileModel::start(move |n, _, _| {
        let output = match n {
            0 => reasoned_charge(),
            _ => charged(),
        };
        api::answer(api::response(output), streamed)
    })
    .await;
    let tools = [http_tool("charge", &sink.url("charge"), "side_effect")];
    let extra = if streamed { "stream = true\n" } else { "" };
    let agent = world.write("agent.toml", &agent(&model, &tools, extra));
    let args = ["run", "--agent", agent.to_str().unwrap(), "charge ada"];
    let (session, answered) = if killed_in_the_call {
        let hold = sink.hold("charge");
        let mut child = world.spawn_until_applied(&args, hold.applied).await;
        child.start_kill().unwrap(); // SIGKILL
        let killed = child.wait_with_output().await.unwrap();
        assert!(!killed.status.success(), "killed in the charge");
        drop(hold.release);
        let session = session_id(&killed);
        let resumed = world.run(&["resume", &session]).await;
        (session, resumed)
    } else {
        let out = world.run(&args).await;
        (session_id(&out), out)
    };
    assert!(answered.status.success(), "{}", stderr(&answered));
    assert!(
        stdout(&answered).contains("Charged ada once."),
        "{}",
        stdout(&answered)
    );
    assert_eq!(sink.stats().path("charge").effects, 1, "one charge");
    Run {
        bodies: model.bodies(),
        session,
        world,
    }
}

/// A request as JSON.
fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap()
}

async fn a_reasoned_call_goes_back_unchanged_after_a_sigkill(streamed: bool) {
    let uncrashed = reasoned_charge_run(streamed, false).await;
    let crashed = reasoned_charge_run(streamed, true).await;
    assert_eq!(uncrashed.bodies.len(), 2);
    assert_eq!(crashed.bodies.len(), 2, "one request before, one after");
    // (a) Byte for byte the uncrashed run's requests (but for the session
    // id each carries as its cache key).
    for (i, (got, want)) in crashed.bodies.iter().zip(&uncrashed.bodies).enumerate() {
        assert!(
            without_cache_key(got) == without_cache_key(want),
            "request {i} differs from the uncrashed run's:\n{}\n{}",
            String::from_utf8_lossy(got),
            String::from_utf8_lossy(want)
        );
    }
    for run in [&uncrashed, &crashed] {
        let first = json_of(&run.bodies[0]);
        let after = json_of(&run.bodies[1]);
        // (c) Stateless, with the encrypted reasoning asked for, and the
        // session as the cache key.
        for request in [&first, &after] {
            assert_eq!(request["store"], false);
            assert_eq!(request["include"], json!(["reasoning.encrypted_content"]));
            assert_eq!(request["prompt_cache_key"], run.session.as_str());
            assert!(request.get("previous_response_id").is_none());
            assert_eq!(request["stream"].as_bool().unwrap_or(false), streamed);
        }
        assert_eq!(first["instructions"], "You are a test agent.");
        assert_eq!(first["tools"][0]["strict"], false);
        // (b) The reasoning item, id and encrypted content unchanged, then
        // the commentary (its phase kept) and the call as received, then
        // the call's output.
        let input = after["input"].as_array().unwrap();
        let reply = reasoned_charge();
        assert_eq!(input[0], json!({"role": "user", "content": "charge ada"}));
        assert_eq!(input[1..4], reply[..], "{after}");
        assert_eq!(input[1]["id"], "rs_0001");
        assert_eq!(input[1]["encrypted_content"], ENCRYPTED);
        assert_eq!(input[2]["phase"], "commentary");
        assert_eq!(input[4]["type"], "function_call_output");
        assert_eq!(input[4]["call_id"], "call_A1");
        assert!(input[4]["output"].is_string(), "{}", input[4]);
        assert_eq!(input.len(), 5);
    }
    // Recorded as received, and counted: 64 cached and 20 reasoning tokens
    // a reply.
    let events = logged_events(&crashed.world, &crashed.session).await;
    let (_, _, reply) = (events.iter())
        .find(|(_, kind, _)| kind == "ModelReplied")
        .unwrap();
    let items: Vec<Value> = (reply["items"].as_array().unwrap().iter())
        .map(|i| serde_json::from_str(i.as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(items, reasoned_charge());
    assert_eq!(reply["usage"]["reasoning_tokens"], 20);
    let out = crashed.world.run(&["sessions", "--json"]).await;
    let row: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!(
        (&row["cached_tokens"], &row["reasoning_tokens"]),
        (&json!(128), &json!(40)),
        "{row}"
    );
    let log = stdout(&crashed.world.run(&["log", &crashed.session]).await);
    assert!(
        log.contains("3 output item(s) (reasoning, message, function_call)")
            && log.contains(SUMMARY)
            && log.contains("(20 reasoning)"),
        "{log}"
    );
    // The request a later turn would build is the same too.
    let rebuilt = rebuilt_request(&uncrashed.world, &uncrashed.session).await;
    assert!(rebuilt_request(&crashed.world, &crashed.session).await == rebuilt);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoned_call_goes_back_unchanged_after_a_sigkill_in_it() {
    a_reasoned_call_goes_back_unchanged_after_a_sigkill(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_reasoned_call_goes_back_unchanged_after_a_sigkill_in_it() {
    a_reasoned_call_goes_back_unchanged_after_a_sigkill(true).await;
}

/// Runs `mneme ARGS` with the test's API key in the environment.
async fn run_with_key(world: &World, args: &[&str]) -> std::process::Output {
    let mut command = world.mneme();
    command.args(args).env("OPENAI_TEST_KEY", KEY);
    command.output().await.unwrap()
}

/// (d), (e): a streamed turn whose first response is cut off by
/// `max_output_tokens` in the middle of its call: the call never starts,
/// the next request gives twice the tokens and leaves the cut-off call
/// out; the answer streams to stdout. Then a turn whose answer is cut off:
/// said, as for a `length` finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_response_is_a_cut_off_reply_streamed_or_not() {
    let sink = Sink::start().await.unwrap();
    let world = World::new();
    let model = HostileModel::start(|n, request, headers| {
        assert_eq!(headers["authorization"], format!("Bearer {KEY}"));
        let streamed = request["stream"] == true;
        let response = match n {
            0 => {
                assert_eq!(request["max_output_tokens"], 50);
                let mut cut = api::function_call("call_B1", "charge", json!({}));
                cut["arguments"] = json!("{\"n\": ");
                api::incomplete(vec![api::reasoning("rs_b1", "Charging.", "gAAAA-b1"), cut])
            }
            1 => {
                assert_eq!(request["max_output_tokens"], 100, "room to finish");
                let input = request["input"].to_string();
                assert!(
                    !input.contains("call_B1") && !input.contains("rs_b1"),
                    "{input}"
                );
                assert!(input.contains("cut it off"), "{input}");
                api::response(vec![api::function_call(
                    "call_B2",
                    "charge",
                    json!({"n": 1}),
                )])
            }
            2 => {
                assert_eq!(request["max_output_tokens"], 50, "once only");
                api::response(vec![api::message("msg_b3", "Charged once.", None)])
            }
            _ => api::incomplete(vec![api::message("msg_b4", "The total is", None)]),
        };
        api::answer(response, streamed)
    })
    .await;
    let tools = [http_tool("charge", &sink.url("charge"), "side_effect")];
    let options = "api_key_env = \"OPENAI_TEST_KEY\"\nmax_tokens = 50\n";
    let streamed = world.write(
        "streamed.toml",
        &agent(&model, &tools, &format!("{options}stream = true\n")),
    );
    let out = run_with_key(
        &world,
        &["run", "--agent", streamed.to_str().unwrap(), "charge ada"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "Charged once.\n");
    assert_eq!(sink.stats().path("charge").effects, 1);
    let session = session_id(&out);
    let kinds = event_kinds(&world, &session).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "ToolStarted").count(),
        1,
        "{kinds:?}"
    );
    // Not streamed, an answer cut off: kept, and said to be cut off.
    let whole = world.write("whole.toml", &agent(&model, &tools, options));
    let out = run_with_key(
        &world,
        &["run", "--agent", whole.to_str().unwrap(), "the total?"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "The total is\n");
    assert!(
        stderr(&out).contains("cut the answer off"),
        "{}",
        stderr(&out)
    );
    let log = stdout(&world.run(&["log", "--json", &session]).await);
    assert!(!log.contains(KEY), "the key stays out of the log");
}

/// (f) What the server sends is untrusted: a malformed event, item or
/// response, a stream that ends early or reports an error, and a response
/// past `max_response_bytes` each fail the turn, named; nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_responses_and_events_are_refused_by_name() {
    let sink = Sink::start().await.unwrap();
    let world = World::new();
    let started = json!({"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}});
    let call = api::function_call("call_C1", "charge", json!({"n": 1}));
    let cases: Vec<(Answer, &str)> = vec![
        (
            Answer::Sse(vec![
                api::event(&started),
                api::event(&json!({"type": "response.output_item.done", "output_index": 0})),
            ]),
            "\"response.output_item.done\" event is malformed: missing field `item`",
        ),
        (
            Answer::Sse(vec![api::event(&started), "data: {not json\n\n".into()]),
            "a stream event is not a Responses API event",
        ),
        (
            Answer::Sse(vec![api::event(
                &json!({"type": "error", "code": "server_error", "message": "the model fell over"}),
            )]),
            "the stream reported an error: the model fell over",
        ),
        (
            Answer::Sse(api::stream(&api::response(vec![call.clone()]))[..3].to_vec()),
            "the stream ended before the reply did",
        ),
        (
            Answer::Json(
                json!({"object": "response", "status": "completed", "output": [{"type": "function_call", "name": "charge"}]}),
            ),
            "output item 0 is malformed: missing field `call_id`",
        ),
        (
            Answer::Json(json!({"choices": [{"message": {"content": "hi"}}]})),
            "not a Responses API response: missing field `output`",
        ),
        (
            Answer::Json(api::response(vec![
                call.clone(),
                api::message("m", &"x".repeat(4096), None),
            ])),
            "max_response_bytes",
        ),
    ];
    let expected: Vec<&str> = cases.iter().map(|(_, says)| *says).collect();
    let answers = std::sync::Mutex::new(cases.into_iter().map(|(a, _)| a).collect::<Vec<_>>());
    let model = HostileModel::start(move |_, _, _| answers.lock().unwrap().remove(0)).await;
    let tools = [http_tool("charge", &sink.url("charge"), "side_effect")];
    let agent = world.write(
        "agent.toml",
        &agent(&model, &tools, "max_response_bytes = 2048\n"),
    );
    for says in expected {
        let out = world
            .run(&["run", "--agent", agent.to_str().unwrap(), "charge ada"])
            .await;
        assert!(!out.status.success(), "{says}: {}", stdout(&out));
        assert!(stderr(&out).contains(says), "{says}: {}", stderr(&out));
    }
    assert_eq!(sink.stats().path("charge").effects, 0, "nothing ran");
}
