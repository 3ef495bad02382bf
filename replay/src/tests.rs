//! Tests of the fold, the plan and the prompt rebuild over whole logs.

use crate::rerun::user_messages;
use crate::*;
use proptest::prelude::*;

fn tool(name: &str, kind: ToolKind, effect: Effect, honours: Option<bool>) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("the {name} tool"),
        kind,
        effect,
        parameters: serde_json::json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
        honours_idempotency_key: honours,
        timeout_secs: None,
        requires_approval: false,
        approval_timeout: None,
        method: None,
        url: Some("http://127.0.0.1:9/x".into()),
        command: Some(vec!["true".into()]),
        env: Vec::new(),
        max_output_bytes: None,
        mcp: None,
        check: None,
        check_command: None,
        agent: None,
        agent_spec: None,
    }
}

fn spec() -> AgentSpec {
    AgentSpec {
        name: "billing".into(),
        system: "You are a billing assistant.".into(),
        model: ModelSpec {
            provider: "openai".into(),
            base_url: Some("http://127.0.0.1:9/v1".into()),
            model: "test-model".into(),
            api_key_env: None,
            script: None,
            temperature: None,
            timeout_secs: None,
            connect_timeout_secs: None,
            prompt_cache_key: None,
            cache_salt: None,
            context_window: None,
            kv: None,
            input_cost_per_mtok: Some(1.0),
            output_cost_per_mtok: Some(2.0),
            max_response_bytes: None,
            max_tokens: None,
            max_completion_tokens: None,
            stream: None,
            cached_input_cost_per_mtok: None,
            cache_write_cost_per_mtok: None,
            reasoning: Default::default(),
            thinking_budget_tokens: None,
            interleaved_thinking: false,
        },
        tools: vec![
            tool("charge", ToolKind::Http, Effect::SideEffect, None),
            tool("email", ToolKind::Command, Effect::SideEffect, None),
            tool("lookup", ToolKind::Command, Effect::ReadOnly, None),
        ],
        limits: Limits::default(),
        mcp: Vec::new(),
        mid_turn_messages: Default::default(),
    }
}

fn call(id: &str, name: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: format!("{{\"x\":{}}}", id.len()),
        invented: None,
    }
}

fn reply(content: Option<&str>, calls: Vec<ToolCall>) -> Event {
    Event::ModelReplied(ModelReply {
        content: content.map(String::from),
        tool_calls: calls,
        usage: Usage {
            prompt_tokens: 100,
            completion_tokens: 10,
            cached_tokens: 50,
            ..Usage::default()
        },
        finish_reason: "tool_calls".into(),
        latency_ms: 3,
        ..ModelReply::default()
    })
}

fn started(id: &str, name: &str, effect: Effect) -> Event {
    Event::ToolStarted {
        call_id: id.into(),
        tool: name.into(),
        args: "{}".into(),
        effect,
        idempotency_key: format!("key-{id}"),
        attempt: 1,
    }
}

fn finished(id: &str, out: &str) -> Event {
    Event::ToolFinished {
        call_id: id.into(),
        outcome: ToolOutcome::Ok(out.into()),
        duration_ms: 1,
        settled_by_check: false,
        rerun: None,
        child: None,
    }
}

fn fold(events: &[Event]) -> SessionState {
    SessionState::fold(
        events
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, e)| (i as u64 + 1, e)),
    )
}

/// A conversation whose two parallel calls finished in reverse order.
fn story() -> Vec<Event> {
    vec![
        Event::SessionStarted {
            spec: Box::new(spec()),
            tenant: None,
        },
        Event::UserMessage {
            text: "Charge ada 500 and email her.".into(),
        },
        reply(None, vec![call("c1", "charge"), call("c22", "lookup")]),
        started("c1", "charge", Effect::SideEffect),
        started("c22", "lookup", Effect::ReadOnly),
        finished("c22", "{\"name\":\"Ada\"}"),
        finished("c1", "{\"status\":200}"),
        reply(Some("Done: charged and looked up."), vec![]),
    ]
}

#[test]
fn prompt_matches_golden_file() {
    let state = fold(&story()[..7]);
    let body = next_request("0190aaaa-0000-7000-8000-000000000001", &state).unwrap();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/request_after_tools.json"
    );
    if std::env::var_os("MNEME_BLESS").is_some() {
        std::fs::write(path, &body).unwrap();
    }
    let golden = std::fs::read(path).expect("fixture missing: run with MNEME_BLESS=1");
    assert_eq!(
        String::from_utf8(body).unwrap(),
        String::from_utf8(golden).unwrap()
    );
}

#[test]
fn a_turn_is_opened_by_a_message_or_a_resume() {
    let mut events = story();
    let state = fold(&events);
    let opened = |seq, resumed, previous| TurnOpened {
        seq,
        resumed,
        previous,
    };
    assert_eq!(state.turn_opened, opened(2, false, 0));
    events.push(Event::SessionPaused {
        reason: "asked".into(),
        budget: false,
    });
    events.push(Event::SessionResumed {
        by: "ada".into(),
        extend_budget: false,
        after_crash: false,
    });
    assert_eq!(fold(&events).turn_opened, opened(10, true, 2));
    events.push(Event::UserMessage {
        text: "more".into(),
    });
    assert_eq!(fold(&events).turn_opened, opened(11, false, 10));
}

#[test]
fn a_turn_is_driven_once_a_process_records_its_work_and_a_forks_copy_is_not() {
    let story = story();
    assert!(
        !fold(&story[..2]).turn_driven,
        "a message alone: never started"
    );
    assert!(fold(&story[..3]).turn_driven, "a reply was recorded");
    let mut next = story.clone();
    next.push(Event::UserMessage {
        text: "more".into(),
    });
    assert!(!fold(&next).turn_driven, "a new turn opened");
    // A fork after a call's result holds the parent's work, not its own.
    let mut fork = vec![Event::SessionForked {
        parent: uuid::Uuid::from_u128(7),
        at_seq: 6,
        rerun: None,
        shared: false,
    }];
    fork.extend(story[..6].iter().cloned());
    assert!(!fold(&fork).turn_driven, "{:?}", fold(&fork).status());
    fork.push(story[6].clone());
    assert!(fold(&fork).turn_driven, "its own first record");
}

#[test]
fn a_forks_links_are_its_own_not_those_of_the_history_it_copies() {
    let [grandparent, parent, caller] = [7, 8, 9].map(uuid::Uuid::from_u128);
    let started = Event::SessionStarted {
        spec: Box::new(spec()),
        tenant: None,
    };
    let hi = Event::UserMessage { text: "hi".into() };
    let a_rerun = vec![
        Event::SessionForked {
            parent: grandparent,
            at_seq: 0,
            rerun: Some(crate::RerunOf {
                through_seq: 4,
                live_tools: false,
            }),
            shared: false,
        },
        started.clone(),
        hi.clone(),
    ];
    let a_sub_agent = vec![
        started,
        Event::SpawnedBy {
            parent: caller,
            seq: 3,
            call_id: "c1".into(),
        },
        hi,
    ];
    for history in [a_rerun, a_sub_agent] {
        let at_seq = history.len() as u64;
        let mut fork = vec![Event::SessionForked {
            parent,
            at_seq,
            rerun: None,
            shared: false,
        }];
        fork.extend(history.iter().cloned());
        let (original, state) = (fold(&history), fold(&fork));
        assert!(original.rerun.is_some() || original.parent.is_some());
        assert_eq!(state.forked_from, Some((parent, at_seq)));
        assert_eq!(state.rerun, None, "a fork of a rerun is not a rerun");
        assert_eq!(state.parent, None, "a fork of a sub-agent is not one");
    }
}

#[test]
fn a_resume_after_a_crash_goes_on_with_the_same_turn_and_prompt() {
    let mut events = story()[..7].to_vec();
    let before = fold(&events);
    let request = next_request("0190aaaa-0000-7000-8000-000000000001", &before).unwrap();
    events.push(Event::SessionResumed {
        by: "mneme resume".into(),
        extend_budget: false,
        after_crash: true,
    });
    let after = fold(&events);
    assert_eq!(after.turn_opened, before.turn_opened);
    assert_eq!(after.turn, before.turn);
    assert_eq!(after.status(), before.status());
    assert_eq!(
        next_request("0190aaaa-0000-7000-8000-000000000001", &after).unwrap(),
        request,
        "the prompt is byte for byte the one the crashed process would have sent"
    );
}

#[test]
fn tool_results_follow_call_order_not_completion_order() {
    let state = fold(&story()[..7]);
    let msgs = messages(&state);
    let ids: Vec<_> = msgs.iter().filter_map(|m| m.tool_call_id.clone()).collect();
    assert_eq!(ids, vec!["c1", "c22"]);
    assert_eq!(
        msgs.last().unwrap().content.as_deref(),
        Some("{\"name\":\"Ada\"}")
    );
}

#[test]
fn story_ends_idle_with_answer_and_totals() {
    let state = fold(&story());
    assert_eq!(state.status(), Status::Idle);
    assert_eq!(state.answer(), Some("Done: charged and looked up."));
    assert_eq!(state.totals.model_calls, 2);
    assert_eq!(state.totals.prompt_tokens, 200);
    assert!((state.totals.cost - (200.0 * 1.0 + 20.0 * 2.0) / 1e6).abs() < 1e-12);
    assert!((state.totals.cache_hit_ratio() - 0.5).abs() < 1e-12);
    assert_eq!(plan(&state).next, NextStep::Nothing);
}

#[test]
fn crash_between_start_and_finish_plans_by_effect() {
    let mut events = story()[..5].to_vec();
    events[2] = reply(
        None,
        vec![
            call("c1", "charge"),
            call("c2", "email"),
            call("c3", "lookup"),
        ],
    );
    events.truncate(3);
    events.push(started("c1", "charge", Effect::SideEffect));
    events.push(started("c2", "email", Effect::SideEffect));
    let state = fold(&events);
    let p = plan(&state);
    assert_eq!(p.next, NextStep::RunTools);
    assert_eq!(
        p.calls[0].decision,
        CallDecision::Rerun,
        "http honours keys"
    );
    assert!(matches!(p.calls[1].decision, CallDecision::InDoubt(_)));
    assert_eq!(p.calls[2].decision, CallDecision::Run);
}

#[test]
fn in_doubt_call_waits_then_resolution_finishes_it() {
    let mut events = story()[..2].to_vec();
    events.push(reply(None, vec![call("c2", "email")]));
    events.push(started("c2", "email", Effect::SideEffect));
    events.push(Event::ToolInDoubt {
        call_id: "c2".into(),
        reason: "crashed".into(),
    });
    let state = fold(&events);
    assert_eq!(state.status(), Status::Paused);
    assert_eq!(plan(&state).next, NextStep::AwaitDecision);
    let unpaired = messages(&state);
    assert_eq!(
        unpaired.last().unwrap().content.as_deref(),
        Some(prompt::IN_DOUBT_RESULT)
    );
    events.push(Event::ToolResolved {
        call_id: "c2".into(),
        resolution: Resolution::Skip("{\"sent\":true}".into()),
        by: "ops".into(),
    });
    let state = fold(&events);
    assert_eq!(plan(&state).next, NextStep::CallModel);
    assert_eq!(state.status(), Status::Running);
}

/// A key-ignoring side effect with a check: interrupted, it is checked
/// (not put in doubt); not applied, it runs again with its key; unknown,
/// it is in doubt; applied, its settled outcome is reused.
#[test]
fn an_interrupted_call_with_a_check_is_checked_before_anything_else() {
    let mut with_check = spec();
    let email = with_check
        .tools
        .iter_mut()
        .find(|t| t.name == "email")
        .unwrap();
    email.check_command = Some(vec!["./sent.sh".into(), "{key}".into()]);
    let mut events = vec![
        Event::SessionStarted {
            spec: Box::new(with_check),
            tenant: None,
        },
        story()[1].clone(),
        reply(None, vec![call("c2", "email")]),
        started("c2", "email", Effect::SideEffect),
    ];
    assert_eq!(plan(&fold(&events)).calls[0].decision, CallDecision::Check);
    let checked = |answer| Event::ToolChecked {
        call_id: "c2".into(),
        attempt: 1,
        answer,
        duration_ms: 4,
        answered: None,
    };
    let mut not_applied = events.clone();
    not_applied.push(checked(CheckAnswer::NotApplied));
    assert_eq!(
        plan(&fold(&not_applied)).calls[0].decision,
        CallDecision::Rerun
    );
    not_applied.push(started("c2", "email", Effect::SideEffect));
    assert_eq!(
        plan(&fold(&not_applied)).calls[0].decision,
        CallDecision::Check,
        "the second attempt is checked again"
    );
    let mut unknown = events.clone();
    unknown.push(checked(CheckAnswer::Unknown("503".into())));
    match &plan(&fold(&unknown)).calls[0].decision {
        CallDecision::InDoubt(why) => assert!(why.contains("503"), "{why}"),
        other => panic!("{other:?}"),
    }
    events.push(checked(CheckAnswer::Applied));
    events.push(Event::ToolFinished {
        call_id: "c2".into(),
        outcome: ToolOutcome::Ok("{\"sent\":true}".into()),
        duration_ms: 4,
        settled_by_check: true,
        rerun: None,
        child: None,
    });
    let state = fold(&events);
    assert_eq!(plan(&state).calls[0].decision, CallDecision::Reuse);
    assert_eq!(plan(&state).next, NextStep::CallModel);
    assert_eq!(
        messages(&state).last().unwrap().content.as_deref(),
        Some("{\"sent\":true}")
    );
}

#[test]
fn a_tool_name_the_model_invented_is_set_aside_as_content_and_sent_back_as_it_was() {
    let mut calls = vec![call("c1", "charge"), call("c2", "send_pin_4821")];
    let spec = spec();
    event::set_invented_names_aside(&mut calls, |name| spec.tool(name).is_some());
    assert_eq!(
        (calls[0].name.as_str(), calls[0].invented.as_deref()),
        ("charge", None)
    );
    assert_eq!(calls[1].name, "unknown_tool_1");
    assert_eq!(calls[1].sent_name(), "send_pin_4821");
    let mut reply = reply(None, calls);
    assert_eq!(
        reply.schema(),
        5,
        "a build that would send its set-aside name refuses it"
    );
    let personal: Vec<String> = reply
        .personal_fields_mut()
        .into_iter()
        .map(|f| f.clone())
        .collect();
    assert!(
        personal.contains(&"send_pin_4821".to_string()),
        "{personal:?}"
    );
    // The next request repeats the model's own name, byte for byte.
    let mut events = story()[..2].to_vec();
    events.push(reply);
    let body = String::from_utf8(next_request("s", &fold(&events)).unwrap()).unwrap();
    assert!(body.contains(r#""name":"send_pin_4821""#), "{body}");
    assert!(!body.contains("unknown_tool_1"), "{body}");
}

#[test]
fn a_checks_answer_is_content() {
    let mut checked = Event::ToolChecked {
        call_id: "c1".into(),
        attempt: 1,
        answer: CheckAnswer::Applied,
        duration_ms: 3,
        answered: Some(r#"{"charge":"PIN 4821"}"#.into()),
    };
    let fields: Vec<String> = (checked.personal_fields_mut().into_iter())
        .map(|f| f.clone())
        .collect();
    assert_eq!(fields, [r#"{"charge":"PIN 4821"}"#]);
}

#[test]
fn call_ids_are_made_unique_and_non_empty() {
    let mut calls = vec![
        call("a", "x"),
        call("a", "x"),
        call("", "x"),
        call("a_1", "x"),
    ];
    event::normalize_call_ids(&mut calls);
    let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["a", "a_1", "call_2", "a_1_3"]);
}

#[test]
fn call_ids_from_the_model_are_normalised_to_a_safe_charset() {
    let hostile = [
        "../../../sessions/0192/calls/call_0/approve?",
        "--deny",
        "\u{1b}]52;c;aGk=\u{7}",
        "ok-id_1",
        &"x".repeat(65),
        "a b",
    ];
    let mut calls: Vec<ToolCall> = hostile.iter().map(|id| call(id, "x")).collect();
    event::normalize_call_ids(&mut calls);
    let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        ["call_0", "call_1", "call_2", "ok-id_1", "call_4", "call_5"]
    );
    assert!(ids.iter().all(|id| spec::is_safe_name(id)));
    // Clashes with the fallback names still end distinct and safe.
    let mut calls = vec![call("call_1", "x"), call("", "x"), call("call_1", "x")];
    event::normalize_call_ids(&mut calls);
    let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["call_1", "call_1_1", "call_1_2"]);
}

#[test]
fn a_refused_reply_runs_none_of_its_calls_and_the_model_is_told() {
    let mut events = vec![
        Event::SessionStarted {
            spec: Box::new(spec()),
            tenant: None,
        },
        Event::UserMessage { text: "hi".into() },
    ];
    let mut refused = reply(None, vec![call("c1", "charge"), call("c2", "charge")]);
    if let Event::ModelReplied(r) = &mut refused {
        r.refused = Some("it made 2 tool calls; at most 1 are allowed".into());
    }
    events.push(refused);
    let state = fold(&events);
    assert_eq!(state.answer(), None, "a refused reply is not an answer");
    assert_eq!(plan(&state).next, NextStep::CallModel);
    assert!(plan(&state).calls.is_empty(), "none of its calls run");
    let body = String::from_utf8(next_request("s", &state).unwrap()).unwrap();
    assert!(!body.contains("tool_calls"), "{body}");
    assert!(
        body.contains("[mneme] Your last reply was not acted on: it made 2 tool calls"),
        "{body}"
    );
    assert_eq!(state.turn.tool_calls, 0);
}

#[test]
fn a_reply_cut_off_mid_call_gets_room_to_finish_once() {
    let mut spec = spec();
    spec.model.max_tokens = Some(30);
    let cut_off = |id: &str| {
        let mut reply = reply(None, vec![call(id, "charge")]);
        if let Event::ModelReplied(r) = &mut reply {
            r.tool_calls[0].arguments = "{\"x\":".into();
            r.finish_reason = event::CUT_OFF.into();
            r.refused = Some("cut off".into());
        }
        reply
    };
    let max_tokens = |events: &[Event]| -> serde_json::Value {
        let body = next_request("s", &fold(events)).unwrap();
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["max_tokens"].clone()
    };
    let mut events = vec![
        Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        },
        Event::UserMessage { text: "go".into() },
    ];
    assert_eq!(max_tokens(&events), 30);
    events.push(cut_off("a"));
    assert_eq!(fold(&events).cut_off_in_a_row, 1);
    assert_eq!(max_tokens(&events), 60, "room to finish, once");
    let body = String::from_utf8(next_request("s", &fold(&events)).unwrap()).unwrap();
    assert!(
        !body.contains("{\\\"x\\\":\""),
        "the cut-off arguments are not sent back: {body}"
    );
    events.push(cut_off("b"));
    assert_eq!(fold(&events).cut_off_in_a_row, 2);
    assert_eq!(max_tokens(&events), 30, "only once");
    events.push(Event::SessionResumed {
        by: "p".into(),
        extend_budget: false,
        after_crash: false,
    });
    assert_eq!(fold(&events).cut_off_in_a_row, 0);
    // The incremental renderer agrees byte for byte.
    let state = fold(&events);
    let mut prefix = RenderedPrefix::default();
    assert_eq!(
        next_request_incremental("s", &state, &mut prefix).map(|r| r.to_vec()),
        next_request("s", &state)
    );
}

#[test]
fn token_estimates_follow_the_servers_own_count() {
    let mut events = story();
    // Before any count: the conservative fallback.
    let first = fold(&events[..2]);
    assert_eq!(first.estimate_tokens(300), 100);
    // The server counted 1,000 tokens for a 3,300-byte request.
    if let Some(Event::ModelReplied(r)) = events.iter_mut().find(|e| e.kind() == "ModelReplied") {
        r.request_bytes = 3300;
        r.usage.prompt_tokens = 1000;
    }
    let state = fold(&events);
    assert!((state.bytes_per_token() - 3.3).abs() < 1e-9);
    assert_eq!(state.estimate_tokens(3300 + 330), 1100);
    assert_eq!(
        state.estimate_tokens(1650),
        500,
        "a compacted request is all at that rate"
    );
}

#[test]
fn arguments_that_are_not_json_are_sent_back_inside_json() {
    let mut events = story();
    if let Some(Event::ModelReplied(r)) = events.iter_mut().find(|e| e.kind() == "ModelReplied") {
        r.tool_calls[0].arguments = "{\"cents\": 4200, \"customer\":".into();
    }
    let body = next_request("s", &fold(&events)).unwrap();
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let sent = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .map(|c| c["function"]["arguments"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    for arguments in &sent {
        serde_json::from_str::<serde_json::Value>(arguments).expect("every argument parses");
    }
    assert!(
        sent.iter().any(|a| a.contains(prompt::UNPARSED_ARGUMENTS)),
        "{sent:?}"
    );
}

#[test]
fn a_turn_stops_at_its_budget_and_an_extending_resume_starts_it_again() {
    let mut spec = spec();
    spec.limits.max_steps_per_turn = Some(2);
    spec.limits.max_tool_calls_per_turn = Some(3);
    let mut events = vec![
        Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        },
        Event::UserMessage { text: "go".into() },
        reply(None, vec![call("a", "lookup")]),
        started("a", "lookup", Effect::ReadOnly),
        finished("a", "1"),
        reply(None, vec![call("b", "lookup")]),
        started("b", "lookup", Effect::ReadOnly),
        finished("b", "1"),
    ];
    let next = plan(&fold(&events)).next;
    let NextStep::OverBudget(reason) = next else {
        panic!("expected the step budget to stop the turn, got {next:?}");
    };
    assert!(reason.contains("max_steps_per_turn = 2"), "{reason}");
    events.push(Event::SessionPaused {
        reason,
        budget: true,
    });
    let state = fold(&events);
    assert!(state.budget_paused);
    assert!(matches!(plan(&state).next, NextStep::Paused(_)));
    // A plain resume clears the pause, but the budget is still spent.
    let mut plain = events.clone();
    plain.push(Event::SessionResumed {
        by: "p".into(),
        extend_budget: false,
        after_crash: false,
    });
    assert!(matches!(plan(&fold(&plain)).next, NextStep::OverBudget(_)));
    events.push(Event::SessionResumed {
        by: "p".into(),
        extend_budget: true,
        after_crash: false,
    });
    assert_eq!(plan(&fold(&events)).next, NextStep::CallModel);
    // Tool calls: a reply that takes the turn past its limit runs nothing.
    events.push(reply(
        None,
        vec![
            call("c", "lookup"),
            call("d", "lookup"),
            call("e", "lookup"),
            call("f", "lookup"),
        ],
    ));
    let next = plan(&fold(&events)).next;
    assert!(
        matches!(&next, NextStep::OverBudget(r) if r.contains("max_tool_calls_per_turn = 3")),
        "{next:?}"
    );
    // A new message is a new turn.
    events.push(Event::UserMessage {
        text: "again".into(),
    });
    assert_eq!(fold(&events).turn, TurnSpend::default());
}

#[test]
fn specs_refuse_what_would_break_a_session_or_leak_a_secret() {
    let refused = |change: &dyn Fn(&mut AgentSpec), expect: &str| {
        let mut s = spec();
        change(&mut s);
        let err = s.validate().expect_err(expect);
        assert!(err.contains(expect), "{err}");
    };
    refused(&|s| s.name = String::new(), "name \"\"");
    refused(
        &|s| s.model.timeout_secs = Some(0),
        "timeout_secs must be greater than 0",
    );
    refused(
        &|s| s.tools[0].timeout_secs = Some(0),
        "timeout_secs must be greater than 0",
    );
    refused(
        &|s| s.tools[0].url = Some("file:///etc/passwd".into()),
        "only http and https",
    );
    refused(
        &|s| s.tools[0].url = Some("ftp://x/y".into()),
        "only http and https",
    );
    refused(&|s| s.tools[0].url = Some("http//nope".into()), "not a URL");
    refused(
        &|s| s.tools[0].method = Some("GE T".into()),
        "is not one of",
    );
    refused(
        &|s| s.model.base_url = Some("http://user:hunter2@127.0.0.1:9/v1".into()),
        "carries user information",
    );
    refused(
        &|s| {
            s.model.kv = Some(KvShape {
                layers: 1 << 62,
                kv_heads: 2,
                head_dim: 1,
                dtype_bytes: 1,
            })
        },
        "fit in 64 bits",
    );
    refused(
        &|s| s.tools[1].env = vec!["A=B".into()],
        "not a variable name",
    );
    refused(
        &|s| s.limits.max_calls_per_reply = Some(0),
        "max_calls_per_reply must be",
    );
    refused(
        &|s| s.tools[0].max_output_bytes = Some(3 << 20),
        "must fit in one record",
    );
    refused(
        &|s| s.model.max_response_bytes = Some(16 << 20),
        "must fit in one record",
    );
    refused(
        &|s| {
            s.model.input_cost_per_mtok = None;
            s.model.output_cost_per_mtok = None;
            s.limits.max_cost_per_turn = Some(1.0);
        },
        "max_cost_per_turn needs prices",
    );
    let mut s = spec();
    s.model.base_url = Some("http://user:hunter2@127.0.0.1:9/v1".into());
    let err = s.validate().unwrap_err();
    assert!(
        !err.contains("hunter2"),
        "the password is not printed: {err}"
    );
    assert!(spec().validate().is_ok());
}

#[test]
fn servers_that_pick_the_model_by_name_must_be_given_one() {
    let refused = |provider: &str, base_url: Option<&str>, expect: &str| {
        let mut s = spec();
        s.model.provider = provider.into();
        s.model.base_url = base_url.map(String::from);
        s.model.model = " ".into();
        let err = s.validate().expect_err(expect);
        assert!(err.contains("[model]") && err.contains(expect), "{err}");
    };
    refused("anthropic", None, "provider = \"anthropic\" needs model");
    refused(
        "openai",
        Some("https://api.openai.com/v1"),
        "https://api.openai.com/v1 needs model",
    );
    // A local server serves what it loaded, whatever the name.
    let mut local = spec();
    local.model.base_url = Some("http://127.0.0.1:8080/v1".into());
    local.model.model = String::new();
    assert!(local.validate().is_ok());
}

#[test]
fn a_thinking_budget_is_refused_where_the_api_would_refuse_it() {
    let thinking = |provider: &str, budget: u64, temperature: Option<f64>| {
        let mut s = spec();
        s.model.provider = provider.into();
        s.model.thinking_budget_tokens = Some(budget);
        s.model.temperature = temperature;
        s.validate()
    };
    assert!(thinking("anthropic", 2048, None).is_ok());
    assert!(thinking("anthropic", 2048, Some(1.0)).is_ok());
    for (provider, budget, temperature, says) in [
        ("openai", 2048, None, "only with provider"),
        ("anthropic", 512, None, "at least 1024"),
        ("anthropic", 4096, None, "under max_tokens (4096)"),
        ("anthropic", 2048, Some(0.2), "temperature"),
    ] {
        let err = thinking(provider, budget, temperature).expect_err(says);
        assert!(err.contains("[model]") && err.contains(says), "{err}");
    }
    // Interleaved, the budget spans the turn: over max_tokens is fine; and
    // it needs a budget.
    let mut s = spec();
    s.model.provider = "anthropic".into();
    s.model.thinking_budget_tokens = Some(8192);
    s.model.interleaved_thinking = true;
    assert!(s.validate().is_ok());
    s.model.thinking_budget_tokens = None;
    let err = s.validate().unwrap_err();
    assert!(
        err.contains("interleaved_thinking needs thinking_budget_tokens"),
        "{err}"
    );
}

/// A reply of the Messages API thinking `thoughts` (each JSON, each with
/// where it stood) around `calls`.
fn thinking_reply(thoughts: &[(&str, u32)], calls: Vec<ToolCall>) -> Event {
    let mut made = reply(None, calls);
    if let Event::ModelReplied(r) = &mut made {
        for (i, (text, _)) in thoughts.iter().enumerate() {
            let block = serde_json::json!({"type": "thinking", "thinking": text, "signature": format!("s{i}")});
            r.thinking.push(block.to_string());
        }
        r.thinking_at = thoughts.iter().map(|(_, at)| *at).collect();
        if r.thinking_at.iter().all(|&at| at == 0) {
            r.thinking_at.clear();
        }
    }
    made
}

/// The types of the blocks of the first assistant message of `state`'s
/// next Messages API request, with each thinking block's text.
fn assistant_blocks(state: &SessionState) -> Vec<String> {
    let body = crate::anthropic::request(state, false).unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let assistant = &body["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    let blocks = assistant["content"].as_array().unwrap().iter();
    blocks
        .map(|b| match b["type"].as_str().unwrap() {
            "thinking" => format!("thinking {}", b["thinking"].as_str().unwrap()),
            other => other.to_string(),
        })
        .collect()
}

#[test]
fn thinking_goes_back_where_it_stood_and_unfinished_thinking_never() {
    let mut spec = spec();
    spec.model.provider = "anthropic".into();
    let started = Event::SessionStarted {
        spec: Box::new(spec),
        tenant: None,
    };
    let user = Event::UserMessage {
        text: "charge".into(),
    };
    let turn = |reply: Event| fold(&[started.clone(), user.clone(), reply]);
    let calls = || vec![call("c1", "lookup"), call("c2", "charge")];
    // Before each call: each block where it stood, a schema 9 reply.
    let interleaved = thinking_reply(&[("one", 0), ("two", 1)], calls());
    assert_eq!(interleaved.schema(), 9);
    assert_eq!(
        assistant_blocks(&turn(interleaved)),
        ["thinking one", "tool_use", "thinking two", "tool_use"]
    );
    // All at the head: as thinking always went back, schema 8.
    let at_head = thinking_reply(&[("one", 0), ("two", 0)], calls());
    assert_eq!(at_head.schema(), 8);
    assert_eq!(
        assistant_blocks(&turn(at_head)),
        ["thinking one", "thinking two", "tool_use", "tool_use"]
    );
    // Cut off while it still thought, and refused for it: its unfinished
    // block is not sent back; the model is told, with room to finish.
    let mut cut = thinking_reply(&[("unfinish", 0)], vec![]);
    if let Event::ModelReplied(r) = &mut cut {
        r.finish_reason = crate::event::CUT_OFF.into();
        r.refused = Some("cut off while it was still thinking".into());
    }
    let state = turn(cut);
    assert_eq!(state.cut_off_in_a_row, 1);
    assert_eq!(assistant_blocks(&state), ["text"]);
    let body = String::from_utf8(crate::anthropic::request(&state, true).unwrap()).unwrap();
    assert!(
        body.contains("cut off while it was still thinking"),
        "{body}"
    );
    assert!(!body.contains("unfinish"), "{body}");
    assert_eq!(plan(&state).next, NextStep::CallModel);
}

#[test]
fn calls_needing_approval_wait_then_run_or_are_denied() {
    let mut spec = spec();
    spec.tools[0].requires_approval = true; // charge
    let mut events = vec![
        Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        },
        Event::UserMessage {
            text: "refund".into(),
        },
        reply(None, vec![call("c1", "charge"), call("c2", "lookup")]),
    ];
    let p = plan(&fold(&events));
    assert_eq!(p.calls[0].decision, CallDecision::NeedsApproval);
    assert_eq!(p.calls[1].decision, CallDecision::Run);
    events.push(Event::ApprovalRequested {
        call_id: "c1".into(),
        expires_at_ms: None,
    });
    events.push(started("c2", "lookup", Effect::ReadOnly));
    events.push(finished("c2", "{}"));
    let state = fold(&events);
    assert_eq!(state.status(), Status::Paused);
    assert_eq!(plan(&state).next, NextStep::AwaitDecision);
    assert_eq!(
        messages(&state)[3].content.as_deref(),
        Some(prompt::AWAITING_APPROVAL_RESULT)
    );
    let mut approved = events.clone();
    approved.push(Event::ApprovalDecided {
        call_id: "c1".into(),
        approved: true,
        by: "ops".into(),
        reason: None,
        args: None,
    });
    assert_eq!(plan(&fold(&approved)).calls[0].decision, CallDecision::Run);
    events.push(Event::ApprovalDecided {
        call_id: "c1".into(),
        approved: false,
        by: "ops".into(),
        reason: None,
        args: None,
    });
    let denied = fold(&events);
    assert_eq!(plan(&denied).next, NextStep::CallModel);
    assert_eq!(
        messages(&denied)[3].content.as_deref(),
        Some("error: denied by ops")
    );
}

/// A log where `charge` (requiring approval, with a timeout of 2s) was
/// called as `c1` with `{"x":1}` and waits for approval until 5000 ms.
fn waiting_for_approval() -> Vec<Event> {
    let mut spec = spec();
    spec.tools[0].requires_approval = true; // charge
    spec.tools[0].approval_timeout = Some("2s".into());
    let mut charge = call("c1", "charge");
    charge.arguments = r#"{"x":1}"#.into();
    vec![
        Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        },
        Event::UserMessage {
            text: "refund".into(),
        },
        reply(None, vec![charge]),
        Event::ApprovalRequested {
            call_id: "c1".into(),
            expires_at_ms: Some(5000),
        },
    ]
}

#[test]
fn an_edited_approval_runs_the_persons_arguments_and_the_model_is_told() {
    let mut events = waiting_for_approval();
    events.push(Event::ApprovalDecided {
        call_id: "c1".into(),
        approved: true,
        by: "ada".into(),
        reason: None,
        args: Some(r#"{"x":2}"#.into()),
    });
    let state = fold(&events);
    let call = &state.open_calls()[0];
    assert_eq!(call.arguments(), r#"{"x":2}"#, "the tool runs with these");
    assert_eq!(call.call.arguments, r#"{"x":1}"#, "the model's stay");
    assert_eq!(
        call.edited,
        Some(EditedArgs {
            arguments: r#"{"x":2}"#.into(),
            by: "ada".into()
        })
    );
    assert_eq!(plan(&state).calls[0].decision, CallDecision::Run);
    events.push(Event::ToolStarted {
        call_id: "c1".into(),
        tool: "charge".into(),
        args: r#"{"x":2}"#.into(),
        effect: Effect::SideEffect,
        idempotency_key: "k".into(),
        attempt: 1,
    });
    events.push(finished("c1", r#"{"ok":true}"#));
    let state = fold(&events);
    assert_eq!(plan(&state).next, NextStep::CallModel);
    let msgs = messages(&state);
    // The request keeps the call as the model made it; its result says
    // who changed the arguments, and to what.
    let calls = msgs[2].tool_calls.as_ref().unwrap();
    assert_eq!(calls[0].function.arguments, r#"{"x":1}"#);
    assert_eq!(
        msgs[3].content.as_deref(),
        Some("(arguments edited by ada: {\"x\":2})\n{\"ok\":true}")
    );
    // Byte for byte the same from the stored encoding, from a snapshot,
    // and built incrementally.
    let body = next_request("s", &state).unwrap();
    let decoded: Vec<Event> = (events.iter())
        .map(|e| Event::decode(EVENT_SCHEMA, &e.encode()).unwrap())
        .collect();
    assert_eq!(next_request("s", &fold(&decoded)).unwrap(), body);
    let snapshot = SessionState::decode(&fold(&events[..5]).encode()).unwrap();
    let mut resumed = snapshot;
    for (i, e) in events.iter().enumerate().skip(5) {
        resumed.apply(i as u64 + 1, e.clone());
    }
    assert_eq!(next_request("s", &resumed).unwrap(), body);
    let mut prefix = RenderedPrefix::default();
    let built = next_request_incremental("s", &state, &mut prefix).unwrap();
    assert_eq!(built.to_vec(), body);
    // Anthropic's request tells it too.
    let mut anthropic = events.clone();
    if let Event::SessionStarted { spec, .. } = &mut anthropic[0] {
        spec.model.provider = "anthropic".into();
    }
    let body = String::from_utf8(next_request("s", &fold(&anthropic)).unwrap()).unwrap();
    assert!(body.contains("(arguments edited by ada:"), "{body}");
    // A denial with arguments keeps none of them.
    let mut denied = waiting_for_approval();
    denied.push(Event::ApprovalDecided {
        call_id: "c1".into(),
        approved: false,
        by: "ada".into(),
        reason: None,
        args: Some("{}".into()),
    });
    assert_eq!(fold(&denied).open_calls()[0].edited, None);
}

#[test]
fn an_approval_expires_at_its_deadline_and_the_model_is_told_why() {
    let mut events = waiting_for_approval();
    let state = fold(&events);
    assert_eq!(state.open_calls()[0].approval_expires_at_ms, Some(5000));
    assert_eq!(state.approval_deadline_ms(), Some(5000));
    assert!(state.approvals_expired(4999).is_empty());
    assert_eq!(state.approvals_expired(5000), ["c1"]);
    assert!(state.waits_for_a_person(), "until something records it");
    events.push(Event::ApprovalDecided {
        call_id: "c1".into(),
        approved: false,
        by: EXPIRY_BY.into(),
        reason: Some(EXPIRED.into()),
        args: None,
    });
    let state = fold(&events);
    assert!(state.approvals_expired(i64::MAX).is_empty());
    assert_eq!(state.approval_deadline_ms(), None);
    assert_eq!(plan(&state).next, NextStep::CallModel);
    assert_eq!(
        messages(&state)[3].content.as_deref(),
        Some("error: denied (expired after 2s: nobody approved it in time)")
    );
    // Without a timeout in the spec (an older log), it still says why.
    if let Event::SessionStarted { spec, .. } = &mut events[0] {
        spec.tools[0].approval_timeout = None;
    }
    assert_eq!(
        messages(&fold(&events))[3].content.as_deref(),
        Some("error: denied (expired: nobody approved it in time)")
    );
}

#[test]
fn only_events_using_the_newer_fields_are_written_as_version_2() {
    // An older build refuses these by name rather than misreading them.
    let mut newer = waiting_for_approval().split_off(3);
    newer.push(Event::ApprovalDecided {
        call_id: "c1".into(),
        approved: true,
        by: "ada".into(),
        reason: None,
        args: Some("{}".into()),
    });
    newer.push(Event::ApprovalDecided {
        call_id: "c1".into(),
        approved: false,
        by: EXPIRY_BY.into(),
        reason: Some(EXPIRED.into()),
        args: None,
    });
    assert!(newer.iter().all(|e| e.schema() == 2), "{newer:?}");
    let mut older = story();
    older.push(Event::ApprovalRequested {
        call_id: "c1".into(),
        expires_at_ms: None,
    });
    older.push(Event::ApprovalDecided {
        call_id: "c1".into(),
        approved: true,
        by: "ops".into(),
        reason: None,
        args: None,
    });
    assert!(older.iter().all(|e| e.schema() == 1), "{older:?}");
    for event in newer.iter().chain(&older) {
        assert!(event.schema() <= EVENT_SCHEMA);
        assert_eq!(
            &Event::decode(event.schema(), &event.encode()).unwrap(),
            event
        );
    }
}

#[test]
fn an_approval_timeout_is_a_window_and_needs_requires_approval() {
    let mut s = spec();
    s.tools[0].approval_timeout = Some("24h".into());
    let err = s.validate().unwrap_err();
    assert!(err.contains("requires_approval"), "{err}");
    s.tools[0].requires_approval = true;
    assert!(s.validate().is_ok());
    assert_eq!(
        s.tools[0].approval_timeout(),
        Some(std::time::Duration::from_secs(86_400))
    );
    for bad in ["24", "0h", "1w", ""] {
        s.tools[0].approval_timeout = Some(bad.into());
        let err = s.validate().unwrap_err();
        assert!(err.contains("approval_timeout"), "{bad}: {err}");
    }
}

#[test]
fn a_cancelled_session_runs_nothing_until_a_new_message() {
    let mut events = story()[..3].to_vec();
    events.push(Event::SessionFinished {
        outcome: SessionOutcome::Cancelled { by: "ops".into() },
    });
    let state = fold(&events);
    assert_eq!(state.status(), Status::Cancelled);
    assert_eq!(plan(&state).next, NextStep::Cancelled("ops".into()));
    events.push(Event::UserMessage {
        text: "again".into(),
    });
    assert_eq!(fold(&events).status(), Status::Running);
}

#[test]
fn an_erased_session_runs_nothing_ever_again() {
    let mut events = story()[..3].to_vec();
    events.push(Event::SessionErased {
        reason: "asked".into(),
        by: "dpo".into(),
    });
    events.push(Event::UserMessage {
        text: "again".into(),
    });
    let state = fold(&events);
    assert_eq!(state.status(), Status::Erased);
    assert_eq!(plan(&state).next, NextStep::Erased("dpo".into()));
    assert!(!state.status().resumable(false));
}

/// Taking the personal fields out of every event of a story and putting
/// them back gives the story; what is left outside holds none of them.
#[test]
fn personal_fields_come_out_and_go_back_in_order() {
    let mut all = story();
    all.push(Event::ToolResolved {
        call_id: "c9".into(),
        resolution: Resolution::Skip("{\"secret\":1}".into()),
        by: "me".into(),
    });
    all.push(Event::SessionFinished {
        outcome: SessionOutcome::Failed("server said: secret".into()),
    });
    all.push(Event::ApprovalDecided {
        call_id: "c9".into(),
        approved: true,
        by: "me".into(),
        reason: None,
        args: Some("{\"card\":\"secret\"}".into()),
    });
    for event in all {
        let mut outline = event.clone();
        let taken: Vec<String> = outline
            .personal_fields_mut()
            .into_iter()
            .map(|field| std::mem::replace(field, ERASED.into()))
            .collect();
        let encoded = String::from_utf8_lossy(&outline.encode()).into_owned();
        for value in taken.iter().filter(|v| v.len() > 3) {
            assert!(
                !encoded.contains(value.as_str()),
                "{value} left in {outline:?}"
            );
        }
        for (field, value) in outline.personal_fields_mut().into_iter().zip(taken) {
            *field = value;
        }
        assert_eq!(outline, event);
    }
}

#[test]
fn kv_bytes_per_token_match_the_seed() {
    let mha_7b = KvShape {
        layers: 32,
        kv_heads: 32,
        head_dim: 128,
        dtype_bytes: 2,
    };
    assert_eq!(mha_7b.bytes_per_token(), 524_288);
    let gqa_8b = KvShape {
        kv_heads: 8,
        ..mha_7b
    };
    assert_eq!(gqa_8b.bytes_per_token(), 131_072);
}

#[test]
fn compaction_replaces_the_oldest_entries_in_the_prompt_and_in_memory() {
    let mut events = story();
    events.push(Event::UserMessage {
        text: "and now?".into(),
    });
    let before = messages(&fold(&events));
    events.push(Event::ContextCompacted {
        entries: 2,
        covers: (2, 7),
        summary: "ada was charged".into(),
    });
    let state = fold(&events);
    let after = messages(&state);
    assert_eq!(
        (state.entries.len(), state.dropped),
        (2, 2),
        "compacted entries leave memory (the log keeps them)"
    );
    assert_eq!(after[0], before[0], "the system prompt stays first");
    assert_eq!(
        after[1].content.as_deref(),
        Some("[mneme] Summary of the earlier conversation: ada was charged")
    );
    assert_eq!(
        &after[2..],
        &before[before.len() - 2..],
        "the newest entries follow"
    );
}

#[test]
fn missing_model_reply_is_requested_again() {
    let state = fold(&story()[..2]);
    assert_eq!(plan(&state).next, NextStep::CallModel);
    assert_eq!(state.status(), Status::Running);
}

#[test]
fn events_round_trip_through_their_encoding() {
    for event in story() {
        let bytes = event.encode();
        assert_eq!(Event::decode(EVENT_SCHEMA, &bytes).unwrap(), event);
    }
    let err = Event::decode(EVENT_SCHEMA + 1, &story()[1].encode()).unwrap_err();
    assert!(matches!(err, DecodeError::UnknownSchema { .. }));
}

/// One fixture per event kind: an encoding change must be deliberate.
#[test]
fn golden_bytes_of_every_event_kind() {
    let mut all = story();
    all.push(Event::ToolInDoubt {
        call_id: "c9".into(),
        reason: "r".into(),
    });
    all.push(Event::ToolResolved {
        call_id: "c9".into(),
        resolution: Resolution::Retry,
        by: "me".into(),
    });
    all.push(Event::ToolFinished {
        call_id: "c9".into(),
        outcome: ToolOutcome::Err("boom".into()),
        duration_ms: 9,
        settled_by_check: false,
        rerun: None,
        child: None,
    });
    all.push(Event::SessionForked {
        parent: uuid::Uuid::from_u128(7),
        at_seq: 3,
        rerun: None,
        shared: false,
    });
    all.push(Event::SessionFinished {
        outcome: SessionOutcome::Cancelled { by: "ops".into() },
    });
    all.push(Event::ContextCompacted {
        entries: 2,
        covers: (2, 5),
        summary: "s".into(),
    });
    all.push(Event::ApprovalRequested {
        call_id: "c8".into(),
        expires_at_ms: None,
    });
    all.push(Event::ApprovalDecided {
        call_id: "c8".into(),
        approved: false,
        by: "ops".into(),
        reason: None,
        args: None,
    });
    all.push(Event::SessionPaused {
        reason: "r".into(),
        budget: false,
    });
    all.push(Event::SessionResumed {
        by: "me".into(),
        extend_budget: false,
        after_crash: false,
    });
    all.push(Event::SessionFinished {
        outcome: SessionOutcome::Failed("f".into()),
    });
    all.push(Event::SpecChanged {
        spec: Box::new(spec()),
        by: "me".into(),
    });
    all.push(Event::McpToolsChanged {
        server: "fs".into(),
        changes: vec!["fs__a is new".into()],
    });
    all.push(Event::McpToolsRefreshed {
        server: "fs".into(),
        tools: vec![tool("fs__a", ToolKind::Command, Effect::ReadOnly, None)],
        changes: vec!["fs__a is new".into()],
        by: "me".into(),
    });
    all.push(Event::HeadSigned {
        seq: 3,
        hash: "ab".repeat(32),
        at_ms: 1_764_547_200_000,
        key: "cd".repeat(32),
        signature: "ef".repeat(64),
    });
    all.push(Event::ToolChecked {
        call_id: "c9".into(),
        attempt: 2,
        answer: CheckAnswer::Unknown("answered 503".into()),
        duration_ms: 7,
        answered: None,
    });
    all.push(Event::ToolFinished {
        call_id: "c9".into(),
        outcome: ToolOutcome::Ok("{}".into()),
        duration_ms: 7,
        settled_by_check: true,
        rerun: None,
        child: None,
    });
    all.push(Event::SessionErased {
        reason: "asked".into(),
        by: "dpo".into(),
    });
    // Encodings added later, each after every line before it.
    all.push(Event::ApprovalRequested {
        call_id: "c7".into(),
        expires_at_ms: Some(1_764_633_600_000),
    });
    all.push(Event::ApprovalDecided {
        call_id: "c7".into(),
        approved: true,
        by: "ada".into(),
        reason: None,
        args: Some(r#"{"cents":100}"#.into()),
    });
    all.push(Event::ApprovalDecided {
        call_id: "c7".into(),
        approved: false,
        by: "mneme".into(),
        reason: Some("expired".into()),
        args: None,
    });
    all.push(Event::MidTurnMessage {
        text: "and in euros".into(),
        policy: crate::spec::MidTurn::Interrupt,
    });
    all.push(Event::MidTurnDelivered { arrived: 21 });
    all.push(Event::SessionStarted {
        spec: Box::new(AgentSpec {
            mid_turn_messages: crate::spec::MidTurn::Reject,
            ..spec()
        }),
        tenant: None,
    });
    all.extend(rerun_events());
    all.push(Event::SessionStarted {
        spec: Box::new(parent_spec()),
        tenant: None,
    });
    all.push(Event::SpawnedBy {
        parent: uuid::Uuid::from_u128(7),
        seq: 4,
        call_id: "c1".into(),
    });
    all.push(child_finished("c1", uuid::Uuid::from_u128(8)));
    all.push(Event::SessionResumed {
        by: "mneme resume".into(),
        extend_budget: false,
        after_crash: true,
    });
    all.push(Event::WakeScheduled {
        call_id: "c2".into(),
        at_ms: None,
        event: Some("payment.landed".into()),
        deadline_ms: Some(1_764_000_060_000),
    });
    all.push(Event::Woken {
        call_id: "c2".into(),
        by: crate::WokenBy::Event,
        payload: Some(r#"{"amount":4200}"#.into()),
        late_ms: 0,
    });
    all.push(Event::Woken {
        call_id: "c3".into(),
        by: crate::WokenBy::Timer,
        payload: None,
        late_ms: 1500,
    });
    all.extend(schedule_events());
    // The Responses API (schema 9): its spec, and a reply with its output
    // items and reasoning tokens.
    all.push(Event::SessionStarted {
        spec: Box::new(responses_api::spec()),
        tenant: None,
    });
    all.push(responses_api::reasoned_calls());
    // Tenants and spend caps (schema 10): a tenant's session and its
    // capped spec, the registry of tenants, a ledger.
    all.extend(tenant_events());
    let text: String = all
        .iter()
        .map(|e| {
            let hex = hex::encode(e.encode());
            format!("{} {hex}\n", e.kind())
        })
        .collect();
    let kinds: std::collections::BTreeSet<&str> = all.iter().map(|e| e.kind()).collect();
    assert_eq!(
        kinds,
        Event::KINDS.iter().copied().collect(),
        "a fixture for every kind"
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/events_v1.txt");
    if std::env::var_os("MNEME_BLESS").is_some() {
        std::fs::write(path, &text).unwrap();
    }
    let golden = std::fs::read_to_string(path).expect("fixture missing: run with MNEME_BLESS=1");
    assert_eq!(text, golden);
    // Old payloads keep decoding.
    for line in golden.lines() {
        let hex = line.split_once(' ').unwrap().1;
        let bytes = hex::decode(hex).unwrap();
        Event::decode(EVENT_SCHEMA, &bytes).unwrap();
    }
}

/// Builds a plausible log from random choices: tool events name calls of
/// the latest reply most of the time, and garbage otherwise.
/// A tenant's session (its spec capped per day, its salt sent), the
/// registry's kinds and a ledger's, one of each.
fn tenant_events() -> Vec<Event> {
    let mut capped = spec();
    capped.limits.max_cost_per_day = Some(20.0);
    capped.model.cache_salt = Some(false);
    vec![
        Event::SessionStarted {
            spec: Box::new(capped),
            tenant: Some(crate::Tenancy {
                name: "acme".into(),
                cache_salt: Some("5a17".into()),
                key: Some(uuid::Uuid::from_u128(11)),
            }),
        },
        Event::TenantAdded {
            name: "acme".into(),
            key: uuid::Uuid::from_u128(11),
            cache_salt: "5a17".into(),
            by: "op".into(),
        },
        Event::TenantTokenIssued {
            tenant: "acme".into(),
            digest: crate::digest_hex(b"token"),
            by: "op".into(),
        },
        Event::TenantTokensRevoked {
            tenant: "acme".into(),
            by: "op".into(),
        },
        Event::TenantLimitsSet {
            tenant: "acme".into(),
            limits: crate::tenant::TenantLimits {
                max_cost_per_day: Some(20.0),
                ..crate::tenant::TenantLimits::default()
            },
            by: "op".into(),
        },
        Event::TenantErased {
            tenant: "acme".into(),
            reason: "contract ended".into(),
            by: "op".into(),
        },
        Event::SpendReserved {
            session: uuid::Uuid::from_u128(12),
            cost: 0.25,
            cap: 20.0,
        },
        Event::SpendSettled {
            reserved: 1,
            cost: 0.125,
        },
    ]
}

#[test]
fn tenants_and_caps_are_written_with_schema_11_and_refused_by_older_readers() {
    for event in tenant_events() {
        assert_eq!(event.schema(), 11, "{event:?}");
        assert_eq!(
            &Event::decode(event.schema(), &event.encode()).unwrap(),
            &event
        );
    }
    let plain = Event::SessionStarted {
        spec: Box::new(spec()),
        tenant: None,
    };
    assert_eq!(plain.schema(), 1, "the operator's sessions as before");
}

#[test]
fn a_tenants_salt_is_sent_with_its_requests_unless_the_spec_says_not() {
    let salted = |cache_salt: Option<bool>| {
        let mut spec = spec();
        spec.model.cache_salt = cache_salt;
        let state = SessionState::fold([
            (
                1,
                Event::SessionStarted {
                    spec: Box::new(spec),
                    tenant: Some(crate::Tenancy {
                        name: "acme".into(),
                        cache_salt: Some("5a17".into()),
                        key: None,
                    }),
                },
            ),
            (2, Event::UserMessage { text: "hi".into() }),
        ]);
        let whole = next_request("s", &state).unwrap();
        let mut prefix = crate::RenderedPrefix::default();
        let incremental = crate::next_request_incremental("s", &state, &mut prefix).unwrap();
        assert_eq!(incremental.to_vec(), whole, "both renderings agree");
        String::from_utf8(whole).unwrap()
    };
    assert!(salted(None).contains(r#""cache_salt":"5a17""#));
    assert!(!salted(Some(false)).contains("cache_salt"));
    // A fork keeps its parent's tenant: its copy holds the parent's start.
    let forked = SessionState::fold([
        (
            1,
            Event::SessionForked {
                parent: uuid::Uuid::from_u128(1),
                at_seq: 1,
                rerun: None,
                shared: false,
            },
        ),
        (
            2,
            Event::SessionStarted {
                spec: Box::new(spec()),
                tenant: Some(crate::Tenancy {
                    name: "acme".into(),
                    cache_salt: None,
                    key: None,
                }),
            },
        ),
    ]);
    assert_eq!(forked.tenant.unwrap().name, "acme");
}

/// A schedule's log, one of each kind, and the mark it leaves in a session.
fn schedule_events() -> Vec<Event> {
    use crate::schedule::{CatchUp, Overlap, ScheduleSpec, SkipReason, Target, When};
    let schedule = uuid::Uuid::from_u128(9);
    vec![
        Event::ScheduleCreated {
            schedule: Box::new(ScheduleSpec {
                agent: Some("test-agent".into()),
                spec: Some(Box::new(spec())),
                when: When::Cron {
                    expr: "0 9 * * 1-5".into(),
                    timezone: "+02:00".into(),
                },
                message: "Good morning".into(),
                into: Target::New,
                overlap: Overlap::Queue,
                catch_up: CatchUp::All,
                from_ms: 1_764_000_000_000,
                tenant: None,
            }),
        },
        Event::ScheduleFired {
            tick_ms: 1_764_054_000_000,
            session: crate::schedule::scheduled_session_id(schedule, 1_764_054_000_000),
        },
        Event::ScheduleSkipped {
            from_ms: 1_764_140_400_000,
            to_ms: 1_764_226_800_000,
            ticks: 2,
            reason: SkipReason::Missed,
        },
        Event::ScheduleRemoved { by: "api".into() },
        Event::ScheduledBy {
            schedule,
            tick_ms: 1_764_054_000_000,
        },
    ]
}

/// The Responses API's output items of a reply with `text` and `calls`: a
/// reasoning item first, each call under the id the server gave (before
/// mneme made it unique), and a trailing reasoning item every other time
/// (a reply cut off while reasoning).
fn responses_items(i: usize, text: Option<&str>, calls: &[ToolCall]) -> Vec<String> {
    let mut items = vec![
        serde_json::json!({"type": "reasoning", "id": format!("rs_{i}"), "summary": [],
                                             "encrypted_content": format!("enc{i}==")}),
    ];
    if let Some(text) = text {
        items.push(serde_json::json!({"type": "message", "id": format!("msg_{i}"), "role": "assistant",
            "status": "completed", "phase": "commentary", "content": [{"type": "output_text", "text": text, "annotations": []}]}));
    }
    for (k, c) in calls.iter().enumerate() {
        items.push(serde_json::json!({"type": "function_call", "id": format!("fc_{i}_{k}"), "call_id": format!("server{k}"),
                                      "name": c.sent_name(), "arguments": c.arguments, "status": "completed"}));
    }
    if i.is_multiple_of(2) {
        items.push(
            serde_json::json!({"type": "reasoning", "id": format!("rs_{i}_end"), "summary": []}),
        );
    }
    items.iter().map(|item| item.to_string()).collect()
}

mod responses_api;

fn arbitrary_log() -> impl Strategy<Value = Vec<Event>> {
    let ops = proptest::collection::vec((0u8..12, 0usize..4, any::<bool>()), 0..60);
    (ops, any::<bool>(), any::<bool>()).prop_map(|(ops, keep, responses)| {
        let names = ["charge", "email", "lookup", "nope"];
        let mut spec = spec();
        if keep {
            spec.model.reasoning = crate::spec::Reasoning::Keep;
        }
        if responses {
            spec.model.provider = crate::spec::OPENAI_RESPONSES.into();
        }
        let mut events = vec![Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        }];
        let mut last_calls: Vec<ToolCall> = Vec::new();
        for (i, (op, pick, flag)) in ops.into_iter().enumerate() {
            let id = last_calls
                .get(pick % last_calls.len().max(1))
                .map(|c| c.id.clone())
                .unwrap_or_else(|| format!("ghost{i}"));
            let event = match op {
                0 => Event::UserMessage {
                    text: format!("m{i}"),
                },
                1 => {
                    // Some servers repeat call ids; the runtime makes them unique.
                    last_calls = (0..pick)
                        .map(|k| call(&format!("r{i}c{}", if flag { k } else { k / 2 }), names[k]))
                        .collect();
                    event::normalize_call_ids(&mut last_calls);
                    let mut made = reply(flag.then_some("text"), last_calls.clone());
                    if let Event::ModelReplied(r) = &mut made {
                        r.reasoning = (pick % 2 == 0).then(|| format!("thought {i}"));
                        if pick % 2 == 1 || flag {
                            r.items = responses_items(i, r.content.as_deref(), &last_calls);
                        }
                    }
                    if let (Event::ModelReplied(r), 3) = (&mut made, pick) {
                        // Refused: none of its calls run.
                        r.refused = Some(format!("refused {i}"));
                        last_calls.clear();
                    }
                    made
                }
                2 | 3 => started(&id, "charge", Effect::SideEffect),
                4 | 5 => Event::ToolFinished {
                    call_id: id,
                    outcome: if flag {
                        ToolOutcome::Ok("1".into())
                    } else {
                        ToolOutcome::Err("e".into())
                    },
                    duration_ms: 1,
                    settled_by_check: false,
                    rerun: None,
                    child: None,
                },
                6 => Event::ToolInDoubt {
                    call_id: id,
                    reason: "r".into(),
                },
                7 => Event::ToolResolved {
                    call_id: id,
                    resolution: if flag {
                        Resolution::Retry
                    } else {
                        Resolution::Skip("{}".into())
                    },
                    by: "p".into(),
                },
                8 => Event::ContextCompacted {
                    entries: (i / 3) as u64,
                    covers: (2, i as u64),
                    summary: format!("summary {i}"),
                },
                10 => Event::ApprovalRequested {
                    call_id: id,
                    expires_at_ms: flag.then_some(i as i64),
                },
                11 => Event::ApprovalDecided {
                    call_id: id,
                    approved: pick != 3,
                    by: "p".into(),
                    reason: (pick == 3 && flag).then(|| EXPIRED.into()),
                    args: (pick == 1).then(|| format!(r#"{{"edited":{i}}}"#)),
                },
                _ => {
                    if flag {
                        Event::SessionPaused {
                            reason: "p".into(),
                            budget: pick == 0,
                        }
                    } else {
                        Event::SessionResumed {
                            by: "p".into(),
                            extend_budget: pick == 0,
                            after_crash: false,
                        }
                    }
                }
            };
            events.push(event);
        }
        events
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every prefix folds; every call in the prompt has exactly one result
    /// right after its assistant message; a finished call is never re-run.
    #[test]
    fn every_prefix_folds_and_never_reruns_finished_calls(events in arbitrary_log()) {
        for n in 0..=events.len() {
            let state = fold(&events[..n]);
            let msgs = messages(&state);
            for (i, m) in msgs.iter().enumerate() {
                if let Some(calls) = &m.tool_calls {
                    for (k, c) in calls.iter().enumerate() {
                        let result = msgs.get(i + 1 + k);
                        prop_assert_eq!(result.and_then(|r| r.tool_call_id.as_deref()), Some(c.id.as_str()));
                    }
                }
            }
            let p = plan(&state);
            for (c, cp) in state.open_calls().iter().zip(&p.calls) {
                if matches!(c.phase, CallPhase::Finished(_)) {
                    prop_assert_eq!(&cp.decision, &CallDecision::Reuse);
                }
                // A started call of a tool that may repeat its effect is re-run
                // only on a person's word.
                let unsafe_tool = spec().tool(&c.call.name).is_none_or(|t| !t.safe_to_rerun());
                if unsafe_tool && c.phase == CallPhase::Started {
                    prop_assert!(matches!(cp.decision, CallDecision::InDoubt(_)), "{:?}", cp);
                }
                if cp.decision == CallDecision::Rerun {
                    prop_assert!(!unsafe_tool || c.phase == CallPhase::RetryApproved);
                }
            }
        }
    }

    /// The incremental rebuild, extended event by event (or started at any
    /// point), gives the same bytes as a full render, every time.
    #[test]
    fn incremental_prompt_equals_full_render(events in arbitrary_log(), start in 0usize..60) {
        let mut prefix = RenderedPrefix::default();
        let mut state = SessionState::default();
        for (i, e) in events.iter().enumerate() {
            state.apply(i as u64 + 1, e.clone());
            if i + 1 < start.min(events.len()) {
                continue;
            }
            let full = next_request("s", &state);
            let incremental = next_request_incremental("s", &state, &mut prefix);
            // The digest kept beside the prefix is the body's own.
            prop_assert_eq!(
                incremental.as_ref().map(|r| r.digest.clone()),
                full.as_deref().map(crate::digest_hex)
            );
            prop_assert_eq!(incremental.map(|r| r.to_vec()), full);
            // The prefix digest is a function of the state, not of how the
            // prefix was built up.
            let mut fresh = RenderedPrefix::default();
            next_request_incremental("s", &state, &mut fresh);
            prop_assert_eq!(prefix.digest_hex(), fresh.digest_hex());
        }
    }

    /// A state saved at any position (encoded and decoded, as a snapshot
    /// is) and then given the rest of the events equals the full fold.
    #[test]
    fn snapshot_plus_tail_equals_the_full_fold(events in arbitrary_log()) {
        let whole = fold(&events);
        for cut in 0..=events.len() {
            let saved = fold(&events[..cut]).encode();
            let mut state = SessionState::decode(&saved).expect("a state decodes");
            for (i, e) in events.iter().enumerate().skip(cut) {
                state.apply(i as u64 + 1, e.clone());
            }
            prop_assert_eq!(&state, &whole);
        }
    }

    /// The prompt depends on the events alone: not on their trip through
    /// the stored encoding, nor on whether they were folded in one go or
    /// resumed from a state folded up to any point.
    #[test]
    fn prompt_rebuild_depends_on_the_events_alone(events in arbitrary_log(), cut in 0usize..60) {
        let whole = fold(&events);
        let body = request_body(&spec(), &messages(&whole), None);
        let decoded: Vec<Event> = events.iter().map(|e| Event::decode(EVENT_SCHEMA, &e.encode()).unwrap()).collect();
        let from_bytes = fold(&decoded);
        prop_assert_eq!(&body, &request_body(&spec(), &messages(&from_bytes), None));
        let cut = cut.min(events.len());
        let mut resumed = fold(&events[..cut]).clone();
        for (i, e) in events.iter().enumerate().skip(cut) {
            resumed.apply(i as u64 + 1, e.clone());
        }
        prop_assert_eq!(&body, &request_body(&spec(), &messages(&resumed), None));
        prop_assert_eq!(plan(&whole), plan(&resumed));
    }
}

#[test]
fn anthropic_requests_carry_the_same_conversation_with_cache_breakpoints() {
    let mut events = story();
    if let Event::SessionStarted { spec, .. } = &mut events[0] {
        spec.model.provider = "anthropic".into();
        spec.model.base_url = None;
    }
    events.push(Event::UserMessage {
        text: "And now?".into(),
    });
    let state = fold(&events);
    let body = next_request("s", &state).unwrap();
    assert_eq!(body, next_request("s", &state).unwrap(), "deterministic");
    let mut prefix = RenderedPrefix::default();
    assert_eq!(
        next_request_incremental("s", &state, &mut prefix)
            .unwrap()
            .to_vec(),
        body
    );
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(request["max_tokens"], anthropic::DEFAULT_MAX_TOKENS);
    assert_eq!(request["system"][0]["cache_control"]["type"], "ephemeral");
    let tools = request["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 3);
    assert!(tools[2]["cache_control"].is_object() && tools[0]["cache_control"].is_null());
    assert_eq!(tools[0]["input_schema"]["type"], "object");
    let messages = request["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
    // The calls, their inputs as objects, their results in call order.
    let calls = messages[1]["content"].as_array().unwrap();
    assert_eq!(calls[0]["type"], "tool_use");
    assert_eq!(calls[0]["input"], serde_json::json!({"x": 2}));
    let results: Vec<&str> = messages[2]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["c1", "c22"]);
    // One breakpoint in the conversation: the end of the turn before the
    // newest message.
    let marked: Vec<(usize, usize)> = messages
        .iter()
        .enumerate()
        .flat_map(|(i, m)| {
            m["content"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .filter(|(_, b)| b["cache_control"].is_object())
                .map(move |(j, _)| (i, j))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(marked, [(3, 0)]);
    assert_eq!(messages[4]["content"][0]["text"], "And now?");
}

#[test]
fn cache_reads_and_writes_are_priced_apart_where_the_spec_says() {
    let mut spec = spec();
    spec.model.input_cost_per_mtok = Some(3.0);
    spec.model.output_cost_per_mtok = Some(15.0);
    let mut reply = reply(Some("hi"), vec![]);
    if let Event::ModelReplied(r) = &mut reply {
        r.usage = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 0,
            cached_tokens: 600_000,
            cache_write_tokens: 300_000,
            reasoning_tokens: 0,
        };
    }
    let cost = |spec: AgentSpec| {
        fold(&[
            Event::SessionStarted {
                spec: Box::new(spec),
                tenant: None,
            },
            Event::UserMessage { text: "x".into() },
            reply.clone(),
        ])
        .totals
        .cost
    };
    assert!(
        (cost(spec.clone()) - 3.0).abs() < 1e-9,
        "unpriced: all at the input price"
    );
    spec.model.cached_input_cost_per_mtok = Some(0.3);
    spec.model.cache_write_cost_per_mtok = Some(3.75);
    let expected = 0.1 * 3.0 + 0.6 * 0.3 + 0.3 * 3.75;
    assert!((cost(spec) - expected).abs() < 1e-9);
}

/// A changed MCP list is only reported; a refresh is adopted, and only
/// from there on do prompts offer the new tools.
#[test]
fn a_refresh_changes_the_tools_offered_and_a_report_does_not() {
    let mut events = vec![
        Event::SessionStarted {
            spec: Box::new(spec()),
            tenant: None,
        },
        Event::UserMessage { text: "hi".into() },
    ];
    let before = fold(&events);
    let body = |state: &SessionState| next_request("s", state).unwrap();
    events.push(Event::McpToolsChanged {
        server: "fs".into(),
        changes: vec!["fs__x is new".into()],
    });
    let reported = fold(&events);
    assert_eq!(body(&reported), body(&before), "a report changes no prompt");
    assert_eq!(reported.mcp_changes["fs"], ["fs__x is new"]);
    let mut pinned = tool("fs__x", ToolKind::Mcp, Effect::ReadOnly, None);
    pinned.mcp = Some(crate::mcp::McpOrigin {
        server: "fs".into(),
        tool: "x".into(),
        effect_from: crate::mcp::EffectSource::Policy,
        annotations: None,
        check_tool: None,
    });
    events.push(Event::McpToolsRefreshed {
        server: "fs".into(),
        tools: vec![pinned],
        changes: vec!["fs__x is new".into()],
        by: "me".into(),
    });
    let refreshed = fold(&events);
    assert!(refreshed.mcp_changes.is_empty());
    let text = String::from_utf8(body(&refreshed)).unwrap();
    assert!(text.contains("fs__x") && text.contains("charge"), "{text}");
}

/// A parent agent with one sub-agent tool, `ask_child`, whose child is
/// [`spec`].
fn parent_spec() -> AgentSpec {
    let mut child_tool = tool("ask_child", ToolKind::Agent, Effect::SideEffect, None);
    child_tool.url = None;
    child_tool.command = None;
    child_tool.parameters = spec::agent_parameters();
    child_tool.agent = Some("child.toml".into());
    child_tool.agent_spec = Some(Box::new(spec()));
    let mut parent = spec();
    parent.name = "parent".into();
    parent.tools = vec![child_tool];
    parent
}

/// The finish of call `id` of an agent tool, whose child `child` spent
/// two requests.
fn child_finished(id: &str, child: uuid::Uuid) -> Event {
    Event::ToolFinished {
        call_id: id.into(),
        outcome: ToolOutcome::Ok("the child's answer".into()),
        duration_ms: 5,
        settled_by_check: false,
        rerun: None,
        child: Some(Box::new(ChildRun {
            session: child,
            totals: Totals {
                model_calls: 2,
                prompt_tokens: 300,
                completion_tokens: 30,
                cached_tokens: 0,
                reasoning_tokens: 0,
                cost: 0.5,
            },
        })),
    }
}

fn mid_turn(text: &str, policy: crate::spec::MidTurn) -> Event {
    Event::MidTurnMessage {
        text: text.into(),
        policy,
    }
}

#[test]
fn a_childs_id_derives_from_its_parent_and_the_calls_key_alone() {
    let parent = uuid::Uuid::from_u128(42);
    let a = child_session_id(parent, "mneme-aaaa");
    assert_eq!(a, child_session_id(parent, "mneme-aaaa"), "stable");
    assert_ne!(a, child_session_id(parent, "mneme-aaab"), "per call");
    assert_ne!(
        a,
        child_session_id(uuid::Uuid::from_u128(43), "mneme-aaaa"),
        "per parent"
    );
    assert_eq!(a.get_version_num(), 8);
    assert_eq!(a.get_variant(), uuid::Variant::RFC4122);
    // Pinned: a later build must find the children an earlier one started.
    assert_eq!(
        child_session_id(uuid::Uuid::nil(), "mneme-0"),
        child_session_id(uuid::Uuid::nil(), "mneme-0")
    );
}

#[test]
fn a_childs_spending_rolls_up_once_into_the_tree_and_the_turn() {
    let parent = uuid::Uuid::from_u128(42);
    let key = "mneme-k1";
    let events = vec![
        Event::SessionStarted {
            spec: Box::new(parent_spec()),
            tenant: None,
        },
        Event::UserMessage { text: "go".into() },
        reply(None, vec![call("c1", "ask_child")]),
        Event::ToolStarted {
            call_id: "c1".into(),
            tool: "ask_child".into(),
            args: r#"{"message":"hi"}"#.into(),
            effect: Effect::SideEffect,
            idempotency_key: key.into(),
            attempt: 1,
        },
        // A resume ran it again: the same child, counted once.
        Event::ToolStarted {
            call_id: "c1".into(),
            tool: "ask_child".into(),
            args: r#"{"message":"hi"}"#.into(),
            effect: Effect::SideEffect,
            idempotency_key: key.into(),
            attempt: 2,
        },
        child_finished("c1", child_session_id(parent, key)),
    ];
    let state = fold(&events);
    let own = state.totals;
    assert_eq!(own.model_calls, 1, "the parent's own requests");
    let tree = state.tree_totals();
    assert_eq!(tree.model_calls, 3);
    assert_eq!(tree.prompt_tokens, own.prompt_tokens + 300);
    assert_eq!(tree.completion_tokens, own.completion_tokens + 30);
    assert!((tree.cost - own.cost - 0.5).abs() < 1e-9);
    assert_eq!(
        state.turn.steps, 3,
        "the child's requests count in the turn"
    );
    let children = state.children(parent);
    assert_eq!(children.len(), 1, "{children:?}");
    assert_eq!(children[0].session, child_session_id(parent, key));
    assert_eq!((children[0].seq, children[0].call_id.as_str()), (4, "c1"));
    // The plan reuses the finished call: nothing runs the child again.
    assert_eq!(plan(&state).calls[0].decision, CallDecision::Reuse);
    // A child's fold names its parent.
    let child = fold(&[
        Event::SessionStarted {
            spec: Box::new(spec()),
            tenant: None,
        },
        Event::SpawnedBy {
            parent,
            seq: 4,
            call_id: "c1".into(),
        },
        Event::UserMessage { text: "hi".into() },
    ]);
    let link = child.parent.expect("a parent");
    assert_eq!((link.session, link.seq), (parent, 4));
}

#[test]
fn an_interrupted_agent_call_runs_again_to_continue_its_child() {
    let mut events = vec![
        Event::SessionStarted {
            spec: Box::new(parent_spec()),
            tenant: None,
        },
        Event::UserMessage { text: "go".into() },
        reply(None, vec![call("c1", "ask_child")]),
    ];
    events.push(started("c1", "ask_child", Effect::SideEffect));
    assert_eq!(plan(&fold(&events)).calls[0].decision, CallDecision::Rerun);
}

#[test]
fn sub_agent_events_are_written_as_version_4() {
    let parent = parent_spec();
    assert_eq!(parent.agent_depth(), 1);
    parent.validate().unwrap();
    let newer = [
        Event::SessionStarted {
            spec: Box::new(parent),
            tenant: None,
        },
        Event::SpawnedBy {
            parent: uuid::Uuid::from_u128(1),
            seq: 4,
            call_id: "c1".into(),
        },
        child_finished("c1", uuid::Uuid::from_u128(2)),
    ];
    for event in &newer {
        assert_eq!(event.schema(), 4, "{event:?}");
        assert_eq!(
            &Event::decode(event.schema(), &event.encode()).unwrap(),
            event
        );
    }
    assert!(story().iter().all(|e| e.schema() == 1));
}

#[test]
fn a_childs_budget_is_what_its_parent_has_left() {
    let child = spec();
    let bounded = child.bounded_by(&Remaining {
        steps: 3,
        cost: Some(0.25),
    });
    assert_eq!(bounded.limits.max_steps_per_turn, Some(3));
    assert_eq!(bounded.limits.max_cost_per_turn, Some(0.25));
    let roomy = child.bounded_by(&Remaining {
        steps: 1000,
        cost: None,
    });
    assert_eq!(
        roomy.limits.max_steps_per_turn,
        Some(spec::DEFAULT_MAX_STEPS_PER_TURN)
    );
    assert_eq!(roomy.limits.max_cost_per_turn, None);
}

#[test]
fn an_agent_tool_needs_its_pinned_child_and_nothing_else() {
    let mut parent = parent_spec();
    parent.tools[0].agent_spec = None;
    let err = parent.validate().unwrap_err();
    assert!(err.contains("needs agent"), "{err}");
    let mut parent = parent_spec();
    parent.tools[0].url = Some("http://127.0.0.1:9/x".into());
    assert!(parent.validate().unwrap_err().contains("not a url"));
    let mut lookup = spec();
    lookup.tools[0].agent = Some("child.toml".into());
    assert!(lookup.validate().unwrap_err().contains("only for kind"));
}

#[test]
fn a_queued_message_waits_outside_the_prompt_until_the_turn_is_answered() {
    use crate::spec::MidTurn;
    let mut events = story()[..4].to_vec();
    events.push(mid_turn("and in euros?", MidTurn::Queue)); // seq 5
    let state = fold(&events);
    let before = next_request("s", &fold(&story()[..4])).unwrap();
    assert_eq!(
        next_request("s", &state).unwrap(),
        before,
        "the prompt is unchanged"
    );
    assert_eq!(state.status(), Status::Running);
    assert_eq!(
        plan(&state).next,
        NextStep::RunTools,
        "the running turn goes on"
    );
    let mut answered = story();
    answered.insert(4, mid_turn("and in euros?", MidTurn::Queue));
    let state = fold(&answered);
    assert_eq!(plan(&state).next, NextStep::Deliver);
    assert_eq!(
        state.status(),
        Status::Running,
        "not at rest while it waits"
    );
    answered.push(Event::MidTurnDelivered { arrived: 5 });
    let state = fold(&answered);
    assert!(state.mailbox.is_empty());
    assert_eq!(state.turn_opened.seq, 10, "it opens a turn");
    assert_eq!(
        state.entries.last(),
        Some(&Entry::User("and in euros?".into()))
    );
    assert_eq!(plan(&state).next, NextStep::CallModel);
}

#[test]
fn an_interrupting_message_is_due_once_the_calls_under_way_are_done() {
    use crate::spec::MidTurn;
    let mut events = story()[..4].to_vec(); // c1 started, c22 not yet
    events.push(mid_turn("stop, use euros", MidTurn::Interrupt));
    assert_eq!(plan(&fold(&events)).next, NextStep::RunTools);
    events.extend([
        started("c22", "lookup", Effect::ReadOnly),
        finished("c22", "{}"),
        finished("c1", "{}"),
    ]);
    assert_eq!(plan(&fold(&events)).next, NextStep::Deliver);
}

#[test]
fn a_rejected_message_is_recorded_only_and_a_cancel_drops_waiting_ones() {
    use crate::spec::MidTurn;
    let mut events = story();
    events.push(mid_turn("again", MidTurn::Reject));
    let state = fold(&events);
    assert!(state.mailbox.is_empty());
    assert_eq!(state.status(), Status::Idle);
    let mut events = story()[..4].to_vec();
    events.push(mid_turn("later", MidTurn::Queue));
    events.push(Event::SessionFinished {
        outcome: SessionOutcome::Cancelled { by: "ada".into() },
    });
    let state = fold(&events);
    assert!(state.mailbox.is_empty());
    assert_eq!(state.status(), Status::Cancelled);
}

#[test]
fn mid_turn_messages_are_written_with_schema_3_and_refused_by_older_readers() {
    use crate::spec::MidTurn;
    assert_eq!(mid_turn("x", MidTurn::Queue).schema(), 3);
    assert_eq!(Event::MidTurnDelivered { arrived: 1 }.schema(), 3);
    let plain = Event::SessionStarted {
        spec: Box::new(spec()),
        tenant: None,
    };
    assert_eq!(
        plain.schema(),
        1,
        "a spec that keeps the default needs nothing new"
    );
    let rejecting = Event::SessionStarted {
        spec: Box::new(AgentSpec {
            mid_turn_messages: MidTurn::Reject,
            ..spec()
        }),
        tenant: None,
    };
    assert_eq!(rejecting.schema(), 3);
    let bounded = Event::SessionStarted {
        spec: Box::new(AgentSpec {
            limits: Limits {
                max_waiting_messages: Some(4),
                ..Limits::default()
            },
            ..spec()
        }),
        tenant: None,
    };
    assert_eq!(bounded.schema(), 3);
    let delivered = Event::MidTurnDelivered { arrived: 9 };
    assert_eq!(
        fold(&[delivered]).anomalies,
        vec![(
            1,
            "delivers the message of seq 9, which does not wait".to_string()
        )]
    );
}

/// The events version 3 added: a rerun's link, a call answered from the
/// record, a call not run.
fn rerun_events() -> Vec<Event> {
    let original = uuid::Uuid::from_u128(7);
    vec![
        Event::SessionForked {
            parent: original,
            at_seq: 0,
            rerun: Some(RerunOf {
                through_seq: 12,
                live_tools: false,
            }),
            shared: false,
        },
        Event::ToolFinished {
            call_id: "c1".into(),
            outcome: ToolOutcome::Ok("{\"charged\":1}".into()),
            duration_ms: 0,
            settled_by_check: false,
            rerun: Some(RerunAnswer::Recorded {
                session: original,
                seq: 5,
                call_id: "c1".into(),
            }),
            child: None,
        },
        Event::ToolFinished {
            call_id: "c2".into(),
            outcome: ToolOutcome::Err(rerun::NOT_RUN.into()),
            duration_ms: 0,
            settled_by_check: false,
            rerun: Some(RerunAnswer::NotRun),
            child: None,
        },
    ]
}

#[test]
fn only_a_reruns_events_are_written_as_version_3() {
    for event in rerun_events() {
        assert_eq!(event.schema(), 3, "{event:?}");
        assert_eq!(Event::decode(3, &event.encode()).unwrap(), event);
    }
    assert!(story().iter().all(|e| e.schema() == 1));
}

/// A recorded session: `charge` and `lookup` in one reply, `charge` again
/// with other arguments after, resolved by a person.
fn recorded() -> Vec<(u64, Event)> {
    let charge = |id: &str, args: &str| ToolCall {
        id: id.into(),
        name: "charge".into(),
        arguments: args.into(),
        invented: None,
    };
    let lookup = ToolCall {
        id: "c2".into(),
        name: "lookup".into(),
        arguments: r#"{"who": "ada", "n": 1}"#.into(),
        invented: None,
    };
    let events = vec![
        Event::SessionStarted {
            spec: Box::new(spec()),
            tenant: None,
        },
        Event::UserMessage { text: "one".into() },
        reply(None, vec![charge("c1", r#"{"x":1}"#), lookup]),
        started("c1", "charge", Effect::SideEffect),
        finished("c1", "charged"),
        finished("c2", "Ada"),
        reply(None, vec![charge("c1", r#"{"x":2}"#)]),
        Event::ToolInDoubt {
            call_id: "c1".into(),
            reason: "r".into(),
        },
        Event::ToolResolved {
            call_id: "c1".into(),
            resolution: Resolution::Skip("skipped".into()),
            by: "ops".into(),
        },
        reply(Some("done"), vec![]),
        Event::UserMessage { text: "two".into() },
    ];
    (1..).zip(events).collect()
}

#[test]
fn a_record_holds_each_call_with_its_outcome_and_arguments_compared_canonical() {
    let record = Record::from_events(uuid::Uuid::nil(), recorded(), u64::MAX);
    let found: Vec<(u64, &str, &str)> = (record.calls.iter())
        .map(|c| (c.seq, c.tool.as_str(), c.args.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (5, "charge", r#"{"x":1}"#),
            (6, "lookup", r#"{"n":1,"who":"ada"}"#),
            (9, "charge", r#"{"x":2}"#)
        ]
    );
    assert_eq!(record.calls[2].outcome, ToolOutcome::Ok("skipped".into()));
    let none = std::collections::BTreeSet::new();
    // Keys in another order, other spacing: the same arguments.
    let hit = record
        .find("lookup", r#"{ "who":"ada","n":1 }"#, &none)
        .unwrap();
    assert_eq!(hit.seq, 6);
    assert!(record
        .find("lookup", r#"{"who":"bob","n":1}"#, &none)
        .is_none());
    assert!(record.find("email", r#"{"x":1}"#, &none).is_none());
    // Up to the seq a rerun replays only.
    let early = Record::from_events(uuid::Uuid::nil(), recorded(), 5);
    assert_eq!(early.calls.len(), 1);
    assert_eq!(user_messages(&recorded(), 10), ["one"]);
    assert_eq!(user_messages(&recorded(), 11), ["one", "two"]);
}

#[test]
fn a_rerun_answers_from_the_record_once_and_runs_only_what_is_harmless() {
    let original = uuid::Uuid::from_u128(7);
    let record = Record::from_events(original, recorded(), u64::MAX);
    let mut spec = spec();
    spec.tools
        .push(tool("lookup2", ToolKind::Command, Effect::ReadOnly, None));
    let rerun = RerunState {
        of: original,
        through_seq: 11,
        live_tools: false,
        used: Default::default(),
    };
    let mut used = rerun.used.clone();
    let charge = spec.tool("charge");
    let (outcome, answer) = (record.answer(&rerun, ("charge", r#"{"x":1}"#), charge, &mut used))
        .expect("answered from the record");
    assert_eq!(outcome, ToolOutcome::Ok("charged".into()));
    assert_eq!(
        answer,
        RerunAnswer::Recorded {
            session: original,
            seq: 5,
            call_id: "c1".into()
        }
    );
    // Each record answers one call: the same call again is a new side
    // effect, not run.
    let (outcome, answer) =
        (record.answer(&rerun, ("charge", r#"{"x":1}"#), charge, &mut used)).expect("not run");
    assert_eq!(answer, RerunAnswer::NotRun);
    assert_eq!(outcome, ToolOutcome::Err(rerun::NOT_RUN.into()));
    // A read-only tool with no record runs; so does an unknown tool (the
    // runner tells the model there is none).
    let lookup2 = spec.tool("lookup2");
    assert_eq!(
        record.answer(&rerun, ("lookup2", "{}"), lookup2, &mut used),
        None
    );
    assert_eq!(record.answer(&rerun, ("nope", "{}"), None, &mut used), None);
    // A read-only tool that needs approval is treated as a side effect.
    let mut needs = lookup2.unwrap().clone();
    needs.requires_approval = true;
    let (_, answer) = record
        .answer(&rerun, ("lookup2", "{}"), Some(&needs), &mut used)
        .unwrap();
    assert_eq!(answer, RerunAnswer::NotRun);
    // With live tools, whatever has no record runs.
    let live = RerunState {
        live_tools: true,
        ..rerun.clone()
    };
    assert_eq!(
        record.answer(&live, ("charge", r#"{"x":9}"#), charge, &mut used),
        None
    );
}

#[test]
fn the_fold_knows_a_rerun_and_the_records_it_used() {
    let original = uuid::Uuid::from_u128(7);
    let mut events = vec![
        rerun_events()[0].clone(),
        Event::SessionStarted {
            spec: Box::new(spec()),
            tenant: None,
        },
        Event::UserMessage { text: "one".into() },
        reply(None, vec![call("c1", "charge"), call("c2", "email")]),
    ];
    events.extend(rerun_events()[1..].iter().cloned());
    let state = fold(&events);
    let rerun = state.rerun.clone().expect("a rerun");
    assert_eq!(
        (rerun.of, rerun.through_seq, rerun.live_tools),
        (original, 12, false)
    );
    assert_eq!(rerun.used.iter().copied().collect::<Vec<_>>(), [5]);
    assert_eq!(state.forked_from, Some((original, 0)));
    // Both calls are finished: the plan asks the model next, and the
    // model is told the one not run was not run.
    assert_eq!(plan(&state).next, NextStep::CallModel);
    let told = messages(&state);
    assert_eq!(
        told.last().unwrap().content.as_deref(),
        Some(&*format!("error: {}", rerun::NOT_RUN))
    );
    assert_eq!(fold(&story()).rerun, None);
}

#[test]
fn a_rerun_posts_a_message_that_arrived_mid_turn_where_it_was_delivered() {
    use crate::spec::MidTurn;
    let events: Vec<(u64, Event)> = vec![
        (1, Event::UserMessage { text: "one".into() }),
        (2, mid_turn("two", MidTurn::Queue)),
        (3, mid_turn("never", MidTurn::Reject)),
        (4, reply(Some("done"), vec![])),
        (5, Event::MidTurnDelivered { arrived: 2 }),
    ];
    assert_eq!(user_messages(&events, 4), ["one"]);
    assert_eq!(user_messages(&events, 5), ["one", "two"]);
}

/// Token counts a server reports are taken as they are: counts too large
/// to add up stop at the largest number instead of overflowing the fold
/// (a panic in a debug build, wrong totals and budgets in a release one).
#[test]
fn huge_token_counts_from_a_server_do_not_overflow_the_fold() {
    let huge = |event: Event| match event {
        Event::ModelReplied(mut reply) => {
            reply.usage.prompt_tokens = u64::MAX;
            reply.usage.completion_tokens = u64::MAX;
            Event::ModelReplied(reply)
        }
        other => other,
    };
    let events = vec![
        Event::SessionStarted {
            spec: Box::new(spec()),
            tenant: None,
        },
        Event::UserMessage { text: "a".into() },
        huge(reply(Some("x"), vec![])),
        Event::UserMessage { text: "b".into() },
        huge(reply(Some("y"), vec![])),
    ];
    let state = fold(&events);
    assert_eq!(state.totals.prompt_tokens, u64::MAX);
    assert_eq!(state.totals.model_calls, 2);
    assert!(matches!(plan(&state).next, NextStep::Nothing));
}

/// A session whose `wait` call sleeps until `at_ms`, beside a lookup that
/// finished.
fn sleeping_at(at_ms: i64) -> Vec<Event> {
    let mut spec = spec();
    let mut wait = tool("wait", ToolKind::Sleep, Effect::ReadOnly, None);
    (wait.url, wait.command) = (None, None);
    spec.tools.push(wait);
    vec![
        Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        },
        Event::UserMessage {
            text: "look her up, then wait".into(),
        },
        reply(None, vec![call("c1", "lookup"), call("c2", "wait")]),
        started("c1", "lookup", Effect::ReadOnly),
        finished("c1", "{\"name\":\"Ada\"}"),
        started("c2", "wait", Effect::ReadOnly),
        Event::WakeScheduled {
            call_id: "c2".into(),
            at_ms: Some(at_ms),
            event: None,
            deadline_ms: None,
        },
    ]
}

#[test]
fn a_sleeping_call_holds_the_turn_until_its_wake_is_recorded() {
    let mut events = sleeping_at(5_000);
    let state = fold(&events);
    assert_eq!(state.status(), Status::Sleeping);
    assert_eq!(plan(&state).next, NextStep::Sleep);
    assert!(!state.status().resumable(state.waits_for_a_person()));
    assert_eq!(state.next_wake_ms(), Some(5_000));
    let wake = &state.sleeping_calls()[0].1;
    assert_eq!(wake.due(4_999), None);
    assert_eq!(wake.due(5_000), Some(WokenBy::Timer));
    events.push(Event::Woken {
        call_id: "c2".into(),
        by: WokenBy::Timer,
        payload: None,
        late_ms: 0,
    });
    events.push(finished("c2", "{\"woke\":\"timer\"}"));
    let woken = fold(&events);
    assert_eq!(woken.status(), Status::Running);
    assert_eq!(plan(&woken).next, NextStep::CallModel);
    assert_eq!(woken.next_wake_ms(), None);
}

#[test]
fn a_paused_or_cancelled_sleep_has_no_wake_due() {
    let mut paused = sleeping_at(5_000);
    paused.push(Event::SessionPaused {
        reason: "paused on request".into(),
        budget: false,
    });
    let state = fold(&paused);
    assert_eq!(state.status(), Status::Paused);
    assert_eq!(state.next_deadline_ms(), None);
    let mut cancelled = sleeping_at(5_000);
    cancelled.push(Event::SessionFinished {
        outcome: SessionOutcome::Cancelled { by: "ada".into() },
    });
    let state = fold(&cancelled);
    assert_eq!(plan(&state).next, NextStep::Cancelled("ada".into()));
    assert_eq!(state.next_wake_ms(), None);
}

#[test]
fn sleep_tools_are_written_as_version_6_and_are_read_only_and_run_by_mneme() {
    let events = sleeping_at(5_000);
    assert_eq!(events[0].schema(), 6, "a spec with a sleep tool");
    assert_eq!(events.last().unwrap().schema(), 6);
    assert_eq!(events[1].schema(), 1);
    let mut wait = tool("wait", ToolKind::Sleep, Effect::SideEffect, None);
    (wait.url, wait.command) = (None, None);
    let mut spec = spec();
    spec.tools.push(wait.clone());
    let error = spec.validate().unwrap_err();
    assert!(error.contains("read_only"), "{error}");
    wait.effect = Effect::ReadOnly;
    wait.url = Some("http://127.0.0.1:9/x".into());
    let mut spec = self::spec();
    spec.tools.push(wait);
    assert!(spec.validate().unwrap_err().contains("no url"));
}

/// A reply answering `text` whose request had `prompt` tokens, `cached` of
/// them from the server's cache.
fn answer_with_cache(text: &str, prompt: u64, cached: u64) -> Event {
    let mut made = reply(Some(text), vec![]);
    if let Event::ModelReplied(r) = &mut made {
        r.usage.prompt_tokens = prompt;
        r.usage.cached_tokens = cached;
    }
    made
}

#[test]
fn a_cache_miss_is_explained_by_the_event_that_changed_the_request_or_eviction() {
    let user = |text: &str| Event::UserMessage { text: text.into() };
    let started = Event::SessionStarted {
        spec: Box::new(spec()),
        tenant: None,
    };
    let log = |middle: Vec<Event>, cached: u64| {
        let mut events = vec![started.clone(), user("a"), answer_with_cache("A", 2000, 0)];
        events.extend(middle);
        events.push(user("b"));
        events.push(answer_with_cache("B", 2100, cached));
        crate::cache::cache_misses(
            events
                .into_iter()
                .enumerate()
                .map(|(i, e)| (i as u64 + 1, e)),
        )
    };
    // Cached as expected, or short by less than a block: no miss.
    assert_eq!(log(vec![], 1990), []);
    assert_eq!(log(vec![], 1800), []);
    // Nothing changed the request, which extended the earlier one: evicted.
    let evicted = log(vec![], 0);
    assert_eq!(evicted.len(), 1);
    assert_eq!(
        (
            evicted[0].seq,
            evicted[0].cacheable_tokens,
            evicted[0].cached_tokens
        ),
        (5, 2000, 0)
    );
    assert_eq!(evicted[0].cause, "evicted");
    // A spec change with another system prompt: named, and where it starts.
    let mut other = spec();
    other.system = "You are a refunds assistant.".into();
    let changed = Event::SpecChanged {
        spec: Box::new(other),
        by: "mneme fork --agent".into(),
    };
    let missed = log(vec![changed], 100);
    assert_eq!(missed.len(), 1, "{missed:?}");
    assert_eq!(missed[0].cause, "system prompt changed");
    let first = next_request("", &fold(&[started, user("a")])).unwrap();
    let at = first.windows(7).position(|w| w == b"billing").unwrap();
    assert_eq!(missed[0].first_difference, at as u64, "{missed:?}");
}
