//! The commands: each opens the log, does one thing, prints, and returns an
//! exit code.

use crate::{Cli, Command, JsonFlag, EXIT_NEEDS_DECISION};
use anyhow::{bail, Context, Result};
use eventlog::{EventLog, SledLog};
use pglog::PgLog;
use runtime::agent::load_agent_file;
use runtime::lease::HeldLease;
use runtime::pause;
use runtime::runner::StopCheck;
use runtime::service::{self, Service};
use runtime::{views, Session, TurnEnd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Runs the command `cli` names; `holder` names this process in the data
/// directory's holder note.
pub async fn dispatch(cli: Cli, holder: &str) -> Result<ExitCode> {
    register_secrets(&cli);
    let data_dir = cli.data_dir.clone().unwrap_or_else(default_data_dir);
    let durability = cli.durability;
    let lease_ttl = Duration::from_millis(cli.lease_ttl_ms.max(100));
    let snapshot_every = cli
        .snapshot_every
        .unwrap_or(runtime::snapshot::DEFAULT_EVERY);
    match cli.command {
        Command::Demo(args) => crate::demo::run(args.keep).await,
        command => {
            let log = match open_log(&cli.store, &data_dir, &command, holder).await? {
                Opened::Log(log) => log,
                Opened::Daemon(client) => return client.dispatch(command).await,
            };
            let ctx = Ctx {
                service: Service::new(log, durability).snapshot_every(snapshot_every),
                owner: runtime::lease::owner_name("cli"),
                lease_ttl,
            };
            match command {
                Command::Run(a) => ctx.run(a.agent, a.session, a.message, a.json).await,
                Command::Resume(a) => ctx.resume(a.session, a.extend, a.json).await,
                Command::Sessions(a) => ctx.sessions(a).await,
                Command::Log(a) => {
                    crate::timeline::print(&crate::timeline::rows(ctx.log(), a.session).await?, &a)
                }
                Command::Verify(a) => ctx.verify(a.session, a.json).await,
                Command::Replay(a) => ctx.replay(a.session, a.raw, a.json.json).await,
                Command::Resolve(a) => ctx.resolve(a).await,
                Command::Approve(a) => ctx.approve(a).await,
                Command::Export(a) => ctx.export(a).await,
                Command::Import(a) => ctx.import(a).await,
                Command::Serve(a) => {
                    let log = ctx.service.log().clone();
                    let settings = ServeSettings {
                        data_dir: &data_dir,
                        durability,
                        snapshot_every,
                        lease_ttl,
                    };
                    serve(log, settings, a).await
                }
                Command::Demo(_) => unreachable!("handled above"),
            }
        }
    }
}

/// Makes what this process knows to be secret (the daemon token in the
/// environment, the store's password) redacted from everything it records
/// and prints.
fn register_secrets(cli: &Cli) {
    if let Ok(token) = std::env::var("MNEME_TOKEN") {
        runtime::text::register_secret(&token);
    }
    let store = cli
        .store
        .as_deref()
        .and_then(|s| reqwest::Url::parse(s).ok());
    if let Some(encoded) = store.as_ref().and_then(|url| url.password()) {
        // As written in the address, and as the server gets it.
        runtime::text::register_secret(encoded);
        let decoded = percent_encoding::percent_decode_str(encoded).decode_utf8_lossy();
        runtime::text::register_secret(&decoded);
    }
}

/// Where a command's log is: opened here, or behind a running daemon.
enum Opened {
    Log(Arc<dyn EventLog>),
    Daemon(crate::client::Client),
}

/// Opens the sled log in `data_dir` on tokio's blocking pool: opening
/// replays the write-ahead file and checkpoints (reads, writes, fsyncs).
async fn open_sled(data_dir: &Path, holder: &str) -> Result<SledLog, eventlog::LogError> {
    let (dir, holder) = (data_dir.to_path_buf(), holder.to_string());
    tokio::task::spawn_blocking(move || SledLog::open_as(dir, &holder))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Opens the PostgreSQL store `store` names, else the sled log in
/// `data_dir` as `holder`; a data directory a daemon holds is reached
/// through it.
async fn open_log(
    store: &Option<String>,
    data_dir: &Path,
    command: &Command,
    holder: &str,
) -> Result<Opened> {
    if let Some(url) = store {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            bail!("--store {url:?}: expected a postgres:// address (the sled log is chosen with --data-dir)");
        }
        return Ok(Opened::Log(Arc::new(PgLog::connect(url).await?)));
    }
    let log = match open_sled(data_dir, holder).await {
        Ok(log) => log,
        Err(eventlog::LogError::Locked { .. }) if !matches!(command, Command::Serve(_)) => {
            if let Some(client) = crate::client::Client::discover(data_dir)? {
                return Ok(Opened::Daemon(client));
            }
            open_sled(data_dir, holder).await?
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(torn) = log.torn_tail() {
        runtime::warn_line!(
            "mneme: warning: the write-ahead file ended in a partial write ({} bytes, never acknowledged); moved to {}",
            torn.bytes,
            torn.saved_to.display()
        );
    }
    Ok(Opened::Log(Arc::new(log)))
}

/// What `serve` takes from the global options.
struct ServeSettings<'a> {
    data_dir: &'a Path,
    durability: eventlog::Durability,
    snapshot_every: u64,
    lease_ttl: Duration,
}

async fn serve(
    log: Arc<dyn EventLog>,
    settings: ServeSettings<'_>,
    a: crate::ServeArgs,
) -> Result<ExitCode> {
    std::fs::create_dir_all(settings.data_dir)
        .with_context(|| format!("creating {}", settings.data_dir.display()))?;
    let (token, token_file) = token(settings.data_dir, a.token_file)?;
    runtime::text::register_secret(&token);
    let config = daemon::DaemonConfig {
        listen: a.listen,
        allow_public: a.allow_public,
        data_dir: settings.data_dir.to_path_buf(),
        token,
        token_file,
        agents_dir: a.agents,
        durability: settings.durability,
        snapshot_every: settings.snapshot_every,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
        max_body_bytes: a.max_body_bytes,
        max_parallel_calls: a.max_parallel_calls,
        header_timeout: Duration::from_secs(a.header_timeout_secs),
        idle_timeout: Duration::from_secs(a.idle_timeout_secs),
        max_connections: a.max_connections,
        owner: runtime::lease::owner_name("daemon"),
        lease_ttl: settings.lease_ttl,
    };
    daemon::serve(log, config).await?;
    Ok(ExitCode::SUCCESS)
}

/// The daemon's token: from `--token-file`, else `$MNEME_TOKEN`, else a new
/// random one written to `DATA_DIR/mneme.token`, readable by this user only.
/// A given token must be long enough, and its file private.
fn token(data_dir: &std::path::Path, file: Option<PathBuf>) -> Result<(String, Option<PathBuf>)> {
    use daemon::token;
    if let Some(file) = file {
        return Ok((token::read_file(&file)?, Some(file)));
    }
    let given = std::env::var("MNEME_TOKEN").unwrap_or_default();
    if !token::trimmed(&given).is_empty() {
        return Ok((token::checked(&given, "$MNEME_TOKEN")?, None));
    }
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut random = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
    let token = hex::encode(random);
    let path = data_dir.join("mneme.token");
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    file.write_all(token.as_bytes())?;
    runtime::log_line!(
        "mneme serve: generated a token in {} (readable by this user only)",
        path.display()
    );
    Ok((token, Some(path)))
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

/// `$XDG_DATA_HOME/mneme`, else `~/.local/share/mneme`, else `./.mneme`.
fn default_data_dir() -> PathBuf {
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("mneme");
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/share/mneme"),
        None => PathBuf::from(".mneme"),
    }
}

struct Ctx {
    service: Service,
    /// This process as a lease owner.
    owner: String,
    lease_ttl: Duration,
}

impl Ctx {
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
        Ok(HeldLease::acquire_after_exited(log, id, &self.owner, self.lease_ttl).await?)
    }

    async fn export(&self, a: crate::ExportArgs) -> Result<ExitCode> {
        let ids = match a.session {
            Some(id) => {
                self.service.ensure_exists(id).await?;
                vec![id]
            }
            None => self.session_ids().await?,
        };
        let mut out: Box<dyn std::io::Write + Send> = match &a.output {
            Some(path) => Box::new(std::io::BufWriter::new(private_output(path)?)),
            None => Box::new(std::io::BufWriter::new(std::io::stdout())),
        };
        let written = runtime::transfer::export(self.log(), &ids, &mut out).await?;
        say!("exported {written} records of {} sessions", ids.len());
        Ok(ExitCode::SUCCESS)
    }

    async fn import(&self, a: crate::ImportArgs) -> Result<ExitCode> {
        let mut input: Box<dyn std::io::BufRead + Send> = match &a.input {
            Some(path) => Box::new(std::io::BufReader::new(
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
            )),
            None => Box::new(std::io::BufReader::new(std::io::stdin())),
        };
        let origin = a
            .input
            .as_ref()
            .map_or("stdin".to_string(), |p| p.display().to_string());
        let done = runtime::transfer::import(self.log(), &mut input)
            .await
            .with_context(|| format!("importing {origin}"))?;
        self.log().barrier(eventlog::Durability::Synced).await?;
        for id in &done.sessions {
            self.log().verify(*id).await?;
        }
        say!(
            "imported {} records into {} sessions ({} already held); every chain verifies",
            done.records,
            done.sessions.len(),
            done.already_held
        );
        Ok(ExitCode::SUCCESS)
    }

    async fn session_ids(&self) -> Result<Vec<Uuid>> {
        Ok(self
            .log()
            .sessions()
            .await?
            .into_iter()
            .map(|m| m.session)
            .collect())
    }

    async fn run(
        &self,
        agent: Option<PathBuf>,
        id: Option<Uuid>,
        message: String,
        json: JsonFlag,
    ) -> Result<ExitCode> {
        let id = match (id, agent) {
            (Some(id), _) => id,
            (None, Some(path)) => self.service.create(load_agent_file(&path)?).await?.id(),
            (None, None) => bail!(
                "mneme run needs --agent FILE to start a session, or --session ID to continue one"
            ),
        };
        say!("session {id}");
        let lease = self.hold(id).await?;
        let mut session = self.service.load(id).await?;
        self.service.post_message(&mut session, message).await?;
        self.drive_then_release(lease, &mut session, json.json, true)
            .await
    }

    /// Drives the session to the end of its turn. A pause asked for through
    /// a daemon sharing the store (addressed to `lease`) stops it between
    /// steps, as it would a daemon's turn.
    async fn drive(
        &self,
        session: &mut Session,
        lease: &HeldLease,
        json: bool,
    ) -> Result<ExitCode> {
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
        let stream = Arc::new(StreamToStdout::default());
        if !json {
            let sink = stream.clone();
            runner = runner.with_deltas(Arc::new(move |_, text| sink.show(text)));
        }
        let end = runner.drive(session).await;
        let shown = stream.finish();
        let end = end.with_context(|| format!("session {}", session.id()))?;
        report_end(session.id(), &end, json, shown)
    }

    async fn resume(&self, id: Option<Uuid>, extend: bool, json: JsonFlag) -> Result<ExitCode> {
        let ids = match id {
            Some(id) => vec![id],
            None => self.service.resumable().await?,
        };
        let mut worst = ExitCode::SUCCESS;
        for id in ids {
            let lease = self.hold(id).await?;
            let mut session = self.service.load(id).await?;
            self.service
                .reopen(&mut session, "mneme resume", extend)
                .await?;
            say!("session {id}");
            let code = self
                .drive_then_release(lease, &mut session, json.json, true)
                .await?;
            if code != ExitCode::SUCCESS {
                worst = code;
            }
        }
        Ok(worst)
    }

    async fn sessions(&self, json: JsonFlag) -> Result<ExitCode> {
        let mut rows = Vec::new();
        for (meta, summary) in self.service.listing().await? {
            rows.push(views::session_row(&meta, summary));
        }
        crate::render::sessions(&rows, json.json);
        Ok(ExitCode::SUCCESS)
    }

    async fn verify(&self, id: Option<Uuid>, json: JsonFlag) -> Result<ExitCode> {
        let ids = match id {
            Some(id) => vec![id],
            None => self.session_ids().await?,
        };
        let mut results: Vec<serde_json::Value> = Vec::with_capacity(ids.len());
        for id in &ids {
            results.push(views::verify(self.log(), *id).await);
        }
        Ok(crate::render::verify(&results, json.json))
    }

    async fn replay(&self, id: Uuid, raw: bool, json: bool) -> Result<ExitCode> {
        let mut session = self.service.load(id).await?;
        if raw {
            use std::io::Write;
            std::io::stdout().write_all(&session.next_request()?.to_vec())?;
            return Ok(ExitCode::SUCCESS);
        }
        crate::render::replay(&views::replay(id, session.state()), json)?;
        Ok(ExitCode::SUCCESS)
    }

    async fn approve(&self, a: crate::ApproveArgs) -> Result<ExitCode> {
        let lease = self.hold(a.session).await?;
        let mut session = self.service.load(a.session).await?;
        let can_continue = self
            .service
            .decide_approval(&mut session, &a.call_id, !a.deny, &a.decision.by)
            .await?;
        let verb = if a.deny { "denied" } else { "approved" };
        say!("session {}: call {} {verb}", a.session, a.call_id);
        let go_on = can_continue && !a.decision.no_resume;
        self.drive_then_release(lease, &mut session, a.decision.json.json, go_on)
            .await
    }

    async fn resolve(&self, a: crate::ResolveArgs) -> Result<ExitCode> {
        let lease = self.hold(a.session).await?;
        let mut session = self.service.load(a.session).await?;
        let resolution = service::resolution(a.retry, a.result.as_deref(), a.fail.as_deref())
            .map_err(|e| anyhow::anyhow!(e))?;
        let can_continue = self
            .service
            .resolve(&mut session, &a.call_id, resolution, &a.decision.by)
            .await?;
        say!("session {}: call {} resolved", a.session, a.call_id);
        let go_on = can_continue && !a.decision.no_resume;
        self.drive_then_release(lease, &mut session, a.decision.json.json, go_on)
            .await
    }

    /// Drives the session (if `go_on`) to the end of its turn, then gives
    /// its lease up. On an error the lease is dropped instead, and lapses at
    /// once: a daemon sharing the store may take the session over.
    async fn drive_then_release(
        &self,
        lease: HeldLease,
        session: &mut Session,
        json: bool,
        go_on: bool,
    ) -> Result<ExitCode> {
        let code = if go_on {
            match self.drive(session, &lease, json).await {
                Ok(code) => code,
                Err(e) => {
                    lease.lapse().await;
                    return Err(e);
                }
            }
        } else {
            ExitCode::SUCCESS
        };
        lease.release().await;
        Ok(code)
    }
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
        use std::io::Write as _;
        if text.is_empty() {
            return;
        }
        self.wrote.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }

    /// Shows what was held back and ends the line; whether anything was shown.
    pub(crate) fn finish(&self) -> bool {
        self.print(&self.text.finish());
        let wrote = self.wrote.load(std::sync::atomic::Ordering::SeqCst);
        if wrote {
            println!();
        }
        wrote
    }
}

/// Prints how a drive ended and gives the exit code for it; the answer is
/// not printed again if it was `streamed` as it came.
pub fn report_end(id: Uuid, end: &TurnEnd, json: bool, streamed: bool) -> Result<ExitCode> {
    if json
        && matches!(
            end,
            TurnEnd::Answered(_)
                | TurnEnd::CutOffAnswer(_)
                | TurnEnd::NeedsDecision(_)
                | TurnEnd::NeedsApproval(_)
        )
    {
        println!("{}", views::turn_end(id, end));
    }
    match end {
        TurnEnd::Answered(answer) | TurnEnd::CutOffAnswer(answer) => {
            if !json && !streamed {
                println!("{}", runtime::text::for_terminal_multiline(answer));
            }
            if matches!(end, TurnEnd::CutOffAnswer(_)) {
                say!("mneme: warning: session {id}: the token limit cut the answer off (finish_reason length); raise [model] max_tokens for whole answers");
            }
            Ok(ExitCode::SUCCESS)
        }
        TurnEnd::NeedsDecision(calls) => {
            say!("mneme: session {id} paused: tool calls in doubt need a decision");
            for (call, reason) in calls {
                say!("  {call}: {reason}");
                say!("    mneme resolve {id} {call} --retry | --skip --result JSON | --fail MSG");
            }
            Ok(ExitCode::from(EXIT_NEEDS_DECISION))
        }
        TurnEnd::NeedsApproval(calls) => {
            say!("mneme: session {id} paused: tool calls wait for approval");
            for (call, tool) in calls {
                say!("  {call}: {tool} requires approval");
                say!("    mneme approve {id} {call} [--deny]");
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
    }
}
