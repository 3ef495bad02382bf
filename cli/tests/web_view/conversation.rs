//! A session's page as a conversation: each call one card, each reply's
//! figures once, a rerun's links, a killed attempt, a sleeping session.

use super::*;

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
