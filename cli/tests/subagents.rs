//! Sub-agents through the real binary: a parent agent whose tool of kind
//! `agent` runs a child session, which charges through a side-effecting
//! HTTP tool. The child is linked both ways, its answer is the call's
//! result and its tokens count once in the parent's totals; a process
//! SIGKILLed inside the child's turn resumes the tree from the parent (the
//! same child, continued, its charge applied once); a crash after the
//! child answered reuses its answer (its model is not asked again); a
//! child waiting for approval makes its parent wait, and approving in the
//! child then resuming the parent finishes both.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::*;
use serde_json::{json, Value};
use std::path::PathBuf;

const MESSAGE: &str = "Have the billing agent charge customer 1.";
const TASK: &str = "Charge customer 1.";

/// A parent and a child agent, each on its own model server, and the sink
/// the child charges on.
struct Tree {
    world: World,
    parent_model: MockModel,
    child_model: MockModel,
    sink: Sink,
    parent: PathBuf,
}

/// The tree; the child's `charge` waits for approval when `approval`.
async fn tree(approval: bool) -> Tree {
    let world = World::new();
    let parent_model = MockModel::start(
        vec![
            MockReply::calls(&[("billing", json!({ "message": TASK }))]),
            MockReply::answer("The billing agent charged customer 1."),
        ],
        Fault::None,
    )
    .await;
    let child_model = MockModel::start(
        vec![
            MockReply::calls(&[("charge", json!({"n": 1}))]),
            MockReply::answer("Charged customer 1."),
        ],
        Fault::None,
    )
    .await;
    let sink = Sink::start().await.unwrap();
    let mut charge = http_tool("charge", &sink.url("charge"), "side_effect");
    if approval {
        charge.push_str("requires_approval = true\n");
    }
    std::fs::create_dir(world.dir.path().join("agents")).unwrap();
    let child = agent_toml(&child_model.base_url(), &[charge]).replace("test-agent", "billing");
    world.write("agents/billing.toml", &child);
    let billing = "name = \"billing\"\ndescription = \"The billing agent\"\nkind = \"agent\"\n\
                   agent = \"agents/billing.toml\"\neffect = \"side_effect\"\n";
    let parent = world.write(
        "parent.toml",
        &agent_toml(&parent_model.base_url(), &[billing.to_string()]),
    );
    Tree {
        world,
        parent_model,
        child_model,
        sink,
        parent,
    }
}

impl Tree {
    fn run_args(&self) -> [&str; 4] {
        ["run", "--agent", self.parent.to_str().unwrap(), MESSAGE]
    }

    /// The listing, by session id.
    async fn listing(&self) -> Vec<Value> {
        let out = self.world.run(&["sessions", "--json"]).await;
        assert!(out.status.success(), "{}", stderr(&out));
        (stdout(&out).lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The one child session in the store, after checking it is one.
    async fn only_child(&self, parent: &str) -> String {
        let rows = self.listing().await;
        assert_eq!(rows.len(), 2, "one parent, one child: {rows:?}");
        let child = rows.iter().find(|r| r["session"] != parent).unwrap();
        assert_eq!(child["parent"], parent, "{child}");
        child["session"].as_str().unwrap().to_string()
    }

    /// Checks the finished tree: the parent answered with the child's
    /// answer as its call's result, both linked, the charge applied once,
    /// the child's tokens counted once in the parent's totals, the child's
    /// model asked `child_requests` times in all.
    async fn check_finished(&self, parent: &str, child_requests: usize) -> String {
        let child = self.only_child(parent).await;
        let stats = self.sink.stats();
        assert_eq!(stats.path("charge").effects, 1, "{:?}", stats.paths);
        assert_eq!(
            stats.hits_by_key.len(),
            1,
            "one key: {:?}",
            stats.hits_by_key
        );
        assert_eq!(self.child_model.bodies().len(), child_requests);
        // The child: its start, its parent and its message in one append.
        let child_events = logged_events(&self.world, &child).await;
        let kinds: Vec<&str> = child_events.iter().map(|(_, k, _)| k.as_str()).collect();
        assert_eq!(kinds[..3], ["SessionStarted", "SpawnedBy", "UserMessage"]);
        assert_eq!(kinds.iter().filter(|k| **k == "SessionStarted").count(), 1);
        let spawned = &child_events[1].2;
        assert_eq!(spawned["parent"], parent);
        assert_eq!(spawned["call_id"], "call_0_0");
        assert_eq!(child_events[2].2["text"], TASK);
        // The parent: the call's result is the child's answer, naming it.
        let parent_events = logged_events(&self.world, parent).await;
        let started_seq = spawned["seq"].as_u64().unwrap();
        let (_, kind, started) = &parent_events[started_seq as usize - 1];
        assert_eq!(
            (kind.as_str(), started["tool"].as_str()),
            ("ToolStarted", Some("billing"))
        );
        let finished: Vec<&Value> = (parent_events.iter())
            .filter(|(_, k, _)| k == "ToolFinished")
            .map(|(_, _, e)| e)
            .collect();
        assert_eq!(finished.len(), 1, "{finished:?}");
        assert_eq!(finished[0]["outcome"]["Ok"], "Charged customer 1.");
        assert_eq!(finished[0]["child"]["session"], child.as_str());
        // Tokens: the parent's listing counts its own and the child's, once.
        let own = |events: &[(u64, String, Value)]| -> u64 {
            (events.iter())
                .filter(|(_, k, _)| k == "ModelReplied")
                .map(|(_, _, e)| e["usage"]["prompt_tokens"].as_u64().unwrap())
                .sum()
        };
        let rows = self.listing().await;
        let row = |id: &str| rows.iter().find(|r| r["session"] == id).unwrap().clone();
        assert_eq!(
            row(parent)["prompt_tokens"].as_u64().unwrap(),
            own(&parent_events) + own(&child_events)
        );
        assert_eq!(
            row(&child)["prompt_tokens"].as_u64().unwrap(),
            own(&child_events)
        );
        assert_eq!(
            finished[0]["child"]["totals"]["prompt_tokens"]
                .as_u64()
                .unwrap(),
            own(&child_events)
        );
        assert_eq!(
            row(parent)["model_calls"].as_u64().unwrap(),
            2 + row(&child)["model_calls"].as_u64().unwrap()
        );
        assert_eq!(row(parent)["status"], "idle");
        assert_eq!(row(&child)["status"], "idle");
        child
    }
}

#[tokio::test]
async fn a_parent_runs_a_child_linked_both_ways_and_counts_its_tokens_once() {
    let tree = tree(false).await;
    let out = tree.world.run(&tree.run_args()).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("The billing agent charged customer 1."));
    let parent = session_id(&out);
    let child = tree.check_finished(&parent, 2).await;
    // The child's request holds its task as the user message.
    let request: Value = serde_json::from_slice(&tree.child_model.bodies()[0]).unwrap();
    assert_eq!(request["messages"][1]["content"], TASK);
    // The parent's model saw the child's answer as the call's result.
    let request: Value = serde_json::from_slice(&tree.parent_model.bodies()[1]).unwrap();
    let results: Vec<&Value> = (request["messages"].as_array().unwrap().iter())
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results[0]["content"], "Charged customer 1.");
    // `mneme log` names the child on the call, and the parent in the child.
    let log = stdout(&tree.world.run(&["log", &parent]).await);
    assert!(
        log.contains(&format!("-> sub-agent session {child}")),
        "{log}"
    );
    assert!(
        log.contains(&format!("sub-agent session {child}:")),
        "{log}"
    );
    let log = stdout(&tree.world.run(&["log", &child]).await);
    assert!(
        log.contains(&format!("sub-agent of session {parent}")),
        "{log}"
    );
    // `mneme sessions` shows the child under its parent.
    let listing = stdout(&tree.world.run(&["sessions"]).await);
    let lines: Vec<&str> = listing.lines().collect();
    // Each row starts with the shortest prefix of its id no other shares.
    let short = |l: &str| l.split_whitespace().next().unwrap_or_default().to_string();
    let at = |id: &str| {
        (lines
            .iter()
            .position(|l| l.len() > 8 && id.starts_with(&short(l))))
        .unwrap_or_else(|| panic!("no row for {id}: {listing}"))
    };
    assert_eq!(at(&child), at(&parent) + 1, "{listing}");
    assert!(lines[at(&child)].contains("└ billing"), "{listing}");
    let parent_short = short(lines[at(&parent)]);
    assert!(
        lines[at(&child)].contains(&format!("sub-agent of {parent_short}")),
        "{listing}"
    );
    // Both verify.
    for id in [&parent, &child] {
        let out = tree.world.run(&["verify", id]).await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

#[tokio::test]
async fn sigkill_inside_the_childs_turn_resumes_the_same_child_and_charges_once() {
    let tree = tree(false).await;
    // Killed while the child's charge is applied and not yet answered.
    let hold = tree.sink.hold("charge");
    let mut process = tree
        .world
        .spawn_until_applied(&tree.run_args(), hold.applied)
        .await;
    process.start_kill().unwrap(); // SIGKILL
    let killed = process.wait_with_output().await.unwrap();
    assert!(!killed.status.success());
    drop(hold.release);
    let parent = session_id(&killed);
    let child = tree.only_child(&parent).await;
    let rows = tree.listing().await;
    let row = |id: &str| rows.iter().find(|r| r["session"] == id).unwrap().clone();
    assert_eq!(row(&parent)["status"], "running");
    assert_eq!(row(&child)["status"], "running");
    // Only the parent is resumable: its turn resumes the child.
    assert_eq!(row(&parent)["resumable"], true);
    assert_eq!(row(&child)["resumable"], false);
    // The parent's resume continues the child: its charge runs again with
    // its key (applied once), its model asked only for what was left.
    let out = tree.world.run(&["resume", &parent]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("The billing agent charged customer 1."));
    assert_eq!(tree.check_finished(&parent, 2).await, child);
    assert_eq!(
        tree.sink.stats().path("charge").hits,
        2,
        "re-run with its key"
    );
}

#[tokio::test]
async fn a_crash_after_the_child_answered_reuses_its_answer() {
    let tree = tree(false).await;
    let out = tree
        .world
        .run_crashing(&tree.run_args(), "subagent_answered")
        .await;
    assert!(!out.status.success(), "the crash point must kill the run");
    assert!(
        stderr(&out).contains("subagent_answered"),
        "{}",
        stderr(&out)
    );
    let parent = session_id(&out);
    let child = tree.only_child(&parent).await;
    assert_eq!(tree.child_model.bodies().len(), 2, "the child answered");
    let out = tree.world.run(&["resume", &parent]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    // The child's model was not asked again; its charge ran once.
    assert_eq!(tree.check_finished(&parent, 2).await, child);
    assert_eq!(tree.sink.stats().path("charge").hits, 1);
    let child_events = logged_events(&tree.world, &child).await;
    assert!(
        !child_events.iter().any(|(_, k, _)| k == "SessionResumed"),
        "an answered child is reused as it is: {child_events:?}"
    );
}

#[tokio::test]
async fn a_child_waiting_for_approval_makes_its_parent_wait_until_both_go_on() {
    let tree = tree(true).await;
    let out = tree.world.run(&tree.run_args()).await;
    let parent = session_id(&out);
    let child = tree.only_child(&parent).await;
    let rows = tree.listing().await;
    let row = |id: &str| rows.iter().find(|r| r["session"] == id).unwrap().clone();
    assert_eq!(row(&child)["waits_for_a_person"], true, "{rows:?}");
    assert_eq!(row(&parent)["status"], "paused", "{rows:?}");
    let paused = logged_events(&tree.world, &parent).await;
    let reason = paused.last().unwrap().2["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.contains(&child) && reason.contains("approval"),
        "the parent says it waits on its child: {reason}"
    );
    assert_eq!(tree.sink.stats().path("charge").hits, 0);
    // Approved in the child (which then answers), the parent resumes.
    let out = tree
        .world
        .run(&["approve", &child, "call_0_0", "--no-resume"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = tree.world.run(&["resume", &parent]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("The billing agent charged customer 1."));
    assert_eq!(tree.check_finished(&parent, 2).await, child);
}

/// A parent run to its answer through its child, then a daemon on its
/// data directory.
async fn finished_tree_beside_a_daemon() -> (Tree, String, String, DaemonProcess) {
    let tree = tree(false).await;
    let out = tree.world.run(&tree.run_args()).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let parent = session_id(&out);
    let child = tree.only_child(&parent).await;
    let daemon = DaemonProcess::start(&tree.world.data(), &[]).await;
    (tree, parent, child, daemon)
}

#[tokio::test]
async fn the_api_shows_the_tree() {
    let (_tree, parent, child, daemon) = finished_tree_beside_a_daemon().await;
    let (status, view) = daemon.get(&format!("/sessions/{parent}")).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["children"][0]["session"], child.as_str(), "{view}");
    assert_eq!(view["children"][0]["call_id"], "call_0_0");
    assert!(view.get("spawned_by").is_none(), "{view}");
    let (_, view) = daemon.get(&format!("/sessions/{child}")).await;
    assert_eq!(view["spawned_by"]["session"], parent.as_str(), "{view}");
    assert_eq!(view["parent"], parent.as_str(), "{view}");
    daemon.terminate().await;
}

#[tokio::test]
async fn a_parents_budget_bounds_its_child_and_counts_the_childs_requests() {
    let tree = tree(false).await;
    // Two model requests a turn for the parent: one is spent when it calls
    // the child, so the child starts with one.
    let text = std::fs::read_to_string(&tree.parent).unwrap();
    std::fs::write(
        &tree.parent,
        format!("{text}[limits]\nmax_steps_per_turn = 2\n"),
    )
    .unwrap();
    let out = tree.world.run(&tree.run_args()).await;
    let parent = session_id(&out);
    let child = tree.only_child(&parent).await;
    let started = logged_events(&tree.world, &child).await;
    assert_eq!(started[0].2["spec"]["limits"]["max_steps_per_turn"], 1);
    // The child charged, then spent its budget: the parent waits on it.
    assert_eq!(tree.sink.stats().path("charge").effects, 1);
    let rows = tree.listing().await;
    let row = |id: &str| rows.iter().find(|r| r["session"] == id).unwrap().clone();
    assert_eq!(row(&child)["waits_for_a_person"], true, "{rows:?}");
    assert_eq!(row(&parent)["status"], "paused", "{rows:?}");
    // Extended in the child, it answers; the parent's call then counts the
    // child's two requests in its turn, which is past its own budget.
    let out = tree.world.run(&["resume", &child, "--extend"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = tree.world.run(&["resume", &parent]).await;
    let paused = logged_events(&tree.world, &parent).await;
    let (_, kind, last) = paused.last().unwrap();
    assert_eq!(kind, "SessionPaused", "{}", stderr(&out));
    assert_eq!(last["budget"], true, "{last}");
    assert!(
        last["reason"]
            .as_str()
            .unwrap()
            .contains("3 model requests"),
        "{last}"
    );
    assert_eq!(
        tree.parent_model.bodies().len(),
        1,
        "not asked past its budget"
    );
    let out = tree.world.run(&["resume", &parent, "--extend"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("The billing agent charged customer 1."));
    assert_eq!(tree.check_finished(&parent, 2).await, child);
}

/// Runs a browser step off the async workers.
fn blocking<T>(step: impl FnOnce() -> Result<T, String>) -> T {
    tokio::task::block_in_place(step).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_view_links_a_call_to_its_child_and_the_child_to_its_parent() {
    use mneme_e2e::browser::signed_in_page;
    const WAIT: std::time::Duration = std::time::Duration::from_secs(20);
    let (tree, parent, child, daemon) = finished_tree_beside_a_daemon().await;
    let (browser, page) = signed_in_page(&tree.world, "ada", WAIT).await;
    // The parent's call card links to the child.
    blocking(|| page.eval(&format!("location.hash = '#/s/{parent}'")));
    let href = blocking(|| {
        page.wait_for(
            "(a => a && a.getAttribute('href'))\
             (document.querySelector('.call[data-call=\"call_0_0\"] a.child-link'))",
            WAIT,
        )
    });
    assert_eq!(href, format!("#/s/{child}"));
    // Followed, the child's page links back to its parent's call.
    blocking(|| {
        page.eval("document.querySelector('.call[data-call=\"call_0_0\"] a.child-link').click()")
    });
    let back = blocking(|| {
        page.wait_for(
            "(a => a && [a.textContent, a.getAttribute('href')])(document.getElementById('parent-link'))",
            WAIT,
        )
    });
    assert_eq!(back[0], parent.as_str(), "{back}");
    assert!(
        back[1]
            .as_str()
            .unwrap()
            .starts_with(&format!("#/s/{parent}?seq=")),
        "{back}"
    );
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}
