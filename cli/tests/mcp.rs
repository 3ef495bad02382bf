//! MCP tools against real MCP servers nobody here wrote (npm's
//! `@modelcontextprotocol/server-filesystem`, `-memory` over stdio and
//! `-everything` over Streamable HTTP), through the real binary: effects
//! from local policy, keys on the wire, pinned tool lists, crashes, bad
//! agent files, and no server left behind.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::mcp::{memory_server, servers, stdio_server};
use mneme_e2e::scenario::{self, Faults};
use mneme_e2e::*;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};

fn agent(model: &MockModel, servers: &[String]) -> String {
    agent_toml(&model.base_url(), &[]) + &servers.concat()
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

/// The events of `kind` in a session's log, as `log --json` shows them.
async fn events_of(world: &World, session: &str, kind: &str) -> Vec<Value> {
    scenario::log_events(world, session)
        .await
        .into_iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| e["event"][kind].clone())
        .collect()
}

/// A world with a `notes/` directory for server-filesystem to serve.
fn world_with_notes() -> (World, std::path::PathBuf) {
    let world = World::new();
    let notes = world.dir.path().join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    (world, notes)
}

#[tokio::test]
async fn the_filesystem_server_writes_and_reads_with_the_effects_the_agent_file_gives() {
    let (world, notes) = world_with_notes();
    let fs = stdio_server(
        "fs",
        &servers().filesystem,
        &[notes.to_str().unwrap()],
        "[mcp.tools]\nread_text_file = \"read_only\"\nwrite_file = { effect = \"idempotent\" }\n",
    );
    let bed = Testbed::new()
        .in_world(world)
        .replies(vec![
            MockReply::calls(&[(
                "fs__write_file",
                json!({"path": "a.txt", "content": "hello"}),
            )]),
            MockReply::calls(&[("fs__read_text_file", json!({"path": "a.txt"}))]),
            MockReply::calls(&[("fs__read_text_file", json!({"path": "missing.txt"}))]),
            MockReply::answer("It says hello."),
        ])
        .agent_extra(&fs)
        .await;
    let (world, model) = (&bed.world, &bed.model);
    let out = bed.run_agent("note it").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "It says hello.");
    assert_eq!(
        std::fs::read_to_string(notes.join("a.txt")).unwrap(),
        "hello"
    );
    let session = named_session(&out).unwrap();

    // The model was offered the server's tools under the server's name,
    // with the server's own descriptions and schemas.
    let first: Value = serde_json::from_slice(&model.bodies()[0]).unwrap();
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        offered.contains(&"fs__write_file") && offered.contains(&"fs__list_directory"),
        "{offered:?}"
    );
    // The result read back is the server's structured content, and a
    // server's isError is a tool error for the model.
    let finished = events_of(world, &session, "ToolFinished").await;
    assert_eq!(finished[1]["outcome"]["Ok"], "{\"content\":\"hello\"}");
    let error = finished[2]["outcome"]["Err"].as_str().unwrap();
    assert!(error.contains("ENOENT"), "{error}");
    // Effects: the file's policy; tools it does not name, the server's
    // default (side_effect), whatever the server's annotations claim.
    let started = events_of(world, &session, "ToolStarted").await;
    assert_eq!(started[0]["effect"], "idempotent");
    assert_eq!(started[1]["effect"], "read_only");
    let view = json_of(&world.run(&["replay", "--json", &session]).await);
    let tool = |name: &str| {
        view["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(tool("fs__write_file")["effect_from"], "policy");
    let listed = tool("fs__list_directory");
    assert_eq!(
        (listed["effect"].as_str(), listed["effect_from"].as_str()),
        (Some("side_effect"), Some("server default"))
    );
    assert_eq!(
        listed["annotations"]["readOnlyHint"], true,
        "shown, not obeyed"
    );
    let text = stdout(&world.run(&["replay", &session]).await);
    assert!(
        text.contains("fs__write_file (mcp): idempotent (from policy)"),
        "{text}"
    );
}

#[tokio::test]
async fn trusted_annotations_set_the_effects_no_policy_names() {
    let world = World::new();
    let memory = memory_server(
        "mem",
        &world.dir.path().join("memory.jsonl"),
        "trust_annotations = true\n[mcp.tools]\nread_graph = \"side_effect\"\ndelete_relations = \"idempotent\"\n",
    );
    let bed = Testbed::new()
        .in_world(world)
        .replies(vec![MockReply::answer("ok")])
        .agent_extra(&memory)
        .await;
    let world = &bed.world;
    let out = bed.run_agent("hi").await;
    assert!(out.status.success(), "{}", stderr(&out));
    let view = json_of(
        &world
            .run(&["replay", "--json", &named_session(&out).unwrap()])
            .await,
    );
    let effect = |name: &str| {
        let t = view["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap();
        format!("{} {}", t["effect"], t["effect_from"])
    };
    // readOnlyHint, idempotentHint, neither; and the policy over the hint.
    assert_eq!(effect("mem__search_nodes"), "\"read_only\" \"annotation\"");
    assert_eq!(
        effect("mem__delete_entities"),
        "\"idempotent\" \"annotation\""
    );
    assert_eq!(
        effect("mem__create_entities"),
        "\"side_effect\" \"server default\""
    );
    assert_eq!(effect("mem__read_graph"), "\"side_effect\" \"policy\"");
    // destructiveHint: each call waits for approval, unless a policy names
    // the tool (then the policy decides).
    let approval = |name: &str| {
        let tools = view["tools"].as_array().unwrap();
        tools.iter().find(|t| t["name"] == name).unwrap()["requires_approval"].clone()
    };
    assert_eq!(approval("mem__delete_entities"), true);
    assert_eq!(approval("mem__create_entities"), false);
    assert_eq!(
        approval("mem__delete_relations"),
        false,
        "a policy names it"
    );
    let text = stdout(&world.run(&["replay", &named_session(&out).unwrap()]).await);
    assert!(
        text.contains(
            "mem__delete_entities (mcp): idempotent (from annotation), requires approval,"
        ),
        "{text}"
    );
}

/// A recording proxy in front of a real Streamable HTTP server: every
/// request's headers, and the bodies it sent.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<(axum::http::HeaderMap, Value)>>>);

async fn proxy(
    axum::extract::State((target, seen)): axum::extract::State<(String, Recorded)>,
    method: axum::http::Method,
    headers: axum::http::HeaderMap,
    body: bytes::Bytes,
) -> axum::response::Response {
    let message = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.0.lock().unwrap().push((headers.clone(), message));
    let mut request = reqwest::Client::new()
        .request(method, &target)
        .body(body.to_vec());
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    let answer = request.send().await.unwrap();
    let mut response = axum::response::Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if name != "content-length" && name != "transfer-encoding" {
            response = response.header(name, value);
        }
    }
    let stream = futures_util::StreamExt::map(answer.bytes_stream(), |chunk| {
        chunk.map_err(std::io::Error::other)
    });
    response
        .body(axum::body::Body::from_stream(stream))
        .unwrap()
}

/// server-everything over Streamable HTTP on a free loopback port; killed
/// when dropped.
struct Everything {
    child: std::process::Child,
    url: String,
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn everything() -> Everything {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Everything {
        child: std::process::Command::new("node")
            .arg(&servers().everything)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("node runs"),
        url: format!("http://127.0.0.1:{port}/mcp"),
    };
    let what = format!("server-everything to listen on {port}");
    eventually(what, std::time::Duration::from_secs(10), || async {
        let connected = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
        connected.map(drop)
    })
    .await;
    server
}

#[tokio::test]
async fn everything_over_streamable_http_gets_keys_in_meta_and_header_and_images_by_reference() {
    let server = everything().await;
    let recorded = Recorded::default();
    let app = axum::Router::new()
        .route("/mcp", axum::routing::any(proxy))
        .with_state((server.url.clone(), recorded.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let _proxy = serve_until_dropped(listener, app);

    let world = World::new();
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("ev__echo", json!({"message": "hi mneme"}))]),
            MockReply::calls(&[("ev__get-tiny-image", json!({}))]),
            MockReply::answer("Echoed and looked."),
        ],
        Fault::None,
    )
    .await;
    let everything = format!(
        "[[mcp]]\nname = \"ev\"\nurl = \"{proxy_url}\"\nexpose = [\"echo\", \"get-tiny-image\"]\nheaders_env = {{ X-Notes-Auth = \"MCP_TEST_AUTH\" }}\n[mcp.tools]\necho = \"read_only\"\n"
    );
    let path = world.write("agent.toml", &agent(&model, &[everything]));
    let out = world
        .mneme()
        .args(["run", "--agent", path.to_str().unwrap(), "echo"])
        .env("MCP_TEST_AUTH", "secret-from-env")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let session = named_session(&out).unwrap();

    // Only the two exposed tools were offered.
    let first: Value = serde_json::from_slice(&model.bodies()[0]).unwrap();
    assert_eq!(first["tools"].as_array().unwrap().len(), 2, "{first}");
    let finished = events_of(&world, &session, "ToolFinished").await;
    assert_eq!(finished[0]["outcome"]["Ok"], "Echo: hi mneme");
    // The image: its size and digest, never its bytes.
    let image = finished[1]["outcome"]["Ok"].as_str().unwrap();
    let image: Value = serde_json::from_str(image).unwrap();
    let block = image["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "image")
        .unwrap();
    assert!(block["bytes"].as_u64().unwrap() > 50, "{block}");
    assert!(block.get("data").is_none(), "{block}");
    assert_eq!(block["blob"], "kept", "{block}");
    // Kept beside the log, by its digest: `mneme blob` gives the bytes.
    let digest = block["sha256"].as_str().unwrap();
    let png = world.run(&["blob", &session, digest]).await;
    assert!(png.status.success(), "{}", stderr(&png));
    assert_eq!(png.stdout.len() as u64, block["bytes"].as_u64().unwrap());
    assert!(png.stdout.starts_with(b"\x89PNG"), "an image");
    assert_eq!(replay::digest_hex(&png.stdout), digest);
    let unknown = world.run(&["blob", &session, &"0".repeat(64)]).await;
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("keeps no blob"),
        "{}",
        stderr(&unknown)
    );

    // On the wire: the key in _meta and as a header, the session and the
    // protocol version the server gave, the header from the environment.
    let started = events_of(&world, &session, "ToolStarted").await;
    let calls: Vec<(axum::http::HeaderMap, Value)> = recorded
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, m)| m["method"] == "tools/call")
        .cloned()
        .collect();
    assert_eq!(calls.len(), 2);
    for ((headers, message), started) in calls.iter().zip(&started) {
        let key = started["idempotency_key"].as_str().unwrap();
        assert_eq!(message["params"]["_meta"]["mneme/idempotency_key"], key);
        assert_eq!(headers["idempotency-key"], key);
        assert!(headers.contains_key("mcp-session-id"));
        assert_eq!(headers["mcp-protocol-version"], "2025-06-18");
        assert_eq!(headers["x-notes-auth"], "secret-from-env");
    }
    // The header's value is never recorded: only the variable's name.
    let log = stdout(&world.run(&["log", "--json", &session]).await);
    assert!(!log.contains("secret-from-env") && log.contains("MCP_TEST_AUTH"));
}

/// Each bad `[[mcp]]` entry is refused at `run`, naming the file, the line
/// and the reason, before any session exists.
#[tokio::test]
async fn a_bad_mcp_entry_is_refused_at_run_with_its_file_line_and_reason() {
    let world = World::new();
    let model = MockModel::start(vec![MockReply::answer("never")], Fault::None).await;
    let fs = |extra: &str| {
        stdio_server(
            "fs",
            &servers().filesystem,
            &[world.dir.path().to_str().unwrap()],
            extra,
        )
    };
    let cases = [
        (fs("bogus = 1\n"), "bogus", None),
        (
            fs("[mcp.tools]\nno_such_tool = \"read_only\"\n"),
            "names tool \"no_such_tool\", which the server does not list",
            Some(":8"),
        ),
        (
            "[[mcp]]\nname = \"gone\"\ncommand = [\"/nonexistent/mcp-server\"]\n".to_string(),
            "cannot start \"/nonexistent/mcp-server\"",
            Some(":8"),
        ),
        (
            "[[mcp]]\nname = \"mute\"\ncommand = [\"sh\", \"-c\", \"echo not json; exit 3\"]\n"
                .to_string(),
            "initialize",
            Some(":8"),
        ),
    ];
    for (entry, reason, line) in cases {
        let path = world.write("agent.toml", &agent(&model, std::slice::from_ref(&entry)));
        let out = world
            .run(&["run", "--agent", path.to_str().unwrap(), "hi"])
            .await;
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{entry}: {said}");
        assert!(
            said.contains("agent.toml") && said.contains(reason),
            "{entry}: {said}"
        );
        if let Some(line) = line {
            assert!(said.contains(&format!("agent.toml{line}")), "{said}");
        }
        assert!(
            named_session(&out).is_none(),
            "no session is started: {said}"
        );
    }
    assert!(model.bodies().is_empty());
}

/// A crash in flight, then a server whose tool list changed: the resumed
/// request is byte-identical to what the log rebuilt before the change,
/// `replay` names the change, and only `--refresh-tools` adopts it.
#[tokio::test]
async fn a_changed_tool_list_leaves_a_resumed_prompt_byte_identical_until_refreshed() {
    let world = World::new();
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("srv__read_graph", json!({}))]),
            MockReply::answer("The graph is empty."),
            MockReply::answer("Now with other tools."),
        ],
        Fault::None,
    )
    .await;
    // The server's command is a script the test rewrites between runs.
    let script = world.dir.path().join("server.sh");
    let memory = format!(
        "MEMORY_FILE_PATH={:?} exec node {:?}\n",
        world.dir.path().join("memory.jsonl").display().to_string(),
        servers().memory.display().to_string()
    );
    std::fs::write(&script, &memory).unwrap();
    let entry = format!(
        "[[mcp]]\nname = \"srv\"\ncommand = [\"sh\", {:?}]\n[mcp.tools]\nread_graph = \"read_only\"\n",
        script.display().to_string()
    );
    let path = world.write("agent.toml", &agent(&model, &[entry]));
    let out = world
        .run_crashing(
            &["run", "--agent", path.to_str().unwrap(), "look"],
            "before_model_call:2",
        )
        .await;
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    let session = named_session(&out).unwrap();
    let rebuilt = world.run(&["replay", "--raw", &session]).await.stdout;

    let notes = world.dir.path().join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    let filesystem = format!(
        "exec node {:?} {:?}\n",
        servers().filesystem.display().to_string(),
        notes.display().to_string()
    );
    std::fs::write(&script, filesystem).unwrap();
    let out = world.run(&["resume", &session]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let bodies = model.bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        without_cache_key(&bodies[1]),
        without_cache_key(&rebuilt),
        "the resumed request is the one the log rebuilt before the change"
    );
    let changed = events_of(&world, &session, "McpToolsChanged").await;
    assert_eq!(changed.len(), 1);
    let text = stdout(&world.run(&["replay", &session]).await);
    assert!(
        text.contains("MCP server srv now lists other tools")
            && text.contains("srv__read_graph is no longer listed")
            && text.contains("srv__read_text_file is new"),
        "{text}"
    );
    // Adopted only on request, and recorded with what changed.
    let out = world
        .run(&["run", "--session", &session, "--refresh-tools", "again"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let refreshed = events_of(&world, &session, "McpToolsRefreshed").await;
    assert_eq!(refreshed.len(), 1);
    let last: Value = serde_json::from_slice(&model.bodies()[2]).unwrap();
    let offered: Vec<&str> = last["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        offered.contains(&"srv__read_text_file") && !offered.contains(&"srv__read_graph"),
        "{offered:?}"
    );
    let view = json_of(&world.run(&["replay", "--json", &session]).await);
    assert!(view.get("mcp_changes").is_none(), "{view}");
}

/// The MCP crash scenario at the points that matter most for effects: a
/// key-ignoring side effect interrupted in flight goes in doubt and is
/// settled from what the server shows; the idempotent write and the
/// read-only read run again; answers and re-sent requests equal the
/// uncrashed run's. (The crash matrix runs every point.)
#[tokio::test]
async fn mcp_calls_interrupted_in_flight_follow_their_effects() {
    let sc = scenario::mcp_scenario();
    let reference = scenario::reference(&sc).await;
    for point in [
        "tool_started_durable:1",
        "tool_returned:1",
        "tool_returned:2",
        "tool_started_durable:2",
    ] {
        let env = sc.env().await;
        let faults = Faults {
            crash_at: Some(point.into()),
            nested: None,
            kill_after_ms: None,
        };
        let outcome = scenario::run(&sc, &env, &faults).await.unwrap();
        assert!(outcome.crashes > 0, "{point} was reached");
        let found = scenario::violations(&env, &outcome, &reference).await;
        assert!(found.is_empty(), "{point}: {found:?}");
        let doubts = events_of(&env.world, &outcome.session, "ToolInDoubt").await;
        let started = events_of(&env.world, &outcome.session, "ToolStarted").await;
        let runs = |tool: &str| started.iter().filter(|s| s["tool"] == tool).count();
        if point == "tool_started_durable:1" {
            // Killed with both first calls started: the side effect goes in
            // doubt (settled from what the server shows, above: at most
            // one entity); the idempotent write runs again on its own.
            assert_eq!(doubts.len(), 1, "{point}");
            assert_eq!(doubts[0]["call_id"], started[0]["call_id"], "{point}");
            assert_eq!(runs("fs__write_file"), 2, "{point}");
        }
        if point == "tool_started_durable:2" {
            assert_eq!(runs("fs__read_text_file"), 2, "a read reruns: {point}");
        }
    }
}

/// Processes whose command line mentions `marker`.
fn processes_naming(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = entry.path().join("cmdline");
        if let Ok(bytes) = std::fs::read(&cmdline) {
            let line = String::from_utf8_lossy(&bytes).replace('\0', " ");
            if line.contains(marker) {
                found.push(format!("{}: {line}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// A stdio server started through a shell (as `npx` starts one: the
/// server is a grandchild) dies with a SIGKILLed mneme.
#[tokio::test]
async fn no_server_is_left_behind_when_mneme_is_killed() {
    let world = World::new();
    let notes = world.dir.path().join("left-behind-notes");
    std::fs::create_dir_all(&notes).unwrap();
    let model = MockModel::start(
        vec![
            MockReply::calls(&[("fs__list_directory", json!({"path": "."}))]),
            MockReply::answer("listed"),
        ],
        Fault::None,
    )
    .await;
    let marker = notes.display().to_string();
    let via_shell = format!(
        "[[mcp]]\nname = \"fs\"\ncommand = [\"sh\", \"-c\", {:?}]\n",
        format!(
            "node {:?} {:?}; echo exited",
            servers().filesystem.display().to_string(),
            marker
        )
    );
    let path = world.write("agent.toml", &agent(&model, &[via_shell]));
    let out = world
        .run_crashing(
            &["run", "--agent", path.to_str().unwrap(), "list"],
            "tool_started_durable",
        )
        .await;
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    let what = "no server process left behind";
    eventually(what, std::time::Duration::from_secs(5), || async {
        let left = processes_naming(&marker);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    assert!(Path::new(&marker).exists());
}

/// The daemon pins, runs and refreshes MCP tools the same way; a bad entry
/// is refused when the session is created, naming the server.
#[tokio::test]
async fn the_daemon_runs_mcp_tools_and_refreshes_them_on_request() {
    let (world, notes) = world_with_notes();
    let fs = stdio_server(
        "fs",
        &servers().filesystem,
        &[notes.to_str().unwrap()],
        "[mcp.tools]\nwrite_file = \"idempotent\"\n",
    );
    let mut bed = Testbed::new()
        .in_world(world)
        .replies(vec![
            MockReply::calls(&[(
                "fs__write_file",
                json!({"path": "d.txt", "content": "daemon"}),
            )]),
            MockReply::answer("Written."),
            MockReply::answer("Same tools."),
        ])
        .agent_extra(&fs)
        .daemon()
        .await;
    let id = bed.create().await;
    let (daemon, model) = (bed.take_daemon(), &bed.model);
    let path = format!("/sessions/{id}/messages");
    let (status, end) = daemon.message_and_wait(&id, "write").await;
    assert_eq!(status, 200, "{end}");
    assert_eq!(end["answer"], "Written.", "{end}");
    assert_eq!(
        std::fs::read_to_string(notes.join("d.txt")).unwrap(),
        "daemon"
    );
    // Nothing changed: a refresh records nothing, and the turn goes on.
    let (status, end) = daemon
        .post(
            &path,
            &json!({"text": "again", "wait": true, "refresh_tools": true}),
        )
        .await;
    assert_eq!(status, 200, "{end}");
    let (_, replay) = daemon.get(&format!("/sessions/{id}/replay")).await;
    let tools = replay["tools"].as_array().unwrap();
    assert!(tools
        .iter()
        .any(|t| t["name"] == "fs__write_file" && t["effect"] == "idempotent"));
    let missing = format!("/sessions/{id}/blobs/{}", "0".repeat(64));
    let (status, error) = daemon.get(&missing).await;
    assert_eq!(status, 404, "{error}");
    assert!(
        error["error"].as_str().unwrap().contains("keeps no blob"),
        "{error}"
    );
    let (status, error) = daemon
        .post(
            "/sessions",
            &json!({"spec": {"name": "x", "model": {"provider": "openai", "base_url": model.base_url(), "model": "m"},
                "mcp": [{"name": "gone", "command": ["/nonexistent/server"]}]}}),
        )
        .await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"].as_str().unwrap().contains("\"gone\""),
        "{error}"
    );
    daemon.terminate().await;
}

/// A world, a model that calls the hostile server's `tool` once, and the
/// file the server will write every line it receives to.
async fn hostile_world(tool: &str) -> (World, MockModel, std::path::PathBuf) {
    let world = World::new();
    let received = world.dir.path().join("received.jsonl");
    let model = MockModel::start(
        vec![
            MockReply::calls(&[(&format!("bad__{tool}"), json!({}))]),
            MockReply::answer("answered"),
        ],
        Fault::None,
    )
    .await;
    (world, model, received)
}

/// The `[[mcp]]` entry of the hostile server, named `bad`, logging to
/// `received`, with `extra` settings.
fn hostile_entry(received: &Path, extra: &str) -> String {
    let fixture = fixtures().join("hostile-mcp.py");
    format!(
        "[[mcp]]\nname = \"bad\"\ncommand = [\"python3\", {:?}, {:?}]\n{extra}",
        fixture.display().to_string(),
        received.display().to_string()
    )
}

/// A session of one call of the hostile server's `tool`
/// (`tests/fixtures/hostile-mcp.py`, speaking the protocol); the world, the
/// run's output and the file of every line the server received.
async fn hostile_call(tool: &str) -> (World, std::process::Output, std::path::PathBuf) {
    let (world, model, received) = hostile_world(tool).await;
    let entry = hostile_entry(
        &received,
        "timeout_secs = 2\nmax_message_bytes = 1048576\n[mcp.tools]\nask = \"read_only\"\n",
    );
    let path = world.write("agent.toml", &agent(&model, &[entry]));
    let out = world
        .run(&["run", "--agent", path.to_str().unwrap(), "go"])
        .await;
    (world, out, received)
}

/// `--refresh-tools` adopts a server's new list only as a spec a session
/// could start with: a list naming one tool twice is refused, naming it,
/// and nothing is recorded.
#[tokio::test]
async fn a_refreshed_list_that_names_a_tool_twice_is_refused() {
    let world = World::new();
    let received = world.dir.path().join("received.jsonl");
    let model = MockModel::start(
        vec![MockReply::answer("one"), MockReply::answer("two")],
        Fault::None,
    )
    .await;
    let entry = hostile_entry(&received, "[mcp.tools]\nask = \"read_only\"\n");
    let path = world.write("agent.toml", &agent(&model, &[entry]));
    let out = world
        .run(&["run", "--agent", path.to_str().unwrap(), "go"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let id = session_id(&out);
    let before = event_kinds(&world, &id).await;
    std::fs::write(format!("{}.twice", received.display()), "").unwrap();
    let out = world
        .run(&["run", "--session", &id, "--refresh-tools", "again"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let error = stderr(&out);
    assert!(
        error.contains("tool \"bad__ask\" is defined twice") && error.contains("nothing adopted"),
        "{error}"
    );
    assert_eq!(event_kinds(&world, &id).await, before, "nothing recorded");
}

/// A server that floods, hangs, dies mid-call, or asks the client things:
/// each bounded, each a call whose outcome is unknown (a key-ignoring side
/// effect goes in doubt, naming why), the cancellation sent on a timeout,
/// and the server's own requests answered or refused.
#[tokio::test]
async fn a_hostile_mcp_server_is_bounded_and_its_broken_calls_are_in_doubt() {
    let cases = [
        ("flood", "over 1048576 bytes (max_message_bytes)"),
        ("hang", "timed out after 2 s"),
        ("die", "closed its stdout"),
    ];
    for (tool, reason) in cases {
        let (world, out, received) = hostile_call(tool).await;
        assert_eq!(out.status.code(), Some(3), "{tool}: {}", stderr(&out));
        let session = named_session(&out).unwrap();
        let doubts = events_of(&world, &session, "ToolInDoubt").await;
        let why = doubts[0]["reason"].as_str().unwrap();
        assert!(why.contains(reason), "{tool}: {why}");
        if tool == "hang" {
            let lines = std::fs::read_to_string(&received).unwrap();
            let messages: Vec<Value> = lines
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let call = messages
                .iter()
                .find(|m| m["method"] == "tools/call")
                .unwrap();
            let cancel = messages
                .iter()
                .find(|m| m["method"] == "notifications/cancelled")
                .expect("the timed-out call is cancelled");
            assert_eq!(cancel["params"]["requestId"], call["id"]);
        }
    }
    let (world, out, _) = hostile_call("ask").await;
    assert!(out.status.success(), "{}", stderr(&out));
    let finished = events_of(&world, &named_session(&out).unwrap(), "ToolFinished").await;
    let answer: Value =
        serde_json::from_str(finished[0]["outcome"]["Ok"].as_str().unwrap()).unwrap();
    assert_eq!(
        answer,
        json!({"ping": {}, "roots": -32601}),
        "ping served, roots refused"
    );
}

/// A person's pause while an MCP call runs cancels it: the server is sent
/// `notifications/cancelled`, the turn pauses at once, and the call follows
/// its effect (a key-ignoring side effect is in doubt).
#[tokio::test]
async fn a_pause_cancels_a_running_mcp_call() {
    use mneme_e2e::daemon::DaemonProcess;
    let (world, model, received) = hostile_world("hang").await;
    let entry = hostile_entry(&received, "timeout_secs = 120\n");
    let daemon = DaemonProcess::start(&world.dir.path().join("data"), &[]).await;
    let id = daemon.create(&agent(&model, &[entry])).await;
    let (status, _) = daemon
        .post(&format!("/sessions/{id}/messages"), &json!({"text": "go"}))
        .await;
    assert_eq!(status, 202);
    let called = || {
        std::fs::read_to_string(&received)
            .unwrap_or_default()
            .contains("tools/call")
    };
    let what = "the call to reach the server";
    eventually(what, std::time::Duration::from_secs(5), || async {
        called()
    })
    .await;
    let asked = std::time::Instant::now();
    let (status, body) = daemon
        .post(&format!("/sessions/{id}/pause"), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    eventually(
        "the turn to pause",
        std::time::Duration::from_secs(5),
        || async {
            let (_, session) = daemon.get(&format!("/sessions/{id}")).await;
            if session["status"] == "paused" {
                Ok(())
            } else {
                Err(session)
            }
        },
    )
    .await;
    assert!(
        asked.elapsed().as_secs() < 10,
        "paused without waiting out the call"
    );
    let lines = std::fs::read_to_string(&received).unwrap();
    let cancel: Value = lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|m| m["method"] == "notifications/cancelled")
        .expect("the server is told");
    assert_eq!(cancel["params"]["reason"], "mneme: the turn was paused");
    daemon.terminate().await;
    let doubts = events_of(&world, &id, "ToolInDoubt").await;
    assert!(
        doubts[0]["reason"].as_str().unwrap().contains("cancelled"),
        "{doubts:?}"
    );
}
