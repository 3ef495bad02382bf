//! The web view in a real browser (headless Chromium, installed by
//! `scripts/chromium.sh` if missing) against a real daemon: sign in with
//! `mneme ui`'s one-time link (a second use refused), find a session by its
//! title's text or id, open it as a conversation, see a tool call as one
//! card with its key and effect, approve it from the page and watch the
//! session go on to its answer, see a turn started elsewhere arrive live,
//! switch to the events by keyboard, fork at one and open the diff; a page
//! of another origin cannot act for the signed-in browser; approve a call
//! with edited arguments, and see one whose approval expired; a rerun's page
//! links to its original and to the diff of the two; each reply's figures
//! show once; a call whose process was killed shows "process died"; the list
//! shows titles and marks forks and reruns. Screenshots of each page go to
//! `target/ui-screenshots/`.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::browser::{install_chromium, sign_in_link, signed_in_page, Browser, Page};
use mneme_e2e::daemon::{DaemonProcess, TOKEN};
use mneme_e2e::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// A user message that would be markup, and would read backwards, if a page
/// took it for anything but text.
const HOSTILE_MESSAGE: &str =
    "refund order 7 <img src=x onerror=\"document.title='pwned'\"> \u{202e}7 redro";

/// Runs a browser step off the async workers (the test's model server and
/// sink run on them).
fn blocking<T>(step: impl FnOnce() -> Result<T, String>) -> T {
    tokio::task::block_in_place(step).unwrap_or_else(|e| panic!("{e}"))
}

/// Writes a screenshot of `page`, without the passing note at its foot.
fn screenshot(page: &Page, name: &str) {
    blocking(|| page.eval("(n => n && (n.textContent = ''))(document.getElementById('note'))"));
    let dir = repo_root().join("target/ui-screenshots");
    blocking(|| page.screenshot(&dir.join(format!("{name}.png"))));
}

/// The billing agent (see [`billing_replies`]) and its sink.
fn billing() -> TestbedBuilder {
    Testbed::new()
        .replies(billing_replies())
        .sink_tools(|sink| billing_tools(sink).to_vec())
}

/// A daemon and an agent whose `refund` on the sink waits for approval.
fn refund_on_approval(replies: Vec<MockReply>) -> TestbedBuilder {
    Testbed::new()
        .replies(replies)
        .sink_tools(|sink| vec![refund_needing_approval(sink)])
        .daemon()
}

/// Session `id`, given `text`, waits for the approval of `call_0_0`.
async fn waits_for_approval(daemon: &DaemonProcess, id: &str, text: &str) {
    let (_, end) = daemon.message_and_wait(id, text).await;
    assert_eq!(end["awaiting_approval"][0]["call_id"], "call_0_0", "{end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signs_in_finds_a_session_approves_its_call_and_compares_a_fork() {
    let mut bed = refund_on_approval(vec![
        MockReply::calls(&[("refund", json!({"n": 7}))]),
        MockReply::answer("Refunded."),
        MockReply::answer("Anything else?"),
    ])
    .await;
    let id = bed.create().await;
    let daemon = bed.take_daemon();
    let (world, model, sink) = (&bed.world, &bed.model, &bed.sink);
    daemon.create(&agent_toml(&model.base_url(), &[])).await;
    waits_for_approval(&daemon, &id, HOSTILE_MESSAGE).await;

    // A page of the log, as the view reads it; a followed stream has no end.
    let (_, page_of) = daemon
        .get(&format!("/sessions/{id}/events?after=1&until=3"))
        .await;
    let seqs: Vec<&Value> = page_of
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["seq"])
        .collect();
    assert_eq!(seqs, [2, 3], "{page_of}");
    let (status, _) = daemon
        .get(&format!("/sessions/{id}/events?follow=true&until=3"))
        .await;
    assert_eq!(status, 400);

    let link = sign_in_link(world, "ada").await;
    install_chromium();
    let browser = blocking(Browser::start);
    let page = blocking(|| browser.new_page());

    // Sign in: the link leads to the sessions, with a cookie scripts cannot
    // read and other sites do not get.
    blocking(|| page.goto(&link));
    blocking(|| {
        page.wait_for(
            &format!("document.querySelector('#sessions a[href=\"#/s/{id}\"]')"),
            WAIT,
        )
    });
    blocking(|| {
        page.wait_for(
            "document.getElementById('who').textContent.includes('ada')",
            WAIT,
        )
    });
    let cookies = blocking(|| page.cookies());
    let cookie = cookies
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "mneme_ui")
        .unwrap_or_else(|| panic!("no sign-in cookie: {cookies}"))
        .clone();
    assert_eq!(cookie["httpOnly"], true, "{cookie}");
    assert_eq!(cookie["sameSite"], "Strict", "{cookie}");
    assert_eq!(
        blocking(|| page.eval("document.cookie")),
        "",
        "scripts cannot read it"
    );
    let address = blocking(|| page.eval("location.href"));
    assert!(!address.as_str().unwrap().contains("signin"), "{address}");
    let key = blocking(|| page.eval("localStorage.getItem('mneme-ui-key')"));
    let key = key.as_str().unwrap().to_string();
    signed_in_browser_is_no_token(&daemon, cookie["value"].as_str().unwrap(), &key, &id).await;
    let waiting = blocking(|| page.eval("document.querySelectorAll('#sessions tr.waits').length"));
    assert_eq!(waiting, 1, "the session waiting for a person stands out");
    // Its row is titled with its first message, as text.
    let row = blocking(|| {
        page.eval(&format!(
            "(r => ({{ title: r.querySelector('.session-link .title').innerText, \
                      images: document.querySelectorAll('#sessions img').length }}))\
             (document.querySelector('#sessions tr[data-session=\"{id}\"]'))"
        ))
    });
    let title = row["title"].as_str().unwrap();
    assert!(
        title.starts_with("refund order 7 <img src=x") && title.contains("\\u{202e}"),
        "{row}"
    );
    assert_eq!(row["images"], 0, "{row}");
    screenshot(&page, "1-sessions");

    // The link works once.
    let second = blocking(|| browser.new_page());
    blocking(|| second.goto(&link));
    let refused = blocking(|| second.eval("document.body.innerText"));
    assert!(
        refused.as_str().unwrap().contains("does not work"),
        "{refused}"
    );
    screenshot(&second, "2-link-used-twice");

    // Find the session by a prefix of its id.
    blocking(|| {
        page.eval(&format!(
            "const f = document.getElementById('find'); f.value = '{}'; \
             f.dispatchEvent(new KeyboardEvent('keydown', {{key: 'Enter', bubbles: true}})); true",
            &id[id.len() - 12..]
        ))
    });
    blocking(|| {
        page.wait_for(
            "document.querySelectorAll('#sessions tbody tr').length === 1",
            WAIT,
        )
    });
    blocking(|| page.click(&format!("#sessions a[href=\"#/s/{id}\"]")));

    // The session, as a conversation: its tool call as a card with its
    // effect, waiting for approval.
    blocking(|| page.wait_for("document.querySelector('#waiting .approve')", WAIT));
    blocking(|| page.wait_for("document.querySelector('#verified.ok')", WAIT));
    let shown = blocking(|| {
        page.eval("[document.getElementById('conversation').hidden, document.getElementById('events').hidden, \
                   document.querySelectorAll('#conversation .call[data-call=\"call_0_0\"]').length]")
    });
    assert_eq!(
        shown,
        json!([false, true, 1]),
        "the conversation first, one card"
    );
    let card = blocking(|| {
        page.eval("(() => { const c = document.querySelector('#conversation .call[data-call=\"call_0_0\"]'); \
                   return { tool: c.querySelector('.tool').textContent, status: c.querySelector('.call-status').textContent, \
                            effect: c.querySelector('.effect-declared').textContent }; })()")
    });
    assert_eq!(card["tool"], "refund", "{card}");
    assert_eq!(card["effect"], "side_effect", "{card}");
    assert!(
        card["status"]
            .as_str()
            .unwrap()
            .contains("Waits for approval"),
        "{card}"
    );
    let hostile = blocking(|| {
        page.eval(
            "({ images: document.querySelectorAll('main img').length, title: document.title, \
                   said: document.querySelector('#c2.user .text').innerText, \
                   heading: document.getElementById('session-title').innerText, \
                   event: document.getElementById('e2').textContent })",
        )
    });
    assert_eq!(hostile["images"], 0, "{hostile}");
    assert_ne!(hostile["title"], "pwned", "{hostile}");
    for shown in ["said", "heading", "event"] {
        let text = hostile[shown].as_str().unwrap();
        assert!(
            text.contains("<img src=x") && text.contains("\\u{202e}"),
            "{shown}: {hostile}"
        );
    }
    screenshot(&page, "3-session-waiting");

    // A page of another origin cannot act for the signed-in browser.
    let forged = cross_site_cancel(&daemon, &id).await;
    let attacker = blocking(|| browser.new_page());
    blocking(|| attacker.goto(&forged.url));
    blocking(|| attacker.wait_for("document.title === 'sent'", WAIT));
    // Time, not a barrier: nothing may be cancelled within 500 ms.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, view) = daemon.get(&format!("/sessions/{id}")).await;
    assert_ne!(
        view["status"], "cancelled",
        "a cross-site form cancelled it"
    );

    // Approve from the page: the call runs once and the session answers.
    blocking(|| page.click("#waiting .approve"));
    blocking(|| {
        page.wait_for("document.querySelector('.facts') && document.querySelector('.facts').innerText.includes('Refunded.')", WAIT)
    });
    assert_eq!(sink.stats().path("refund").effects, 1);
    let (_, records) = daemon.get(&format!("/sessions/{id}/events")).await;
    let decided = find_event(&records, "ApprovalDecided");
    assert_eq!(decided["by"], "ada", "recorded with the signed-in name");
    blocking(|| {
        page.wait_for("document.querySelector('#conversation .call[data-call=\"call_0_0\"] .duration').textContent.endsWith('ms')", WAIT)
    });
    let key = started_key(&daemon, &id).await;
    // The same card in both views: the conversation's, and the events'.
    for view in ["#conversation", "#timeline"] {
        let attempt = blocking(|| {
            page.eval(&format!("(() => {{ const c = document.querySelector('{view} .call[data-call=\"call_0_0\"]'); \
                       return {{ key: c.querySelector('.key').textContent, effect: c.querySelector('.effect').textContent, \
                                outcome: c.querySelector('.attempt .outcome').textContent, \
                                status: c.querySelector('.call-status').textContent }}; }})()"))
        });
        assert_eq!(attempt["key"], key.as_str(), "{view}: {attempt}");
        assert_eq!(attempt["effect"], "side_effect", "{view}: {attempt}");
        assert_eq!(attempt["outcome"], "ok", "{view}: {attempt}");
        assert!(
            attempt["status"]
                .as_str()
                .unwrap()
                .contains("Approved by ada"),
            "{view}: {attempt}"
        );
    }
    screenshot(&page, "4-session-answered");

    // By keyboard: t shows the events, j moves to the first, Enter shows
    // its payload.
    press(&page, "t");
    blocking(|| {
        page.wait_for(
            "!document.getElementById('events').hidden && document.getElementById('conversation').hidden",
            WAIT,
        )
    });
    press(&page, "j");
    press(&page, "Enter");
    let payload = blocking(|| {
        page.wait_for("document.activeElement.id === 'e1' && document.querySelector('#e1 pre.payload') && document.querySelector('#e1 pre.payload').textContent", WAIT)
    });
    assert!(
        payload.as_str().unwrap().contains("\"SessionStarted\""),
        "{payload}"
    );

    // Live: a turn started elsewhere shows on the open page as it is recorded.
    let (status, _) = daemon
        .post(
            &format!("/sessions/{id}/messages"),
            &json!({"text": "thanks", "wait": true}),
        )
        .await;
    assert_eq!(status, 200);
    blocking(|| {
        page.wait_for(
            "document.getElementById('timeline').innerText.includes('Anything else?')",
            WAIT,
        )
    });
    screenshot(&page, "4b-session-events");
    // t again: the conversation, with the new turn.
    press(&page, "t");
    blocking(|| {
        page.wait_for(
            "!document.getElementById('conversation').hidden && document.getElementById('turns').innerText.includes('Anything else?')",
            WAIT,
        )
    });

    // Fork at the user's message (in the events) and compare the fork with
    // its parent.
    blocking(|| page.click("#tab-events"));
    blocking(|| page.click("#e2 .fork"));
    blocking(|| page.wait_for("document.getElementById('diff-link')", WAIT));
    screenshot(&page, "5-fork");
    blocking(|| page.click("#diff-link"));
    let common = blocking(|| {
        page.wait_for(
            "document.getElementById('common') && document.getElementById('common').textContent",
            WAIT,
        )
    });
    assert!(
        common.as_str().unwrap().contains("same first 2 events"),
        "{common}"
    );
    let differs =
        blocking(|| page.eval("document.querySelectorAll('#comparison .differs').length"));
    assert!(
        differs.as_u64().unwrap() >= 1,
        "the answers differ: {differs}"
    );
    screenshot(&page, "6-diff");

    // Nothing was fetched from anywhere but the daemon.
    let fetched = blocking(|| {
        page.eval(
            "performance.getEntriesByType('resource').map(e => e.name).concat([location.href])",
        )
    });
    for url in fetched.as_array().unwrap() {
        assert!(
            url.as_str().unwrap().starts_with(&daemon.base),
            "fetched from elsewhere: {url}"
        );
    }
    // The page ran without a script error.
    let errors: Vec<Value> = page
        .take_events()
        .into_iter()
        .filter(|e| {
            e["method"] == "Runtime.exceptionThrown"
                || (e["method"] == "Runtime.consoleAPICalled" && e["params"]["type"] == "error")
        })
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// What the sign-in's halves let a client do, from outside the browser: the
/// cookie alone (what a server on another port of the host gets) nothing;
/// with the key, look and decide, but not start sessions or send messages.
async fn signed_in_browser_is_no_token(daemon: &DaemonProcess, cookie: &str, key: &str, id: &str) {
    let client = reqwest::Client::new();
    let ask = |method: reqwest::Method, path: String, key: Option<&str>| {
        let mut request = client
            .request(method, daemon.url(&path))
            .header("cookie", format!("mneme_ui={cookie}"))
            .header("content-type", "application/json")
            .body("{\"text\": \"hi\", \"agent\": \"x\"}");
        if let Some(key) = key {
            request = request.header("x-mneme-ui", key);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    use reqwest::Method;
    assert_eq!(
        ask(Method::GET, "/sessions".into(), None).await,
        401,
        "the cookie alone"
    );
    let forged = "0".repeat(64);
    assert_eq!(
        ask(Method::GET, "/sessions".into(), Some(&forged)).await,
        401
    );
    assert_eq!(ask(Method::GET, "/sessions".into(), Some(key)).await, 200);
    assert_eq!(
        ask(Method::POST, "/sessions".into(), Some(key)).await,
        403,
        "no new sessions"
    );
    let message = format!("/sessions/{id}/messages");
    assert_eq!(
        ask(Method::POST, message, Some(key)).await,
        403,
        "no messages"
    );
    assert_eq!(
        ask(Method::POST, "/ui/codes".into(), Some(key)).await,
        403,
        "no codes"
    );
}

/// Presses `key` as a person would (a key down and up through the browser's
/// input, not a script's synthetic event).
fn press(page: &Page, key: &str) {
    for kind in ["keyDown", "keyUp"] {
        let text = if key.len() == 1 { key } else { "" };
        let code = if key == "Enter" {
            13
        } else {
            key.to_ascii_uppercase().as_bytes()[0] as u32
        };
        blocking(|| {
            page.call(
                "Input.dispatchKeyEvent",
                json!({"type": kind, "key": key, "text": text, "windowsVirtualKeyCode": code}),
            )
        });
    }
}

/// The idempotency key the log records for the first call.
async fn started_key(daemon: &DaemonProcess, id: &str) -> String {
    let (_, records) = daemon.get(&format!("/sessions/{id}/events")).await;
    find_event(&records, "ToolStarted")["idempotency_key"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The fields of the first event of `kind` in an `/events` answer.
fn find_event(records: &Value, kind: &str) -> Value {
    records
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == kind)
        .map(|r| r["event"][kind].clone())
        .unwrap_or_else(|| panic!("no {kind} in {records}"))
}

/// A page on another port of this host (same site, another origin) whose
/// form posts a cancel of session `id` to the daemon as soon as it loads.
struct Forged {
    url: String,
    _server: tokio::sync::oneshot::Sender<()>,
}

async fn cross_site_cancel(daemon: &DaemonProcess, id: &str) -> Forged {
    let html = format!(
        "<!doctype html><title>forging</title><iframe name=sink></iframe>\
         <form id=f method=POST enctype=text/plain target=sink action=\"{}/sessions/{id}/cancel\">\
         <input name='{{\"by\":\"attacker\",\"x\":\"' value='\"}}'></form>\
         <script>document.getElementById('f').submit(); setTimeout(() => document.title = 'sent', 800);</script>",
        daemon.base
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let html = html.clone();
            async move { axum::response::Html(html) }
        }),
    );
    Forged {
        url,
        _server: serve_until_dropped(listener, app),
    }
}

/// A daemon on `world` and a session whose agent streams from the model
/// at `model_url` (`model_lines` in its `[model]`), open on a signed-in
/// page that follows it live: the daemon, the session, the browser and
/// the page.
async fn streaming_session_on_a_page(
    world: &World,
    model_url: &str,
    model_lines: &str,
) -> (DaemonProcess, String, Browser, Page) {
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let agent = agent_toml(model_url, &[]).replace("timeout_secs = 10\n", model_lines);
    let id = daemon.create(&agent).await;
    let (browser, page) = signed_in_page(world, "ada", WAIT).await;
    blocking(|| page.eval(&format!("location.hash = '#/s/{id}'")));
    blocking(|| {
        page.wait_for(
            "document.getElementById('live').textContent.includes('live')",
            WAIT,
        )
    });
    (daemon, id, browser, page)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_reply_shows_on_the_page_as_it_arrives() {
    let world = World::new();
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let opened = gate.clone();
    let model = mneme_e2e::hostile::HostileModel::start(move |_, _, _| {
        mneme_e2e::hostile::Answer::Stream {
            events: mneme_e2e::hostile::streamed_text(&["First words, ", "then the rest."], "stop"),
            gate: Some(opened.clone()),
            then_stall: false,
        }
    })
    .await;
    let lines = "timeout_secs = 10\nstream = true\n";
    let (daemon, id, browser, page) =
        streaming_session_on_a_page(&world, &model.base_url(), lines).await;

    let (status, _) = daemon
        .post(&format!("/sessions/{id}/messages"), &json!({"text": "go"}))
        .await;
    assert_eq!(status, 202);
    // The first words show while the server still holds the rest.
    let shown = blocking(|| {
        page.wait_for(
            "(a => !a.hidden && a.textContent)(document.getElementById('arriving'))",
            WAIT,
        )
    });
    assert!(
        "First words, ".starts_with(shown.as_str().unwrap()),
        "{shown}"
    );
    screenshot(&page, "7-streaming");
    gate.notify_one();
    // Once recorded, the reply is an event and the arriving text goes.
    blocking(|| {
        page.wait_for("document.getElementById('turns').innerText.includes('then the rest.') && document.getElementById('arriving').hidden", WAIT)
    });
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_is_approved_with_edited_arguments_and_an_expired_one_says_so() {
    let mut bed = refund_on_approval(vec![
        MockReply::calls(&[("refund", json!({"n": 7}))]),
        MockReply::answer("Refunded."),
    ])
    .await;
    let edited = bed.create().await;
    let (daemon, model, sink) = (bed.take_daemon(), &bed.model, &bed.sink);
    let tool = refund_needing_approval(sink) + "approval_timeout = \"1s\"\n";
    let expiring = daemon.create(&agent_toml(&model.base_url(), &[tool])).await;
    for id in [&edited, &expiring] {
        waits_for_approval(&daemon, id, "refund ada").await;
    }
    let (browser, page) = signed_in_page(&bed.world, "ada", WAIT).await;

    // The waiting call's arguments, editable; approved with the person's.
    blocking(|| page.eval(&format!("location.hash = '#/s/{edited}'")));
    let shown = blocking(|| {
        page.wait_for(
            "(t => t && t.value)(document.querySelector('#waiting textarea.edit-args'))",
            WAIT,
        )
    });
    assert_eq!(shown, "{\n  \"n\": 7\n}", "laid out, one member a line");
    let told =
        blocking(|| page.eval("document.querySelector('#waiting .tool-description').textContent"));
    assert!(
        told.as_str().unwrap().contains("refund"),
        "the tool's description: {told}"
    );
    blocking(|| {
        page.eval("document.querySelector('#waiting textarea.edit-args').value = '{\"n\": 70}'")
    });
    blocking(|| page.click("#waiting .approve"));
    let status = blocking(|| {
        page.wait_for(
            "(c => c && c.querySelector('.duration').textContent.endsWith('ms') && c.querySelector('.call-status').textContent.includes('edited') \
               && [c.querySelector('.call-status').textContent, c.querySelector('.edited-args').textContent])\
             (document.querySelector('#conversation .call[data-call=\"call_0_0\"]'))",
            WAIT,
        )
    });
    assert!(
        status[0]
            .as_str()
            .unwrap()
            .contains("Approved with edited arguments by ada"),
        "{status}"
    );
    assert_eq!(status[1], r#"{"n":70}"#, "{status}");
    assert_eq!(sink.bodies("refund"), [json!({"n": 70})]);
    blocking(|| page.wait_for("!document.getElementById('waiting')", WAIT));
    screenshot(&page, "8-edited-approval");

    // Nobody approves the other: the daemon denies it as expired, and the
    // page says so.
    blocking(|| page.eval(&format!("location.hash = '#/s/{expiring}'")));
    let expired = blocking(|| {
        page.wait_for(
            "(c => c && c.querySelector('.call-status').textContent.startsWith('Expired') && c.querySelector('.call-status').textContent)\
             (document.querySelector('#conversation .call[data-call=\"call_0_0\"]'))",
            WAIT,
        )
    });
    assert!(expired.as_str().unwrap().contains("mneme"), "{expired}");
    assert_eq!(
        sink.stats().path("refund").hits,
        1,
        "the expired call never ran"
    );
    screenshot(&page, "9-expired-approval");
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_open_keeps_the_link_off_command_lines() {
    let world = World::new();
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let seen = world.dir.path().join("browser-args");
    let browser = world.write(
        "browser.sh",
        &format!("#!/bin/sh\necho \"$@\" > {}\n", seen.display()),
    );
    std::fs::set_permissions(
        &browser,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let out = world
        .mneme()
        .env("MNEME_TOKEN", TOKEN)
        .env("BROWSER", &browser)
        .args(["ui", "--open", "--print-url"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let link = stdout(&out).trim().to_string();
    let code = link.split("code=").nth(1).unwrap();
    let args = eventually(
        "the browser to be opened",
        Duration::from_secs(5),
        || async {
            Some(std::fs::read_to_string(&seen).unwrap_or_default()).filter(|a| !a.is_empty())
        },
    )
    .await;
    assert!(
        !args.contains(code),
        "the code is on the browser's command line: {args}"
    );
    let page = PathBuf::from(args.trim());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains(&link), "{html}");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&page).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "the page is its owner's alone: {mode:o}");
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_links_to_its_original_and_its_diff() {
    let mut bed = Testbed::new()
        .replies(vec![MockReply::answer("Hello.")])
        .daemon()
        .await;
    let original = bed.create().await;
    let (daemon, world, model) = (bed.take_daemon(), &bed.world, &bed.model);
    let (_, end) = daemon.message_and_wait(&original, "hi").await;
    assert_eq!(end["answer"], "Hello.", "{end}");
    let spec = json!({"name": "other", "model": {"provider": "openai", "base_url": model.base_url(), "model": "newer-model"}});
    let (status, report) = daemon
        .post(
            &format!("/sessions/{original}/rerun"),
            &json!({"spec": spec}),
        )
        .await;
    assert_eq!(status, 200, "{report}");
    let rerun = report["rerun"]["session"].as_str().unwrap().to_string();
    let (browser, page) = signed_in_page(world, "ada", WAIT).await;
    blocking(|| page.eval(&format!("location.hash = '#/s/{rerun}'")));
    let shown = blocking(|| {
        page.wait_for(
            "(p => p && [p.textContent, p.querySelector('a').getAttribute('href'), \
               document.getElementById('rerun-diff-link').getAttribute('href')])\
             (document.getElementById('rerun-of'))",
            WAIT,
        )
    });
    assert!(
        shown[0].as_str().unwrap().starts_with("A rerun of"),
        "{shown}"
    );
    assert!(shown[1].as_str().unwrap().contains(&original), "{shown}");
    assert_eq!(shown[2], format!("#/diff/{original}/{rerun}"), "{shown}");
    screenshot(&page, "10-rerun");
    blocking(|| page.click("#rerun-diff-link"));
    blocking(|| page.wait_for("location.hash.startsWith('#/diff/')", WAIT));
    // The list marks it a rerun of its original (not a fork), by a link.
    blocking(|| page.eval("location.hash = '#/'"));
    let row = blocking(|| {
        page.wait_for(
            &format!(
                "(r => r && {{ marks: r.querySelector('.marks').innerText, href: r.querySelector('.mark.rerun a').getAttribute('href'), \
                   forks: r.querySelectorAll('.mark.fork').length }})\
                 (document.querySelector('#sessions tr[data-session=\"{rerun}\"]'))"
            ),
            WAIT,
        )
    });
    let marks = row["marks"].as_str().unwrap();
    let short = marks
        .strip_prefix("rerun of ")
        .unwrap_or_else(|| panic!("{row}"));
    assert!(short.len() >= 8 && original.starts_with(short), "{row}");
    assert_eq!(row["href"], format!("#/s/{original}"), "{row}");
    assert_eq!(row["forks"], 0, "{row}");
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// The approval box shows the model's arguments with a bidi override
/// escaped, as every session text: shown as is, what the person reads
/// would not be what the tool gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_box_shows_bidi_overrides_escaped() {
    // Stored: the account "\u{202e}1337-tcca" (reads "acct-7331" on screen).
    let mut bed = refund_on_approval(vec![
        MockReply::calls(&[("refund", json!({"n": 7, "to": "\u{202e}1337-tcca\u{202c}"}))]),
        MockReply::answer("Refunded."),
    ])
    .await;
    let id = bed.create().await;
    waits_for_approval(bed.daemon(), &id, "refund").await;
    let (browser, page) = bed.signed_in("ada").await;
    blocking(|| page.eval(&format!("location.hash = '#/s/{id}'")));
    let shown = blocking(|| {
        page.wait_for(
            "(t => t && t.value)(document.querySelector('#waiting textarea.edit-args'))",
            WAIT,
        )
    });
    screenshot(&page, "approval-bidi");
    let raw = shown.as_str().unwrap();
    assert!(
        !raw.chars()
            .any(|c| matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')),
        "the approval box shows a bidi override unescaped: {raw:?}"
    );
    drop(page);
    drop(browser);
    assert!(bed.take_daemon().terminate().await.success());
}

/// Arguments padded with 400 newlines showed their first member alone in a
/// 4-row box: the box shows them laid out afresh, whole, each member on a
/// line of its own, and the call is approved with the model's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_box_shows_padded_arguments_whole() {
    use mneme_e2e::hostile::{completion, raw_call, Answer, HostileModel};
    let padded = format!(
        "{{\"note\": \"fine\",{}\"to\": \"mallory-iban\", \"n\": 7}}",
        "\n".repeat(400)
    );
    let model = HostileModel::start(move |n, _, _| match n {
        0 => raw_call("refund", &padded),
        _ => Answer::Json(completion(Some("Refunded."), &[])),
    })
    .await;
    let mut bed = Testbed::new()
        .model_url(&model.base_url())
        .sink_tools(|sink| vec![refund_needing_approval(sink)])
        .daemon()
        .await;
    let id = bed.create().await;
    let (_, end) = bed.daemon().message_and_wait(&id, "refund").await;
    assert_eq!(end["awaiting_approval"][0]["call_id"], "c1", "{end}");
    let (browser, page) = bed.signed_in("ada").await;
    blocking(|| page.eval(&format!("location.hash = '#/s/{id}'")));
    let shown = blocking(|| {
        page.wait_for(
            "(t => t && [t.value, t.rows])(document.querySelector('#waiting textarea.edit-args'))",
            WAIT,
        )
    });
    screenshot(&page, "approval-padded");
    let (text, rows) = (shown[0].as_str().unwrap(), shown[1].as_u64().unwrap());
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.contains(&r#"  "to": "mallory-iban","#), "{text}");
    assert!(
        lines.len() <= 6 && rows >= lines.len() as u64,
        "whole: {rows} rows for {text}"
    );
    let card = blocking(|| {
        page.eval("document.querySelector('#conversation .call .arguments').textContent")
    });
    assert_eq!(
        card, r#"{"note":"fine","to":"mallory-iban","n":7}"#,
        "the call's card"
    );
    blocking(|| page.click("#waiting .approve"));
    let sink = &bed.sink;
    effects_reach(sink, "refund", 1, WAIT).await;
    assert_eq!(sink.bodies("refund")[0]["to"], "mallory-iban");
    let path = format!("/sessions/{id}/events?kind=ApprovalDecided");
    let (_, decided) = bed.daemon().get(&path).await;
    let decided = &decided[0]["event"]["ApprovalDecided"];
    assert_eq!(decided["by"], "ada", "{decided}");
    assert!(
        decided.get("args").is_none(),
        "the model's own arguments: {decided}"
    );
    drop(page);
    drop(browser);
    assert!(bed.take_daemon().terminate().await.success());
}

/// U+061C ARABIC LETTER MARK is a bidi control like U+200F: a model's
/// answer "\u{061C}100 5" must read in order in the facts (unescaped, it
/// read "5 100").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arabic_letter_mark_does_not_reorder_an_answer() {
    let world = World::new();
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let mut models = vec![];
    let (browser, page) = {
        let mut ids = vec![];
        for answer in ["rlm pay \u{200f}100 5", "alm pay \u{061c}100 5"] {
            let model = MockModel::start(vec![MockReply::answer(answer)], Fault::None).await;
            let id = daemon.create(&agent_toml(&model.base_url(), &[])).await;
            let (status, _) = daemon
                .post(
                    &format!("/sessions/{id}/messages"),
                    &json!({"text": "go", "wait": true}),
                )
                .await;
            assert!(status < 300, "{status}");
            ids.push(id);
            models.push(model);
        }
        let (browser, page) = signed_in_page(&world, "ada", WAIT).await;
        let mut order = vec![];
        for (id, tag) in ids.iter().zip(["rlm", "alm"]) {
            blocking(|| page.eval(&format!("location.hash = '#/s/{id}'")));
            let o = blocking(|| {
                page.wait_for(
                &format!("(() => {{ const w = document.createTreeWalker(document.querySelector('.facts') || document.createElement('i'), NodeFilter.SHOW_TEXT);\
                   for (let n; (n = w.nextNode());) {{ const s = n.data; const i = s.indexOf('100 5'); if (!s.startsWith('{tag}') || i < 0) continue;\
                     const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 3); const hundred = r.getBoundingClientRect().left;\
                     r.setStart(n, i + 4); r.setEnd(n, i + 5); const five = r.getBoundingClientRect().left;\
                     return {{ text: JSON.stringify(s), hundred_left_of_five: hundred < five }}; }} return null; }})()"),
                WAIT,
            )
            });
            order.push(o);
        }
        screenshot(&page, "answer-letter-mark");
        println!("{order:?}");
        assert_eq!(
            order[0]["hundred_left_of_five"], true,
            "U+200F: {:?}",
            order[0]
        );
        assert_eq!(
            order[1]["hundred_left_of_five"], true,
            "U+061C reorders the answer: {:?}",
            order[1]
        );
        (browser, page)
    };
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// A long streamed reply while the page is open: only the end of what has
/// arrived is shown (appending each piece to the whole text made the page's
/// work grow with the square of the reply's length; 3.6 MB froze it for 8 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_streamed_reply_shows_only_its_end_while_it_arrives() {
    let world = World::new();
    let piece = format!("{} ", "x".repeat(150));
    let model = mneme_e2e::hostile::HostileModel::start(move |_, _, _| {
        let texts: Vec<&str> = (0..2_000).map(|_| piece.as_str()).collect();
        let events = mneme_e2e::hostile::streamed_text(&texts, "stop");
        // Forty SSE events a chunk (the server sleeps 10 ms a chunk).
        let events = events.chunks(40).map(|c| c.join("\n\ndata: ")).collect();
        mneme_e2e::hostile::Answer::Stream {
            events,
            gate: None,
            then_stall: false,
        }
    })
    .await;
    let lines = "timeout_secs = 120\nstream = true\n";
    let (daemon, id, browser, page) =
        streaming_session_on_a_page(&world, &model.base_url(), lines).await;
    // The longest the box of arriving text ever was.
    blocking(|| {
        page.eval(
            "window.__longest = 0; setInterval(() => { const a = document.getElementById('arriving'); \
             window.__longest = Math.max(window.__longest, a ? a.textContent.length : 0); }, 5); true",
        )
    });
    let (status, _) = daemon
        .post(
            &format!("/sessions/{id}/messages"),
            &json!({"text": "go", "wait": true}),
        )
        .await;
    assert!(status < 300, "{status}");
    blocking(|| {
        page.wait_for(
            "document.getElementById('arriving').hidden && document.getElementById('turns').innerText.includes('xxxx')",
            WAIT,
        )
    });
    let longest = blocking(|| page.eval("window.__longest")).as_f64().unwrap();
    assert!(longest > 0.0, "nothing was seen arriving");
    assert!(
        longest <= 4_000.0,
        "the box of arriving text held {longest} characters"
    );
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// `n` as the page writes it: digits in groups of three, by commas.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A session opens as its conversation: the user's message, each reply
/// with its figures once, each tool call as one card (its tool, effect,
/// key, attempt and result) under the reply that made it, and no event
/// rows among them; the events stay one click away, all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conversation_shows_each_call_as_one_card_and_each_replys_figures_once() {
    let mut bed = billing().daemon().await;
    let id = bed.create().await;
    let (daemon, world) = (bed.take_daemon(), &bed.world);
    let text = "Charge customer 1, then email them.";
    let (_, end) = daemon.message_and_wait(&id, text).await;
    assert_eq!(end["answer"], "Charged and emailed.", "{end}");
    let (_, records) = daemon.get(&format!("/sessions/{id}/events")).await;
    let records = records.as_array().unwrap().clone();
    let of_kind = |kind: &str| -> Vec<Value> {
        (records.iter())
            .filter(|r| r["kind"] == kind)
            .map(|r| r["event"][kind].clone())
            .collect()
    };
    let started = of_kind("ToolStarted");
    let replies = of_kind("ModelReplied");
    assert_eq!((started.len(), replies.len()), (3, 3));

    let (browser, page) = signed_in_page(world, "ada", WAIT).await;
    blocking(|| page.eval(&format!("location.hash = '#/s/{id}'")));
    blocking(|| {
        page.wait_for(
            "document.querySelectorAll('#conversation .call').length === 3 && document.querySelector('#verified.ok')",
            WAIT,
        )
    });
    screenshot(&page, "11-conversation");
    let shown = blocking(|| {
        page.eval(
            "(() => { const c = document.getElementById('conversation'); \
               return { hidden: c.hidden, text: c.innerText, rows: c.querySelectorAll('.event').length, \
                 users: [...c.querySelectorAll('.turn.user .text')].map(n => n.innerText), \
                 answers: [...c.querySelectorAll('.turn.agent .text')].map(n => n.innerText), \
                 figures: c.querySelectorAll('.figures').length, \
                 cards: [...c.querySelectorAll('.call')].map(n => ({ call: n.dataset.call, \
                   tool: n.querySelector('.tool').textContent, effect: n.querySelector('.effect').textContent, \
                   key: n.querySelector('.key').textContent, args: n.querySelector('.arguments').textContent, \
                   attempts: [...n.querySelectorAll('.attempt')].map(a => a.querySelector('.outcome').textContent), \
                   duration: n.querySelector('.attempt .duration').textContent, \
                   result: n.querySelector('.result').textContent })) }; })()",
        )
    });
    assert_eq!(shown["hidden"], false, "the conversation is what opens");
    assert_eq!(shown["rows"], 0, "no event rows among the turns: {shown}");
    assert_eq!(
        shown["users"],
        json!(["Charge customer 1, then email them."]),
        "{shown}"
    );
    assert_eq!(shown["answers"], json!(["Charged and emailed."]), "{shown}");
    // One card per call, in the order they started, with what the log says.
    let cards = shown["cards"].as_array().unwrap();
    assert_eq!(cards.len(), started.len(), "{shown}");
    for (card, start) in cards.iter().zip(&started) {
        assert_eq!(card["call"], start["call_id"], "{card}");
        assert_eq!(card["tool"], start["tool"], "{card}");
        assert_eq!(card["effect"], start["effect"], "{card}");
        assert_eq!(card["key"], start["idempotency_key"], "{card}");
        assert_eq!(card["args"], start["args"], "{card}");
        assert_eq!(card["attempts"], json!(["ok"]), "{card}");
        assert!(
            card["duration"].as_str().unwrap().ends_with(" ms"),
            "{card}"
        );
        assert!(
            card["result"].as_str().unwrap().starts_with("Result: ok: "),
            "{card}"
        );
    }
    let effects: Vec<&Value> = cards.iter().map(|c| &c["effect"]).collect();
    assert_eq!(effects, ["side_effect", "read_only", "side_effect"]);
    // Each reply's figures, once.
    let text = shown["text"].as_str().unwrap();
    assert_eq!(shown["figures"], replies.len(), "{shown}");
    for reply in &replies {
        let u = &reply["usage"];
        let figures = format!(
            "tokens {} in ({} cached) / {} out · {} ms",
            grouped(u["prompt_tokens"].as_u64().unwrap()),
            grouped(u["cached_tokens"].as_u64().unwrap()),
            grouped(u["completion_tokens"].as_u64().unwrap()),
            grouped(reply["latency_ms"].as_u64().unwrap()),
        );
        assert_eq!(
            text.matches(&figures).count(),
            1,
            "{figures:?} is not shown exactly once: {text}"
        );
        let tokens = format!(
            "tokens {} in",
            grouped(u["prompt_tokens"].as_u64().unwrap())
        );
        assert_eq!(text.matches(&tokens).count(), 1, "{tokens:?}: {text}");
    }
    // The events, one click away: every event, as before.
    blocking(|| page.click("#tab-events"));
    let events = blocking(|| {
        page.wait_for(
            "!document.getElementById('events').hidden && document.getElementById('conversation').hidden \
               && document.querySelectorAll('#timeline .event[id]').length",
            WAIT,
        )
    });
    assert_eq!(events, records.len(), "every event has its row");
    screenshot(&page, "12-events");
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// A `mneme run` killed (SIGKILL) while its email ran, then resumed: the
/// page shows the first attempt as "process died" (not "running…"), the
/// second one's result, and a note where the resume took the turn up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runs_attempt_shows_as_process_died() {
    let bed = billing().await;
    let world = &bed.world;
    let message = "Charge customer 1, look them up, then email them.";
    let killed = bed.run_killed_in("email", message).await;
    let id = session_id(&killed);
    let out = world.run(&["resume", &id]).await;
    assert!(out.status.success(), "resume failed: {}", stderr(&out));
    assert!(
        stdout(&out).contains("Charged and emailed."),
        "{}",
        stdout(&out)
    );

    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let (_, records) = daemon.get(&format!("/sessions/{id}/events")).await;
    let resumed = find_event(&records, "SessionResumed");
    assert_eq!(resumed["after_crash"], true, "{resumed}");
    let email = (records.as_array().unwrap().iter())
        .filter(|r| r["kind"] == "ToolStarted" && r["event"]["ToolStarted"]["tool"] == "email")
        .map(|r| r["event"]["ToolStarted"].clone())
        .collect::<Vec<_>>();
    assert_eq!(email.len(), 2, "two attempts of the email: {records}");
    let call = email[0]["call_id"].as_str().unwrap().to_string();

    let (browser, page) = signed_in_page(world, "ada", WAIT).await;
    blocking(|| page.eval(&format!("location.hash = '#/s/{id}'")));
    for view in ["#conversation", "#timeline"] {
        let attempts = blocking(|| {
            page.wait_for(
                &format!(
                    "(c => c && c.querySelectorAll('.attempt').length === 2 && \
                       [...c.querySelectorAll('.attempt')].map(a => [a.dataset.attempt, a.className, a.querySelector('.outcome').textContent]))\
                     (document.querySelector('{view} .call[data-call=\"{call}\"]'))"
                ),
                WAIT,
            )
        });
        assert_eq!(
            attempts,
            json!([
                ["1", "attempt died", "process died"],
                ["2", "attempt ok", "ok"]
            ]),
            "{view}"
        );
    }
    let shown = blocking(|| {
        page.eval(
            "({ crash: [...document.querySelectorAll('#conversation .turn.remark.crash')].map(n => n.innerText), \
                text: document.getElementById('conversation').innerText })",
        )
    });
    assert_eq!(
        shown["crash"],
        json!(["The process running this turn died; resumed by mneme resume."]),
        "{shown}"
    );
    assert!(
        !shown["text"].as_str().unwrap().contains("running…"),
        "{shown}"
    );
    screenshot(&page, "13-process-died");
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// The list titles each session with its first message (as text), shows a
/// short prefix of its id that no other session shares, and marks a fork
/// with a link to its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_shows_titles_and_marks_forks() {
    let mut bed = Testbed::new()
        .replies(vec![
            MockReply::answer("Hello."),
            MockReply::answer("Again."),
        ])
        .daemon()
        .await;
    let original = bed.create().await;
    let (daemon, world) = (bed.take_daemon(), &bed.world);
    let said = "greet <b>ada</b>\u{202e} please";
    let (_, end) = daemon.message_and_wait(&original, said).await;
    assert_eq!(end["answer"], "Hello.", "{end}");
    let (status, forked) = daemon
        .post(&format!("/sessions/{original}/fork"), &json!({"at": 2}))
        .await;
    assert_eq!(status, 201, "{forked}");
    let fork = forked["session"].as_str().unwrap().to_string();
    let empty = daemon.create(&bed.agent_toml).await;

    let (browser, page) = signed_in_page(world, "ada", WAIT).await;
    let row = |id: &str| {
        blocking(|| {
            page.wait_for(
                &format!(
                    "(r => r && {{ title: r.querySelector('.session-link .title').innerText, \
                       link: r.querySelector('.session-link').getAttribute('href'), \
                       full: r.querySelector('.session-link').getAttribute('title'), \
                       short: r.querySelector('.short-id').innerText, \
                       marks: [...r.querySelectorAll('.mark')].map(m => [m.className, m.innerText, \
                         m.querySelector('a').getAttribute('href'), m.querySelector('a').getAttribute('title')]) }})\
                     (document.querySelector('#sessions tr[data-session=\"{id}\"]'))"
                ),
                WAIT,
            )
        })
    };
    let (a, f, e) = (row(&original), row(&fork), row(&empty));
    screenshot(&page, "14-sessions-titled");
    let escaped = "greet <b>ada</b>\\u{202e} please";
    assert_eq!(a["title"], escaped, "{a}");
    assert_eq!(f["title"], escaped, "the fork holds the same message: {f}");
    assert_eq!(e["title"], "no message yet", "{e}");
    let bold = blocking(|| page.eval("document.querySelectorAll('#sessions b').length"));
    assert_eq!(bold, 0, "the title is text, not markup");
    for (r, id) in [(&a, &original), (&f, &fork), (&e, &empty)] {
        assert_eq!(r["link"], format!("#/s/{id}"), "{r}");
        assert_eq!(r["full"], id.as_str(), "{r}");
        let short = r["short"].as_str().unwrap();
        assert!(short.len() >= 8 && id.starts_with(short), "{r}");
    }
    let shorts = [&a["short"], &f["short"], &e["short"]];
    assert!(
        shorts[0] != shorts[1] && shorts[1] != shorts[2] && shorts[0] != shorts[2],
        "{shorts:?}"
    );
    assert_eq!(a["marks"], json!([]), "{a}");
    assert_eq!(
        f["marks"],
        json!([[
            "mark fork",
            format!("fork of {}", a["short"].as_str().unwrap()),
            format!("#/s/{original}"),
            original
        ]]),
        "{f}"
    );
    // Found by its title's words.
    blocking(|| page.eval("location.hash = '#/?find=GREET'"));
    let found = blocking(|| {
        page.wait_for(
            "document.getElementById('find').value === 'GREET' && document.querySelectorAll('#sessions tbody tr').length",
            WAIT,
        )
    });
    assert_eq!(found, 2, "the session and its fork");
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// A sub-agent's row in the list is marked with a link to its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_marks_a_sub_agent_with_its_parent() {
    let world = World::new();
    let parent_model = MockModel::start(
        vec![
            MockReply::calls(&[("billing", json!({ "message": "charge customer 1" }))]),
            MockReply::answer("The billing agent charged customer 1."),
        ],
        Fault::None,
    )
    .await;
    let child_model = MockModel::start(vec![MockReply::answer("Charged.")], Fault::None).await;
    std::fs::create_dir(world.dir.path().join("agents")).unwrap();
    let child = agent_toml(&child_model.base_url(), &[]).replace("test-agent", "billing");
    world.write("agents/billing.toml", &child);
    let billing = "name = \"billing\"\ndescription = \"The billing agent\"\nkind = \"agent\"\n\
                   agent = \"agents/billing.toml\"\neffect = \"side_effect\"\n";
    let agent = world.write(
        "parent.toml",
        &agent_toml(&parent_model.base_url(), &[billing.to_string()]),
    );
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "bill customer 1"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let parent = session_id(&out);
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let (_, view) = daemon.get(&format!("/sessions/{parent}")).await;
    let child = view["children"][0]["session"]
        .as_str()
        .unwrap_or_else(|| panic!("no child: {view}"))
        .to_string();

    let (browser, page) = signed_in_page(&world, "ada", WAIT).await;
    let marks = |id: &str| {
        blocking(|| {
            page.wait_for(
                &format!(
                    "(r => r && [...r.querySelectorAll('.mark')].map(m => [m.className, m.innerText, \
                       m.querySelector('a').getAttribute('href'), m.querySelector('a').getAttribute('title')]))\
                     (document.querySelector('#sessions tr[data-session=\"{id}\"]'))"
                ),
                WAIT,
            )
        })
    };
    assert_eq!(marks(&parent), json!([]));
    let of_child = marks(&child);
    let text = of_child[0][1].as_str().unwrap();
    let short = text
        .strip_prefix("sub-agent of ")
        .unwrap_or_else(|| panic!("{of_child}"));
    assert!(short.len() >= 8 && parent.starts_with(short), "{of_child}");
    assert_eq!(of_child[0][0], "mark child", "{of_child}");
    assert_eq!(of_child[0][2], format!("#/s/{parent}"), "{of_child}");
    assert_eq!(of_child[0][3], parent.as_str(), "{of_child}");
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// A sleeping session's page says so: its status, the event it waits for,
/// and its call as sleeping (never as a process that died); once woken,
/// the call says how it woke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_session_shows_what_it_waits_for_and_how_it_woke() {
    let wait = "name = \"wait\"\nkind = \"sleep\"\neffect = \"read_only\"\n".to_string();
    let bed = Testbed::new()
        .replies(vec![
            MockReply::calls(&[("wait", json!({"event": "payment.landed"}))]),
            MockReply::answer("Paid."),
        ])
        .tools([wait])
        .daemon()
        .await;
    let daemon = bed.daemon();
    let id = bed.create().await;
    let (_, end) = daemon.message_and_wait(&id, "wait for the payment").await;
    assert_eq!(end["status"], "sleeping", "{end}");
    let (browser, page) = signed_in_page(&bed.world, "ada", WAIT).await;
    blocking(|| page.eval(&format!("location.hash = '#/s/{id}'")));
    let shown = |ready: &str| {
        blocking(|| {
            page.wait_for(
                &format!(
                    "(c => c && {ready} && ({{ facts: document.querySelector('.facts').innerText, \
                       attempt: c.querySelector('.attempt').className, outcome: c.querySelector('.attempt .outcome').textContent, \
                       status: c.querySelector('.call-status').textContent }}))\
                     (document.querySelector('#timeline .call[data-call=\"call_0_0\"]'))"
                ),
                WAIT,
            )
        })
    };
    let asleep = shown("c.querySelector('.attempt.sleeping')");
    assert!(
        asleep["facts"].as_str().unwrap().contains("payment.landed"),
        "{asleep}"
    );
    assert_eq!(asleep["attempt"], "attempt sleeping", "{asleep}");
    assert!(
        asleep["outcome"]
            .as_str()
            .unwrap()
            .starts_with("sleeping until the event payment.landed"),
        "{asleep}"
    );
    screenshot(&page, "20-sleeping");
    let (status, body) = daemon
        .post(
            &format!("/sessions/{id}/wake"),
            &json!({"event": "payment.landed", "payload": {"ok": true}, "wait": true}),
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("idle")),
        "{body}"
    );
    let woke = shown("c.querySelector('.call-status').textContent.startsWith('Woke')");
    assert!(
        woke["status"].as_str().unwrap().starts_with("Woke (event)"),
        "{woke}"
    );
    drop(page);
    drop(browser);
}
