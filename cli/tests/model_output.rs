//! What real inference servers send that a scripted one never does: replies
//! cut off by the token limit (`finish_reason: "length"`) in the middle of
//! a tool call or of an answer, and arguments that are not JSON. None of it
//! may start a call or leave the session unusable.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::hostile::{completion, streamed_text, Answer, HostileModel};
use mneme_e2e::*;
use serde_json::{json, Value};

/// A reply that calls `tool` with `arguments` given as raw text, ending
/// with `finish_reason`.
fn raw_call(tool: &str, arguments: &str, finish_reason: &str) -> Answer {
    let reply = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "",
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": tool, "arguments": arguments}}]},
        "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 30}});
    Answer::Json(reply)
}

/// What a llama.cpp server sent with `-n 30` (issue 11).
const CUT_ARGUMENTS: &str = r#"{"cents": 4200, "customer":"#;

/// Every tool call's arguments in a request's history parse as JSON (a
/// server refuses the request otherwise).
fn assert_history_parses(request: &Value) {
    for message in request["messages"].as_array().unwrap() {
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let arguments = call["function"]["arguments"].as_str().unwrap();
            assert!(
                serde_json::from_str::<Value>(arguments).is_ok(),
                "a request carries arguments no server accepts: {arguments}"
            );
        }
    }
}

fn user_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// An agent on `model` with the sink's `charge` and `[model] max_tokens =
/// 30`.
async fn charging(model: &HostileModel) -> Testbed {
    Testbed::new()
        .model_url(&model.base_url())
        .sink_tools(|sink| vec![http_tool("charge", &sink.url("charge"), "side_effect")])
        .model_options("max_tokens = 30\n")
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_cut_off_by_the_token_limit_never_starts_and_gets_room_to_finish() {
    let model = HostileModel::start(|n, request, _| {
        assert_history_parses(request);
        match n {
            0 => {
                assert_eq!(request["max_tokens"], 30);
                raw_call("charge", CUT_ARGUMENTS, "length")
            }
            1 => {
                assert_eq!(request["max_tokens"], 60, "room to finish");
                assert!(
                    user_text(request).contains("cut it off in the middle of its tool calls"),
                    "the model is told: {}",
                    user_text(request)
                );
                raw_call("charge", r#"{"n": 1}"#, "tool_calls")
            }
            _ => {
                assert_eq!(request["max_tokens"], 30, "once only");
                Answer::Json(completion(Some("charged"), &[]))
            }
        }
    })
    .await;
    let bed = charging(&model).await;
    let (world, sink) = (&bed.world, &bed.sink);
    let out = bed.run_agent("charge ada").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "charged");
    assert_eq!(model.requests().len(), 3);
    assert_eq!(sink.stats().path("charge").effects, 1);
    let kinds = event_kinds(world, &session_id(&out)).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "ToolStarted").count(),
        1,
        "the cut-off call never started: {kinds:?}"
    );
    let out = world.run(&["log", &session_id(&out)]).await;
    assert!(
        stdout(&out).contains("REFUSED: the token limit cut it off"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_cut_off_in_a_row_fails_the_turn_and_a_resume_asks_again() {
    let model = HostileModel::start(|n, request, _| {
        assert_history_parses(request);
        match n {
            0 | 1 => raw_call("charge", CUT_ARGUMENTS, "length"),
            _ => {
                assert_eq!(request["max_tokens"], 30, "a resume starts afresh");
                Answer::Json(completion(Some("gave up charging"), &[]))
            }
        }
    })
    .await;
    let bed = charging(&model).await;
    let (world, sink) = (&bed.world, &bed.sink);
    let out = bed.run_agent("charge ada").await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("twice in a row (the second time with max_tokens = 60)"),
        "{}",
        stderr(&out)
    );
    let id = session_id(&out);
    let out = world.run(&["sessions", "--json"]).await;
    assert!(
        stdout(&out).contains("\"status\":\"failed\""),
        "{}",
        stdout(&out)
    );
    let out = world.run(&["resume", &id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "gave up charging");
    assert_eq!(sink.stats().path("charge").hits, 0, "nothing was charged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_that_are_not_json_never_start_a_call() {
    let model = HostileModel::start(|n, request, _| {
        assert_history_parses(request);
        match n {
            0 => raw_call("charge", "{'n': 1}", "tool_calls"),
            _ => {
                assert!(
                    user_text(request).contains("are not valid JSON"),
                    "{}",
                    user_text(request)
                );
                Answer::Json(completion(Some("could not charge"), &[]))
            }
        }
    })
    .await;
    let bed = charging(&model).await;
    let (world, sink) = (&bed.world, &bed.sink);
    let out = bed.run_agent("charge ada").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(sink.stats().path("charge").hits, 0);
    let kinds = event_kinds(world, &session_id(&out)).await;
    assert!(!kinds.contains(&"ToolStarted".to_string()), "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cut_off_by_the_token_limit_is_kept_and_flagged() {
    let world = World::new();
    let model = HostileModel::start(|_, _, _| {
        let mut reply = completion(Some("The charge was <tool_"), &[]);
        reply["choices"][0]["finish_reason"] = json!("length");
        Answer::Json(reply)
    })
    .await;
    let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[]));
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "what happened?"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "The charge was <tool_");
    assert!(
        stderr(&out).contains("token limit cut the answer off"),
        "{}",
        stderr(&out)
    );
    let id = session_id(&out);
    let out = world.run(&["sessions", "--json"]).await;
    let row: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!(row["answer_cut_off"], true, "{row}");
    let out = world.run(&["sessions"]).await;
    assert!(
        stdout(&out).contains("answer cut off by the token limit"),
        "{}",
        stdout(&out)
    );
    let out = world.run(&["log", &id]).await;
    assert!(
        stdout(&out).contains("CUT OFF by the token limit"),
        "{}",
        stdout(&out)
    );
}

/// A server that counts a token as 2 bytes, summarizes compaction requests,
/// and answers everything else.
async fn two_bytes_a_token() -> HostileModel {
    HostileModel::start(|_, request, _| {
        let bytes = request.to_string().len();
        let content = match user_text(request).contains("[mneme:compact]")
            || request["messages"][0]["content"]
                .as_str()
                .is_some_and(|s| s.contains("[mneme:compact]"))
        {
            true => "SUMMARY".to_string(),
            false => "noted".to_string(),
        };
        let mut reply = completion(Some(&content), &[]);
        reply["usage"]["prompt_tokens"] = json!(bytes / 2);
        Answer::Json(reply)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_counts_tokens_as_the_server_does() {
    let world = World::new();
    let model = two_bytes_a_token().await;
    const WINDOW: usize = 600;
    let agent = agent_toml(&model.base_url(), &[]).replace(
        "timeout_secs = 10\n",
        &format!("timeout_secs = 10\ncontext_window = {WINDOW}\n"),
    );
    let agent = world.write("agent.toml", &agent);
    let messages =
        (0..8).map(|turn| format!("turn {turn}: {}", "a long line of facts. ".repeat(12)));
    world.run_turns(&agent, messages).await;
    let requests = model.requests();
    let compactions = requests
        .iter()
        .filter(|r| r.to_string().contains("[mneme:compact]"))
        .count();
    assert!(compactions > 0, "the prompt was compacted");
    // By the server's count (2 bytes a token, not the 4 mneme once
    // assumed), no request it had to answer filled 90% of the window.
    for request in requests
        .iter()
        .filter(|r| !r.to_string().contains("[mneme:compact]"))
    {
        let tokens = request.to_string().len() / 2;
        assert!(
            tokens * 10 <= WINDOW * 9,
            "a request of {tokens} tokens against a window of {WINDOW}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_larger_than_the_window_is_refused_and_the_session_goes_on() {
    let world = World::new();
    let model = two_bytes_a_token().await;
    let agent = agent_toml(&model.base_url(), &[]).replace(
        "timeout_secs = 10\n",
        "timeout_secs = 10\ncontext_window = 1000\n",
    );
    let agent = world.write("agent.toml", &agent);
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "hello"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let id = session_id(&out);
    let big = "one blue widget, shipped by ground freight. ".repeat(100);
    let out = world.run(&["run", "--session", &id, &big]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("the message is {} bytes", big.len()))
            && stderr(&out).contains("more than the model's context window of 1000 tokens"),
        "{}",
        stderr(&out)
    );
    let named = format!("session {id}");
    assert!(
        !stderr(&out).contains(&format!("{named}: {named}")),
        "the error names the session once: {}",
        stderr(&out)
    );
    assert_eq!(model.requests().len(), 1, "the big message was never sent");
    let out = world.run(&["run", "--session", &id, "and now?"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "noted");
    let kinds = event_kinds(&world, &id).await;
    assert_eq!(kinds.iter().filter(|k| *k == "UserMessage").count(), 2);
}

/// A body captured from llama.cpp's server (`tests/fixtures/llama-cpp/`).
fn captured(name: &str) -> String {
    let path = fixtures().join("llama-cpp").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Answers as llama.cpp's server did: the captured HTTP 500 for a history
/// whose tool-call arguments do not parse, else `answer`.
fn as_llama_cpp(request: &Value, answer: Answer) -> Answer {
    let unparsed = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .any(|c| {
            let arguments = c["function"]["arguments"].as_str().unwrap_or("");
            serde_json::from_str::<Value>(arguments).is_err()
        });
    match unparsed {
        true => Answer::Status(500, captured("unparsed-arguments-500.json")),
        false => answer,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpps_own_cut_off_reply_leaves_the_session_usable() {
    let sink = Sink::start().await.unwrap();
    let world = World::new();
    let model = HostileModel::start(|n, request, _| {
        let answer = match n {
            0 => Answer::Status(200, captured("cut-off-tool-call.json")),
            1 => Answer::Status(200, captured("tool-call.json")),
            _ => Answer::Json(completion(Some("Charged ada 4200 cents."), &[])),
        };
        as_llama_cpp(request, answer)
    })
    .await;
    let agent = agent_toml(
        &model.base_url(),
        &[http_tool("charge_card", &sink.url("charge"), "side_effect")],
    );
    let agent = world.write("agent.toml", &agent);
    let out = world
        .run(&[
            "run",
            "--agent",
            agent.to_str().unwrap(),
            "Charge ada 4200 cents",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "Charged ada 4200 cents.");
    assert_eq!(sink.stats().path("charge").effects, 1);
    assert_eq!(
        model.requests().len(),
        3,
        "no request was refused or retried"
    );
    let id = session_id(&out);
    let out = world.run(&["run", "--session", &id, "Hello"]).await;
    assert!(
        out.status.success(),
        "the next message answers: {}",
        stderr(&out)
    );
}

/// An agent on `model` that streams its replies.
fn streaming_agent(model: &HostileModel, tools: &[String]) -> String {
    agent_toml(&model.base_url(), tools)
        .replace("timeout_secs = 10\n", "timeout_secs = 10\nstream = true\n")
}

/// Reads `stdout` until it holds `needle`; what it read.
async fn read_until(stdout: &mut tokio::process::ChildStdout, needle: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), stdout.read(&mut buf))
            .await
            .expect("stdout stalled")
            .unwrap();
        assert!(
            n > 0,
            "stdout ended before {needle:?}: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_text_reaches_stdout_as_it_comes_and_the_reply_is_recorded_whole() {
    let sink = Sink::start().await.unwrap();
    let world = World::new();
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let opened = gate.clone();
    let model = HostileModel::start(move |n, request, _| {
        assert_eq!(request["stream"], true);
        assert_eq!(request["stream_options"]["include_usage"], true);
        match n {
            // A call, its arguments in pieces.
            0 => Answer::Stream {
                events: vec![
                    json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "charge", "arguments": "{\"n\""}}]}}]}).to_string(),
                    json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "finish_reason": "tool_calls"}]}).to_string(),
                ],
                gate: None,
                then_stall: false,
            },
            _ => Answer::Stream {
                events: streamed_text(&["Charged ", "ada ", "4200 cents."], "stop"),
                gate: Some(opened.clone()),
                then_stall: false,
            },
        }
    })
    .await;
    let agent = streaming_agent(
        &model,
        &[http_tool("charge", &sink.url("charge"), "side_effect")],
    );
    let agent = world.write("agent.toml", &agent);
    let mut child = world
        .mneme()
        .args(["run", "--agent", agent.to_str().unwrap(), "charge ada"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut piped = child.stdout.take().unwrap();
    // The first piece is on stdout while the server still holds the rest.
    let first = read_until(&mut piped, "Charged ").await;
    assert_eq!(first, "Charged ");
    gate.notify_one();
    let rest = read_until(&mut piped, "cents.").await;
    let tail = stdout_rest(piped).await;
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = first + &rest + &tail;
    assert_eq!(
        printed, "Charged ada 4200 cents.\n",
        "printed once, as it came"
    );
    assert_eq!(sink.stats().path("charge").effects, 1);
    let log = world.run(&["log", "--json", &session_id(&out)]).await;
    let replies: Vec<Value> = stdout(&log)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["kind"] == "ModelReplied")
        .map(|r| r["event"]["ModelReplied"].clone())
        .collect();
    assert_eq!(replies[0]["tool_calls"][0]["arguments"], "{\"n\": 1}");
    assert_eq!(replies[1]["content"], "Charged ada 4200 cents.");
    assert_eq!(replies[1]["usage"]["prompt_tokens"], 10);
    assert!(
        replies[1]["first_token_ms"].as_u64().unwrap() > 0,
        "{}",
        replies[1]
    );
}

async fn stdout_rest(mut stdout: tokio::process::ChildStdout) -> String {
    use tokio::io::AsyncReadExt;
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).await.unwrap();
    rest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_stream_records_nothing_and_the_same_request_is_sent_again() {
    let world = World::new();
    let model = HostileModel::start(|n, _, _| Answer::Stream {
        events: streamed_text(&["Half ", "of it, then the rest."], "stop"),
        gate: None,
        then_stall: n == 0,
    })
    .await;
    let agent = world.write("agent.toml", &streaming_agent(&model, &[]));
    let mut child = world
        .mneme()
        .args(["run", "--agent", agent.to_str().unwrap(), "tell me"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut piped = child.stdout.take().unwrap();
    read_until(&mut piped, "Half ").await;
    child.start_kill().unwrap();
    let out = child.wait_with_output().await.unwrap();
    let id = session_id(&out);
    let kinds = event_kinds(&world, &id).await;
    assert!(!kinds.contains(&"ModelReplied".to_string()), "{kinds:?}");
    let out = world.run(&["resume", &id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "Half of it, then the rest.\n");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0], requests[1], "the same request, byte for byte");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemons_clients_follow_a_streamed_reply_as_it_comes() {
    use futures_util::StreamExt;
    let world = World::new();
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let opened = gate.clone();
    let model = HostileModel::start(move |_, _, _| Answer::Stream {
        events: streamed_text(
            &[
                "Streamed as it comes, piece one; ",
                "through ",
                "the daemon.",
            ],
            "stop",
        ),
        gate: Some(opened.clone()),
        then_stall: false,
    })
    .await;
    let daemon = mneme_e2e::daemon::DaemonProcess::start(&world.data(), &[]).await;
    let id = daemon.create(&streaming_agent(&model, &[])).await;
    let response = daemon
        .http
        .get(daemon.url(&format!("/sessions/{id}/deltas")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = response.bytes_stream();
    let (status, _) = daemon
        .post(&format!("/sessions/{id}/messages"), &json!({"text": "go"}))
        .await;
    assert_eq!(status, 202);
    let mut seen = String::new();
    let mut text = String::new();
    while !text.contains("the daemon.") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
            .await
            .expect("the delta stream stalled")
            .expect("the delta stream ended")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
        text = seen
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| v["text"].as_str().map(String::from))
            .collect();
        // Text arrives while the server still holds the rest (less the
        // end of the first piece, held back in case a secret (here the
        // daemon's token) starts there).
        if !text.is_empty() && !text.contains("through") {
            assert!(
                "Streamed as it comes, piece one; ".starts_with(&text),
                "{text}"
            );
            gate.notify_one();
        }
    }
    assert_eq!(text, "Streamed as it comes, piece one; through the daemon.");
    assert!(seen.contains("event: delta"), "{seen}");
    // Recorded whole, once durable.
    let what = "the streamed answer to be recorded whole";
    eventually(what, std::time::Duration::from_secs(10), || async {
        let (_, session) = daemon.get(&format!("/sessions/{id}")).await;
        if session["answer"] == "Streamed as it comes, piece one; through the daemon." {
            Ok(())
        } else {
            Err(session)
        }
    })
    .await;
    daemon.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_context_error_compacts_the_newest_entries_too_and_the_turn_goes_on() {
    const LIMIT: usize = 2500;
    let world = World::new();
    // No context_window in the agent: only the server knows its context,
    // and says so with llama.cpp's own error when a request exceeds it.
    let model = HostileModel::start(|_, request, _| {
        let text = request.to_string();
        if text.contains("[mneme:compact]") {
            return Answer::Json(completion(Some("SUMMARY so far"), &[]));
        }
        if text.len() > LIMIT {
            return Answer::Status(400, captured("context-error-400.json"));
        }
        Answer::Json(completion(Some("noted"), &[]))
    })
    .await;
    let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[]));
    let messages =
        (0..6).map(|turn| format!("turn {turn}: {}", "a line of facts to keep. ".repeat(20)));
    let (session, outputs) = world.run_turns(&agent, messages).await;
    for out in &outputs {
        assert_eq!(stdout(out).trim(), "noted");
    }
    let requests = model.requests();
    let refused = requests
        .iter()
        .filter(|r| !r.to_string().contains("[mneme:compact]") && r.to_string().len() > LIMIT)
        .count();
    assert!(refused > 0, "the server refused a request for its context");
    let kinds = event_kinds(&world, &session).await;
    assert!(kinds.contains(&"ContextCompacted".to_string()), "{kinds:?}");
    assert!(
        !kinds.contains(&"SessionFinished".to_string()),
        "no turn failed: {kinds:?}"
    );
    let last = requests.last().unwrap().to_string();
    assert!(
        last.contains("Summary of the earlier conversation: SUMMARY so far"),
        "{last}"
    );
}

/// A session whose one request gets `status` with the captured `body`:
/// the run fails naming `expected`, after that one request.
async fn refused_once(status: u16, body: &'static str, expected: &[&str]) {
    let world = World::new();
    let model = HostileModel::start(move |_, _, _| Answer::Status(status, captured(body))).await;
    let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[]));
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "hello"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    for text in expected {
        assert!(stderr(&out).contains(text), "{text}: {}", stderr(&out));
    }
    assert_eq!(model.requests().len(), 1, "{body}: not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_that_would_repeat_are_named_and_not_retried() {
    // llama.cpp's context error, and its error for a request it cannot
    // parse: the same request would fail the same way.
    refused_once(
        400,
        "context-error-400.json",
        &["HTTP 400", "exceed_context_size_error"],
    )
    .await;
    refused_once(
        500,
        "unparsed-arguments-500.json",
        &["HTTP 500", "Failed to parse"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mneme_run_beside_a_daemon_shows_streamed_text_as_it_comes() {
    const FIRST: &str = "The first piece is long enough to pass every hold-back, ";
    let world = World::new();
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let opened = gate.clone();
    let model = HostileModel::start(move |_, _, _| Answer::Stream {
        events: streamed_text(&[FIRST, "then the rest."], "stop"),
        gate: Some(opened.clone()),
        then_stall: false,
    })
    .await;
    let daemon = mneme_e2e::daemon::DaemonProcess::start(&world.data(), &[]).await;
    let agent = world.write("agent.toml", &streaming_agent(&model, &[]));
    let mut child = world
        .mneme()
        .args(["run", "--agent", agent.to_str().unwrap(), "go"])
        .env("MNEME_TOKEN", mneme_e2e::daemon::TOKEN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut piped = child.stdout.take().unwrap();
    // Text on stdout while the server still holds the rest.
    let first = read_until(&mut piped, "The first piece").await;
    gate.notify_one();
    let rest = stdout_rest(piped).await;
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        first + &rest,
        format!("{FIRST}then the rest.\n"),
        "streamed through the daemon, printed once"
    );
    daemon.kill().await;
}

/// The `delta` frames of one `/deltas` client: each one's id and text.
struct Deltas {
    bytes:
        std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buffer: String,
}

impl Deltas {
    /// Opens `/deltas` of session `id`, with `Last-Event-ID: last` if given.
    async fn open(
        daemon: &mneme_e2e::daemon::DaemonProcess,
        id: &str,
        last: Option<&str>,
    ) -> Deltas {
        let mut request = daemon
            .http
            .get(daemon.url(&format!("/sessions/{id}/deltas")));
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        Deltas {
            bytes: Box::pin(response.bytes_stream()),
            buffer: String::new(),
        }
    }

    /// The next `delta` frame: its id and its text (within 10 s).
    async fn next(&mut self) -> (String, String) {
        use futures_util::StreamExt;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                let field = |name: &str| {
                    frame
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(str::trim)
                        .map(String::from)
                };
                if field("event:").as_deref() != Some("delta") {
                    continue;
                }
                let data: Value = serde_json::from_str(&field("data:").unwrap()).unwrap();
                return (
                    field("id:").unwrap(),
                    data["text"].as_str().unwrap().to_string(),
                );
            }
            let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), self.bytes.next())
                .await
                .expect("no frame within 10 s")
                .expect("the stream ended")
                .unwrap();
            self.buffer
                .push_str(&String::from_utf8_lossy(&chunk).replace("\r\n", "\n"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deltas_client_cut_mid_reply_gets_the_exact_rest_when_it_reconnects() {
    const FIRST: &str = "First words, in a sentence long enough to show some of it at once; ";
    const REST: &str = "then the rest, once the server lets it go.";
    let world = World::new();
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let opened = gate.clone();
    let model = HostileModel::start(move |_, _, _| Answer::Stream {
        events: streamed_text(&[FIRST, REST], "stop"),
        gate: Some(opened.clone()),
        then_stall: false,
    })
    .await;
    let daemon = mneme_e2e::daemon::DaemonProcess::start(&world.data(), &[]).await;
    let id = daemon.create(&streaming_agent(&model, &[])).await;
    let mut cut = Deltas::open(&daemon, &id, None).await;
    let (status, _) = daemon
        .post(&format!("/sessions/{id}/messages"), &json!({"text": "go"}))
        .await;
    assert_eq!(status, 202);
    let (at, seen) = cut.next().await;
    assert!(FIRST.starts_with(&seen) && !seen.is_empty(), "{seen}");
    let (seq, offset) = at.split_once(':').unwrap();
    assert_eq!(offset.parse::<usize>().unwrap(), seen.len(), "{at}");
    drop(cut);

    // Opened mid-reply: the text so far, at once.
    let mut late = Deltas::open(&daemon, &id, None).await;
    assert_eq!(late.next().await, (at.clone(), seen.clone()));
    // A Last-Event-ID that names no position is ignored: the text so far.
    let mut garbage = Deltas::open(&daemon, &id, Some("99999999999999999999999:-1 x")).await;
    assert_eq!(garbage.next().await, (at.clone(), seen.clone()));
    // One past the reply's end gets nothing of it, and no panic.
    let past = format!("{seq}:{}", usize::MAX);
    drop(Deltas::open(&daemon, &id, Some(&past)).await);
    // Reconnected mid-reply from byte 5: the rest of the text so far.
    let mut from_five = Deltas::open(&daemon, &id, Some(&format!("{seq}:5"))).await;
    assert_eq!(from_five.next().await, (at.clone(), seen[5..].to_string()));

    gate.notify_one();
    let whole = format!("{FIRST}{REST}");
    eventually(
        "the reply recorded",
        std::time::Duration::from_secs(10),
        || async {
            let (_, view) = daemon.get(&format!("/sessions/{id}")).await;
            (view["answer"] == whole.as_str()).then_some(())
        },
    )
    .await;
    let mut followed = seen.clone();
    while followed.len() < whole.len() {
        followed.push_str(&late.next().await.1);
    }
    assert_eq!(followed, whole, "the late client got it all, once");
    // Reconnected after the reply was recorded: the rest, from the record.
    let mut after = Deltas::open(&daemon, &id, Some(&at)).await;
    let (end, rest) = after.next().await;
    assert_eq!(
        rest,
        whole[seen.len()..],
        "exactly the bytes it had not had"
    );
    let recorded_at = logged_seq_of_reply(&daemon, &id).await;
    assert_eq!(end, format!("{recorded_at}:{}", whole.len()));
    assert!(daemon.terminate().await.success());
}

/// The seq of the session's one recorded reply.
async fn logged_seq_of_reply(daemon: &mneme_e2e::daemon::DaemonProcess, id: &str) -> u64 {
    let (_, events) = daemon
        .get(&format!("/sessions/{id}/events?kind=ModelReplied"))
        .await;
    events[0]["seq"].as_u64().unwrap()
}
