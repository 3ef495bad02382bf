//! What would fail in a session of an agent, found before one exists
//! (`mneme check --agent FILE`): the model server reached and asked for
//! one tool call (the key with it), each command's program found, each
//! URL's server listening, each MCP server started and listing its tools.
//! Nothing with an effect runs: no tool is called, HTTP tools and checks
//! are only connected to. A model that answers in text is asked nothing
//! more; llama.cpp's server is asked (`GET /props`) whether its chat
//! template has tools at all.

use crate::model::{ModelCall, ModelError};
use replay::{AgentSpec, Event, SessionState, ToolKind};
use std::time::{Duration, Instant};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// It works.
    Ok,
    /// It works, but a session may not go as hoped (the model answered
    /// without calling a tool).
    Warn,
    /// A session would fail here.
    Fail,
}

/// One thing checked.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    /// How it came out.
    pub verdict: Verdict,
    /// What was checked (`model server http://…`, `tool "charge"`).
    pub what: String,
    /// What was found, and for a failure what to do.
    pub detail: String,
}

/// What the model is asked, so that it calls a tool, unless the check is
/// given the message a session would start with.
pub(crate) const ASK: &str =
    "This is a connection check (mneme check). Call one of your tools now, with example arguments.";

/// Bytes of llama.cpp's `/props` read (it holds the chat template whole).
const PROPS_BYTES: usize = 1 << 20;

/// How long a tool's or a check's server has to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Checks everything a session of `spec` reaches, its sub-agents' too;
/// the model is sent [`ASK`].
pub async fn check(spec: &AgentSpec) -> Vec<Finding> {
    check_with(spec, None).await
}

/// Checks everything a session of `spec` reaches, its sub-agents' too; the
/// model is sent `message` (the first request of a session started with
/// it, but for the prefix-cache key, which a session's id gives), else
/// [`ASK`]. Sub-agents are sent [`ASK`].
pub async fn check_with(spec: &AgentSpec, message: Option<&str>) -> Vec<Finding> {
    let mut findings = Vec::new();
    check_agent(spec, "", message, &mut findings).await;
    findings
}

async fn check_agent(
    spec: &AgentSpec,
    prefix: &str,
    message: Option<&str>,
    findings: &mut Vec<Finding>,
) {
    let mut offered = spec.clone();
    for server in &spec.mcp {
        let what = format!("{prefix}MCP server {:?}", server.name);
        match tools::mcp::pin_tools(server).await {
            Ok(tools) => {
                findings.push(ok(what, format!("started; lists {} tools", tools.len())));
                offered.tools.extend(tools);
            }
            Err(e) => findings.push(fail(what, e.to_string())),
        }
    }
    for tool in &spec.tools {
        let what = format!("{prefix}tool {:?}", tool.name);
        if let Some(found) = check_tool(tool).await {
            findings.push(found.named(what));
        }
        if let Some(child) = tool.child_spec() {
            let prefix = format!("{prefix}sub-agent {:?}: ", child.name);
            Box::pin(check_agent(child, &prefix, None, findings)).await;
        }
    }
    findings.push(check_model(&offered, message).await.named(format!(
        "{prefix}model server {} ({})",
        replay::spec::redact_url(offered.model.base_url()),
        offered.model.provider
    )));
}

/// Everything a session of `spec` reaches outside this process, a line
/// each: the model server and the variable its key comes from, each tool's
/// URL or program, each check, each MCP server, each sub-agent's the same
/// way (indented). What a person should read before running a spec that
/// came from elsewhere (an import).
pub fn reach(spec: &AgentSpec) -> Vec<String> {
    let mut lines = Vec::new();
    reach_of(spec, "", &mut lines);
    lines
}

fn reach_of(spec: &AgentSpec, indent: &str, lines: &mut Vec<String>) {
    let model = &spec.model;
    let key = match &model.api_key_env {
        Some(var) => format!("its key from ${var}"),
        None => "no key".to_string(),
    };
    lines.push(format!(
        "{indent}model {} ({}, model {:?}, {key})",
        replay::spec::redact_url(model.base_url()),
        model.provider,
        model.model
    ));
    for server in &spec.mcp {
        let how = match (&server.command, &server.url) {
            (Some(command), _) => format!("runs {command:?}"),
            (_, Some(url)) => replay::spec::redact_url(url),
            _ => String::new(),
        };
        let headers: Vec<&str> = server.headers_env.values().map(String::as_str).collect();
        let headers = match headers.is_empty() {
            true => String::new(),
            false => format!(", headers from ${}", headers.join(", $")),
        };
        lines.push(format!(
            "{indent}MCP server {:?}: {how}{headers}",
            server.name
        ));
    }
    for tool in spec.tools.iter().filter(|t| t.kind != ToolKind::Mcp) {
        let what = match (&tool.command, &tool.url) {
            (Some(command), _) => format!("runs {command:?}"),
            (_, Some(url)) => format!("{} {}", tool.http_method(), replay::spec::redact_url(url)),
            _ => format!("{:?}", tool.kind).to_lowercase(),
        };
        let env = match tool.env.is_empty() {
            true => String::new(),
            false => format!(", given ${}", tool.env.join(", $")),
        };
        lines.push(format!(
            "{indent}tool {:?} ({}): {what}{env}",
            tool.name, tool.effect
        ));
        if let Some(check) = &tool.check {
            lines.push(format!(
                "{indent}  its check: {}",
                replay::spec::redact_url(&check.url)
            ));
        }
        if let Some(check) = &tool.check_command {
            lines.push(format!("{indent}  its check runs {check:?}"));
        }
        if let Some(child) = tool.child_spec() {
            reach_of(child, &format!("{indent}    "), lines);
        }
    }
}

/// A finding whose subject is filled in later.
struct Found(Verdict, String);

impl Found {
    fn named(self, what: String) -> Finding {
        Finding {
            verdict: self.0,
            what,
            detail: self.1,
        }
    }
}

fn ok(what: String, detail: String) -> Finding {
    Found(Verdict::Ok, detail).named(what)
}

fn fail(what: String, detail: String) -> Finding {
    Found(Verdict::Fail, detail).named(what)
}

/// The program of a command tool, the server of an HTTP tool and of a check.
async fn check_tool(tool: &replay::ToolSpec) -> Option<Found> {
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    let programs = [tool.command.as_ref(), tool.check_command.as_ref()];
    for program in programs.into_iter().flatten().filter_map(|c| c.first()) {
        match find_program(program) {
            Ok(path) => seen.push(format!("runs {}", path.display())),
            Err(why) => problems.push(why),
        }
    }
    let check_url = tool.check.as_ref().map(|c| c.url.as_str());
    let urls = [
        tool.url.as_deref().filter(|_| tool.kind == ToolKind::Http),
        check_url,
    ];
    for url in urls.into_iter().flatten() {
        match listens(url).await {
            Ok(()) => seen.push(format!(
                "{} accepts connections",
                replay::spec::redact_url(url)
            )),
            Err(why) => problems.push(why),
        }
    }
    match (problems.is_empty(), seen.is_empty()) {
        (true, true) => None,
        (true, false) => Some(Found(Verdict::Ok, seen.join("; "))),
        (false, _) => Some(Found(Verdict::Fail, problems.join("; "))),
    }
}

/// Where `program` is found as a command tool would run it: a path (the
/// loader made an agent file's absolute), or a name on `PATH`.
fn find_program(program: &str) -> Result<std::path::PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |path: &std::path::Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = std::path::PathBuf::from(program);
        return match (path.exists(), runnable(&path)) {
            (true, true) => Ok(path),
            (true, false) => Err(format!("{program} is not an executable file (chmod +x?)")),
            (false, _) => Err(format!(
                "{program} does not exist (a relative path is taken from the directory mneme runs in)"
            )),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| runnable(candidate))
        .ok_or_else(|| format!("{program:?} is not found on PATH"))
}

/// Whether something accepts connections at `url`'s host and port: nothing
/// is sent, so nothing happens there.
async fn listens(url: &str) -> Result<(), String> {
    let shown = replay::spec::redact_url(url);
    // A check's placeholders are filled in per call; the address holds none.
    let parsed =
        reqwest::Url::parse(&url.replace(['{', '}'], "")).map_err(|e| format!("{shown}: {e}"))?;
    let host = parsed.host_str().unwrap_or_default().to_string();
    let port = parsed.port_or_known_default().unwrap_or(80);
    let connect = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port));
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("{shown}: {e}")),
        Err(_) => Err(format!(
            "{shown}: no connection within {} s",
            CONNECT_TIMEOUT.as_secs()
        )),
    }
}

/// Asks the model server for one tool call, as a session's first request
/// would be made (the same body, the same key, the same timeouts), with
/// `message` as the user's (else [`ASK`]).
async fn check_model(spec: &AgentSpec, message: Option<&str>) -> Found {
    if spec.model.provider == "scripted" {
        let script = spec.model.script.as_deref().unwrap_or_default();
        return match std::path::Path::new(script).is_file() {
            true => Found(Verdict::Ok, format!("scripted replies from {script}")),
            false => Found(Verdict::Fail, format!("the script {script} does not exist")),
        };
    }
    let client = match crate::model::client_for(spec) {
        Ok(client) => client,
        Err(ModelError::Config(reason)) => return Found(Verdict::Fail, reason),
        Err(e) => return Found(Verdict::Fail, e.to_string()),
    };
    let text = message.unwrap_or(ASK);
    let state = SessionState::fold([
        (
            1,
            Event::SessionStarted {
                spec: Box::new(spec.clone()),
                tenant: None,
            },
        ),
        (2, Event::UserMessage { text: text.into() }),
    ]);
    let Some(body) = replay::next_request(&uuid::Uuid::nil().to_string(), &state) else {
        return Found(Verdict::Fail, "no request could be built".into());
    };
    let request = replay::PreparedRequest::whole(body);
    let started = Instant::now();
    match client.complete(ModelCall { index: 0 }, &request, None).await {
        Ok(reply) => {
            let took = started.elapsed().as_millis();
            match reply.tool_calls.first() {
                Some(call) => Found(
                    Verdict::Ok,
                    format!(
                        "answered in {took} ms with a tool call: {}({})",
                        call.name,
                        crate::describe::clip(&call.arguments, 80)
                    ),
                ),
                None => {
                    let said = crate::describe::clip(reply.content.as_deref().unwrap_or_default(), 80);
                    let answered = format!("answered in {took} ms, but with text instead of a tool call ({said:?})");
                    let offered = !spec.tools.is_empty();
                    match template_has_tools(spec).await {
                        Some(false) if offered => Found(Verdict::Fail, format!("{answered}. The server's chat template has no tools (llama.cpp's /props: supports_tools false): it drops them from the prompt, so the model is never shown its tools. Start llama-server with --chat-template-file and a template that has tools (llama.cpp ships some in models/templates/, such as Qwen-Qwen2.5-7B-Instruct.jinja); see docs/guide/local-models.md")),
                        Some(true) => Found(Verdict::Warn, format!("{answered}. The server's chat template has tools (llama.cpp's /props), so the model was shown them and chose text: a small model may need an example of a call in the system prompt, and one check is one try; see docs/guide/local-models.md")),
                        _ => Found(Verdict::Warn, format!("{answered}: a session's model may never call its tools. The server's chat template must have tools (llama.cpp: --jinja, and --chat-template-file with a template that has tools when the model's own has none); a small model may also need an example of a call in the system prompt; see docs/guide/local-models.md")),
                    }
                }
            }
        }
        Err(ModelError::Refused { status, body, .. }) if matches!(status, 401 | 403) => Found(
            Verdict::Fail,
            format!(
                "refused the key (HTTP {status}: {body}): check the variable api_key_env names ({})",
                spec.model.api_key_env.as_deref().unwrap_or("none is named")
            ),
        ),
        Err(e) => Found(Verdict::Fail, e.to_string()),
    }
}

/// Whether the server's chat template has tools, as llama.cpp's server
/// says (`GET /props` beside `/v1`: `chat_template_caps.supports_tools`);
/// `None` from any other server, or when it cannot tell. A read, with the
/// key the model requests carry; at most [`PROPS_BYTES`] are read.
async fn template_has_tools(spec: &AgentSpec) -> Option<bool> {
    if spec.model.provider != "openai" {
        return None;
    }
    let base = spec.model.base_url().trim_end_matches('/');
    let root = base.strip_suffix("/v1").unwrap_or(base);
    let http = crate::outbound::client(CONNECT_TIMEOUT).ok()?;
    let mut request = http.get(format!("{root}/props")).timeout(CONNECT_TIMEOUT);
    let key = (spec.model.api_key_env.as_deref()).and_then(|var| std::env::var(var).ok());
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let mut response = request.send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if body.len() + chunk.len() > PROPS_BYTES {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    let props: serde_json::Value = serde_json::from_slice(&body).ok()?;
    props["chat_template_caps"]["supports_tools"].as_bool()
}
