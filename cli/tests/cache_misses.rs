//! `mneme replay --cache` through the real binary: a reply whose prompt
//! missed the server's prefix cache is named with what it cost and why:
//! the system prompt a `fork --agent` changed, or nothing recorded (the
//! server evicted the prefix). A daemon counts misses by cause for
//! Prometheus, and its web view marks the reply that missed (and shows
//! what a reply reasoned, folded away).

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::hostile::{Answer, HostileModel};
use mneme_e2e::*;
use serde_json::{json, Value};

/// An agent file on `url` whose system prompt starts with `opening` and
/// runs long (about 5 KB: a prefix worth caching).
fn agent_with_system(url: &str, opening: &str) -> String {
    let system = format!("{opening} {}", "Keep every figure exact. ".repeat(200));
    agent_toml(url, &[]).replace("You are a test agent.", &system)
}

/// The misses `mneme replay --cache --json` lists for `session`.
async fn misses(world: &World, session: &str) -> Vec<Value> {
    let out = world.run(&["replay", "--cache", "--json", session]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn run_ok(world: &World, args: &[&str]) -> std::process::Output {
    let out = world.run(args).await;
    assert!(out.status.success(), "mneme {args:?}: {}", stderr(&out));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_with_another_system_prompt_is_named_as_the_cause_of_its_miss() {
    let replies = ["one", "two", "three"].map(MockReply::answer).to_vec();
    let model = MockModel::start(replies, Fault::None).await;
    let world = World::new();
    let billing = world.write(
        "billing.toml",
        &agent_with_system(&model.base_url(), "You are a billing agent."),
    );
    let refunds = world.write(
        "refunds.toml",
        &agent_with_system(&model.base_url(), "You are a refunds agent."),
    );
    let out = run_ok(
        &world,
        &["run", "--agent", billing.to_str().unwrap(), "first"],
    )
    .await;
    let id = session_id(&out);
    run_ok(&world, &["run", "--session", &id, "second"]).await;
    // The session's second request extended its first: the mock's cache
    // served it, and nothing is listed.
    assert_eq!(misses(&world, &id).await, Vec::<Value>::new());
    let out = run_ok(&world, &["replay", "--cache", &id]).await;
    assert!(
        stdout(&out).contains("no prefix-cache misses"),
        "{}",
        stdout(&out)
    );

    let events = logged_events(&world, &id).await;
    let at = events.last().unwrap().0.to_string();
    let out = run_ok(
        &world,
        &[
            "fork",
            &id,
            "--at",
            &at,
            "--agent",
            refunds.to_str().unwrap(),
        ],
    )
    .await;
    let fork = stdout(&out).trim().to_string();
    run_ok(&world, &["run", "--session", &fork, "third"]).await;
    let missed = misses(&world, &fork).await;
    assert_eq!(missed.len(), 1, "{missed:?}");
    // The fork (a session of its own: another prompt-cache key) and its
    // system prompt, both recorded since the reply before.
    assert_eq!(
        missed[0]["cause"], "fork, system prompt changed",
        "{missed:?}"
    );
    let cacheable = missed[0]["cacheable_tokens"].as_u64().unwrap();
    let cached = missed[0]["cached_tokens"].as_u64().unwrap();
    assert!(cacheable > 1000 && cached < 100, "{missed:?}");
    // Where the two requests part: at the system prompt's first word that
    // differs.
    let sent = &model.bodies()[1];
    let at = sent.windows(7).position(|w| w == b"billing").unwrap();
    assert_eq!(missed[0]["first_difference"], at as u64, "{missed:?}");
    let out = run_ok(&world, &["replay", "--cache", &fork]).await;
    assert!(
        stdout(&out).contains("system prompt changed, the request first differing at byte"),
        "{}",
        stdout(&out)
    );
}

/// A server that never serves from its cache (restarted between
/// requests, say): every prompt token is read anew. Each answer comes
/// with the reasoning `thought N`.
async fn forgetful_model() -> HostileModel {
    HostileModel::start(|n, request, _| {
        let prompt = request.to_string().len() / 4;
        Answer::Json(json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("answer {n}"),
                                                 "reasoning_content": format!("thought {n}")},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 3,
                      "prompt_tokens_details": {"cached_tokens": 0}}}))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miss_no_recorded_event_explains_is_named_evicted() {
    let model = forgetful_model().await;
    let world = World::new();
    let agent = world.write(
        "agent.toml",
        &agent_with_system(&model.base_url(), "You are a billing agent."),
    );
    let out = run_ok(
        &world,
        &["run", "--agent", agent.to_str().unwrap(), "first"],
    )
    .await;
    let id = session_id(&out);
    run_ok(&world, &["run", "--session", &id, "second"]).await;
    let missed = misses(&world, &id).await;
    assert_eq!(missed.len(), 1, "{missed:?}");
    assert_eq!(missed[0]["cause"], "evicted", "{missed:?}");
    assert_eq!(missed[0]["cached_tokens"], 0);
    // The second request extended the first past its stable start.
    let first = model.requests()[0].to_string().len() as u64;
    assert!(missed[0]["first_difference"].as_u64().unwrap() > first / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_counts_the_miss_by_cause_and_its_web_view_marks_it() {
    use mneme_e2e::browser::signed_in_page;
    const WAIT: std::time::Duration = std::time::Duration::from_secs(20);
    let model = forgetful_model().await;
    let world = World::new();
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let agent = agent_with_system(&model.base_url(), "You are a billing agent.");
    let id = daemon.create(&agent).await;
    for text in ["first", "second"] {
        let (status, end) = daemon.message_and_wait(&id, text).await;
        assert_eq!(status, 200, "{end}");
    }
    let (status, report) = daemon.get(&format!("/sessions/{id}/cache")).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["misses"].as_array().unwrap().len(), 1, "{report}");
    let missed = report["misses"][0]["seq"].to_string();
    let metrics = daemon.metrics_text().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "mneme_cache_misses_total{cause=\"evicted\"} 1"),
        "{metrics}"
    );

    let (browser, page) = signed_in_page(&world, "ada", WAIT).await;
    let shown = tokio::task::block_in_place(|| {
        page.eval(&format!("location.hash = '#/s/{id}'"))?;
        page.wait_for("document.querySelector('#conversation .miss-note')", WAIT)?;
        page.eval(
            "({ misses: [...document.querySelectorAll('#conversation .miss-note')].map(n => \
                   [n.closest('[data-seq]').dataset.seq, n.dataset.cause, n.textContent]), \
               events: document.querySelectorAll('#timeline .miss-note').length, \
               reasoning: [...document.querySelectorAll('#conversation details.thinking')].map(d => \
                   [d.open, d.querySelector('summary').textContent, d.querySelector('.text').textContent]) })",
        )
    })
    .unwrap_or_else(|e| panic!("{e}"));
    drop(browser);
    // The second reply missed: marked once in each view, with its cause.
    let misses = shown["misses"].as_array().unwrap();
    assert_eq!(misses.len(), 1, "{shown}");
    assert_eq!(misses[0][0], missed.as_str(), "{shown}");
    assert_eq!(misses[0][1], "evicted", "{shown}");
    assert!(
        misses[0][2].as_str().unwrap().contains("cause: evicted"),
        "{shown}"
    );
    assert_eq!(shown["events"], 1, "{shown}");
    // Each reply's reasoning, folded away.
    assert_eq!(
        shown["reasoning"],
        json!([
            [false, "Reasoning", "thought 0"],
            [false, "Reasoning", "thought 1"]
        ]),
        "{shown}"
    );
}
