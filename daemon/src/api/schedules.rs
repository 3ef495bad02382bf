//! Schedules: created, listed and removed through the API; fired by the
//! daemon (`crate::schedules`).

use super::*;
use runtime::api::{CreateSchedule, ScheduleCreated, ScheduleView};

/// A schedule of the store named in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // read by axum as `Path<Uuid>`
pub(super) struct SchedulePath {
    /// The schedule's id.
    id: Uuid,
}

/// Creates a schedule: each tick (`every` or `cron`) sends `message` to a
/// new session of the agent or to the session `into` names. Its log
/// (`mneme log ID`) records its creation, every firing and every skip.
#[utoipa::path(post, path = "/schedules", request_body = CreateSchedule,
    responses(
        (status = 201, description = "Created", body = ScheduleCreated),
        (status = 400, description = "It cannot run as given (the error says why)", body = wire::ApiError),
        (status = 404, description = "`into` names a session the store does not hold", body = wire::ApiError)))]
pub(super) async fn create(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<CreateSchedule>,
) -> Result<(StatusCode, Json<ScheduleCreated>), ApiError> {
    if let Some(Ok(into)) = body.into.as_deref().filter(|i| *i != "new").map(str::parse) {
        daemon.reach(&caller, into).await?;
    }
    let spec = match (&body.agent, &body.spec) {
        (Some(name), None) => Some(agent_named(&daemon, &caller, name)?),
        (None, Some(spec)) => refuse_own_spec(&caller).map(|()| Some(spec.clone()))?,
        (None, None) => None,
        (Some(_), Some(_)) => {
            return Err(bad_request(
                "give at most one of \"agent\" (a name) or \"spec\" (an agent spec)",
            ))
        }
    };
    let service = daemon.service_for(&caller);
    let schedule = service.create_schedule(&body, spec).await?;
    daemon.schedules.know(schedule);
    Ok((StatusCode::CREATED, Json(ScheduleCreated { schedule })))
}

/// Every schedule of the store, removed ones too, each with its next tick,
/// its last firing and how many ticks fired and were skipped.
#[utoipa::path(get, path = "/schedules",
    responses((status = 200, description = "The schedules", body = Vec<ScheduleView>)))]
pub(super) async fn list(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<ScheduleView>>, ApiError> {
    let mut views = Vec::new();
    for id in daemon.service.schedule_ids().await? {
        let state = daemon.schedule_state(id).await?;
        if caller.reaches(tenant_of(&state)) {
            views.extend(store::schedule_view(id, &state));
        }
    }
    Ok(Json(views))
}

/// The tenant whose schedule `state` is (`None`: the operator's).
fn tenant_of(state: &replay::schedule::ScheduleState) -> Option<&str> {
    let tenant = state.spec.as_ref().and_then(|s| s.tenant.as_ref());
    tenant.map(|t| t.name.as_str())
}

/// Removes a schedule: it fires no more (recorded; its log stays).
#[utoipa::path(delete, path = "/schedules/{id}", params(SchedulePath),
    responses(
        (status = 204, description = "Removed (or removed already)"),
        (status = 404, description = "No such schedule", body = wire::ApiError)))]
pub(super) async fn remove(
    State(daemon): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    // Another tenant's schedule is one the store does not hold.
    let state = daemon.service.schedule(id).await?;
    if !caller.reaches(tenant_of(&state)) {
        return Err(RuntimeError::NoSuchSchedule(id).into());
    }
    daemon.service.remove_schedule(id, "api").await?;
    Ok(StatusCode::NO_CONTENT)
}
