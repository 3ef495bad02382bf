//! `verify --key` vouches for a whole history or names what it does not:
//! records after the last signed head fail it (a turn run without the key,
//! a tail rewritten and moved in place), a witness of the signed heads
//! tells a session deleted or cut, and neither a fork nor a failed turn
//! raises a false alarm.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use serde_json::Value;

struct Signed {
    world: World,
    _model: MockModel,
    agent: String,
    key: String,
    public: String,
}

async fn signed(replies: Vec<MockReply>, fault: Fault) -> Signed {
    let world = World::new();
    let model = MockModel::start(replies, fault).await;
    let agent = world.write("agent.toml", &agent_toml(&model.base_url(), &[]));
    let key = world.dir.path().join("signing.key");
    let out = world.run(&["keygen", "--out", key.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    Signed {
        public: stdout(&out).trim().to_string(),
        world,
        _model: model,
        agent: agent.to_str().unwrap().to_string(),
        key: key.to_str().unwrap().to_string(),
    }
}

impl Signed {
    async fn verify(&self, extra: &[&str]) -> (bool, Vec<Value>) {
        let mut args = vec!["verify", "--json", "--key", &self.public];
        args.extend(extra);
        let out = self.world.run(&args).await;
        let rows = (stdout(&out).lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (out.status.success(), rows)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_run_without_the_key_is_not_vouched_for() {
    let s = signed(
        vec![MockReply::answer("one"), MockReply::answer("two")],
        Fault::None,
    )
    .await;
    let out = s
        .world
        .run(&[
            "run",
            "--signing-key",
            &s.key,
            "--agent",
            &s.agent,
            "pay alice 7",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let id = session_id(&out);
    let (ok, rows) = s.verify(&[]).await;
    assert!(ok, "{rows:?}");
    let said = rows[0]["signed"].as_str().unwrap();
    assert!(
        said.contains("the last signed 20") && said.contains("vouching for seq 1–3"),
        "{said}"
    );
    // A second turn without the key: its records are nobody's word.
    let out = s
        .world
        .run(&["run", "--session", &id, "pay mallory 7000"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let (ok, rows) = s.verify(&[]).await;
    assert!(!ok, "{rows:?}");
    let error = rows[0]["error"].as_str().unwrap();
    assert!(error.contains("seq 5–6 are not vouched for"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turn_and_a_fork_of_a_signed_session_verify() {
    let s = signed(vec![MockReply::answer("one")], Fault::Fail500(100)).await;
    let out = s
        .world
        .run(&["run", "--signing-key", &s.key, "--agent", &s.agent, "hello"])
        .await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "the model fails: {}",
        stderr(&out)
    );
    let failed = session_id(&out);
    let (ok, rows) = s.verify(&[]).await;
    assert!(ok, "a failed turn is signed too: {rows:?}");

    let s = signed(vec![MockReply::answer("one")], Fault::None).await;
    let out = s
        .world
        .run(&["run", "--signing-key", &s.key, "--agent", &s.agent, "hello"])
        .await;
    let parent = session_id(&out);
    let fork = stdout(&s.world.run(&["fork", &parent, "--at", "4"]).await);
    let (ok, rows) = s.verify(&[fork.trim()]).await;
    assert!(ok, "a fork's shared heads name its parent: {rows:?}");
    assert!(
        rows[0]["signed"]
            .as_str()
            .unwrap()
            .contains("of the history it shares with the session it was forked from"),
        "{rows:?}"
    );
    let _ = failed;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_witness_tells_a_session_deleted_or_cut() {
    let s = signed(
        vec![MockReply::answer("one"), MockReply::answer("two")],
        Fault::None,
    )
    .await;
    let out = s
        .world
        .run(&["run", "--signing-key", &s.key, "--agent", &s.agent, "one"])
        .await;
    let id = session_id(&out);
    s.world
        .run(&["run", "--signing-key", &s.key, "--session", &id, "two"])
        .await;
    let witness = s.world.dir.path().join("heads.jsonl");
    let out = s
        .world
        .run(&["heads", "--output", witness.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&witness).unwrap().lines().count(),
        2
    );
    let w = witness.to_str().unwrap();
    let (ok, rows) = s.verify(&["--witness", w]).await;
    assert!(ok, "{rows:?}");

    // The store cut before its last signed head, as a rewriter would move
    // a shorter history in place.
    let export = s.world.dir.path().join("all.jsonl");
    s.world
        .run(&["export", "--output", export.to_str().unwrap()])
        .await;
    let lines: Vec<String> = (std::fs::read_to_string(&export).unwrap().lines())
        .map(String::from)
        .collect();
    let cut = World::new();
    let kept: String = lines[..4].iter().map(|l| format!("{l}\n")).collect();
    let cut_file = cut.write("cut.jsonl", &kept);
    assert!(cut
        .run(&["import", cut_file.to_str().unwrap()])
        .await
        .status
        .success());
    let cut = Signed {
        world: cut,
        _model: MockModel::start(vec![], Fault::None).await,
        agent: String::new(),
        key: String::new(),
        public: s.public.clone(),
    };
    let (ok, rows) = cut.verify(&["--witness", w]).await;
    assert!(!ok, "{rows:?}");
    let witness_says = |rows: &[Value]| {
        (rows.iter())
            .filter_map(|r| r["error"].as_str())
            .find(|e| e.starts_with("witness"))
            .unwrap_or_else(|| panic!("{rows:?}"))
            .to_string()
    };
    let fault = witness_says(&rows);
    assert!(fault.contains(": cut"), "{fault}");

    // And one that no longer holds the session at all.
    let empty = Signed {
        world: World::new(),
        ..cut
    };
    std::fs::create_dir_all(empty.world.data()).unwrap();
    let (ok, rows) = empty.verify(&["--witness", w]).await;
    assert!(!ok, "{rows:?}");
    assert!(
        witness_says(&rows).contains("no longer holds it"),
        "{rows:?}"
    );
}

/// A signing key kept in the data directory would travel with every copy
/// of the store, to whoever can rewrite it: refused, as the master key is,
/// before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signing_key_inside_the_data_directory_is_refused() {
    let s = signed(vec![MockReply::answer("one")], Fault::None).await;
    let out = s.world.run(&["run", "--agent", &s.agent, "hello"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let inside = s.world.data().join("signing.key");
    std::fs::rename(&s.key, &inside).unwrap();
    let inside = inside.to_str().unwrap();
    let out = s
        .world
        .run(&["run", "--signing-key", inside, "--agent", &s.agent, "again"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let error = stderr(&out);
    assert!(
        error.contains(inside) && error.contains("inside the data directory"),
        "{error}"
    );
    let sessions = stdout(&s.world.run(&["sessions", "--json"]).await);
    assert_eq!(sessions.lines().count(), 1, "no second session: {sessions}");
}
