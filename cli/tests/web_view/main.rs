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

mod approvals;
mod conversation;
mod journey;
mod list;
mod streaming;
