//! MCP tools in a session's life: pinned when it starts, checked against
//! their servers when a turn starts, adopted again only on request.

use crate::error::RuntimeError;
use crate::session::Session;
use replay::{AgentSpec, Event, ToolKind};

/// `spec` with the tools of each of its MCP servers pinned from the
/// servers' lists as they are now (replacing any it held). Each server is
/// started, asked and stopped; one that cannot start, or that does not list
/// a tool the spec names, is refused with the reason.
pub(crate) async fn pin(mut spec: AgentSpec, origin: &str) -> Result<AgentSpec, RuntimeError> {
    spec.tools.retain(|t| t.kind != ToolKind::Mcp);
    for server in spec.mcp.clone() {
        server
            .validate()
            .map_err(|reason| spec_error(origin, reason))?;
        let tools = tools::mcp::pin_tools(&server)
            .await
            .map_err(|e| spec_error(origin, e.to_string()))?;
        spec.tools.extend(tools);
    }
    Ok(spec)
}

fn spec_error(origin: &str, reason: String) -> RuntimeError {
    RuntimeError::Spec {
        origin: origin.to_string(),
        reason,
    }
}

/// Records, for each server whose list differs from the session's pinned
/// one, what differs (once: not again while it stays the same). The session
/// goes on with what it pinned.
pub(crate) async fn record_changes(
    session: &mut Session,
    report: Vec<(String, Vec<String>)>,
) -> Result<(), RuntimeError> {
    let events: Vec<Event> = report
        .into_iter()
        .filter(|(server, changes)| {
            let known = session.state().mcp_changes.get(server);
            known.map_or(&[][..], Vec::as_slice) != changes.as_slice()
        })
        .map(|(server, changes)| Event::McpToolsChanged { server, changes })
        .collect();
    if !events.is_empty() {
        session.append(events, None).await?;
    }
    Ok(())
}

/// Adopts each MCP server's current list for `session` (`run
/// --refresh-tools`): one event per server whose list changed, naming the
/// changes and `by`. Returns the changes adopted, by server.
pub(crate) async fn refresh(
    session: &mut Session,
    by: &str,
) -> Result<Vec<(String, Vec<String>)>, RuntimeError> {
    let spec = session.spec()?.clone();
    let origin = format!("session {}", session.id());
    let mut adopted = Vec::new();
    let mut events = Vec::new();
    let mut refreshed = spec.clone();
    for server in &spec.mcp {
        let tools = tools::mcp::offered_tools(server)
            .await
            .map_err(|e| spec_error(&origin, e.to_string()))?;
        let changes = replay::mcp::tool_list_changes(&spec.mcp_tools(&server.name), &tools);
        if changes.is_empty() {
            continue;
        }
        refreshed = refreshed.with_mcp_tools(&server.name, &tools);
        adopted.push((server.name.clone(), changes.clone()));
        events.push(Event::McpToolsRefreshed {
            server: server.name.clone(),
            tools,
            changes,
            by: by.to_string(),
        });
    }
    // Adopted only whole, and only as a spec a session could start with.
    refreshed.validate().map_err(|reason| {
        spec_error(
            &origin,
            format!(
                "the servers' lists now give a spec that is refused ({reason}): nothing adopted"
            ),
        )
    })?;
    if !events.is_empty() {
        session.append(events, None).await?;
    }
    Ok(adopted)
}
