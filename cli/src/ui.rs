//! `mneme ui`: signs a browser in to the web view of the daemon that holds
//! the data directory, with a one-time link (the token stays out of URLs,
//! histories and logs).

use crate::remote::Remote;
use crate::UiArgs;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::ExitCode;

/// Asks the daemon for a sign-in link and prints it (or opens it).
pub async fn run(data_dir: &Path, args: UiArgs) -> Result<ExitCode> {
    let Some(remote) = Remote::discover(data_dir)? else {
        bail!(
            "no daemon holds {}: the web view is the daemon's; start `mneme serve` first",
            data_dir.display()
        );
    };
    let name = args
        .name
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "web view".to_string());
    let code = remote.ui_code(&name).await?;
    let url = format!("{}{}", remote.base(), code.login);
    if !args.print_url {
        eprintln!(
            "mneme ui: open this link within {} s; it signs one browser in, once, as {name:?}",
            code.expires_in_secs
        );
    }
    outln!("{url}");
    if args.open {
        open(data_dir, &url)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens `url` with `$BROWSER`, else `xdg-open`, through a page in the data
/// directory (the owner's alone) that forwards to it: a program's
/// arguments are readable by every local user, the link is not for them.
fn open(data_dir: &Path, url: &str) -> Result<()> {
    let page = data_dir.join("ui-sign-in.html");
    let html = format!(
        "<!doctype html><meta charset=utf-8><meta name=referrer content=no-referrer><meta http-equiv=refresh content=\"0;url={url}\"><title>mneme: signing in</title>"
    );
    std::fs::write(&page, html).with_context(|| format!("writing {}", page.display()))?;
    let program = std::env::var("BROWSER").unwrap_or_else(|_| "xdg-open".to_string());
    std::process::Command::new(&program)
        .arg(&page)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("opening the link with {program} (set $BROWSER)"))?;
    Ok(())
}
