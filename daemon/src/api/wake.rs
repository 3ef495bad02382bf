//! Waking a sleeping session by an event (a webhook, a person).

use super::*;
use runtime::api::{Wake, Woke};

/// Delivers an event to a session that sleeps until it: the sleeping call
/// wakes with the event's payload in its result (recorded), and the turn
/// goes on.
#[utoipa::path(post, path = "/sessions/{id}/wake", params(SessionPath), request_body = Wake,
    responses(
        (status = 202, description = "The call woke; the turn goes on", body = Woke),
        (status = 200, description = "With `wait`: the turn that went on ended", body = TurnOutcome),
        (status = 400, description = "Not an event name", body = wire::ApiError),
        (status = 409, description = "No call of the session sleeps until this event, its payload is larger than the sleeping tool keeps, or another daemon runs it", body = wire::ApiError),
        (status = 503, description = "The daemon is shutting down, or near its open-file limit", body = wire::ApiError)))]
pub(super) async fn wake(
    State(daemon): State<Shared>,
    Path(id): Path<Uuid>,
    Json(body): Json<Wake>,
) -> Result<Response, ApiError> {
    let admitted = admit_turn(&daemon)?;
    daemon.service.ensure_exists(id).await?; // 404 before anything
    daemon.refuse_when_queue_full(id).await?; // 429, nothing recorded
    if !runtime::control::is_event_name(&body.event) {
        return Err(bad_request(format!(
            "event {:?}: 1 to 128 letters, digits, '_', '-', '.' or ':'",
            body.event
        )));
    }
    let control = daemon.control();
    let woke = control.wake(id, &body.event, &body.payload).await?;
    let turn = control.go_on(id);
    drop(admitted); // its task counts now
    if !body.wait {
        let woke = Woke { session: id, woke };
        return Ok((StatusCode::ACCEPTED, Json(woke)).into_response());
    }
    let end = turn.await?;
    Ok(Json(store::turn_end(id, &end)).into_response())
}
