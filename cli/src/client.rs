//! The CLI beside a running daemon: sled admits one process per data
//! directory, so while `mneme serve` holds it, commands go through the
//! daemon's API (found from `mneme.daemon` in the data directory) and print
//! what they would print reading the log directly. Requests and answers
//! are the API's own types ([`runtime::api`]), the ones the daemon's
//! handlers take and give.

use crate::{Command, JsonFlag};
use anyhow::{anyhow, bail, Context, Result};
use daemon::DAEMON_FILE;
use runtime::agent::load_agent_file;
use runtime::api::{
    self, Approve, CreateSession, Created, DecisionAnswer, PostMessage, ReplayView, Resolve,
    Resume, SessionSummary, TurnOutcome, Verified,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::path::Path;
use std::process::ExitCode;
use uuid::Uuid;

/// A client of the daemon that holds a data directory.
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// The daemon named by `DATA_DIR/mneme.daemon`, if the file is there.
    /// Its token comes from the file the daemon names, else `$MNEME_TOKEN`.
    pub fn discover(data_dir: &Path) -> Result<Option<Client>> {
        let path = data_dir.join(DAEMON_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        let note: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let addr = note["addr"]
            .as_str()
            .with_context(|| format!("{} names no address", path.display()))?;
        let token = match note["token_file"].as_str() {
            Some(file) => std::fs::read_to_string(file)
                .with_context(|| format!("reading the daemon's token from {file}"))?,
            None => std::env::var("MNEME_TOKEN")
                .context("the daemon's token is not in a file: set MNEME_TOKEN to it")?,
        };
        let token = daemon::token::trimmed(&token);
        runtime::text::register_secret(token);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse()?,
        );
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()?;
        Ok(Some(Client {
            base: format!("http://{addr}"),
            http,
        }))
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let response = request.send().await.with_context(|| {
            format!(
                "the daemon at {} holds this data directory but does not answer",
                self.base
            )
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let error = match response.json::<api::ApiError>().await {
            Ok(api::ApiError { error }) => error,
            Err(_) => status.to_string(),
        };
        Err(anyhow!("{error}"))
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let response = self
            .call(self.http.get(format!("{}{path}", self.base)))
            .await?;
        answer(path, response).await
    }

    async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        let request = self.http.post(format!("{}{path}", self.base)).json(body);
        answer(path, self.call(request).await?).await
    }

    /// Ids of the sessions whose row `keep` accepts.
    async fn session_ids(&self, keep: impl Fn(&SessionSummary) -> bool) -> Result<Vec<Uuid>> {
        let rows: Vec<SessionSummary> = self.get("/sessions").await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| keep(&r).then_some(r.session))
            .collect())
    }

    /// `one` if given, else every session whose row `keep` accepts.
    async fn this_or_every(
        &self,
        one: Option<Uuid>,
        keep: impl Fn(&SessionSummary) -> bool,
    ) -> Result<Vec<Uuid>> {
        match one {
            Some(id) => Ok(vec![id]),
            None => self.session_ids(keep).await,
        }
    }

    /// Posts a person's decision on a call; reports how the session went on.
    async fn decide(
        &self,
        (session, call): (Uuid, &str),
        action: &str,
        body: &impl Serialize,
        verb: &str,
        json: JsonFlag,
    ) -> Result<ExitCode> {
        if matches!(call, "." | "..") {
            // URL parsers treat these segments as directions, encoded or not.
            bail!("session {session}: no call can be named {call:?}");
        }
        let path = format!("/sessions/{session}/calls/{}/{action}", path_segment(call));
        let answer: DecisionAnswer = self.post(&path, body).await?;
        say!("session {session}: call {call} {verb}");
        match answer {
            DecisionAnswer::Ended(end) => report(session, end, json),
            DecisionAnswer::Decided(_) => Ok(ExitCode::SUCCESS), // not continued
        }
    }

    /// Runs `turn`, showing on stdout the session's streamed text as the
    /// daemon relays it (`/deltas`); whether any was shown.
    async fn showing_deltas<T>(
        &self,
        id: Uuid,
        turn: impl std::future::Future<Output = T>,
    ) -> (T, bool) {
        let url = format!("{}/sessions/{id}/deltas", self.base);
        // Subscribed before the turn starts: nothing is missed.
        let Ok(mut response) = self.http.get(url).send().await else {
            return (turn.await, false);
        };
        let out = std::sync::Arc::new(crate::commands::StreamToStdout::default());
        let heard = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (shown, counted) = (out.clone(), heard.clone());
        let reader = tokio::spawn(async move {
            let mut pending = String::new();
            while let Ok(Some(bytes)) = response.chunk().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                pending.push_str(&String::from_utf8_lossy(&bytes));
                while let Some(end) = pending.find('\n') {
                    let line: String = pending.drain(..=end).collect();
                    let text = line
                        .trim_end()
                        .strip_prefix("data:")
                        .and_then(|d| serde_json::from_str::<Value>(d.trim()).ok());
                    if let Some(text) = text.as_ref().and_then(|v| v["text"].as_str()) {
                        shown.show(text);
                    }
                }
            }
        });
        let result = turn.await;
        // The relay runs on another connection: let it drain.
        for _ in 0..10 {
            let before = heard.load(std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            if heard.load(std::sync::atomic::Ordering::SeqCst) == before {
                break;
            }
        }
        reader.abort();
        (result, out.finish())
    }

    /// Runs `command` through the daemon.
    pub async fn dispatch(&self, command: Command) -> Result<ExitCode> {
        match command {
            Command::Run(a) => {
                let id = match (a.session, a.agent) {
                    (Some(id), _) => id,
                    (None, Some(path)) => {
                        let create = CreateSession {
                            agent: None,
                            spec: Some(load_agent_file(&path)?),
                        };
                        let created: Created = self.post("/sessions", &create).await?;
                        created.session
                    }
                    (None, None) => bail!("mneme run needs --agent FILE to start a session, or --session ID to continue one"),
                };
                say!("session {id}");
                let path = format!("/sessions/{id}/messages");
                let message = PostMessage {
                    text: a.message,
                    wait: true,
                };
                let turn = self.post::<TurnOutcome>(&path, &message);
                let (end, streamed) = match a.json.json {
                    true => (turn.await, false),
                    false => self.showing_deltas(id, turn).await,
                };
                let end = end_of(end.with_context(|| format!("session {id}"))?)?;
                crate::commands::report_end(id, &end, a.json.json, streamed)
            }
            Command::Resume(a) => {
                // The daemon says which sessions have pending work no
                // person has to decide on.
                let pending = |r: &SessionSummary| r.resumable == Some(true);
                let ids = self.this_or_every(a.session, pending).await?;
                let mut worst = ExitCode::SUCCESS;
                for id in ids {
                    say!("session {id}");
                    let resume = Resume {
                        wait: true,
                        extend: a.extend,
                    };
                    let end = self
                        .post(&format!("/sessions/{id}/resume"), &resume)
                        .await?;
                    let code = report(id, end, JsonFlag { json: a.json.json })?;
                    if code != ExitCode::SUCCESS {
                        worst = code;
                    }
                }
                Ok(worst)
            }
            Command::Sessions(a) => {
                let rows: Vec<SessionSummary> = self.get("/sessions").await?;
                let rows: Vec<Value> = rows.iter().map(to_json).collect();
                crate::render::sessions(&rows, a.json);
                Ok(ExitCode::SUCCESS)
            }
            Command::Log(a) => {
                let rows: Vec<Value> = self.get(&format!("/sessions/{}/events", a.session)).await?;
                crate::timeline::print(&rows, &a)
            }
            Command::Verify(a) => {
                let ids = self.this_or_every(a.session, |_| true).await?;
                let mut results = Vec::new();
                for id in ids {
                    let verified: Verified = self.get(&format!("/sessions/{id}/verify")).await?;
                    results.push(to_json(&verified));
                }
                Ok(crate::render::verify(&results, a.json.json))
            }
            Command::Replay(a) => {
                if a.raw {
                    use std::io::Write;
                    let request = self
                        .http
                        .get(format!("{}/sessions/{}/request", self.base, a.session));
                    let body = self.call(request).await?.bytes().await?;
                    std::io::stdout().write_all(&body)?;
                    return Ok(ExitCode::SUCCESS);
                }
                let view: ReplayView = self.get(&format!("/sessions/{}/replay", a.session)).await?;
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
                let call = (a.session, a.call_id.as_str());
                self.decide(call, "resolve", &body, "resolved", a.decision.json)
                    .await
            }
            Command::Approve(a) => {
                let go_on = !a.decision.no_resume;
                let body = Approve {
                    approved: !a.deny,
                    by: a.decision.by.clone(),
                    wait: go_on,
                    proceed: go_on,
                };
                let verb = if a.deny { "denied" } else { "approved" };
                self.decide(
                    (a.session, a.call_id.as_str()),
                    "approve",
                    &body,
                    verb,
                    a.decision.json,
                )
                .await
            }
            Command::Export(_) | Command::Import(_) => anyhow::bail!(
                "the data directory is held by the daemon at {}: stop it, then export or import",
                self.base
            ),
            Command::Serve(_) | Command::Demo(_) => unreachable!("never sent to a daemon"),
        }
    }
}

/// `text` as one path segment: every byte but letters, digits and `-._~`
/// percent-encoded, so a call id (typed by a person, or printed from a
/// model's choice) can never be a path of its own (`../`), a query or a
/// fragment.
fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// A successful answer's body, as the type the API gives for `path`.
async fn answer<T: DeserializeOwned>(path: &str, response: reqwest::Response) -> Result<T> {
    let body = response.bytes().await?;
    serde_json::from_slice(&body).with_context(|| {
        format!(
            "the daemon answered {path} with what this client does not read: {}",
            String::from_utf8_lossy(&body)
        )
    })
}

fn to_json(value: &impl Serialize) -> Value {
    serde_json::to_value(value).expect("API types serialize")
}

/// The turn end an outcome tells.
fn end_of(outcome: TurnOutcome) -> Result<runtime::TurnEnd> {
    outcome.end().with_context(|| {
        format!(
            "the daemon answered an unknown turn end: {}",
            to_json(&outcome)
        )
    })
}

fn report(id: Uuid, end: TurnOutcome, json: JsonFlag) -> Result<ExitCode> {
    crate::commands::report_end(id, &end_of(end)?, json.json, false)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_path_segment_cannot_climb_or_end_the_path() {
        let hostile = "../../../sessions/0192/calls/call_0/approve?x#y";
        let encoded = super::path_segment(hostile);
        assert!(!encoded.contains(['/', '?', '#', '.']), "{encoded}");
        assert_eq!(super::path_segment("call_1-a"), "call_1-a");
        // As the client sends it: one segment, whatever the id.
        for id in [hostile, "%2e%2e", "a/b", "...", "%2e"] {
            let url = format!(
                "http://h/sessions/s/calls/{}/approve",
                super::path_segment(id)
            );
            let parsed = reqwest::Url::parse(&url).unwrap();
            let segments: Vec<&str> = parsed.path_segments().unwrap().collect();
            assert_eq!(segments.len(), 5, "{id:?} -> {parsed}");
            assert_eq!(segments[4], "approve", "{id:?} -> {parsed}");
        }
    }
}
