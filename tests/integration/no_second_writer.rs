//! No second writer at the edges (issue 27): an empty `SKILL_LOCK_TOKEN` is
//! a lost token, never "no token" (§2); a result that cannot be written
//! gives its lock back (§3); every valid name works on every command, in
//! every store (§5 "Names", §8); text from a store reaches no terminal as
//! control characters or an extra line (§3, §2.7), and the hint pastes from
//! anywhere for any root and a relative `git:` path (§2.1).
//!
//! Covers: SPEC §2, §2.1, §2.2, §2.7, §3, §5, §8.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::harness::{Cmd, Lock, Reply};
use crate::harness::{Out, TestEnv};

/// The verbs that read a token (and whether forced), each to be run with
/// `SKILL_LOCK_TOKEN` set but empty.
const TOKEN_VERBS: [(&str, bool); 4] = [
    ("renew", false),
    ("check", false),
    ("release", false),
    ("release", true),
];

/// `verb` on `lock`, `--force` when `forced`.
fn token_verb(lock: &Lock, verb: &str, forced: bool) -> Cmd {
    let call = lock.op(verb);
    if forced { call.force() } else { call }
}

/// The lock is still held by `token`'s run, at `fence`, never renewed.
#[track_caller]
fn still_held_by(lock: &Lock, token: &str, fence: u64) {
    assert!(
        matches!(lock.check(token), Reply::Held { fence: f, .. } if f == fence),
        "the first run lost its lock"
    );
    match lock.status() {
        Reply::Status {
            state,
            holder: Some(holder),
            ..
        } => {
            assert_eq!((state.as_str(), holder.fence), ("held", fence));
            assert_eq!(holder.renewed, None, "the lock was renewed");
        }
        other => panic!("not held: {other:?}"),
    }
}

#[test]
fn an_empty_token_variable_is_a_usage_error_that_changes_nothing() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let first = lock.acquire();
    let (token, fence) = (first.token().to_owned(), first.fence().unwrap());
    for (verb, forced) in TOKEN_VERBS {
        let call = token_verb(&lock, verb, forced).env("SKILL_LOCK_TOKEN", "");
        match call.reply() {
            Reply::Error { error, .. } => assert_eq!(error, "usage", "{verb} {forced}"),
            other => panic!("{verb} {forced} with an empty SKILL_LOCK_TOKEN: {other:?}"),
        }
        still_held_by(&lock, &token, fence);
    }
    // `--token ''` answers as an empty variable does (SPEC §2): `usage`,
    // exit 2, never "no token" and never `refused`.
    for (verb, forced) in TOKEN_VERBS {
        let out = token_verb(&lock, verb, forced).token("").run();
        assert_eq!(out.code, 2, "{verb} {forced} --token '': {}", out.stdout);
        match out.reply() {
            Reply::Error { error, .. } => assert_eq!(error, "usage", "{verb} {forced}"),
            other => panic!("{verb} {forced} with --token '': {other:?}"),
        }
        still_held_by(&lock, &token, fence);
    }
    // The real token in the variable still works.
    let out = lock.op("release").env("SKILL_LOCK_TOKEN", &token).reply();
    assert!(matches!(out, Reply::Released { forced: false, .. }));
}

/// `call` run by `sh -c SCRIPT` (which gets BIN and the call's arguments
/// as `$0 "$@"`), so the shell can close or redirect its streams.
fn via_sh(script: &str, call: Cmd) -> Out {
    call.through("sh", &[OsStr::new("-c"), OsStr::new(script)])
        .run()
}

/// The lock is free: the next acquire takes it without a takeover.
#[track_caller]
fn free(lock: &Lock) {
    match lock.acquire() {
        Reply::Acquired {
            took_over, token, ..
        } => {
            assert_eq!(took_over, None, "the lock was still held");
            lock.release(&token);
        }
        other => panic!("the lock is not free: {other:?}"),
    }
}

#[test]
fn an_acquire_whose_result_cannot_be_written_holds_no_lock() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let args = || lock.op("acquire");
    for (how, script) in [
        ("full", r#"exec "$0" "$@" >/dev/full"#),
        ("closed", r#"exec "$0" "$@" >&-"#),
    ] {
        let out = via_sh(script, args());
        assert_eq!(out.code, 2, "{how}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{how}");
        free(&lock);
    }
    // A pipe whose reader left (`true` reads nothing); its status is
    // written to a file, as `set -o pipefail` is not POSIX.
    let status = env.path("status");
    let script = format!(
        r#"trap '' PIPE; {{ "$0" "$@"; echo $? >'{}'; }} | true"#,
        status.display()
    );
    via_sh(&script, args());
    let code = std::fs::read_to_string(&status).unwrap();
    assert_eq!(code.trim(), "2", "an acquire into a closed pipe");
    free(&lock);
    // `>/dev/null` is the caller's choice, not a closed stream.
    let out = via_sh(r#"exec "$0" "$@" >/dev/null"#, args());
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(lock.state(), "held");
}

#[test]
fn an_acquire_that_waited_gives_the_lock_back_when_its_result_is_lost() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let first = lock.op("acquire").ttl(1).reply();
    let fence = first.fence().unwrap();
    // Waits out the first lease, takes the lock over, cannot print it.
    let waiter = lock.op("acquire").wait(20);
    let out = via_sh(r#"exec "$0" "$@" >/dev/full"#, waiter);
    assert_eq!(out.code, 2, "{}", out.stderr);
    match lock.acquire() {
        Reply::Acquired {
            took_over,
            fence: f,
            ..
        } => {
            assert_eq!(took_over, None, "the waiter left the lock held");
            assert!(f > fence + 1, "the waiter never acquired ({f})");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_run_whose_result_cannot_be_written_leaves_no_lock() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let run = || lock.op("run").command(["true"]);
    let out = via_sh(r#"exec "$0" "$@" >&- 2>/dev/full"#, run());
    assert_eq!(out.code, 2, "{}", out.stderr);
    free(&lock);
    // Its stdout closed, run still runs CMD and reports on stderr.
    let out = via_sh(r#"exec "$0" "$@" >&-"#, run());
    assert!(matches!(
        out.run_reply(),
        Reply::Ran {
            released: true,
            exit_status: 0,
            ..
        }
    ));
    free(&lock);
}

// ---------------------------------------------------------------------------
// Every valid name works on every command (SPEC §5 "Names").

/// A skill of `s`, owner of `o` and name of `n` characters (the skill in
/// capitals: the lowercase spelling must find the same lock).
fn long_names(s: usize, o: usize, n: usize) -> (String, String) {
    (
        "S".repeat(s),
        format!("{}/{}", "o".repeat(o), "n".repeat(n)),
    )
}

/// Sleeps until `lock`'s current lease has run out.
fn outlive(lock: &Lock) {
    if let Reply::Status {
        expires_in: Some(left),
        ..
    } = lock.status()
    {
        std::thread::sleep(std::time::Duration::from_millis(left * 1000 + 1200));
    }
}

/// acquire, status, renew, check, list, release, release --force, a
/// takeover of an expired lock, and history, on `lock` (spelled `skill`,
/// `repo`); `takeover`: the store keeps an expired lock to take over (etcd
/// drops it with its lease).
fn every_command(lock: &Lock, lower: &Lock, skill: &str, repo: &str, takeover: bool) {
    let got = lock.op("acquire").ttl(2).note("long").reply();
    let token = got.token().to_owned();
    let Reply::Acquired { lock: at, .. } = &got else {
        unreachable!()
    };
    assert!(matches!(lower.acquire(), Reply::AlreadyRunning { .. }));
    assert_eq!(lock.state(), "held");
    assert!(matches!(lock.renew(&token), Reply::Renewed { .. }));
    assert!(matches!(lower.check(&token), Reply::Held { .. }));
    match lock.list() {
        Reply::List { locks, .. } => assert!(
            locks
                .iter()
                .any(|l| l.skill == skill && l.repo == repo && l.lock == *at),
            "{at} not listed: {locks:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        lower.release(&token),
        Reply::Released { forced: false, .. }
    ));
    lock.op("acquire").ttl(2).reply().is("acquired");
    assert!(matches!(
        lower.force_release(),
        Reply::Released { forced: true, .. }
    ));
    lock.op("acquire").ttl(2).reply().is("acquired");
    outlive(lock);
    // An etcd lease may outlive the `expires` its holder was told: wait for it.
    let again = lower.op("acquire").wait(10).reply();
    match &again {
        Reply::Acquired { took_over, .. } => assert!(
            !takeover || took_over.as_ref().is_some_and(|t| t.reason == "expired"),
            "{again:?}"
        ),
        other => panic!("the expired lock was not taken over: {other:?}"),
    }
    lower.release(again.token());
    let mine = lock.history().events().to_vec();
    let all = lock.store_op("history").reply().events().to_vec();
    let kinds: Vec<&str> = mine.iter().map(|e| e.event.as_str()).collect();
    for want in ["acquired", "renewed", "released", "forced_release"] {
        assert!(kinds.contains(&want), "no {want} in {kinds:?}");
    }
    assert!(!takeover || kinds.contains(&"took_over"), "{kinds:?}");
    assert!(all.len() >= mine.len() && all.iter().any(|e| e.skill.eq_ignore_ascii_case(skill)));
}

/// Every path component below `dir` is at most 255 bytes.
#[track_caller]
fn components_fit(dir: &Path) {
    for rel in crate::harness::tree(dir) {
        for c in Path::new(&rel).components() {
            let len = c.as_os_str().len();
            assert!(len <= 255, "{rel}: a component of {len} bytes");
        }
    }
}

#[test]
fn the_longest_names_work_on_every_command_in_the_file_store() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    // The longest, the longest whose path is today's, the first that is
    // not, and one whose tombstone would not fit uncut.
    for (s, o, n) in [(64, 100, 100), (64, 100, 78), (64, 100, 79), (64, 100, 73)] {
        let (skill, name) = long_names(s, o, n);
        let lock = Lock::new(&repo, &skill, &name);
        let lower = Lock::new(&repo, &skill.to_lowercase(), &name);
        every_command(&lock, &lower, &skill, &name, true);
        components_fit(&repo.join(".git/apache-magpie"));
    }
    // A name that fits keeps the path every earlier version used.
    let (skill, name) = long_names(64, 100, 78);
    let got = Lock::new(&repo, &skill, &name).acquire();
    let Reply::Acquired { lock, .. } = &got else {
        unreachable!()
    };
    let today = format!("{}@{}.lock", skill.to_lowercase(), name.replace('/', "__"));
    assert!(lock.ends_with(&format!("/locks/{today}")), "{lock}");
}

#[test]
fn the_longest_names_and_names_git_refuses_work_in_the_git_store() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let remote = crate::harness::gitd::bare_repo(&env.path("remote.git"));
    let url = format!("git:file://{}", remote.display());
    let cache = env.path("cache");
    let (skill, name) = long_names(64, 100, 100);
    let (fits, fits_repo) = long_names(64, 100, 83);
    for (skill, name) in [
        (skill.as_str(), name.as_str()),
        (fits.as_str(), fits_repo.as_str()),
        ("A..b", "o/r.lock"),
        ("s", "o/x."),
    ] {
        let at = |s: &str| {
            Lock::new(&repo, s, name)
                .in_store(&url)
                .with_env("SKILL_LOCK_GIT_CACHE", cache.to_str().unwrap())
                .with_env("SKILL_LOCK_CLOCK_SKEW", "0")
        };
        every_command(&at(skill), &at(&skill.to_lowercase()), skill, name, true);
    }
    // A name git takes keeps the ref every earlier version used.
    let refs = std::process::Command::new("git")
        .args(["for-each-ref", "--format=%(refname)", "refs/skill-lock/"])
        .current_dir(&remote)
        .output()
        .unwrap();
    let refs = String::from_utf8_lossy(&refs.stdout);
    let today = format!(
        "refs/skill-lock/{}@{}",
        fits.to_lowercase(),
        fits_repo.replace('/', "__")
    );
    assert!(refs.lines().any(|r| r == today), "{refs}");
    components_fit(&remote);
}

#[test]
fn the_longest_names_work_in_the_etcd_store() {
    let Some(ep) = crate::harness::etcd_endpoint("no_second_writer: the longest names on etcd")
    else {
        return;
    };
    let env = TestEnv::new();
    let dir = env.dir("w");
    let url = format!(
        "etcd://{ep}{}",
        crate::harness::etcd_prefix(&env, "no_second_writer")
    );
    let (skill, name) = long_names(64, 100, 100);
    let lock = Lock::new(&dir, &skill, &name).in_store(&url);
    let lower = Lock::new(&dir, &skill.to_lowercase(), &name).in_store(&url);
    every_command(&lock, &lower, &skill, &name, false);
}

// ---------------------------------------------------------------------------
// Text from a store never reaches a terminal as control characters or an
// extra line (SPEC §3); the hint pastes from anywhere (SPEC §2.1).

/// What a forged record's host and note carry: ESC sequences (clear
/// screen, set title), BEL, CR LF and a fake line, DEL, C1 CSI and NEL, a
/// right-to-left override and a line separator.
const HOSTILE: &str =
    "vm\u{1b}[2J\u{1b}]0;pwned\u{7}\r\nFAKE LINE\u{7f}\u{9b}31m\u{85}\u{202e}exe.txt\u{2028}x";

/// Would a terminal act on `c`, or break or reorder the line at it?
fn acts_on(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}'
        )
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// `text` is lines (each ending in `\n`) that a terminal only displays.
#[track_caller]
fn displays_only(text: &str, what: &str) {
    for line in text.split_terminator('\n') {
        assert!(!line.chars().any(acts_on), "{what}: {line:?}");
    }
}

/// Rewrites the record of the lock `s`/`o/r` in `repo`'s file store with
/// `host` and `note`, atomically (as a store writer could).
fn forge(repo: &Path, host: &str, note: &str) {
    let dir = repo.join(".git/apache-magpie/run/locks/s@o__r.lock");
    let record = dir.join("owner.json");
    let forged = dir.join("forged.tmp");
    std::fs::copy(&record, &forged).unwrap();
    crate::harness::edit_json_file(&forged, &[("host", host.into()), ("note", note.into())]);
    std::fs::rename(forged, record).unwrap();
}

#[test]
fn a_forged_host_and_note_reach_no_terminal() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let token = lock.acquire().token().to_owned();
    forge(&repo, HOSTILE, HOSTILE);
    let outs = [
        lock.op("acquire").run(),
        lock.op("status").run(),
        lock.op("check").token("nope").run(),
        lock.op("renew").token(&token).run(),
        lock.op("release").token(&token).run(),
        lock.store_op("history").run(),
    ];
    for out in &outs {
        assert_eq!(out.stdout.matches('\n').count(), 1, "{:?}", out.stdout);
        displays_only(&out.stdout, "stdout");
        displays_only(&out.stderr, "stderr");
    }
    // Escaped, not dropped: a JSON reader sees the record as stored.
    match &outs[0].reply() {
        Reply::AlreadyRunning { holder, hint, .. } => {
            assert_eq!(
                (holder.host.as_str(), holder.note.as_deref()),
                (HOSTILE, Some(HOSTILE))
            );
            assert!(!hint.chars().any(acts_on), "{hint:?}");
        }
        other => panic!("{other:?}"),
    }
    match &outs[4].reply() {
        Reply::Released {
            holder: Some(h), ..
        } => assert_eq!(h.host, HOSTILE),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_run_that_lost_its_lock_names_a_forged_holder_on_one_line() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let run = lock
        .op("run")
        .ttl(3)
        .command(["sleep", "30"])
        .into_command()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while lock.state() != "held" {
        assert!(std::time::Instant::now() < deadline, "run never acquired");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // An operator frees it, another run takes it, and its record is forged.
    lock.force_release();
    lock.op("acquire").ttl(60).reply().is("acquired");
    forge(&repo, HOSTILE, "n");
    let out = Out::from(run.wait_with_output().unwrap());
    displays_only(&out.stderr, "run's stderr");
    let lost = out
        .stderr
        .lines()
        .find(|l| l.contains("the lease was lost"))
        .unwrap_or_else(|| panic!("no word of the lost lease: {}", out.stderr));
    // The whole host, escaped, on that one line.
    for shown in [
        "\\u{1b}[2J",
        "\\u{d}\\u{a}FAKE LINE",
        "\\u{9b}31m",
        "\\u{202e}exe.txt",
    ] {
        assert!(lost.contains(shown), "{lost}");
    }
    assert!(matches!(out.run_reply(), Reply::Ran { lost: true, .. }));
}

/// Pastes `hint` into `sh -c` in `cwd` and checks that it released.
#[track_caller]
fn paste(hint: &str, cwd: &Path, envs: &[(&str, &Path)]) {
    assert!(!hint.chars().any(acts_on), "{hint:?}");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", hint])
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = Out::from(cmd.output().unwrap());
    assert!(
        matches!(out.reply(), Reply::Released { forced: true, .. }),
        "{hint}: {}",
        out.stderr
    );
}

/// The hint of `lock`, held by another run.
fn hint_of(lock: &Lock) -> String {
    lock.acquire();
    match lock.acquire() {
        Reply::AlreadyRunning { hint, .. } => hint,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_hint_pastes_for_a_root_that_is_not_utf8_or_holds_controls() {
    use std::os::unix::ffi::OsStrExt;
    let env = TestEnv::new();
    let elsewhere = env.dir("elsewhere");
    for name in [
        &b"r\xff\xfe\x1b[31m\xe2\x80\xaex 'q'"[..],
        b"two\nlines",
        b"ends in a newline\n",
        b"\x9b\x85\x7f",
    ] {
        let dir = env.root.join(std::ffi::OsStr::from_bytes(name));
        std::fs::create_dir(&dir).unwrap();
        crate::harness::git(&dir, &["init", "-q"]);
        let lock = Lock::new(&dir, "s", "o/r");
        let hint = hint_of(&lock);
        assert!(hint.contains(" --root "), "{hint}");
        paste(&hint, &elsewhere, &[]);
        free(&lock);
    }
}

#[test]
fn the_hint_pastes_for_a_relative_git_store_path() {
    let env = TestEnv::new();
    crate::harness::gitd::bare_repo(&env.path("coord.git"));
    let cwd = env.dir("w");
    let cache = env.path("cache");
    let elsewhere = env.dir("elsewhere");
    for url in ["git:../coord.git", "git:../coord.git#team"] {
        let lock = Lock::new(&cwd, "s", "o/r")
            .in_store(url)
            .with_env("SKILL_LOCK_GIT_CACHE", cache.to_str().unwrap());
        let hint = hint_of(&lock);
        let absolute = format!("git:{}/../coord.git", cwd.display());
        assert!(hint.contains(&absolute), "{hint}");
        paste(&hint, &elsewhere, &[("SKILL_LOCK_GIT_CACHE", &cache)]);
        free(&lock);
    }
}

/// `renew` needs the token unless `--force`, and `--force` takes none
/// (SPEC §2.2): a run that dropped its `SKILL_LOCK_TOKEN=` prefix is refused
/// (usage, exit 2) and the holder's lease is left as it was; the messages
/// say what to do and never advise acting without a token.
#[test]
fn renew_without_a_token_is_refused_unless_forced_and_forced_takes_none() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let first = lock.acquire();
    let (token, fence) = (first.token().to_owned(), first.fence().unwrap());
    let out = lock.op("renew").run();
    assert_eq!(out.code, 2, "{}", out.stdout);
    let msg = out.error_message("usage");
    assert!(
        msg.contains("SKILL_LOCK_TOKEN=") && msg.contains("--force"),
        "{msg}"
    );
    still_held_by(&lock, &token, fence);
    let out = lock.op("renew").token(&token).force().run();
    assert_eq!(out.code, 2, "{}", out.stdout);
    let msg = out.error_message("usage");
    assert!(msg.contains("drop --force"), "{msg}");
    let out = lock
        .op("renew")
        .force()
        .env("SKILL_LOCK_TOKEN", &token)
        .run();
    assert_eq!(
        out.code, 2,
        "a token in the environment counts: {}",
        out.stdout
    );
    still_held_by(&lock, &token, fence);
    for empty in [
        lock.op("renew").env("SKILL_LOCK_TOKEN", "").run(),
        lock.op("renew").token("").run(),
    ] {
        let msg = empty.error_message("usage");
        assert!(
            !msg.contains("unset"),
            "never advise dropping the token: {msg}"
        );
    }
    lock.op("renew").force().expect(0, "renewed");
    lock.op("renew").token(&token).expect(0, "renewed");
}

/// `run --conflict-exit-code N` exits N, not 3, when CMD was not run
/// because the lock is held; a CMD that exits 3 itself still exits 3; N
/// outside 0..=255 is a usage error.
#[test]
fn run_conflict_exit_code_tells_held_from_a_command_that_exits_3() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let out = lock
        .op("run")
        .args(["--conflict-exit-code", "75"])
        .command(["sh", "-c", "exit 3"])
        .run();
    assert_eq!(out.code, 3, "the command's own 3: {}", out.stderr);
    let held = lock.acquire();
    let out = lock
        .op("run")
        .args(["--conflict-exit-code", "75"])
        .command(["sh", "-c", "exit 0"])
        .run();
    assert_eq!(out.code, 75, "held, not run: {}", out.stderr);
    assert!(out.stderr.contains("already_running"), "{}", out.stderr);
    let out = lock.op("run").command(["true"]).run();
    assert_eq!(out.code, 3, "without it, 3: {}", out.stderr);
    for bad in ["256", "-1", "x"] {
        let out = lock
            .op("run")
            .args(["--conflict-exit-code", bad])
            .command(["true"])
            .run();
        assert_eq!(out.code, 2, "{bad}: {}", out.stderr);
        assert!(out.stderr.contains("0 to 255"), "{bad}: {}", out.stderr);
    }
    lock.release(held.token()).is("released");
}
