//! What a command works on: the PostgreSQL store, the sled log opened
//! here, or the process that holds the data directory; and the daemon
//! `serve` starts on it.

use crate::remote::Remote;
use crate::{Cli, Command};
use anyhow::{bail, Context, Result};
use eventlog::{EventLog, SledLog};
use pglog::PgLog;
use runtime::store::HeadSigner;
use runtime::Tracer;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Makes what this process knows to be secret (the daemon token in the
/// environment, the store's password) redacted from everything it records
/// and prints.
pub(crate) fn register_secrets(cli: &Cli) {
    if let Ok(token) = std::env::var("MNEME_TOKEN") {
        runtime::text::register_secret(&token);
    }
    let given = cli.command.store().and_then(|o| o.store.as_deref());
    let store = (given.or(cli.store.as_deref())).and_then(|s| reqwest::Url::parse(s).ok());
    if let Some(encoded) = store.as_ref().and_then(|url| url.password()) {
        // As written in the address, and as the server gets it.
        runtime::text::register_secret(encoded);
        let decoded = percent_encoding::percent_decode_str(encoded).decode_utf8_lossy();
        runtime::text::register_secret(&decoded);
    }
}

/// Where a command's log is: opened here, or behind a running daemon.
pub(crate) enum Opened {
    /// The log, opened by this process.
    Log(Arc<dyn EventLog>),
    /// The daemon (or command) holding the data directory, through its API.
    Daemon(Remote),
}

/// Opens the sled log in `data_dir`, with `cache_bytes` of page cache, on
/// tokio's blocking pool: opening replays the write-ahead file and
/// checkpoints (reads, writes, fsyncs).
async fn open_sled(
    data_dir: &Path,
    cache_bytes: u64,
    holder: &str,
) -> Result<SledLog, eventlog::LogError> {
    let (dir, holder) = (data_dir.to_path_buf(), holder.to_string());
    tokio::task::spawn_blocking(move || SledLog::open_with(dir, &holder, cache_bytes))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Opens the PostgreSQL store `store` names, else the sled log in
/// `data_dir` (with `cache_bytes` of page cache) as `holder`; a data
/// directory a daemon holds is reached through it.
pub(crate) async fn open_log(
    store: &Option<String>,
    data_dir: &Path,
    cache_bytes: u64,
    command: &Command,
    holder: &str,
) -> Result<Opened> {
    if let Some(url) = store {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            bail!("--store {url:?}: expected a postgres:// address (the sled log is chosen with --data-dir)");
        }
        return Ok(Opened::Log(Arc::new(PgLog::connect(url).await?)));
    }
    let log = match open_sled(data_dir, cache_bytes, holder).await {
        Ok(log) => log,
        Err(eventlog::LogError::Locked { .. }) if !matches!(command, Command::Serve(_)) => {
            match beside_the_holder(data_dir, cache_bytes, holder).await? {
                Ok(remote) => return Ok(Opened::Daemon(remote)),
                Err(log) => log,
            }
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

/// How long a command waits for the process holding the data directory to
/// say where it answers (it does just after opening it), or to let go.
const HOLDER_WAIT: Duration = Duration::from_secs(3);

/// Reaches the data directory another process holds: through it (a daemon,
/// or a command answering reads, once it has said where), or opened here
/// if it lets go within [`HOLDER_WAIT`].
async fn beside_the_holder(
    data_dir: &Path,
    cache_bytes: u64,
    holder: &str,
) -> Result<std::result::Result<Remote, SledLog>> {
    let deadline = std::time::Instant::now() + HOLDER_WAIT;
    loop {
        if let Some(remote) = Remote::discover(data_dir)? {
            return Ok(Ok(remote));
        }
        match open_sled(data_dir, cache_bytes, holder).await {
            Ok(log) => return Ok(Err(log)),
            Err(eventlog::LogError::Locked { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(eventlog::LogError::Locked { dir, holder }) => bail!(
                "the data directory {dir} is in use by another process ({holder}): wait for it to finish, or run sessions under `mneme serve`, which takes any number of commands side by side"
            ),
            Err(e) => return Err(e.into()),
        }
    }
}

/// What `serve` takes from the global options.
pub(crate) struct ServeSettings<'a> {
    pub(crate) signer: Option<Arc<HeadSigner>>,
    pub(crate) tracer: Option<Arc<Tracer>>,
    pub(crate) data_dir: &'a Path,
    pub(crate) durability: eventlog::Durability,
    pub(crate) snapshot_every: u64,
    pub(crate) lease_ttl: Duration,
}

pub(crate) async fn serve(
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
        max_running_turns: a.max_running_turns.unwrap_or(usize::MAX),
        header_timeout: Duration::from_secs(a.header_timeout_secs),
        idle_timeout: Duration::from_secs(a.idle_timeout_secs),
        max_connections: a.max_connections,
        owner: runtime::control::owner_name("daemon"),
        lease_ttl: settings.lease_ttl,
        signer: settings.signer,
        retain: a.retain,
        tracer: settings.tracer,
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

/// `$XDG_DATA_HOME/mneme`, else `~/.local/share/mneme`, else `./.mneme`.
pub(crate) fn default_data_dir() -> PathBuf {
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("mneme");
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/share/mneme"),
        None => PathBuf::from(".mneme"),
    }
}
