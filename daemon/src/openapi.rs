//! The OpenAPI document served at `/openapi.json`, generated from the
//! handlers' annotations and the types of [`runtime::api`] (the router is
//! built from the same annotations), plus what every operation shares: the
//! bearer token, and errors answered as `{"error": REASON}` ([`ApiError`]).

use runtime::api::ApiError;
use serde_json::{json, Map, Value};
use std::sync::OnceLock;
use utoipa::PartialSchema;

const DESCRIPTION: &str = "Event-sourced agent sessions. Every endpoint but \
/health needs `Authorization: Bearer <token>`. Every error answers \
{\"error\": REASON} as application/json (the ApiError schema), whatever its status.";

/// The API, as OpenAPI 3.1.
pub(crate) fn document() -> Value {
    let mut document =
        serde_json::to_value(super::api::operations()).expect("the document serializes");
    document["info"] = json!({
        "title": "mneme daemon",
        "version": env!("CARGO_PKG_VERSION"),
        "description": DESCRIPTION,
        "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
    });
    document["components"]["securitySchemes"] =
        json!({"bearer": {"type": "http", "scheme": "bearer"}});
    document["security"] = json!([{"bearer": []}]);
    let schema = serde_json::to_value(ApiError::schema()).expect("the schema serializes");
    document["components"]["schemas"]["ApiError"] = schema;
    let paths = document["paths"].as_object_mut().expect("paths");
    for (path, item) in paths.iter_mut() {
        for operation in item.as_object_mut().expect("a path item").values_mut() {
            add_errors(path, operation.as_object_mut().expect("an operation"));
        }
    }
    document
}

/// [`document`], made once.
pub(crate) fn document_json() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(document)
}

/// The errors an operation shares with others: 400 for a request that does
/// not parse, 401 without the token, 404 for no such session, 413 for a
/// body over the limit, 500; each answers an [`ApiError`]. Operations list
/// their own (409, 503) in their annotations.
fn add_errors(path: &str, operation: &mut Map<String, Value>) {
    // Tags would only split a generated client into modules by Rust module.
    operation.remove("tags");
    let open = operation.get("security") == Some(&json!([{}]));
    let has_body = operation.contains_key("requestBody");
    let has_input = has_body || operation.contains_key("parameters");
    let mut errors = Vec::new();
    if has_input {
        errors.push((
            "400",
            "The request does not parse (path, query or body), or asks for something impossible",
        ));
    }
    if !open {
        errors.push(("401", "Missing or wrong bearer token"));
    }
    if path.contains("{id}") {
        errors.push(("404", "No such session"));
    }
    if has_body {
        errors.push(("413", "The body is larger than the daemon's limit"));
        errors.push((
            "415",
            "The body's content type is not one the operation takes",
        ));
        errors.push(("422", "The body is JSON of the wrong shape"));
    }
    errors.push(("500", "The daemon failed"));
    let responses = operation
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("responses");
    for (status, description) in errors {
        responses.entry(status).or_insert_with(|| {
            json!({
                "description": description,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ApiError"}}},
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (method, path) of every operation in the document.
    fn operations(document: &Value) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                found.push((method.clone(), path.clone()));
            }
        }
        found.sort();
        found
    }

    #[test]
    fn every_route_is_added_from_its_documented_handler() {
        // The router is built from `routes!(handler)` only, each handler
        // annotated with its route: a route added with axum's own
        // `.route(...)` (or nested, or a fallback) would be served without
        // being documented.
        let source = [
            include_str!("api/mod.rs"),
            include_str!("api/stream.rs"),
            include_str!("api/reads.rs"),
            include_str!("api/wake.rs"),
            include_str!("api/deltas.rs"),
            include_str!("api/schedules.rs"),
            include_str!("api/tenants.rs"),
        ]
        .concat();
        for undocumented in [
            ".route(",
            ".route_service(",
            ".nest(",
            ".nest_service(",
            ".fallback(",
        ] {
            assert!(
                !source.contains(undocumented),
                "daemon/src/api/ adds a route with {undocumented}...): add it with routes!(handler) and #[utoipa::path] instead"
            );
        }
        let handlers: usize = source
            .match_indices(".routes(routes!(")
            .map(|(at, _)| {
                let rest = &source[at..];
                let list = &rest[..rest.find("))").unwrap()];
                list.matches(',').count() + 1
            })
            .sum();
        let annotated = source.matches("#[utoipa::path(").count();
        let document = document();
        assert_eq!(handlers, annotated, "every annotated handler is routed");
        assert_eq!(operations(&document).len(), annotated, "{document:#}");
    }

    #[test]
    fn the_document_names_every_route_and_the_shared_errors() {
        let document = document();
        assert_eq!(document["openapi"], "3.1.0");
        let expected: Vec<(String, String)> = [
            ("get", "/"),
            ("get", "/health"),
            ("get", "/metrics"),
            ("get", "/openapi.json"),
            ("get", "/sessions"),
            ("post", "/sessions"),
            ("get", "/sessions/{id}"),
            ("delete", "/sessions/{id}"),
            ("post", "/sessions/{id}/messages"),
            ("post", "/sessions/{id}/resume"),
            ("post", "/sessions/{id}/wake"),
            ("post", "/sessions/{id}/pause"),
            ("post", "/sessions/{id}/cancel"),
            ("post", "/sessions/{id}/fork"),
            ("post", "/sessions/{id}/rerun"),
            ("post", "/sessions/{id}/calls/{call}/resolve"),
            ("post", "/sessions/{id}/calls/{call}/approve"),
            ("get", "/sessions/{id}/events"),
            ("get", "/sessions/{id}/deltas"),
            ("get", "/sessions/{id}/verify"),
            ("get", "/sessions/{id}/replay"),
            ("get", "/sessions/{id}/cache"),
            ("get", "/sessions/{id}/request"),
            ("get", "/sessions/{id}/blobs/{digest}"),
            ("get", "/sessions/{id}/diff/{other}"),
            ("post", "/ui/codes"),
            ("get", "/schedules"),
            ("post", "/schedules"),
            ("delete", "/schedules/{id}"),
            ("get", "/tenants"),
            ("post", "/tenants"),
            ("patch", "/tenants/{name}"),
            ("delete", "/tenants/{name}"),
            ("post", "/tenants/{name}/tokens"),
            ("delete", "/tenants/{name}/tokens"),
            ("get", "/spend"),
        ]
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
        assert_eq!(operations(&document), expected);
        // Generated clients name an operation by its id: no two alike.
        let mut ids = std::collections::BTreeSet::new();
        for (method, path) in operations(&document) {
            let id = document["paths"][&path][&method]["operationId"]
                .as_str()
                .unwrap();
            assert!(ids.insert(id.to_string()), "operationId {id} twice");
        }
        for (method, path) in operations(&document) {
            let operation = &document["paths"][&path][&method];
            let responses = operation["responses"].as_object().unwrap();
            assert!(responses.contains_key("500"), "{method} {path}");
            assert_eq!(
                responses.contains_key("401"),
                !["/", "/health"].contains(&path.as_str()),
                "{method} {path}"
            );
            for (status, response) in responses {
                if status.starts_with(['4', '5']) {
                    assert_eq!(
                        response["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/ApiError",
                        "{method} {path} {status}"
                    );
                }
            }
            // Every path parameter is declared.
            for name in ["id", "call"] {
                if path.contains(&format!("{{{name}}}")) {
                    let declared = operation["parameters"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["name"] == name && p["in"] == "path");
                    assert!(declared, "{method} {path}: {name}");
                }
            }
        }
        let schemas = &document["components"]["schemas"];
        for decision in ["Resolve", "Approve"] {
            assert_eq!(
                schemas[decision]["properties"]["continue"]["type"], "boolean",
                "{decision}"
            );
        }
        let statuses = &schemas["SessionStatus"]["enum"];
        assert!(
            statuses.as_array().unwrap().contains(&json!("idle")),
            "{statuses}"
        );
        let events = &document["paths"]["/sessions/{id}/events"]["get"]["responses"]["200"];
        assert!(
            events["content"]["text/event-stream"].is_object(),
            "{events}"
        );
        assert!(
            events["content"]["application/json"].is_object(),
            "{events}"
        );
        let deltas = &document["paths"]["/sessions/{id}/deltas"]["get"]["responses"]["200"];
        assert!(
            deltas["content"]["text/event-stream"].is_object(),
            "{deltas}"
        );
    }
}
