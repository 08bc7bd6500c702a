//! The behaviour corpus (issue 30, item 4): every command's JSON output and
//! exit status over one fixed scenario set, recorded before the redesign and
//! replayed after it, on each store and platform. A redesign that changes
//! an object, a field's order, an exit status, a message or a hint fails
//! here with the first invocations that differ.
//!
//! Covers: SPEC §2, §2.1, §2.2, §2.3, §2.4, §2.5, §2.6, §2.7, §2.8, §3, §4, §8.
//!
//! **Stores.** `file_store` (the default store of a real temporary git
//! repository), `git_store` (a local bare remote, `SKILL_LOCK_CLOCK_SKEW=0`)
//! and `etcd_store` (under a prefix of its own on `SKILL_LOCK_TEST_ETCD`;
//! skipped visibly without it, a failure under `SKILL_LOCK_TEST_ETCD_REQUIRED`).
//!
//! **Expectations** live in `tests/corpus/PLATFORM-STORE.txt`, one block per
//! invocation. `SKILL_LOCK_CORPUS_RECORD=1 cargo test --test integration
//! corpus::` (re)writes them; without it each test compares and fails with
//! the first differing blocks side by side.
//!
//! **Another binary.** `SKILL_LOCK_CORPUS_EXE` (a path) replaces the binary
//! under test, started through `SKILL_LOCK_CORPUS_WRAPPER` when that is set
//! (`/usr/lib/wine/wine64`). An `.exe` is the Windows build: it is compared
//! with the `windows-*.txt` files, and there, explicitly, the git store is
//! skipped (no Windows git under wine), `--owner-pid` of a live or killed
//! process and a CMD killed by a signal are left out (a Linux pid or a POSIX
//! signal means nothing to it), and CMDs run through `cmd /c`. Each left-out
//! scenario says so in the file, as a `# windows: ...` line.
//!
//! **Normalization** (what is filtered, everything else is kept byte for
//! byte, fields in their order):
//! - values by field name: `token` → `<token:N>` (N counts the tokens in the
//!   order they were first printed; a token passed back on a later command
//!   line shows the same name); `started`, `expires`, `renewed`, `time` →
//!   `<time>`; `expires_in` → `<secs>`; `host` → `<host>`; `pid`,
//!   `owner_pid`, `owner_pgid` → `<pid>`; `boot_id` → `<boot-id>`;
//!   `machine` → `<machine-id>`; `pid_ns`, `time_ns` → `<ns>`;
//!   `pid_ns_start`, `owner_start`, `group_start` → `<start>`;
//!   `deadline_boot_ms` → `<ms>`. A `null` stays `null`.
//! - etcd fences (cluster revisions, which other clients move) →
//!   `<fence:N>` in the order first printed, in outputs and `--since`
//!   arguments alike; file and git fences are kept.
//! - in every string, output line and argument: the test's temporary
//!   directory → `<tmp>` (also as wine shows it, `Z:\...`), the binary →
//!   `<bin>`, the etcd endpoints → `<etcd>`, the etcd prefix → `<prefix>`.
//! - output that is not JSON (CMD's, `--version`): kept line by line, a
//!   carriage return ending a line dropped (cmd.exe's `echo`); more than
//!   20 lines (`--help`, completions) are kept as their line count and
//!   SHA-256.
//! - through a wrapper (wine), the wrapper's own lines on stderr (`wine: ...`,
//!   `0024:fixme:...`) are dropped: wine reports crashes of its own code at
//!   a process's exit now and then, whatever the binary did.
//!
//! **Streams.** Each invocation records its exit status, then every line of
//! stdout and of stderr: a line that is a JSON object as `stdout {...}` /
//! `stderr {...}` (normalized), any other line as `stdout| ...` /
//! `stderr| ...`. Stderr is kept whole because the contract gives it
//! meaning for `run` (its object is the last line) and a command's own
//! diagnostics must not change either; every scenario here is chosen so
//! that stderr is deterministic.
//!
//! **Command lines** are shown as a shell would take them (`cd DIR && `
//! when not run in the project, `NAME=value` for a scenario's variable,
//! quoted where needed, an argument over 60 bytes by its length, a pid
//! started here as `<pid>`). Each runs with a cleared environment: PATH
//! (less any directory holding a `skill-lock`, so a hint names `<bin>`),
//! wine's `WINE*` variables, the store's and the scenario's variables.
//!
//! **Timing.** No scenario races: leases that must run out are granted 2 s
//! (what every store grants exactly) and then waited out with a margin
//! (5 s, once per store); `--wait 1` on a lock held throughout.

use crate::harness;

use harness::TestEnv;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use sha2::Digest;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The skill and repository of the main scenario.
const SKILL: &str = "issue-triage";
const REPO: &str = "apache/airflow";
/// A well-formed token that holds nothing.
const WRONG: &str = "0123456789abcdef0123456789abcdef";
#[test]
fn file_store() {
    replay(Store::File);
}

#[test]
fn git_store() {
    replay(Store::Git);
}

#[test]
fn etcd_store() {
    replay(Store::Etcd);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    File,
    Git,
    Etcd,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Git => "git",
            Self::Etcd => "etcd",
        }
    }
}

/// The binary under test: this build's, or `SKILL_LOCK_CORPUS_EXE`
/// (through `SKILL_LOCK_CORPUS_WRAPPER`).
struct Target {
    exe: PathBuf,
    wrapper: Option<PathBuf>,
    windows: bool,
}

impl Target {
    fn from_env() -> Self {
        let exe = std::env::var_os("SKILL_LOCK_CORPUS_EXE")
            .filter(|v| !v.is_empty())
            .map(|p| std::fs::canonicalize(&p).unwrap_or_else(|e| panic!("{p:?}: {e}")))
            .unwrap_or_else(|| PathBuf::from(harness::BIN));
        let wrapper = std::env::var_os("SKILL_LOCK_CORPUS_WRAPPER")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let windows = exe
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("exe"));
        Self {
            exe,
            wrapper,
            windows,
        }
    }

    fn platform(&self) -> &'static str {
        if self.windows { "windows" } else { "linux" }
    }

    /// A command starting the binary, with a cleared environment but for
    /// PATH and wine's own variables.
    fn command(&self) -> Command {
        let mut cmd = match &self.wrapper {
            Some(w) => {
                let mut c = Command::new(w);
                c.arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        cmd.env_clear();
        for (k, v) in std::env::vars_os() {
            if k == "PATH" {
                // No `skill-lock` on PATH: a hint names the binary by its
                // path (<bin>), whatever the machine has installed.
                let dirs = std::env::split_paths(&v).filter(|d| !d.join("skill-lock").exists());
                cmd.env(k, std::env::join_paths(dirs).unwrap_or(v));
            } else if k.to_string_lossy().starts_with("WINE") {
                cmd.env(k, v);
            }
        }
        cmd
    }

    /// Starts the binary once through its wrapper with no standard streams:
    /// what the wrapper leaves running (wine's services) then holds no pipe
    /// of a recorded invocation open, which would make each one wait for it
    /// to exit. (Under wine, start `wineserver -p` first, as
    /// `scripts/cross-build` does, so they stay up between invocations.)
    fn warm_up(&self) {
        if self.wrapper.is_some() {
            let _ = self
                .command()
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }

    /// The binary as a CMD of `run` sees it (wine: its `Z:` drive).
    fn inside(&self) -> String {
        let unix = self.exe.display().to_string();
        if self.windows {
            format!("Z:{}", unix.replace('/', "\\"))
        } else {
            unix
        }
    }
}

fn replay(store: Store) {
    let target = Target::from_env();
    let test = format!("corpus::{}_store", store.name());
    if target.windows && store == Store::Git {
        eprintln!(
            "SKIPPED: {test} under wine: the Windows build runs git.exe, which wine does not have"
        );
        return;
    }
    let etcd = match store {
        Store::Etcd => match harness::etcd_endpoints(&test) {
            Some(e) => Some(e),
            None => return,
        },
        _ => None,
    };
    target.warm_up();
    let started = Instant::now();
    let mut w = World::new(target, store, etcd);
    scenarios(&mut w);
    let took = started.elapsed();
    eprintln!(
        "corpus {}-{}: {} invocations in {:.1} s",
        w.target.platform(),
        store.name(),
        w.count,
        took.as_secs_f64()
    );
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(format!("{}-{}.txt", w.target.platform(), store.name()));
    let record =
        std::env::var_os("SKILL_LOCK_CORPUS_RECORD").is_some_and(|v| !v.is_empty() && v != "0");
    if record {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, &w.text).unwrap();
        eprintln!("recorded {}", file.display());
        return;
    }
    let want = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; record it with SKILL_LOCK_CORPUS_RECORD=1 cargo test --test integration corpus::",
            file.display()
        )
    });
    if let Some(diff) = first_differences(&want, &w.text) {
        panic!(
            "{test}: the behaviour differs from {} (re-record with SKILL_LOCK_CORPUS_RECORD=1 only when the change is meant):\n{diff}",
            file.display()
        );
    }
}

/// Up to three invocation blocks that differ, expected then actual, or
/// `None` when the transcripts are the same.
fn first_differences(want: &str, got: &str) -> Option<String> {
    if want == got {
        return None;
    }
    let blocks = |s: &str| -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for line in s.lines() {
            if line.starts_with("## ") || out.is_empty() {
                out.push(String::new());
            }
            let last = out.last_mut().unwrap();
            last.push_str(line);
            last.push('\n');
        }
        out
    };
    let (want, got) = (blocks(want), blocks(got));
    let mut report = String::new();
    let mut shown = 0;
    for i in 0..want.len().max(got.len()) {
        let (a, b) = (want.get(i), got.get(i));
        if a == b {
            continue;
        }
        let a = a.map_or("(none)\n", String::as_str);
        let b = b.map_or("(none)\n", String::as_str);
        let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
        let _ = writeln!(report, "--- expected\n+++ actual");
        for j in 0..la.len().max(lb.len()) {
            match (la.get(j), lb.get(j)) {
                (Some(x), Some(y)) if x == y => {
                    let _ = writeln!(report, "  {x}");
                }
                (x, y) => {
                    if let Some(x) = x {
                        let _ = writeln!(report, "- {x}");
                    }
                    if let Some(y) = y {
                        let _ = writeln!(report, "+ {y}");
                    }
                    if let (Some(x), Some(y)) = (x, y) {
                        let _ = writeln!(report, "{}", where_they_differ(x, y));
                    }
                }
            }
        }
        shown += 1;
        if shown == 3 {
            let _ = writeln!(report, "(further differences not shown)");
            break;
        }
    }
    Some(report)
}

/// Where two long lines part: the text around their first difference.
fn where_they_differ(x: &str, y: &str) -> String {
    let at = x
        .char_indices()
        .zip(y.chars())
        .find(|((_, a), b)| a != b)
        .map_or(x.len().min(y.len()), |((i, _), _)| i);
    let around = |s: &str| -> String {
        let from = (0..=at.saturating_sub(40).min(s.len()))
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        let to = ((at + 40).min(s.len())..=s.len())
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(s.len());
        s[from..to].to_owned()
    };
    format!(
        "  (they part at byte {at}: expected …{}… actual …{}…)",
        around(x),
        around(y)
    )
}

/// One store's run of the scenarios, and its transcript.
struct World {
    _env: TestEnv,
    target: Target,
    store: Store,
    /// The project (a real git repository) every command runs in.
    repo: PathBuf,
    /// A folder with no project marker.
    plain: PathBuf,
    /// The store's variables, on every command.
    vars: Vec<(&'static str, OsString)>,
    /// Literal text → placeholder, longest literal first.
    subs: Vec<(String, String)>,
    tokens: Vec<String>,
    fences: Vec<u64>,
    /// Pids of processes started here, shown as `<pid>` in arguments.
    pids: Vec<String>,
    text: String,
    count: usize,
}

/// What one invocation printed, kept for the scenarios that read a reply.
struct Ran {
    out: harness::Out,
}

impl Ran {
    /// The token of an `acquired` reply.
    fn token(&self) -> String {
        self.out.reply().token().to_owned()
    }

    /// The fence of a reply on stdout that carries one.
    fn fence(&self) -> u64 {
        self.out
            .reply()
            .fence()
            .unwrap_or_else(|| panic!("no fence: {}", self.out.stdout))
    }
}

impl World {
    fn new(target: Target, store: Store, etcd: Option<String>) -> Self {
        let env = TestEnv::new();
        let repo = env.git_repo("repo");
        let plain = env.dir("plain");
        let mut vars: Vec<(&'static str, OsString)> = Vec::new();
        let mut subs: Vec<(String, String)> = Vec::new();
        let mut header = String::new();
        match store {
            Store::File => {
                header.push_str("# store: file (the default: the personal layer of <tmp>/repo, a git repository)\n");
            }
            Store::Git => {
                let remote = harness::gitd::bare_repo(&env.path("remote.git"));
                vars.push((
                    "SKILL_LOCK_STORE",
                    format!("git:file://{}", remote.display()).into(),
                ));
                vars.push(("SKILL_LOCK_GIT_CACHE", env.path("cache").into()));
                vars.push(("SKILL_LOCK_CLOCK_SKEW", "0".into()));
                header.push_str("# store: SKILL_LOCK_STORE=git:file://<tmp>/remote.git (a bare repository), SKILL_LOCK_GIT_CACHE=<tmp>/cache, SKILL_LOCK_CLOCK_SKEW=0\n");
            }
            Store::Etcd => {
                let eps = etcd.unwrap_or_default();
                let prefix = format!(
                    "corpus-{}-{}",
                    std::process::id(),
                    env.root
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .trim_start_matches('.')
                );
                vars.push(("SKILL_LOCK_STORE", format!("etcd://{eps}/{prefix}/").into()));
                subs.push((eps, "<etcd>".into()));
                subs.push((prefix, "<prefix>".into()));
                header.push_str("# store: SKILL_LOCK_STORE=etcd://<etcd>/<prefix>/ (a prefix of this run's own)\n");
            }
        }
        let root = env.root.display().to_string();
        let bin = target.exe.display().to_string();
        for (text, to) in [(bin, "<bin>"), (root, "<tmp>")] {
            let win = format!("Z:{}", text.replace('/', "\\"));
            subs.push((format!("\\\\?\\{win}"), to.into()));
            subs.push((win.clone(), to.into()));
            subs.push((win.to_lowercase(), to.into()));
            subs.push((text, to.into()));
        }
        subs.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
        let mut text = String::new();
        let _ = writeln!(
            text,
            "# skill-lock behaviour corpus: {}, {} store (tests/integration/corpus.rs).",
            target.platform(),
            store.name()
        );
        text.push_str("# Recorded by SKILL_LOCK_CORPUS_RECORD=1 cargo test --test integration corpus::; compared otherwise.\n");
        text.push_str(
            "# Normalization and stream rules: the module doc of tests/integration/corpus.rs.\n",
        );
        text.push_str(&header);
        Self {
            _env: env,
            target,
            store,
            repo,
            plain,
            vars,
            subs,
            tokens: Vec::new(),
            fences: Vec::new(),
            pids: Vec::new(),
            text,
            count: 0,
        }
    }

    fn etcd(&self) -> bool {
        self.store == Store::Etcd
    }

    fn windows(&self) -> bool {
        self.target.windows
    }

    /// A comment line in the transcript (a section, or a scenario left out).
    fn note(&mut self, line: &str) {
        let _ = writeln!(self.text, "\n# {line}");
    }

    /// Runs `line` (its arguments split on spaces) in the project.
    fn c(&mut self, label: &str, line: &str) -> Ran {
        let args: Vec<&str> = line.split_whitespace().collect();
        self.call_in(label, None, &[], &args)
    }

    /// Runs `line` (split on spaces) in the project with `env` added.
    fn c_env(&mut self, label: &str, env: &[(&str, &str)], line: &str) -> Ran {
        let args: Vec<&str> = line.split_whitespace().collect();
        self.call_in(label, None, env, &args)
    }

    /// Runs `line` (split on spaces) in `cwd`.
    fn c_in(&mut self, label: &str, cwd: &Path, line: &str) -> Ran {
        let args: Vec<&str> = line.split_whitespace().collect();
        self.call_in(label, Some(cwd), &[], &args)
    }

    /// Runs `args` in the project.
    fn call_owned(&mut self, label: &str, args: &[String]) -> Ran {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.call_in(label, None, &[], &args)
    }

    /// Runs `args` in the project.
    fn call(&mut self, label: &str, args: &[&str]) -> Ran {
        self.call_in(label, None, &[], args)
    }

    /// Runs `args` in `cwd` (the project when `None`) with `env` added,
    /// and writes its block.
    fn call_in(
        &mut self,
        label: &str,
        cwd: Option<&Path>,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Ran {
        let mut cmd = self.target.command();
        cmd.current_dir(cwd.unwrap_or(&self.repo));
        for (k, v) in &self.vars {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.args(args).stdin(Stdio::null());
        let began = Instant::now();
        let output = cmd.output().expect("the binary runs");
        let took = began.elapsed();
        if took > Duration::from_secs(2) {
            eprintln!(
                "corpus: #{} ({label}) took {:.1} s",
                self.count + 1,
                took.as_secs_f64()
            );
        }
        let out = harness::Out::from(output);
        self.count += 1;
        let mut line = String::new();
        if let Some(dir) = cwd {
            let _ = write!(line, "cd {} && ", self.arg(&dir.display().to_string()));
        }
        for (k, v) in env {
            let _ = write!(line, "{k}={} ", self.arg(v));
        }
        line.push_str("skill-lock");
        let mut previous = "";
        for a in args {
            let shown = match previous {
                "--since" => self.fence_arg(a),
                "--owner-pid" if self.pids.iter().any(|p| p == a) => "<pid>".to_owned(),
                _ => self.arg(a),
            };
            previous = a;
            let _ = write!(line, " {shown}");
        }
        let _ = write!(
            self.text,
            "\n## {} {label}\n$ {line}\nexit {}\n",
            self.count, out.code
        );
        let (stdout, stderr) = (out.stdout.clone(), out.stderr.clone());
        self.stream("stdout", &stdout);
        self.stream("stderr", &stderr);
        Ran { out }
    }

    /// Takes the lock with `args` (an `acquire` that must succeed) and
    /// returns its token and fence.
    fn acquire(&mut self, label: &str, args: &[&str]) -> (String, u64) {
        let r = self.call(label, args);
        (r.token(), r.fence())
    }

    /// The `fence` that `status` of `skill` shows now (not recorded: the
    /// transcript already has it).
    fn fence_now(&mut self, skill: &str) -> u64 {
        let mut cmd = self.target.command();
        cmd.current_dir(&self.repo);
        for (k, v) in &self.vars {
            cmd.env(k, v);
        }
        let out = harness::Out::from(
            cmd.args(["status", skill, "--repo", REPO])
                .stdin(Stdio::null())
                .output()
                .expect("the binary runs"),
        );
        out.reply().fence().expect("status shows a fence")
    }

    /// Waits out the short leases, saying so in the transcript.
    fn sleep(&mut self, secs: u64, why: &str) {
        let _ = writeln!(self.text, "\n# (sleep {secs} s: {why})");
        std::thread::sleep(Duration::from_secs(secs));
    }

    fn stream(&mut self, name: &str, text: &str) {
        if text.is_empty() {
            return;
        }
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() > 20 {
            let sum = sha2::Sha256::digest(text.as_bytes());
            let hex: String = sum.iter().map(|b| format!("{b:02x}")).collect();
            let _ = writeln!(self.text, "{name}: {} lines, sha256 {hex}", lines.len());
            return;
        }
        for raw in lines {
            let raw = raw.strip_suffix('\r').unwrap_or(raw);
            if self.target.wrapper.is_some() && wrapper_noise(raw) {
                continue;
            }
            let line = match serde_json::from_str::<J>(raw) {
                Ok(mut j @ J::Obj(_)) => {
                    self.norm(&mut j, None);
                    format!("{name} {}", j.render())
                }
                _ => format!("{name}| {}", self.subst(raw)),
            };
            self.text.push_str(&line);
            self.text.push('\n');
        }
        if !text.ends_with('\n') {
            let _ = writeln!(self.text, "{name}: (no newline at the end)");
        }
    }

    /// `s` with every literal of [`Self::subs`] and every token replaced.
    fn subst(&self, s: &str) -> String {
        let mut s = s.to_owned();
        for (from, to) in &self.subs {
            if s.contains(from.as_str()) {
                s = s.replace(from.as_str(), to);
            }
        }
        for (i, t) in self.tokens.iter().enumerate() {
            if s.contains(t.as_str()) {
                s = s.replace(t.as_str(), &format!("<token:{i}>"));
            }
        }
        s
    }

    /// An argument as the transcript shows it: normalized, quoted when a
    /// shell would need it, long ones by their length.
    fn arg(&self, a: &str) -> String {
        if a.len() > 60 {
            let first = a.chars().next().unwrap_or(' ');
            return format!("<{} bytes of {first:?}>", a.len());
        }
        let a = self.subst(a);
        let plain = !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/:=@%<>,+".contains(c));
        if plain {
            return a;
        }
        if a.chars().all(|c| !c.is_control()) && !a.contains('\'') {
            return format!("'{a}'");
        }
        format!("{a:?}")
    }

    /// A `--since` argument: an etcd fence by its name.
    fn fence_arg(&mut self, a: &str) -> String {
        match a.parse::<u64>() {
            Ok(f) if self.etcd() && f != 0 => self.fence_name(f),
            _ => self.arg(a),
        }
    }

    fn fence_name(&mut self, f: u64) -> String {
        let i = match self.fences.iter().position(|x| *x == f) {
            Some(i) => i,
            None => {
                self.fences.push(f);
                self.fences.len() - 1
            }
        };
        format!("<fence:{i}>")
    }

    /// Normalizes `j`, the value of field `key`, in place.
    fn norm(&mut self, j: &mut J, key: Option<&str>) {
        let placeholder = match (key, &*j) {
            (_, J::Null) => None,
            (Some("token"), J::Str(t)) => {
                if !self.tokens.contains(t) {
                    self.tokens.push(t.clone());
                }
                None
            }
            (Some("started" | "expires" | "renewed" | "time"), J::Str(_)) => Some("<time>"),
            (Some("expires_in"), _) => Some("<secs>"),
            (Some("host"), _) => Some("<host>"),
            (Some("pid" | "owner_pid" | "owner_pgid"), _) => Some("<pid>"),
            (Some("boot_id"), _) => Some("<boot-id>"),
            (Some("machine"), _) => Some("<machine-id>"),
            (Some("pid_ns" | "time_ns"), _) => Some("<ns>"),
            (Some("pid_ns_start" | "owner_start" | "group_start"), _) => Some("<start>"),
            (Some("deadline_boot_ms"), _) => Some("<ms>"),
            _ => None,
        };
        if let Some(p) = placeholder {
            *j = J::Str(p.to_owned());
            return;
        }
        match j {
            J::Num(n) if key == Some("fence") && self.etcd() => {
                if let Ok(f) = n.parse::<u64>() {
                    *j = J::Str(self.fence_name(f));
                }
            }
            J::Str(s) => *s = self.subst(s),
            J::Arr(items) => {
                for item in items {
                    self.norm(item, None);
                }
            }
            J::Obj(fields) => {
                for (k, v) in fields.iter_mut() {
                    self.norm(v, Some(k.as_str()));
                }
            }
            _ => {}
        }
    }
}

/// A line the wrapper printed, not the binary: wine's own diagnostics
/// (`wine: ...`, `0024:fixme:...`), such as its report of a crash in its
/// own code at a process's exit, which comes and goes from run to run.
fn wrapper_noise(line: &str) -> bool {
    let channel = line.get(4..).is_some_and(|rest| {
        line.as_bytes()[..4].iter().all(u8::is_ascii_hexdigit)
            && ["fixme:", "err:", "warn:", "trace:"]
                .iter()
                .any(|c| rest.starts_with(&format!(":{c}")))
    });
    line.starts_with("wine: ") || channel
}

/// A JSON value that keeps its fields in their order (serde_json's `Value`
/// sorts them without its `preserve_order` feature, and field order is part
/// of the wire format).
#[derive(Debug, Clone)]
enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    /// Compact JSON, fields in their order.
    fn render(&self) -> String {
        match self {
            Self::Null => "null".into(),
            Self::Bool(b) => b.to_string(),
            Self::Num(n) => n.clone(),
            Self::Str(s) => serde_json::to_string(s).unwrap(),
            Self::Arr(items) => {
                let inner: Vec<String> = items.iter().map(Self::render).collect();
                format!("[{}]", inner.join(","))
            }
            Self::Obj(fields) => {
                let inner: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).unwrap(), v.render()))
                    .collect();
                format!("{{{}}}", inner.join(","))
            }
        }
    }
}

impl<'de> serde::Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = J;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_none<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<J, E> {
                Ok(J::Bool(b))
            }
            fn visit_u64<E>(self, n: u64) -> Result<J, E> {
                Ok(J::Num(n.to_string()))
            }
            fn visit_i64<E>(self, n: i64) -> Result<J, E> {
                Ok(J::Num(n.to_string()))
            }
            fn visit_f64<E>(self, n: f64) -> Result<J, E> {
                Ok(J::Num(n.to_string()))
            }
            fn visit_str<E>(self, s: &str) -> Result<J, E> {
                Ok(J::Str(s.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = a.next_element()? {
                    items.push(item);
                }
                Ok(J::Arr(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut fields = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, J>()? {
                    fields.push((k, v));
                }
                Ok(J::Obj(fields))
            }
        }
        d.deserialize_any(V)
    }
}

/// The scenario set, in order.
fn scenarios(w: &mut World) {
    whole_cycle(w);
    since_and_force(w);
    waits_and_notes(w);
    owner_pid(w);
    expiry(w);
    run(w);
    roots(w);
    usage(w);
}

/// One lock through every command, every answer of each.
fn whole_cycle(w: &mut World) {
    let l = format!("{SKILL} --repo {REPO}");
    let empty = [("SKILL_LOCK_TOKEN", "")];
    w.note("the whole cycle of one lock");
    w.c(
        "status: never acquired: free, fence null",
        &format!("status {l}"),
    );
    w.c("list: an empty store", "list");
    w.c("history: an empty store", "history");
    let args = [
        "acquire",
        SKILL,
        "--repo",
        REPO,
        "--ttl",
        "600",
        "--note",
        "first run",
    ];
    let (t1, _) = w.acquire("acquire: a free lock, --ttl and --note", &args);
    w.c("acquire: held by another run", &format!("acquire {l}"));
    w.c(
        "acquire: the same lock spelled otherwise (case, .git)",
        "acquire Issue-Triage --repo Apache/Airflow.git",
    );
    w.c("status: held", &format!("status {l}"));
    w.c(
        "check: the holder's token",
        &format!("check {l} --token {t1}"),
    );
    let env = [("SKILL_LOCK_TOKEN", t1.as_str())];
    w.c_env(
        "check: the token in SKILL_LOCK_TOKEN",
        &env,
        &format!("check {l}"),
    );
    w.c_env(
        "check: --token wins over SKILL_LOCK_TOKEN",
        &[("SKILL_LOCK_TOKEN", WRONG)],
        &format!("check {l} --token {t1}"),
    );
    w.c(
        "check: another token",
        &format!("check {l} --token {WRONG}"),
    );
    w.c("check: no token", &format!("check {l}"));
    w.c_env(
        "check: SKILL_LOCK_TOKEN set but empty",
        &empty,
        &format!("check {l}"),
    );
    w.c(
        "renew: the holder's token, a new --ttl",
        &format!("renew {l} --token {t1} --ttl 900"),
    );
    w.c(
        "renew: another token",
        &format!("renew {l} --token {WRONG}"),
    );
    w.c_env(
        "renew: SKILL_LOCK_TOKEN set but empty",
        &empty,
        &format!("renew {l}"),
    );
    w.c("renew: no token is refused", &format!("renew {l}"));
    w.c(
        "renew --force: renews whoever holds it",
        &format!("renew {l} --force"),
    );
    w.c(
        "release: another token is refused",
        &format!("release {l} --token {WRONG}"),
    );
    w.c_env(
        "release: SKILL_LOCK_TOKEN set but empty",
        &empty,
        &format!("release {l}"),
    );
    w.c("list: one lock held", "list");
    w.c("history: the store's events so far", "history");
    w.c(
        "release: the holder's token",
        &format!("release {l} --token {t1}"),
    );
    w.c("release: a free lock", &format!("release {l}"));
    w.c("check: a released lock", &format!("check {l} --token {t1}"));
    w.c("renew: a released lock", &format!("renew {l} --token {t1}"));
    w.c("renew: a free lock, no token", &format!("renew {l}"));
    w.c("status: free, the fence remembered", &format!("status {l}"));
    w.c("list: no lock held", "list");
}

/// `--since`, `--force`, and the token from the environment.
fn since_and_force(w: &mut World) {
    let l = format!("{SKILL} --repo {REPO}");
    w.note("acquire --since, release --force, SKILL_LOCK_TOKEN");
    let f1 = w.fence_now(SKILL);
    w.c(
        "acquire --since the fence status showed: nobody came in between",
        &format!("acquire {l} --since {f1}"),
    );
    w.c(
        "release --force with another token",
        &format!("release {l} --token {WRONG} --force"),
    );
    let t3 = w.c(
        "acquire --since an older fence: another acquisition came in between",
        &format!("acquire {l} --since {f1}"),
    );
    let t3 = t3.token();
    w.c(
        "release --force while held, no token",
        &format!("release {l} --force"),
    );
    w.c(
        "release --force of a free lock",
        &format!("release {l} --force"),
    );
    let t4 = w
        .c("acquire --since 0", &format!("acquire {l} --since 0"))
        .token();
    let env = [("SKILL_LOCK_TOKEN", t4.as_str())];
    w.c_env(
        "release: the token in SKILL_LOCK_TOKEN",
        &env,
        &format!("release {l}"),
    );
    w.c(
        "release: an old token of a free lock",
        &format!("release {l} --token {t3}"),
    );
    w.c(
        "acquire --since null, a fresh lock",
        &format!("acquire fresh --repo {REPO} --since null"),
    );
    w.c("release: no token", &format!("release fresh --repo {REPO}"));
    w.c("history of one lock", &format!("history {l}"));
    w.c("history --limit 2", &format!("history {l} --limit 2"));
    w.c("history --limit 0", &format!("history {l} --limit 0"));
}

/// `--wait`, `--note` and `--ttl` at their bounds.
fn waits_and_notes(w: &mut World) {
    let l = format!("sweep --repo {REPO}");
    w.note("acquire --wait, --note, --ttl bounds");
    let t = w
        .c(
            "acquire --wait 0 of a free lock",
            &format!("acquire {l} --wait 0"),
        )
        .token();
    w.c(
        "acquire --wait 0 of a held lock",
        &format!("acquire {l} --wait 0"),
    );
    w.c(
        "acquire --wait 1 of a lock held throughout",
        &format!("acquire {l} --wait 1"),
    );
    w.c("release", &format!("release {l} --token {t}"));
    let note = "tab\there, é ✓";
    let args = [
        "acquire", "notes", "--repo", REPO, "--ttl", "2592000", "--note", note,
    ];
    w.call(
        "acquire: the longest --ttl, a --note with a tab and UTF-8",
        &args,
    );
    w.c("status", &format!("status notes --repo {REPO}"));
    w.c("release: no token", &format!("release notes --repo {REPO}"));
}

/// `--owner-pid` of a live process, then of the same one killed.
fn owner_pid(w: &mut World) {
    let l = format!("owned --repo {REPO}");
    w.note("acquire --owner-pid");
    if w.windows() {
        w.note("windows: --owner-pid of a live and of a killed process left out (a Linux pid is no Windows process)");
        return;
    }
    let mut child = Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep runs");
    let pid = child.id().to_string();
    w.pids.push(pid.clone());
    w.c(
        "acquire --owner-pid of a live process",
        &format!("acquire {l} --owner-pid {pid}"),
    );
    w.c(
        "acquire: held while its owner lives",
        &format!("acquire {l}"),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    w.c("status: its owner is dead", &format!("status {l}"));
    w.c(
        "check: another token, the owner dead",
        &format!("check {l} --token {WRONG}"),
    );
    let t = w
        .c(
            "acquire: takes over from a dead owner",
            &format!("acquire {l}"),
        )
        .token();
    w.c("history: took_over owner_dead", &format!("history {l}"));
    w.c("release", &format!("release {l} --token {t}"));
}

/// Leases of 2 s run out: status, check, renew, takeover, the old token.
fn expiry(w: &mut World) {
    let r = REPO;
    w.note("expired leases (--ttl 2, waited out)");
    let acquire = "acquire --ttl 2";
    let old = w
        .c(
            acquire,
            &format!("acquire expiring --repo {r} --ttl 2 --note old"),
        )
        .token();
    let renewing = w
        .c(acquire, &format!("acquire renewing --repo {r} --ttl 2"))
        .token();
    let checking = w
        .c(acquire, &format!("acquire checking --repo {r} --ttl 2"))
        .token();
    w.sleep(5, "the 2 s leases run out");
    w.c("status: expired", &format!("status expiring --repo {r}"));
    w.c("list: the expired locks", "list");
    w.c(
        "check: the holder's token, expired",
        &format!("check checking --repo {r} --token {checking}"),
    );
    w.c(
        "renew: the holder's token, expired, nobody took over",
        &format!("renew renewing --repo {r} --token {renewing}"),
    );
    w.c(
        "acquire: takes over an expired lock",
        &format!("acquire expiring --repo {r} --note new"),
    );
    w.c(
        "renew: the old token",
        &format!("renew expiring --repo {r} --token {old}"),
    );
    w.c(
        "check: the old token",
        &format!("check expiring --repo {r} --token {old}"),
    );
    w.c(
        "release: the old token",
        &format!("release expiring --repo {r} --token {old}"),
    );
    w.c(
        "history: the takeover",
        &format!("history expiring --repo {r}"),
    );
    w.c(
        "release --force",
        &format!("release expiring --repo {r} --force"),
    );
    w.c("release: no token", &format!("release renewing --repo {r}"));
    w.c(
        "release: the expired holder's token",
        &format!("release checking --repo {r} --token {checking}"),
    );
}

/// The CMDs of `run` on this platform: one that succeeds and shows it
/// has its token, one that fails (exit 7), one that prints `--since`'s
/// answer.
fn cmds(windows: bool) -> [Vec<&'static str>; 3] {
    if windows {
        [
            vec![
                "cmd",
                "/c",
                "echo inside & if defined SKILL_LOCK_TOKEN echo token-set",
            ],
            vec!["cmd", "/c", "exit 7"],
            vec!["cmd", "/c", "echo others_since=%SKILL_LOCK_OTHERS_SINCE%"],
        ]
    } else {
        [
            vec![
                "sh",
                "-c",
                "echo inside; test -n \"$SKILL_LOCK_TOKEN\" && echo token-set",
            ],
            vec!["sh", "-c", "echo to-stderr >&2; exit 7"],
            vec!["sh", "-c", "echo \"others_since=$SKILL_LOCK_OTHERS_SINCE\""],
        ]
    }
}

/// `run`: a CMD that succeeds, fails, is killed, reads `--since`; held; errors.
fn run(w: &mut World) {
    let l = format!("runner --repo {REPO}");
    w.note("run");
    let [ok, fails, since] = cmds(w.windows());
    let run = |head: &str, cmd: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = head.split_whitespace().map(str::to_owned).collect();
        args.push("--".into());
        args.extend(cmd.iter().map(|s| (*s).to_owned()));
        args
    };
    w.call_owned(
        "run: CMD succeeds, sees its token",
        &run(&format!("run {l} --ttl 60 --note run"), &ok),
    );
    w.call_owned("run: CMD fails (exit 7)", &run(&format!("run {l}"), &fails));
    if w.windows() {
        w.note("windows: a CMD killed by a signal left out (no POSIX signals)");
    } else {
        w.call_owned(
            "run: CMD killed by SIGTERM",
            &run(&format!("run {l}"), &["sh", "-c", "kill -TERM $$"]),
        );
    }
    let inner = w.target.inside();
    let check = format!("{inner} check {l}");
    let check: Vec<&str> = check.split_whitespace().collect();
    w.call_owned(
        "run: CMD checks the lock with the token run gave it",
        &run(&format!("run {l}"), &check),
    );
    let status = format!("{inner} status {l}");
    let status: Vec<&str> = status.split_whitespace().collect();
    w.call_owned(
        "run: CMD sees the lock held by run",
        &run(&format!("run {l}"), &status),
    );
    let f = w.fence_now("runner");
    let label = "run --since: CMD sees SKILL_LOCK_OTHERS_SINCE";
    w.call_owned(
        &format!("{label} (the latest fence)"),
        &run(&format!("run {l} --since {f}"), &since),
    );
    w.call_owned(
        &format!("{label} (0)"),
        &run(&format!("run {l} --since 0"), &since),
    );
    w.c("status: free after run", &format!("status {l}"));
    let t = w.c("acquire", &format!("acquire {l}")).token();
    w.call_owned(
        "run: held by another: CMD not run",
        &run(&format!("run {l}"), &ok),
    );
    w.c("release", &format!("release {l} --token {t}"));
    let missing = "no-such-program-corpus";
    w.c(
        "run: a CMD that does not exist",
        &format!("run {l} -- {missing}"),
    );
    w.c("run: no CMD", &format!("run {l}"));
    w.c("run: a bad --ttl", &format!("run {l} --ttl 0 -- {missing}"));
    w.call(
        "run: a bad skill",
        &["run", "bad skill", "--repo", REPO, "--", missing],
    );
    w.c(
        "run: an unknown flag",
        &format!("run {l} --bogus -- {missing}"),
    );
    w.c("history of run's lock", &format!("history {l}"));
}

/// `--root`, and a directory that is no project.
fn roots(w: &mut World) {
    let l = format!("{SKILL} --repo {REPO}");
    w.note("--root and the project root");
    let sub = w.repo.join("sub/dir");
    std::fs::create_dir_all(&sub).unwrap();
    let plain = w.plain.clone();
    let (repo, gone) = (w.repo.display().to_string(), plain.join("gone"));
    let status = format!("status {l}");
    w.c_in("status from a folder below the checkout", &sub, &status);
    w.c_in(
        "status --root the checkout, from a folder that is no project",
        &plain,
        &format!("{status} --root {repo}"),
    );
    w.c_in("status from a folder that is no project", &plain, &status);
    let gone = format!("{status} --root {}", gone.display());
    w.c("status --root of a folder that does not exist", &gone);
}

/// Usage errors (and the texts): `ARGUMENTS | what it shows`, the
/// arguments split on spaces. 4194305 is a pid that exists nowhere: above
/// Linux's largest pid_max (2^22), and not a multiple of 4 as every Windows
/// pid is.
const USAGE: &str = "\
frob                                                           | an unknown command
--version                                                      | --version
--help                                                         | --help
completions bash                                               | completions bash
completions tcsh                                               | completions of an unknown shell
acquire .hidden --repo apache/airflow                          | acquire: a skill starting with '.'
acquire issue-triage --repo airflow                            | acquire: a repo without '/'
acquire issue-triage --repo a/b/c                              | acquire: a repo of three parts
acquire issue-triage --repo a__b/c                             | acquire: a repo owner with '__'
acquire issue-triage --repo ../c                               | acquire: a repo owner '..'
acquire issue-triage                                           | acquire: no --repo
acquire issue-triage --repo apache/airflow --ttl 0             | acquire: --ttl 0
acquire issue-triage --repo apache/airflow --ttl 2592001       | acquire: --ttl above 30 days
acquire issue-triage --repo apache/airflow --ttl -1            | acquire: --ttl -1
acquire issue-triage --repo apache/airflow --ttl abc           | acquire: --ttl abc
acquire issue-triage --repo apache/airflow --owner-pid 0       | acquire: --owner-pid 0
acquire issue-triage --repo apache/airflow --owner-pid abc     | acquire: --owner-pid abc
acquire issue-triage --repo apache/airflow --owner-pid 4194305 | acquire: --owner-pid of no process
acquire issue-triage --repo apache/airflow --wait abc          | acquire: --wait abc
acquire issue-triage --repo apache/airflow --since abc         | acquire: --since abc
acquire issue-triage --repo apache/airflow --bogus             | acquire: an unknown flag
renew issue-triage --repo apache/airflow --ttl 0               | renew: --ttl 0
renew issue-triage --repo apache/airflow --bogus               | renew: an unknown flag
release issue-triage --repo a/b/c                              | release: a bad repo
release issue-triage --repo apache/airflow --bogus             | release: an unknown flag
status issue-triage                                            | status: no --repo
status issue-triage --repo apache/airflow --bogus              | status: an unknown flag
list extra                                                     | list: an argument
list --bogus                                                   | list: an unknown flag
check issue-triage --repo apache/airflow --bogus               | check: an unknown flag
history --limit abc                                            | history: --limit abc
history issue-triage                                           | history: a skill without --repo
history --bogus                                                | history: an unknown flag
";

/// Every command's usage errors.
fn usage(w: &mut World) {
    w.note("usage errors, per command");
    w.call("no command", &[]);
    for entry in USAGE.lines() {
        let (line, label) = entry.split_once(" | ").expect("ARGUMENTS | what");
        w.c(label, line);
    }
    let long = "x".repeat(1001);
    for (label, args) in [
        (
            "acquire: a bad skill",
            ["acquire", "bad skill", "--repo", REPO].as_slice(),
        ),
        (
            "acquire: a --note with a control character",
            &["acquire", SKILL, "--repo", REPO, "--note", "bell\u{7}"],
        ),
        (
            "acquire: a --note of 1001 bytes",
            &["acquire", SKILL, "--repo", REPO, "--note", &long],
        ),
        (
            "renew: a bad skill",
            &["renew", "bad skill", "--repo", REPO],
        ),
        (
            "status: a bad skill",
            &["status", "bad skill", "--repo", REPO],
        ),
        (
            "check: a bad skill",
            &["check", "bad skill", "--repo", REPO, "--token", WRONG],
        ),
        (
            "history: a bad skill",
            &["history", "bad skill", "--repo", REPO],
        ),
    ] {
        w.call(label, args);
    }
    w.c("list: what is left", "list");
}
