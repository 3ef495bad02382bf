//! Agent files (TOML) into agent specs.

use crate::error::RuntimeError;
use replay::AgentSpec;
use std::path::Path;

/// The largest agent file read: an agent file is a few kilobytes.
pub const MAX_AGENT_FILE_BYTES: u64 = 1 << 20;

/// Reads and checks the agent file at `path`. Its relative paths (a
/// scripted provider's script, a program given as `./charge.sh`) are made
/// absolute, relative to the agent file, so a session resumes from any
/// working directory and runs the same files. Each tool of kind `agent` gets its child's
/// spec loaded (from `agent`, relative to this file) and pinned in it, and
/// the `message` parameters if it gives none; a file that names itself,
/// directly or not, is refused.
pub fn load_agent_file(path: &Path) -> Result<AgentSpec, RuntimeError> {
    load_nested(path, &mut Vec::new())
}

/// [`load_agent_file`], with the files of the agents above it (`above`).
fn load_nested(
    path: &Path,
    above: &mut Vec<std::path::PathBuf>,
) -> Result<AgentSpec, RuntimeError> {
    let origin = path.display().to_string();
    let error = |reason: String| RuntimeError::Spec {
        origin: origin.clone(),
        reason,
    };
    let text = crate::model::read_small_file(&origin, MAX_AGENT_FILE_BYTES)
        .map_err(|e| error(format!("cannot read: {e}")))?;
    let mut spec: AgentSpec = toml::from_str(&text).map_err(|e| error(e.to_string()))?;
    for (server, line) in spec.mcp.iter_mut().zip(mcp_header_lines(&text)) {
        server.declared_at = Some(format!("{origin}:{line}"));
    }
    let here = std::path::absolute(path).map_err(|e| error(e.to_string()))?;
    if above.contains(&here) {
        return Err(error("its sub-agents name it again (a cycle)".into()));
    }
    above.push(here);
    fill_sleep_defaults(&mut spec);
    let children = pin_children(&mut spec, path, above);
    above.pop();
    children?;
    anchor_paths(&mut spec, path.parent().unwrap_or(Path::new("."))).map_err(error)?;
    spec.validate().map_err(error)?;
    Ok(spec)
}

/// Makes the file's relative paths absolute, relative to its directory
/// `base`: the scripted provider's script, and each program given as a path
/// (a tool's `command` and `check_command`, an MCP server's `command`; a
/// bare name is left to PATH).
fn anchor_paths(spec: &mut AgentSpec, base: &Path) -> Result<(), String> {
    let absolute = |path: &str| {
        std::path::absolute(base.join(path))
            .map(|p| p.display().to_string())
            .map_err(|e| format!("path {path:?}: {e}"))
    };
    if let Some(script) = &mut spec.model.script {
        *script = absolute(script)?;
    }
    let commands = spec
        .tools
        .iter_mut()
        .flat_map(|tool| [tool.command.as_mut(), tool.check_command.as_mut()]);
    let servers = spec.mcp.iter_mut().map(|server| server.command.as_mut());
    for program in commands
        .chain(servers)
        .flatten()
        .filter_map(|c| c.first_mut())
    {
        if program.contains('/') && !program.starts_with('/') {
            *program = absolute(program)?;
        }
    }
    Ok(())
}

/// Gives each tool of kind `sleep` that says nothing of them the
/// arguments and the description mneme offers the model for it.
fn fill_sleep_defaults(spec: &mut AgentSpec) {
    let empty = serde_json::json!({"type": "object", "properties": {}});
    for tool in (spec.tools.iter_mut()).filter(|t| t.kind == replay::ToolKind::Sleep) {
        if tool.parameters == empty {
            tool.parameters = replay::spec::sleep_parameters();
        }
        if tool.description.is_empty() {
            tool.description = replay::spec::SLEEP_DESCRIPTION.into();
        }
    }
}

/// Loads the child spec of each tool of kind `agent` of `spec` (declared
/// in the file at `path`) into the tool.
fn pin_children(
    spec: &mut AgentSpec,
    path: &Path,
    above: &mut Vec<std::path::PathBuf>,
) -> Result<(), RuntimeError> {
    let base = path.parent().unwrap_or(Path::new("."));
    for tool in spec.tools.iter_mut() {
        if tool.kind != replay::ToolKind::Agent {
            continue;
        }
        if tool.parameters == serde_json::json!({"type": "object", "properties": {}}) {
            tool.parameters = replay::spec::agent_parameters();
        }
        if let Some(file) = &tool.agent {
            tool.agent_spec = Some(Box::new(load_nested(&base.join(file), above)?));
        }
    }
    Ok(())
}

/// The line number of each `[[mcp]]` header of an agent file, in order.
fn mcp_header_lines(text: &str) -> impl Iterator<Item = usize> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, line)| line.trim_start().starts_with("[[mcp]]"))
        .map(|(index, _)| index + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<AgentSpec, RuntimeError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        load_agent_file(&path)
    }

    #[test]
    fn contract_example_loads() {
        let spec = load(
            r#"
name = "billing-agent"
system = "You are a billing assistant."
[model]
provider = "openai"
base_url = "http://127.0.0.1:8000/v1"
model = "gpt-4o-mini"
api_key_env = "OPENAI_API_KEY"
[[tools]]
name = "charge_card"
description = "Charge a customer's card"
kind = "http"
method = "POST"
url = "http://127.0.0.1:9000/charge"
effect = "side_effect"
parameters = { type = "object", properties = { customer = { type = "string" }, cents = { type = "integer" } }, required = ["customer", "cents"] }
"#,
        )
        .unwrap();
        assert_eq!(spec.tools[0].effect, replay::Effect::SideEffect);
        assert!(
            spec.tools[0].honours_key(),
            "HTTP tools honour keys by default"
        );
    }

    #[test]
    fn example_agent_file_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/openai-agent.toml");
        let spec = load_agent_file(&path).unwrap();
        assert_eq!(spec.tools.len(), 3);
        assert!(!spec.tool("send_sms").unwrap().safe_to_rerun());
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mcp-notes.toml");
        let spec = load_agent_file(&path).unwrap();
        assert_eq!(spec.mcp[0].name, "fs");
        assert!(spec.tools.is_empty(), "pinned only when a session starts");
    }

    #[test]
    fn an_mcp_server_is_named_with_its_file_and_line() {
        let spec = load(
            "name = \"x\"\n[model]\nprovider = \"scripted\"\nmodel = \"m\"\nscript = \"s.json\"\n\n[[mcp]]\nname = \"fs\"\ncommand = [\"true\"]\n[mcp.tools]\nread = \"read_only\"\n",
        )
        .unwrap();
        let label = spec.mcp[0].label();
        assert!(label.contains("agent.toml:7"), "{label}");
        let err = load("name = \"x\"\n[model]\nprovider = \"scripted\"\nmodel = \"m\"\nscript = \"s.json\"\n[[mcp]]\nname = \"fs\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("agent.toml:6") && err.contains("exactly one of command"),
            "{err}"
        );
    }

    #[test]
    fn programs_given_as_paths_run_from_beside_the_file_and_other_relative_ones_are_refused() {
        let text = "name = \"x\"\n[model]\nprovider = \"scripted\"\nmodel = \"m\"\nscript = \"s.json\"\n\
             [[tools]]\nname = \"charge\"\nkind = \"command\"\ncommand = [\"./charge.sh\", \"--live\"]\n\
             check_command = [\"bin/charged\"]\neffect = \"side_effect\"\n\
             [[tools]]\nname = \"echo\"\nkind = \"command\"\ncommand = [\"cat\"]\neffect = \"read_only\"\n\
             [[mcp]]\nname = \"fs\"\ncommand = [\"servers/fs\"]\n";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        let spec = load_agent_file(&path).unwrap();
        let beside = |name: &str| dir.path().join(name).display().to_string();
        let charge = spec.tool("charge").unwrap();
        assert_eq!(
            charge.command.as_ref().unwrap(),
            &[beside("charge.sh"), "--live".into()]
        );
        assert_eq!(
            charge.check_command.as_ref().unwrap(),
            &[beside("bin/charged")]
        );
        assert_eq!(
            spec.tool("echo").unwrap().command.as_ref().unwrap(),
            &["cat"],
            "PATH's"
        );
        assert_eq!(
            spec.mcp[0].command.as_ref().unwrap(),
            &[beside("servers/fs")]
        );
        // A spec that arrives whole (the API, an import) has no file to
        // anchor them to: refused, naming the program.
        let unanchored: AgentSpec = toml::from_str(text).unwrap();
        let err = unanchored.validate().unwrap_err();
        assert!(
            err.contains("check_command program \"bin/charged\" is a relative path"),
            "{err}"
        );
    }

    #[test]
    fn a_sub_agent_is_loaded_relative_to_its_parent_and_pinned_in_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("agents")).unwrap();
        let model = "[model]\nprovider = \"scripted\"\nmodel = \"m\"\nscript = \"s.json\"\n";
        let agent_tool = |file: &str| {
            format!("[[tools]]\nname = \"ask\"\nkind = \"agent\"\nagent = \"{file}\"\neffect = \"side_effect\"\n")
        };
        std::fs::write(
            dir.path().join("agents/child.toml"),
            format!("name = \"child\"\n{model}"),
        )
        .unwrap();
        let parent = dir.path().join("parent.toml");
        let text = format!(
            "name = \"parent\"\n{model}{}",
            agent_tool("agents/child.toml")
        );
        std::fs::write(&parent, text).unwrap();
        let spec = load_agent_file(&parent).unwrap();
        let tool = spec.tool("ask").unwrap();
        let child = tool.child_spec().expect("pinned");
        assert_eq!(child.name, "child");
        let script = child.model.script.as_deref().unwrap();
        assert!(
            script.ends_with("agents/s.json"),
            "relative to the child: {script}"
        );
        assert_eq!(tool.parameters, replay::spec::agent_parameters());
        // A file that names itself is refused, naming the cycle.
        let looped = dir.path().join("loop.toml");
        let text = format!("name = \"loop\"\n{model}{}", agent_tool("loop.toml"));
        std::fs::write(&looped, text).unwrap();
        let err = load_agent_file(&looped).unwrap_err().to_string();
        assert!(err.contains("cycle"), "{err}");
        // A missing child file is named.
        let missing = dir.path().join("missing.toml");
        let text = format!("name = \"m\"\n{model}{}", agent_tool("nowhere.toml"));
        std::fs::write(&missing, text).unwrap();
        let err = load_agent_file(&missing).unwrap_err().to_string();
        assert!(err.contains("nowhere.toml"), "{err}");
    }

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let err = load("name = \"x\"\n[model]\nprovider = \"openai\"\n[[tools]]\nname = \"t\"\nkind = \"http\"\neffect = \"sometimes\"\nurl = \"http://x\"\n").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("agent.toml") && text.contains("sometimes"),
            "{text}"
        );
        let err = load("name = \"x\"\n[model]\nprovider = \"openai\"\n").unwrap_err();
        assert!(err.to_string().contains("base_url"), "{err}");
        let err = load(
            "name = \"x\"\n[model]\nprovider = \"openai\"\nbase_url = \"http://x\"\nbogus = 1\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        // The Responses API's provider: its model named, no key unknown.
        let responses = "name = \"x\"\n[model]\nprovider = \"openai-responses\"\n";
        let err = load(responses).unwrap_err();
        assert!(err.to_string().contains("needs model"), "{err}");
        let err = load(&format!("{responses}model = \"m\"\nstore = true\n")).unwrap_err();
        assert!(err.to_string().contains("store"), "{err}");
        assert!(load(&format!("{responses}model = \"m\"\n")).is_ok());
    }
}
