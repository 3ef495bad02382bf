//! `mneme`: the command-line face of the runtime.

/// Prints one line to stderr in a single write. Scripts (and the crash
/// tests) read lines such as `session ID`; `eprintln!` writes a line in
/// pieces, so a process killed mid-line could leave `session ` alone. Text
/// from outside in it (server errors, call ids) can neither forge lines nor
/// drive the terminal, and known secrets are redacted.
macro_rules! say {
    ($($arg:tt)*) => {
        runtime::text::say(&format!($($arg)*))
    };
}

#[macro_use]
mod out;
mod commands;
mod demo;
mod diff;
mod local;
mod reader;
mod remote;
mod render;
mod sessions;
mod timeline;
mod ui;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use sessions::SessionRef;
use std::path::PathBuf;
use std::process::ExitCode;

/// An event-sourced agent runtime: every agent session is an append-only,
/// hash-chained log; kill it at any instant and it resumes from the log,
/// never running a committed side effect twice.
#[derive(Parser)]
#[command(name = "mneme", version, propagate_version = true)]
struct Cli {
    /// Data directory holding the event log (sled), and the daemon's token
    /// and address files.
    #[arg(long, env = "MNEME_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// Keep the event log in PostgreSQL instead of the data directory:
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?schema=NAME]`, with
    /// `&sslmode=require[&sslrootcert=FILE]` for TLS. Several daemons may
    /// share one store.
    #[arg(long, env = "MNEME_STORE", global = true)]
    store: Option<String>,
    /// MiB of the sled log's page cache, counted as sled counts it: the
    /// bytes its pages take on disk, compressed (the process holds more
    /// for them). Pages of records read stay in memory up to this; sled
    /// evicts in batches, so a process may hold up to ~16,000 more pages
    /// than the cache before it catches up. Appends need little of it.
    #[arg(
        long,
        env = "MNEME_SLED_CACHE_MIB",
        default_value_t = eventlog::DEFAULT_CACHE_BYTES >> 20,
        value_parser = clap::value_parser!(u64).range(1..=1 << 20),
        global = true
    )]
    sled_cache_mib: u64,
    /// Milliseconds a session's lease lasts unless renewed: how soon another
    /// daemon on the same store takes over the sessions of one that died.
    #[arg(
        long,
        env = "MNEME_LEASE_TTL_MS",
        default_value_t = 15_000,
        global = true
    )]
    lease_ttl_ms: u64,
    /// What a write-ahead barrier waits for: `synced` (fdatasync: survives
    /// power loss), `flushed` (survives a process crash) or `buffered`.
    #[arg(
        long,
        env = "MNEME_DURABILITY",
        default_value = "synced",
        global = true
    )]
    durability: eventlog::Durability,
    /// Sign each session's head at the end of each turn with the ed25519
    /// key in this file (see `mneme keygen`; keep it outside the data
    /// directory): `mneme verify --key PUB` then tells a rewritten history.
    #[arg(long, env = "MNEME_SIGNING_KEY", global = true)]
    signing_key: Option<PathBuf>,
    /// Encrypt new sessions at rest, each under a key of its own wrapped
    /// by the master key in this file (see `mneme keygen --master`; keep
    /// it outside the data directory), so `mneme erase` can destroy their
    /// content. Needed to read sessions written with it.
    #[arg(long, env = "MNEME_MASTER_KEY", global = true)]
    master_key: Option<PathBuf>,
    /// Send a trace of each turn this process runs (`run`, `resume`, the
    /// daemon's) to an OpenTelemetry collector: OTLP over HTTP, protobuf,
    /// POSTed to URL/v1/traces. Spans follow the GenAI semantic
    /// conventions; a collector that is down costs a warning, never a turn.
    #[arg(long, env = "MNEME_OTLP_ENDPOINT", global = true, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// Put messages, tool arguments and results in the traces (each
    /// clipped to 4 KiB). Off by default: spans carry names, ids, tokens,
    /// timings and outcomes only.
    #[arg(long, env = "MNEME_OTLP_CONTENT", global = true)]
    otlp_content: bool,
    /// Snapshot a session's state every N events (0: never). Default: every
    /// 1000 events for agents with a context window (their state stays
    /// small), never otherwise. Snapshots only make resume faster.
    #[arg(long, env = "MNEME_SNAPSHOT_EVERY", global = true)]
    snapshot_every: Option<u64>,
    /// How log events (the daemon's, warnings) go to stderr: `human`
    /// lines or `json` objects, one a line. A command's own lines (the
    /// session id, its answer) are not log events.
    #[arg(long, env = "MNEME_LOG_FORMAT", default_value = "human", global = true)]
    log_format: runtime::text::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a session (or continue one) and run the agent until it answers.
    /// Prints the answer on stdout and the session id on stderr.
    Run(RunArgs),
    /// Continue unfinished sessions from their logs.
    Resume(ResumeArgs),
    /// List sessions with status, events and last activity.
    Sessions(JsonFlag),
    /// Show a session's audit trail as a timeline.
    Log(LogArgs),
    /// Check hash chains; exits non-zero naming the first bad seq.
    Verify(VerifyArgs),
    /// Dry run: the rebuilt prompt and the resume plan, running nothing.
    Replay(ReplayArgs),
    /// Start a new session holding another's first events (up to --at),
    /// to run on from there.
    Fork(ForkArgs),
    /// Where two sessions (a session and its fork) hold the same events,
    /// where they part, and what differs after.
    Diff(DiffArgs),
    /// Re-run a session's user messages on another agent in a new session
    /// linked to it: calls matching a recorded one are answered from the
    /// record; side effects with none run only with --live-tools. Prints
    /// where the two sessions' requests first differ, both answers to each
    /// message, tokens, cost and cache hit ratios.
    Rerun(RerunArgs),
    /// Write the bytes of binary content a tool returned by reference (its
    /// event records the SHA-256) to stdout or --output.
    Blob(BlobArgs),
    /// Decide what to do with a tool call in doubt, then continue the session.
    Resolve(ResolveArgs),
    /// Approve (or deny) a tool call that waits for approval, then continue.
    Approve(ApproveArgs),
    /// Write sessions' records as JSON lines (envelopes, hashes and the
    /// exact stored bytes), to stdout or --output.
    Export(ExportArgs),
    /// Read JSON lines written by `export` into this store, checking every
    /// hash and chain link; the way from sled to PostgreSQL.
    Import(ImportArgs),
    /// A self-contained story: a crash mid-run, a resume, and proof that
    /// every side effect happened exactly once. Needs no network.
    Demo(DemoArgs),
    /// Run the daemon: an HTTP API over many sessions that resumes
    /// unfinished ones on start. Token: --token-file, else $MNEME_TOKEN,
    /// else a new one written to DATA_DIR/mneme.token (mode 0600).
    Serve(ServeArgs),
    /// Write a new ed25519 signing key to FILE (outside the data directory,
    /// readable by its owner only) and print its public key, for
    /// `--signing-key FILE` and `mneme verify --key PUB`.
    Keygen(KeygenArgs),
    /// Erase a session's content for good (its key is destroyed): its
    /// shape stays and its chain still verifies; nothing runs in it again.
    /// With --idle-for instead of a session: every session idle that long.
    Erase(EraseArgs),
    /// Sign a browser in to the web view of the daemon that holds the data
    /// directory: prints a link with a one-time code (valid once, for two
    /// minutes), the token never in it.
    Ui(UiArgs),
}

#[derive(Args)]
struct KeygenArgs {
    /// Where to write the key (never overwritten).
    #[arg(long)]
    out: PathBuf,
    /// Write a master key for `--master-key` (encryption at rest) instead
    /// of a signing key.
    #[arg(long)]
    master: bool,
}

#[derive(Args)]
struct EraseArgs {
    /// The session to erase.
    #[arg(required_unless_present = "idle_for", conflicts_with = "idle_for")]
    session: Option<SessionRef>,
    /// Erase every session idle longer than this (`30d`, `12h`): a
    /// retention sweep, for a schedule (`mneme serve --retain` runs one).
    #[arg(long, value_parser = runtime::text::parse_window)]
    idle_for: Option<std::time::Duration>,
    /// Why (recorded). Default for --idle-for: the retention window.
    #[arg(long, required_unless_present = "idle_for")]
    reason: Option<String>,
    /// Who asks (recorded in the log).
    #[arg(long, env = "USER", default_value = "unknown")]
    by: String,
}

#[derive(Args)]
struct UiArgs {
    /// Open the link in a browser ($BROWSER, else xdg-open).
    #[arg(long)]
    open: bool,
    /// Print only the link.
    #[arg(long)]
    print_url: bool,
    /// The name the browser acts as, recorded as who decided what it
    /// decides (default: $USER).
    #[arg(long = "as", value_name = "NAME")]
    name: Option<String>,
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: std::net::SocketAddr,
    /// Allow a --listen address other hosts can reach. The API is plain
    /// HTTP: put a TLS proxy in front of it, or keep it to a trusted network.
    #[arg(long)]
    allow_public: bool,
    /// File holding the bearer token (at least 16 bytes; readable by its
    /// owner only).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Directory of agent files that sessions can be created from by name.
    #[arg(long)]
    agents: Option<PathBuf>,
    /// Erase sessions idle longer than this (`30d`, `12h`), checked about
    /// every tenth of it (at most hourly). Needs sessions written with
    /// --master-key.
    #[arg(long, value_parser = runtime::text::parse_window)]
    retain: Option<std::time::Duration>,
    /// Seconds a shutdown waits for running turns to reach a step boundary.
    #[arg(long, default_value_t = 10)]
    shutdown_grace: u64,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Tool calls running at once across every session of the daemon
    /// (each agent also has its own `max_parallel_calls`, default 8).
    #[arg(long, default_value_t = 64)]
    max_parallel_calls: usize,
    /// Seconds a client has to send a request's head: from connecting for
    /// the first request, from its first byte for a later one.
    #[arg(
        long,
        default_value_t = daemon::DEFAULT_HEADER_TIMEOUT_SECS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    header_timeout_secs: u64,
    /// Seconds a keep-alive connection may wait for its next request.
    #[arg(
        long,
        default_value_t = daemon::DEFAULT_IDLE_TIMEOUT_SECS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    idle_timeout_secs: u64,
    /// Connections open at most, lowered to what the open-file limit leaves
    /// room for. At the cap, the connection quiet the longest is closed to
    /// admit a new one; those with a request under way never are.
    #[arg(
        long,
        default_value_t = daemon::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    max_connections: usize,
}

#[derive(Args)]
struct JsonFlag {
    /// One JSON object a line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RunArgs {
    /// The agent file (TOML). Optional with --session: a session keeps the
    /// spec it started with.
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Continue this session instead of starting a new one.
    #[arg(long)]
    session: Option<SessionRef>,
    /// Adopt the tools the session's MCP servers list now (recorded, with
    /// what changed); without it a session keeps the tools it started with.
    #[arg(long, requires = "session")]
    refresh_tools: bool,
    /// The user's message.
    message: String,
    #[command(flatten)]
    json: JsonFlag,
}

#[derive(Args)]
struct ResumeArgs {
    /// The session to continue.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    session: Option<SessionRef>,
    /// Continue every session that has pending work (not those that
    /// spent a budget: they need --extend, one by one).
    #[arg(long)]
    all: bool,
    /// Start the turn's budgets (`[limits]` in the agent file) again: a
    /// session paused on a spent budget continues only with this.
    #[arg(long, requires = "session")]
    extend: bool,
    #[command(flatten)]
    json: JsonFlag,
}

#[derive(Args)]
struct LogArgs {
    /// The session.
    session: SessionRef,
    /// Only events of these kinds (e.g. ToolStarted); repeatable.
    #[arg(long)]
    kind: Vec<String>,
    /// Only events about calls of this tool.
    #[arg(long)]
    tool: Option<String>,
    /// Only events at or after this time: RFC 3339, or an age such as 10m, 2h, 1d.
    #[arg(long)]
    since: Option<String>,
    #[command(flatten)]
    json: JsonFlag,
}

#[derive(Args)]
struct VerifyArgs {
    /// Only this session (default: every session).
    session: Option<SessionRef>,
    /// Also check every signed head against this public key (hex, or a file
    /// holding it): each must be its, and match the record it names; a
    /// session without one fails.
    #[arg(long)]
    key: Option<String>,
    #[command(flatten)]
    json: JsonFlag,
}

#[derive(Args)]
struct ReplayArgs {
    /// The session.
    session: SessionRef,
    /// Print only the exact bytes of the next model request.
    #[arg(long, conflicts_with = "json")]
    raw: bool,
    #[command(flatten)]
    json: JsonFlag,
}

#[derive(Args)]
struct ForkArgs {
    /// The session to fork.
    session: SessionRef,
    /// The seq of its last event the fork holds.
    #[arg(long)]
    at: u64,
    /// Run the fork with this agent file from there on (another model,
    /// prompt or tools); recorded in the fork.
    #[arg(long)]
    agent: Option<PathBuf>,
    #[command(flatten)]
    json: JsonFlag,
}

#[derive(Args)]
struct DiffArgs {
    /// One session.
    a: SessionRef,
    /// The other.
    b: SessionRef,
    #[command(flatten)]
    json: JsonFlag,
}

#[derive(Args)]
struct RerunArgs {
    /// The recorded session to re-run.
    session: SessionRef,
    /// The agent file to re-run it with (another model, prompt or tools).
    #[arg(long)]
    agent: PathBuf,
    /// Run calls no record answers even when they have side effects (by
    /// default only read-only tools run; the others are told they were not
    /// run).
    #[arg(long)]
    live_tools: bool,
    #[command(flatten)]
    json: JsonFlag,
}

#[derive(Args)]
struct BlobArgs {
    /// The session.
    session: SessionRef,
    /// The blob's SHA-256 (hex), as `mneme log` shows it.
    digest: String,
    /// Write here instead of stdout.
    #[arg(long)]
    output: Option<PathBuf>,
}

/// What every decision on a call takes besides the decision itself.
#[derive(Args)]
struct Decision {
    /// Who decides (recorded in the log).
    #[arg(long, env = "USER", default_value = "unknown")]
    by: String,
    /// Record the decision but do not continue the session.
    #[arg(long)]
    no_resume: bool,
    #[command(flatten)]
    json: JsonFlag,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("decision").required(true).args(["retry", "skip", "fail"])))]
struct ResolveArgs {
    /// The session.
    session: SessionRef,
    /// The call in doubt.
    call_id: String,
    /// Run the call again (accepting the risk of a duplicate effect).
    #[arg(long)]
    retry: bool,
    /// Do not run it; give the model the result given with --result.
    #[arg(long, requires = "result")]
    skip: bool,
    /// The result (JSON) for --skip.
    #[arg(long)]
    result: Option<String>,
    /// Do not run it; tell the model it failed with this message.
    #[arg(long, value_name = "MSG")]
    fail: Option<String>,
    #[command(flatten)]
    decision: Decision,
}

#[derive(Args)]
struct ApproveArgs {
    /// The session.
    session: SessionRef,
    /// The call waiting for approval.
    call_id: String,
    /// Deny it: the tool never runs and the model is told.
    #[arg(long)]
    deny: bool,
    /// Approve it with these arguments (JSON) instead of the model's: the
    /// tool runs with them, recorded with who changed them, and the model
    /// is told.
    #[arg(long, value_name = "JSON", conflicts_with = "deny")]
    edit_args: Option<String>,
    #[command(flatten)]
    decision: Decision,
}

#[derive(Args)]
struct ExportArgs {
    /// Only this session (default: every session).
    session: Option<SessionRef>,
    /// Write here instead of stdout.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct ImportArgs {
    /// The file to read (default: stdin).
    input: Option<PathBuf>,
}

#[derive(Args)]
struct DemoArgs {
    /// Keep the demo's data directory here instead of a temporary one.
    #[arg(long)]
    keep: Option<PathBuf>,
}

/// Exit code of a run that stopped on calls in doubt.
const EXIT_NEEDS_DECISION: u8 = 3;

fn main() -> ExitCode {
    // Sessions hold what people, models and tools said: nothing mneme
    // writes is for other local users.
    runtime::restrict_umask();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    runtime::text::init_logging(cli.log_format);
    // What the data directory's holder note says of this process: never
    // its arguments (a user's message).
    let holder = format!("mneme {}", matches.subcommand_name().unwrap_or_default());
    runtime::text::name_this_process(&holder);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime starts");
    match runtime.block_on(commands::dispatch(cli, &holder)) {
        Ok(code) => code,
        // The reader of stdout went away (`mneme export | head`): quietly.
        Err(error) if out::is_closed_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            say_error(&error);
            ExitCode::FAILURE
        }
    }
}

/// Says why the command failed. An agent file's error keeps its lines (the
/// file's line, a caret under the fault); every other error is one line,
/// since text from outside (a server's answer) may be in it.
fn say_error(error: &anyhow::Error) {
    let in_agent_file = error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<runtime::RuntimeError>(),
            Some(runtime::RuntimeError::Spec { .. })
        )
    });
    match in_agent_file {
        true => runtime::text::say_lines(&format!("mneme: error: {error:#}")),
        false => say!("mneme: error: {error:#}"),
    }
}
