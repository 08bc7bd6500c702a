//! The only writer to standard output, and the [`Channel`] an invocation's
//! one object goes to: a result that could not be written in full (standard
//! output closed, full or a broken pipe) is a failure, said on standard
//! error (SPEC §3).

use std::io::Write;

use super::{ExitStatus, Report};

impl Report {
    /// Serializes to one line ending in `\n`, with nothing in it that a
    /// terminal would act on ([`crate::visible::to_writer`]).
    #[must_use]
    pub(crate) fn to_line(&self) -> Vec<u8> {
        let mut v = Vec::new();
        if let Err(e) = crate::visible::to_writer(&mut v, self) {
            v = format!(
                r#"{{"result":"error","error":"internal","message":"cannot print result: {e}"}}"#
            )
            .into_bytes();
        }
        v.push(b'\n');
        v
    }

    /// What the object said, for a note on stderr when it could not be
    /// written: an error's message, else its `result`.
    #[must_use]
    pub(crate) fn gist(&self) -> String {
        match self {
            Self::Error(r) => format!("; it said: {}", r.message),
            other => serde_json::to_value(other)
                .ok()
                .and_then(|v| Some(format!("; it was: {}", v["result"].as_str()?)))
                .unwrap_or_default(),
        }
    }

    /// Writes the object on `channel`, in full, or says why it could not
    /// (a closed, full or broken standard output, SPEC §3).
    ///
    /// # Errors
    /// The write error; [`std::io::ErrorKind::BrokenPipe`] for a standard
    /// output that was closed when the process started.
    pub(crate) fn write(&self, channel: Channel) -> std::io::Result<()> {
        let line = self.to_line();
        match channel {
            Channel::Stderr => std::io::stderr().lock().write_all(&line),
            Channel::Stdout => {
                let mut out = open_stdout()?;
                out.write_all(&line).and_then(|()| out.flush())
            }
        }
    }

    /// Prints the object on `channel` and returns its exit status: a
    /// result that could not be written in full is a failure (2, said on
    /// standard error), SPEC §3.
    #[must_use = "the exit status is the process's"]
    pub(crate) fn emit(&self, channel: Channel) -> ExitStatus {
        match self.write(channel) {
            Ok(()) => self.exit_status(),
            Err(e) => {
                unwritten(&e, &self.gist());
                ExitStatus::Error
            }
        }
    }
}

/// Says on standard error that the result was not written (`what_then`:
/// what was done about it, e.g. "; the lock was released again").
pub(crate) fn unwritten(e: &dyn std::fmt::Display, what_then: &str) {
    let line = format!("the result could not be written to standard output ({e}){what_then}");
    let _ = writeln!(
        std::io::stderr(),
        "skill-lock: {}",
        crate::visible::visible(&line)
    );
}

/// Where an invocation's one object goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    /// Standard output: every command but `run`.
    Stdout,
    /// Standard error: `run`'s (CMD owns standard output, SPEC §2.7), and
    /// an error that arrives after part of a `list` reached standard output.
    Stderr,
}

impl Channel {
    /// The channel of an invocation whose command word is `command`: the
    /// one place that chooses.
    #[must_use]
    pub(crate) fn of_command(command: Option<&str>) -> Self {
        if command == Some("run") {
            Self::Stderr
        } else {
            Self::Stdout
        }
    }
}

/// Standard output: only this file writes to it (and clap, for
/// `completions`, through it).
#[allow(clippy::disallowed_methods, reason = "the one writer to stdout")]
pub(super) fn stdout() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

/// Standard output, or an error when it was closed when the process
/// started: what is written there then reaches nobody (SPEC §3).
///
/// # Errors
/// [`std::io::ErrorKind::BrokenPipe`] when standard output was closed.
pub(crate) fn open_stdout() -> std::io::Result<std::io::StdoutLock<'static>> {
    if stdout_closed() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "standard output is closed",
        ));
    }
    Ok(stdout())
}

/// Was standard output closed when the process started (so that nothing
/// written there reaches anyone)?
#[must_use]
pub(crate) fn stdout_closed() -> bool {
    super::sys::stdout_closed()
}

/// Writes a report built elsewhere (`doctor`'s) to standard output as it
/// is: `status` when it was written whole, else 2.
pub(crate) fn print_plain(text: &str, status: ExitStatus) -> ExitStatus {
    let mut out = stdout();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => status,
        Err(_) => ExitStatus::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::super::About;
    use super::*;
    use crate::engine::State;
    use proptest::prelude::*;

    fn about() -> About {
        About {
            skill: "s".into(),
            repo: "o/r".into(),
            lock: "/p/run/locks/s@o__r.lock".into(),
            clock_skew: None,
        }
    }

    proptest! {
        /// A holder whose host and note carry any characters (every
        /// control, C1, bidi override, line separator) prints as one line
        /// that a terminal only displays, and reads back as stored.
        #[test]
        fn any_host_and_note_print_as_one_safe_line(
            host in "[\\x00-\\x{a0}\\x{2000}-\\x{206f}a-z]{0,24}",
            note in "\\PC{0,8}[\\x00-\\x{9f}\\x{202a}-\\x{202e}]{0,16}",
        ) {
            let mut record = crate::record::tests::sample(Some(note.clone()));
            record.holder.host = host.clone();
            let fence = Some(record.holder.fence);
            let report = Report::status(
                crate::engine::Status {
                    state: State::Held { holder: record.holder, expires_in: 5 },
                    fence,
                },
                about(),
            );
            let line = String::from_utf8(report.to_line()).unwrap();
            prop_assert!(line.ends_with('\n'));
            let body = &line[..line.len() - 1];
            prop_assert!(!body.chars().any(crate::visible::is_unsafe), "{:?}", body);
            let back: serde_json::Value = serde_json::from_str(body).unwrap();
            prop_assert_eq!(back["holder"]["host"].as_str(), Some(host.as_str()));
            prop_assert_eq!(back["holder"]["note"].as_str(), Some(note.as_str()));
        }
    }
}
