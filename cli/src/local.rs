//! [`Sessions`] on a log opened here: each turn runs in this process under
//! the session's lease, through the same [`Service`] operations the
//! daemon's handlers call.

use crate::sessions::{Decision, Exported, Recorded, Sessions, Started, Stream};
use anyhow::{Context, Result};
use eventlog::EventLog;
use replay::AgentSpec;
use runtime::api::{
    Decided, DecisionAnswer, Forked, PostMessage, ReplayView, RerunReport, SessionDiff,
    SessionStatus, SessionSummary, TurnOutcome, Verified,
};
use runtime::lease::HeldLease;
use runtime::pause;
use runtime::runner::StopCheck;
use runtime::service::{self, Service};
use runtime::{views, Session};
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

    /// Takes session `id`'s lease for as long as the value lives: a daemon
    /// or another CLI running it gets a clear refusal instead. A lease left
    /// by a killed `mneme` of this host is waited out. No lease is taken
    /// for a session that does not exist.
    async fn hold(&self, id: Uuid) -> Result<HeldLease> {
        self.service.ensure_exists(id).await?;
        let log = self.service.log().clone();
        Ok(HeldLease::acquire_taking_over_exited(log, id, &self.owner, self.lease_ttl).await?)
    }

    /// Drives the session to the end of its turn. A pause asked for through
    /// a daemon sharing the store (addressed to `lease`) stops it between
    /// steps, as it would a daemon's turn.
    async fn drive(
        &self,
        session: &mut Session,
        lease: &HeldLease,
        stream: Stream,
    ) -> Result<TurnOutcome> {
        let listening = Arc::new(pause::Listening::default());
        listening.start(session.id(), lease.token());
        let log = self.service.log().clone();
        let stop: StopCheck = Arc::new(move |id| {
            let (listening, log) = (listening.clone(), log.clone());
            Box::pin(async move {
                listening
                    .asked(log.as_ref(), id)
                    .await
                    .then(|| pause::PAUSED_ON_REQUEST.to_string())
            })
        });
        let mut runner = self.service.runner().with_stop(stop);
        if let Some(sink) = stream {
            runner = runner.with_deltas(Arc::new(move |_, text| sink.show(text)));
        }
        let id = session.id();
        let end = runner.drive(session).await.map_err(|e| {
            use runtime::model::ModelError;
            let when = match &e {
                runtime::RuntimeError::Model(ModelError::Unavailable { .. }) => {
                    Some("once the model server answers")
                }
                runtime::RuntimeError::Model(_) => Some("once that is fixed"),
                _ => None,
            };
            let next = when.map_or(String::new(), |when| {
                format!(" stopped; {when}, `mneme resume {id}` continues it")
            });
            anyhow::Error::new(e).context(format!("session {id}{next}"))
        })?;
        Ok(TurnOutcome::new(session.id(), &end))
    }

    /// Drives the session to the end of its turn, then gives its lease up.
    /// On an error the lease is dropped instead, and lapses at once: a
    /// daemon sharing the store may take the session over.
    async fn drive_then_release(
        &self,
        lease: HeldLease,
        session: &mut Session,
        stream: Stream,
    ) -> Result<TurnOutcome> {
        match self.drive(session, &lease, stream).await {
            Ok(outcome) => {
                lease.release().await;
                Ok(outcome)
            }
            Err(e) => {
                lease.lapse().await;
                Err(e)
            }
        }
    }

    /// Records a decision on `call` (`record`) under the session's lease;
    /// then, if `proceed` and nothing else waits, runs the session on.
    async fn record_then_go_on<F>(
        &self,
        id: Uuid,
        call: &str,
        proceed: bool,
        (recorded, stream): (Recorded<'_>, Stream),
        record: impl FnOnce(Session) -> F,
    ) -> Result<DecisionAnswer>
    where
        F: std::future::Future<Output = (Session, Result<bool, runtime::RuntimeError>)>,
    {
        let lease = self.hold(id).await?;
        let session = self.service.load(id).await?;
        let (mut session, can_continue) = record(session).await;
        let go_on = can_continue? && proceed;
        recorded();
        if !go_on {
            lease.release().await;
            return Ok(DecisionAnswer::Decided(Decided {
                session: id,
                decided: call.to_string(),
                continuing: false,
            }));
        }
        let outcome = self.drive_then_release(lease, &mut session, stream);
        Ok(DecisionAnswer::Ended(outcome.await?))
    }
}

#[async_trait::async_trait]
impl Sessions for Local {
    async fn create(&self, spec: AgentSpec, first_message: Option<String>) -> Result<Uuid> {
        let session = match first_message {
            Some(text) => self.service.start(spec, text).await?,
            None => self.service.create(spec).await?,
        };
        Ok(session.id())
    }

    async fn list(&self) -> Result<Vec<SessionSummary>> {
        Ok(self.service.rows().await?)
    }

    async fn ids(&self) -> Result<Vec<Uuid>> {
        let metas = self.log().sessions().await?;
        Ok(metas.into_iter().map(|m| m.session).collect())
    }

    async fn events(&self, id: Uuid) -> Result<Vec<Value>> {
        crate::timeline::rows(self.log(), id).await
    }

    async fn verify(&self, id: Uuid) -> Result<Verified> {
        Ok(views::verified(self.log(), id).await)
    }

    async fn replay(&self, id: Uuid) -> Result<ReplayView> {
        let session = self.service.load(id).await?;
        Ok(views::replay_view(id, session.state()))
    }

    async fn erase(&self, id: Uuid, erase: runtime::api::Erase) -> Result<runtime::api::Erased> {
        let lease = self.hold(id).await?;
        let mut session = self.service.load(id).await?;
        let erased = self
            .service
            .erase(&mut session, &erase.reason, &erase.by)
            .await;
        drop(session);
        lease.release().await;
        erased?;
        Ok(runtime::api::Erased {
            session: id,
            status: runtime::api::SessionStatus::Erased,
        })
    }

    async fn fork(&self, id: Uuid, at: u64, spec: Option<AgentSpec>) -> Result<Forked> {
        let spec = spec.map(|spec| (spec, "mneme fork --agent"));
        let child = self.service.fork(id, at, spec).await?;
        Ok(Forked {
            session: child.id(),
            parent: id,
            at,
        })
    }

    async fn diff(&self, a: Uuid, b: Uuid) -> Result<SessionDiff> {
        Ok(runtime::diff::sessions(self.log(), a, b).await?)
    }

    async fn rerun(
        &self,
        id: Uuid,
        spec: AgentSpec,
        live_tools: bool,
        started: Started<'_>,
    ) -> Result<RerunReport> {
        let (mut session, rest) = self.service.start_rerun(id, spec, live_tools).await?;
        started(session.id());
        let lease = self.hold(session.id()).await?;
        let mut rest = rest.into_iter();
        let ended = loop {
            match self.drive(&mut session, &lease, None).await {
                Ok(outcome) if outcome.status == SessionStatus::Idle => {}
                ended => break ended.map(|_| ()),
            }
            let Some(text) = rest.next() else {
                break Ok(());
            };
            if let Err(e) = self.service.post_message(&mut session, text).await {
                break Err(e.into());
            }
        };
        match &ended {
            Ok(()) => lease.release().await,
            Err(_) => lease.lapse().await,
        }
        if let Err(e) = ended {
            // The turn's failure is in the log: the report says where it stopped.
            runtime::text::say(&format!("mneme: {e:#}"));
        }
        Ok(runtime::rerun::report(self.log(), id, session.id()).await?)
    }

    async fn blob(&self, id: Uuid, digest: &str) -> Result<Vec<u8>> {
        Ok(self.service.blob(id, digest).await?)
    }

    async fn next_request(&self, id: Uuid) -> Result<Vec<u8>> {
        let mut session = self.service.load(id).await?;
        Ok(session.next_request()?.to_vec())
    }

    async fn post_message(
        &self,
        id: Uuid,
        message: PostMessage,
        stream: Stream,
    ) -> Result<TurnOutcome> {
        let lease = self.hold(id).await?;
        let mut session = self.service.load(id).await?;
        if message.refresh_tools {
            runtime::mcp::refresh(&mut session, "mneme run --refresh-tools").await?;
        }
        self.service
            .post_message(&mut session, message.text)
            .await?;
        self.drive_then_release(lease, &mut session, stream).await
    }

    async fn start(&self, id: Uuid, stream: Stream) -> Result<TurnOutcome> {
        let lease = self.hold(id).await?;
        let mut session = self.service.load(id).await?;
        self.drive_then_release(lease, &mut session, stream).await
    }

    async fn resume(&self, id: Uuid, extend: bool, stream: Stream) -> Result<TurnOutcome> {
        const BY: &str = "mneme resume";
        let lease = self.hold(id).await?;
        let mut session = self.service.load(id).await?;
        // Not stopped, yet running, and its lease ours: what ran it died.
        if !self.service.reopen(&mut session, BY, extend).await? {
            self.service.resume_interrupted(&mut session, BY).await?;
        }
        self.drive_then_release(lease, &mut session, stream).await
    }

    async fn decide(
        &self,
        id: Uuid,
        call: &str,
        decision: Decision,
        recorded: Recorded<'_>,
        stream: Stream,
    ) -> Result<DecisionAnswer> {
        let context = (recorded, stream);
        match decision {
            Decision::Resolve(decision) => {
                let skip = decision.skip.as_ref().map(Value::to_string);
                let resolution =
                    service::resolution(decision.retry, skip.as_deref(), decision.fail.as_deref())
                        .map_err(|e| anyhow::anyhow!(e))?;
                let by = decision.by.as_str();
                self.record_then_go_on(id, call, decision.proceed, context, |mut s| async {
                    let resolved = self.service.resolve(&mut s, call, resolution, by).await;
                    (s, resolved)
                })
                .await
            }
            Decision::Approve(decision) => {
                let (approved, by) = (decision.approved, decision.by.as_str());
                let args = decision.args.as_deref();
                self.record_then_go_on(id, call, decision.proceed, context, |mut s| async {
                    let decided = (self.service)
                        .decide_approval(&mut s, call, approved, by, args)
                        .await;
                    (s, decided)
                })
                .await
            }
        }
    }

    async fn export(&self, session: Option<Uuid>, output: Option<&Path>) -> Result<Exported> {
        let ids = match session {
            Some(id) => {
                self.service.ensure_exists(id).await?;
                vec![id]
            }
            None => self.ids().await?,
        };
        let mut out: Box<dyn std::io::Write + Send> = match output {
            Some(path) => Box::new(std::io::BufWriter::new(private_output(path)?)),
            None => Box::new(std::io::BufWriter::new(std::io::stdout())),
        };
        let records = runtime::transfer::export(self.raw.as_ref(), &ids, &mut out).await?;
        Ok(Exported {
            records,
            sessions: ids.len(),
        })
    }

    async fn import(&self, input: Option<&Path>) -> Result<runtime::transfer::Imported> {
        let mut reader: Box<dyn std::io::BufRead + Send> = match input {
            Some(path) => Box::new(std::io::BufReader::new(
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
            )),
            None => Box::new(std::io::BufReader::new(std::io::stdin())),
        };
        let origin = input.map_or("stdin".to_string(), |p| p.display().to_string());
        let done = runtime::transfer::import(self.raw.as_ref(), &mut reader)
            .await
            .with_context(|| format!("importing {origin}"))?;
        self.log().barrier(eventlog::Durability::Synced).await?;
        for id in &done.sessions {
            self.log().verify(*id).await?;
        }
        Ok(done)
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
