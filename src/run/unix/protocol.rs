//! The protocol between `run`'s wrapper and its keeper (SPEC §2.7): how the
//! keeper is started, and every line either sends, written and read here.
//!
//! The keeper is this same binary run again (`/proc/self/exe` on Linux)
//! with [`KEEPER_ARG`], the grace in milliseconds, CMD's program and CMD's
//! words; the wrapper hands it two pipes as its fds 3 and 4. Control lines
//! ([`Control`], wrapper to keeper, on [`CONTROL_FD`]) and reports
//! ([`TreeReport`], keeper to wrapper, on [`REPORT_FD`]) are text lines;
//! the only writer of each pipe is one process, and every line but the
//! first (the [`ReleaseOrder`], sent while the pipe is still empty) is one
//! `write` shorter than `PIPE_BUF`. The token and the store's URL travel
//! only over the pipe, never in the keeper's arguments.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use super::super::TreeReport;
use crate::error::{Error, Result};

/// The first argument that makes this binary the keeper of a `run`.
pub(super) const KEEPER_ARG: &str = "__skill-lock-run-keeper";

/// The keeper's end of the control pipe.
pub(super) const CONTROL_FD: RawFd = 3;
/// The keeper's end of the report pipe.
pub(super) const REPORT_FD: RawFd = 4;

/// The program to exec as the keeper: this very binary (and, from the
/// keeper, the `release` it runs when the wrapper died).
pub(super) fn keeper_program() -> Result<PathBuf> {
    if cfg!(target_os = "linux") {
        return Ok(PathBuf::from("/proc/self/exe"));
    }
    #[allow(
        clippy::disallowed_methods,
        reason = "the keeper is this binary run again; not configuration"
    )]
    std::env::current_exe().map_err(|e| {
        Error::Internal(format!(
            "cannot find this program to start run's keeper: {e}"
        ))
    })
}

/// One control line, wrapper to keeper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Control {
    /// How to release the lock should the wrapper die (the first line).
    Release(ReleaseOrder),
    /// Start CMD under the lease; with `lend`, its group is made the
    /// terminal's foreground.
    Go {
        fence: u64,
        lend: bool,
        others_since: Option<bool>,
        token: String,
    },
    /// Stop the tree at this moment on the lease clock unless a later one
    /// is sent.
    StopAt(Duration),
    /// Forward this signal to every process of the tree.
    Signal(libc::c_int),
    /// Stop the tree now.
    Stop,
    /// Before CMD started: exit.
    Quit,
    /// The wrapper dealt with the lock: exit without releasing.
    Done,
}

impl Control {
    /// The line, newline included: `release ...`, `go FENCE LEND SINCE
    /// TOKEN`, `stop-at MS`, `signal N`, `stop`, `quit`, `done`.
    pub(super) fn line(&self) -> String {
        match self {
            Self::Release(order) => order.line(),
            Self::Go {
                fence,
                lend,
                others_since,
                token,
            } => {
                let since = match others_since {
                    None => "-",
                    Some(true) => "1",
                    Some(false) => "0",
                };
                format!("go {fence} {} {since} {token}\n", u8::from(*lend))
            }
            Self::StopAt(at) => format!("stop-at {}\n", at.as_millis()),
            Self::Signal(sig) => format!("signal {sig}\n"),
            Self::Stop => "stop\n".into(),
            Self::Quit => "quit\n".into(),
            Self::Done => "done\n".into(),
        }
    }

    /// A line read back (without its newline); `None` for anything else.
    pub(super) fn parse(line: &str) -> Option<Self> {
        if let Some(rest) = line.strip_prefix("release ") {
            return ReleaseOrder::parse(rest).map(Self::Release);
        }
        let mut words = line.splitn(5, ' ');
        Some(match words.next()? {
            "go" => Self::Go {
                fence: words.next()?.parse().ok()?,
                lend: words.next()? == "1",
                others_since: match words.next()? {
                    "-" => None,
                    "1" => Some(true),
                    "0" => Some(false),
                    _ => return None,
                },
                token: words.next()?.to_owned(),
            },
            "stop-at" => Self::StopAt(Duration::from_millis(words.next()?.parse().ok()?)),
            "signal" => Self::Signal(words.next()?.parse().ok()?),
            "stop" => Self::Stop,
            "quit" => Self::Quit,
            "done" => Self::Done,
            _ => return None,
        })
    }
}

/// One report line of the keeper, newline included: `started PID`,
/// `failed REASON`, `exited STATUS LEFTOVERS`, `empty`. `None` for what
/// is never sent: [`TreeReport::Gone`] (the wrapper's own conclusion when
/// the pipe closes) and an exit without a status.
pub(super) fn report_line(report: &TreeReport) -> Option<String> {
    Some(match report {
        TreeReport::Started(pid) => format!("started {pid}\n"),
        TreeReport::Failed(reason) => format!("failed {reason}\n"),
        TreeReport::Exited { status, leftovers } => {
            format!("exited {} {}\n", (*status)?.into_raw(), u8::from(*leftovers))
        }
        TreeReport::Empty => "empty\n".into(),
        TreeReport::Gone => return None,
    })
}

/// A report line read back (without its newline); `None` for anything else.
pub(super) fn parse_report(line: &str) -> Option<TreeReport> {
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    Some(match word {
        "started" => TreeReport::Started(rest.parse().ok()?),
        "failed" => TreeReport::Failed(rest.to_owned()),
        "exited" => {
            let (raw, left) = rest.split_once(' ')?;
            TreeReport::Exited {
                status: Some(ExitStatus::from_raw(raw.parse().ok()?)),
                leftovers: left == "1",
            }
        }
        "empty" => TreeReport::Empty,
        _ => return None,
    })
}

/// What the keeper runs to release the lock when the wrapper died: this
/// binary's `release` with `args`, the token in `SKILL_LOCK_TOKEN` (a token
/// release: it never removes another run's lock) and the store's URL, when
/// one was named, in `SKILL_LOCK_STORE`: never in an argument, since it may
/// carry credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ReleaseOrder {
    /// The words after the program name (`release SKILL --repo=REPO ...`).
    pub args: Vec<OsString>,
    /// The store's URL, for the release's environment.
    pub store: Option<OsString>,
}

impl ReleaseOrder {
    /// One control line: `release STORE ARG...`, each word `x` and its
    /// bytes in hex (`-`: no store), so any bytes survive a text line.
    fn line(&self) -> String {
        let mut line = String::from("release ");
        match &self.store {
            Some(url) => line.push_str(&hex(url)),
            None => line.push('-'),
        }
        for arg in &self.args {
            line.push(' ');
            line.push_str(&hex(arg));
        }
        line.push('\n');
        line
    }

    fn parse(rest: &str) -> Option<Self> {
        let mut words = rest.split(' ');
        let store = match words.next()? {
            "-" => None,
            word => Some(unhex(word)?),
        };
        let args = words.map(unhex).collect::<Option<Vec<_>>>()?;
        Some(Self { args, store })
    }
}

fn hex(word: &std::ffi::OsStr) -> String {
    use std::fmt::Write as _;
    word.as_encoded_bytes()
        .iter()
        .fold(String::from("x"), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

fn unhex(word: &str) -> Option<OsString> {
    use std::os::unix::ffi::OsStringExt;
    let digits = word.strip_prefix('x')?.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    let bytes = digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(OsString::from_vec(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn back(control: &Control) -> Option<Control> {
        Control::parse(control.line().trim_end_matches('\n'))
    }

    #[test]
    fn reports_and_controls_parse_and_refuse_garbage() {
        assert_eq!(parse_report("started 42"), Some(TreeReport::Started(42)));
        assert_eq!(
            parse_report("exited 256 1"),
            Some(TreeReport::Exited {
                status: Some(ExitStatus::from_raw(256)),
                leftovers: true
            })
        );
        assert_eq!(parse_report("empty"), Some(TreeReport::Empty));
        assert_eq!(parse_report("exited x 1"), None);
        assert_eq!(parse_report("what"), None);
        assert!(matches!(
            Control::parse("go 7 1 - abc"),
            Some(Control::Go { fence: 7, lend: true, others_since: None, ref token }) if token == "abc"
        ));
        assert!(matches!(
            Control::parse("go 7 0 1 abc"),
            Some(Control::Go {
                lend: false,
                others_since: Some(true),
                ..
            })
        ));
        assert!(matches!(
            Control::parse("go 7 0 0 abc"),
            Some(Control::Go {
                others_since: Some(false),
                ..
            })
        ));
        assert!(Control::parse("go 7 1 abc").is_none(), "no answer to --since");
        assert!(
            matches!(Control::parse("stop-at 1500"), Some(Control::StopAt(d)) if d.as_millis() == 1500)
        );
        assert!(matches!(Control::parse("signal 2"), Some(Control::Signal(2))));
        assert!(Control::parse("go x 1 - t").is_none());
        assert!(Control::parse("").is_none());
        assert!(matches!(Control::parse("done"), Some(Control::Done)));
    }

    #[test]
    fn every_line_written_reads_back_the_same() {
        for control in [
            Control::Go {
                fence: 9,
                lend: true,
                others_since: Some(false),
                token: "t0k".into(),
            },
            Control::StopAt(Duration::from_millis(1234)),
            Control::Signal(15),
            Control::Stop,
            Control::Quit,
            Control::Done,
        ] {
            assert_eq!(back(&control), Some(control.clone()), "{control:?}");
        }
        for report in [
            TreeReport::Started(7),
            TreeReport::Failed("cannot run x: no".into()),
            TreeReport::Exited {
                status: Some(ExitStatus::from_raw(9)),
                leftovers: false,
            },
            TreeReport::Empty,
        ] {
            let line = report_line(&report).unwrap();
            assert_eq!(parse_report(line.trim_end_matches('\n')), Some(report));
        }
        assert_eq!(report_line(&TreeReport::Gone), None);
    }

    #[test]
    fn a_release_order_survives_its_line_whatever_its_bytes() {
        use std::os::unix::ffi::OsStringExt;
        let order = ReleaseOrder {
            args: vec![
                "release".into(),
                "s".into(),
                "--repo=o/r".into(),
                OsString::from_vec(b"--root=/a b/\xff\n\x00 x".to_vec()),
            ],
            store: Some("etcd://user:pa ss@host:2379/p".into()),
        };
        let line = order.line();
        assert!(
            line.ends_with('\n') && !line.trim_end().contains('\n'),
            "{line}"
        );
        assert!(!line.contains("pa ss") && !line.contains("user"), "{line}");
        assert_eq!(
            back(&Control::Release(order.clone())),
            Some(Control::Release(order))
        );
        let none = ReleaseOrder {
            args: vec!["release".into()],
            store: None,
        };
        assert_eq!(
            back(&Control::Release(none.clone())),
            Some(Control::Release(none))
        );
        assert!(Control::parse("release - x6").is_none(), "odd hex");
        assert!(Control::parse("release - 61").is_none(), "no x");
    }
}
