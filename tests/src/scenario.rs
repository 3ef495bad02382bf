//! Scripted scenarios for fault tests: run one uncrashed for reference, run
//! it again with crashes, and check the contract's invariants between the two.

use crate::powercut::PowerCut;
use crate::{
    agent_toml, command_tool, http_tool, lookup_tool, named_session, rebuilt_request,
    refund_needing_approval, stderr, stdout, Fault, MockModel, MockReply, Sink, SinkStats, World,
};
use runtime::control::crash::{self, CrashPoint};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Output;
use tokio::process::Command;

/// What the command tool that ignores idempotency keys returns.
pub const NOTIFY_RESULT: &str = "{\"sent\":true}";

/// A conversation with tools, replayable against fresh servers.
#[derive(Clone)]
pub struct Scenario {
    /// Short name, for reports.
    pub name: &'static str,
    /// User messages, one turn each.
    pub turns: Vec<&'static str>,
    /// The model's replies, in order.
    pub replies: Vec<MockReply>,
    /// How the model server misbehaves.
    pub fault: Fault,
    /// Its agent's tools.
    pub tools: Tools,
    /// The crash points its runs must reach.
    pub points: Vec<Reach>,
}

/// The tools of a scenario's agent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Tools {
    /// HTTP tools of each effect on the sink, command tools (one ignores
    /// keys, one fails).
    Effects,
    /// Real MCP servers' tools.
    Mcp,
    /// `refund`, a side effect on the sink that waits for approval.
    Approval,
    /// `notify`, a command side effect that ignores keys, with a check
    /// that looks for its key among the effects.
    Checked,
    /// The effects' tools and `wait`, a tool of kind `sleep`.
    Sleep,
}

/// A crash point a scenario must reach, and the point a run must crash at
/// first when it is reached only on the way back from a crash (a call in
/// doubt is recorded by the resume after a crash mid-call).
#[derive(Clone, Copy, Debug)]
pub struct Reach {
    /// The point.
    pub point: CrashPoint,
    /// The crash that must come first, if any.
    pub after: Option<CrashPoint>,
}

/// Every crash point of the write path, but those in `not`; those in
/// `after_a_crash` are reached after a crash at `tool_started_durable`.
fn reaching(not: &[CrashPoint], after_a_crash: &[CrashPoint]) -> Vec<Reach> {
    runtime::control::crash::all_points()
        .into_iter()
        .filter(|p| !not.contains(p))
        .map(|point| Reach {
            point,
            after: after_a_crash
                .contains(&point)
                .then_some(crash::TOOL_STARTED_DURABLE),
        })
        .collect()
}

/// Points reached only by the resume after a crash mid-call of a side
/// effect that ignores keys, and the decision on it.
const AFTER_A_CRASH: &[CrashPoint] = &[crash::IN_DOUBT_APPENDED, crash::DECISION_APPENDED];

/// Parallel calls of every effect kind, a failing tool, an HTTP side effect
/// in a second reply.
pub fn effects_scenario() -> Scenario {
    Scenario {
        name: "effects",
        turns: vec!["Charge customer 1, reserve a seat, notify them, check the ledger."],
        replies: vec![
            MockReply::calls(&[
                ("charge", json!({"n": 1})),
                ("reserve", json!({"n": 2})),
                ("lookup", json!({"n": 3})),
                ("notify", json!({"n": 4})),
                ("ledger", json!({"n": 5})),
            ]),
            MockReply::calls(&[("email", json!({"n": 6}))]),
            MockReply::answer("Charged, reserved, notified, emailed; the ledger was down."),
        ],
        fault: Fault::None,
        tools: Tools::Effects,
        points: reaching(&[], AFTER_A_CRASH),
    }
}

/// Two turns on a model that needs a retry for every request.
pub fn multi_turn_scenario() -> Scenario {
    Scenario {
        name: "multi-turn-retry",
        turns: vec!["Look customer 1 up.", "Now charge them."],
        replies: vec![
            MockReply::calls(&[("lookup", json!({"n": 1}))]),
            MockReply::answer("Customer 1 is Ada."),
            MockReply::calls(&[("charge", json!({"n": 2}))]),
            MockReply::answer("Charged Ada."),
        ],
        fault: Fault::FailFirstTry,
        tools: Tools::Effects,
        // Its tools honour keys or only read: no call is ever in doubt.
        points: reaching(AFTER_A_CRASH, &[]),
    }
}

/// A key-ignoring side effect with a check: whatever the crash, its
/// effect happens exactly once and no person is ever asked.
pub fn checked_scenario() -> Scenario {
    Scenario {
        name: "checked",
        turns: vec!["Notify customer 1, then look them up."],
        replies: vec![
            MockReply::calls(&[("notify", json!({"n": 1}))]),
            MockReply::calls(&[("lookup", json!({"n": 2}))]),
            MockReply::answer("Notified customer 1, who is Ada."),
        ],
        fault: Fault::None,
        tools: Tools::Checked,
        // The check settles every interrupted call: nothing is in doubt.
        points: reaching(AFTER_A_CRASH, &[]),
    }
}

/// A charge, a sleep already due when it is recorded (so the run wakes it
/// and goes on), an email.
pub fn sleep_scenario() -> Scenario {
    let woken = runtime::control::crash::SLEEP_POINTS.iter();
    let mut points = reaching(AFTER_A_CRASH, &[]);
    points.extend(woken.map(|&point| Reach { point, after: None }));
    Scenario {
        name: "sleep",
        turns: vec!["Charge customer 1, wait, then email them."],
        replies: vec![
            MockReply::calls(&[("charge", json!({"n": 1}))]),
            MockReply::calls(&[("wait", json!({"seconds": 0}))]),
            MockReply::calls(&[("email", json!({"n": 2}))]),
            MockReply::answer("Charged, waited, emailed."),
        ],
        fault: Fault::None,
        tools: Tools::Sleep,
        // Its side effects honour keys: never in doubt.
        points,
    }
}

/// What server-memory's `create_entities` answers for the entity the MCP
/// scenario creates (its `structuredContent`, as mneme records it).
pub const REMEMBER_RESULT: &str =
    "{\"entities\":[{\"entityType\":\"person\",\"name\":\"ada\",\"observations\":[\"met\"]}]}";

/// Real MCP servers as tools: a side effect that ignores keys
/// (server-memory's `create_entities`, the server's default effect), an
/// idempotent write and a read-only read (server-filesystem, by policy).
pub fn mcp_scenario() -> Scenario {
    let entity =
        json!({"entities": [{"name": "ada", "entityType": "person", "observations": ["met"]}]});
    Scenario {
        name: "mcp",
        turns: vec!["Remember Ada, write her a note and read it back."],
        replies: vec![
            MockReply::calls(&[
                ("mem__create_entities", entity),
                (
                    "fs__write_file",
                    json!({"path": "note.txt", "content": "Ada: met"}),
                ),
            ]),
            MockReply::calls(&[("fs__read_text_file", json!({"path": "note.txt"}))]),
            MockReply::answer("Ada is remembered; her note reads: Ada: met."),
        ],
        fault: Fault::None,
        tools: Tools::Mcp,
        points: reaching(&[], AFTER_A_CRASH),
    }
}

/// A side effect that waits for a person's approval (`mneme approve`).
pub fn approval_scenario() -> Scenario {
    Scenario {
        name: "approval",
        turns: vec!["Refund order 7."],
        replies: vec![
            MockReply::calls(&[("refund", json!({"n": 7}))]),
            MockReply::answer("Refunded order 7."),
        ],
        fault: Fault::None,
        tools: Tools::Approval,
        // Its one call honours keys: never in doubt. The decision is the
        // approval, reached without a crash first.
        points: reaching(&[crash::IN_DOUBT_APPENDED], &[]),
    }
}

/// The scenarios the soak runs (the crash matrix adds the MCP and approval
/// scenarios).
pub fn all() -> Vec<Scenario> {
    vec![effects_scenario(), multi_turn_scenario()]
}

/// Fresh servers, data directory and agent file for one run of a scenario.
pub struct Env {
    /// Files and the binary.
    pub world: World,
    /// The model server.
    pub model: MockModel,
    /// The side-effect sink.
    pub sink: Sink,
    /// The agent file.
    pub agent: PathBuf,
    /// One line per effect of the command tool that ignores keys.
    pub effects: PathBuf,
    /// Every interrupted call is settled by its check: no call may ever
    /// be in doubt, and the key-ignoring effect happens exactly once.
    pub no_person: bool,
}

impl Scenario {
    /// Starts fresh servers for one run on a sled data directory.
    pub async fn env(&self) -> Env {
        self.env_in(World::new()).await
    }

    /// Starts fresh servers for one run on a fresh log in `store`.
    pub async fn env_on(&self, store: Store) -> Env {
        self.env_in(store.world()).await
    }

    /// Starts fresh servers for one run in `world`.
    pub async fn env_in(&self, world: World) -> Env {
        let model = MockModel::start(self.replies.clone(), self.fault).await;
        let sink = Sink::start().await.unwrap();
        let effects = world.dir.path().join("notify-effects.log");
        let agent = match self.tools {
            Tools::Mcp => mcp_agent(&world, &model),
            Tools::Effects => effects_agent(&world, &model, &sink, &effects, false),
            Tools::Checked => effects_agent(&world, &model, &sink, &effects, true),
            Tools::Sleep => {
                let agent = effects_agent(&world, &model, &sink, &effects, false);
                let wait = "[[tools]]\nname = \"wait\"\nkind = \"sleep\"\neffect = \"read_only\"\n";
                let text = std::fs::read_to_string(&agent).unwrap() + wait;
                world.write("agent.toml", &text)
            }
            Tools::Approval => world.write(
                "agent.toml",
                &agent_toml(&model.base_url(), &[refund_needing_approval(&sink)]),
            ),
        };
        Env {
            world,
            model,
            sink,
            agent,
            effects,
            no_person: self.tools == Tools::Checked,
        }
    }
}

/// The MCP scenario's agent: server-memory keeps its graph in the world's
/// `memory.jsonl`, server-filesystem may touch only the world's `notes/`.
fn mcp_agent(world: &World, model: &MockModel) -> PathBuf {
    let servers = crate::mcp::servers();
    let notes = world.dir.path().join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    let fs = crate::mcp::stdio_server(
        "fs",
        &servers.filesystem,
        &[notes.to_str().unwrap()],
        "tools = { write_file = \"idempotent\", read_text_file = \"read_only\" }\nexpose = [\"write_file\", \"read_text_file\"]\n",
    );
    let memory = crate::mcp::memory_server(
        "mem",
        &world.dir.path().join("memory.jsonl"),
        "expose = [\"create_entities\", \"read_graph\"]\n",
    );
    let text = agent_toml(&model.base_url(), &[]) + &fs + &memory;
    world.write("agent.toml", &text)
}

/// The effects scenario's agent: HTTP tools on `sink`, command tools, one
/// of which logs each key it runs with to `effects` (`checked`: with a
/// check that finds the key there).
fn effects_agent(
    world: &World,
    model: &MockModel,
    sink: &Sink,
    effects: &std::path::Path,
    checked: bool,
) -> PathBuf {
    let notify = format!(
        "cat >/dev/null; echo \"$MNEME_IDEMPOTENCY_KEY\" >> {}; echo '{NOTIFY_RESULT}'",
        effects.display()
    );
    let mut notify_tool = command_tool("notify", &["sh", "-c", &notify], "side_effect", 10);
    if checked {
        let check = format!(
            "grep -qxF \"$1\" {} || exit 3; echo '{NOTIFY_RESULT}'",
            effects.display()
        );
        let words = serde_json::json!(["sh", "-c", check, "check", "{key}"]);
        notify_tool.push_str(&format!("check_command = {words}\n"));
    }
    let tools = [
        http_tool("charge", &sink.url("charge"), "side_effect"),
        http_tool("reserve", &sink.url("reserve"), "idempotent"),
        http_tool("email", &sink.url("email"), "side_effect"),
        lookup_tool(),
        notify_tool,
        command_tool(
            "ledger",
            &["sh", "-c", "cat >/dev/null; echo 'ledger down' >&2; exit 1"],
            "read_only",
            10,
        ),
    ];
    world.write("agent.toml", &agent_toml(&model.base_url(), &tools))
}

/// Where a fault test keeps its logs.
#[derive(Clone, Copy, Debug)]
pub enum Store {
    /// A sled data directory per run.
    Sled,
    /// A fresh schema on the test PostgreSQL server per run.
    Postgres,
}

impl Store {
    /// A new world on this kind of store.
    pub fn world(self) -> World {
        match self {
            Store::Sled => World::new(),
            Store::Postgres => World::on_postgres(),
        }
    }
}

/// What a finished run of a scenario left behind.
pub struct Outcome {
    /// The session.
    pub session: String,
    /// Answers, one per turn.
    pub answers: Vec<String>,
    /// Processes that died at a crash point or by SIGKILL.
    pub crashes: usize,
    /// The crash points processes died at.
    pub points: BTreeSet<String>,
    /// Whether a `mneme run` of it died (not only the operator's commands).
    pub run_crashed: bool,
}

/// How a run is disturbed.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// `MNEME_CRASH_AT` for every `mneme run` of the scenario.
    pub crash_at: Option<String>,
    /// `MNEME_CRASH_AT` for the first resume after a crash.
    pub nested: Option<String>,
    /// SIGKILL each `mneme run` this many milliseconds after it starts.
    pub kill_after_ms: Option<u64>,
}

async fn output(
    mut command: Command,
    crash_at: Option<&str>,
    kill_after_ms: Option<u64>,
) -> Output {
    if let Some(spec) = crash_at {
        command.env("MNEME_CRASH_AT", spec);
    }
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let Some(ms) = kill_after_ms else {
        return child.wait_with_output().await.unwrap();
    };
    let pid = child.id().unwrap() as i32;
    let waiting = tokio::spawn(child.wait_with_output());
    // Time, not a barrier: the kill lands at a random instant of the run.
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our
    // child's and is not reaped until `waiting` finishes.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    waiting.await.unwrap().unwrap()
}

/// Runs every turn of `scenario` in `env`, disturbed by `faults`, and
/// brings the session to its end the way an operator would: `mneme resume`
/// after a crash, `mneme resolve` for calls in doubt (skip when the effect is
/// on record, retry when it is not), `mneme approve` for calls that wait
/// for approval; the nested crash is armed on each of those until one dies.
pub async fn run(scenario: &Scenario, env: &Env, faults: &Faults) -> Result<Outcome, String> {
    run_with(scenario, env, faults, None).await
}

/// [`run`], with the power cut after every process that dies, before the
/// next command (`cli/tests/power_cut.rs`).
pub async fn run_with(
    scenario: &Scenario,
    env: &Env,
    faults: &Faults,
    power_cut: Option<&PowerCut>,
) -> Result<Outcome, String> {
    let mut session = None::<String>;
    let mut answers = Vec::new();
    let mut operator = Operator {
        env,
        nested: faults.nested.clone(),
        deaths: Deaths::default(),
        power_cut,
    };
    let mut run_crashed = false;
    for turn in &scenario.turns {
        let mut command = env.world.mneme();
        match &session {
            None => command.args(["run", "--agent", env.agent.to_str().unwrap(), turn]),
            Some(id) => command.args(["run", "--session", id, turn]),
        };
        if let Some(cut) = power_cut {
            cut.configure(&mut command);
        }
        let out = output(command, faults.crash_at.as_deref(), faults.kill_after_ms).await;
        run_crashed |= operator.note(&out);
        let id = match &session {
            Some(id) => id.clone(),
            None => {
                let Some(id) = named_session(&out) else {
                    // Killed before it named the session: start over, undisturbed,
                    // as a user would.
                    let again =
                        Box::pin(run_with(scenario, env, &Faults::default(), power_cut)).await?;
                    let mut deaths = operator.deaths;
                    deaths.points.extend(again.points);
                    return Ok(Outcome {
                        crashes: again.crashes + deaths.count,
                        points: deaths.points,
                        run_crashed,
                        ..again
                    });
                };
                session = Some(id.clone());
                id
            }
        };
        let mut answer = match out.status.code() {
            Some(0) => stdout(&out).trim().to_string(),
            _ => operator.settle(&id).await?,
        };
        // A process that died before it recorded the message (say, while
        // opening the log) never took the turn: the user sends it again.
        let recorded = log_events(&env.world, &id)
            .await
            .iter()
            .filter(|e| e["kind"] == "UserMessage")
            .count();
        if recorded <= answers.len() {
            let mut again = env.world.mneme();
            again.args(["run", "--session", &id, turn]);
            if let Some(cut) = power_cut {
                cut.configure(&mut again);
            }
            let out = output(again, None, None).await;
            answer = match out.status.code() {
                Some(0) => stdout(&out).trim().to_string(),
                Some(3) => operator.settle(&id).await?,
                code => {
                    return Err(format!(
                        "sending turn {turn:?} again exited {code:?}: {}",
                        stderr(&out)
                    ))
                }
            };
        }
        answers.push(answer);
    }
    Ok(Outcome {
        session: session.unwrap_or_default(),
        answers,
        crashes: operator.deaths.count,
        points: operator.deaths.points,
        run_crashed,
    })
}

/// The processes of a run that died, and the crash points they died at.
#[derive(Default)]
struct Deaths {
    count: usize,
    points: BTreeSet<String>,
}

impl Deaths {
    /// Notes `out`'s process if it died; whether it did.
    fn note(&mut self, out: &Output) -> bool {
        if out.status.code().is_some() {
            return false;
        }
        self.count += 1;
        let said = stderr(out);
        if let Some(at) = said.find(eventlog::crash::REACHED) {
            let rest = &said[at + eventlog::crash::REACHED.len()..];
            if let Some(name) = rest.split_whitespace().next() {
                self.points.insert(name.to_string());
            }
        }
        true
    }
}

/// What a person does to bring a session to its end after a crash.
struct Operator<'a> {
    env: &'a Env,
    /// `MNEME_CRASH_AT` for the operator's commands, until one dies.
    nested: Option<String>,
    deaths: Deaths,
    /// The power cut after each death, if any.
    power_cut: Option<&'a PowerCut>,
}

impl Operator<'_> {
    /// Notes `out`'s process if it died, cutting the power after it if
    /// asked; whether it died.
    fn note(&mut self, out: &Output) -> bool {
        let died = self.deaths.note(out);
        if let (true, Some(cut)) = (died, self.power_cut) {
            cut.after_death(&self.env.world);
        }
        died
    }

    /// Runs `mneme ARGS` with the nested crash armed, if it still is.
    async fn mneme(&mut self, args: &[&str]) -> Output {
        let mut command = self.env.world.mneme();
        command.args(args);
        if let Some(cut) = self.power_cut {
            cut.configure(&mut command);
        }
        let out = output(command, self.nested.as_deref(), None).await;
        if self.note(&out) {
            self.nested = None;
        }
        out
    }

    /// Resumes and decides until the session answers.
    async fn settle(&mut self, session: &str) -> Result<String, String> {
        for _ in 0..20 {
            let out = self.mneme(&["resume", session]).await;
            match out.status.code() {
                Some(0) => return Ok(stdout(&out).trim().to_string()),
                Some(3) => {
                    if let Some(answer) = self.decide(session).await? {
                        return Ok(answer);
                    }
                }
                // Like an operator, try again when the directory is still held
                // a moment after the killed process (its last tools may be
                // exiting); every invariant is still checked at the end.
                // On PostgreSQL: the killed process's lease, until it lapses.
                // The pause is time, not a barrier: a retry, as an operator
                // would, after the holder's last moment or the lease's TTL.
                Some(1)
                    if stderr(&out).contains("in use by another process")
                        || stderr(&out).contains("is leased to") =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Some(code) => return Err(format!("resume exited {code}: {}", stderr(&out))),
                None => {}
            }
        }
        Err("the session never finished".into())
    }

    /// Decides every call that waits for a person: approves those waiting
    /// for approval, resolves those in doubt by what the world shows of
    /// their effect. Returns the answer if the session finished.
    async fn decide(&mut self, session: &str) -> Result<Option<String>, String> {
        let env = self.env;
        let plan: Value = serde_json::from_str(
            stdout(&env.world.run(&["replay", "--json", session]).await).trim(),
        )
        .map_err(|e| format!("replay --json: {e}"))?;
        let keys = started_keys(&env.world, session).await;
        let effects = std::fs::read_to_string(&env.effects).unwrap_or_default();
        let remembered =
            std::fs::read_to_string(env.world.dir.path().join("memory.jsonl")).unwrap_or_default();
        for call in plan["calls"].as_array().into_iter().flatten() {
            let id = call["call_id"].as_str().unwrap();
            let mut args = match call["decision"].as_str() {
                Some("awaiting_approval") => vec!["approve", session, id],
                Some("awaiting_decision") => vec!["resolve", session, id],
                _ => continue,
            };
            if args[0] == "resolve" {
                // What the world shows of the effect, and the result it gave.
                let (happened, result) = match call["tool"].as_str() {
                    Some("mem__create_entities") => {
                        (remembered.contains("\"ada\""), REMEMBER_RESULT)
                    }
                    _ => {
                        let logged = keys
                            .get(id)
                            .is_some_and(|k| effects.lines().any(|l| l == k));
                        (logged, NOTIFY_RESULT)
                    }
                };
                match happened {
                    true => args.extend_from_slice(&["--skip", "--result", result]),
                    false => args.push("--retry"),
                }
            }
            let out = self.mneme(&args).await;
            match out.status.code() {
                Some(0) if !stdout(&out).trim().is_empty() => {
                    return Ok(Some(stdout(&out).trim().to_string()))
                }
                Some(0) | Some(3) => {}
                // Died mid-decision: the next resume shows what was recorded.
                None => return Ok(None),
                _ => return Err(format!("{} failed: {}", args[0], stderr(&out))),
            }
        }
        Ok(None)
    }
}

/// Idempotency key of each call, from its ToolStarted events.
async fn started_keys(world: &World, session: &str) -> BTreeMap<String, String> {
    log_events(world, session)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "ToolStarted")
        .map(|e| {
            let started = &e["event"]["ToolStarted"];
            (
                started["call_id"].as_str().unwrap().to_string(),
                started["idempotency_key"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every event of the session, from `mneme log --json`.
pub async fn log_events(world: &World, session: &str) -> Vec<Value> {
    let out = world.run(&["log", "--json", session]).await;
    assert!(out.status.success(), "log: {}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Prints a fault test's summary line and appends it to
/// `target/fault-summary.txt`, which CI prints after the tests (cargo hides
/// the output of passing tests).
pub fn report(line: &str) {
    use std::io::Write;
    println!("{line}");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fault-summary.txt");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(file, "{line}");
    }
}

/// What an uncrashed run of a scenario produced.
pub struct Reference {
    /// Answers, one per turn.
    pub answers: Vec<String>,
    /// Request bodies by the number of assistant messages in them.
    pub bodies: BTreeMap<usize, Vec<u8>>,
    /// The final transcript as `mneme replay --raw` rebuilds it.
    pub final_request: Vec<u8>,
    /// The sink's counts.
    pub sink: SinkStats,
    /// Kinds of events, counted.
    pub kinds: BTreeMap<String, usize>,
}

fn assistant_turn(body: &[u8]) -> usize {
    serde_json::from_slice::<Value>(body).unwrap()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .count()
}

/// Runs `scenario` without faults.
pub async fn reference(scenario: &Scenario) -> Reference {
    let env = scenario.env().await;
    let outcome = run(scenario, &env, &Faults::default()).await.unwrap();
    assert_eq!(outcome.crashes, 0);
    let kinds = count_kinds(&log_events(&env.world, &outcome.session).await);
    Reference {
        answers: outcome.answers,
        bodies: env
            .model
            .bodies()
            .into_iter()
            .map(|b| (assistant_turn(&b), as_if_uncrashed(&b)))
            .collect(),
        final_request: as_if_uncrashed(&rebuilt_request(&env.world, &outcome.session).await),
        sink: env.sink.stats(),
        kinds,
    }
}

/// `body` without what tells the model a result came from the call's
/// check, not the tool, and without when a sleep woke (its time is the
/// run's): a call a check settled after a crash then reads as the
/// uncrashed run's (the scenarios' checks answer what their tools do), and
/// everything else must be byte for byte the same.
fn as_if_uncrashed(body: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let text = text.replace(replay::prompt::SETTLED_BY_CHECK_PREFIX, "");
    without_wake_times(&text).into_bytes()
}

/// `text` (a request body) with each woken sleep's `at` and `late_seconds`
/// (in a tool result: JSON inside a JSON string) left out.
fn without_wake_times(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(r#"{\"at\":\""#) {
        let (before, from) = rest.split_at(at);
        let Some(end) = from.find(r#"\"woke\":"#) else {
            break;
        };
        out.push_str(before);
        out.push('{');
        rest = &from[end..];
    }
    out.push_str(rest);
    out
}

fn count_kinds(events: &[Value]) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for e in events {
        *kinds
            .entry(e["kind"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    kinds
}

/// Every invariant the contract promises after crashes, as a list of
/// violations (empty when all hold).
pub async fn violations(env: &Env, outcome: &Outcome, reference: &Reference) -> Vec<String> {
    let mut found = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            found.push(what);
        }
    };
    let session = &outcome.session;
    check(
        outcome.answers == reference.answers,
        format!("answers {:?} != {:?}", outcome.answers, reference.answers),
    );
    let final_request = as_if_uncrashed(&rebuilt_request(&env.world, session).await);
    check(
        final_request == reference.final_request,
        "final transcript differs".into(),
    );
    for body in env.model.bodies().iter().map(|b| as_if_uncrashed(b)) {
        let turn = assistant_turn(&body);
        check(
            reference.bodies.get(&turn) == Some(&body),
            format!("request at turn {turn} is not byte-identical to the uncrashed run's"),
        );
    }
    // (a) side effects: once per key where keys are honoured, at most once otherwise.
    let stats = env.sink.stats();
    for (path, counts) in &reference.sink.paths {
        check(
            stats.path(path).effects == counts.effects,
            format!(
                "/{path} applied {} times, expected {}",
                stats.path(path).effects,
                counts.effects
            ),
        );
    }
    check(
        stats.hits_by_key.len() == reference.sink.hits_by_key.len(),
        format!(
            "{} distinct keys reached the sink, expected {}",
            stats.hits_by_key.len(),
            reference.sink.hits_by_key.len()
        ),
    );
    // An MCP side effect that ignores keys: one entity, created once (a
    // second create_entities would answer differently, and the final
    // transcript would show it).
    let memory = std::fs::read_to_string(env.world.dir.path().join("memory.jsonl"));
    if let Ok(memory) = memory {
        let entities = memory
            .lines()
            .filter(|l| l.contains("\"name\":\"ada\""))
            .count();
        check(
            entities == 1,
            format!("server-memory holds {entities} entities ada"),
        );
        let note = std::fs::read_to_string(env.world.dir.path().join("notes/note.txt"));
        check(
            note.as_deref().ok() == Some("Ada: met"),
            format!("the note written through MCP reads {note:?}"),
        );
    }
    let effects = std::fs::read_to_string(&env.effects).unwrap_or_default();
    let lines: Vec<&str> = effects.lines().collect();
    let distinct: BTreeSet<&&str> = lines.iter().collect();
    check(
        lines.len() == distinct.len(),
        format!("a key-ignoring side effect ran twice: {lines:?}"),
    );
    if env.no_person {
        check(
            lines.len() == 1,
            format!("the checked side effect ran {} times", lines.len()),
        );
    }
    // (d) the chain verifies.
    let verify = env.world.run(&["verify", session]).await;
    check(
        verify.status.success(),
        format!("verify: {}", stdout(&verify)),
    );
    // (e) nothing lost or duplicated: every call has exactly one outcome.
    let events = log_events(&env.world, session).await;
    let kinds = count_kinds(&events);
    if env.no_person {
        check(
            !kinds.contains_key("ToolInDoubt") && !kinds.contains_key("ToolResolved"),
            format!("a call went in doubt despite its check: {kinds:?}"),
        );
    }
    for kind in ["UserMessage", "ModelReplied"] {
        check(
            kinds.get(kind) == reference.kinds.get(kind),
            format!(
                "{kind}: {:?} events, expected {:?}",
                kinds.get(kind),
                reference.kinds.get(kind)
            ),
        );
    }
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for e in &events {
        match e["kind"].as_str().unwrap() {
            "ToolFinished" => {
                *outcomes
                    .entry(
                        e["event"]["ToolFinished"]["call_id"]
                            .as_str()
                            .unwrap()
                            .into(),
                    )
                    .or_default() += 1
            }
            "ToolResolved" if e["event"]["ToolResolved"]["resolution"] != "Retry" => {
                *outcomes
                    .entry(
                        e["event"]["ToolResolved"]["call_id"]
                            .as_str()
                            .unwrap()
                            .into(),
                    )
                    .or_default() += 1
            }
            _ => {}
        }
    }
    let calls: usize = reference.kinds.get("ToolFinished").copied().unwrap_or(0);
    check(
        outcomes.len() == calls && outcomes.values().all(|&n| n == 1),
        format!("call outcomes {outcomes:?}, expected {calls} calls with one each"),
    );
    found
}
