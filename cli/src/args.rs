//! The command line as people type it: the commands, their options, and
//! an example of each in its `--help`.

use crate::sessions::SessionRef;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// An event-sourced agent runtime: every agent session is an append-only,
/// hash-chained log; kill it at any instant and it resumes from the log,
/// never running a committed side effect twice.
#[derive(Parser)]
#[command(name = "mneme", version, propagate_version = true)]
pub(crate) struct Cli {
    /// Data directory holding the event log (sled), and the daemon's token
    /// and address files. Default: $XDG_DATA_HOME/mneme, else
    /// ~/.local/share/mneme.
    #[arg(long, env = "MNEME_DATA_DIR", global = true)]
    pub(crate) data_dir: Option<PathBuf>,
    /// The store, given before the command (`mneme --store URL serve`):
    /// the same as the command's own `--store`.
    #[arg(long, env = "MNEME_STORE", hide = true)]
    pub(crate) store: Option<String>,
    /// How log events (the daemon's, warnings) go to stderr: `human`
    /// lines or `json` objects, one a line. A command's own lines (the
    /// session id, its answer) are not log events.
    #[arg(long, env = "MNEME_LOG_FORMAT", default_value = "human", global = true)]
    pub(crate) log_format: runtime::text::LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How a command opens the store: on the commands that open one.
#[derive(Args)]
pub(crate) struct StoreOptions {
    /// Keep the event log in PostgreSQL instead of the data directory:
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?schema=NAME]`, with
    /// `&sslmode=require[&sslrootcert=FILE]` for TLS. Several daemons may
    /// share one store.
    #[arg(long, env = "MNEME_STORE")]
    pub(crate) store: Option<String>,
    /// MiB of the sled log's page cache, counted as sled counts it: the
    /// bytes its pages take on disk, compressed (the process holds more
    /// for them). Pages of records read stay in memory up to this; sled
    /// evicts in batches, so a process may hold up to ~16,000 more pages
    /// than the cache before it catches up. Appends need little of it.
    #[arg(
        long,
        env = "MNEME_SLED_CACHE_MIB",
        default_value_t = eventlog::DEFAULT_CACHE_BYTES >> 20,
        value_parser = clap::value_parser!(u64).range(1..=1 << 20)
    )]
    pub(crate) sled_cache_mib: u64,
    /// Milliseconds a session's lease lasts unless renewed: how soon another
    /// daemon on the same store takes over the sessions of one that died.
    #[arg(long, env = "MNEME_LEASE_TTL_MS", default_value_t = 15_000)]
    pub(crate) lease_ttl_ms: u64,
    /// What a write-ahead barrier waits for: `synced` (fdatasync: survives
    /// power loss), `flushed` (survives a process crash) or `buffered`.
    #[arg(long, env = "MNEME_DURABILITY", default_value = "synced")]
    pub(crate) durability: eventlog::Durability,
    /// Encrypt new sessions at rest, each under a key of its own wrapped
    /// by the master key in this file (see `mneme keygen --master`; keep
    /// it outside the data directory), so `mneme erase` can destroy their
    /// content. Needed to read sessions written with it.
    #[arg(long, env = "MNEME_MASTER_KEY")]
    pub(crate) master_key: Option<PathBuf>,
    /// Snapshot a session's state every N events (0: never). Default: every
    /// 1000 events for agents with a context window (their state stays
    /// small), never otherwise. Snapshots only make resume faster.
    #[arg(long, env = "MNEME_SNAPSHOT_EVERY")]
    pub(crate) snapshot_every: Option<u64>,
}

/// What a command that runs turns takes besides.
#[derive(Args)]
pub(crate) struct TurnOptions {
    /// Sign each session's head at the end of each turn with the ed25519
    /// key in this file (see `mneme keygen`; keep it outside the data
    /// directory): `mneme verify --key PUB` then tells a rewritten history.
    #[arg(long, env = "MNEME_SIGNING_KEY")]
    pub(crate) signing_key: Option<PathBuf>,
    /// Send a trace of each turn this process runs (`run`, `resume`, the
    /// daemon's) to an OpenTelemetry collector: OTLP over HTTP, protobuf,
    /// POSTed to URL/v1/traces. Spans follow the GenAI semantic
    /// conventions; a collector that is down costs a warning, never a turn.
    #[arg(long, env = "MNEME_OTLP_ENDPOINT", value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
    /// Put messages, tool arguments and results in the traces (each
    /// clipped to 4 KiB). Off by default: spans carry names, ids, tokens,
    /// timings and outcomes only.
    #[arg(long, env = "MNEME_OTLP_CONTENT")]
    pub(crate) otlp_content: bool,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Start a session (or continue one) and run the agent until it answers.
    /// Prints the answer on stdout and the session id on stderr.
    #[command(
        after_help = "Examples:\n  mneme run --agent agent.toml \"Charge ada 4200 cents\"\n  mneme run --session 01a23562 \"And email her the receipt\""
    )]
    Run(RunArgs),
    /// Continue unfinished sessions from their logs.
    #[command(after_help = "Examples:\n  mneme resume 01a23562\n  mneme resume --all")]
    Resume(ResumeArgs),
    /// Deliver an event to a session that sleeps until it (a call of a
    /// tool of kind `sleep`): the call wakes with the payload in its
    /// result, and the turn goes on.
    #[command(
        after_help = "Examples:\n  mneme wake 01a23562 --event payment.landed --payload '{\"amount\": 4200}'"
    )]
    Wake(WakeArgs),
    /// Run an agent on a schedule: add, list and remove schedules. A
    /// daemon holding the store (`mneme serve`) fires them; each firing
    /// and each skipped tick is in the schedule's log (`mneme log ID`).
    #[command(
        after_help = "Examples:\n  mneme schedule add --agent agent.toml --every 30m \"Check the queue\"\n  mneme schedule add --into 01a23562 --cron \"0 9 * * 1-5\" --timezone +02:00 \"Good morning\"\n  mneme schedule list\n  mneme schedule remove 01b7c3d4-..."
    )]
    Schedule(ScheduleArgs),
    /// Tenants: the users of one daemon (or fleet), each with tokens of its
    /// own that reach only its own sessions, schedules, spend and metrics,
    /// its own key (`mneme erase --tenant`) and its own daily cap.
    #[command(
        after_help = "Examples:\n  mneme tenant add acme --max-cost-per-day 20   # prints acme's token, once\n  mneme tenant list\n  mneme tenant set acme --max-cost-per-day 50\n  mneme tenant token acme                      # another token\n  mneme tenant revoke acme                     # every token of acme stops working"
    )]
    Tenant(TenantArgs),
    /// What model requests cost, from the sessions' logs at their agents'
    /// prices: by tenant, and by agent, UTC day or session.
    #[command(
        after_help = "Examples:\n  mneme spend\n  mneme spend --tenant acme --by day\n  mneme spend --by agent --day 2026-05-01 --json"
    )]
    Spend(SpendArgs),
    /// List sessions with status, events and last activity.
    #[command(after_help = "Examples:\n  mneme sessions\n  mneme sessions --json | jq -r .title")]
    Sessions(SessionsArgs),
    /// Show a session's audit trail as a timeline.
    #[command(
        after_help = "Examples:\n  mneme log 01a23562\n  mneme log 01a23562 --kind ToolStarted --since 1h"
    )]
    Log(LogArgs),
    /// Check hash chains; exits non-zero naming the first bad seq.
    #[command(
        after_help = "Examples:\n  mneme verify\n  mneme verify 01a23562 --key signing.pub\n  mneme verify --key signing.pub --witness heads.jsonl"
    )]
    Verify(VerifyArgs),
    /// Write every signed head as JSON lines: a witness to keep apart from
    /// the store, for `mneme verify --key PUB --witness FILE`, which then
    /// tells a session deleted, cut or rewritten since.
    #[command(after_help = "Examples:\n  mneme heads --output ~/witness/heads.jsonl")]
    Heads(HeadsArgs),
    /// Dry run: the rebuilt prompt and the resume plan, running nothing.
    #[command(
        after_help = "Examples:\n  mneme replay 01a23562\n  mneme replay 01a23562 --raw > next-request.json"
    )]
    Replay(ReplayArgs),
    /// Start a new session holding another's first events (up to --at),
    /// to run on from there.
    #[command(after_help = "Examples:\n  mneme fork 01a23562 --at 12 --agent other-model.toml")]
    Fork(ForkArgs),
    /// Where two sessions (a session and its fork) hold the same events,
    /// where they part, and what differs after.
    #[command(after_help = "Examples:\n  mneme diff 01a23562 01a23599")]
    Diff(DiffArgs),
    /// Re-run a session's user messages on another agent in a new session
    /// linked to it: calls matching a recorded one are answered from the
    /// record; side effects with none run only with --live-tools. Prints
    /// where the two sessions' requests first differ, both answers to each
    /// message, tokens, cost and cache hit ratios.
    #[command(after_help = "Examples:\n  mneme rerun 01a23562 --agent bigger-model.toml")]
    Rerun(RerunArgs),
    /// Write the bytes of binary content a tool returned by reference (its
    /// event records the SHA-256) to stdout or --output.
    #[command(after_help = "Examples:\n  mneme blob 01a23562 9f86d081884c7d65 --output image.png")]
    Blob(BlobArgs),
    /// Decide what to do with a tool call in doubt, then continue the session.
    #[command(
        after_help = "Examples:\n  mneme resolve 01a23562 call_0_0 --retry\n  mneme resolve 01a23562 call_0_0 --skip --result '{\"charged\": true}'\n  mneme resolve 01a23562 call_0_0 --fail \"the card was not charged\""
    )]
    Resolve(ResolveArgs),
    /// Approve (or deny) a tool call that waits for approval, then continue.
    #[command(
        after_help = "Examples:\n  mneme approve 01a23562 call_0_0\n  mneme approve 01a23562 call_0_0 --deny\n  mneme approve 01a23562 call_0_0 --edit-args '{\"cents\": 2100}'"
    )]
    Approve(ApproveArgs),
    /// Write sessions' records as JSON lines (envelopes, hashes and the
    /// exact stored bytes), to stdout or --output.
    #[command(
        after_help = "Examples:\n  mneme export --output all.jsonl\n  mneme export 01a23562 > one.jsonl"
    )]
    Export(ExportArgs),
    /// Read JSON lines written by `export` into this store, checking every
    /// hash and chain link; the way from sled to PostgreSQL.
    #[command(
        after_help = "Examples:\n  mneme import all.jsonl\n  mneme import --append later.jsonl\n  mneme --store postgres://mneme@127.0.0.1/mneme import all.jsonl"
    )]
    Import(ImportArgs),
    /// A self-contained story: a crash mid-run, a resume, and proof that
    /// every side effect happened exactly once. Needs no network; uses a
    /// data directory of its own (a temporary one, or --keep DIR), never
    /// --data-dir's.
    #[command(after_help = "Examples:\n  mneme demo")]
    Demo(DemoArgs),
    /// Run the daemon: an HTTP API over many sessions that resumes
    /// unfinished ones on start. Token: --token-file, else $MNEME_TOKEN,
    /// else a new one written to DATA_DIR/mneme.token (mode 0600).
    #[command(
        after_help = "Examples:\n  mneme serve --agents ./agents\n  mneme serve --listen 127.0.0.1:7878 --token-file ~/.config/mneme/token"
    )]
    Serve(ServeArgs),
    /// Write a new ed25519 signing key to FILE (outside the data directory,
    /// readable by its owner only) and print its public key, for
    /// `--signing-key FILE` and `mneme verify --key PUB`.
    #[command(
        after_help = "Examples:\n  mneme keygen --out ~/.config/mneme/signing.key\n  mneme keygen --master --out ~/.config/mneme/master.key"
    )]
    Keygen(KeygenArgs),
    /// Erase a session's content for good (its key is destroyed): its
    /// shape stays and its chain still verifies; nothing runs in it again.
    /// Every session derived from it (its forks, reruns and sub-agents,
    /// and theirs) holds a copy, and is erased with it unless --only-this.
    /// With --idle-for instead of a session: every session idle that long.
    #[command(
        after_help = "Examples:\n  mneme erase 01a23562 --reason \"asked by the user\"\n  mneme erase 01a23562 --reason \"asked by the user\" --only-this\n  mneme erase --idle-for 30d"
    )]
    Erase(EraseArgs),
    /// Preflight an agent file: reach what a session of it would (the
    /// model server, asked for one tool call with the key; each command's
    /// program; each tool's and check's server; each MCP server), before
    /// any session exists. Calls no tool. Exits 1 if anything would fail.
    #[command(
        after_help = "Examples:\n  mneme check --agent agent.toml\n  mneme check --agent agent.toml --message \"Note: buy milk\""
    )]
    Check(CheckArgs),
    /// Sign a browser in to the web view of the daemon that holds the data
    /// directory: prints a link with a one-time code (valid once, for two
    /// minutes), the token never in it.
    #[command(after_help = "Examples:\n  mneme ui --open")]
    Ui(UiArgs),
}

#[derive(Args)]
pub(crate) struct CheckArgs {
    /// The agent file (TOML).
    #[arg(long)]
    pub(crate) agent: PathBuf,
    /// Send the model this message, as `mneme run --agent FILE MESSAGE`
    /// would: the first request of such a session (its prefix-cache key,
    /// the session's id, aside). Without it, the check sends its own: "This is a connection check (mneme
    /// check). Call one of your tools now, with example arguments."
    #[arg(long, value_name = "MESSAGE")]
    pub(crate) message: Option<String>,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
}

#[derive(Args)]
pub(crate) struct KeygenArgs {
    /// Where to write the key (never overwritten).
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Write a master key for `--master-key` (encryption at rest) instead
    /// of a signing key.
    #[arg(long)]
    pub(crate) master: bool,
}

#[derive(Args)]
pub(crate) struct EraseArgs {
    /// The session to erase.
    #[arg(
        required_unless_present_any = ["idle_for", "tenant"],
        conflicts_with_all = ["idle_for", "tenant"]
    )]
    pub(crate) session: Option<SessionRef>,
    /// Erase a tenant: its key is destroyed (every session of it unreadable
    /// at once, each chain still verifying), its tokens revoked, and each
    /// of its sessions erased; its name is never given again.
    #[arg(long, conflicts_with = "idle_for", requires = "reason")]
    pub(crate) tenant: Option<String>,
    /// Erase every session idle longer than this (`30d`, `12h`): a
    /// retention sweep, for a schedule (`mneme serve --retain` runs one).
    #[arg(long, value_parser = runtime::text::parse_window)]
    pub(crate) idle_for: Option<std::time::Duration>,
    /// Why (recorded). Default for --idle-for: the retention window.
    #[arg(long, required_unless_present = "idle_for")]
    pub(crate) reason: Option<String>,
    /// Who asks (recorded in the log).
    #[arg(long, env = "USER", default_value = "unknown")]
    pub(crate) by: String,
    /// Erase only the session named, not the sessions derived from it
    /// (forks, reruns, sub-agents): those are named, as still holding
    /// copies of its content. --idle-for judges each session by its own
    /// idleness, and so always erases only the idle ones.
    #[arg(long)]
    pub(crate) only_this: bool,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct TenantArgs {
    #[command(subcommand)]
    pub(crate) action: TenantAction,
}

#[derive(Subcommand)]
pub(crate) enum TenantAction {
    /// Add a tenant; prints its first token (on stdout, once: only its
    /// SHA-256 is kept).
    Add(TenantAddArgs),
    /// List tenants: tokens that work, daily cap, erased or not.
    List(TenantListArgs),
    /// Set a tenant's limits.
    Set(TenantSetArgs),
    /// Issue another token of a tenant (printed once).
    Token(TenantNameArgs),
    /// Revoke every token of a tenant (its sessions stay).
    Revoke(TenantNameArgs),
}

#[derive(Args)]
pub(crate) struct TenantAddArgs {
    /// Its name: 1 to 32 lower-case letters, digits, '-' and '_'.
    pub(crate) name: String,
    /// The most its sessions' model requests may cost in one UTC day.
    #[arg(long, value_name = "COST")]
    pub(crate) max_cost_per_day: Option<f64>,
    /// Turns of its sessions running at once on a daemon.
    #[arg(long, value_name = "N")]
    pub(crate) max_running_turns: Option<u64>,
    /// Tool calls of its sessions running at once in a process.
    #[arg(long, value_name = "N")]
    pub(crate) max_parallel_calls: Option<u64>,
    /// Turns of its sessions waiting on a daemon, past which one more is
    /// refused (429).
    #[arg(long, value_name = "N")]
    pub(crate) max_queued_turns: Option<u64>,
    /// Who asks (recorded).
    #[arg(long, env = "USER", default_value = "unknown")]
    pub(crate) by: String,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

/// A count limit as `tenant set` takes it: a number, or `none` to remove
/// the limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CountOrNone(pub(crate) Option<u64>);

impl std::str::FromStr for CountOrNone {
    type Err = String;

    fn from_str(s: &str) -> Result<CountOrNone, String> {
        match s {
            "none" => Ok(CountOrNone(None)),
            n => n
                .parse()
                .map(|n| CountOrNone(Some(n)))
                .map_err(|_| format!("{n:?}: a whole number, or none")),
        }
    }
}

#[derive(Args)]
pub(crate) struct TenantListArgs {
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("limit").required(true).multiple(true).args([
    "max_cost_per_day", "no_max_cost_per_day", "max_running_turns", "max_parallel_calls", "max_queued_turns"
])))]
pub(crate) struct TenantSetArgs {
    /// The tenant.
    pub(crate) name: String,
    /// The most its sessions' model requests may cost in one UTC day.
    #[arg(long, value_name = "COST", conflicts_with = "no_max_cost_per_day")]
    pub(crate) max_cost_per_day: Option<f64>,
    /// Remove its daily cap.
    #[arg(long)]
    pub(crate) no_max_cost_per_day: bool,
    /// Turns of its sessions running at once on a daemon (`none`: no
    /// limit but the daemon's).
    #[arg(long, value_name = "N|none")]
    pub(crate) max_running_turns: Option<CountOrNone>,
    /// Tool calls of its sessions running at once in a process (`none`:
    /// no limit but the process's).
    #[arg(long, value_name = "N|none")]
    pub(crate) max_parallel_calls: Option<CountOrNone>,
    /// Turns of its sessions waiting on a daemon, past which one more is
    /// refused with 429 (`none`: no bound).
    #[arg(long, value_name = "N|none")]
    pub(crate) max_queued_turns: Option<CountOrNone>,
    /// Who asks (recorded).
    #[arg(long, env = "USER", default_value = "unknown")]
    pub(crate) by: String,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct TenantNameArgs {
    /// The tenant.
    pub(crate) name: String,
    /// Who asks (recorded).
    #[arg(long, env = "USER", default_value = "unknown")]
    pub(crate) by: String,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct SpendArgs {
    /// Only this tenant's sessions.
    #[arg(long)]
    pub(crate) tenant: Option<String>,
    /// Rows by tenant and this too: agent, day (UTC) or session.
    #[arg(long, value_parser = ["tenant", "agent", "day", "session"])]
    pub(crate) by: Option<String>,
    /// Only this UTC day (YYYY-MM-DD).
    #[arg(long)]
    pub(crate) day: Option<String>,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct UiArgs {
    /// Open the link in a browser ($BROWSER, else xdg-open).
    #[arg(long)]
    pub(crate) open: bool,
    /// Print only the link.
    #[arg(long)]
    pub(crate) print_url: bool,
    /// The name the browser acts as, recorded as who decided what it
    /// decides (default: $USER).
    #[arg(long = "as", value_name = "NAME")]
    pub(crate) name: Option<String>,
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub(crate) listen: std::net::SocketAddr,
    /// Allow a --listen address other hosts can reach. The API is plain
    /// HTTP: put a TLS proxy in front of it, or keep it to a trusted network.
    #[arg(long)]
    pub(crate) allow_public: bool,
    /// File holding the bearer token (at least 16 bytes; readable by its
    /// owner only).
    #[arg(long)]
    pub(crate) token_file: Option<PathBuf>,
    /// Directory of agent files that sessions can be created from by name.
    #[arg(long)]
    pub(crate) agents: Option<PathBuf>,
    /// Erase sessions idle longer than this (`30d`, `12h`), checked about
    /// every tenth of it (at most hourly). Needs sessions written with
    /// --master-key.
    #[arg(long, value_parser = runtime::text::parse_window)]
    pub(crate) retain: Option<std::time::Duration>,
    /// Seconds a shutdown waits for running turns to reach a step boundary.
    #[arg(long, default_value_t = 10)]
    pub(crate) shutdown_grace: u64,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub(crate) max_body_bytes: usize,
    /// Tool calls running at once across every session of the daemon
    /// (each agent also has its own `max_parallel_calls`, default 8).
    #[arg(long, default_value_t = 64)]
    pub(crate) max_parallel_calls: usize,
    /// Turns running at once across every session of the daemon (default:
    /// no limit); the others wait, served round-robin across tenants (each
    /// tenant also has its own `max_running_turns`).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(crate) max_running_turns: Option<usize>,
    /// Seconds a client has to send a request's head: from connecting for
    /// the first request, from its first byte for a later one.
    #[arg(
        long,
        default_value_t = daemon::DEFAULT_HEADER_TIMEOUT_SECS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) header_timeout_secs: u64,
    /// Seconds a keep-alive connection may wait for its next request.
    #[arg(
        long,
        default_value_t = daemon::DEFAULT_IDLE_TIMEOUT_SECS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) idle_timeout_secs: u64,
    /// Connections open at most, lowered to what the open-file limit leaves
    /// room for. At the cap, the connection quiet the longest is closed to
    /// admit a new one; those with a request under way never are.
    #[arg(
        long,
        default_value_t = daemon::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub(crate) max_connections: usize,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
    #[command(flatten, next_help_heading = "Turn options")]
    pub(crate) turns: TurnOptions,
}

#[derive(Args)]
pub(crate) struct SessionsArgs {
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct JsonFlag {
    /// One JSON object a line.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct RunArgs {
    /// The agent file (TOML). Optional with --session: a session keeps the
    /// spec it started with.
    #[arg(long)]
    pub(crate) agent: Option<PathBuf>,
    /// Continue this session instead of starting a new one.
    #[arg(long)]
    pub(crate) session: Option<SessionRef>,
    /// Adopt the tools the session's MCP servers list now (recorded, with
    /// what changed); without it a session keeps the tools it started with.
    #[arg(long, requires = "session")]
    pub(crate) refresh_tools: bool,
    /// The user's message.
    pub(crate) message: String,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
    #[command(flatten, next_help_heading = "Turn options")]
    pub(crate) turns: TurnOptions,
}

#[derive(Args)]
pub(crate) struct ResumeArgs {
    /// The session to continue.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub(crate) session: Option<SessionRef>,
    /// Continue every session that has pending work (not those that
    /// spent a budget: they need --extend, one by one).
    #[arg(long)]
    pub(crate) all: bool,
    /// Start the turn's budgets (`[limits]` in the agent file) again: a
    /// session paused on a spent budget continues only with this.
    #[arg(long, requires = "session")]
    pub(crate) extend: bool,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
    #[command(flatten, next_help_heading = "Turn options")]
    pub(crate) turns: TurnOptions,
}

#[derive(Args)]
pub(crate) struct WakeArgs {
    /// The sleeping session.
    pub(crate) session: SessionRef,
    /// The event's name: the call sleeping until it wakes.
    #[arg(long)]
    pub(crate) event: String,
    /// What the event carries (JSON), given to the model in the call's
    /// result.
    #[arg(long)]
    pub(crate) payload: Option<String>,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
    #[command(flatten, next_help_heading = "Turn options")]
    pub(crate) turns: TurnOptions,
}

#[derive(Args)]
pub(crate) struct ScheduleArgs {
    #[command(subcommand)]
    pub(crate) action: ScheduleAction,
}

#[derive(Subcommand)]
pub(crate) enum ScheduleAction {
    /// Add a schedule: each tick sends MESSAGE to a new session of the
    /// agent (or to the session --into names).
    Add(ScheduleAddArgs),
    /// List schedules: next tick, last firing, ticks fired and skipped.
    List(ScheduleListArgs),
    /// Remove a schedule: it fires no more (its log stays).
    Remove(ScheduleRemoveArgs),
}

#[derive(Args)]
pub(crate) struct ScheduleAddArgs {
    /// The user message each firing sends.
    pub(crate) message: String,
    /// The agent file each firing starts a session of.
    #[arg(long)]
    pub(crate) agent: Option<PathBuf>,
    /// Send the message to this session instead of starting new ones.
    #[arg(long)]
    pub(crate) into: Option<SessionRef>,
    /// A period: a whole number and a unit (s, m, h or d), such as 30m.
    #[arg(long, conflicts_with = "cron", required_unless_present = "cron")]
    pub(crate) every: Option<String>,
    /// A cron expression: 5 fields, or 6 with seconds first.
    #[arg(long)]
    pub(crate) cron: Option<String>,
    /// The zone --cron is read in: UTC or a fixed offset such as +02:00.
    #[arg(long, requires = "cron")]
    pub(crate) timezone: Option<String>,
    /// While the previous firing's turn runs: skip the tick, or queue it.
    #[arg(long, default_value = "skip", value_parser = ["skip", "queue"])]
    pub(crate) overlap: String,
    /// Of the ticks that came due at once (after a downtime): fire none
    /// (only a tick on time), the newest one, or all.
    #[arg(long, default_value = "one", value_parser = ["none", "one", "all"])]
    pub(crate) catch_up: String,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct ScheduleListArgs {
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct ScheduleRemoveArgs {
    /// The schedule's id.
    pub(crate) schedule: uuid::Uuid,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct LogArgs {
    /// The session.
    pub(crate) session: SessionRef,
    /// Only events of these kinds (e.g. ToolStarted); repeatable.
    #[arg(long)]
    pub(crate) kind: Vec<String>,
    /// Only events about calls of this tool.
    #[arg(long)]
    pub(crate) tool: Option<String>,
    /// Only events at or after this time: RFC 3339, or an age such as 10m, 2h, 1d.
    #[arg(long)]
    pub(crate) since: Option<String>,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct VerifyArgs {
    /// Only this session (default: every session).
    pub(crate) session: Option<SessionRef>,
    /// Also check every signed head against this public key (hex, or a file
    /// holding it): each must be its, and match the record it names; a
    /// session without one fails, and so do records after the last one
    /// (but a turn still running).
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// With --key: the store must still hold every head this file (from
    /// `mneme heads`) witnessed: a session gone, or cut or rewritten before
    /// a witnessed head, fails.
    #[arg(long, requires = "key", value_name = "FILE")]
    pub(crate) witness: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct HeadsArgs {
    /// Only this session (default: every session).
    pub(crate) session: Option<SessionRef>,
    /// Write here instead of stdout (keep it where whoever can rewrite the
    /// store cannot).
    #[arg(long, short)]
    pub(crate) output: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct ReplayArgs {
    /// The session.
    pub(crate) session: SessionRef,
    /// Print only the exact bytes of the next model request.
    #[arg(long, conflicts_with = "json")]
    pub(crate) raw: bool,
    /// List the replies whose prompts missed the server's prefix cache,
    /// what each cost, and why (the event that changed the request, or
    /// eviction).
    #[arg(long, conflicts_with = "raw")]
    pub(crate) cache: bool,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct ForkArgs {
    /// The session to fork.
    pub(crate) session: SessionRef,
    /// The seq of its last event the fork holds.
    #[arg(long)]
    pub(crate) at: u64,
    /// Run the fork with this agent file from there on (another model,
    /// prompt or tools); recorded in the fork.
    #[arg(long)]
    pub(crate) agent: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct DiffArgs {
    /// One session.
    pub(crate) a: SessionRef,
    /// The other.
    pub(crate) b: SessionRef,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct RerunArgs {
    /// The recorded session to re-run.
    pub(crate) session: SessionRef,
    /// The agent file to re-run it with (another model, prompt or tools).
    #[arg(long)]
    pub(crate) agent: PathBuf,
    /// Run calls no record answers even when they have side effects (by
    /// default only read-only tools run; the others are told they were not
    /// run).
    #[arg(long)]
    pub(crate) live_tools: bool,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
    #[command(flatten, next_help_heading = "Turn options")]
    pub(crate) turns: TurnOptions,
}

#[derive(Args)]
pub(crate) struct BlobArgs {
    /// The session.
    pub(crate) session: SessionRef,
    /// The blob's SHA-256 (hex), as `mneme log` shows it.
    pub(crate) digest: String,
    /// Write here instead of stdout.
    #[arg(long)]
    pub(crate) output: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

/// What every decision on a call takes besides the decision itself.
#[derive(Args)]
pub(crate) struct Decision {
    /// Who decides (recorded in the log).
    #[arg(long, env = "USER", default_value = "unknown")]
    pub(crate) by: String,
    /// Record the decision but do not continue the session.
    #[arg(long)]
    pub(crate) no_resume: bool,
    #[command(flatten)]
    pub(crate) json: JsonFlag,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
    #[command(flatten, next_help_heading = "Turn options")]
    pub(crate) turns: TurnOptions,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("decision").required(true).args(["retry", "skip", "fail"])))]
pub(crate) struct ResolveArgs {
    /// The session.
    pub(crate) session: SessionRef,
    /// The call in doubt.
    pub(crate) call_id: String,
    /// Run the call again (accepting the risk of a duplicate effect).
    #[arg(long)]
    pub(crate) retry: bool,
    /// Do not run it; give the model the result given with --result.
    #[arg(long, requires = "result")]
    pub(crate) skip: bool,
    /// The result (JSON) for --skip.
    #[arg(long)]
    pub(crate) result: Option<String>,
    /// Do not run it; tell the model it failed with this message.
    #[arg(long, value_name = "MSG")]
    pub(crate) fail: Option<String>,
    #[command(flatten)]
    pub(crate) decision: Decision,
}

#[derive(Args)]
pub(crate) struct ApproveArgs {
    /// The session.
    pub(crate) session: SessionRef,
    /// The call waiting for approval.
    pub(crate) call_id: String,
    /// Deny it: the tool never runs and the model is told.
    #[arg(long)]
    pub(crate) deny: bool,
    /// Approve it with these arguments (JSON) instead of the model's: the
    /// tool runs with them, recorded with who changed them, and the model
    /// is told.
    #[arg(long, value_name = "JSON", conflicts_with = "deny")]
    pub(crate) edit_args: Option<String>,
    #[command(flatten)]
    pub(crate) decision: Decision,
}

#[derive(Args)]
pub(crate) struct ExportArgs {
    /// Only this session (default: every session).
    pub(crate) session: Option<SessionRef>,
    /// Write here instead of stdout.
    #[arg(long, short)]
    pub(crate) output: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct ImportArgs {
    /// The file to read (default: stdin).
    pub(crate) input: Option<PathBuf>,
    /// Add records past the head of sessions this store already holds
    /// (refused without it: anyone can extend a chain), naming each
    /// session added to and the seqs added.
    #[arg(long)]
    pub(crate) append: bool,
    #[command(flatten, next_help_heading = "Store options")]
    pub(crate) store: StoreOptions,
}

#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Keep the demo's data directory here instead of a temporary one.
    #[arg(long)]
    pub(crate) keep: Option<PathBuf>,
}

impl Command {
    /// How the command opens the store, if it opens one.
    pub(crate) fn store(&self) -> Option<&StoreOptions> {
        Some(match self {
            Command::Run(a) => &a.store,
            Command::Resume(a) => &a.store,
            Command::Wake(a) => &a.store,
            Command::Schedule(a) => match &a.action {
                ScheduleAction::Add(a) => &a.store,
                ScheduleAction::List(a) => &a.store,
                ScheduleAction::Remove(a) => &a.store,
            },
            Command::Tenant(a) => match &a.action {
                TenantAction::Add(a) => &a.store,
                TenantAction::List(a) => &a.store,
                TenantAction::Set(a) => &a.store,
                TenantAction::Token(a) | TenantAction::Revoke(a) => &a.store,
            },
            Command::Spend(a) => &a.store,
            Command::Sessions(a) => &a.store,
            Command::Log(a) => &a.store,
            Command::Verify(a) => &a.store,
            Command::Heads(a) => &a.store,
            Command::Replay(a) => &a.store,
            Command::Fork(a) => &a.store,
            Command::Diff(a) => &a.store,
            Command::Rerun(a) => &a.store,
            Command::Blob(a) => &a.store,
            Command::Resolve(a) => &a.decision.store,
            Command::Approve(a) => &a.decision.store,
            Command::Export(a) => &a.store,
            Command::Import(a) => &a.store,
            Command::Serve(a) => &a.store,
            Command::Erase(a) => &a.store,
            Command::Demo(_) | Command::Keygen(_) | Command::Ui(_) | Command::Check(_) => {
                return None
            }
        })
    }

    /// What the command takes for the turns it runs, if it runs any here.
    pub(crate) fn turns(&self) -> Option<&TurnOptions> {
        Some(match self {
            Command::Run(a) => &a.turns,
            Command::Resume(a) => &a.turns,
            Command::Wake(a) => &a.turns,
            Command::Rerun(a) => &a.turns,
            Command::Resolve(a) => &a.decision.turns,
            Command::Approve(a) => &a.decision.turns,
            Command::Serve(a) => &a.turns,
            _ => return None,
        })
    }
}
