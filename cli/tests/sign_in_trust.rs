//! What a web view sign-in may and may not do, through the real daemon: it
//! cannot drive a model turn it could not have started (a fork at a user
//! message, then a resume, re-ran paid turns), it ends when the person signs
//! out, and nothing it reads is kept by a cache.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use reqwest::Method;
use serde_json::json;

/// A billing session whose turn charged once: the testbed (whose model has
/// a second turn's replies left) and the session.
async fn charged_once() -> (Testbed, String) {
    let replies = [billing_replies(), billing_replies()].concat();
    let bed = Testbed::new()
        .replies(replies)
        .sink_tools(|sink| billing_tools(sink).to_vec())
        .daemon()
        .await;
    let id = bed.create().await;
    let (status, end) = bed.daemon().message_and_wait(&id, "charge ada").await;
    assert_eq!(status, 200, "{end}");
    assert_eq!(bed.sink.stats().path("charge").effects, 1);
    (bed, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_cannot_rerun_a_paid_turn_by_forking_at_its_message() {
    let (bed, id) = charged_once().await;
    let daemon = bed.daemon();
    let browser = daemon.sign_in("ada").await;
    // Seq 2 is the user message: the fork's next step is a model request.
    let (status, forked) = browser
        .post(&format!("/sessions/{id}/fork"), &json!({"at": 2}))
        .await;
    assert_eq!(status, 201, "a sign-in may fork: {forked}");
    let fork = forked["session"].as_str().unwrap().to_string();
    let resume = format!("/sessions/{fork}/resume");
    let (_, before) = daemon.get(&format!("/sessions/{fork}")).await;
    assert_eq!(before["pending"], true, "{before}");
    for body in [json!({}), json!({"wait": true})] {
        let (status, refused) = browser.post(&resume, &body).await;
        assert_eq!(status, 403, "{refused}");
        let error = refused["error"].as_str().unwrap();
        assert!(error.contains("use the token"), "{error}");
    }
    let (_, after) = daemon.get(&format!("/sessions/{fork}")).await;
    assert_eq!(
        after["events"], before["events"],
        "nothing recorded in the fork"
    );
    assert_eq!(bed.sink.stats().path("charge").hits, 1, "no second charge");
    // The operator, with the token, may run it on purpose.
    let (status, end) = daemon.post(&resume, &json!({"wait": true})).await;
    assert_eq!(status, 200, "{end}");
    assert_eq!(bed.sink.stats().path("charge").effects, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_out_ends_the_sign_in_and_no_answer_is_cached() {
    let (bed, id) = charged_once().await;
    let daemon = bed.daemon();
    let browser = daemon.sign_in("ada").await;
    let session = format!("/sessions/{id}");
    let read = || async {
        let answer = browser.request(Method::GET, &session).send().await.unwrap();
        let cache = answer.headers().get("cache-control").cloned();
        (answer.status().as_u16(), cache)
    };
    let (status, cache) = read().await;
    assert_eq!(status, 200);
    assert_eq!(
        cache.unwrap(),
        "no-store",
        "a session's JSON is kept by no cache"
    );
    let by_token = daemon.http.get(daemon.url(&session)).send().await.unwrap();
    assert_eq!(by_token.headers()["cache-control"], "no-store");

    // Another site cannot sign the browser out (nor learn anything by it).
    let elsewhere = browser.request(Method::POST, "/ui/logout");
    let elsewhere = elsewhere
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status(), 403);
    assert_eq!(read().await.0, 200, "still signed in");

    let out = browser
        .request(Method::POST, "/ui/logout")
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 204);
    let cleared = out.headers()["set-cookie"].to_str().unwrap();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    assert_eq!(
        read().await.0,
        401,
        "the cookie and key sign in nowhere now"
    );
    let (status, _) = browser.post(&format!("{session}/resume"), &json!({})).await;
    assert_eq!(status, 401);
    let again = browser
        .request(Method::POST, "/ui/logout")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 401, "signed out once");
}

/// Each fork copies its parent's history (20 forks of a 48 MiB session by
/// a sign-in took 2.8 GB): a sign-in may fork ten times a minute, and a
/// session may have at most 64 forks, whoever asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_are_bounded_in_rate_for_a_sign_in_and_in_number_for_a_session() {
    let (bed, id) = charged_once().await;
    let daemon = bed.daemon();
    let browser = daemon.sign_in("ada").await;
    let path = format!("/sessions/{id}/fork");
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(browser.post(&path, &json!({"at": 2})).await.0);
    }
    assert_eq!(statuses, [[201; 10].as_slice(), &[429]].concat());
    let (status, refused) = browser.post(&path, &json!({"at": 2})).await;
    assert_eq!(status, 429);
    let refused = refused["error"].as_str().unwrap();
    assert!(refused.contains("use the token"), "{refused}");
    for n in 10..64 {
        let (status, forked) = daemon.post(&path, &json!({"at": 2})).await;
        assert_eq!(status, 201, "fork {n}: {forked}");
    }
    let (status, refused) = daemon.post(&path, &json!({"at": 2})).await;
    assert_eq!(status, 409, "{refused}");
    let refused = refused["error"].as_str().unwrap();
    assert!(refused.contains("it has 64 forks already"), "{refused}");
}

/// A fork at a user message holds a turn nobody started: a restarted
/// daemon's recovery left it alone only if it said so (it ran every such
/// fork's model turn, and its tools: a sign-in's forks, then a restart,
/// re-ran paid turns). Resumed by id, with the token, it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_does_not_run_a_fork_nobody_started() {
    let (mut bed, id) = charged_once().await;
    let browser = bed.daemon().sign_in("ada").await;
    let path = format!("/sessions/{id}/fork");
    let (status, forked) = browser.post(&path, &json!({"at": 2})).await;
    assert_eq!(status, 201, "{forked}");
    let fork = forked["session"].as_str().unwrap().to_string();
    assert!(bed.take_daemon().terminate().await.success());
    let log = bed.world.dir.path().join("restarted.log");
    let command = mneme_e2e::daemon::DaemonProcess::command(&bed.world.data(), &[]);
    let daemon =
        mneme_e2e::daemon::DaemonProcess::launch_logged(command, &bed.world.data(), &log).await;
    eventually(
        "the daemon's recovery",
        std::time::Duration::from_secs(20),
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("recovery found").then_some(())
        },
    )
    .await;
    let recovered = std::fs::read_to_string(&log).unwrap();
    assert!(
        recovered.contains("recovery found 0 interrupted sessions"),
        "{recovered}"
    );
    let (_, view) = daemon.get(&format!("/sessions/{fork}")).await;
    assert_eq!(view["pending"], true, "still waits for a person: {view}");
    assert_eq!(view["resumable"], false, "not for `resume --all`: {view}");
    assert_eq!(
        bed.sink.stats().path("charge").effects,
        1,
        "nothing charged again"
    );
    let (status, end) = daemon
        .post(&format!("/sessions/{fork}/resume"), &json!({"wait": true}))
        .await;
    assert_eq!(status, 200, "{end}");
    assert_eq!(bed.sink.stats().path("charge").effects, 2);
}
