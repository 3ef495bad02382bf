//! The approval box: edited arguments, an expired wait, and arguments
//! shown whole and as they are.

use super::*;

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
