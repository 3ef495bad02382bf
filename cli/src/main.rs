//! `mneme`: the command-line face of the runtime.

/// Prints one line to stderr in a single write. Scripts (and the crash
/// tests) read lines such as `session ID`; `eprintln!` writes a line in
/// pieces, so a process killed mid-line could leave `session ` alone. Text
/// from outside in it (server errors, call ids) can neither forge lines nor
/// drive the terminal, and known secrets are redacted.
macro_rules! say {
    ($($arg:tt)*) => {
        runtime::text::say(&format!($($arg)*))
    };
}

#[macro_use]
mod out;
mod approving;
mod args;
mod commands;
mod demo;
mod diff;
mod local;
mod open;
mod progress;
mod reader;
mod remote;
mod render;
mod sessions;
mod timeline;
mod ui;
mod witness;

use args::*;
use clap::{CommandFactory, FromArgMatches};
use std::process::ExitCode;

/// Exit code of a run that stopped on calls in doubt.
const EXIT_NEEDS_DECISION: u8 = 3;

/// Exit code of a run that stopped with the session sleeping (a call of a
/// tool of kind `sleep`): it goes on when it wakes.
const EXIT_SLEEPING: u8 = 4;

fn main() -> ExitCode {
    // Sessions hold what people, models and tools said: nothing mneme
    // writes is for other local users.
    runtime::restrict_umask();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    runtime::text::init_logging(cli.log_format);
    // What the data directory's holder note says of this process: never
    // its arguments (a user's message).
    let holder = format!("mneme {}", matches.subcommand_name().unwrap_or_default());
    runtime::text::name_this_process(&holder);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime starts");
    match runtime.block_on(commands::dispatch(cli, &holder)) {
        Ok(code) => code,
        // The reader of stdout went away (`mneme export | head`): quietly.
        Err(error) if out::is_closed_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            say_error(&error);
            ExitCode::FAILURE
        }
    }
}

/// Says why the command failed. An agent file's error keeps its lines (the
/// file's line, a caret under the fault); every other error is one line,
/// since text from outside (a server's answer) may be in it.
fn say_error(error: &anyhow::Error) {
    let in_agent_file = error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<runtime::RuntimeError>(),
            Some(runtime::RuntimeError::Spec { .. })
        )
    });
    match in_agent_file {
        true => runtime::text::say_lines(&format!("mneme: error: {error:#}")),
        false => say!("mneme: error: {error:#}"),
    }
}
