//! The commands: each is written once, against [`Sessions`] (the log
//! opened here, or the daemon that holds the data directory), does one
//! thing, prints, and returns an exit code.

use crate::local::Local;
use crate::open::{default_data_dir, open_log, register_secrets, serve, Opened, ServeSettings};
use crate::sessions::{Decision, Sessions, Stream};
use crate::witness::{heads_of, signed_heads, witnessed};
use crate::{Cli, Command, EXIT_NEEDS_DECISION};
use anyhow::{bail, Context, Result};
use eventlog::EventLog;
use runtime::api::PostMessage;
use runtime::api::{
    Approve, DecisionAnswer, DerivedOutcome, DerivedSession, Erase, Resolve, SessionStatus,
    TurnOutcome,
};
use runtime::load_agent_file;
use runtime::store::{HeadKey, HeadSigner};
use runtime::store::{MasterKey, SealedLog};
use runtime::Service;
use runtime::{store, TurnEnd};
use runtime::{OtlpConfig, Tracer};
use serde::Serialize;
use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Runs the command `cli` names; `holder` names this process in the data
/// directory's holder note.
pub async fn dispatch(cli: Cli, holder: &str) -> Result<ExitCode> {
    register_secrets(&cli);
    let data_dir = cli.data_dir.clone().unwrap_or_else(default_data_dir);
    let command = match cli.command {
        Command::Demo(args) => return crate::demo::run(args.keep).await,
        Command::Ui(args) => return crate::ui::run(&data_dir, args).await,
        Command::Keygen(args) => return keygen(&data_dir, &args.out, args.master),
        Command::Check(args) => return check(&args).await,
        command => command,
    };
    let options = command.store().expect("every other command opens a store");
    // Given after the command, or before it.
    let store_url = options.store.clone().or(cli.store);
    let durability = options.durability;
    let lease_ttl = Duration::from_millis(options.lease_ttl_ms.max(100));
    let snapshot_every = options
        .snapshot_every
        .unwrap_or(runtime::store::SNAPSHOT_EVERY);
    let cache_bytes = options.sled_cache_mib << 20;
    let master = options
        .master_key
        .as_deref()
        .map(|path| MasterKey::load(path, Some(&data_dir)))
        .transpose()?;
    // Only commands that run turns here sign heads and trace.
    let turn_options = command.turns();
    let turns = turn_options.is_some();
    let signer = turn_options
        .and_then(|t| t.signing_key.as_deref())
        .map(|path| HeadSigner::load(path, Some(&data_dir)))
        .transpose()?
        .map(Arc::new);
    let endpoint = turn_options.and_then(|t| t.otlp_endpoint.as_deref());
    let tracer = tracer(endpoint, turn_options.is_some_and(|t| t.otlp_content))?;
    let store = StoreName::of(&store_url, &data_dir);
    if store_url.is_none() && !data_dir.exists() && reads_only(&command) {
        // Nothing ran here: a read creates nothing.
        return nothing_here(&command, &store);
    }
    let outcome = async {
        let opened = open_log(&store_url, &data_dir, cache_bytes, &command, holder).await?;
        let (sessions, _reader): (Arc<dyn Sessions>, _) = match opened {
            Opened::Daemon(remote) => (Arc::new(remote), None),
            Opened::Log(raw) => {
                let log: Arc<dyn EventLog> = Arc::new(SealedLog::new(raw.clone(), master));
                if let Command::Serve(a) = command {
                    let settings = ServeSettings {
                        signer,
                        tracer: tracer.clone(),
                        data_dir: &data_dir,
                        durability,
                        snapshot_every,
                        lease_ttl,
                    };
                    return serve(log, settings, a).await;
                }
                let mut service = Service::new(log, durability)
                    .snapshot_every(snapshot_every)
                    .signed_by(signer)
                    .traced_by(tracer.clone());
                if let Some(progress) = crate::progress::Progress::on_terminal().filter(|_| turns) {
                    service = service.observed_by(progress);
                }
                let owner = runtime::control::owner_name("cli");
                let local: Arc<dyn Sessions> = Arc::new(Local::new(service, raw, owner, lease_ttl));
                // A turn may take long: meanwhile, other terminals may read.
                let reader = match (turns, &store_url) {
                    (true, None) => readable_beside(local.clone(), &data_dir, holder).await,
                    _ => None,
                };
                (local, reader)
            }
        };
        run(sessions.as_ref(), command).await
    }
    .await
    .map_err(|e| store.in_error(e));
    if let Some(tracer) = tracer {
        // The last turns' spans, before the process ends: at most this long.
        tracer.flush(OtlpConfig::DEFAULT_TIMEOUT).await;
    }
    outcome
}

/// Answers reads of `sessions` from other processes while this one holds
/// the data directory (see [`crate::reader`]); a reader that cannot start
/// costs a warning, never the command.
async fn readable_beside(
    sessions: Arc<dyn Sessions>,
    data_dir: &Path,
    holder: &str,
) -> Option<crate::reader::Reader> {
    match crate::reader::Reader::start(sessions, data_dir, holder).await {
        Ok(reader) => Some(reader),
        Err(e) => {
            runtime::warn_line!("mneme: warning: other commands cannot read this data directory while this one runs: {e:#}");
            None
        }
    }
}

/// Whether `command` only reads the store.
fn reads_only(command: &Command) -> bool {
    matches!(
        command,
        Command::Sessions(_)
            | Command::Log(_)
            | Command::Verify(_)
            | Command::Heads(_)
            | Command::Replay(_)
            | Command::Diff(_)
            | Command::Blob(_)
            | Command::Export(_)
            | Command::Spend(_)
    )
}

/// What a read-only `command` answers when the data directory does not
/// exist: no sessions, or no such session.
fn nothing_here(command: &Command, store: &StoreName) -> Result<ExitCode> {
    let named = match command {
        Command::Log(a) => Some(&a.session),
        Command::Replay(a) => Some(&a.session),
        Command::Diff(a) => Some(&a.a),
        Command::Blob(a) => Some(&a.session),
        Command::Verify(a) => a.session.as_ref(),
        Command::Heads(a) => a.session.as_ref(),
        Command::Export(a) => a.session.as_ref(),
        _ => None,
    };
    if let Some(named) = named {
        bail!("no session {named} in {store}: it does not exist yet (nothing has run with it; --data-dir or $MNEME_DATA_DIR names another)");
    }
    say!("mneme: no sessions: {store} does not exist yet (nothing has run with it; --data-dir or $MNEME_DATA_DIR names another)");
    Ok(ExitCode::SUCCESS)
}

/// The store a command uses, as its messages name it.
struct StoreName(String);

impl StoreName {
    fn of(store: &Option<String>, data_dir: &Path) -> StoreName {
        StoreName(match store {
            Some(url) => format!("the store {}", replay::spec::redact_url(url)),
            None => format!("the data directory {}", data_dir.display()),
        })
    }

    /// `error`, saying which store had no such session.
    fn in_error(&self, error: anyhow::Error) -> anyhow::Error {
        let missing = error.chain().find_map(|cause| {
            if let Some(crate::sessions::NoSession(named)) = cause.downcast_ref() {
                return Some(named.clone());
            }
            match cause.downcast_ref::<runtime::RuntimeError>() {
                Some(runtime::RuntimeError::NoSuchSession(id)) => Some(id.to_string()),
                _ => None,
            }
        });
        match missing {
            Some(named) => anyhow::anyhow!("no session {named} in {self}"),
            None => error,
        }
    }
}

impl std::fmt::Display for StoreName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The exporter of turns' traces, if `--otlp-endpoint` names a collector.
fn tracer(endpoint: Option<&str>, content: bool) -> Result<Option<Arc<Tracer>>> {
    let Some(endpoint) = endpoint.filter(|e| !e.trim().is_empty()) else {
        return Ok(None);
    };
    let mut config = OtlpConfig::new(endpoint);
    config.content = content;
    let tracer = Tracer::start(config).map_err(|e| anyhow::anyhow!("--otlp-endpoint: {e}"))?;
    Ok(Some(tracer))
}

/// Runs `command` on `sessions`.
async fn run(sessions: &dyn Sessions, command: Command) -> Result<ExitCode> {
    match command {
        Command::Run(a) => {
            let (outcome, streamed) = match (a.session, a.agent) {
                (Some(named), _) => {
                    let id = named.resolve(sessions).await?;
                    say!("session {id}");
                    let message = PostMessage {
                        text: a.message,
                        wait: true,
                        refresh_tools: a.refresh_tools,
                    };
                    showing(a.json.json, |s| sessions.post_message(id, message, s)).await
                }
                (None, Some(path)) => {
                    // The start and the message are one append.
                    let spec = load_agent_file(&path)?;
                    let id = sessions.create(spec, Some(a.message)).await?;
                    say!("session {id}");
                    showing(a.json.json, |s| sessions.start(id, s)).await
                }
                (None, None) => bail!(
                    "mneme run needs --agent FILE to start a session, or --session ID to continue one"
                ),
            };
            report(&outcome?, a.json.json, streamed)
        }
        Command::Resume(a) => {
            let ids = match a.session {
                Some(named) => vec![named.resolve(sessions).await?],
                // Those with pending work no person has to decide on.
                None => {
                    let rows = sessions.list().await?;
                    let ids: Vec<Uuid> = (rows.iter())
                        .filter_map(|row| (row.resumable == Some(true)).then_some(row.session))
                        .collect();
                    if ids.is_empty() {
                        say_nothing_to_resume(&rows);
                    }
                    ids
                }
            };
            let mut worst = ExitCode::SUCCESS;
            for id in ids {
                say!("session {id}");
                let turn = |stream| sessions.resume(id, a.extend, stream);
                let (outcome, streamed) = showing(a.json.json, turn).await;
                let code = report(&outcome?, a.json.json, streamed)?;
                if code != ExitCode::SUCCESS {
                    worst = code;
                }
            }
            Ok(worst)
        }
        Command::Wake(a) => {
            let payload = match &a.payload {
                Some(text) => serde_json::from_str(text)
                    .with_context(|| format!("--payload is not JSON: {text:?}"))?,
                None => serde_json::Value::Null,
            };
            let id = a.session.resolve(sessions).await?;
            let wake = runtime::api::Wake {
                event: a.event.clone(),
                payload,
                wait: true,
            };
            let turn = |stream| sessions.wake(id, wake.clone(), stream);
            let (outcome, streamed) = showing(a.json.json, turn).await;
            report(&outcome?, a.json.json, streamed)
        }
        Command::Schedule(a) => schedule(sessions, a.action).await,
        Command::Sessions(a) => {
            let rows: Vec<_> = sessions.list().await?.iter().map(to_json).collect();
            crate::render::sessions(&rows, a.json.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Log(a) => {
            let id = a.session.resolve(sessions).await?;
            crate::timeline::print(&sessions.events(id).await?, &a)
        }
        Command::Verify(a) => {
            let ids = match a.session {
                Some(named) => vec![named.resolve(sessions).await?],
                None => sessions.ids().await?,
            };
            let key = a.key.as_deref().map(HeadKey::parse).transpose()?;
            let mut results = Vec::with_capacity(ids.len());
            for id in ids {
                let mut verified = sessions.verify(id).await?;
                if let (Some(key), true) = (&key, verified.ok) {
                    signed_heads(sessions, key, &mut verified).await?;
                }
                results.push(to_json(&verified));
            }
            if let (Some(key), Some(file)) = (&key, &a.witness) {
                results.extend(witnessed(sessions, key, file).await?.iter().map(to_json));
            }
            Ok(crate::render::verify(&results, a.json.json))
        }
        Command::Heads(a) => {
            let ids = match a.session {
                Some(named) => vec![named.resolve(sessions).await?],
                None => sessions.ids().await?,
            };
            let mut text = String::new();
            for id in ids {
                for head in heads_of(sessions, id).await? {
                    text.push_str(&serde_json::to_string(&head)?);
                    text.push('\n');
                }
            }
            match a.output {
                Some(path) => std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => crate::out::write(text.as_bytes()),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Erase(a) => erase(sessions, a).await,
        Command::Tenant(a) => tenant(sessions, a.action).await,
        Command::Spend(a) => {
            let query = runtime::api::SpendQuery {
                tenant: a.tenant,
                by: a
                    .by
                    .as_deref()
                    .map(str::parse)
                    .transpose()
                    .map_err(|e: String| anyhow::anyhow!(e))?,
                day: a.day,
            };
            if let Some(day) = &query.day {
                chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
                    .map_err(|_| anyhow::anyhow!("--day {day:?}: a UTC day as YYYY-MM-DD"))?;
            }
            if let Some(tenant) = &query.tenant {
                replay::tenant::check_name(tenant).map_err(|e| anyhow::anyhow!("--tenant: {e}"))?;
            }
            let report = sessions.spend(query).await?;
            crate::render::spend(&report, a.json.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Fork(a) => {
            let spec = a.agent.as_deref().map(load_agent_file).transpose()?;
            let id = a.session.resolve(sessions).await?;
            let forked = sessions.fork(id, a.at, spec).await?;
            match a.json.json {
                true => outln!("{}", to_json(&forked)),
                false => outln!("{}", forked.session),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Diff(a) => {
            let (a_id, b_id) = (a.a.resolve(sessions).await?, a.b.resolve(sessions).await?);
            let diff = sessions.diff(a_id, b_id).await?;
            crate::diff::print(&diff, a.json.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Rerun(a) => {
            let spec = load_agent_file(&a.agent)?;
            let started = |id: Uuid| say!("session {id}");
            let report = sessions
                .rerun(
                    a.session.resolve(sessions).await?,
                    spec,
                    a.live_tools,
                    &started,
                )
                .await?;
            crate::diff::print_rerun(&report, a.json.json);
            Ok(match report.stopped {
                None => ExitCode::SUCCESS,
                Some(_) => ExitCode::FAILURE,
            })
        }
        Command::Blob(a) => {
            let id = a.session.resolve(sessions).await?;
            let bytes = sessions.blob(id, &a.digest).await?;
            match a.output {
                Some(path) => std::fs::write(&path, bytes)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => crate::out::write(&bytes),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Replay(a) => {
            let id = a.session.resolve(sessions).await?;
            if a.raw {
                crate::out::write(&sessions.next_request(id).await?);
                return Ok(ExitCode::SUCCESS);
            }
            if a.cache {
                let report = sessions.cache_report(id).await?;
                crate::render::cache_report(&report, a.json.json)?;
                return Ok(ExitCode::SUCCESS);
            }
            let view = sessions.replay(id).await?;
            crate::render::replay(&to_json(&view), a.json.json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Resolve(a) => {
            let go_on = !a.decision.no_resume;
            let mut body = Resolve {
                retry: false,
                skip: None,
                fail: None,
                by: a.decision.by.clone(),
                wait: go_on,
                proceed: go_on,
            };
            match (a.retry, a.result, a.fail) {
                (true, _, _) => body.retry = true,
                (_, Some(result), None) => {
                    body.skip = Some(
                        serde_json::from_str(&result)
                            .with_context(|| format!("--result is not JSON: {result:?}"))?,
                    )
                }
                (_, _, Some(message)) => body.fail = Some(message),
                _ => bail!("give one of --retry, --skip --result JSON, --fail MSG"),
            }
            let id = a.session.resolve(sessions).await?;
            let call_id = waiting_call(sessions, id, &a.call_id, IN_DOUBT).await?;
            let json = a.decision.json.json;
            let call = (id, call_id.as_str());
            decide(sessions, call, Decision::Resolve(body), "resolved", json).await
        }
        Command::Approve(a) => {
            let go_on = !a.decision.no_resume;
            let body = Approve {
                approved: !a.deny,
                by: a.decision.by.clone(),
                args: a.edit_args.clone(),
                wait: go_on,
                proceed: go_on,
            };
            let verb = match (a.deny, &a.edit_args) {
                (true, _) => "denied",
                (false, Some(_)) => "approved with edited arguments",
                (false, None) => "approved",
            };
            let id = a.session.resolve(sessions).await?;
            let call_id = waiting_call(sessions, id, &a.call_id, TO_APPROVE).await?;
            let call = (id, call_id.as_str());
            let json = a.decision.json.json;
            let edited = a.edit_args.as_deref();
            crate::approving::say_what_is_decided(sessions, call, edited, a.deny).await;
            decide(sessions, call, Decision::Approve(body), verb, json).await
        }
        Command::Export(a) => {
            let id = match &a.session {
                Some(named) => Some(named.resolve(sessions).await?),
                None => None,
            };
            let done = sessions.export(id, a.output.as_deref()).await?;
            say!(
                "exported {} records of {} sessions",
                done.records,
                done.sessions
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Import(a) => {
            let policy = runtime::store::Policy { append: a.append };
            let report = sessions.import(a.input.as_deref(), policy).await?;
            imported(&report);
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(_)
        | Command::Demo(_)
        | Command::Ui(_)
        | Command::Keygen(_)
        | Command::Check(_) => {
            unreachable!("run before a store is chosen")
        }
    }
}

/// `mneme check --agent FILE`: one line a thing checked; exit 1 if any
/// would fail a session.
async fn schedule(sessions: &dyn Sessions, action: crate::ScheduleAction) -> Result<ExitCode> {
    use crate::ScheduleAction;
    match action {
        ScheduleAction::Add(a) => {
            let spec = a.agent.as_deref().map(load_agent_file).transpose()?;
            let into = match &a.into {
                Some(named) => named.resolve(sessions).await?.to_string(),
                None => "new".into(),
            };
            let request = runtime::api::CreateSchedule {
                agent: None,
                spec: None,
                every: a.every,
                cron: a.cron,
                timezone: a.timezone,
                message: a.message,
                into: Some(into),
                overlap: Some(a.overlap),
                catch_up: Some(a.catch_up),
            };
            let id = sessions.create_schedule(request, spec).await?;
            match a.json.json {
                true => outln!("{}", serde_json::json!({ "schedule": id })),
                false => outln!("schedule {id}"),
            }
        }
        ScheduleAction::List(a) => {
            let views = sessions.schedules().await?;
            crate::render::schedules(&views, a.json.json);
        }
        ScheduleAction::Remove(a) => {
            sessions.remove_schedule(a.schedule).await?;
            say!("schedule {} removed", a.schedule);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn check(args: &crate::CheckArgs) -> Result<ExitCode> {
    use runtime::control::Verdict;
    let spec = load_agent_file(&args.agent)?;
    let findings = runtime::control::preflight_with(&spec, args.message.as_deref()).await;
    for finding in &findings {
        match args.json.json {
            true => outln!("{}", to_json(finding)),
            false => {
                let mark = match finding.verdict {
                    Verdict::Ok => "ok  ",
                    Verdict::Warn => "warn",
                    Verdict::Fail => "FAIL",
                };
                let line = format!("{mark}  {}: {}", finding.what, finding.detail);
                outln!("{}", runtime::text::for_terminal(&line));
            }
        }
    }
    let count = |verdict| findings.iter().filter(|f| f.verdict == verdict).count();
    let (failed, warned) = (count(Verdict::Fail), count(Verdict::Warn));
    let file = args.agent.display();
    if failed > 0 {
        say!(
            "mneme check: {failed} of {} checks of {file} failed: a session of it would fail there",
            findings.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    match warned {
        0 => say!("mneme check: {file}: everything a session reaches answers"),
        1 => say!("mneme check: {file}: nothing fails, 1 warning"),
        n => say!("mneme check: {file}: nothing fails, {n} warnings"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Says what an import stored, and of each session it stored to, what a
/// session of it would reach and whether it is at rest.
fn imported(report: &crate::sessions::ImportReport) {
    let done = &report.imported;
    say!(
        "imported {} records into {} sessions ({} already held); every chain verifies",
        done.records,
        done.sessions.len(),
        done.already_held
    );
    for (session, first, last) in &done.appended {
        say!("  added to session {session}: seq {first}–{last} (--append)");
    }
    for (id, reach, refused, status) in &report.sessions {
        let rest = match status.as_str() {
            "paused" => format!("at rest: nothing runs it until `mneme resume {id}`"),
            status => status.to_string(),
        };
        say!("  session {id}: {rest}; a session of it reaches:");
        for line in reach {
            say!("    {line}");
        }
        if let Some(why) = refused {
            say!("    its agent spec is refused as an agent file would be: {why}");
        }
    }
}

/// `mneme keygen --out FILE`: a new signing key, kept outside the data
/// directory; prints its public key.
fn keygen(data_dir: &Path, out: &Path, master: bool) -> Result<ExitCode> {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (what, why) = match master {
        true => (
            "master key",
            "a copy of the directory must not carry the key to its content",
        ),
        false => (
            "signing key",
            "whoever can rewrite the store must not hold it",
        ),
    };
    if absolute(out).starts_with(absolute(data_dir)) {
        bail!(
            "{}: the {what} must be kept outside the data directory ({}): {why}",
            out.display(),
            data_dir.display()
        );
    }
    if master {
        MasterKey::generate(out)?;
        say!("master key written to {}: pass it as --master-key (or $MNEME_MASTER_KEY); without it, sessions written with it cannot be read", out.display());
        return Ok(ExitCode::SUCCESS);
    }
    let signer = HeadSigner::generate(out)?;
    outln!("{}", signer.public_hex());
    Ok(ExitCode::SUCCESS)
}

/// Erases the session `a` names and, unless `--only-this`, every session
/// derived from it; or every session idle longer than its window, each
/// alone (a session derived from one and not idle is kept, and named).
/// Those that cannot be erased are named, and fail the command.
/// `mneme tenant …`.
async fn tenant(sessions: &dyn Sessions, action: crate::TenantAction) -> Result<ExitCode> {
    use crate::TenantAction;
    let checked = |name: &str| replay::tenant::check_name(name).map_err(|e| anyhow::anyhow!("{e}"));
    let cost = |cost: Option<f64>| match cost {
        Some(c) if !(c > 0.0 && c.is_finite()) => {
            bail!("--max-cost-per-day {c}: must be a positive number")
        }
        c => Ok(c),
    };
    match action {
        TenantAction::Add(a) => {
            checked(&a.name)?;
            let request = runtime::api::CreateTenant {
                name: a.name,
                max_cost_per_day: cost(a.max_cost_per_day)?,
                max_running_turns: a.max_running_turns,
                max_parallel_calls: a.max_parallel_calls,
                max_queued_turns: a.max_queued_turns,
            };
            runtime::limits_of(&request)
                .validate()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let issued = sessions.add_tenant(request, &a.by).await?;
            issued_token(&issued, a.json.json);
        }
        TenantAction::List(a) => {
            crate::render::tenants(&sessions.tenants().await?, a.json.json);
        }
        TenantAction::Set(a) => {
            checked(&a.name)?;
            let set = runtime::api::SetTenant {
                max_cost_per_day: match (a.no_max_cost_per_day, a.max_cost_per_day) {
                    (true, _) => Some(None),
                    (false, None) => None,
                    (false, given) => Some(cost(given)?),
                },
                max_running_turns: a.max_running_turns.map(|c| c.0),
                max_parallel_calls: a.max_parallel_calls.map(|c| c.0),
                max_queued_turns: a.max_queued_turns.map(|c| c.0),
            };
            runtime::limits_set(Default::default(), &set)
                .validate()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let view = sessions.set_tenant(&a.name, set, &a.by).await?;
            crate::render::tenants(&[view], a.json.json);
        }
        TenantAction::Token(a) => {
            checked(&a.name)?;
            issued_token(&sessions.issue_token(&a.name, &a.by).await?, a.json.json);
        }
        TenantAction::Revoke(a) => {
            checked(&a.name)?;
            let revoked = sessions.revoke_tokens(&a.name, &a.by).await?;
            match a.json.json {
                true => outln!("{}", to_json(&revoked)),
                false => say!(
                    "tenant {}: {} tokens revoked",
                    revoked.tenant,
                    revoked.revoked
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A token just issued: on stdout, alone (or as JSON), once; what it is
/// on stderr.
fn issued_token(issued: &runtime::api::TenantToken, json: bool) {
    match json {
        true => outln!("{}", to_json(issued)),
        false => {
            say!(
                "tenant {}: its token follows, shown this once (only its SHA-256 is kept): give it to the tenant as `Authorization: Bearer TOKEN`",
                issued.tenant
            );
            outln!("{}", issued.token);
        }
    }
}

async fn erase(sessions: &dyn Sessions, a: crate::EraseArgs) -> Result<ExitCode> {
    if let Some(tenant) = &a.tenant {
        replay::tenant::check_name(tenant).map_err(|e| anyhow::anyhow!("{e}"))?;
        let request = runtime::api::EraseTenant {
            reason: a.reason.clone().unwrap_or_default(),
            by: a.by.clone(),
        };
        let erased = sessions.erase_tenant(tenant, request).await?;
        let key = match erased.key_destroyed {
            true => "its key destroyed: every session of it is unreadable",
            false => "it had no key (no session of it was encrypted)",
        };
        say!("tenant {tenant}: erased, {key}; its tokens revoked");
        for id in &erased.erased {
            say!("session {id}: erased");
        }
        for failed in &erased.not_erased {
            runtime::warn_line!(
                "mneme: session {}: not erased on its own ({}); its content is unreadable all the same",
                failed.session,
                failed.error
            );
        }
        return Ok(match erased.not_erased.is_empty() {
            true => ExitCode::SUCCESS,
            false => ExitCode::FAILURE,
        });
    }
    let (ids, reason, cascade) = match (a.session, a.idle_for) {
        (Some(named), _) => (
            vec![named.resolve(sessions).await?],
            a.reason.unwrap_or_default(),
            !a.only_this,
        ),
        (None, Some(window)) => {
            let since = runtime::text::now_ms() - window.as_millis() as i64;
            let idle = sessions.list().await?.into_iter().filter(|row| {
                let last = chrono::DateTime::parse_from_rfc3339(&row.last_activity);
                row.status != SessionStatus::Erased
                    && last.is_ok_and(|t| t.timestamp_millis() < since)
            });
            let reason = a.reason.unwrap_or_else(|| {
                format!(
                    "retention: idle longer than {}",
                    runtime::text::window(window)
                )
            });
            let ids: Vec<Uuid> = idle.map(|row| row.session).collect();
            (ids, reason, false)
        }
        (None, None) => bail!("mneme erase needs a session, or --idle-for WINDOW"),
    };
    let mut code = ExitCode::SUCCESS;
    for &id in &ids {
        let request = Erase {
            reason: reason.clone(),
            by: a.by.clone(),
            cascade,
        };
        match sessions.erase(id, request).await {
            Ok(erased) => {
                say!("session {id}: erased");
                // A sweep says of the others only what still holds a copy
                // (those it reaches on their own are said then).
                let sweep = a.idle_for.is_some();
                let derived = erased.derived.iter().filter(|d| {
                    !(sweep
                        && (ids.contains(&d.session) || d.outcome == DerivedOutcome::AlreadyErased))
                });
                for line in derived.map(|d| erased_line(id, d)) {
                    match line {
                        Ok(line) => say!("{line}"),
                        Err(line) => {
                            runtime::warn_line!("{line}");
                            code = ExitCode::FAILURE;
                        }
                    }
                }
            }
            Err(e) => {
                runtime::warn_line!("mneme: session {id}: not erased: {e:#}");
                code = ExitCode::FAILURE;
            }
        }
    }
    Ok(code)
}

/// What became of session `derived`, derived from erased session `root`,
/// in a line: `Err` when it could not be erased (the command fails).
fn erased_line(root: Uuid, derived: &DerivedSession) -> Result<String, String> {
    let id = derived.session;
    let how = match derived.from == root {
        true => format!("a {} of {root}", derived.link),
        false => format!(
            "a {} of {}, derived from {root}",
            derived.link, derived.from
        ),
    };
    match derived.outcome {
        DerivedOutcome::Erased => Ok(format!("session {id}: erased with {root} ({how})")),
        DerivedOutcome::AlreadyErased => Ok(format!("session {id}: already erased ({how})")),
        DerivedOutcome::Kept => Ok(format!(
            "session {id}: still holds a copy of {root}'s content ({how}): not erased; \
             `mneme erase {id}` erases it"
        )),
        DerivedOutcome::Failed => Err(format!(
            "mneme: session {id}: still holds a copy of {root}'s content ({how}): not erased: {}",
            derived.error.as_deref().unwrap_or("unknown error")
        )),
    }
}

/// Runs `turn`, its streamed text shown on stdout as it comes unless
/// `quiet` (`--json`); whether any was shown.
async fn showing<T, F>(quiet: bool, turn: impl FnOnce(Stream) -> F) -> (Result<T>, bool)
where
    F: Future<Output = Result<T>>,
{
    let stream = (!quiet).then(|| Arc::new(StreamToStdout::default()));
    let result = turn(stream.clone()).await;
    let shown = stream.is_some_and(|s| s.finish());
    (result, shown)
}

/// Records `decision` on `call`, says it was `done` once it is recorded,
/// then reports how the session went on: the continued turn's end (its
/// text streamed unless `json`), or nothing more when it was not continued.
async fn decide(
    sessions: &dyn Sessions,
    (id, call): (Uuid, &str),
    decision: Decision,
    done: &str,
    json: bool,
) -> Result<ExitCode> {
    let quiet = json || !decision.proceeds();
    let asked_to_go_on = decision.proceeds();
    let recorded = || say!("session {id}: call {call} {done}");
    let turn = |stream| sessions.decide(id, call, decision, &recorded, stream);
    let (answer, streamed) = showing(quiet, turn).await;
    match answer? {
        DecisionAnswer::Ended(outcome) => report(&outcome, json, streamed),
        // Not continued: other calls still wait, or it was asked not to.
        DecisionAnswer::Decided(_) => {
            if !json {
                say_what_still_waits(sessions, id, asked_to_go_on).await;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Says that `resume --all` found nothing it may resume, and how many of
/// the sessions `rows` wait for a person instead.
fn say_nothing_to_resume(rows: &[runtime::api::SessionSummary]) {
    let waiting = (rows.iter())
        .filter(|r| r.waits_for_a_person == Some(true))
        .count();
    match waiting {
        0 => say!("mneme: nothing to resume"),
        1 => say!("mneme: nothing to resume without a person: 1 session waits for a decision (`mneme sessions` lists it, `mneme replay ID` says on what)"),
        n => say!("mneme: nothing to resume without a person: {n} sessions wait for a decision (`mneme sessions` lists them, `mneme replay ID` says on what)"),
    }
}

/// What the plan calls a call in doubt (`mneme resolve` settles it).
const IN_DOUBT: &[&str] = &["awaiting_decision"];
/// What the plan calls a call waiting for approval (`mneme approve`).
const TO_APPROVE: &[&str] = &["awaiting_approval"];

/// The call of session `id` that `given` names among its calls whose plan
/// decision is one of `kinds`: the whole id, or a start of one that no
/// other such call shares (a model's ids can be 32 random characters).
/// Several such calls beginning with it are refused, naming them; a text
/// that begins none is passed on as given, for the decision to refuse
/// naming what waits.
async fn waiting_call(
    sessions: &dyn Sessions,
    id: Uuid,
    given: &str,
    kinds: &[&str],
) -> Result<String> {
    let Ok(view) = sessions.replay(id).await else {
        return Ok(given.to_string());
    };
    let waiting: Vec<&runtime::api::PlannedCall> = (view.calls.iter())
        .filter(|c| kinds.contains(&c.decision.as_str()))
        .collect();
    if waiting.iter().any(|c| c.call_id == given) {
        return Ok(given.to_string());
    }
    let matching: Vec<&&runtime::api::PlannedCall> = (waiting.iter())
        .filter(|c| !given.is_empty() && c.call_id.starts_with(given))
        .collect();
    match matching.as_slice() {
        [one] => Ok(one.call_id.clone()),
        [] => Ok(given.to_string()),
        several => {
            let named: Vec<String> = (several.iter())
                .map(|c| format!("{} ({})", c.call_id, c.tool))
                .collect();
            bail!(
                "{} calls of session {id} that wait for a person begin with {given:?}: {}; give more of the id",
                several.len(),
                named.join(", ")
            )
        }
    }
}

/// Says, after a decision that did not continue session `id`, what still
/// waits for a person and the command for each, or (`asked_to_go_on`
/// false, nothing waiting) how it goes on.
async fn say_what_still_waits(sessions: &dyn Sessions, id: Uuid, asked_to_go_on: bool) {
    let Ok(view) = sessions.replay(id).await else {
        return;
    };
    let waiting: Vec<&runtime::api::PlannedCall> = (view.calls.iter())
        .filter(|c| {
            IN_DOUBT.contains(&c.decision.as_str()) || TO_APPROVE.contains(&c.decision.as_str())
        })
        .collect();
    match waiting.len() {
        0 if !asked_to_go_on => say!(
            "mneme: nothing else waits for a person: `mneme resume {id}` continues the session"
        ),
        0 => {}
        1 => say!("mneme: session {id} goes on once this call is decided too:"),
        n => say!("mneme: session {id} goes on once these {n} calls are decided too:"),
    }
    for call in waiting {
        let id_and_tool = format!("{} (call {})", call.tool, call.call_id);
        match IN_DOUBT.contains(&call.decision.as_str()) {
            true => {
                say!("  {id_and_tool}: {}", call.reason);
                say!(
                    "    mneme resolve {id} {} --retry | --skip --result JSON | --fail MSG",
                    call.call_id
                );
            }
            false => {
                say!("  {id_and_tool}: waits for approval");
                say!(
                    "    mneme approve {id} {} [--deny | --edit-args JSON]",
                    call.call_id
                );
            }
        }
    }
}

/// Prints how a turn ended and gives the exit code for it (see
/// [`report_end`]).
fn report(outcome: &TurnOutcome, json: bool, streamed: bool) -> Result<ExitCode> {
    let end = outcome.end().with_context(|| {
        format!(
            "the daemon answered an unknown turn end: {}",
            to_json(outcome)
        )
    })?;
    report_end(outcome.session, &end, json, streamed)
}

fn to_json(value: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).expect("API types serialize")
}

/// Streamed replies' text on stdout as it comes (see
/// [`runtime::text::StreamText`]).
#[derive(Default)]
pub(crate) struct StreamToStdout {
    text: runtime::text::StreamText,
    wrote: std::sync::atomic::AtomicBool,
}

impl StreamToStdout {
    /// Shows `piece` (what of it may be shown yet).
    pub(crate) fn show(&self, piece: &str) {
        self.print(&self.text.push(piece));
    }

    fn print(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.wrote.store(true, std::sync::atomic::Ordering::SeqCst);
        crate::out::write(text.as_bytes());
    }

    /// Shows what was held back and ends the line; whether anything was shown.
    pub(crate) fn finish(&self) -> bool {
        self.print(&self.text.finish());
        let wrote = self.wrote.load(std::sync::atomic::Ordering::SeqCst);
        if wrote {
            outln!();
        }
        wrote
    }
}

/// Prints how a drive ended and gives the exit code for it; the answer is
/// not printed again if it was `streamed` as it came.
fn report_end(id: Uuid, end: &TurnEnd, json: bool, streamed: bool) -> Result<ExitCode> {
    if json
        && matches!(
            end,
            TurnEnd::Answered(_)
                | TurnEnd::CutOffAnswer(_)
                | TurnEnd::NeedsDecision(_)
                | TurnEnd::NeedsApproval(_)
                | TurnEnd::Sleeping { .. }
        )
    {
        outln!("{}", store::turn_end(id, end));
    }
    match end {
        TurnEnd::Answered(answer) | TurnEnd::CutOffAnswer(answer) => {
            if !json && !streamed {
                outln!("{}", runtime::text::for_terminal_multiline(answer));
            }
            if matches!(end, TurnEnd::CutOffAnswer(_)) {
                say!("mneme: warning: session {id}: a token limit cut the answer off (finish_reason length): [model] max_tokens if the agent file sets one, else the server's own (llama.cpp: --n-predict); raise it for whole answers");
            }
            Ok(ExitCode::SUCCESS)
        }
        TurnEnd::NeedsDecision(calls) => {
            say!("mneme: session {id} paused: tool calls in doubt need a decision");
            for waiting in calls {
                let call = &waiting.call_id;
                say!("  {} (call {call}): {}", waiting.tool, waiting.reason);
                say!("    mneme resolve {id} {call} --retry | --skip --result JSON | --fail MSG");
            }
            Ok(ExitCode::from(EXIT_NEEDS_DECISION))
        }
        TurnEnd::NeedsApproval(calls) => {
            say!("mneme: session {id} paused: tool calls wait for approval");
            for waiting in calls {
                let call = &waiting.call_id;
                say!(
                    "  {call}: {} {}, with these arguments:",
                    waiting.tool,
                    waiting.reason
                );
                crate::approving::say_arguments(&waiting.arguments);
                crate::approving::say_description(&waiting.tool, &waiting.description);
                say!("    mneme approve {id} {call} [--deny | --edit-args JSON]");
            }
            Ok(ExitCode::from(EXIT_NEEDS_DECISION))
        }
        TurnEnd::Paused(reason) => {
            bail!("session {id} is paused ({reason}): `mneme resume {id}` continues it")
        }
        TurnEnd::BudgetSpent(reason) => {
            say!("mneme: session {id} paused: {reason}");
            say!("    mneme resume {id} --extend");
            Ok(ExitCode::from(EXIT_NEEDS_DECISION))
        }
        TurnEnd::Failed(error) => {
            bail!("session {id} failed earlier ({error}): `mneme resume {id}` tries again")
        }
        TurnEnd::Cancelled(by) => {
            bail!("session {id} was cancelled by {by}: a new message (`mneme run --session {id}`) reopens it")
        }
        TurnEnd::Sleeping { wakes_at_ms, event } => {
            say_sleeping(id, *wakes_at_ms, event.as_deref());
            Ok(ExitCode::from(crate::EXIT_SLEEPING))
        }
    }
}

/// Says when and how a sleeping session goes on.
fn say_sleeping(id: Uuid, wakes_at_ms: Option<i64>, event: Option<&str>) {
    let until = wakes_at_ms.map(runtime::api::format_time);
    match (event, &until) {
        (Some(event), Some(at)) => {
            say!("mneme: session {id} sleeps until event {event:?} arrives, at most until {at}")
        }
        (Some(event), None) => say!("mneme: session {id} sleeps until event {event:?} arrives"),
        (None, Some(at)) => say!("mneme: session {id} sleeps until {at}"),
        (None, None) => say!("mneme: session {id} sleeps"),
    }
    if let Some(event) = event {
        say!("    mneme wake {id} --event {event} [--payload JSON]   wakes it now");
    }
    match until {
        Some(at) => say!("    a daemon holding the store (`mneme serve`) wakes it then; or `mneme resume {id}` after {at}"),
        None => say!("    it goes on when the event is delivered (to a daemon: POST /sessions/{id}/wake)"),
    }
}
