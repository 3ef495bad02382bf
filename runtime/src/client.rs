//! The CLI beside a running daemon: sled admits one process per data
//! directory, so while `mneme serve` holds it, commands go through the
//! daemon's API (found from `mneme.daemon` in the data directory) and print
//! what they would print reading the log directly.

use crate::{Command, JsonFlag};
use anyhow::{anyhow, bail, Context, Result};
use mneme_runtime::agent::load_agent_file;
use mneme_runtime::daemon::DAEMON_FILE;
use mneme_runtime::views;
use serde_json::{json, Value};
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
        let token = mneme_runtime::daemon::token::trimmed(&token);
        mneme_runtime::text::register_secret(token);
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
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let error = body["error"]
            .as_str()
            .map_or_else(|| status.to_string(), String::from);
        Err(anyhow!("{error}"))
    }

    async fn get(&self, path: &str) -> Result<Value> {
        Ok(self
            .call(self.http.get(format!("{}{path}", self.base)))
            .await?
            .json()
            .await?)
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        let request = self.http.post(format!("{}{path}", self.base)).json(&body);
        Ok(self.call(request).await?.json().await?)
    }

    /// Ids of the sessions whose status (with `paused-unattended` for a pause
    /// no person has to end) `keep` accepts.
    async fn session_ids(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<Uuid>> {
        let rows = self.get("/sessions").await?;
        Ok(rows
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                // Paused waiting for a person is not "pending work" for resume.
                let status = match (r["status"].as_str()?, r["waits_for_a_person"].as_bool()) {
                    ("paused", Some(false)) => "paused-unattended",
                    (status, _) => status,
                };
                keep(status).then(|| r["session"].as_str()?.parse().ok())?
            })
            .collect())
    }

    /// `one` if given, else every session whose status `keep` accepts.
    async fn this_or_every(
        &self,
        one: Option<Uuid>,
        keep: impl Fn(&str) -> bool,
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
        body: Value,
        verb: &str,
        json: JsonFlag,
    ) -> Result<ExitCode> {
        if matches!(call, "." | "..") {
            // URL parsers treat these segments as directions, encoded or not.
            bail!("session {session}: no call can be named {call:?}");
        }
        let path = format!("/sessions/{session}/calls/{}/{action}", path_segment(call));
        let answer = self.post(&path, body).await?;
        say!("session {session}: call {call} {verb}");
        if answer["status"].is_null() {
            return Ok(ExitCode::SUCCESS); // recorded; not continued
        }
        report(session, answer, json)
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
                        let spec = load_agent_file(&path)?;
                        let created = self.post("/sessions", json!({ "spec": spec })).await?;
                        created["session"].as_str().context("no session id")?.parse()?
                    }
                    (None, None) => bail!("mneme run needs --agent FILE to start a session, or --session ID to continue one"),
                };
                say!("session {id}");
                let path = format!("/sessions/{id}/messages");
                let turn = self.post(&path, json!({"text": a.message, "wait": true}));
                let (end, streamed) = match a.json.json {
                    true => (turn.await, false),
                    false => self.showing_deltas(id, turn).await,
                };
                let end = end.with_context(|| format!("session {id}"))?;
                let end = views::turn_end_from(&end)
                    .with_context(|| format!("the daemon answered an unknown turn end: {end}"))?;
                crate::commands::report_end(id, &end, a.json.json, streamed)
            }
            Command::Resume(a) => {
                let pending =
                    |status: &str| matches!(status, "running" | "failed" | "paused-unattended");
                let ids = self.this_or_every(a.session, pending).await?;
                let mut worst = ExitCode::SUCCESS;
                for id in ids {
                    say!("session {id}");
                    let end = self
                        .post(
                            &format!("/sessions/{id}/resume"),
                            json!({"wait": true, "extend": a.extend}),
                        )
                        .await?;
                    let code = report(id, end, JsonFlag { json: a.json.json })?;
                    if code != ExitCode::SUCCESS {
                        worst = code;
                    }
                }
                Ok(worst)
            }
            Command::Sessions(a) => {
                let rows = self.get("/sessions").await?;
                crate::render::sessions(rows.as_array().map_or(&[][..], Vec::as_slice), a.json);
                Ok(ExitCode::SUCCESS)
            }
            Command::Log(a) => {
                let rows = self.get(&format!("/sessions/{}/events", a.session)).await?;
                crate::timeline::print(rows.as_array().map_or(&[][..], Vec::as_slice), &a)
            }
            Command::Verify(a) => {
                let ids = self.this_or_every(a.session, |_| true).await?;
                let mut results = Vec::new();
                for id in ids {
                    results.push(self.get(&format!("/sessions/{id}/verify")).await?);
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
                let view = self.get(&format!("/sessions/{}/replay", a.session)).await?;
                crate::render::replay(&view, a.json.json)?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Resolve(a) => {
                let mut body = decision_body(&a.decision);
                match (a.retry, a.result, a.fail) {
                    (true, _, _) => body["retry"] = json!(true),
                    (_, Some(result), None) => {
                        body["skip"] = serde_json::from_str(&result)
                            .with_context(|| format!("--result is not JSON: {result:?}"))?
                    }
                    (_, _, Some(message)) => body["fail"] = json!(message),
                    _ => bail!("give one of --retry, --skip --result JSON, --fail MSG"),
                }
                let call = (a.session, a.call_id.as_str());
                self.decide(call, "resolve", body, "resolved", a.decision.json)
                    .await
            }
            Command::Approve(a) => {
                let mut body = decision_body(&a.decision);
                body["approved"] = json!(!a.deny);
                let verb = if a.deny { "denied" } else { "approved" };
                self.decide(
                    (a.session, a.call_id.as_str()),
                    "approve",
                    body,
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

/// The fields of a decision's request body that every decision has.
fn decision_body(decision: &crate::Decision) -> Value {
    let go_on = !decision.no_resume;
    json!({"by": decision.by, "wait": go_on, "continue": go_on})
}

fn report(id: Uuid, end: Value, json: JsonFlag) -> Result<ExitCode> {
    let end = views::turn_end_from(&end)
        .with_context(|| format!("the daemon answered an unknown turn end: {end}"))?;
    crate::commands::report_end(id, &end, json.json, false)
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
