//! What a person is about to approve, said before `mneme approve` records
//! it: the call's tool, what the model was told of the tool, and the
//! arguments the tool will get, laid out afresh.

use crate::sessions::Sessions;
use replay::{AgentSpec, Event, ToolCall};
use uuid::Uuid;

/// Says what deciding on `call` of session `id` approves (or denies): its
/// tool, the tool's pinned description, and the arguments whole (`edited`,
/// if the person gives their own, with the model's beside them). Says
/// nothing if the session holds no such call (the decision then fails,
/// naming it).
pub(crate) async fn say_what_is_decided(
    sessions: &dyn Sessions,
    (id, call_id): (Uuid, &str),
    edited: Option<&str>,
    deny: bool,
) {
    let Ok(rows) = sessions.events(id).await else {
        return;
    };
    let Some((call, spec)) = latest_call(&rows, call_id) else {
        return;
    };
    let verb = if deny { "denying" } else { "approving" };
    say!("mneme: {verb} {call_id} of session {id}: {}", call.name);
    let tool = spec.as_ref().and_then(|s| s.tool(&call.name));
    say_description(&call.name, tool.map_or("", |t| &t.description));
    match (edited, deny) {
        (Some(edited), false) => {
            say!("    with your arguments:");
            say_arguments(edited);
            say!("    in place of the model's:");
        }
        _ => say!("    with these arguments:"),
    }
    say_arguments(&call.arguments);
}

/// The last call `call_id` the model made in `rows` (the log's events), and
/// the agent spec the session had then.
fn latest_call(rows: &[serde_json::Value], call_id: &str) -> Option<(ToolCall, Option<AgentSpec>)> {
    let (mut found, mut spec) = (None, None);
    for row in rows {
        match serde_json::from_value(row["event"].clone()) {
            Ok(Event::SessionStarted { spec: s, .. } | Event::SpecChanged { spec: s, .. }) => {
                spec = Some(*s)
            }
            Ok(Event::ModelReplied(reply)) => {
                if let Some(call) = reply.tool_calls.into_iter().find(|c| c.id == call_id) {
                    found = Some((call, spec.clone()));
                }
            }
            _ => {}
        }
    }
    found
}

/// Says what the model was told of `tool` (its pinned `description`), if
/// anything: an MCP server's own words reach the model, and a person
/// should read them too.
pub(crate) fn say_description(tool: &str, description: &str) {
    if !description.is_empty() {
        say!("    what the model was told of {tool}: {description:?}");
    }
}

/// Says a call's `arguments` whole, laid out afresh one member a line (what
/// the tool is given, not what padding or a long line would show).
pub(crate) fn say_arguments(arguments: &str) {
    for line in runtime::describe::laid_out(arguments, true).lines() {
        say!("      {line}");
    }
}
