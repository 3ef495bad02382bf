//! Many users on one daemon: tenants that cannot see each other, whose
//! daily caps hold before a request is sent, and whose erasure destroys
//! one key. Everything through the real binary: `mneme tenant …` beside a
//! running daemon, and each tenant's token on the daemon's API.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::{DaemonProcess, TOKEN};
use mneme_e2e::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Output;

/// What a tenant says in its sessions, planted to be looked for.
const SECRET: &str = "acme's planted secret: 4111 1111 1111 1111";

/// A world, a model, a daemon holding it with a master key and an agents
/// directory with one agent, `helper`, for each of `tenants` (and the
/// operator's own); the tenants are added by the test.
struct Bed {
    world: World,
    model: MockModel,
    daemon: DaemonProcess,
    _sink: Sink,
}

/// The master key's file, outside the data directory.
fn master_key(world: &World) -> PathBuf {
    world.dir.path().join("master.key")
}

impl Bed {
    async fn start(
        replies: Vec<MockReply>,
        agent: impl Fn(&str, &Sink) -> String,
        tenants: &[&str],
    ) -> Bed {
        Bed::start_with(replies, agent, tenants, &[]).await
    }

    /// [`Bed::start`], the daemon given `extra` arguments too.
    async fn start_with(
        replies: Vec<MockReply>,
        agent: impl Fn(&str, &Sink) -> String,
        tenants: &[&str],
        extra: &[&str],
    ) -> Bed {
        let world = World::new();
        let model = MockModel::start(replies, Fault::None).await;
        let sink = Sink::start().await.unwrap();
        let agents = world.dir.path().join("agents");
        for dir in tenants
            .iter()
            .map(|t| agents.join(t))
            .chain([agents.clone()])
        {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("helper.toml"), agent(&model.base_url(), &sink)).unwrap();
        }
        let out = world
            .run(&[
                "keygen",
                "--master",
                "--out",
                master_key(&world).to_str().unwrap(),
            ])
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
        let master = master_key(&world);
        let args = [
            "--agents",
            agents.to_str().unwrap(),
            "--master-key",
            master.to_str().unwrap(),
        ];
        let daemon = DaemonProcess::start(&world.data(), &[&args[..], extra].concat()).await;
        Bed {
            world,
            model,
            daemon,
            _sink: sink,
        }
    }

    /// `mneme ARGS` beside the daemon, as its operator (the daemon's token).
    async fn mneme(&self, args: &[&str]) -> Output {
        let mut command = self.world.mneme();
        command.env("MNEME_TOKEN", TOKEN).args(args);
        command.output().await.unwrap()
    }

    /// Adds tenant `name` (`mneme tenant add NAME EXTRA`): its token.
    async fn add(&self, name: &str, extra: &[&str]) -> Client {
        let out = self
            .mneme(&[&["tenant", "add", name], extra].concat())
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stderr(&out).contains("shown this once"), "{}", stderr(&out));
        let token = stdout(&out).trim().to_string();
        assert!(token.starts_with("mnt_") && token.len() == 68, "{token}");
        self.client(&token)
    }

    fn client(&self, token: &str) -> Client {
        Client {
            http: self.daemon.client_with(token),
            base: self.daemon.base.clone(),
            token: token.to_string(),
        }
    }

    fn operator(&self) -> Client {
        self.client(TOKEN)
    }
}

/// A client of the daemon with one token.
struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    async fn send(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut request =
            (self.http).request(method.parse().unwrap(), format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send("GET", path, None).await
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send("POST", path, Some(body)).await
    }

    /// Creates a session of its `helper`; its id.
    async fn create(&self) -> String {
        let (status, created) = self.post("/sessions", &json!({"agent": "helper"})).await;
        assert_eq!(status, 201, "{created}");
        created["session"].as_str().unwrap().to_string()
    }

    /// Posts `text` to session `id` and waits for the turn's end.
    async fn turn(&self, id: &str, text: &str) -> Value {
        let body = json!({"text": text, "wait": true});
        let (status, end) = self.post(&format!("/sessions/{id}/messages"), &body).await;
        assert_eq!(status, 200, "{end}");
        end
    }
}

/// An agent whose first reply calls `refund`, which waits for approval.
fn approving_agent(model: &str, sink: &Sink) -> String {
    agent_toml(model, &[refund_needing_approval(sink)])
}

/// Every route that names a session, with a body it takes.
fn routes_naming(a: &str, b: &str) -> Vec<(&'static str, String, Option<Value>)> {
    let get = |p: String| ("GET", p, None);
    let post = |p: String, body: Value| ("POST", p, Some(body));
    vec![
        get(format!("/sessions/{a}")),
        get(format!("/sessions/{a}/events")),
        get(format!("/sessions/{a}/events?follow=true")),
        get(format!("/sessions/{a}/deltas")),
        get(format!("/sessions/{a}/verify")),
        get(format!("/sessions/{a}/replay")),
        get(format!("/sessions/{a}/request")),
        get(format!("/sessions/{a}/cache")),
        get(format!("/sessions/{a}/blobs/{}", "0".repeat(64))),
        get(format!("/sessions/{a}/diff/{b}")),
        get(format!("/sessions/{b}/diff/{a}")),
        post(
            format!("/sessions/{a}/messages"),
            json!({"text": "let me in"}),
        ),
        post(format!("/sessions/{a}/resume"), json!({})),
        post(format!("/sessions/{a}/pause"), json!({})),
        post(format!("/sessions/{a}/cancel"), json!({"by": "b"})),
        post(format!("/sessions/{a}/fork"), json!({"at": 1})),
        post(
            format!("/sessions/{a}/rerun"),
            json!({"spec": {"name": "x", "model": {"provider": "scripted", "script": "x.json"}}}),
        ),
        post(
            format!("/sessions/{a}/wake"),
            json!({"event": "payment.landed"}),
        ),
        post(
            format!("/sessions/{a}/calls/call_0_0/resolve"),
            json!({"retry": true, "by": "b"}),
        ),
        post(
            format!("/sessions/{a}/calls/call_0_0/approve"),
            json!({"approved": true, "by": "b"}),
        ),
        (
            "DELETE",
            format!("/sessions/{a}"),
            Some(json!({"reason": "b wants it gone"})),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_gets_404_on_every_route_for_another_tenants_session() {
    let replies = vec![
        MockReply::calls(&[("refund", json!({"n": 1}))]),
        MockReply::answer("Refunded."),
    ];
    let bed = Bed::start(replies, approving_agent, &["acme", "beta"]).await;
    let (acme, beta) = (bed.add("acme", &[]).await, bed.add("beta", &[]).await);
    let a = acme.create().await;
    let end = acme.turn(&a, SECRET).await;
    assert_eq!(end["status"], "paused", "waits for approval: {end}");
    let b = beta.create().await;
    beta.turn(&b, "hello").await;
    let (status, schedule) = acme
        .post(
            "/schedules",
            &json!({"agent": "helper", "every": "1h", "message": "tick"}),
        )
        .await;
    assert_eq!(status, 201, "{schedule}");
    let schedule = schedule["schedule"].as_str().unwrap().to_string();

    // A session that does not exist, for the words of every 404.
    let nowhere = "0192a000-0000-7000-8000-00000000abcd";
    for (method, path, body) in routes_naming(&a, &b) {
        let (status, refused) = beta.send(method, &path, body.as_ref()).await;
        assert_eq!(status, 404, "{method} {path}: {refused}");
        let missing = path.replace(&a, nowhere);
        let (same, words) = beta.send(method, &missing, body.as_ref()).await;
        assert_eq!(
            (
                status,
                refused["error"].as_str().unwrap().replace(&a, nowhere)
            ),
            (same, words["error"].as_str().unwrap().to_string()),
            "{method} {path}: told apart from a session that does not exist"
        );
    }
    // Nor is it listed, nor its schedule, nor its spend.
    let (_, listed) = beta.get("/sessions").await;
    let listed: Vec<&str> = (listed.as_array().unwrap().iter())
        .map(|r| r["session"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [b.as_str()]);
    let (_, schedules) = beta.get("/schedules").await;
    assert_eq!(schedules, json!([]));
    let (status, _) = beta
        .send("DELETE", &format!("/schedules/{schedule}"), None)
        .await;
    assert_eq!(status, 404);
    let into_a = json!({"into": a, "every": "1h", "message": "x"});
    assert_eq!(beta.post("/schedules", &into_a).await.0, 404);
    assert_eq!(beta.get("/spend?tenant=acme").await.0, 404);
    let metrics = beta
        .http
        .get(format!("{}/metrics", beta.base))
        .send()
        .await
        .unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(metrics.contains("tenant=\"beta\""), "{metrics}");
    assert!(
        !metrics.contains("acme") && !metrics.contains("mneme_events_appended"),
        "{metrics}"
    );
    // The web view: a sign-in made with a tenant's token is that tenant's.
    let signed_in = bed.daemon.sign_in_with(&beta.http, "bob").await;
    let seen = |path: String| {
        let request = signed_in.request(reqwest::Method::GET, &path);
        async move {
            let response = request.send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    assert_eq!(seen(format!("/sessions/{a}")).await.0, 404);
    assert_eq!(seen(format!("/sessions/{a}/events")).await.0, 404);
    let (_, rows) = seen("/sessions".into()).await;
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(seen("/ui/me".into()).await.1["tenant"], "beta");
    let decided = signed_in
        .post(
            &format!("/sessions/{a}/calls/call_0_0/approve"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(decided.0, 404, "{decided:?}");

    // The owner reaches it all the while: the 404s were not something else.
    let (status, own) = acme.get(&format!("/sessions/{a}")).await;
    assert_eq!(
        (status, own["tenant"].as_str()),
        (200, Some("acme")),
        "{own}"
    );
    let (_, events) = acme.get(&format!("/sessions/{a}/events")).await;
    let started = &events.as_array().unwrap()[0]["event"]["SessionStarted"];
    assert_eq!(
        started["tenant"]["name"], "acme",
        "recorded in its start: {started}"
    );
    let body = json!({"approved": true, "by": "ada", "wait": true});
    let (status, end) = acme
        .post(&format!("/sessions/{a}/calls/call_0_0/approve"), &body)
        .await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("Refunded.")),
        "{end}"
    );
    // And the operator sees both, each with its tenant.
    let (_, all) = bed.operator().get("/sessions").await;
    let tenants: Vec<&str> = (all.as_array().unwrap().iter())
        .filter_map(|r| r["tenant"].as_str())
        .collect();
    assert_eq!(tenants.len(), 2, "{all}");
    // Each tenant's requests carry its own cache salt, never another's.
    let salts: std::collections::BTreeSet<String> = (bed.model.raw_bodies().iter())
        .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
        .filter_map(|b| b["cache_salt"].as_str().map(String::from))
        .collect();
    assert_eq!(salts.len(), 2, "{salts:?}");
    assert!(bed.daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_token_runs_its_own_agents_and_manages_nothing() {
    let bed = Bed::start(vec![MockReply::answer("hi")], approving_agent, &["beta"]).await;
    let acme = bed.add("beta", &[]).await;
    let spec = json!({"spec": {"name": "x", "model": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1"}}});
    for (method, path, body) in [
        ("POST", "/sessions", Some(spec.clone())),
        ("POST", "/tenants", Some(json!({"name": "mine"}))),
        ("GET", "/tenants", None),
        (
            "PATCH",
            "/tenants/beta",
            Some(json!({"max_cost_per_day": 1000.0})),
        ),
        ("POST", "/tenants/beta/tokens", None),
        ("DELETE", "/tenants/acme/tokens", None),
        ("DELETE", "/tenants/acme", Some(json!({"reason": "x"}))),
    ] {
        let (status, refused) = acme.send(method, path, body.as_ref()).await;
        assert_eq!(status, 403, "{method} {path}: {refused}");
        assert!(!refused["error"].as_str().unwrap().is_empty());
    }
    let toml = acme
        .http
        .post(format!("{}/sessions", acme.base))
        .header("content-type", "application/toml")
        .body("name = \"x\"\n[model]\nprovider = \"scripted\"\nscript = \"/etc/passwd\"\n")
        .send()
        .await
        .unwrap();
    assert_eq!(toml.status().as_u16(), 403);
    // An agent of the operator's directory is not the tenant's.
    let (status, refused) = acme.post("/sessions", &json!({"agent": "nobody"})).await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("tenant beta has no agent"),
        "{refused}"
    );
    assert!(
        !refused["error"].as_str().unwrap().contains("agents/"),
        "no path: {refused}"
    );
    let id = acme.create().await;
    let (status, _) = acme.get(&format!("/sessions/{id}")).await;
    assert_eq!(status, 200);
    // Its own session: a fork with another spec is refused (403, not 404).
    let (status, _) = acme
        .post(
            &format!("/sessions/{id}/fork"),
            &json!({"at": 1, "spec": spec["spec"]}),
        )
        .await;
    assert_eq!(status, 403);
    // Revoked, the token opens nothing, within a second.
    let out = bed.mneme(&["tenant", "revoke", "beta"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 tokens revoked"),
        "{}",
        stderr(&out)
    );
    let (status, _) = acme.get("/sessions").await;
    assert_eq!(status, 401);
    assert!(bed.daemon.terminate().await.success());
}

/// An agent on the model whose requests cost about 0.006 each (a prompt
/// of ~2,300 bytes at $10 a million, 5 reply tokens at $100 a million),
/// and at most about 0.009 (the prompt estimated at 3 bytes a token, 10
/// reply tokens).
fn priced_agent(model: &str, _: &Sink) -> String {
    let system = "You answer briefly. ".repeat(100);
    format!(
        "name = \"helper\"\nsystem = \"{system}\"\n[model]\nprovider = \"openai\"\nbase_url = \"{model}\"\nmodel = \"m\"\ntimeout_secs = 10\nmax_tokens = 10\ninput_cost_per_mtok = 10.0\noutput_cost_per_mtok = 100.0\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_cap_pauses_a_tenants_second_session_before_its_request_is_sent() {
    let replies = vec![MockReply::answer("Done.")];
    let bed = Bed::start(replies, priced_agent, &["capped", "free"]).await;
    let (acme, beta) = (
        bed.add("capped", &["--max-cost-per-day", "0.01"]).await,
        bed.add("free", &[]).await,
    );
    let first = acme.create().await;
    let end = acme.turn(&first, "one").await;
    assert_eq!(end["answer"], "Done.", "{end}");
    assert_eq!(bed.model.raw_bodies().len(), 1);
    let second = acme.create().await;
    let end = acme.turn(&second, "two").await;
    assert_eq!(
        (end["status"].as_str(), end["budget"].as_bool()),
        (Some("paused"), Some(true)),
        "{end}"
    );
    let reason = end["reason"].as_str().unwrap();
    for said in [
        "daily cap of tenant capped",
        "mneme tenant set capped --max-cost-per-day = 0.01",
        "reserved on",
        "it was not sent",
        "resets at",
    ] {
        assert!(reason.contains(said), "{said:?} in {reason}");
    }
    assert_eq!(
        bed.model.raw_bodies().len(),
        1,
        "the model server never received it"
    );
    // Another tenant runs on.
    for text in ["three", "four"] {
        let id = beta.create().await;
        assert_eq!(beta.turn(&id, text).await["answer"], "Done.");
    }
    assert_eq!(bed.model.raw_bodies().len(), 3);
    // The spend, from the logs: one request of the capped tenant.
    let (status, spend) = acme.get("/spend?by=day").await;
    assert_eq!(status, 200, "{spend}");
    assert_eq!(spend["total"]["model_calls"], 1, "{spend}");
    let spent = spend["total"]["cost"].as_f64().unwrap();
    assert!(spent > 0.004 && spent < 0.01, "{spend}");
    let out = bed.mneme(&["spend", "--by", "agent", "--json"]).await;
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{report}");
    assert_eq!(rows[1]["tenant"], "free");
    assert_eq!(rows[1]["model_calls"], 2);
    let metrics = bed.daemon.metrics_text().await;
    assert!(
        metrics.contains("mneme_spend_cost{tenant=\"capped\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mneme_spend_model_calls{tenant=\"free\"} 2"),
        "{metrics}"
    );
    // The web view says it too: today's spend, by tenant.
    let wait = std::time::Duration::from_secs(20);
    let (browser, page) = mneme_e2e::browser::signed_in_page(&bed.world, "ops", wait).await;
    let said = tokio::task::block_in_place(|| {
        page.wait_for(
            "(n => n && !n.hidden && n.textContent)(document.getElementById('spend'))",
            wait,
        )
    })
    .unwrap_or_else(|e| panic!("{e}"));
    drop(browser);
    let said = said.as_str().unwrap();
    for part in [
        "Spent today (",
        "capped $0.0",
        "(1 model requests)",
        "free $",
        "(2 model requests)",
    ] {
        assert!(said.contains(part), "{part:?} in {said}");
    }
    // A higher cap, a resume that extends: the request goes now.
    let out = bed
        .mneme(&["tenant", "set", "capped", "--max-cost-per-day", "1"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let resume = json!({"wait": true, "extend": true});
    let (status, end) = acme
        .post(&format!("/sessions/{second}/resume"), &resume)
        .await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("Done.")),
        "{end}"
    );
    assert_eq!(bed.model.raw_bodies().len(), 4);
    assert!(bed.daemon.terminate().await.success());
}

/// Every record `mneme log --json` shows of `id` (on the stopped store).
async fn texts_of(world: &World, master: &Path, id: &str) -> String {
    let out = world
        .run(&[
            "log",
            "--json",
            id,
            "--master-key",
            master.to_str().unwrap(),
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasing_a_tenant_leaves_its_sessions_unreadable_and_verifying_and_others_untouched() {
    let replies = vec![MockReply::answer("Noted.")];
    let bed = Bed::start(replies, priced_agent, &["gone", "stays"]).await;
    let (acme, beta) = (bed.add("gone", &[]).await, bed.add("stays", &[]).await);
    let mut theirs = Vec::new();
    for _ in 0..2 {
        let id = acme.create().await;
        acme.turn(&id, SECRET).await;
        theirs.push(id);
    }
    let (status, fork) = acme
        .post(&format!("/sessions/{}/fork", theirs[0]), &json!({"at": 2}))
        .await;
    assert_eq!(status, 201, "{fork}");
    theirs.push(fork["session"].as_str().unwrap().to_string());
    let kept = beta.create().await;
    beta.turn(&kept, &SECRET.replace("acme", "stays")).await;
    let every = json!({"agent": "helper", "every": "1h", "message": SECRET});
    let (status, schedule) = acme.post("/schedules", &every).await;
    assert_eq!(status, 201, "{schedule}");

    let out = bed
        .mneme(&[
            "erase",
            "--tenant",
            "gone",
            "--reason",
            "contract ended",
            "--by",
            "dpo",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("its key destroyed"),
        "{}",
        stderr(&out)
    );
    for id in &theirs {
        let (status, events) = bed.operator().get(&format!("/sessions/{id}/events")).await;
        assert_eq!(status, 200);
        let text = events.to_string();
        assert!(
            !text.contains(SECRET) && text.contains("[erased]"),
            "{text}"
        );
        let (_, verified) = bed.operator().get(&format!("/sessions/{id}/verify")).await;
        assert_eq!(verified["ok"], true, "{verified}");
        let (_, session) = bed.operator().get(&format!("/sessions/{id}")).await;
        assert_eq!(session["status"], "erased", "{session}");
    }
    let (_, kept_events) = beta.get(&format!("/sessions/{kept}/events")).await;
    assert!(
        kept_events.to_string().contains("stays's planted secret"),
        "{kept_events}"
    );
    // Its token opens nothing; its name is never given again.
    assert_eq!(acme.get("/sessions").await.0, 401);
    let again = bed.mneme(&["tenant", "add", "gone"]).await;
    assert!(!again.status.success());
    assert!(stderr(&again).contains("erased"), "{}", stderr(&again));
    let (_, tenants) = bed.operator().get("/tenants").await;
    assert!(
        tenants.to_string().contains("by dpo: contract ended"),
        "{tenants}"
    );
    // Its schedule starts nothing more, and its message is gone with it.
    let (_, schedules) = bed.operator().get("/schedules").await;
    assert_eq!(schedules[0]["removed_by"], "dpo", "{schedules}");
    let schedule = schedule["schedule"].as_str().unwrap();
    let log = bed.mneme(&["log", "--json", schedule]).await;
    assert!(log.status.success(), "{}", stderr(&log));
    assert!(!stdout(&log).contains(SECRET), "{}", stdout(&log));

    // After the daemon: the store read with the master key still holds
    // nothing of theirs, and every chain verifies.
    assert!(bed.daemon.terminate().await.success());
    let master = master_key(&bed.world);
    for id in &theirs {
        let text = texts_of(&bed.world, &master, id).await;
        assert!(
            !text.contains(SECRET) && text.contains("[erased]"),
            "{text}"
        );
    }
    assert!(texts_of(&bed.world, &master, &kept)
        .await
        .contains("stays's planted secret"));
    let verified = bed
        .world
        .run(&["verify", "--master-key", master.to_str().unwrap()])
        .await;
    assert!(verified.status.success(), "{}", stderr(&verified));
    let stored = raw_bytes(&bed.world.data());
    assert!(
        !contains(&stored, SECRET.as_bytes()),
        "the secret is nowhere in the data directory"
    );
    let _ = acme.token;
}

/// Every byte of every file under `dir`.
fn raw_bytes(dir: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            all.extend(raw_bytes(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            all.extend(bytes);
        }
    }
    all
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_about_tenants_is_refused_with_clear_errors() {
    let bed = Bed::start(vec![MockReply::answer("hi")], approving_agent, &["acme"]).await;
    let acme = bed.add("acme", &[]).await;
    // Bad names, from the command line and the API, each refused saying why.
    for bad in [
        "Acme",
        "../etc",
        "a b",
        "-flag",
        "",
        &"x".repeat(33),
        "ac\u{1b}[31mme",
    ] {
        let out = bed.mneme(&["tenant", "add", "--", bad]).await;
        assert!(!out.status.success(), "{bad:?}");
        assert!(
            stderr(&out).contains("tenant name"),
            "{bad:?}: {}",
            stderr(&out)
        );
        assert!(
            !stderr(&out).contains('\u{1b}'),
            "escaped: {}",
            stderr(&out)
        );
        let (status, refused) = bed.operator().post("/tenants", &json!({"name": bad})).await;
        assert_eq!(status, 400, "{bad:?}: {refused}");
    }
    for (args, said) in [
        (
            vec!["tenant", "add", "b", "--max-cost-per-day=-1"],
            "positive",
        ),
        (
            vec!["tenant", "add", "b", "--max-cost-per-day", "NaN"],
            "positive",
        ),
        (
            vec!["tenant", "set", "nobody", "--max-cost-per-day", "1"],
            "no tenant",
        ),
        (vec!["tenant", "add", "acme"], "exists already"),
        (vec!["spend", "--day", "yesterday"], "YYYY-MM-DD"),
        (vec!["spend", "--tenant", "NO"], "tenant name"),
        (
            vec!["erase", "--tenant", "nobody", "--reason", "x"],
            "no tenant",
        ),
    ] {
        let out = bed.mneme(&args).await;
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(said), "{args:?}: {}", stderr(&out));
    }
    let (status, refused) = bed
        .operator()
        .post("/tenants", &json!({"name": "b", "max_cost_per_day": -5}))
        .await;
    assert_eq!(status, 400, "{refused}");
    let (status, _) = bed
        .operator()
        .post("/tenants", &json!({"name": "b", "admin": true}))
        .await;
    assert!(
        status == 400 || status == 422,
        "unknown fields refused: {status}"
    );
    assert_eq!(bed.operator().get("/spend?by=everything").await.0, 400);
    // Forged tokens: a tenant's shape, the operator's, one far too long.
    let forged = format!("mnt_{}", "0".repeat(64));
    let last = if acme.token.ends_with('0') { '1' } else { '0' };
    let almost = format!("{}{last}", &acme.token[..acme.token.len() - 1]);
    for token in [forged, almost, format!("{TOKEN}x"), "x".repeat(8000)] {
        let (status, refused) = bed.client(&token).get("/sessions").await;
        assert_eq!(status, 401, "{}: {refused}", &token[..token.len().min(80)]);
    }
    // A body past the daemon's limit.
    let huge = json!({"name": "b", "padding": "x".repeat(2 << 20)});
    let (status, refused) = bed.operator().post("/tenants", &huge).await;
    assert_eq!(status, 413, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("--max-body-bytes"),
        "{refused}"
    );
    // Nothing of that was recorded.
    let out = bed.mneme(&["tenant", "list", "--json"]).await;
    assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));
    assert!(bed.daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_carries_the_tenants_and_their_keys_to_another_store() {
    let bed = Bed::start(vec![MockReply::answer("Noted.")], priced_agent, &["acme"]).await;
    let acme = bed.add("acme", &["--max-cost-per-day", "3"]).await;
    let id = acme.create().await;
    acme.turn(&id, SECRET).await;
    assert!(bed.daemon.terminate().await.success());
    let master = master_key(&bed.world);
    let master = master.to_str().unwrap();
    let dump = bed.world.dir.path().join("all.jsonl");
    let out = bed
        .world
        .run(&["export", "--output", dump.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    // Into a new data directory: the tenant, its cap, and its session,
    // readable with the same master key.
    let elsewhere = World::new();
    let out = elsewhere.run(&["import", dump.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let listed = elsewhere.run(&["tenant", "list", "--json"]).await;
    let tenant: Value = serde_json::from_str(stdout(&listed).trim()).unwrap();
    assert_eq!(
        (tenant["name"].as_str(), tenant["max_cost_per_day"].as_f64()),
        (Some("acme"), Some(3.0))
    );
    assert!(texts_of(&elsewhere, Path::new(master), &id)
        .await
        .contains(SECRET));
    // And erasing the tenant there destroys the key it came with.
    let out = elsewhere
        .run(&[
            "erase",
            "--tenant",
            "acme",
            "--reason",
            "moved",
            "--master-key",
            master,
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = texts_of(&elsewhere, Path::new(master), &id).await;
    assert!(
        !text.contains(SECRET) && text.contains("[erased]"),
        "{text}"
    );
}

/// An agent on the slow model at `model`.
fn slow_agent(model: &str) -> String {
    format!("name = \"helper\"\n[model]\nprovider = \"openai\"\nbase_url = \"{model}\"\nmodel = \"m\"\ntimeout_secs = 30\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_waits_for_its_share_and_past_its_queue_bound_is_told_429() {
    let slow = mneme_e2e::slow::SlowModel::start(std::time::Duration::from_millis(800)).await;
    let url = slow.base_url();
    let agent = move |_: &str, _: &Sink| slow_agent(&url);
    let bed = Bed::start_with(vec![], agent, &["a", "b"], &["--max-running-turns", "2"]).await;
    let limits = ["--max-running-turns", "1", "--max-queued-turns", "2"];
    let (a, b) = (bed.add("a", &limits).await, bed.add("b", &[]).await);
    let first = json!({"agent": "helper", "first_message": "go"});
    let mut theirs = Vec::new();
    for _ in 0..4 {
        let (status, created) = a.post("/sessions", &first).await;
        assert_eq!(status, 201, "{created}");
        theirs.push(created["session"].as_str().unwrap().to_string());
    }
    // One runs (a's limit), two wait (its bound), the fourth is refused.
    for id in &theirs[..3] {
        let (status, body) = a.post(&format!("/sessions/{id}/resume"), &json!({})).await;
        assert_eq!(status, 202, "{body}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (status, refused) = a
        .post(&format!("/sessions/{}/resume", theirs[3]), &json!({}))
        .await;
    assert_eq!(status, 429, "{refused}");
    let said = refused["error"].as_str().unwrap();
    assert!(
        said.contains("tenant a has 2 turns waiting") && said.contains("max_queued_turns = 2"),
        "{said}"
    );
    let message = json!({"text": "and this", "wait": true});
    let (status, _) = a
        .post(&format!("/sessions/{}/messages", theirs[3]), &message)
        .await;
    assert_eq!(status, 429, "a message that would start a turn too");
    let metrics = bed.daemon.metrics_text().await;
    assert!(metrics.contains("mneme_turns_queued 2"), "{metrics}");
    // b's turn takes the daemon's second place at once: a's queue is a's.
    let (status, created) = b.post("/sessions", &first).await;
    assert_eq!(status, 201, "{created}");
    let mine = created["session"].as_str().unwrap();
    let (status, end) = b
        .post(&format!("/sessions/{mine}/resume"), &json!({"wait": true}))
        .await;
    assert_eq!(
        (status, end["answer"].as_str()),
        (200, Some("Done.")),
        "{end}"
    );
    let (_, last) = a.get(&format!("/sessions/{}", theirs[2])).await;
    assert_eq!(last["status"], "running", "a's third still waits: {last}");
    // a's turns all run in the end, one at a time.
    for id in &theirs[..3] {
        eventually(
            format!("{id} answered"),
            std::time::Duration::from_secs(20),
            || async {
                let (_, session) = a.get(&format!("/sessions/{id}")).await;
                match session["status"].as_str() {
                    Some("idle") => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    }
    assert!(
        slow.most_held() <= 2,
        "the daemon's cap: {}",
        slow.most_held()
    );
    assert_eq!(slow.answered(), 4);
    assert!(bed.daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_tool_calls_run_at_most_its_limit_at_once() {
    let replies = vec![
        MockReply::calls(&[
            ("work", json!({"n": 1})),
            ("work", json!({"n": 2})),
            ("work", json!({"n": 3})),
        ]),
        MockReply::answer("Worked."),
    ];
    let bed = Bed::start(
        replies,
        |model, _| agent_toml(model, &[]),
        &["held", "free"],
    )
    .await;
    // Each tenant's agent: one tool that notes when each call starts and ends.
    let logs = bed.world.dir.path().join("calls");
    for tenant in ["held", "free"] {
        let log = logs.join(tenant);
        std::fs::create_dir_all(&log).unwrap();
        let script = format!(
            "cat >/dev/null; echo \"$(date +%s%N) 1\" >> {0}/log; sleep 0.4; echo \"$(date +%s%N) -1\" >> {0}/log; echo '{{}}'",
            log.display()
        );
        let tool = command_tool("work", &["sh", "-c", &script], "read_only", 10);
        let agent = agent_toml(&bed.model.base_url(), &[tool]);
        std::fs::write(
            bed.world
                .dir
                .path()
                .join(format!("agents/{tenant}/helper.toml")),
            agent,
        )
        .unwrap();
    }
    let held = bed.add("held", &["--max-parallel-calls", "1"]).await;
    let free = bed.add("free", &[]).await;
    for client in [&held, &free] {
        let id = client.create().await;
        assert_eq!(client.turn(&id, "work").await["answer"], "Worked.");
    }
    // The most calls of each tenant that ran at once.
    let most = |tenant: &str| {
        let text = std::fs::read_to_string(logs.join(tenant).join("log")).unwrap();
        let mut marks: Vec<(u128, i32)> = text
            .lines()
            .map(|l| {
                let (at, delta) = l.split_once(' ').unwrap();
                (at.parse().unwrap(), delta.parse().unwrap())
            })
            .collect();
        marks.sort_by_key(|(at, delta)| (*at, *delta));
        let (mut now, mut most) = (0, 0);
        for (_, delta) in marks {
            now += delta;
            most = most.max(now);
        }
        most
    };
    assert_eq!(most("held"), 1, "held to its limit of 1");
    assert_eq!(most("free"), 3, "the agent's own 8 allow all three");
    assert!(bed.daemon.terminate().await.success());
}
