//! Requests in the Responses API's shapes: stateless (`store: false`,
//! encrypted reasoning included), every output item sent back as received
//! and in order, each call followed by its output.

use super::*;
use crate::prompt::{COMPACT_INSTRUCTION, REFUSED_PREFIX};
use crate::spec::OPENAI_RESPONSES;
use serde_json::{json, Value};

const SESSION: &str = "0190aaaa-0000-7000-8000-000000000001";

/// The billing agent on OpenAI's Responses API.
pub(super) fn spec() -> AgentSpec {
    let mut spec = super::spec();
    spec.model.provider = OPENAI_RESPONSES.into();
    spec.model.base_url = None;
    spec
}

fn reasoning_item() -> Value {
    json!({"type": "reasoning", "id": "rs_0a1b", "encrypted_content": "gAAAAABo+enc/rypted==",
           "summary": [{"type": "summary_text", "text": "Charge first, then look her up."}]})
}

fn call_item(call_id: &str, call: &ToolCall) -> Value {
    json!({"type": "function_call", "id": format!("fc_{}", call.id), "call_id": call_id,
           "name": call.name, "arguments": call.arguments, "status": "completed"})
}

/// A reply that reasoned, then called `charge` (c1) and `lookup` (c22),
/// its output items as the server sent them.
pub(super) fn reasoned_calls() -> Event {
    let calls = vec![call("c1", "charge"), call("c22", "lookup")];
    let items = [
        reasoning_item(),
        call_item("c1", &calls[0]),
        call_item("c22", &calls[1]),
    ];
    let Event::ModelReplied(mut reply) = reply(None, calls) else {
        unreachable!()
    };
    reply.items = items.iter().map(Value::to_string).collect();
    reply.usage.reasoning_tokens = 40;
    Event::ModelReplied(reply)
}

/// [`super::story`] on the Responses API, up to both results.
fn story() -> Vec<Event> {
    let mut events = super::story()[..7].to_vec();
    events[0] = Event::SessionStarted {
        spec: Box::new(spec()),
        tenant: None,
    };
    events[2] = reasoned_calls();
    events
}

fn body_of(state: &SessionState) -> Value {
    serde_json::from_slice(&next_request(SESSION, state).unwrap()).unwrap()
}

/// The incremental render, from scratch and extended from `earlier`, gives
/// the full render's bytes.
fn assert_incremental_is_whole(earlier: &SessionState, state: &SessionState) {
    let whole = next_request(SESSION, state).unwrap();
    let mut prefix = RenderedPrefix::default();
    next_request_incremental(SESSION, earlier, &mut prefix);
    let extended = next_request_incremental(SESSION, state, &mut prefix).unwrap();
    assert_eq!(extended.to_vec(), whole);
    assert_eq!(extended.digest, digest_hex(&whole));
    let mut fresh = RenderedPrefix::default();
    let built = next_request_incremental(SESSION, state, &mut fresh).unwrap();
    assert_eq!(built.to_vec(), whole);
}

#[test]
fn responses_request_matches_golden_file() {
    let body = next_request(SESSION, &fold(&story())).unwrap();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/responses_request_after_tools.json"
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
fn every_output_item_goes_back_unchanged_in_order_and_each_call_is_answered() {
    let events = story();
    let state = fold(&events);
    let request = body_of(&state);
    assert_eq!(request["store"], false, "mneme is the state");
    assert!(request.get("previous_response_id").is_none());
    assert_eq!(request["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(request["prompt_cache_key"], SESSION);
    assert_eq!(request["instructions"], "You are a billing assistant.");
    assert!(request.get("messages").is_none() && request.get("stream").is_none());
    let tools = request["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 3);
    assert_eq!(
        (&tools[0]["type"], &tools[0]["name"], &tools[0]["strict"]),
        (&json!("function"), &json!("charge"), &json!(false))
    );
    assert_eq!(tools[0]["parameters"]["type"], "object");
    let Event::ModelReplied(replied) = &events[2] else {
        unreachable!()
    };
    let input = request["input"].as_array().unwrap();
    assert_eq!(
        input[0],
        json!({"role": "user", "content": "Charge ada 500 and email her."})
    );
    // The reasoning item, id and encrypted content and all, then the
    // calls, exactly as received.
    let sent: Vec<String> = input[1..4].iter().map(Value::to_string).collect();
    assert_eq!(sent, replied.items);
    assert_eq!(input[1], reasoning_item());
    // Each output in call order, though they finished the other way.
    assert_eq!(
        input[4..],
        [
            json!({"type": "function_call_output", "call_id": "c1", "output": "{\"status\":200}"}),
            json!({"type": "function_call_output", "call_id": "c22", "output": "{\"name\":\"Ada\"}"}),
        ]
    );
    assert_eq!(input.len(), 6);
    // The same bytes from the stored encoding and built incrementally.
    let decoded: Vec<Event> = (events.iter())
        .map(|e| Event::decode(e.schema(), &e.encode()).unwrap())
        .collect();
    assert_eq!(
        next_request(SESSION, &fold(&decoded)),
        next_request(SESSION, &state)
    );
    assert_incremental_is_whole(&fold(&events[..3]), &state);
    // A later turn keeps it all at the head of the input.
    let mut later = events.clone();
    later.push(reply(Some("Done."), vec![]));
    later.push(Event::UserMessage {
        text: "Thanks".into(),
    });
    let again = body_of(&fold(&later));
    assert_eq!(again["input"].as_array().unwrap()[..6], input[..]);
    assert_incremental_is_whole(&state, &fold(&later));
}

#[test]
fn the_responses_api_is_schema_9_and_its_items_are_personal() {
    let mut replied = reasoned_calls();
    assert_eq!(replied.schema(), 9);
    assert_eq!(story()[0].schema(), 9, "a spec on the Responses API");
    let mut plain = reasoned_calls();
    if let Event::ModelReplied(r) = &mut plain {
        r.items.clear();
    }
    assert_eq!(plain.schema(), 1, "reasoning tokens alone need no version");
    let encrypted = "gAAAAABo+enc/rypted==";
    let personal = replied.personal_fields_mut();
    assert!(personal.iter().any(|f| f.contains(encrypted)));
    assert!(personal.iter().any(|f| f.contains("Charge first")));
    // The fold counts the reasoning tokens, and a snapshot keeps them.
    let state = fold(&story());
    assert_eq!(state.totals.reasoning_tokens, 40);
    assert_eq!(
        SessionState::decode(&state.encode()).unwrap().totals,
        state.totals
    );
}

#[test]
fn a_call_id_mneme_replaced_is_the_one_its_item_and_output_carry() {
    let mut calls = vec![call("c1", "charge")];
    calls[0].id = "bad id/..".into();
    let item = call_item("bad id/..", &calls[0]);
    event::normalize_call_ids(&mut calls);
    assert_eq!(calls[0].id, "call_0");
    let Event::ModelReplied(mut made) = reply(None, calls) else {
        unreachable!()
    };
    made.items = vec![reasoning_item().to_string(), item.to_string()];
    let mut events = story()[..2].to_vec();
    events.push(Event::ModelReplied(made));
    events.push(started("call_0", "charge", Effect::SideEffect));
    events.push(finished("call_0", "ok"));
    let request = body_of(&fold(&events));
    let input = request["input"].as_array().unwrap();
    let mut expected = item.clone();
    expected["call_id"] = json!("call_0");
    assert_eq!(input[2], expected, "only the call id differs");
    assert_eq!(input[3]["call_id"], "call_0");
    assert_eq!(input[3]["output"], "ok");
}

#[test]
fn a_refused_or_unfinished_reply_sends_back_only_what_the_api_takes() {
    let commentary = json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
        "phase": "commentary", "content": [{"type": "output_text", "text": "Charging.", "annotations": []}]});
    let calls = vec![call("c1", "charge")];
    let items = [
        reasoning_item(),
        commentary.clone(),
        call_item("c1", &calls[0]),
    ];
    let Event::ModelReplied(mut refused) = reply(Some("Charging."), calls) else {
        unreachable!()
    };
    refused.items = items.iter().map(Value::to_string).collect();
    refused.refused = Some("too many calls".into());
    let mut events = story()[..2].to_vec();
    events.push(Event::ModelReplied(refused));
    let state = fold(&events);
    let request = body_of(&state);
    // Its calls never ran: neither they nor the reasoning that led to them
    // go back (the API refuses a reasoning item without what followed it,
    // and a call without its output), the commentary does, phase and all.
    assert_eq!(
        request["input"].as_array().unwrap()[1..],
        [
            commentary,
            json!({"role": "user", "content": format!("{REFUSED_PREFIX}too many calls")}),
        ]
    );
    assert_incremental_is_whole(&fold(&events[..2]), &state);
    // A reply cut off while it reasoned leaves nothing to send back.
    let Event::ModelReplied(mut thinking) = reply(None, vec![]) else {
        unreachable!()
    };
    thinking.items = vec![reasoning_item().to_string()];
    thinking.finish_reason = event::CUT_OFF.into();
    let mut events = story()[..2].to_vec();
    events.push(Event::ModelReplied(thinking));
    events.push(Event::UserMessage {
        text: "Go on".into(),
    });
    let input = request_input(&events);
    assert_eq!(input.len(), 2, "{input:?}");
    assert_eq!(input[1]["content"], "Go on");
}

fn request_input(events: &[Event]) -> Vec<Value> {
    body_of(&fold(events))["input"].as_array().unwrap().clone()
}

#[test]
fn a_reply_from_another_api_goes_back_as_its_text_and_function_calls() {
    // A session forked onto the Responses API from chat completions: its
    // replies have no items.
    let mut events = super::story();
    events[0] = Event::SessionStarted {
        spec: Box::new(spec()),
        tenant: None,
    };
    let input = request_input(&events[..7]);
    assert_eq!(
        input[1],
        json!({"type": "function_call", "call_id": "c1", "name": "charge", "arguments": "{\"x\":2}"})
    );
    assert_eq!(input[2]["call_id"], "c22");
    assert_eq!(input[3]["type"], "function_call_output");
    events.push(Event::UserMessage {
        text: "Thanks".into(),
    });
    let input = request_input(&events);
    assert_eq!(
        input[5],
        json!({"role": "assistant", "content": "Done: charged and looked up."})
    );
}

#[test]
fn a_reply_cut_off_in_its_calls_gets_twice_the_output_tokens_once() {
    let mut spec = spec();
    spec.model.max_tokens = Some(100);
    spec.model.stream = Some(true);
    let mut events = vec![
        Event::SessionStarted {
            spec: Box::new(spec),
            tenant: None,
        },
        Event::UserMessage { text: "go".into() },
    ];
    assert_eq!(body_of(&fold(&events))["max_output_tokens"], 100);
    let Event::ModelReplied(mut cut) = reply(None, vec![call("c1", "charge")]) else {
        unreachable!()
    };
    cut.finish_reason = event::CUT_OFF.into();
    cut.refused = Some("cut off".into());
    events.push(Event::ModelReplied(cut));
    let state = fold(&events);
    let request = body_of(&state);
    assert_eq!(request["max_output_tokens"], 200);
    assert_eq!(request["stream"], true);
    assert_incremental_is_whole(&fold(&events[..2]), &state);
}

#[test]
fn a_compaction_request_is_stateless_too() {
    let state = fold(&story());
    let body = compaction_request(&state, 2).unwrap();
    let request: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(request["instructions"], COMPACT_INSTRUCTION);
    assert_eq!(request["store"], false);
    assert!(request.get("tools").is_none() && request.get("prompt_cache_key").is_none());
    let text = request["input"][0]["content"].as_str().unwrap();
    assert!(text.contains("Charge ada 500"), "{text}");
}

#[test]
fn the_responses_provider_is_refused_what_its_api_has_no_place_for() {
    assert!(spec().validate().is_ok());
    assert_eq!(spec().model.base_url(), crate::spec::OPENAI_BASE_URL);
    let refused = |change: fn(&mut AgentSpec), says: &str| {
        let mut s = spec();
        change(&mut s);
        let err = s.validate().expect_err(says);
        assert!(err.contains("[model]") && err.contains(says), "{err}");
    };
    refused(
        |s| s.model.model = String::new(),
        "provider = \"openai-responses\" needs model",
    );
    refused(
        |s| s.model.max_completion_tokens = Some(10),
        "give max_tokens (sent as max_output_tokens)",
    );
    refused(
        |s| s.model.reasoning = crate::spec::Reasoning::Keep,
        "every reasoning item is sent back",
    );
    refused(
        |s| s.model.base_url = Some("ftp://x/v1".into()),
        "only http and https",
    );
    refused(
        |s| s.model.provider = "openai-response".into(),
        "\"openai-responses\"",
    );
}
