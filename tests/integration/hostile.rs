//! Hostile layers (SPEC §5 "Trust", §7 "Hostile layers" and "Fences never
//! repeat", §8 git, §2 `SKILL_LOCK_TOKEN`): what a checkout or another local
//! user plants in the personal layer never makes a command hang, answer
//! anything but one JSON object, or read, write, create or delete anything
//! outside `P/run/`; no value from a checkout, a config file or an argument
//! reaches git as an option; credentials never show.
//!
//! The first tests replay each attack that was reproduced against the old
//! code; `every_plant_at_every_path_answers_and_touches_nothing_outside` is
//! the generated campaign (its counts are in docs/stress.md).
//!
//! Covers: SPEC §2, §5, §7, §8.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::harness::{Cmd, Lock, Reply};
use crate::harness::{Out, TestEnv, git};

const NAME: &str = "s@o__r";

/// An adopted project (its personal layer lies in the working tree) and a
/// decoy tree beside it: the user's other projects and files.
struct World {
    env: TestEnv,
    repo: PathBuf,
    layer: PathBuf,
    decoy: PathBuf,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl World {
    fn new() -> Self {
        let env = TestEnv::new();
        let repo = env.dir("checkout");
        std::fs::write(repo.join(".apache-magpie.lock"), "").unwrap();
        let layer = repo.join(".apache-magpie-local");
        let decoy = env.dir("decoy");
        std::fs::create_dir_all(decoy.join("other-project/src")).unwrap();
        std::fs::write(decoy.join("other-project/src/main.rs"), "fn main() {}\n").unwrap();
        std::fs::write(decoy.join("file.txt"), "precious\n").unwrap();
        std::fs::create_dir_all(decoy.join("dir")).unwrap();
        std::fs::write(decoy.join("dir/inner.txt"), "inner\n").unwrap();
        Self {
            env,
            repo,
            layer,
            decoy,
        }
    }

    fn run_dir(&self) -> PathBuf {
        self.layer.join("run")
    }

    /// The lock `s` of `o/r`, from the checkout.
    fn lock(&self) -> Lock {
        Lock::new(&self.repo, "s", "o/r")
    }

    /// `verb` on the lock, from the checkout.
    fn op(&self, verb: &str) -> Cmd {
        self.lock().op(verb)
    }

    /// Acquires the lock for 60 s: its token.
    fn acquire(&self) -> String {
        let a = self.op("acquire").ttl(60).reply().is("acquired");
        a.token().to_owned()
    }
}

/// Every entry below `dir`: its kind, mode, size and content, links not followed.
fn fingerprint(dir: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(d).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            let what = if m.is_symlink() {
                format!("link {:?}", std::fs::read_link(&p).unwrap())
            } else if m.is_dir() {
                walk(base, &p, out);
                format!("dir {:o}", m.permissions().mode())
            } else {
                format!(
                    "file {:o} {:?}",
                    m.permissions().mode(),
                    std::fs::read(&p).unwrap()
                )
            };
            out.insert(rel, what);
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Runs `cmd`, killed after `limit`; `None` when it had to be killed.
fn run_bounded(cmd: Cmd, limit: Duration) -> Option<Out> {
    let mut child = cmd.spawn();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let (stdout, stderr) = (out_t.join().unwrap(), err_t.join().unwrap());
    status.map(|status| {
        Out::from(std::process::Output {
            status,
            stdout,
            stderr,
        })
    })
}

/// The one JSON object of an invocation (`run` prints it last on stderr),
/// read typed.
fn one_object(out: &Out, on_stderr: bool) -> Option<Reply> {
    out.try_reply(on_stderr)
}

// ---------------------------------------------------------------------------
// The attacks reproduced against the old code, one by one.

/// `run/tombs -> ../../..` committed in an adopted checkout: the old code's
/// release deleted every sibling of the checkout.
#[test]
fn a_planted_tombs_link_deletes_nothing_outside_the_layer() {
    let w = World::new();
    let token = w.acquire();
    let before = fingerprint(&w.env.root.join("decoy"));
    let tombs = w.run_dir().join("tombs");
    std::fs::remove_dir_all(&tombs).unwrap();
    // ../../.. from run/tombs is the folder holding the checkout and the decoy.
    symlink("../../..", &tombs).unwrap();
    let out = w.lock().op("release").token(&token).run();
    assert!(
        one_object(&out, false).is_some(),
        "{} {}",
        out.stdout,
        out.stderr
    );
    let message = out.error_message("io");
    assert!(message.contains("symbolic link"), "{}", out.stdout);
    assert_eq!(fingerprint(&w.decoy), before, "the decoy tree changed");
    assert!(w.repo.join(".apache-magpie.lock").exists());
    // The lock is still held and released once the link is gone.
    std::fs::remove_file(&tombs).unwrap();
    w.lock().release(&token).is("released");
}

/// Links planted where the store writes its temporaries, guard and history:
/// the old code truncated, overwrote, appended to and created files outside.
#[test]
fn planted_links_at_write_paths_overwrite_and_create_nothing_outside() {
    let w = World::new();
    let token = w.acquire();
    w.lock().release(&token).is("released");
    let run = w.run_dir();
    let targets = [
        (format!("keys/{NAME}.fence.tmp"), "file.txt"),
        ("history.lock".to_owned(), "dir/inner.txt"),
        ("history.jsonl".to_owned(), "other-project/src/main.rs"),
        (format!("keys/{NAME}.guard"), "never-created"),
    ];
    for (at, to) in &targets {
        let p = run.join(at);
        let _ = std::fs::remove_file(&p);
        symlink(w.decoy.join(to), &p).unwrap();
    }
    let before = fingerprint(&w.decoy);
    let out = w.op("acquire").run();
    assert!(one_object(&out, false).is_some(), "{}", out.stdout);
    assert_eq!(fingerprint(&w.decoy), before, "{}", out.stdout);
    assert!(!w.decoy.join("never-created").exists());
    // Only the guard is essential: with it planted the change is refused
    // (nothing acquired); the others are replaced or skipped.
    out.expect_error("io");
    std::fs::remove_file(run.join(format!("keys/{NAME}.guard"))).unwrap();
    let a = w.lock().acquire().is("acquired");
    // A record temporary planted inside the lock: renew replaces the link, not its target.
    let tmp = run.join(format!("locks/{NAME}.lock/owner.json.tmp"));
    symlink(w.decoy.join("file.txt"), &tmp).unwrap();
    w.lock().renew(a.token()).is("renewed");
    assert_eq!(fingerprint(&w.decoy), before);
}

/// A FIFO, `/dev/zero` or an endless file as the config, the history or the
/// fence counter: the old code hung (or read gigabytes); now every command
/// answers at once.
#[test]
fn fifos_and_endless_files_never_hang_a_command() {
    for (at, what) in [
        ("skill-lock.toml", "zero"),
        ("skill-lock.toml", "fifo"),
        ("run/history.jsonl", "zero"),
        ("run/history.jsonl", "fifo"),
        (&format!("run/keys/{NAME}.fence") as &str, "fifo"),
    ] {
        let w = World::new();
        // A fresh layer for the history case: acquire publishes, then appends.
        std::fs::create_dir_all(w.run_dir().join("keys")).unwrap();
        for d in [&w.layer, &w.run_dir(), &w.run_dir().join("keys")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let p = w.layer.join(at);
        if what == "zero" {
            symlink("/dev/zero", &p).unwrap();
        } else {
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: a valid C string.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        for call in [
            w.op("acquire"),
            w.op("status"),
            w.lock().store_op("history"),
            w.lock().store_op("list"),
        ] {
            let args = call.verb().to_owned();
            let start = Instant::now();
            let out = run_bounded(call, Duration::from_secs(11))
                .unwrap_or_else(|| panic!("{args:?} with {what} at {at} hung"));
            assert!(start.elapsed() < Duration::from_secs(5), "{args:?} {at}");
            assert!(
                one_object(&out, false).is_some(),
                "{args:?} {what} at {at}: {} {}",
                out.stdout,
                out.stderr
            );
        }
        if at.contains("history") {
            // The lock works; only its history is refused (SPEC §2.8).
            assert_eq!(w.lock().state(), "held");
        }
    }
}

/// The checkout's config names a git store whose remote is an option: the
/// old code ran `--upload-pack`'s command.
#[test]
fn a_config_or_remote_that_is_an_option_runs_nothing() {
    let w = World::new();
    let pwned = w.env.root.join("PWNED");
    std::fs::create_dir_all(&w.layer).unwrap();
    std::fs::set_permissions(&w.layer, std::fs::Permissions::from_mode(0o700)).unwrap();
    let evil = [
        format!("git:--upload-pack=touch {};:", pwned.display()),
        format!("git:ext::sh -c touch% {}", pwned.display()),
        format!("git:EXT::sh -c touch% {}", pwned.display()),
        "git:fd::3#x".to_owned(),
    ];
    for url in &evil {
        std::fs::write(
            w.layer.join("skill-lock.toml"),
            format!("store = {url:?}\n"),
        )
        .unwrap();
        w.op("status").run().expect_error("usage");
        // The same value from --store and the environment is refused alike.
        w.op("status").store(url).run().expect_error("usage");
        let by_env = w.op("status").env("SKILL_LOCK_STORE", url);
        by_env.run().expect_error("usage");
    }
    std::fs::remove_file(w.layer.join("skill-lock.toml")).unwrap();
    // A remote of a (shared) checkout whose URL is an option or runs a command.
    let repo = w.env.git_repo("g");
    for bad in [
        format!("--upload-pack=touch {};:", pwned.display()),
        format!("ext::sh -c touch% {}", pwned.display()),
    ] {
        git(&repo, &["config", "remote.origin.url", &bad]);
        let out = Lock::new(&repo, "s", "o/r")
            .op("status")
            .store("git:origin")
            .run();
        out.expect_error("usage");
    }
    assert!(!pwned.exists(), "a command ran");
}

/// Credentials in a git URL never show: not in results, errors or history,
/// and not in any process's arguments (git gets the URL in its environment).
#[test]
fn credentials_never_show_in_output_or_in_process_arguments() {
    let w = World::new();
    // A `git` first on PATH that logs its arguments, then runs the real one.
    let bin = w.env.dir("bin");
    let log = w.env.root.join("argv.log");
    let real = crate::harness::real_git();
    std::fs::write(
        bin.join("git"),
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> {}\nexec {} \"$@\"\n",
            log.display(),
            real.trim()
        ),
    )
    .unwrap();
    std::fs::set_permissions(bin.join("git"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    // Nothing listens on port 9 of loopback: the remote is unreachable.
    let url = "git:https://someone:s3cret-pw@127.0.0.1:9/r.git";
    let cache = w.env.root.join("cache");
    let out = w
        .op("acquire")
        .env("PATH", &path)
        .env("SKILL_LOCK_STORE", url)
        .env("SKILL_LOCK_GIT_TIMEOUT", "3")
        .env("SKILL_LOCK_GIT_CACHE", &cache)
        .run();
    out.expect_error("store_unavailable");
    assert!(!out.stdout.contains("s3cret"), "{}", out.stdout);
    assert!(!out.stderr.contains("s3cret"), "{}", out.stderr);
    let argv = std::fs::read_to_string(&log).unwrap();
    // The network git ran (a change reads the lock with a fetch).
    assert!(
        argv.contains(" fetch ") || argv.contains("ls-remote"),
        "{argv}"
    );
    assert!(
        !argv.contains("s3cret"),
        "git's arguments carry the password: {argv}"
    );
    // A bad namespace and an unknown scheme: the message never repeats it.
    for bad in [
        "git:https://someone:s3cret-pw@h/r.git#../x",
        "nope://someone:s3cret-pw@h/r",
    ] {
        let out = w.op("status").env("SKILL_LOCK_STORE", bad).run();
        out.expect_error("usage");
        assert!(!out.stdout.contains("s3cret"), "{}", out.stdout);
    }
    // On the command line a password is readable by every local user: refused.
    let out = w.op("status").store(url).run();
    out.expect_error("usage");
    assert!(!out.stdout.contains("s3cret"), "{}", out.stdout);
    assert!(out.stdout.contains("SKILL_LOCK_STORE"), "{}", out.stdout);
}

/// `echo 1 > keys/<lock>.fence` after fences 1..=3: the old code handed out
/// 2 again. The history still knows 3, so the next fence is 4.
#[test]
fn a_fence_counter_set_back_never_repeats_a_fence() {
    let w = World::new();
    let fence = || w.lock().acquire().is("acquired").fence();
    for want in 1..=3u64 {
        assert_eq!(fence(), Some(want));
        w.op("release").expect(0, "released");
    }
    let counter = w.run_dir().join(format!("keys/{NAME}.fence"));
    std::fs::write(&counter, "1\n").unwrap();
    assert_eq!(fence(), Some(4));
    // Held, with the counter set back again: the record in place wins.
    std::fs::write(&counter, "0\n").unwrap();
    w.lock().force_release().is("released");
    assert_eq!(fence(), Some(5));
    // A planted FIFO as the counter: rebuilt from what the store still knows.
    std::fs::remove_file(&counter).unwrap();
    let c = std::ffi::CString::new(counter.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    w.op("release").expect(0, "released");
    assert_eq!(fence(), Some(6));
}

/// A layer that group or others can write, or that is another user's, is
/// refused (as ssh refuses a lax `~/.ssh`) with the command that fixes it.
#[test]
fn a_layer_others_can_write_or_own_is_refused_with_the_fix() {
    let w = World::new();
    let token = w.acquire();
    for (dir, want) in [(w.layer.clone(), "chmod go-w"), (w.run_dir(), "chmod go-w")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        for call in [w.op("status"), w.op("release").token(&token)] {
            let m = call.run().error_message("io");
            assert!(
                m.contains(want) && m.contains(&dir.display().to_string()),
                "{m}"
            );
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    if is_root() {
        std::os::unix::fs::chown(&w.layer, Some(65534), Some(65534)).unwrap();
        let m = w.op("status").run().error_message("io");
        assert!(m.contains("chown") && m.contains("uid 65534"), "{m}");
        std::os::unix::fs::chown(&w.layer, Some(0), Some(0)).unwrap();
    }
    w.lock().release(&token).is("released");
}

/// `SKILL_LOCK_TOKEN` carries the token for renew, release and check;
/// `--token` wins when both are given.
#[test]
fn the_token_comes_from_the_environment_and_the_flag_wins() {
    let w = World::new();
    let token = w.acquire();
    let with_env = |t: &str, verb: &str| w.op(verb).env("SKILL_LOCK_TOKEN", t);
    with_env(&token, "check").expect(0, "held");
    with_env(&token, "renew").expect(0, "renewed");
    let wrong = "0".repeat(32);
    with_env(&wrong, "check").expect(4, "not_owner");
    with_env(&wrong, "release").expect(4, "refused");
    w.op("check").run().expect_error("usage");
    with_env(&wrong, "release")
        .token(&token)
        .expect(0, "released");
}

// ---------------------------------------------------------------------------
// The campaign.

/// Where the file store looks, and whether a directory or a file belongs there.
fn paths() -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = [
        ("", true),
        ("run", true),
        ("skill-lock.toml", false),
        ("run/.gitignore", false),
        ("run/locks", true),
        ("run/keys", true),
        ("run/tmp", true),
        ("run/tombs", true),
        ("run/history.jsonl", false),
        ("run/history.1.jsonl", false),
        ("run/history.lock", false),
    ]
    .iter()
    .map(|(p, d)| ((*p).to_owned(), *d))
    .collect();
    for (p, d) in [
        ("run/locks/{}.lock", true),
        ("run/locks/{}.lock/owner.json", false),
        ("run/locks/{}.lock/owner.json.tmp", false),
        ("run/keys/{}.guard", false),
        ("run/keys/{}.fence", false),
        ("run/keys/{}.fence.tmp", false),
        ("run/tmp/{}", true),
        ("run/tombs/{}.1.x", true),
    ] {
        v.push((p.replace("{}", NAME), d));
    }
    v
}

const PLANTS: [&str; 11] = [
    "link-to-file",
    "hard-link",
    "link-to-dir",
    "dangling-link",
    "fifo",
    "dev-zero-link",
    "device",
    "huge-file",
    "wrong-kind",
    "foreign-dir",
    "dir-0777",
];

/// Plants `what` at `p` (a directory belongs there when `dir`); false when
/// this machine cannot make it (not root).
fn plant(w: &World, p: &Path, dir: bool, what: &str) -> bool {
    if let Ok(m) = std::fs::symlink_metadata(p) {
        if m.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    let cstr = || std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    match what {
        "link-to-file" => symlink(w.decoy.join("file.txt"), p).unwrap(),
        "link-to-dir" => symlink(w.decoy.join("dir"), p).unwrap(),
        // Another name of a file outside (a hard link is a regular file).
        "hard-link" => std::fs::hard_link(w.decoy.join("file.txt"), p).unwrap(),
        "dangling-link" => symlink(w.decoy.join("never-created"), p).unwrap(),
        // SAFETY: a valid C string.
        "fifo" => assert_eq!(unsafe { libc::mkfifo(cstr().as_ptr(), 0o600) }, 0),
        "dev-zero-link" => symlink("/dev/zero", p).unwrap(),
        "device" => {
            if !is_root() {
                return false;
            }
            // SAFETY: a valid C string; 1:5 is /dev/zero's device number.
            let rc =
                unsafe { libc::mknod(cstr().as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 5)) };
            assert_eq!(rc, 0);
        }
        "huge-file" => {
            // 100 MB with no newline (sparse: made in no time, read in full).
            let f = std::fs::File::create(p).unwrap();
            f.set_len(100_000_000).unwrap();
        }
        "wrong-kind" => {
            if dir {
                std::fs::write(p, "not a directory\n").unwrap();
            } else {
                std::fs::create_dir(p).unwrap();
            }
        }
        "foreign-dir" => {
            if !is_root() {
                return false;
            }
            std::fs::create_dir(p).unwrap();
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        }
        "dir-0777" => {
            std::fs::create_dir(p).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        _ => unreachable!("{what}"),
    }
    true
}

/// Plants each kind of thing at each path the file store touches, runs
/// every command against it, and checks that each answers one JSON object
/// within the bounded wait and that nothing outside `P/run/` changed.
#[test]
fn every_plant_at_every_path_answers_and_touches_nothing_outside() {
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let (mut cases, mut calls, mut skipped) = (0u64, 0u64, 0u64);
    let mut slowest = Duration::ZERO;
    for (rel, dir) in paths() {
        for what in PLANTS {
            let w = World::new();
            let token = w.acquire();
            let at = if rel.is_empty() {
                w.layer.clone()
            } else {
                w.layer.join(&rel)
            };
            if !plant(&w, &at, dir, what) {
                skipped += 1;
                continue;
            }
            cases += 1;
            let before = fingerprint(&w.decoy);
            let commands = [
                ("status", w.op("status")),
                ("list", w.lock().store_op("list")),
                ("history", w.lock().store_op("history")),
                ("check --token", w.op("check").token(&token)),
                ("renew --token", w.op("renew").token(&token)),
                ("acquire", w.op("acquire")),
                ("release --token", w.op("release").token(&token)),
                ("acquire --ttl 5", w.op("acquire").ttl(5)),
                ("run --ttl 5 -- true", w.op("run").ttl(5).command(["true"])),
                ("release", w.op("release")),
            ];
            for (args, call) in commands {
                calls += 1;
                let verb = call.verb().to_owned();
                let start = Instant::now();
                let out = run_bounded(call, Duration::from_secs(11)).unwrap_or_else(|| {
                    panic!("{args:?} with {what} at P/{rel} did not answer within 11 s")
                });
                slowest = slowest.max(start.elapsed());
                let obj = one_object(&out, verb == "run").unwrap_or_else(|| {
                    panic!(
                        "{args:?} with {what} at P/{rel}: not one JSON object\nstdout: {}\nstderr: {}",
                        out.stdout, out.stderr
                    )
                });
                assert!(
                    [0, 2, 3, 4].contains(&out.code),
                    "{args:?} {what} P/{rel}: exit {}",
                    out.code
                );
                let result = match &obj {
                    Reply::Error { error, .. } => format!("error:{error}"),
                    other => other.result().to_owned(),
                };
                *outcomes.entry(format!("{verb} -> {result}")).or_default() += 1;
            }
            assert_eq!(
                fingerprint(&w.decoy),
                before,
                "{what} at P/{rel} changed something outside P/run"
            );
            assert!(!w.decoy.join("never-created").exists(), "{what} at P/{rel}");
        }
    }
    eprintln!(
        "hostile layers: {cases} cases ({} paths x {} plants, {skipped} not makeable here), \
         {calls} calls, slowest {:.2} s, outside P/run changed: 0",
        paths().len(),
        PLANTS.len(),
        slowest.as_secs_f64()
    );
    for (k, n) in &outcomes {
        eprintln!("  {k}: {n}");
    }
    assert!(cases >= 150, "{cases}");
}
