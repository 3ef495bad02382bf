//! A person's way through the web view: sign in with a one-time link, find
//! a session, approve its call, compare a fork; what a page of another
//! origin cannot do; `mneme ui` keeping its link off command lines.

use super::*;

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
