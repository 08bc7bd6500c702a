//! Command line (SPEC §2). [`run`] is the whole program: parse, validate,
//! act ([`crate::commands`]), print one object. The clap definitions and
//! the help texts are `args.rs`; their validation into
//! [`crate::config::Settings`] in one place is `validate.rs`
//! (`Cli::into_settings`); what stays here is the run itself and how a
//! refused command line is reported.

mod args;
mod validate;

use std::ffi::OsString;

use args::{Cli, Command, LockArgs};
use clap::Parser;
use validate::key_of;

use crate::config::Environment;
use crate::error::Error;
use crate::output::{Channel, ExitStatus, Report};

/// The clap definition of the command line, for generating completions and
/// the man page (`cargo run --example gen-docs`).
#[must_use]
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command()
}

/// clap's complaint on one line, without its usage block, with clap's
/// suggestions ("did you mean 'acquire'?"), the fix for the most common
/// mistake of `run` (CMD without `--`), and the help of the subcommand.
fn usage_message(e: &clap::Error, args: &[OsString]) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let text = e.render().to_string();
    let body: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("tip:") && !l.starts_with("For more information")
        })
        .collect();
    let mut parts = vec![body.join(" ").trim_start_matches("error: ").to_owned()];
    for kind in [
        ContextKind::SuggestedSubcommand,
        ContextKind::SuggestedArg,
        ContextKind::SuggestedValue,
    ] {
        let names = match e.get(kind) {
            Some(ContextValue::String(one)) => vec![one.clone()],
            Some(ContextValue::Strings(many)) => many.clone(),
            _ => continue,
        };
        let names: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
        if !names.is_empty() {
            parts.push(format!("did you mean {}?", names.join(" or ")));
        }
    }
    let word = command_word(args).filter(|w| command().find_subcommand(w).is_some());
    let stray = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => !arg.starts_with('-'),
        _ => false,
    };
    if word == Some("run") && e.kind() == ErrorKind::UnknownArgument && stray {
        parts.push(
            "put -- before the command to run: skill-lock run SKILL --repo OWNER/NAME -- CMD [ARGS...]"
                .to_owned(),
        );
    }
    let help = word.map_or_else(
        || "skill-lock --help".to_owned(),
        |w| format!("skill-lock {w} --help"),
    );
    format!("{}; run '{help}' for usage", parts.join("; "))
}

/// The command word of an argument list that clap refused (skipping the
/// global options and their values), to route `run`'s error to stderr.
fn command_word(args: &[OsString]) -> Option<&str> {
    let mut it = args.iter().skip(1).filter_map(|a| a.to_str());
    while let Some(a) = it.next() {
        match a {
            "--root" | "--store" => {
                it.next();
            }
            _ if a.starts_with('-') => {}
            word => return Some(word),
        }
    }
    None
}

/// Prints the error object of an invocation that reached no command (on
/// standard output) and returns its exit status.
#[must_use = "the exit status is the process's"]
pub fn report_error(err: &Error) -> ExitStatus {
    Report::error(err, None).emit(Channel::Stdout)
}

/// Runs one invocation: parses `args` (program name first), acts, prints
/// exactly one JSON object (or help/version text) and returns the exit status.
pub fn run<I, T>(args: I) -> ExitStatus
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let channel = Channel::of_command(command_word(&args));
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitStatus::Success;
            }
            let report = Report::error(&Error::Usage(usage_message(&e, &args)), None);
            return report.emit(channel);
        }
    };
    if let Command::Completions { shell } = cli.command {
        return crate::output::print_completions(&mut command(), shell);
    }
    let env = match Environment::read() {
        Ok(env) => env,
        Err(err) => return Report::error(&err, None).emit(channel),
    };
    if let Command::Mcp = cli.command {
        return mcp(cli.store, cli.root.as_deref(), env, channel);
    }
    if let Command::Doctor(a) = cli.command {
        let key = match (a.skill, a.repo) {
            (Some(skill), Some(repo)) => match key_of(&LockArgs { skill, repo }) {
                Ok(key) => Some(key),
                Err(err) => return Report::error(&err, None).emit(channel),
            },
            _ => None,
        };
        let req = crate::doctor::Request {
            key,
            root: cli.root,
            store: cli.store,
            text: a.text,
        };
        return crate::doctor::run(&req, &env);
    }
    if matches!(cli.command, Command::Run(_)) {
        crate::run::prepare();
    }
    let lock = cli.command.lock_as_given();
    cli.into_settings(env)
        .and_then(|settings| crate::commands::execute(&settings, channel))
        .unwrap_or_else(|err| Report::error(&err, lock).emit(channel))
}

/// `skill-lock mcp`: serves until the session ends (SPEC §2.9). Each tool
/// call names its own root, so `--root` is refused here; `--store` holds
/// for every call, as for any command.
#[cfg(feature = "mcp")]
fn mcp(
    store: Option<OsString>,
    root: Option<&std::path::Path>,
    env: Environment,
    channel: Channel,
) -> ExitStatus {
    if root.is_some() {
        let err = Error::Usage(
            "mcp takes no --root: each tool call names its checkout in its `root` argument".into(),
        );
        return Report::error(&err, None).emit(channel);
    }
    crate::mcp::serve(store, env)
}

/// `skill-lock mcp` in a build without the server: a usage error that says
/// which build has it.
#[cfg(not(feature = "mcp"))]
fn mcp(
    _store: Option<OsString>,
    _root: Option<&std::path::Path>,
    _env: Environment,
    channel: Channel,
) -> ExitStatus {
    let err = Error::Usage(
        "this build has no MCP server (cargo feature \"mcp\"): install the bundle or the wheel, \
         or build with the default features"
            .into(),
    );
    Report::error(&err, None).emit(channel)
}
