//! The file store at its edges (issue 12): a layout cut short or removed by
//! hand, damaged fence counters, readers racing takeovers, a process stopped
//! inside the guard, spellings of one lock, records of older versions,
//! read-only layers, pid namespaces and other machines. Each test fails on
//! the code before its fix. Also the layout itself: where a checkout keeps
//! its locks (root discovery in git repositories, worktrees, svn-like and
//! plain folders), private modes, the owner record with the token only
//! hashed, a corrupt record, and a `file:` store named by URL or config.
//!
//! Covers: SPEC §2.1, §2.4, §2.5, §4, §5, §6, §7, §8.

use crate::harness;

use harness::chaos::Seed;
use harness::{BIN, Cmd, TestEnv};
use harness::{Lock, Reply};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const NAME: &str = "s@o__r";

fn run_dir(repo: &Path) -> PathBuf {
    repo.join(".git/apache-magpie/run")
}

/// The lock `s` of `o/r`, seen from `repo`.
fn lock(repo: &Path) -> Lock {
    Lock::new(repo, "s", "o/r")
}

/// Acquires `s` of `o/r` in `repo`, which must succeed.
#[track_caller]
fn acquired(repo: &Path) -> Reply {
    lock(repo).acquire().is("acquired")
}

/// Releases `s` of `o/r` in `repo` without a token; `result` is what it says.
#[track_caller]
fn release(repo: &Path, result: &str) {
    lock(repo).op("release").expect(0, result);
}

/// The state `status` shows of `s` of `o/r` in `repo`.
#[track_caller]
fn state(repo: &Path) -> String {
    lock(repo).state()
}

/// A checkout without running git: a `.git` directory holding what makes
/// it a git directory (`HEAD`, `objects/`, `refs/`, SPEC §5 layer rule 1).
fn bare_checkout(env: &TestEnv, rel: &str) -> PathBuf {
    let d = env.dir(rel);
    for sub in [".git/objects", ".git/refs"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    d
}

#[test]
fn a_layout_removed_by_hand_heals_and_release_that_says_released_has_released() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    let run = run_dir(&repo);
    for part in ["tmp", "locks", "tombs", "keys", ""] {
        acquired(&repo);
        std::fs::remove_dir_all(run.join(part)).unwrap();
        if part == "locks" || part.is_empty() {
            // The lock went with it: the next acquire creates it afresh.
            assert_eq!(state(&repo), "free", "{part}");
        } else {
            // The lock is still there: a forced release removes it, for real.
            lock(&repo).op("release").force().expect(0, "released");
            assert_eq!(state(&repo), "free", "after rm {part}");
        }
        acquired(&repo);
        release(&repo, "released");
        for sub in ["tmp", "locks", "tombs", "keys"] {
            assert!(run.join(sub).is_dir(), "{sub} re-created after rm {part}");
        }
    }
}

#[test]
fn sigkill_while_the_layer_is_first_created_never_leaves_it_stuck() {
    let env = TestEnv::new();
    let seed = Seed::from_env("layer creation kills", "FS_SEED");
    let mut rng = seed.rng(0);
    let mut killed = 0;
    for i in 0..120 {
        let repo = bare_checkout(&env, &format!("k{i}"));
        let mut child = lock(&repo).op("acquire").quiet().spawn();
        std::thread::sleep(Duration::from_micros(rng.below(4000)));
        if child.kill().is_ok() {
            killed += 1;
        }
        child.wait().unwrap();
        // Whatever the kill left, the lock works: release, then acquire.
        let was = if state(&repo) == "free" {
            "not_held"
        } else {
            "released"
        };
        release(&repo, was);
        acquired(&repo);
    }
    eprintln!("{killed} of 120 acquires killed in flight");
}

#[test]
fn fences_never_repeat_or_go_back_when_the_counter_is_damaged() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    let counter = run_dir(&repo).join(format!("keys/{NAME}.fence"));
    let mut last = 0;
    let mut step = |damage: &dyn Fn()| {
        damage();
        let f = acquired(&repo).must_fence();
        assert!(f > last, "fence {f} after {last}");
        last = f;
        release(&repo, "released");
    };
    for _ in 0..3 {
        step(&|| {});
    }
    step(&|| std::fs::write(&counter, "3x").unwrap());
    step(&|| std::fs::write(&counter, "").unwrap());
    step(&|| std::fs::remove_file(&counter).unwrap());
    step(&|| std::fs::remove_dir_all(counter.parent().unwrap()).unwrap());
    // Damaged while held: the record in place counts too.
    let f = lock(&repo).op("acquire").ttl(1).reply().must_fence();
    std::fs::write(&counter, "garbage").unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    assert!(acquired(&repo).must_fence() > f);
    release(&repo, "released");
    // The last fence there is: refused, never wrapped to 0.
    std::fs::write(&counter, format!("{}\n", u64::MAX)).unwrap();
    let out = lock(&repo).op("acquire").run();
    let message = out.error_message("io");
    assert!(message.contains("fence"), "{}", out.stdout);
    assert_eq!(state(&repo), "free");
}

#[test]
fn readers_never_report_corrupt_while_the_lock_is_retaken() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    acquired(&repo);
    let stop = AtomicBool::new(false);
    let (reads, corrupt, cycles) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    // Unconditional release, then acquire: the lock directory
                    // is buried and re-published back to back.
                    lock(&repo).op("release").run();
                    lock(&repo).op("acquire").run();
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for _ in 0..6 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let v = lock(&repo).status();
                    reads.fetch_add(1, Ordering::Relaxed);
                    if v.stale_reason() == Some("corrupt") {
                        corrupt.fetch_add(1, Ordering::Relaxed);
                        eprintln!("corrupt: {v:?}");
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_secs(6));
        stop.store(true, Ordering::Relaxed);
    });
    let (r, c, n) = (
        reads.into_inner(),
        corrupt.into_inner(),
        cycles.into_inner(),
    );
    eprintln!("{r} reads, {n} release/acquire cycles, {c} corrupt");
    assert!(
        r > 100 && n > 50,
        "too little load to prove anything: {r} reads, {n} cycles"
    );
    assert_eq!(c, 0, "{c} of {r} reads said corrupt for a healthy lock");
}

fn holds_flock(path: &Path) -> bool {
    !Command::new("flock")
        .args(["-n", path.to_str().unwrap(), "true"])
        .status()
        .unwrap()
        .success()
}

#[test]
fn a_process_stopped_inside_the_guard_costs_ten_seconds_not_forever() {
    if Command::new("flock").arg("--version").output().is_err() {
        eprintln!("SKIPPED: needs flock(1)");
        return;
    }
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    lock(&repo).op("acquire").ttl(1).reply().is("acquired");
    let guard = run_dir(&repo).join(format!("keys/{NAME}.guard"));
    // A real process takes the guard and is stopped inside it.
    // flock -o: only flock(1) itself holds it, not its sleeping child.
    let mut holder = Command::new("flock")
        .args(["-o", guard.to_str().unwrap(), "sleep", "60"])
        .process_group(0)
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !holds_flock(&guard) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "flock never took the guard"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = holder.id();
    let group = -i32::try_from(pid).unwrap();
    // SAFETY: plain signal to our own child's process group.
    unsafe { libc::kill(group, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(2100));
    let start = Instant::now();
    let mut child = lock(&repo).op("acquire").spawn();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > Duration::from_secs(25) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.is_none() {
        child.kill().unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let waited = start.elapsed();
    // SAFETY: plain signals to our own child.
    unsafe {
        libc::kill(group, libc::SIGKILL);
        libc::kill(group, libc::SIGCONT);
    }
    holder.wait().unwrap();
    assert!(status.is_some(), "acquire still waiting after {waited:?}");
    let out = harness::Out::from(out);
    let msg = out.error_message("store_unavailable");
    assert!(msg.contains(&pid.to_string()), "names the process: {msg}");
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(20),
        "{waited:?}"
    );
    // Once it is gone, everything works again.
    let again = acquired(&repo);
    assert_eq!(again.took_over().unwrap().reason, "expired");
}

#[test]
fn one_lock_whatever_the_spelling() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let sub = env.dir("r/docs/sub");
    let a = Lock::new(&repo, "Issue-Triage", "Apache/Airflow").acquire();
    let lock = a.is("acquired").lock().to_owned();
    assert!(
        lock.ends_with("issue-triage@apache__airflow.lock"),
        "{lock}"
    );
    for (cwd, args) in [
        (&repo, vec!["--root", "docs/sub"]),
        (&sub, vec![]),
        (&env.root, vec!["--root", sub.to_str().unwrap()]),
    ] {
        for (skill, r) in [
            ("issue-triage", "apache/airflow"),
            ("ISSUE-TRIAGE", "apache/airflow.git"),
        ] {
            let out = Cmd::new(cwd)
                .args(&args)
                .args(["acquire", skill, "--repo", r])
                .run();
            let v = out.expect_reply(3, "already_running");
            assert_eq!(v.lock(), lock, "{args:?} {skill} {r}");
            assert_eq!(
                v.holder().skill,
                "Issue-Triage",
                "the record keeps the spelling"
            );
        }
    }
    assert!(!sub.join(".apache-magpie-local").exists());
    let l = Lock::new(&repo, "s", "o/r").list();
    assert_eq!(
        l.lock_names(),
        [("Issue-Triage".into(), "Apache/Airflow".into())]
    );
    for bad in ["a__b/c", "a_/c", "./c", "a/..", "a/.git"] {
        Lock::new(&repo, "s", bad)
            .op("acquire")
            .run()
            .expect_error("invalid_repo");
    }
}

fn lock_record(repo: &Path) -> PathBuf {
    run_dir(repo).join(format!("locks/{NAME}.lock/owner.json"))
}

fn rfc3339_in(secs: i64) -> String {
    let out = Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{}", now_secs() + secs),
            "+%Y-%m-%dT%H:%M:%SZ",
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn now_secs() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

#[test]
fn a_record_of_an_older_version_is_held_until_it_expires() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    acquired(&repo);
    let old = format!(
        r#"{{"started":"{}","expires":"{}","note":"written by 0.0.9"}}"#,
        rfc3339_in(-60),
        rfc3339_in(3600)
    );
    std::fs::write(lock_record(&repo), &old).unwrap();
    let st = lock(&repo).status();
    assert_eq!(st.state(), "held", "{st:?}");
    assert!(st.expires_in().unwrap() > 3500);
    let a = lock(&repo).acquire().is("already_running");
    assert_eq!(a.holder().note.as_deref(), Some("written by 0.0.9"));
    // No token can renew or release it; it ends with its lease.
    lock(&repo).renew("00").is("not_owner");
    std::fs::write(
        lock_record(&repo),
        format!(r#"{{"expires":"{}","owner_pid":1}}"#, rfc3339_in(-1)),
    )
    .unwrap();
    let t = acquired(&repo);
    assert_eq!(t.took_over().unwrap().reason, "expired");
}

#[test]
fn release_with_nothing_held_needs_no_write() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    acquired(&repo);
    release(&repo, "released");
    // No guard can be made: as on a read-only file system (root ignores modes).
    let keys = run_dir(&repo).join("keys");
    std::fs::remove_dir_all(&keys).unwrap();
    std::fs::write(&keys, "not a directory").unwrap();
    release(&repo, "not_held");
    lock(&repo).op("release").force().expect(0, "not_held");
    std::fs::remove_file(&keys).unwrap();
    // And on a real read-only mount, where this machine allows one.
    let script = format!(
        "mount --bind {d} {d} && mount -o remount,ro,bind {d} && {BIN} release s --repo o/r",
        d = repo.display()
    );
    if let Some(out) = in_private_mounts(&repo, &script) {
        out.expect(0, "not_held");
    }
}

/// `unshare` with a new pid namespace and /proc, as root or as a mapped user.
fn unshare_pid() -> Option<Vec<&'static str>> {
    for args in [
        vec!["--pid", "--fork", "--mount-proc"],
        vec!["-r", "--pid", "--fork", "--mount-proc"],
    ] {
        let ok = Command::new("unshare")
            .args(&args)
            .arg("true")
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(args);
        }
    }
    None
}

#[test]
fn an_owner_in_another_pid_namespace_is_judged_by_its_lease_alone() {
    let Some(unshare) = unshare_pid() else {
        eprintln!("SKIPPED: unshare --pid --fork --mount-proc is not allowed here");
        return;
    };
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    // Inside the namespace the shell is pid 1: it names itself the owner.
    let script = format!(
        "{BIN} acquire s --repo o/r --ttl 60 --owner-pid $$ && touch {ready} && sleep 3",
        ready = env.path("ready").display()
    );
    let mut inner = Command::new("unshare")
        .args(&unshare)
        .args(["sh", "-c", &script])
        .current_dir(&repo)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !env.path("ready").exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "inner acquire never finished"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let owner = harness::json_file_field(&lock_record(&repo), "owner_pid");
    assert_eq!(owner, 1, "the record's owner_pid");
    // Outside, pid 1 is another process: never judged, so never taken over.
    assert_eq!(state(&repo), "held");
    lock(&repo).acquire().is("already_running");
    inner.wait().unwrap();
    // Its owner is gone now, but that is not certain from here: the lease decides.
    lock(&repo).acquire().is("already_running");
}

#[test]
fn a_record_from_another_machine_with_the_same_hostname_is_judged_by_its_lease() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let a = lock(&repo).op("acquire").owner_pid(child.id()).reply();
    a.is("acquired");
    // A cloned VM or a `--hostname` container: same hostname, another machine and boot.
    harness::edit_json_file(
        &lock_record(&repo),
        &[
            ("machine", "0123456789abcdef0123456789abcdef".into()),
            ("boot_id", "00000000-0000-0000-0000-000000000000".into()),
        ],
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(state(&repo), "held");
    lock(&repo).acquire().is("already_running");
}

#[test]
fn a_takeover_whose_publish_fails_records_what_it_did() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    lock(&repo).op("acquire").ttl(1).reply().is("acquired");
    // A damaged lock (its record unreadable) is the one kind a takeover
    // buries before it publishes; a lock with a record is rewritten in place.
    let record = run_dir(&repo)
        .join("locks")
        .join(format!("{NAME}.lock/owner.json"));
    std::fs::write(&record, "{ not json").unwrap();
    // run/tmp on another file system: the new lock is built there but cannot
    // be renamed into run/locks (EXDEV), after the damaged lock was buried.
    let tmp = run_dir(&repo).join("tmp");
    let script = format!(
        "mount -t tmpfs -o mode=0700 none {} && exec {BIN} acquire s --repo o/r",
        tmp.display()
    );
    let Some(out) = in_private_mounts(&repo, &script) else {
        return;
    };
    out.expect_error("io");
    assert_eq!(state(&repo), "free");
    let history = lock(&repo).history();
    assert_eq!(
        history.event_kinds(),
        ["acquired", "took_over"],
        "{history:?}"
    );
    let last = &history.events()[1];
    assert_eq!(last.fence, None, "no new fence was published: {last:?}");
    let reason = last.reason.as_deref().unwrap();
    assert!(reason.contains("not published"), "{last:?}");
}

/// A takeover of a stale lock with a record rewrites the record in place;
/// when that write fails, the stale lock is exactly as it was (no gap in
/// which it was free, no history event), and the next takeover works.
#[test]
fn a_takeover_that_cannot_write_leaves_the_stale_lock_as_it_was() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    lock(&repo).op("acquire").ttl(1).reply().is("acquired");
    std::thread::sleep(Duration::from_millis(2100));
    let before = lock(&repo).status();
    let lock_dir = run_dir(&repo).join("locks").join(format!("{NAME}.lock"));
    // The lock directory read-only (a bind mount, which binds root too).
    let script = format!(
        "mount --bind {0} {0} && mount -o remount,bind,ro {0} && exec {BIN} acquire s --repo o/r",
        lock_dir.display()
    );
    let Some(out) = in_private_mounts(&repo, &script) else {
        return;
    };
    out.expect_error("io");
    let after = lock(&repo).status();
    assert_eq!(after.holder_opt(), before.holder_opt(), "{after:?}");
    assert_eq!(after.state(), before.state(), "{after:?}");
    let events = lock(&repo).history();
    assert_eq!(
        events.events().len(),
        1,
        "only the first acquire: {events:?}"
    );
    let v = acquired(&repo);
    let took = v.took_over().and_then(|t| t.holder.as_ref());
    assert_eq!(took.map(|h| h.fence), Some(1), "{v:?}");
    assert!(v.must_fence() > 1, "{v:?}");
}

/// Runs `script` with `sh` in a private user and mount namespace (so it may
/// mount); None (the test is skipped, and says so) where that is not allowed.
fn in_private_mounts(repo: &Path, script: &str) -> Option<harness::Out> {
    let out = Command::new("unshare")
        .args(["-r", "-m", "sh", "-c", script])
        .current_dir(repo)
        .output();
    match out {
        Ok(o) if !harness::Out::from(o.clone()).is_one_object() => {
            eprintln!(
                "SKIPPED: no private mounts here: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            None
        }
        Ok(o) => Some(harness::Out::from(o)),
        Err(e) => {
            eprintln!("SKIPPED: no unshare ({e})");
            None
        }
    }
}

/// `status`'s fence of a free lock and `--since` when the store forgot
/// fences: the counter alone removed (the history still knows), the counter
/// and the history removed, the counter set back below the fence `status`
/// showed. A read creates nothing, not even the guard.
#[test]
fn since_a_fence_the_store_forgot_cannot_be_answered_false() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    let lock = Lock::new(&repo, "s", "o/r");
    let run = run_dir(&repo);
    let counter = run.join(format!("keys/{NAME}.fence"));
    let forget_history = || {
        for name in ["history.jsonl", "history.1.jsonl"] {
            let _ = std::fs::remove_file(run.join(name));
        }
    };
    let cycle = |since: Option<u64>| {
        let a = lock.op("acquire").since(since).reply();
        assert!(matches!(a, Reply::Acquired { .. }), "{a:?}");
        lock.release(a.token());
        a.others_since().unwrap()
    };
    assert_eq!(lock.status_fence(), None);
    assert!(
        !repo.join(".git/apache-magpie").exists(),
        "status created the layer"
    );
    for _ in 0..3 {
        assert!(!cycle(lock.status_fence()));
    }
    assert_eq!(lock.status_fence(), Some(3));
    // The counter alone removed: the history still names fence 3.
    let since = lock.status_fence();
    std::fs::remove_file(&counter).unwrap();
    assert!(!cycle(since), "the history still knows the last fence");
    // Counter and history gone: the store cannot tell.
    let since = lock.status_fence();
    assert_eq!(since, Some(4));
    std::fs::remove_file(&counter).unwrap();
    forget_history();
    assert!(cycle(since), "after the counter and history were removed");
    for _ in 0..3 {
        cycle(None);
    }
    // The counter set back below the fence status showed, the history gone.
    let since = lock.status_fence().unwrap();
    std::fs::write(&counter, "1\n").unwrap();
    forget_history();
    assert!(cycle(Some(since)), "after the counter was set back");
    // With `keys/` removed by hand (no guard to take), status reads the
    // history, and creates nothing.
    let last = lock.status_fence().unwrap();
    std::fs::remove_dir_all(run.join("keys")).unwrap();
    assert_eq!(lock.status_fence(), Some(last));
    assert!(!run.join("keys").exists(), "status created keys/");
    assert!(!cycle(Some(last)));
}

// What follows came from `cli`: the file store's layout in a checkout, its
// modes, root discovery, a corrupt record, and how a `file:` store is named.

/// `issue-triage` of `apache/airflow`, seen from `cwd`.
fn triage(cwd: &Path) -> Lock {
    Lock::new(cwd, "issue-triage", "apache/airflow")
}

#[test]
fn the_lock_in_a_git_checkout_is_a_directory_with_its_record() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = triage(&repo);
    let a = lock.op("acquire").note("run 1\tok").ttl(600).reply();
    let token = a.token().to_owned();
    assert_eq!(a.fence(), Some(1));
    let dir = repo.join(".git/apache-magpie/run/locks/issue-triage@apache__airflow.lock");
    assert_eq!(a.lock(), dir.display().to_string());
    assert!(dir.join("owner.json").is_file());
    let record = std::fs::read_to_string(dir.join("owner.json")).unwrap();
    assert!(!record.contains(&token), "the token is stored only hashed");
    assert_eq!(
        std::fs::read_to_string(repo.join(".git/apache-magpie/run/.gitignore")).unwrap(),
        "*\n"
    );
    assert_eq!(lock.check(&token).is("held").fence(), Some(1));
    let released = lock.release(&token).is("released");
    assert_eq!(released.holder().fence, 1);
    assert!(!dir.exists());
    // The fence survives release.
    assert_eq!(lock.acquire().fence(), Some(2));
}

#[test]
fn modes_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    triage(&repo).acquire().is("acquired");
    let p = repo.join(".git/apache-magpie");
    for rel in harness::tree(&p) {
        let meta = std::fs::metadata(p.join(&rel)).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        let want = if meta.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, want, "{rel}");
    }
}

/// Acquires `issue-triage` of `apache/airflow` from `cwd`: the lock's path.
#[track_caller]
fn triage_lock_path(cwd: &Path) -> String {
    triage(cwd).acquire().is("acquired").lock().to_owned()
}

#[test]
fn roots_and_personal_layers() {
    let env = TestEnv::new();
    // Plain checkout, from a subdirectory.
    let repo = env.git_repo("plain");
    let sub = repo.join("a/b");
    std::fs::create_dir_all(&sub).unwrap();
    let lock = triage_lock_path(&sub);
    assert!(lock.starts_with(&format!("{}/.git/apache-magpie/run/locks/", repo.display())));

    // Linked worktree shares the main clone's common dir: they contend.
    let main = env.git_repo("main");
    let wt = env.worktree(&main, "wt");
    assert!(wt.join(".git").is_file());
    let lock = triage_lock_path(&wt);
    assert!(lock.starts_with(&format!("{}/.git/apache-magpie/", main.display())));
    triage(&main).acquire().is("already_running");
    assert!(!wt.join(".apache-magpie-local").exists());

    // Adopted git project: the git common directory too, never the working
    // tree (SPEC §5 rule 1), from a worktree too.
    let adopted = env.git_repo("adopted");
    std::fs::write(adopted.join(".apache-magpie.lock"), "").unwrap();
    let awt = env.worktree(&adopted, "awt");
    std::fs::write(awt.join(".apache-magpie.lock"), "").unwrap();
    let want = adopted.join(".git/apache-magpie/run/locks/issue-triage@apache__airflow.lock");
    assert_eq!(triage_lock_path(&awt), want.display().to_string());
    assert!(!awt.join(".apache-magpie-local").exists());
    assert!(!adopted.join(".apache-magpie-local").exists());
    triage(&adopted).acquire().is("already_running");

    // svn-like folder.
    let svn = env.svn_dir("svn");
    std::fs::create_dir_all(svn.join("trunk")).unwrap();
    let lock = triage_lock_path(&svn.join("trunk"));
    assert!(lock.starts_with(&format!("{}/.svn/apache-magpie/run/locks/", svn.display())));

    // Plain folder with --root (after the command word, and relative; and
    // before it).
    let plain = env.dir("folder");
    let a = triage(&env.root).op("acquire").root("folder").reply();
    let want = format!("{}/.apache-magpie-local/run/locks/", plain.display());
    assert!(a.is("acquired").lock().starts_with(&want));
    let before = Cmd::new(&env.root)
        .arg("--root")
        .arg(&plain)
        .args(["status", "issue-triage", "--repo", "apache/airflow"])
        .run();
    before.expect(0, "status");

    // No root at all.
    let nowhere = env.dir("nowhere");
    let out = triage(&nowhere).op("acquire").run();
    // The temp dir may sit below a checkout on odd machines; only judge when it does not.
    if !Path::new("/tmp/.git").exists() {
        out.expect_error("no_root");
        assert!(harness::tree(&nowhere).is_empty());
    }
    Lock::new(&nowhere, "issue-triage", "a/b")
        .op("status")
        .root("/does/not/exist")
        .run()
        .expect_error("no_root");
}

#[test]
fn corrupt_record_is_stale_and_taken_over() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = triage(&repo);
    let dir = PathBuf::from(lock.acquire().is("acquired").lock());
    std::fs::write(dir.join("owner.json"), b"{\"half\": ").unwrap();
    let s = lock.status();
    assert_eq!((s.state(), s.stale_reason()), ("stale", Some("corrupt")));
    assert_eq!(
        lock.list().locks()[0].stale_reason.as_deref(),
        Some("corrupt")
    );
    let b = lock.acquire().is("acquired");
    let took = b.took_over().unwrap();
    assert_eq!(
        (took.reason.as_str(), took.holder.as_ref()),
        ("corrupt", None)
    );
    assert_eq!(b.fence(), Some(2));
}

#[test]
fn list_names_the_checkouts_store_and_reading_creates_nothing() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    triage(&repo).acquire().is("acquired");
    let list = triage(&repo).list();
    assert_eq!(list.locks().len(), 1);
    assert!(
        list.store().ends_with(".git/apache-magpie/run/locks"),
        "{list:?}"
    );
    // Read-only in a fresh checkout: creates nothing.
    let fresh = env.git_repo("fresh");
    let before = harness::tree(&fresh);
    Lock::new(&fresh, "s", "o/r").list().is("list");
    Lock::new(&fresh, "s", "o/r").status().is("status");
    assert_eq!(harness::tree(&fresh), before);
}

/// `list` streams its locks in the order of SPEC §2.5: by skill, then by repo
/// compared case-insensitively; not the byte order of the lock names (where
/// `a.b@` sorts before `a@`). Enough locks to span several output buffers.
#[test]
fn list_is_sorted_by_skill_then_repo_across_many_locks() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let mut want = Vec::new();
    // Skills and repos are one lock whatever their case (SPEC §5), so the
    // spellings here differ in more than case.
    for skill in ["a", "a.b", "Ab", "a-b", "b"] {
        for repo_name in ["o/R", "O/a", "o/b"] {
            want.push((skill.to_owned(), repo_name.to_owned()));
        }
    }
    for i in 0..150 {
        want.push((format!("bulk{i}"), "o/r".to_owned()));
    }
    for (skill, repo_name) in &want {
        let lock = Lock::new(&repo, skill, repo_name);
        lock.op("acquire")
            .note("x".repeat(400))
            .reply()
            .is("acquired");
    }
    want.sort_by_key(|(s, r)| (s.to_ascii_lowercase(), r.to_ascii_lowercase()));
    let out = Lock::new(&repo, "a", "o/r").store_op("list").run();
    assert!(out.stdout.len() > 2 * 64 * 1024, "spans several buffers");
    let list = out.expect_reply(0, "list");
    assert_eq!(list.lock_names(), want);
    assert_eq!(list.tombstones(), 0);
}

#[test]
fn file_store_url_and_environment_select_another_directory() {
    let env = TestEnv::new();
    let elsewhere = env.dir("shared-locks");
    let nowhere = env.dir("no-root-needed");
    let url = format!("file:{}", elsewhere.display());
    let a = Lock::new(&nowhere, "s", "o/r")
        .op("acquire")
        .store(&url)
        .reply();
    let want = format!("{}/run/locks/", elsewhere.display());
    assert!(a.is("acquired").lock().starts_with(&want));
    let by_env = Lock::new(&nowhere, "s", "o/r").with_env("SKILL_LOCK_STORE", &url);
    let held = by_env.acquire().is("already_running");
    assert!(held.hint().ends_with(&format!("--force --store {url}")));
    // A skill-lock.toml in the personal layer is never read (a tree can
    // carry one, SPEC §5): with nothing the user set, it is refused...
    let repo = env.git_repo("r");
    std::fs::create_dir_all(repo.join(".git/apache-magpie")).unwrap();
    let planted = repo.join(".git/apache-magpie/skill-lock.toml");
    std::fs::write(&planted, format!("store = \"{url}\"\n")).unwrap();
    let m = Lock::new(&repo, "s", "o/r")
        .op("acquire")
        .run()
        .error_message("usage");
    assert!(m.contains(planted.to_str().unwrap()), "{m}");
    // ...and the user's configuration file chooses the store (SPEC §8).
    let config = env.path("user.toml");
    std::fs::write(&config, format!("[repos]\n\"o/*\" = \"{url}\"\n")).unwrap();
    Lock::new(&repo, "s", "o/r")
        .with_env("SKILL_LOCK_CONFIG", &config)
        .acquire()
        .is("already_running");
}
