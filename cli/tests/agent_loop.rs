//! The agent loop's observable behaviour: parallel calls, result order,
//! multi-turn sessions, HTTP GET tools, usage totals.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use axum::extract::Query;
use axum::routing::get;
use mneme_e2e::scenario::log_events;
use mneme_e2e::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn tool_messages(body: &[u8]) -> Vec<(String, String)> {
    let request: Value = serde_json::from_slice(body).unwrap();
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_calls_run_concurrently_and_return_in_call_order() {
    let tools = [
        command_tool(
            "slow",
            &["sh", "-c", "cat >/dev/null; sleep 1; echo slow"],
            "read_only",
            10,
        ),
        command_tool(
            "fast",
            &["sh", "-c", "cat >/dev/null; sleep 0.6; echo fast"],
            "read_only",
            10,
        ),
    ];
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("slow", json!({})), ("fast", json!({}))]),
            MockReply::answer("both done"),
        ])
        .tools(tools)
        .await;
    let (world, model) = (&bed.world, &bed.model);
    let started = Instant::now();
    let out = bed.run_agent("go").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "calls ran one after the other: {:?}",
        started.elapsed()
    );
    let session = session_id(&out);
    let kinds = event_kinds(world, &session).await;
    let finished: Vec<&str> = kinds
        .iter()
        .map(String::as_str)
        .filter(|k| *k == "ToolFinished")
        .collect();
    assert_eq!(finished.len(), 2);
    // fast finished first in the log, but the model sees slow's result first.
    let log = stdout(
        &world
            .run(&["log", &session, "--kind", "ToolFinished"])
            .await,
    );
    let first = log.lines().next().unwrap();
    assert!(
        first.contains("call_0_1"),
        "fast should finish first: {log}"
    );
    let bodies = model.bodies();
    assert_eq!(
        tool_messages(&bodies[1]),
        vec![
            ("call_0_0".to_string(), "\"slow\"".to_string()),
            ("call_0_1".to_string(), "\"fast\"".to_string())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_continues_over_several_turns_with_usage_totals() {
    // An 8B GQA shape: 131,072 KV bytes a token.
    let shape = "context_window = 8192\nkv = { layers = 32, kv_heads = 8, head_dim = 128, dtype_bytes = 2 }\n";
    let bed = Testbed::new()
        .replies(vec![
            MockReply::answer("first answer"),
            MockReply::answer("second answer"),
        ])
        .model_options(shape)
        .await;
    let (world, model) = (&bed.world, &bed.model);
    let out = bed.run_agent("one").await;
    assert_eq!(stdout(&out).trim(), "first answer");
    let session = session_id(&out);
    let out = world
        .run(&["run", "--session", &session, "two", "--json"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let reply: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(reply["answer"], "second answer");
    // Requests name the session as the prefix-cache key.
    let raw = String::from_utf8(model.raw_bodies()[0].clone()).unwrap();
    assert!(
        raw.contains(&format!("\"prompt_cache_key\":\"{session}\"")),
        "{raw}"
    );
    // The second request extends the first byte for byte: a prefix cache hits.
    let bodies = model.bodies();
    let first = String::from_utf8(bodies[0].clone()).unwrap();
    let second = String::from_utf8(bodies[1].clone()).unwrap();
    let shared = first.trim_end_matches("]}").len() - 10;
    assert_eq!(first[..shared], second[..shared]);
    let sessions: Value =
        serde_json::from_str(stdout(&world.run(&["sessions", "--json"]).await).trim()).unwrap();
    assert_eq!(sessions["model_calls"], 2);
    assert_eq!(sessions["status"], "idle");
    let raw = model.raw_bodies();
    let expected_prompt = (raw[0].len() / 4 + raw[1].len() / 4) as u64;
    assert_eq!(sessions["prompt_tokens"].as_u64().unwrap(), expected_prompt);
    let last = (raw[1].len() / 4) as u64;
    assert_eq!(sessions["prompt_tokens_last"].as_u64(), Some(last));
    assert_eq!(sessions["kv_bytes_last"].as_u64(), Some(last * 131_072));
    assert_eq!(sessions["context_window"].as_u64(), Some(8192));
    assert!(
        sessions["cached_tokens"].as_u64().unwrap() > 0,
        "{sessions}"
    );
    // Each reply records the digest and size of the exact bytes the server
    // received (kept as the prompt grows, not recomputed over it).
    let replies: Vec<Value> = log_events(world, &session)
        .await
        .into_iter()
        .filter(|r| r["kind"] == "ModelReplied")
        .map(|r| r["event"]["ModelReplied"].clone())
        .collect();
    assert_eq!(replies.len(), raw.len());
    for (reply, body) in replies.iter().zip(&raw) {
        assert_eq!(reply["request_digest"], replay::digest_hex(body), "{reply}");
        assert_eq!(reply["request_bytes"], body.len() as u64, "{reply}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_tools_send_arguments_as_the_query_and_the_key_as_a_header() {
    let app = axum::Router::new().route(
        "/weather",
        get(
            |Query(q): Query<BTreeMap<String, String>>, headers: axum::http::HeaderMap| async move {
                let key = headers
                    .get("idempotency-key")
                    .map(|v| v.to_str().unwrap().to_string());
                axum::Json(json!({"query": q, "key": key}))
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let tool = format!(
        "name = \"weather\"\nkind = \"http\"\nmethod = \"GET\"\nurl = \"http://{addr}/weather\"\neffect = \"read_only\"\n"
    );
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("weather", json!({"city": "Oslo", "days": 2}))]),
            MockReply::answer("sunny"),
        ])
        .tools([tool])
        .await;
    let out = bed.run_agent("weather?").await;
    assert!(out.status.success(), "{}", stderr(&out));
    let results = tool_messages(&bed.model.bodies()[1]);
    let result: Value = serde_json::from_str(&results[0].1).unwrap();
    assert_eq!(result["status"], 200);
    assert_eq!(
        result["body"]["query"],
        json!({"city": "Oslo", "days": "2"})
    );
    assert!(
        result["body"]["key"]
            .as_str()
            .unwrap()
            .starts_with("mneme-"),
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_call_ids_in_one_reply_each_run_once() {
    let world = World::new();
    let runs = world.dir.path().join("runs.log");
    let script = format!(
        "cat >> {}; echo >> {}; echo ok",
        runs.display(),
        runs.display()
    );
    let bed = Testbed::new()
        .in_world(world)
        .replies(vec![
            MockReply::calls(&[("count", json!({"n": 1})), ("count", json!({"n": 2}))]),
            MockReply::answer("counted"),
        ])
        .fault(Fault::RepeatCallIds)
        .tools([command_tool(
            "count",
            &["sh", "-c", &script],
            "read_only",
            10,
        )])
        .await;
    let out = bed.run_agent("go").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        2,
        "each call ran once"
    );
    let ids: Vec<String> = tool_messages(&bed.model.bodies()[1])
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, ["call_0", "call_0_1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_requires_approval_waits_for_a_person() {
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("refund", json!({"n": 1}))]),
            MockReply::answer("handled"),
        ])
        .sink_tools(|sink| vec![refund_needing_approval(sink)])
        .await;
    let (world, model, sink) = (&bed.world, &bed.model, &bed.sink);
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let out = bed.run_agent("refund ada").await;
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(stderr(&out).contains("mneme approve"), "{}", stderr(&out));
        sessions.push(session_id(&out));
    }
    assert_eq!(
        sink.stats().path("refund").hits,
        0,
        "nothing ran before approval"
    );
    let out = world
        .run(&["approve", &sessions[0], "call_0_0", "--by", "ops"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "handled");
    assert_eq!(sink.stats().path("refund").effects, 1);
    let out = world
        .run(&["approve", &sessions[1], "call_0_0", "--deny", "--by", "ops"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        sink.stats().path("refund").hits,
        1,
        "a denied call never runs"
    );
    let denied = tool_messages(&model.bodies().last().unwrap().clone());
    assert_eq!(denied[0].1, "error: denied by ops");
    let log = stdout(
        &world
            .run(&["log", &sessions[1], "--kind", "ApprovalDecided"])
            .await,
    );
    assert!(log.contains("call_0_0 denied by ops"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_near_the_context_window_is_compacted_and_the_log_keeps_everything() {
    // About 100 tokens at 4 bytes a token: the third turn crosses 80%.
    let bed = Testbed::new()
        .replies(vec![MockReply::answer("noted"); 8])
        .model_options("context_window = 100\n")
        .await;
    let (world, model) = (&bed.world, &bed.model);
    let messages = [
        "FIRST-QUESTION about ada",
        "second question about bob",
        "third question about carol",
        "fourth question about dave",
    ];
    let (session, _) = world
        .run_turns(&bed.agent, messages.map(String::from))
        .await;
    let log = stdout(&world.run(&["log", &session]).await);
    assert!(
        log.contains("ContextCompacted") && log.contains("SUMMARY of"),
        "{log}"
    );
    assert_eq!(
        log.matches("UserMessage").count(),
        4,
        "the log keeps every message: {log}"
    );
    let last = String::from_utf8(model.bodies().last().unwrap().clone()).unwrap();
    assert!(
        last.contains("Summary of the earlier conversation: SUMMARY of"),
        "{last}"
    );
    assert!(
        !last.contains("FIRST-QUESTION"),
        "compacted away from the prompt: {last}"
    );
    assert!(last.contains("fourth question about dave"));
    // The rebuild from the log gives the prompt that was sent.
    let rebuilt = String::from_utf8(rebuilt_request(world, &session).await).unwrap();
    let messages_sent = &last[..last.rfind("}]").unwrap() + 1];
    assert!(
        rebuilt.starts_with(messages_sent),
        "the rebuild extends what was sent:\n{rebuilt}\n{last}"
    );
}
