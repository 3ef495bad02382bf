//! A reply streamed onto the page as it arrives.

use super::*;

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
