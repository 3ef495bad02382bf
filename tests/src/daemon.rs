//! A `mneme serve` process for tests, and a client for its API.

use crate::{eventually, mneme_bin, Sink};
use serde_json::Value;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// The token the test daemons use.
pub const TOKEN: &str = "test-token-0123456789";

/// A running daemon on a free loopback port.
pub struct DaemonProcess {
    /// The process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// HTTP client with the token set.
    pub http: reqwest::Client,
    /// Where its stderr goes, if not to the test's.
    pub log: Option<std::path::PathBuf>,
}

impl DaemonProcess {
    /// Starts `mneme serve` on `data` and waits until it answers.
    pub async fn start(data: &Path, extra: &[&str]) -> DaemonProcess {
        DaemonProcess::launch(DaemonProcess::command(data, extra), data).await
    }

    /// The `mneme serve` command [`DaemonProcess::start`] runs (on a free
    /// loopback port, with [`TOKEN`]), for a test to adjust (its output,
    /// its limits) before [`DaemonProcess::launch`].
    pub fn command(data: &Path, extra: &[&str]) -> Command {
        let mut command = Command::new(mneme_bin());
        command
            .arg("--data-dir")
            .arg(data)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env("MNEME_TOKEN", TOKEN)
            .env_remove("MNEME_CRASH_AT")
            .kill_on_drop(true);
        command
    }

    /// [`DaemonProcess::launch`] with the daemon's stderr written to `log`
    /// (read it with [`DaemonProcess::terminate_with_output`], or as it goes).
    pub async fn launch_logged(mut command: Command, data: &Path, log: &Path) -> DaemonProcess {
        command.stderr(std::fs::File::create(log).unwrap());
        let mut daemon = DaemonProcess::launch(command, data).await;
        daemon.log = Some(log.to_path_buf());
        daemon
    }

    /// Runs `command` (a `mneme serve` on `data`) and waits until the daemon
    /// says where it listens; its client sends [`TOKEN`].
    pub async fn launch(mut command: Command, data: &Path) -> DaemonProcess {
        let note = data.join("mneme.daemon");
        let _ = std::fs::remove_file(&note);
        let child = command.spawn().unwrap();
        let what = format!("the daemon to write its address in {}", note.display());
        let addr = eventually(what, Duration::from_secs(20), || async {
            std::fs::read_to_string(&note)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v["addr"].as_str().map(String::from))
        })
        .await;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {TOKEN}").parse().unwrap(),
        );
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap();
        DaemonProcess {
            child,
            base: format!("http://{addr}"),
            http,
            log: None,
        }
    }

    /// SIGTERM, then everything it wrote to stderr (see
    /// [`DaemonProcess::launch_logged`]).
    pub async fn terminate_with_output(self) -> String {
        let log = self.log.clone().expect("launched with launch_logged");
        self.terminate().await;
        std::fs::read_to_string(log).unwrap()
    }

    /// A client of this daemon that sends `token` (a tenant's, say)
    /// instead of [`TOKEN`].
    pub fn client_with(&self, token: &str) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the daemon runs")
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// GET `path`, as JSON.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self.http.get(self.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// POST `body` (JSON) to `path`.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// DELETE `path`: the status.
    pub async fn delete(&self, path: &str) -> u16 {
        let response = self.http.delete(self.url(path)).send().await.unwrap();
        response.status().as_u16()
    }

    /// Posts the message `text` to session `id` (202: a turn starts).
    pub async fn message(&self, id: &str, text: &str) -> (u16, Value) {
        let body = serde_json::json!({ "text": text });
        self.post(&format!("/sessions/{id}/messages"), &body).await
    }

    /// Posts the message `text` to session `id` and waits for the turn's
    /// end (200, and how it ended).
    pub async fn message_and_wait(&self, id: &str, text: &str) -> (u16, Value) {
        let body = serde_json::json!({ "text": text, "wait": true });
        self.post(&format!("/sessions/{id}/messages"), &body).await
    }

    /// POST with owned arguments, for many requests at once.
    pub async fn post_owned(&self, path: String, body: Value) -> (u16, Value) {
        self.post(&path, &body).await
    }

    /// Asserts that each of `ids` verifies and ended with `answer`.
    pub async fn assert_verified_with_answer(&self, ids: &[String], answer: &str) {
        for id in ids {
            let (_, verified) = self.get(&format!("/sessions/{id}/verify")).await;
            assert_eq!(verified["ok"], true, "{verified}");
            let (_, session) = self.get(&format!("/sessions/{id}")).await;
            assert_eq!(session["answer"], answer, "{session}");
        }
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics_text(&self) -> String {
        let response = self.http.get(self.url("/metrics")).send().await.unwrap();
        response.text().await.unwrap()
    }

    /// The value of an unlabelled counter or gauge from `/metrics`.
    pub async fn metric(&self, name: &str) -> u64 {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in {text}"))
    }

    /// Creates a session from an agent file's text; returns its id.
    pub async fn create(&self, agent_toml: &str) -> String {
        let response = self
            .http
            .post(self.url("/sessions"))
            .header("content-type", "application/toml")
            .body(agent_toml.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
        let body: Value = response.json().await.unwrap();
        body["session"].as_str().unwrap().to_string()
    }

    /// SIGKILL.
    pub async fn kill(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }

    /// SIGTERM, then the exit status.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
        unsafe {
            libc::kill(self.child.id().unwrap() as i32, libc::SIGTERM);
        }
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the daemon exits")
            .unwrap()
    }

    /// Signs in to the web view as `name` the way a browser does (a code
    /// from `POST /ui/codes`, its login link followed once): a client that
    /// sends the sign-in's cookie and key, and not the token.
    pub async fn sign_in(&self, name: &str) -> SignedIn {
        self.sign_in_with(&self.http, name).await
    }

    /// [`DaemonProcess::sign_in`], the code asked for by `http` (a client
    /// with a tenant's token, say: the sign-in is then that tenant's).
    pub async fn sign_in_with(&self, http: &reqwest::Client, name: &str) -> SignedIn {
        let response = http
            .post(self.url("/ui/codes"))
            .json(&serde_json::json!({"name": name}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let code: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 201, "{code}");
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let login = http.get(self.url(code["login"].as_str().unwrap()));
        let login = login.send().await.unwrap();
        let header = |name: &str| login.headers()[name].to_str().unwrap().to_string();
        let cookie = header("set-cookie").split(';').next().unwrap().to_string();
        let key = header("location")
            .split("#signin=")
            .nth(1)
            .unwrap()
            .to_string();
        SignedIn {
            http,
            base: self.base.clone(),
            cookie,
            key,
        }
    }

    /// Polls until every listed session is idle; returns how long it took.
    pub async fn wait_all_idle(&self, expected: usize, limit: Duration) -> Duration {
        let started = Instant::now();
        let what = format!("{expected} sessions to be idle");
        eventually(what, limit, || async {
            let (_, sessions) = self.get("/sessions?status=idle").await;
            let idle = sessions.as_array().map_or(0, Vec::len);
            if idle >= expected {
                Ok(())
            } else {
                Err(format!("{idle} idle"))
            }
        })
        .await;
        started.elapsed()
    }
}

/// Sends `posts` at once; each must be accepted (202).
pub async fn all_accepted(posts: impl IntoIterator<Item = impl Future<Output = (u16, Value)>>) {
    for (status, body) in futures_util::future::join_all(posts).await {
        assert_eq!(status, 202, "{body}");
    }
}

/// SIGKILLs `daemon` mid-load: once a fifth of `sessions` billing sessions
/// charged on `sink` (within a minute); most must not have finished
/// (emailed) by then.
pub async fn kill_mid_load(daemon: DaemonProcess, sink: &Sink, sessions: usize) {
    let fifth = (sessions / 5) as u64;
    crate::effects_reach(sink, "charge", fifth, Duration::from_secs(60)).await;
    daemon.kill().await;
    assert!(
        sink.stats().path("email").effects < sessions as u64,
        "the kill came too late to test anything"
    );
}

/// Reads an event stream into `seen` until it contains `needle`; fails if
/// the stream stalls for 10 s or ends first.
pub async fn read_until(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    seen: &mut String,
    needle: &str,
) {
    use futures_util::StreamExt;
    while !seen.contains(needle) {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap_or_else(|_| panic!("the stream stalled before {needle}: {seen}"))
            .expect("the stream ended")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// Runs a session of two turns on `runner` (a model answering "one", then
/// "two") and follows its event stream on `watcher` from after the first
/// turn until the second answer arrives. Returns the stream's content type
/// and everything it carried.
pub async fn follow_two_turns(
    runner: &DaemonProcess,
    watcher: &DaemonProcess,
    agent_toml: &str,
) -> (String, String) {
    let id = runner.create(agent_toml).await;
    let messages = format!("/sessions/{id}/messages");
    runner
        .post(
            &messages,
            &serde_json::json!({"text": "first", "wait": true}),
        )
        .await;
    let response = watcher
        .http
        .get(watcher.url(&format!("/sessions/{id}/events?follow=true")))
        .send()
        .await
        .unwrap();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    let mut stream = response.bytes_stream();
    let mut seen = String::new();
    read_until(&mut stream, &mut seen, "\"one\"").await;
    runner
        .post(&messages, &serde_json::json!({"text": "second"}))
        .await;
    read_until(&mut stream, &mut seen, "\"two\"").await;
    (content_type, seen)
}

/// A web view sign-in, used as a browser would (no token): from
/// [`DaemonProcess::sign_in`].
pub struct SignedIn {
    http: reqwest::Client,
    base: String,
    /// `mneme_ui=…`, as the browser sends it.
    pub cookie: String,
    /// The key the page sends beside the cookie (`x-mneme-ui`).
    pub key: String,
}

impl SignedIn {
    /// A request to `path` with the sign-in's cookie and key.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        (self.http.request(method, format!("{}{path}", self.base)))
            .header("cookie", &self.cookie)
            .header("x-mneme-ui", &self.key)
    }

    /// POST `body` (JSON) to `path`: the status and the JSON answer.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self.request(reqwest::Method::POST, path).json(body);
        let response = response.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}
