//! The web view in a real browser (headless Chromium, installed by
//! `scripts/chromium.sh` if missing) against a real daemon: sign in with
//! `mneme ui`'s one-time link (a second use refused), find a session, open
//! it, see a tool call with its key and effect, approve it from the page and
//! watch the session go on to its answer, see a turn started elsewhere
//! arrive live, use it by keyboard, fork it and open the diff; a page
//! of another origin cannot act for the signed-in browser; approve a call
//! with edited arguments, and see one whose approval expired; a rerun's page
//! links to its original and to the diff of the two. Screenshots of
//! each page go to `target/ui-screenshots/`.

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
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ui-screenshots");
    blocking(|| page.screenshot(&dir.join(format!("{name}.png"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signs_in_finds_a_session_approves_its_call_and_compares_a_fork() {
    let world = World::new();
    let sink = Sink::start().await.unwrap();
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("refund", json!({"n": 7}))]),
            MockReply::answer("Refunded."),
            MockReply::answer("Anything else?"),
        ],
        Fault::None,
    )
    .await;
    let tool = refund_needing_approval(&sink);
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let id = daemon.create(&agent_toml(&model.base_url(), &[tool])).await;
    daemon.create(&agent_toml(&model.base_url(), &[])).await;
    let (_, end) = daemon
        .post(
            &format!("/sessions/{id}/messages"),
            &json!({"text": HOSTILE_MESSAGE, "wait": true}),
        )
        .await;
    assert_eq!(end["awaiting_approval"][0]["call_id"], "call_0_0", "{end}");

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

    let link = sign_in_link(&world, "ada").await;
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

    // The session: its tool call with its key and effect, waiting for approval.
    blocking(|| page.wait_for("document.querySelector('#waiting .approve')", WAIT));
    blocking(|| page.wait_for("document.querySelector('#verified.ok')", WAIT));
    let card = blocking(|| {
        page.eval("(() => { const c = document.querySelector('.call[data-call=\"call_0_0\"]'); \
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
                   text: document.getElementById('e2').innerText })",
        )
    });
    assert_eq!(hostile["images"], 0, "{hostile}");
    assert_ne!(hostile["title"], "pwned", "{hostile}");
    let text = hostile["text"].as_str().unwrap();
    assert!(
        text.contains("<img src=x") && text.contains("\\u{202e}"),
        "{hostile}"
    );
    screenshot(&page, "3-session-waiting");

    // A page of another origin cannot act for the signed-in browser.
    let forged = cross_site_cancel(&daemon, &id).await;
    let attacker = blocking(|| browser.new_page());
    blocking(|| attacker.goto(&forged.url));
    blocking(|| attacker.wait_for("document.title === 'sent'", WAIT));
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
        page.wait_for("document.querySelector('.call[data-call=\"call_0_0\"] .duration').textContent.endsWith('ms')", WAIT)
    });
    let key = started_key(&daemon, &id).await;
    let attempt = blocking(|| {
        page.eval("(() => { const c = document.querySelector('.call[data-call=\"call_0_0\"]'); \
                   return { key: c.querySelector('.key').textContent, effect: c.querySelector('.effect').textContent, \
                            status: c.querySelector('.call-status').textContent }; })()")
    });
    assert_eq!(attempt["key"], key.as_str(), "{attempt}");
    assert_eq!(attempt["effect"], "side_effect", "{attempt}");
    assert!(
        attempt["status"]
            .as_str()
            .unwrap()
            .contains("Approved by ada"),
        "{attempt}"
    );
    screenshot(&page, "4-session-answered");

    // By keyboard: j moves to the first event, Enter shows its payload.
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

    // Fork at the user's message and compare the fork with its parent.
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
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let agent = agent_toml(&model.base_url(), &[])
        .replace("timeout_secs = 10\n", "timeout_secs = 10\nstream = true\n");
    let id = daemon.create(&agent).await;
    let (browser, page) = signed_in_page(&world, "ada", WAIT).await;
    blocking(|| page.eval(&format!("location.hash = '#/s/{id}'")));
    blocking(|| {
        page.wait_for(
            "document.getElementById('live').textContent.includes('live')",
            WAIT,
        )
    });

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
        page.wait_for("document.getElementById('timeline').innerText.includes('then the rest.') && document.getElementById('arriving').hidden", WAIT)
    });
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_is_approved_with_edited_arguments_and_an_expired_one_says_so() {
    let world = World::new();
    let sink = Sink::start().await.unwrap();
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("refund", json!({"n": 7}))]),
            MockReply::answer("Refunded."),
        ],
        Fault::None,
    )
    .await;
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let agent = |extra: &str| {
        let tool = format!("{}{extra}", refund_needing_approval(&sink));
        agent_toml(&model.base_url(), &[tool])
    };
    let edited = daemon.create(&agent("")).await;
    let expiring = daemon.create(&agent("approval_timeout = \"1s\"\n")).await;
    for id in [&edited, &expiring] {
        let (_, end) = daemon
            .post(
                &format!("/sessions/{id}/messages"),
                &json!({"text": "refund ada", "wait": true}),
            )
            .await;
        assert_eq!(end["awaiting_approval"][0]["call_id"], "call_0_0", "{end}");
    }
    let (browser, page) = signed_in_page(&world, "ada", WAIT).await;

    // The waiting call's arguments, editable; approved with the person's.
    blocking(|| page.eval(&format!("location.hash = '#/s/{edited}'")));
    let shown = blocking(|| {
        page.wait_for(
            "(t => t && t.value)(document.querySelector('#waiting textarea.edit-args'))",
            WAIT,
        )
    });
    assert_eq!(shown, r#"{"n":7}"#);
    blocking(|| {
        page.eval("document.querySelector('#waiting textarea.edit-args').value = '{\"n\": 70}'")
    });
    blocking(|| page.click("#waiting .approve"));
    let status = blocking(|| {
        page.wait_for(
            "(c => c && c.querySelector('.duration').textContent.endsWith('ms') && c.querySelector('.call-status').textContent.includes('edited') \
               && [c.querySelector('.call-status').textContent, c.querySelector('.edited-args').textContent])\
             (document.querySelector('.call[data-call=\"call_0_0\"]'))",
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
             (document.querySelector('.call[data-call=\"call_0_0\"]'))",
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
    let mut args = String::new();
    for _ in 0..50 {
        args = std::fs::read_to_string(&seen).unwrap_or_default();
        if !args.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let world = World::new();
    let model = MockModel::start(vec![MockReply::answer("Hello.")], Fault::None).await;
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let original = daemon.create(&agent_toml(&model.base_url(), &[])).await;
    let (_, end) = daemon
        .post(
            &format!("/sessions/{original}/messages"),
            &json!({"text": "hi", "wait": true}),
        )
        .await;
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
    let (browser, page) = signed_in_page(&world, "ada", WAIT).await;
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
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// The approval box shows the model's arguments with a bidi override
/// escaped, as every session text: shown as is, what the person reads
/// would not be what the tool gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_box_shows_bidi_overrides_escaped() {
    let world = World::new();
    let sink = Sink::start().await.unwrap();
    // Stored: the account "\u{202e}1337-tcca" (reads "acct-7331" on screen).
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("refund", json!({"n": 7, "to": "\u{202e}1337-tcca\u{202c}"}))]),
            MockReply::answer("Refunded."),
        ],
        Fault::None,
    )
    .await;
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let id = daemon
        .create(&agent_toml(
            &model.base_url(),
            &[refund_needing_approval(&sink)],
        ))
        .await;
    let (_, end) = daemon
        .post(
            &format!("/sessions/{id}/messages"),
            &json!({"text": "refund", "wait": true}),
        )
        .await;
    assert_eq!(end["awaiting_approval"][0]["call_id"], "call_0_0", "{end}");
    let (browser, page) = signed_in_page(&world, "ada", WAIT).await;
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
    assert!(daemon.terminate().await.success());
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
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let agent = agent_toml(&model.base_url(), &[])
        .replace("timeout_secs = 10\n", "timeout_secs = 120\nstream = true\n");
    let id = daemon.create(&agent).await;
    let (browser, page) = signed_in_page(&world, "ada", WAIT).await;
    blocking(|| page.eval(&format!("location.hash = '#/s/{id}'")));
    blocking(|| {
        page.wait_for(
            "document.getElementById('live').textContent.includes('live')",
            WAIT,
        )
    });
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
            "document.getElementById('arriving').hidden && document.getElementById('timeline').innerText.includes('xxxx')",
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
