//! The commands: each opens the log, does one thing, prints, and returns an
//! exit code.

use crate::{Cli, Command, JsonFlag, EXIT_NEEDS_DECISION};
use anyhow::{bail, Context, Result};
use eventlog::{Durability, EventLog, SledLog};
use mneme_runtime::agent::load_agent_file;
use mneme_runtime::runner::in_doubt;
use mneme_runtime::session::read_events;
use mneme_runtime::{Runner, Session, TurnEnd};
use replay::{messages, plan, request_body, CallDecision, Event, NextStep, Resolution, Status};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use uuid::Uuid;

/// Runs the command `cli` names.
pub async fn dispatch(cli: Cli) -> Result<ExitCode> {
    let data_dir = cli.data_dir.clone().unwrap_or_else(default_data_dir);
    let durability = cli.durability;
    match cli.command {
        Command::Demo(args) => crate::demo::run(args.keep).await,
        command => {
            let log = SledLog::open(&data_dir)?;
            if let Some(torn) = log.torn_tail() {
                eprintln!(
                    "mneme: warning: the write-ahead file ended in a partial write ({} bytes, never acknowledged); moved to {}",
                    torn.bytes,
                    torn.saved_to.display()
                );
            }
            let log: Arc<dyn EventLog> = Arc::new(log);
            let ctx = Ctx { log, durability };
            match command {
                Command::Run(a) => ctx.run(a.agent, a.session, a.message, a.json).await,
                Command::Resume(a) => ctx.resume(a.session, a.json).await,
                Command::Sessions(a) => ctx.sessions(a),
                Command::Log(a) => crate::timeline::print(ctx.log.as_ref(), &a),
                Command::Verify(a) => ctx.verify(a.session, a.json),
                Command::Replay(a) => ctx.replay(a.session, a.raw, a.json.json),
                Command::Resolve(a) => ctx.resolve(a).await,
                Command::Demo(_) => unreachable!("handled above"),
            }
        }
    }
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
    log: Arc<dyn EventLog>,
    durability: Durability,
}

impl Ctx {
    async fn run(
        &self,
        agent: Option<PathBuf>,
        id: Option<Uuid>,
        message: String,
        json: JsonFlag,
    ) -> Result<ExitCode> {
        let mut session = match (id, agent) {
            (Some(id), _) => {
                let session = Session::load(self.log.clone(), id)?;
                let status = session.state().status();
                if !matches!(status, Status::Idle | Status::Failed) {
                    bail!("session {id} is {status} with an unfinished turn: run `mneme resume {id}` (or resolve its calls) before sending a new message");
                }
                session
            }
            (None, Some(path)) => {
                let spec = load_agent_file(&path)?;
                Session::create(self.log.clone(), spec)?
            }
            (None, None) => bail!(
                "mneme run needs --agent FILE to start a session, or --session ID to continue one"
            ),
        };
        eprintln!("session {}", session.id());
        session.append(vec![Event::UserMessage { text: message }], None)?;
        mneme_runtime::crash::point("user_message_appended");
        session.barrier(self.durability)?;
        mneme_runtime::crash::point("user_message_durable");
        self.drive(&mut session, json.json).await
    }

    async fn drive(&self, session: &mut Session, json: bool) -> Result<ExitCode> {
        let end = Runner::new(self.durability)
            .drive(session)
            .await
            .with_context(|| format!("session {}", session.id()))?;
        report_end(session.id(), &end, json)
    }

    async fn resume(&self, id: Option<Uuid>, json: JsonFlag) -> Result<ExitCode> {
        let ids = match id {
            Some(id) => vec![id],
            None => self.resumable()?,
        };
        let mut worst = ExitCode::SUCCESS;
        for id in ids {
            let mut session = Session::load(self.log.clone(), id)?;
            let state = session.state();
            if (state.paused.is_some() || state.failed.is_some()) && in_doubt(&session).is_empty() {
                session.append(
                    vec![Event::SessionResumed {
                        by: "mneme resume".into(),
                    }],
                    None,
                )?;
            }
            eprintln!("session {id}");
            let code = self.drive(&mut session, json.json).await?;
            if code != ExitCode::SUCCESS {
                worst = code;
            }
        }
        Ok(worst)
    }

    /// Sessions with pending work that no person needs to decide on.
    fn resumable(&self) -> Result<Vec<Uuid>> {
        let mut out = Vec::new();
        for meta in self.log.sessions()? {
            let session = Session::load(self.log.clone(), meta.session)?;
            let status = session.state().status();
            let pending = matches!(status, Status::Running | Status::Failed)
                || (status == Status::Paused && in_doubt(&session).is_empty());
            if pending {
                out.push(meta.session);
            }
        }
        Ok(out)
    }

    fn sessions(&self, json: JsonFlag) -> Result<ExitCode> {
        if !json.json {
            println!(
                "{:<36}  {:<16}  {:<7}  {:>7}  {:<24}  {:>6}",
                "SESSION", "AGENT", "STATUS", "EVENTS", "LAST ACTIVITY", "CACHE"
            );
        }
        for meta in self.log.sessions()? {
            let session = Session::load(self.log.clone(), meta.session)?;
            let state = session.state();
            let agent = state.spec.as_ref().map_or("", |s| s.name.as_str());
            let last = crate::timeline::format_time(meta.updated_ms);
            let ratio = state.totals.cache_hit_ratio();
            if json.json {
                println!(
                    "{}",
                    json!({
                        "session": meta.session, "agent": agent, "status": state.status().to_string(),
                        "events": meta.events, "created": crate::timeline::format_time(meta.created_ms),
                        "last_activity": last, "model_calls": state.totals.model_calls,
                        "prompt_tokens": state.totals.prompt_tokens, "completion_tokens": state.totals.completion_tokens,
                        "cached_tokens": state.totals.cached_tokens, "cache_hit_ratio": ratio, "cost": state.totals.cost,
                    })
                );
            } else {
                println!(
                    "{:<36}  {:<16}  {:<7}  {:>7}  {:<24}  {:>5.1}%",
                    meta.session,
                    agent,
                    state.status(),
                    meta.events,
                    last,
                    ratio * 100.0
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    fn verify(&self, id: Option<Uuid>, json: JsonFlag) -> Result<ExitCode> {
        let ids = match id {
            Some(id) => vec![id],
            None => self
                .log
                .sessions()?
                .into_iter()
                .map(|m| m.session)
                .collect(),
        };
        let mut broken = 0;
        for id in &ids {
            let result = self
                .log
                .verify(*id)
                .map_err(anyhow::Error::from)
                .and_then(|n| {
                    // Every record must also decode as an event this build knows.
                    read_events(self.log.as_ref(), *id)?;
                    Ok(n)
                });
            let head = self
                .log
                .head(*id)
                .map(|h| h.hash.to_hex())
                .unwrap_or_default();
            match (&result, json.json) {
                (Ok(n), true) => println!(
                    "{}",
                    json!({"session": id, "ok": true, "events": n, "head": head})
                ),
                (Ok(n), false) => println!("ok    {id}  {n} events, head {}", &head[..16]),
                (Err(e), true) => println!(
                    "{}",
                    json!({"session": id, "ok": false, "error": e.to_string()})
                ),
                (Err(e), false) => println!("FAIL  {id}  {e}"),
            }
            broken += usize::from(result.is_err());
        }
        if broken > 0 {
            eprintln!("mneme: verify: {broken} of {} sessions failed", ids.len());
            return Ok(ExitCode::FAILURE);
        }
        Ok(ExitCode::SUCCESS)
    }

    fn replay(&self, id: Uuid, raw: bool, json: bool) -> Result<ExitCode> {
        let session = Session::load(self.log.clone(), id)?;
        let state = session.state();
        let spec = session.spec()?;
        let msgs = messages(state);
        let body = request_body(spec, &msgs);
        let digest = replay::digest_hex(&body);
        let plan = plan(state);
        if raw {
            use std::io::Write;
            std::io::stdout().write_all(&body)?;
            return Ok(ExitCode::SUCCESS);
        }
        let calls: Vec<serde_json::Value> = plan
            .calls
            .iter()
            .map(|c| {
                let (decision, reason) = describe_decision(&c.decision);
                json!({"call_id": c.call_id, "tool": c.tool, "decision": decision, "reason": reason})
            })
            .collect();
        let next = describe_next(&plan.next);
        if json {
            let request: serde_json::Value = serde_json::from_slice(&body)?;
            println!(
                "{}",
                json!({"session": id, "status": state.status().to_string(), "next": next, "calls": calls, "request_digest": digest, "request": request})
            );
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "Session {id} ({}), {} events, status {}",
            spec.name,
            state.last_seq,
            state.status()
        );
        println!(
            "\nRebuilt prompt: {} messages, request body {} bytes, SHA-256 {}",
            msgs.len(),
            body.len(),
            &digest[..16]
        );
        for m in &msgs {
            println!("{}", serde_json::to_string(m)?);
        }
        println!("\nResume plan: {next}");
        for c in calls {
            println!(
                "  {} {}: {} {}",
                c["call_id"].as_str().unwrap_or(""),
                c["tool"].as_str().unwrap_or(""),
                c["decision"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or("")
            );
        }
        Ok(ExitCode::SUCCESS)
    }

    async fn resolve(&self, a: crate::ResolveArgs) -> Result<ExitCode> {
        let mut session = Session::load(self.log.clone(), a.session)?;
        let doubts = in_doubt(&session);
        if !doubts.iter().any(|(id, _)| *id == a.call_id) {
            let open: Vec<&str> = doubts.iter().map(|(id, _)| id.as_str()).collect();
            bail!(
                "session {}: call {:?} is not in doubt (calls in doubt: {})",
                a.session,
                a.call_id,
                if open.is_empty() {
                    "none".to_string()
                } else {
                    open.join(", ")
                }
            );
        }
        let resolution = match (a.retry, a.result, a.fail) {
            (true, _, _) => Resolution::Retry,
            (_, Some(result), None) => {
                let value: serde_json::Value = serde_json::from_str(&result)
                    .with_context(|| format!("--result is not JSON: {result:?}"))?;
                Resolution::Skip(value.to_string())
            }
            (_, _, Some(message)) => Resolution::Fail(message),
            _ => bail!("give one of --retry, --skip --result JSON, --fail MSG"),
        };
        let mut events = vec![Event::ToolResolved {
            call_id: a.call_id.clone(),
            resolution,
            by: a.by.clone(),
        }];
        if doubts.len() == 1 {
            events.push(Event::SessionResumed { by: a.by });
        }
        session.append(events, None)?;
        session.barrier(self.durability)?;
        mneme_runtime::crash::point("decision_appended");
        eprintln!("session {}: call {} resolved", a.session, a.call_id);
        if a.no_resume || doubts.len() > 1 {
            return Ok(ExitCode::SUCCESS);
        }
        self.drive(&mut session, a.json.json).await
    }
}

fn describe_decision(decision: &CallDecision) -> (&'static str, String) {
    match decision {
        CallDecision::Reuse => ("reuse", "finished: its recorded result is reused".into()),
        CallDecision::Run => ("run", "never started".into()),
        CallDecision::Rerun => (
            "rerun",
            "started, not finished; safe to run again with the same idempotency key".into(),
        ),
        CallDecision::InDoubt(reason) => ("in_doubt", reason.clone()),
        CallDecision::AwaitingDecision(reason) => ("awaiting_decision", reason.clone()),
    }
}

fn describe_next(next: &NextStep) -> String {
    match next {
        NextStep::Nothing => "nothing: the last turn is answered".into(),
        NextStep::CallModel => "call the model".into(),
        NextStep::RunTools => "run tools".into(),
        NextStep::AwaitDecision => "wait for a person's decision (mneme resolve)".into(),
        NextStep::Paused(reason) => format!("paused: {reason}"),
        NextStep::Failed(error) => format!("failed: {error} (mneme resume tries again)"),
    }
}

fn report_end(id: Uuid, end: &TurnEnd, json: bool) -> Result<ExitCode> {
    match end {
        TurnEnd::Answered(answer) => {
            if json {
                println!(
                    "{}",
                    json!({"session": id, "status": "idle", "answer": answer})
                );
            } else {
                println!("{answer}");
            }
            Ok(ExitCode::SUCCESS)
        }
        TurnEnd::NeedsDecision(calls) => {
            if json {
                let calls: Vec<_> = calls
                    .iter()
                    .map(|(c, r)| json!({"call_id": c, "reason": r}))
                    .collect();
                println!(
                    "{}",
                    json!({"session": id, "status": "paused", "in_doubt": calls})
                );
            }
            eprintln!("mneme: session {id} paused: tool calls in doubt need a decision");
            for (call, reason) in calls {
                eprintln!("  {call}: {reason}");
                eprintln!(
                    "    mneme resolve {id} {call} --retry | --skip --result JSON | --fail MSG"
                );
            }
            Ok(ExitCode::from(EXIT_NEEDS_DECISION))
        }
        TurnEnd::Paused(reason) => {
            bail!("session {id} is paused ({reason}): `mneme resume {id}` continues it")
        }
        TurnEnd::Failed(error) => {
            bail!("session {id} failed earlier ({error}): `mneme resume {id}` tries again")
        }
    }
}
