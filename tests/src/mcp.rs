//! The reference MCP servers (npm's `@modelcontextprotocol/server-*`),
//! installed under target/ by `scripts/mcp-servers.sh` the first time a
//! test asks: never skipped, they install or the test fails saying why.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Entry points of the installed servers, each run with `node`.
#[derive(Debug, Clone)]
pub struct McpServers {
    /// server-filesystem (stdio; allowed directories as arguments).
    pub filesystem: PathBuf,
    /// server-memory (stdio; its graph in `MEMORY_FILE_PATH`).
    pub memory: PathBuf,
    /// server-everything (`streamableHttp`, port in `PORT`).
    pub everything: PathBuf,
}

/// The servers, installed once per test process.
pub fn servers() -> &'static McpServers {
    static SERVERS: OnceLock<McpServers> = OnceLock::new();
    SERVERS.get_or_init(install)
}

fn install() -> McpServers {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("scripts/mcp-servers.sh");
    let output = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} could not install the MCP servers (Node.js, npm and the npm registry are needed):\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let entries = std::fs::read_to_string(root.join("target/mcp-servers/entry.env"))
        .expect("the install script writes target/mcp-servers/entry.env");
    let entry = |name: &str| {
        let line = entries
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("entry.env names no {name}"));
        PathBuf::from(line.trim())
    };
    McpServers {
        filesystem: entry("MCP_FS"),
        memory: entry("MCP_MEMORY"),
        everything: entry("MCP_EVERYTHING"),
    }
}

/// An `[[mcp]]` table for a stdio server run as `node ENTRY ARGS...`,
/// with `extra` TOML lines (policy, effect) after it.
pub fn stdio_server(name: &str, entry: &Path, args: &[&str], extra: &str) -> String {
    let mut words = vec![
        format!("{:?}", "node"),
        format!("{:?}", entry.display().to_string()),
    ];
    words.extend(args.iter().map(|a| format!("{a:?}")));
    format!(
        "[[mcp]]\nname = \"{name}\"\ncommand = [{}]\n{extra}",
        words.join(", ")
    )
}

/// A server-memory whose graph lives in `file` (it takes no argument
/// for it: the variable is set by `sh`, since mneme passes its servers
/// only the variables their spec names).
pub fn memory_server(name: &str, file: &Path, extra: &str) -> String {
    let script = format!(
        "MEMORY_FILE_PATH={:?} exec node {:?}",
        file.display().to_string(),
        servers().memory.display().to_string()
    );
    format!("[[mcp]]\nname = \"{name}\"\ncommand = [\"sh\", \"-c\", {script:?}]\n{extra}")
}
