//! The OpenAPI document served at `/openapi.json`.

use serde_json::{json, Value};

fn op(summary: &str, ok: &str) -> Value {
    json!({
        "summary": summary,
        "responses": {
            ok: {"description": "OK", "content": {"application/json": {}}},
            "401": {"description": "Missing or wrong bearer token"},
            "404": {"description": "No such session"},
        }
    })
}

fn with_body(mut operation: Value, schema: Value) -> Value {
    operation["requestBody"] =
        json!({"required": true, "content": {"application/json": {"schema": schema}}});
    operation
}

/// The API, as OpenAPI 3.1.
pub(crate) fn document() -> Value {
    let wait = json!({"wait": {"type": "boolean", "description": "answer when the turn ends"}});
    json!({
        "openapi": "3.1.0",
        "info": {"title": "mneme daemon", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Event-sourced agent sessions. Every endpoint but /health needs `Authorization: Bearer <token>`. Every error answers {\"error\": REASON} as application/json."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/health": {"get": {"summary": "Liveness; no token needed", "security": [], "responses": {"200": {"description": "OK"}}}},
            "/metrics": {"get": op("Prometheus metrics: sessions by status, events appended, flushes, latencies", "200")},
            "/openapi.json": {"get": op("This document", "200")},
            "/sessions": {
                "get": op("List sessions (query: status, agent)", "200"),
                "post": with_body(op("Create a session from {\"agent\": NAME} (a file in the agents directory) or {\"spec\": AgentSpec}; or send the agent file as TOML with Content-Type: application/toml", "201"),
                    json!({"type": "object", "properties": {"agent": {"type": "string"}, "spec": {"type": "object"}}})),
            },
            "/sessions/{id}": {"get": op("A session's status, usage, answer, calls in doubt, and running_on: the owner of its live lease (the daemon running a turn of it), or null", "200")},
            "/sessions/{id}/messages": {"post": with_body(op("Record a user message (durable before the reply: 202 with its seq) and run the turn; with wait, 200 with the turn's end. 409 while another daemon sharing the store runs the session (the error names it)", "202"),
                json!({"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}, "wait": wait["wait"]}}))},
            "/sessions/{id}/resume": {"post": op("Continue pending work (optional body {\"wait\": true, \"extend\": true}; extend starts a spent budget of the turn again, recorded)", "202")},
            "/sessions/{id}/pause": {"post": op("Pause the session at its next step, wherever it runs (on another daemon sharing the store: within a second; the answer names it in running_on)", "200")},
            "/sessions/{id}/cancel": {"post": with_body(op("Cancel the session (a running turn stops at its next step); a new message reopens it", "200"),
                json!({"type": "object", "required": ["by"], "properties": {"by": {"type": "string"}}}))},
            "/sessions/{id}/fork": {"post": with_body(op("Fork: a new session holding this one's first `at` events; its first event names the parent and seq", "201"),
                json!({"type": "object", "required": ["at"], "properties": {"at": {"type": "integer"}}}))},
            "/sessions/{id}/calls/{call}/resolve": {"post": with_body(op("Decide on a call in doubt: exactly one of retry, skip (the result), fail (a message); by names who decides", "202"),
                json!({"type": "object", "required": ["by"], "properties": {"retry": {"type": "boolean"}, "skip": {}, "fail": {"type": "string"}, "by": {"type": "string"}, "wait": wait["wait"]}}))},
            "/sessions/{id}/calls/{call}/approve": {"post": with_body(op("Approve or deny a call that waits for approval; by names who decides", "202"),
                json!({"type": "object", "required": ["approved", "by"], "properties": {"approved": {"type": "boolean"}, "by": {"type": "string"}, "wait": wait["wait"]}}))},
            "/sessions/{id}/events": {"get": op("The audit trail (query: kind=K1,K2, after=SEQ); with follow=true a Server-Sent Events stream: history, then each event once durable", "200")},
            "/sessions/{id}/deltas": {"get": op("Server-Sent Events: the text of the session's streamed replies as it arrives (`delta` events of {\"text\": ...}; `lagged` names pieces a slow reader missed); never recorded as such, the whole reply is", "200")},
            "/sessions/{id}/verify": {"get": op("Check the session's hash chain", "200")},
            "/sessions/{id}/replay": {"get": op("Dry run: the rebuilt prompt and the resume plan", "200")},
            "/sessions/{id}/request": {"get": op("The exact bytes of the next model request", "200")},
        }
    })
}
