//! The native Anthropic provider against a loopback server that speaks the
//! Messages API's documented shapes: `tool_use`/`tool_result` blocks,
//! prompt-cache breakpoints on the stable prefix, cache reads counted as
//! cached tokens, streaming events, the same resume rules.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::hostile::{Answer, HostileModel};
use mneme_e2e::*;
use serde_json::{json, Value};

const KEY: &str = "sk-ant-test-0123456789abcdef";

/// An agent on the Messages API at `model`, with `tools`.
fn agent(model: &HostileModel, tools: &[String], extra: &str) -> String {
    agent_toml(&model.base_url(), tools)
        .replace("provider = \"openai\"", "provider = \"anthropic\"")
        .replace(
            "timeout_secs = 10\n",
            &format!("timeout_secs = 10\napi_key_env = \"ANTHROPIC_TEST_KEY\"\n{extra}"),
        )
}

/// Runs `mneme ARGS` with the test's API key in the environment.
async fn run_with_key(world: &World, args: &[&str]) -> std::process::Output {
    world
        .mneme()
        .args(args)
        .env("ANTHROPIC_TEST_KEY", KEY)
        .output()
        .await
        .unwrap()
}

/// A Messages API message with `blocks`, stopping for `stop_reason`, the
/// cache having served `cache_read` prompt tokens.
fn message(blocks: Value, stop_reason: &str, cache_read: u64) -> Answer {
    Answer::Json(json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "test-model",
        "content": blocks, "stop_reason": stop_reason, "stop_sequence": null,
        "usage": {"input_tokens": 20, "output_tokens": 10,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": cache_read}}))
}

/// Indices (message, block) of the conversation's cache breakpoints.
fn breakpoints(request: &Value) -> Vec<(usize, usize)> {
    let mut marked = Vec::new();
    for (i, m) in request["messages"].as_array().unwrap().iter().enumerate() {
        for (j, b) in m["content"].as_array().unwrap().iter().enumerate() {
            if b["cache_control"]["type"] == "ephemeral" {
                marked.push((i, j));
            }
        }
    }
    marked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_the_messages_api_calls_tools_and_hits_the_prompt_cache() {
    let sink = Sink::start().await.unwrap();
    let world = World::new();
    let model = HostileModel::start(|n, request, headers| {
        assert_eq!(headers["x-api-key"], KEY);
        assert_eq!(headers["anthropic-version"], "2023-06-01");
        assert!(headers.get("authorization").is_none());
        assert_eq!(request["system"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(request["tools"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(request["tools"][0]["input_schema"]["type"], "object");
        assert!(request["max_tokens"].as_u64().unwrap() > 0);
        match n {
            0 => message(
                json!([{"type": "text", "text": "Charging."},
                       {"type": "tool_use", "id": "toolu_01", "name": "charge", "input": {"n": 1}}]),
                "tool_use",
                0,
            ),
            1 => {
                let messages = request["messages"].as_array().unwrap();
                let result = &messages[2]["content"][0];
                assert_eq!(result["type"], "tool_result");
                assert_eq!(result["tool_use_id"], "toolu_01");
                assert_eq!(messages[1]["content"][1]["input"], json!({"n": 1}));
                // The conversation before the newest entry (the reply and
                // its results) ends at a breakpoint.
                assert_eq!(breakpoints(request), [(0, 0)]);
                message(json!([{"type": "text", "text": "Charged."}]), "end_turn", 300)
            }
            _ => {
                assert_eq!(breakpoints(request), [(3, 0)], "{request}");
                message(json!([{"type": "text", "text": "You are welcome."}]), "end_turn", 350)
            }
        }
    })
    .await;
    let tools = [http_tool("charge", &sink.url("charge"), "side_effect")];
    let agent = world.write("agent.toml", &agent(&model, &tools, ""));
    let out = run_with_key(
        &world,
        &["run", "--agent", agent.to_str().unwrap(), "charge ada"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Charged.");
    let id = session_id(&out);
    let out = run_with_key(&world, &["run", "--session", &id, "thanks"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(sink.stats().path("charge").effects, 1);
    let out = world.run(&["sessions", "--json"]).await;
    let row: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    // Prompt tokens: 20 uncached + the cache's reads, per request.
    assert_eq!(row["cached_tokens"], 650, "{row}");
    assert_eq!(row["prompt_tokens"], 60 + 650, "{row}");
    let log = world.run(&["log", "--json", &id]).await;
    assert!(!stdout(&log).contains(KEY), "the key stays out of the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_message_reaches_stdout_and_a_cut_off_call_never_starts() {
    let sink = Sink::start().await.unwrap();
    let world = World::new();
    let events = |blocks: Vec<Value>, stop: &str| -> Vec<String> {
        let mut out = vec![json!({"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 9, "output_tokens": 1}}}).to_string()];
        for (i, block) in blocks.into_iter().enumerate() {
            match block["type"].as_str().unwrap() {
                "text" => {
                    out.push(json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}).to_string());
                    for piece in block["pieces"].as_array().unwrap() {
                        out.push(json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": piece}}).to_string());
                    }
                }
                _ => {
                    out.push(json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}).to_string());
                    out.push(json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": block["json"]}}).to_string());
                }
            }
            out.push(json!({"type": "content_block_stop", "index": i}).to_string());
        }
        out.push(json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 12}}).to_string());
        out.push(json!({"type": "message_stop"}).to_string());
        out
    };
    let model = HostileModel::start(move |n, request, _| {
        assert_eq!(request["stream"], true);
        let (blocks, stop) = match n {
            // Cut off by max_tokens in the middle of the call's input.
            0 => (vec![json!({"type": "tool_use", "id": "toolu_a", "name": "charge", "json": "{\"n\": "})], "max_tokens"),
            1 => {
                assert_eq!(request["max_tokens"], 200, "room to finish: twice max_tokens");
                (vec![json!({"type": "tool_use", "id": "toolu_b", "name": "charge", "json": "{\"n\": 1}"})], "tool_use")
            }
            _ => (vec![json!({"type": "text", "pieces": ["Charged ", "once."]})], "end_turn"),
        };
        Answer::Stream { events: events(blocks, stop), gate: None, then_stall: false }
    })
    .await;
    let tools = [http_tool("charge", &sink.url("charge"), "side_effect")];
    let agent = world.write(
        "agent.toml",
        &agent(&model, &tools, "stream = true\nmax_tokens = 100\n"),
    );
    let out = run_with_key(
        &world,
        &["run", "--agent", agent.to_str().unwrap(), "charge ada"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "Charged once.\n");
    assert_eq!(sink.stats().path("charge").effects, 1);
    let kinds = event_kinds(&world, &session_id(&out)).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "ToolStarted").count(),
        1,
        "{kinds:?}"
    );
}

/// A thinking block and a redacted one, as the Messages API returns them.
fn thought() -> [Value; 2] {
    [
        json!({"type": "thinking", "thinking": "A refund of order 1: it needs a person's approval.",
               "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}),
        json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"}),
    ]
}

/// `mneme run` of an agent thinking before a refund that needs approval,
/// then `mneme approve`, which runs it: uncrashed, or SIGKILLed inside the
/// refund and resumed. Returns every request the model got.
async fn a_thinking_turn_through_an_approval(killed_in_the_call: bool) -> Vec<Value> {
    let sink = Sink::start().await.unwrap();
    let world = World::new();
    let model = HostileModel::start(|n, _, _| {
        let [thinking, redacted] = thought();
        match n {
            0 => message(
                json!([thinking, redacted,
                       {"type": "tool_use", "id": "toolu_01", "name": "refund", "input": {"n": 1}}]),
                "tool_use",
                0,
            ),
            _ => message(json!([{"type": "text", "text": "Refunded."}]), "end_turn", 0),
        }
    })
    .await;
    let text = agent_toml(&model.base_url(), &[refund_needing_approval(&sink)])
        .replace("provider = \"openai\"", "provider = \"anthropic\"")
        .replace(
            "timeout_secs = 10\n",
            "timeout_secs = 10\nthinking_budget_tokens = 2048\n",
        );
    let agent = world.write("agent.toml", &text);
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "refund order 1"])
        .await;
    let id = session_id(&out);
    assert!(stderr(&out).contains("approval"), "{}", stderr(&out));
    let approve = ["approve", &id, "toolu_01", "--by", "ada"];
    let answered = if killed_in_the_call {
        let hold = sink.hold("refund");
        let mut child = world.spawn_until_applied(&approve, hold.applied).await;
        child.start_kill().unwrap(); // SIGKILL
        child.wait().await.unwrap();
        drop(hold.release);
        world.run(&["resume", &id]).await
    } else {
        world.run(&approve).await
    };
    assert!(answered.status.success(), "{}", stderr(&answered));
    assert!(
        stdout(&answered).contains("Refunded."),
        "{}",
        stdout(&answered)
    );
    assert_eq!(sink.stats().path("refund").effects, 1, "one refund");
    model.requests()
}

/// Anthropic's extended thinking: the request asks for it, and the turn's
/// thinking blocks go back at the head of its assistant message exactly as
/// received (signature and redacted data), across an approval, a SIGKILL
/// inside the approved call and a resume: the request after it is the
/// uncrashed run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_blocks_go_back_unchanged_across_an_approval_and_a_sigkill() {
    let uncrashed = a_thinking_turn_through_an_approval(false).await;
    let crashed = a_thinking_turn_through_an_approval(true).await;
    assert_eq!(uncrashed.len(), 2);
    assert_eq!(
        uncrashed[0]["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    let assistant = &uncrashed[1]["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    let content = assistant["content"].as_array().unwrap();
    assert_eq!(content[..2], thought(), "{assistant}");
    assert_eq!(content[2]["type"], "tool_use");
    assert_eq!(crashed, uncrashed, "the same requests after the crash");
}

/// Interleaved thinking: the request carries the beta, and a reply that
/// thinks before each of its two calls has each thinking block go back
/// where it stood; a reply the token limit cut off while it still thought
/// is refused (its unfinished block never sent back) and asked again with
/// room to finish, and the turn answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_thinking_goes_back_where_it_stood_and_cut_off_thinking_is_asked_again() {
    let betas = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = betas.clone();
    let before_lookup =
        json!({"type": "thinking", "thinking": "First who ordered it.", "signature": "sigA"});
    let before_charge =
        json!({"type": "thinking", "thinking": "Ada: charge her.", "signature": "sigB"});
    let (a, b) = (before_lookup.clone(), before_charge.clone());
    let model = HostileModel::start(move |n, _, headers| {
        let beta = headers.get("anthropic-beta").map(|v| v.to_str().unwrap().to_string());
        seen.lock().unwrap().push(beta);
        match n {
            0 => message(
                json!([a, {"type": "tool_use", "id": "toolu_01", "name": "lookup", "input": {"n": 1}},
                       b, {"type": "tool_use", "id": "toolu_02", "name": "charge", "input": {"n": 2}}]),
                "tool_use",
                0,
            ),
            1 => message(
                json!([{"type": "thinking", "thinking": "Both went thr", "signature": ""}]),
                "max_tokens",
                0,
            ),
            _ => message(json!([{"type": "text", "text": "Charged Ada."}]), "end_turn", 0),
        }
    })
    .await;
    let sink = Sink::start().await.unwrap();
    let tools = [
        http_tool("lookup", &sink.url("lookup"), "read_only"),
        http_tool("charge", &sink.url("charge"), "side_effect"),
    ];
    let text = agent(
        &model,
        &tools,
        "max_tokens = 2000\nthinking_budget_tokens = 4096\ninterleaved_thinking = true\n",
    );
    let world = World::new();
    let file = world.write("agent.toml", &text);
    let out = run_with_key(
        &world,
        &["run", "--agent", file.to_str().unwrap(), "charge"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Charged Ada.");
    assert_eq!(sink.stats().path("charge").effects, 1);
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    let beta = Some("interleaved-thinking-2025-05-14".to_string());
    assert_eq!(*betas.lock().unwrap(), [beta.clone(), beta.clone(), beta]);
    // The budget spans the turn: more than one reply's max_tokens.
    assert_eq!(
        requests[0]["thinking"],
        json!({"type": "enabled", "budget_tokens": 4096})
    );
    let content = |request: &Value| request["messages"][1]["content"].clone();
    let kinds = |request: &Value| -> Vec<Value> {
        let content = content(request);
        content
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["type"].clone())
            .collect()
    };
    assert_eq!(
        kinds(&requests[1]),
        ["thinking", "tool_use", "thinking", "tool_use"],
        "{}",
        requests[1]
    );
    assert_eq!(content(&requests[1])[0], before_lookup);
    assert_eq!(content(&requests[1])[2], before_charge);
    // The cut-off thinking is not sent back: the model is told, with room
    // to finish.
    let last = &requests[2];
    assert_eq!(last["max_tokens"], 4000, "{last}");
    let sent = last.to_string();
    assert!(!sent.contains("Both went thr"), "{sent}");
    assert!(sent.contains("while it was still thinking"), "{sent}");
    // The refusal is recorded on the reply.
    let id = session_id(&out);
    let events = logged_events(&world, &id).await;
    let refused = events
        .iter()
        .filter(|(_, kind, _)| kind == "ModelReplied")
        .nth(1);
    assert!(
        refused.is_some_and(|(_, _, e)| e["refused"].is_string()),
        "{events:?}"
    );
}
