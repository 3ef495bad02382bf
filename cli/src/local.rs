//! [`Sessions`] on a log opened here: each operation is the runtime's
//! [`Control`], with every turn run in this process ([`InPlace`]), under
//! the session's lease, through the same operations the daemon's handlers
//! call.

use crate::sessions::{Decision, Exported, Recorded, Sessions, Started, Stream};
use anyhow::{Context, Result};
use eventlog::EventLog;
use replay::AgentSpec;
use runtime::api::{
    Decided, DecisionAnswer, Forked, PostMessage, ReplayView, RerunReport, SessionDiff,
    SessionSummary, TurnOutcome, Verified,
};
use runtime::control::HeldLease;
use runtime::control::{self, Control, Hold, Opened, TurnStart, TurnTask, Turns};
use runtime::Service;
use runtime::StopCheck;
use runtime::{store, RuntimeError, TurnEnd};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The sessions of a log this process opened.
pub struct Local {
    service: Service,
    /// The store under the service's log, as stored (encrypted): what
    /// export and import carry.
    raw: Arc<dyn EventLog>,
    /// This process as a lease owner.
    owner: String,
    lease_ttl: Duration,
}

impl Local {
    /// The sessions of `service`'s log; leases taken as `owner` last
    /// `lease_ttl` unless renewed.
    pub fn new(
        service: Service,
        raw: Arc<dyn EventLog>,
        owner: String,
        lease_ttl: Duration,
    ) -> Local {
        Local {
            service,
            raw,
            owner,
            lease_ttl,
        }
    }

    fn log(&self) -> &dyn EventLog {
        self.service.log().as_ref()
    }

    /// The operations on the sessions, their turns run here, each reply's
    /// text streamed to `stream`.
    fn control(&self, stream: Stream) -> Control<InPlace> {
        let turns = InPlace {
            service: self.service.clone(),
            owner: self.owner.clone(),
            lease_ttl: self.lease_ttl,
            stream,
        };
        Control::new(self.service.clone(), turns)
    }

    /// Runs `turn` of session `id` to its end, as the API tells it.
    async fn ended(id: Uuid, turn: TurnTask) -> Result<TurnOutcome> {
        let end = turn.await.map_err(|e| turn_failed(id, e))?;
        Ok(TurnOutcome::new(id, &end))
    }
}

/// The error of a turn of session `id`, saying what to do next where the
/// model server is the cause.
fn turn_failed(id: Uuid, e: RuntimeError) -> anyhow::Error {
    use runtime::ModelError;
    let when = match &e {
        RuntimeError::Model(ModelError::Unavailable { .. }) => {
            Some("once the model server answers")
        }
        RuntimeError::Model(_) => Some("once that is fixed"),
        _ => None,
    };
    let next = when.map_or(String::new(), |when| {
        format!(" stopped; {when}, `mneme resume {id}` continues it")
    });
    // An error about the session's request names it already.
    let named = matches!(&e, RuntimeError::InvalidRequest { session, .. } if *session == id);
    match named && next.is_empty() {
        true => anyhow::Error::new(e),
        false => anyhow::Error::new(e).context(format!("session {id}{next}")),
    }
}

/// How the command line runs a turn: here, when it is awaited, under the
/// session's lease (a lease left by a killed `mneme` of this host is taken
/// over at once), each reply's text streamed as it comes. A pause asked
/// for through a daemon sharing the store stops it between steps, as it
/// would a daemon's turn.
pub struct InPlace {
    service: Service,
    owner: String,
    lease_ttl: Duration,
    stream: Stream,
}

impl InPlace {
    /// Takes session `id`'s lease for as long as the value lives: a daemon
    /// or another CLI running it gets a clear refusal instead. No lease is
    /// taken for a session that does not exist.
    async fn lease(
        service: &Service,
        (id, owner, ttl): (Uuid, &str, Duration),
    ) -> Result<HeldLease, RuntimeError> {
        service.ensure_exists(id).await?;
        let log = service.log().clone();
        Ok(HeldLease::acquire_taking_over_exited(log, id, owner, ttl).await?)
    }

    /// Opens the turn `start` opens in session `id` and drives it to its
    /// end. On an error the lease lapses at once: a daemon sharing the
    /// store may take the session over.
    async fn run_here(self, id: Uuid, start: TurnStart) -> Result<TurnEnd, RuntimeError> {
        let lease = InPlace::lease(&self.service, (id, &self.owner, self.lease_ttl)).await?;
        let ended = self.open_and_drive(id, start, &lease).await;
        match &ended {
            Ok(_) => lease.release().await,
            Err(_) => lease.lapse().await,
        }
        ended
    }

    async fn open_and_drive(
        &self,
        id: Uuid,
        start: TurnStart,
        lease: &HeldLease,
    ) -> Result<TurnEnd, RuntimeError> {
        let mut session = self.service.load(id).await?;
        if let Opened::Ended(end) = self.service.open_turn(&mut session, start).await? {
            return Ok(end);
        }
        let listening = Arc::new(control::Listening::default());
        listening.start(id, lease.token());
        let log = self.service.log().clone();
        let stop: StopCheck = Arc::new(move |id| {
            let (listening, log) = (listening.clone(), log.clone());
            Box::pin(async move {
                listening
                    .asked(log.as_ref(), id)
                    .await
                    .then(|| control::PAUSED_ON_REQUEST.to_string())
            })
        });
        let mut runner = self.service.runner().with_stop(stop);
        if let Some(sink) = self.stream.clone() {
            runner = runner.with_deltas(Arc::new(move |_, _, text| sink.show(text)));
        }
        runner.drive(&mut session).await
    }
}

#[async_trait::async_trait]
impl Turns for InPlace {
    async fn hold(&self, id: Uuid) -> Result<Hold, RuntimeError> {
        let lease = InPlace::lease(&self.service, (id, &self.owner, self.lease_ttl)).await?;
        Ok(Hold::new(lease, None))
    }

    /// A turn another process runs is not stopped from here: holding the
    /// session is refused instead, naming that process.
    async fn stop(&self, _id: Uuid) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn run(&self, id: Uuid, start: TurnStart) -> TurnTask {
        let here = InPlace {
            service: self.service.clone(),
            owner: self.owner.clone(),
            lease_ttl: self.lease_ttl,
            stream: self.stream.clone(),
        };
        Box::pin(here.run_here(id, start))
    }
}

#[async_trait::async_trait]
impl Sessions for Local {
    async fn create(&self, spec: AgentSpec, first_message: Option<String>) -> Result<Uuid> {
        Ok(self.control(None).create(spec, first_message).await?)
    }

    async fn list(&self) -> Result<Vec<SessionSummary>> {
        Ok(self.service.rows().await?)
    }

    async fn ids(&self) -> Result<Vec<Uuid>> {
        let metas = self.service.session_metas().await?;
        Ok(metas.into_iter().map(|m| m.session).collect())
    }

    async fn events(&self, id: Uuid) -> Result<Vec<Value>> {
        crate::timeline::rows(self.log(), id).await
    }

    async fn verify(&self, id: Uuid) -> Result<Verified> {
        Ok(store::verified(self.log(), id).await)
    }

    async fn replay(&self, id: Uuid) -> Result<ReplayView> {
        Ok(self.service.replay_view(id).await?)
    }

    async fn cache_report(&self, id: Uuid) -> Result<runtime::api::CacheReport> {
        Ok(self.service.cache_report(id).await?)
    }

    async fn erase(&self, id: Uuid, erase: runtime::api::Erase) -> Result<runtime::api::Erased> {
        let control = self.control(None);
        Ok(control.erase_with_derived(id, &erase, &|_| {}).await?)
    }

    async fn fork(&self, id: Uuid, at: u64, spec: Option<AgentSpec>) -> Result<Forked> {
        let spec = spec.map(|spec| (spec, "mneme fork --agent"));
        let child = self.control(None).fork(id, at, spec).await?;
        Ok(Forked {
            session: child,
            parent: id,
            at,
        })
    }

    async fn diff(&self, a: Uuid, b: Uuid) -> Result<SessionDiff> {
        Ok(runtime::store::diff_sessions(self.log(), a, b).await?)
    }

    async fn rerun(
        &self,
        id: Uuid,
        spec: AgentSpec,
        live_tools: bool,
        started: Started<'_>,
    ) -> Result<RerunReport> {
        let control = self.control(None);
        Ok(control.rerun(id, spec, live_tools, started).await?)
    }

    async fn blob(&self, id: Uuid, digest: &str) -> Result<Vec<u8>> {
        Ok(self.service.blob(id, digest).await?)
    }

    async fn next_request(&self, id: Uuid) -> Result<Vec<u8>> {
        Ok(self.service.next_request(id).await?)
    }

    async fn post_message(
        &self,
        id: Uuid,
        message: PostMessage,
        stream: Stream,
    ) -> Result<TurnOutcome> {
        let message = TurnStart::Message {
            text: message.text,
            refresh_tools: message
                .refresh_tools
                .then(|| "mneme run --refresh-tools".to_string()),
            recorded: None,
        };
        Local::ended(id, self.control(stream).post_message(id, message)).await
    }

    async fn start(&self, id: Uuid, stream: Stream) -> Result<TurnOutcome> {
        Local::ended(id, self.control(stream).start(id)).await
    }

    async fn resume(&self, id: Uuid, extend: bool, stream: Stream) -> Result<TurnOutcome> {
        let turn = self.control(stream).resume(id, "mneme resume", extend);
        Local::ended(id, turn).await
    }

    async fn create_schedule(
        &self,
        request: runtime::api::CreateSchedule,
        spec: Option<AgentSpec>,
    ) -> Result<Uuid> {
        Ok(self.service.create_schedule(&request, spec).await?)
    }

    async fn schedules(&self) -> Result<Vec<runtime::api::ScheduleView>> {
        let mut views = Vec::new();
        for id in self.service.schedule_ids().await? {
            let state = self.service.schedule(id).await?;
            views.extend(store::schedule_view(id, &state));
        }
        Ok(views)
    }

    async fn remove_schedule(&self, id: Uuid) -> Result<()> {
        Ok(self
            .service
            .remove_schedule(id, "mneme schedule remove")
            .await?)
    }

    async fn wake(
        &self,
        id: Uuid,
        wake: runtime::api::Wake,
        stream: Stream,
    ) -> Result<TurnOutcome> {
        let control = self.control(stream);
        control.wake(id, &wake.event, &wake.payload).await?;
        Local::ended(id, control.go_on(id)).await
    }

    async fn decide(
        &self,
        id: Uuid,
        call: &str,
        decision: Decision,
        recorded: Recorded<'_>,
        stream: Stream,
    ) -> Result<DecisionAnswer> {
        let (decision, by, proceed) = match decision {
            Decision::Resolve(d) => {
                let skip = d.skip.as_ref().map(Value::to_string);
                let resolution = control::resolution(d.retry, skip.as_deref(), d.fail.as_deref())
                    .map_err(|e| anyhow::anyhow!(e))?;
                (control::Decision::Resolve(resolution), d.by, d.proceed)
            }
            Decision::Approve(d) => {
                let decision = control::Decision::Approve {
                    approved: d.approved,
                    args: d.args,
                };
                (decision, d.by, d.proceed)
            }
        };
        let control = self.control(stream);
        let can_continue = control.decide(id, call, decision, &by).await?;
        recorded();
        if !(can_continue && proceed) {
            return Ok(DecisionAnswer::Decided(Decided {
                session: id,
                decided: call.to_string(),
                continuing: false,
            }));
        }
        let turn = control.resume(id, &by, false);
        Ok(DecisionAnswer::Ended(Local::ended(id, turn).await?))
    }

    async fn add_tenant(
        &self,
        request: runtime::api::CreateTenant,
        by: &str,
    ) -> Result<runtime::api::TenantToken> {
        let limits = runtime::limits_of(&request);
        let issued = (self.service.tenants())
            .add(&request.name, limits, by)
            .await?;
        Ok(runtime::api::TenantToken {
            tenant: issued.tenant,
            token: issued.token,
        })
    }

    async fn tenants(&self) -> Result<Vec<runtime::api::TenantView>> {
        let registry = self.service.tenants().registry().await?;
        Ok(registry
            .tenants
            .values()
            .map(runtime::tenant_view)
            .collect())
    }

    async fn issue_token(&self, name: &str, by: &str) -> Result<runtime::api::TenantToken> {
        let issued = self.service.tenants().issue_token(name, by).await?;
        Ok(runtime::api::TenantToken {
            tenant: issued.tenant,
            token: issued.token,
        })
    }

    async fn revoke_tokens(&self, name: &str, by: &str) -> Result<runtime::api::TokensRevoked> {
        let revoked = self.service.tenants().revoke(name, by).await?;
        Ok(runtime::api::TokensRevoked {
            tenant: name.to_string(),
            revoked,
        })
    }

    async fn set_tenant(
        &self,
        name: &str,
        set: runtime::api::SetTenant,
        by: &str,
    ) -> Result<runtime::api::TenantView> {
        let change = |limits| runtime::limits_set(limits, &set);
        let tenants = self.service.tenants();
        tenants.set_limits(name, change, by).await?;
        let registry = tenants.registry().await?;
        Ok(runtime::tenant_view(
            registry.tenants.get(name).expect("set just now"),
        ))
    }

    async fn erase_tenant(
        &self,
        name: &str,
        erase: runtime::api::EraseTenant,
    ) -> Result<runtime::api::TenantErased> {
        let control = self.control(None);
        Ok(control
            .erase_tenant(name, &erase.reason, &erase.by, &|_| {})
            .await?)
    }

    async fn spend(&self, query: runtime::api::SpendQuery) -> Result<runtime::api::SpendReport> {
        Ok(self.service.spend(&query).await?)
    }

    async fn export(&self, session: Option<Uuid>, output: Option<&Path>) -> Result<Exported> {
        let ids = match session {
            Some(id) => {
                self.service.ensure_exists(id).await?;
                vec![id]
            }
            None => {
                // The registry of tenants goes with the sessions: their
                // tenants, tokens and caps (the ledgers of days, and the
                // schedules, do not).
                let registry = replay::tenant::registry_id();
                let held = self.log().head(registry).await?.seq > 0;
                let mut ids: Vec<Uuid> = held.then_some(registry).into_iter().collect();
                ids.extend(self.ids().await?);
                ids
            }
        };
        let mut out: Box<dyn std::io::Write + Send> = match output {
            Some(path) => Box::new(std::io::BufWriter::new(private_output(path)?)),
            None => Box::new(std::io::BufWriter::new(std::io::stdout())),
        };
        let records = runtime::store::export(self.raw.as_ref(), &ids, &mut out).await?;
        Ok(Exported {
            records,
            sessions: ids.len(),
        })
    }

    async fn import(
        &self,
        input: Option<&Path>,
        policy: runtime::store::Policy,
    ) -> Result<crate::sessions::ImportReport> {
        let mut reader: Box<dyn std::io::BufRead + Send> = match input {
            Some(path) => Box::new(std::io::BufReader::new(
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
            )),
            None => Box::new(std::io::BufReader::new(std::io::stdin())),
        };
        let origin = input.map_or("stdin".to_string(), |p| p.display().to_string());
        let imported = runtime::store::import(self.raw.as_ref(), &mut reader, policy)
            .await
            .with_context(|| format!("importing {origin}"))?;
        self.log().barrier(eventlog::Durability::Synced).await?;
        for id in &imported.sessions {
            self.log().verify(*id).await?;
        }
        let mut sessions = Vec::new();
        let registry = replay::tenant::registry_id();
        for id in imported.changed.iter().filter(|id| **id != registry) {
            // Unreadable here (written under another master key): nothing
            // can run it either.
            let at_rest = self.service.at_rest_after_import(*id, &origin).await;
            let (spec, refused) = at_rest.unwrap_or((None, None));
            let reach = spec.map_or(Vec::new(), |spec| control::reach(&spec));
            let status = match self.service.current_summary(*id).await {
                Ok(summary) => summary.status,
                Err(e) => format!("unreadable here ({e})"),
            };
            sessions.push((*id, reach, refused, status));
        }
        Ok(crate::sessions::ImportReport { imported, sessions })
    }
}

/// Creates (or empties) `path` for an export, which holds every record:
/// readable and writable by its owner only (0600), also when it existed
/// (a device or a pipe is left as it is).
fn private_output(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let context = || format!("creating {}", path.display());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(context)?;
    if file.metadata().with_context(context)?.is_file() {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(context)?;
    }
    Ok(file)
}
