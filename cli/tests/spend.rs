//! A daily cap shared by a fleet: two daemons on one PostgreSQL store,
//! each running sessions of one tenant at once, never spend past the cap
//! together. Each reservation is appended to the cap's ledger at the seq
//! after the ledger it was checked against (the store's expected-seq
//! check), so the two cannot both take the last of it.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::daemon::DaemonProcess;
use mneme_e2e::*;
use serde_json::{json, Value};

/// An agent whose requests cost about 0.006 each and at most about 0.009
/// (as `tenants.rs` has it).
fn priced_agent(model: &str) -> String {
    let system = "You answer briefly. ".repeat(100);
    format!(
        "name = \"helper\"\nsystem = \"{system}\"\n[model]\nprovider = \"openai\"\nbase_url = \"{model}\"\nmodel = \"m\"\ntimeout_secs = 10\nmax_tokens = 10\ninput_cost_per_mtok = 10.0\noutput_cost_per_mtok = 100.0\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_on_one_store_never_spend_past_a_tenants_cap_together() {
    const SESSIONS: usize = 16;
    const CAP: f64 = 0.05;
    let world = World::on_postgres();
    let store = world.store.clone().unwrap();
    let model = MockModel::start(vec![MockReply::answer("Done.")], Fault::None).await;
    let agents = world.dir.path().join("agents");
    std::fs::create_dir_all(agents.join("acme")).unwrap();
    std::fs::write(
        agents.join("acme/helper.toml"),
        priced_agent(&model.base_url()),
    )
    .unwrap();
    let mut daemons = Vec::new();
    for name in ["a", "b"] {
        let data = world.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        let args = ["--store", &store, "--agents", agents.to_str().unwrap()];
        daemons.push(DaemonProcess::start(&data, &args).await);
    }
    let (status, added) = daemons[0]
        .post(
            "/tenants",
            &json!({"name": "acme", "max_cost_per_day": CAP}),
        )
        .await;
    assert_eq!(status, 201, "{added}");
    let token = added["token"].as_str().unwrap();
    let clients: Vec<reqwest::Client> = daemons.iter().map(|d| d.client_with(token)).collect();
    // Half the sessions on each daemon, every first turn asked for at once.
    let mut ids = Vec::new();
    for i in 0..SESSIONS {
        let (daemon, client) = (&daemons[i % 2], &clients[i % 2]);
        let body = json!({"agent": "helper", "first_message": format!("job {i}")});
        let created = client
            .post(daemon.url("/sessions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(created.status().as_u16(), 201);
        let created: Value = created.json().await.unwrap();
        ids.push(created["session"].as_str().unwrap().to_string());
    }
    let resumes = ids.iter().enumerate().map(|(i, id)| {
        let url = daemons[i % 2].url(&format!("/sessions/{id}/resume"));
        let request = clients[i % 2].post(url).json(&json!({"wait": true}));
        async move {
            let response = request.send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    });
    let ends = futures_util::future::join_all(resumes).await;
    let (mut answered, mut capped) = (0, 0);
    for (status, end) in &ends {
        assert_eq!(*status, 200, "{end}");
        match (end["status"].as_str(), end["budget"].as_bool()) {
            (Some("idle"), _) => answered += 1,
            (Some("paused"), Some(true)) => {
                assert!(
                    end["reason"]
                        .as_str()
                        .unwrap()
                        .contains("daily cap of tenant acme"),
                    "{end}"
                );
                capped += 1;
            }
            _ => panic!("neither answered nor paused on the cap: {end}"),
        }
    }
    assert_eq!(answered + capped, SESSIONS);
    let sent = model.raw_bodies().len();
    assert_eq!(sent, answered, "a capped session's request is never sent");
    let (_, spend) = {
        let response = clients[1]
            .get(daemons[1].url("/spend"))
            .send()
            .await
            .unwrap();
        (response.status(), response.json::<Value>().await.unwrap())
    };
    let spent = spend["total"]["cost"].as_f64().unwrap();
    let per_request = spent / answered as f64;
    assert_eq!(spend["total"]["model_calls"], answered as u64, "{spend}");
    // The bound: past the cap by at most one request of each
    // daemon; with the replies within their reservations, not past it.
    assert!(
        spent <= CAP + 2.0 * per_request,
        "{spent} spent under a cap of {CAP}: past it by more than a request of each daemon"
    );
    assert!(spent <= CAP + 1e-9, "{spent} spent under a cap of {CAP}");
    // The cap is not refused early either: every request reserved at most
    // its worst case (under 0.01), so at least 4 fit whatever the order.
    assert!(
        answered >= 4 && capped > 0,
        "{answered} answered, {capped} capped"
    );
    eprintln!(
        "fleet cap: {answered} of {SESSIONS} requests sent on two daemons, {spent:.6} spent of a cap of {CAP} ({per_request:.6} a request)"
    );
    for daemon in daemons {
        assert!(daemon.terminate().await.success());
    }
}
