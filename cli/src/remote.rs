//! [`Sessions`] beside a running daemon: sled admits one process per data
//! directory, so while `mneme serve` holds it, commands go through the
//! daemon's API (found from `mneme.daemon` in the data directory) and print
//! what they would print reading the log directly (they are the same
//! commands, in `commands.rs`). Requests and answers are the API's own
//! types ([`runtime::api`]), the ones the daemon's handlers take and give.

use crate::sessions::{Decision, Exported, Recorded, Sessions, Stream};
use anyhow::{anyhow, bail, Context, Result};
use daemon::DAEMON_FILE;
use replay::AgentSpec;
use runtime::api::{
    self, CreateSession, Created, DecisionAnswer, Fork, Forked, PostMessage, ReplayView, Resume,
    SessionDiff, SessionSummary, TurnOutcome, Verified,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::path::Path;
use uuid::Uuid;

/// A client of the daemon that holds a data directory, or of the command
/// that holds it and answers reads only ([`crate::reader`]).
pub struct Remote {
    base: String,
    http: reqwest::Client,
    /// What holds the directory when it answers reads only (`mneme run,
    /// pid 4242`): anything else is refused, saying what to do.
    reads_only: Option<String>,
    data_dir: std::path::PathBuf,
}

impl Remote {
    /// The daemon named by `DATA_DIR/mneme.daemon`, else the command that
    /// answers reads named by `DATA_DIR/mneme.reader`, if such a note is
    /// there and the process it names lives. The token comes from the file
    /// the note names, else (a daemon's) `$MNEME_TOKEN`.
    pub fn discover(data_dir: &Path) -> Result<Option<Remote>> {
        for file in [DAEMON_FILE, crate::reader::READER_FILE] {
            if let Some(remote) = Remote::from_note(data_dir, file)? {
                return Ok(Some(remote));
            }
        }
        Ok(None)
    }

    fn from_note(data_dir: &Path, file: &str) -> Result<Option<Remote>> {
        let path = data_dir.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        let note: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let pid = note["pid"].as_u64().and_then(|p| i32::try_from(p).ok());
        if pid.is_some_and(|pid| !process_lives(pid)) {
            return Ok(None); // left by a process that was killed
        }
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
        let reads_only = note["holder"].as_str().map(|holder| match pid {
            Some(pid) => format!("{holder}, pid {pid}"),
            None => holder.to_string(),
        });
        Ok(Some(Remote {
            base: format!("http://{addr}"),
            http,
            reads_only,
            data_dir: data_dir.to_path_buf(),
        }))
    }

    /// Refuses what would write, when the holder answers reads only.
    fn writable(&self) -> Result<()> {
        match &self.reads_only {
            None => Ok(()),
            Some(holder) => bail!(
                "the data directory {} is in use by another process ({holder}), which lets other commands read it but not change it: wait for it to finish, or run sessions under `mneme serve`, which takes any number of commands side by side",
                self.data_dir.display()
            ),
        }
    }

    /// Where the daemon listens, as `http://ADDR`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A one-time code that signs a browser in to the web view as `name`.
    pub async fn ui_code(&self, name: &str) -> Result<api::UiCode> {
        let request = api::UiCodeRequest {
            name: name.to_string(),
        };
        self.post("/ui/codes", &request).await
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

    /// Posts a person's decision on a call (`action`: `resolve` or
    /// `approve`); the daemon records it and goes on as `body` asks.
    async fn post_decision(
        &self,
        (session, call): (Uuid, &str),
        action: &str,
        body: &impl Serialize,
        recorded: Recorded<'_>,
        stream: Stream,
    ) -> Result<DecisionAnswer> {
        if matches!(call, "." | "..") {
            // URL parsers treat these segments as directions, encoded or not.
            bail!("session {session}: no call can be named {call:?}");
        }
        let path = format!("/sessions/{session}/calls/{}/{action}", path_segment(call));
        let answer = self.post::<DecisionAnswer>(&path, body);
        let answer = self.showing_deltas(session, stream, answer);
        let answer = answer.await?;
        recorded();
        Ok(answer)
    }

    /// Runs `turn`, showing in `stream` the session's streamed text as the
    /// daemon relays it (`/deltas`).
    async fn showing_deltas<T>(
        &self,
        id: Uuid,
        stream: Stream,
        turn: impl std::future::Future<Output = T>,
    ) -> T {
        let Some(shown) = stream else {
            return turn.await;
        };
        let url = format!("{}/sessions/{id}/deltas", self.base);
        // Subscribed before the turn starts: nothing is missed.
        let Ok(mut response) = self.http.get(url).send().await else {
            return turn.await;
        };
        let heard = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = heard.clone();
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
        result
    }
}

#[async_trait::async_trait]
impl Sessions for Remote {
    async fn create(&self, spec: AgentSpec, first_message: Option<String>) -> Result<Uuid> {
        self.writable()?;
        let create = CreateSession {
            agent: None,
            spec: Some(spec),
            first_message,
        };
        let created: Created = self.post("/sessions", &create).await?;
        Ok(created.session)
    }

    async fn list(&self) -> Result<Vec<SessionSummary>> {
        self.get("/sessions").await
    }

    async fn ids(&self) -> Result<Vec<Uuid>> {
        Ok(self.list().await?.into_iter().map(|r| r.session).collect())
    }

    async fn events(&self, id: Uuid) -> Result<Vec<Value>> {
        self.get(&format!("/sessions/{id}/events")).await
    }

    async fn verify(&self, id: Uuid) -> Result<Verified> {
        self.get(&format!("/sessions/{id}/verify")).await
    }

    async fn replay(&self, id: Uuid) -> Result<ReplayView> {
        self.get(&format!("/sessions/{id}/replay")).await
    }

    async fn cache_report(&self, id: Uuid) -> Result<runtime::api::CacheReport> {
        self.get(&format!("/sessions/{id}/cache")).await
    }

    async fn erase(&self, id: Uuid, erase: runtime::api::Erase) -> Result<runtime::api::Erased> {
        self.writable()?;
        let path = format!("/sessions/{id}");
        let request = self
            .http
            .delete(format!("{}{path}", self.base))
            .json(&erase);
        answer(&path, self.call(request).await?).await
    }

    async fn fork(&self, id: Uuid, at: u64, spec: Option<AgentSpec>) -> Result<Forked> {
        self.writable()?;
        self.post(&format!("/sessions/{id}/fork"), &Fork { at, spec })
            .await
    }

    async fn diff(&self, a: Uuid, b: Uuid) -> Result<SessionDiff> {
        self.get(&format!("/sessions/{a}/diff/{b}")).await
    }

    async fn blob(&self, id: Uuid, digest: &str) -> Result<Vec<u8>> {
        let request = self
            .http
            .get(format!("{}/sessions/{id}/blobs/{digest}", self.base));
        Ok(self.call(request).await?.bytes().await?.to_vec())
    }

    async fn next_request(&self, id: Uuid) -> Result<Vec<u8>> {
        let request = self
            .http
            .get(format!("{}/sessions/{id}/request", self.base));
        Ok(self.call(request).await?.bytes().await?.to_vec())
    }

    async fn post_message(
        &self,
        id: Uuid,
        message: PostMessage,
        stream: Stream,
    ) -> Result<TurnOutcome> {
        self.writable()?;
        let message = PostMessage {
            wait: true,
            ..message
        };
        let path = format!("/sessions/{id}/messages");
        let turn = self.post::<TurnOutcome>(&path, &message);
        let outcome = self.showing_deltas(id, stream, turn).await;
        outcome.with_context(|| format!("session {id}"))
    }

    async fn start(&self, id: Uuid, stream: Stream) -> Result<TurnOutcome> {
        // The daemon runs a session's first turn on a resume.
        self.resume(id, false, stream).await
    }

    async fn resume(&self, id: Uuid, extend: bool, stream: Stream) -> Result<TurnOutcome> {
        self.writable()?;
        let resume = Resume { wait: true, extend };
        let path = format!("/sessions/{id}/resume");
        let turn = self.post::<TurnOutcome>(&path, &resume);
        self.showing_deltas(id, stream, turn).await
    }

    async fn create_schedule(
        &self,
        request: runtime::api::CreateSchedule,
        spec: Option<AgentSpec>,
    ) -> Result<Uuid> {
        self.writable()?;
        let body = runtime::api::CreateSchedule { spec, ..request };
        let created: runtime::api::ScheduleCreated = self.post("/schedules", &body).await?;
        Ok(created.schedule)
    }

    async fn schedules(&self) -> Result<Vec<runtime::api::ScheduleView>> {
        self.get("/schedules").await
    }

    async fn remove_schedule(&self, id: Uuid) -> Result<()> {
        self.writable()?;
        let request = self.http.delete(format!("{}/schedules/{id}", self.base));
        self.call(request).await?;
        Ok(())
    }

    async fn wake(
        &self,
        id: Uuid,
        wake: runtime::api::Wake,
        stream: Stream,
    ) -> Result<TurnOutcome> {
        self.writable()?;
        let body = runtime::api::Wake { wait: true, ..wake };
        let path = format!("/sessions/{id}/wake");
        let turn = self.post::<TurnOutcome>(&path, &body);
        self.showing_deltas(id, stream, turn).await
    }

    async fn decide(
        &self,
        id: Uuid,
        call: &str,
        decision: Decision,
        recorded: Recorded<'_>,
        stream: Stream,
    ) -> Result<DecisionAnswer> {
        self.writable()?;
        let action = decision.action();
        self.post_decision((id, call), action, &decision, recorded, stream)
            .await
    }

    async fn rerun(
        &self,
        id: Uuid,
        spec: AgentSpec,
        live_tools: bool,
        started: crate::sessions::Started<'_>,
    ) -> Result<runtime::api::RerunReport> {
        self.writable()?;
        // The daemon runs every turn and answers once the rerun is done.
        let body = runtime::api::Rerun { spec, live_tools };
        let report: runtime::api::RerunReport =
            self.post(&format!("/sessions/{id}/rerun"), &body).await?;
        started(report.rerun.session);
        Ok(report)
    }

    async fn add_tenant(&self, request: api::CreateTenant, _by: &str) -> Result<api::TenantToken> {
        self.writable()?;
        self.post("/tenants", &request).await
    }

    async fn tenants(&self) -> Result<Vec<api::TenantView>> {
        self.get("/tenants").await
    }

    async fn issue_token(&self, name: &str, _by: &str) -> Result<api::TenantToken> {
        self.writable()?;
        let path = format!("/tenants/{}/tokens", path_segment(name));
        self.post(&path, &Value::Null).await
    }

    async fn revoke_tokens(&self, name: &str, _by: &str) -> Result<api::TokensRevoked> {
        self.writable()?;
        let path = format!("/tenants/{}/tokens", path_segment(name));
        let request = self.http.delete(format!("{}{path}", self.base));
        answer(&path, self.call(request).await?).await
    }

    async fn set_tenant(
        &self,
        name: &str,
        set: api::SetTenant,
        _by: &str,
    ) -> Result<api::TenantView> {
        self.writable()?;
        let path = format!("/tenants/{}", path_segment(name));
        let request = self.http.patch(format!("{}{path}", self.base)).json(&set);
        answer(&path, self.call(request).await?).await
    }

    async fn erase_tenant(&self, name: &str, erase: api::EraseTenant) -> Result<api::TenantErased> {
        self.writable()?;
        let path = format!("/tenants/{}", path_segment(name));
        let request = self
            .http
            .delete(format!("{}{path}", self.base))
            .json(&erase);
        answer(&path, self.call(request).await?).await
    }

    async fn spend(&self, query: api::SpendQuery) -> Result<api::SpendReport> {
        let request = self.http.get(format!("{}/spend", self.base)).query(&query);
        answer("/spend", self.call(request).await?).await
    }

    async fn export(&self, _: Option<Uuid>, _: Option<&Path>) -> Result<Exported> {
        Err(self.holds_the_store())
    }

    async fn import(
        &self,
        _: Option<&Path>,
        _: runtime::store::Policy,
    ) -> Result<crate::sessions::ImportReport> {
        Err(self.holds_the_store())
    }
}

impl Remote {
    /// The refusal of what needs the store itself (`export`, `import`).
    fn holds_the_store(&self) -> anyhow::Error {
        match &self.reads_only {
            Some(holder) => anyhow!(
                "the data directory {} is in use by another process ({holder}): export and import need the store itself; wait for it to finish",
                self.data_dir.display()
            ),
            None => anyhow!(
                "the data directory is held by the daemon at {}: stop it, then export or import",
                self.base
            ),
        }
    }
}
/// Whether process `pid` runs (on this host).
fn process_lives(pid: i32) -> bool {
    // Signal 0 checks without sending; EPERM: it runs, as another user.
    let signalled = unsafe { libc::kill(pid, 0) };
    signalled == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
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
