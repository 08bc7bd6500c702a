//! The one way a test runs the binary: [`Cmd`], built fluently from a
//! directory ([`Cmd::new`]), a lock ([`super::Lock::op`]) or a store
//! ([`super::stores::Store::cmd`]); its options typed (`.ttl(60)`,
//! `.token(&t)`), its environment cleared but for `PATH`, its stdin closed
//! unless given bytes, bounded in time when asked. It ends in what the test
//! reads: [`Out`] (`.run()`), the typed reply (`.reply()`, `.expect(..)`,
//! `.run_reply()`), or a process the test drives itself (`.spawn()`, then
//! [`finish`]).

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::Value;
use super::reply::{self, Reply};

/// Path of the binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_skill-lock");

/// One invocation of the binary, built fluently.
pub struct Cmd {
    inner: Command,
    /// The verb, when a [`super::Lock`] made it: `not_held`'s exit status
    /// is checked by it.
    verb: Option<String>,
    stdin: Option<Vec<u8>>,
    timeout: Option<Duration>,
    quiet: bool,
    /// The signals `run` forwards at their defaults, in a session of its own.
    signals: Option<bool>,
    /// Run through another program: `program PRE... BIN ARGS...`.
    through: Option<(OsString, Vec<OsString>)>,
}

impl Cmd {
    /// The binary, to be run in `cwd` with only `PATH` of this environment.
    pub fn new(cwd: &Path) -> Self {
        let mut inner = Command::new(BIN);
        inner.current_dir(cwd).env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            inner.env("PATH", path);
        }
        Self {
            inner,
            verb: None,
            stdin: None,
            timeout: None,
            quiet: false,
            signals: None,
            through: None,
        }
    }

    /// The verb `verb` (its first argument), whose `not_held` reply
    /// [`Cmd::reply`] checks by it.
    pub fn with_verb(self, verb: &str) -> Self {
        Self {
            verb: Some(verb.to_owned()),
            ..self.arg(verb)
        }
    }

    /// The verb it runs (`""`: none named).
    pub fn verb(&self) -> &str {
        self.verb.as_deref().unwrap_or("")
    }

    /// Appends one raw argument.
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.inner.arg(a);
        self
    }

    /// Appends raw arguments (for an option no typed method names).
    pub fn args<I, S>(mut self, a: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.inner.args(a);
        self
    }

    /// The environment variable `name=value` for this invocation.
    pub fn env(mut self, name: &str, value: impl AsRef<OsStr>) -> Self {
        self.inner.env(name, value);
        self
    }

    /// As if run on another host (`SKILL_LOCK_HOST`).
    pub fn host(self, name: &str) -> Self {
        self.env("SKILL_LOCK_HOST", name)
    }

    /// One option and its value.
    fn opt(self, name: &str, value: impl AsRef<OsStr>) -> Self {
        self.arg(name).arg(value)
    }

    /// `--ttl SECS`.
    pub fn ttl(self, secs: u64) -> Self {
        self.opt("--ttl", secs.to_string())
    }

    /// `--note TEXT`.
    pub fn note(self, text: impl AsRef<OsStr>) -> Self {
        self.opt("--note", text)
    }

    /// `--owner-pid PID`.
    pub fn owner_pid(self, pid: u32) -> Self {
        self.opt("--owner-pid", pid.to_string())
    }

    /// `--token TOKEN`.
    pub fn token(self, token: &str) -> Self {
        self.opt("--token", token)
    }

    /// `--force`.
    pub fn force(self) -> Self {
        self.arg("--force")
    }

    /// `--wait SECS` (a decimal number of seconds).
    pub fn wait(self, secs: impl std::fmt::Display) -> Self {
        self.opt("--wait", secs.to_string())
    }

    /// `--since FENCE` (`None`: `null`, the fence of a never-acquired lock).
    pub fn since(self, fence: Option<u64>) -> Self {
        let fence = fence.map_or_else(|| "null".to_owned(), |f| f.to_string());
        self.opt("--since", fence)
    }

    /// `--root DIR`.
    pub fn root(self, dir: impl AsRef<OsStr>) -> Self {
        self.opt("--root", dir)
    }

    /// `--limit N` (`history`).
    pub fn limit(self, n: u64) -> Self {
        self.opt("--limit", n.to_string())
    }

    /// `--store URL`.
    pub fn store(self, url: &str) -> Self {
        self.opt("--store", url)
    }

    /// `-- CMD...` (`run`): the command to run under the lock.
    pub fn command<I, S>(self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.arg("--").args(argv)
    }

    /// `-- sh -c SCRIPT sh ARGS...` (`run`; ARGS are `$1`...).
    pub fn sh(self, script: &str, args: &[&str]) -> Self {
        self.command([&["sh", "-c", script, "sh"][..], args].concat())
    }

    /// `bytes` on its standard input (closed otherwise).
    pub fn stdin(self, bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            stdin: Some(bytes.into()),
            ..self
        }
    }

    /// [`Cmd::run`] kills it and fails the test after `limit`.
    pub fn timeout(self, limit: Duration) -> Self {
        Self {
            timeout: Some(limit),
            ..self
        }
    }

    /// [`Cmd::spawn`] sends its output nowhere (a process to be SIGKILLed).
    pub fn quiet(self) -> Self {
        Self {
            quiet: true,
            ..self
        }
    }

    /// The signals `run` forwards (INT, TERM, HUP) at their default
    /// disposition in the child, so that a harness started with SIGINT
    /// ignored (a background job of a non-interactive shell) does not make
    /// CMD ignore it too; in a session of its own when `own_session`.
    pub fn default_signals(self, own_session: bool) -> Self {
        Self {
            signals: Some(own_session),
            ..self
        }
    }

    /// Run through another program: `program PRE... BIN ARGS...`, in the
    /// same directory with only this environment (a start gate, a fresh
    /// namespace: something that then `exec`s the binary).
    pub fn through(self, program: impl AsRef<OsStr>, pre: &[&OsStr]) -> Self {
        let pre = pre.iter().map(|p| p.to_os_string()).collect();
        Self {
            through: Some((program.as_ref().to_os_string(), pre)),
            ..self
        }
    }

    /// The process as configured, its standard streams left to the caller
    /// (for what no option here says: another uid, a file for stdout).
    pub fn into_command(self) -> Command {
        let mut cmd = match self.through {
            None => self.inner,
            Some((program, pre)) => {
                let inner = self.inner;
                let mut outer = Command::new(program);
                outer
                    .args(pre)
                    .arg(inner.get_program())
                    .args(inner.get_args());
                outer.env_clear();
                if let Some(dir) = inner.get_current_dir() {
                    outer.current_dir(dir);
                }
                for (k, v) in inner.get_envs() {
                    if let Some(v) = v {
                        outer.env(k, v);
                    }
                }
                outer
            }
        };
        if let Some(own_session) = self.signals {
            // SAFETY: only async-signal-safe calls (signal, setsid) between
            // fork and exec.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                        libc::signal(s, libc::SIG_DFL);
                    }
                    if own_session {
                        libc::setsid();
                    }
                    Ok(())
                });
            }
        }
        cmd
    }

    /// Starts it: stdin closed (or fed its bytes), stdout and stderr
    /// captured (or nowhere when [`Cmd::quiet`]).
    #[track_caller]
    pub fn spawn(self) -> Child {
        let (stdin, quiet) = (self.stdin.clone(), self.quiet);
        let out = || if quiet { Stdio::null() } else { Stdio::piped() };
        let mut child = self
            .into_command()
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(out())
            .stderr(out())
            .spawn()
            .expect("the binary starts");
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(&bytes).expect("write stdin");
        }
        child
    }

    /// Runs it and returns what it printed (within [`Cmd::timeout`]).
    #[track_caller]
    pub fn run(self) -> Out {
        match self.timeout {
            Some(limit) => finish(self.spawn(), limit),
            None => Out::from(self.spawn().wait_with_output().expect("binary runs")),
        }
    }

    /// Runs it and reads its reply (the exit status checked against the
    /// result, `not_held`'s by the verb: 0 for `release`, 4 otherwise).
    #[track_caller]
    pub fn reply(self) -> Reply {
        let verb = self.verb.clone();
        let out = self.run();
        let r = out.reply();
        if let (Reply::NotHeld { .. }, Some(verb)) = (&r, verb) {
            let want = if verb == "release" { 0 } else { 4 };
            assert_eq!(out.code, want, "exit status of {verb}'s {r:?}");
        }
        r
    }

    /// Runs it, asserts its exit status and result, and returns the reply.
    #[track_caller]
    pub fn expect(self, code: i32, result: &str) -> Reply {
        self.run().expect_reply(code, result)
    }

    /// Runs `run` and reads its reply from the last line of stderr.
    #[track_caller]
    pub fn run_reply(self) -> (Out, Reply) {
        let out = self.run();
        let r = out.run_reply();
        (out, r)
    }
}

/// Waits for `child` and its output, at most `limit`; kills it and fails
/// the test when it takes longer.
#[track_caller]
pub fn finish_output(child: Child, limit: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for the binary"),
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                // SAFETY: kill(2) of a child this test started and has not reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("pid {pid} still running after {limit:?}");
        }
    }
}

/// [`finish_output`] of a child [`Cmd::spawn`] started, read as its [`Out`].
#[track_caller]
pub fn finish(child: Child, limit: Duration) -> Out {
    Out::from(finish_output(child, limit))
}

/// What one invocation printed.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub json: Value,
}

impl From<Output> for Out {
    fn from(out: Output) -> Self {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let json = if stdout.ends_with('\n') && stdout.matches('\n').count() == 1 {
            serde_json::from_str(&stdout).unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        Self {
            code: out.status.code().unwrap_or(-1),
            stdout,
            stderr,
            json,
        }
    }
}

impl Out {
    /// Asserts the exit status and the `result`, and returns the JSON. The
    /// object must also read as its typed mirror ([`Reply`]: every field
    /// known, of the right type, the exit status the one its result means),
    /// so no test passes on an object the contract does not define.
    #[track_caller]
    pub fn expect(&self, code: i32, result: &str) -> &Value {
        assert_eq!(
            (self.code, self.json["result"].as_str()),
            (code, Some(result)),
            "stdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        reply::parse(self, &self.json.to_string());
        &self.json
    }

    /// Asserts the exit status and the `result`, and returns the typed reply.
    #[track_caller]
    pub fn expect_reply(&self, code: i32, result: &str) -> Reply {
        self.expect(code, result);
        self.reply()
    }

    /// Asserts an error object with this code and exit status 2, and
    /// returns its message.
    #[track_caller]
    pub fn error_message(&self, code: &str) -> String {
        self.expect_error(code);
        self.reply().message().to_owned()
    }

    /// The typed reply on stdout (the default way to read a result); its
    /// exit status must match its result.
    #[track_caller]
    pub fn reply(&self) -> Reply {
        reply::parse(self, self.stdout.trim_end())
    }

    /// The typed reply of `run`, which prints its object as the last line
    /// of stderr (CMD owns stdout).
    #[track_caller]
    pub fn run_reply(&self) -> Reply {
        reply::parse(self, self.stderr.lines().last().unwrap_or(""))
    }

    /// The typed reply of an invocation that must answer one object (on
    /// stdout, or `on_stderr` as the last line, as `run` does), or `None`
    /// when it printed no object the contract defines; its exit status
    /// checked when it did.
    #[track_caller]
    pub fn try_reply(&self, on_stderr: bool) -> Option<Reply> {
        let text = if on_stderr {
            self.stderr.lines().last()?
        } else if self.json.is_object() {
            self.stdout.trim_end()
        } else {
            return None;
        };
        serde_json::from_str::<Reply>(text).ok()?;
        Some(reply::parse(self, text))
    }

    /// Did it print one JSON object on one line (what every command but
    /// `run` prints)?
    pub fn is_one_object(&self) -> bool {
        self.json.is_object()
    }

    /// Asserts an error object with this code and exit status 2.
    #[track_caller]
    pub fn expect_error(&self, code: &str) -> &Value {
        let v = self.expect(2, "error");
        assert_eq!(v["error"], code, "{}", self.stdout);
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
        v
    }
}
