//! `mneme demo`: the story of a crash and a resume, told with real processes
//! against a local side-effect sink, on a scripted model. No network, no setup.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;
use testkit::Sink;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const SCRIPT: &str = r#"{"replies": [
  {"content": "Charging the card first.", "tool_calls": [{"name": "charge_card", "arguments": {"customer": "ada", "cents": 4200}}]},
  {"tool_calls": [{"name": "send_email", "arguments": {"to": "ada@example.com", "subject": "Your receipt for $42.00"}}]},
  {"content": "Done: ada was charged $42.00 once and got one receipt."}
]}"#;

fn agent_toml(sink: &Sink) -> String {
    format!(
        r#"name = "billing-agent"
system = "You are a billing assistant."
[model]
provider = "scripted"
script = "script.json"
[[tools]]
name = "charge_card"
description = "Charge a customer's card"
kind = "http"
url = "{charge}"
effect = "side_effect"
parameters = {{ type = "object", properties = {{ customer = {{ type = "string" }}, cents = {{ type = "integer" }} }}, required = ["customer", "cents"] }}
[[tools]]
name = "send_email"
description = "Send an email"
kind = "http"
url = "{email}"
effect = "side_effect"
parameters = {{ type = "object", properties = {{ to = {{ type = "string" }}, subject = {{ type = "string" }} }} }}
"#,
        charge = sink.url("charge"),
        email = sink.url("email"),
    )
}

/// Tells the story; exits non-zero if any effect did not happen exactly once.
pub async fn run(keep: Option<PathBuf>) -> Result<ExitCode> {
    let temp = tempfile::tempdir()?;
    let root = keep.unwrap_or_else(|| temp.path().to_path_buf());
    let data = root.join("data");
    std::fs::create_dir_all(&root)?;
    let sink = Sink::start().await?;
    let agent = root.join("agent.toml");
    std::fs::write(root.join("script.json"), SCRIPT)?;
    std::fs::write(&agent, agent_toml(&sink))?;
    outln!("mneme demo: a billing agent charges a card and emails a receipt.");
    outln!("  data directory  {}", data.display());
    outln!(
        "  side-effect sink {} (applies each Idempotency-Key once)\n",
        sink.url("")
    );

    let hold = sink.hold("email");
    let mut child = mneme(&data)
        .args(["run", "--agent"])
        .arg(&agent)
        .arg("Charge ada $42 and email her a receipt.")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting `mneme run`")?;
    let session = read_session_id(&mut child).await?;
    outln!(
        "1. `mneme run` (pid {}) started session {session}",
        child.id().unwrap_or(0)
    );
    tokio::time::timeout(Duration::from_secs(30), hold.applied)
        .await
        .context("the agent never reached send_email")??;
    child.start_kill()?;
    child.wait().await?;
    drop(hold.release);
    outln!("2. the email was sent, and before mneme heard back: SIGKILL. The process is gone.");
    print_counts(&sink, "   sink now:");

    outln!("\n3. `mneme resume {session}`: fold the log, reuse the finished charge,");
    outln!("   re-send the email with the same idempotency key, ask the model again.");
    let out = mneme(&data)
        .args(["resume", &session])
        .stderr(Stdio::null())
        .output()
        .await?;
    if !out.status.success() {
        bail!("resume failed: {}", String::from_utf8_lossy(&out.stdout));
    }
    outln!("   answer: {}", String::from_utf8_lossy(&out.stdout).trim());

    outln!("\n4. The audit trail (`mneme log {session}`):");
    let log = mneme(&data).args(["log", &session]).output().await?;
    out!("{}", String::from_utf8_lossy(&log.stdout));
    let verify = mneme(&data).args(["verify", &session]).output().await?;
    out!(
        "\n5. `mneme verify`: {}",
        String::from_utf8_lossy(&verify.stdout)
    );

    let stats = sink.stats();
    print_counts(&sink, "\n6. The sink's counts:");
    let once = ["charge", "email"]
        .iter()
        .all(|p| stats.path(p).effects == 1);
    if once && verify.status.success() {
        outln!("\nEvery side effect happened exactly once, across a SIGKILL and a resume.");
        Ok(ExitCode::SUCCESS)
    } else {
        outln!("\nSomething ran twice or the chain broke: this is a bug.");
        Ok(ExitCode::FAILURE)
    }
}

fn mneme(data: &Path) -> Command {
    let exe = std::env::current_exe().expect("current executable");
    let mut command = Command::new(exe);
    command
        .arg("--data-dir")
        .arg(data)
        .env_remove("MNEME_CRASH_AT");
    command
}

async fn read_session_id(child: &mut tokio::process::Child) -> Result<String> {
    let stderr = child.stderr.take().context("child stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    while let Some(line) = lines.next_line().await? {
        if let Some(id) = line.strip_prefix("session ") {
            return Ok(id.trim().to_string());
        }
    }
    bail!("`mneme run` exited before naming its session")
}

fn print_counts(sink: &Sink, title: &str) {
    outln!("{title}");
    for (path, s) in sink.stats().paths {
        outln!(
            "     /{path:<8} requests {}  effects applied {}",
            s.hits,
            s.effects
        );
    }
}
