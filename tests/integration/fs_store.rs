//! The file store at its edges (issue 12): a layout cut short or removed by
//! hand, damaged fence counters, readers racing takeovers, a process stopped
//! inside the guard, spellings of one lock, records of older versions,
//! read-only layers, pid namespaces and other machines. Each test fails on
//! the code before its fix.
//!
//! Covers: SPEC §2.1, §2.4, §5, §6, §7.

use crate::common;

use common::verbs::{Lock, Reply};
use common::{BIN, Cmd, TestEnv, Value};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const NAME: &str = "s@o__r";

fn run_dir(repo: &Path) -> PathBuf {
    repo.join(".git/apache-magpie/run")
}

fn acquire(env: &TestEnv, repo: &Path, extra: &[&str]) -> common::Out {
    env.cmd(repo)
        .args(["acquire", "s", "--repo", "o/r"])
        .args(extra)
        .run()
}

fn release(env: &TestEnv, repo: &Path, extra: &[&str]) -> common::Out {
    env.cmd(repo)
        .args(["release", "s", "--repo", "o/r"])
        .args(extra)
        .run()
}

/// The lock's history events, oldest first.
fn history(env: &TestEnv, repo: &Path) -> Vec<Value> {
    let h = env.cmd(repo).args(["history", "s", "--repo", "o/r"]).run();
    h.expect(0, "history")["events"].as_array().unwrap().clone()
}

fn status(env: &TestEnv, repo: &Path) -> Value {
    env.cmd(repo)
        .args(["status", "s", "--repo", "o/r"])
        .run()
        .expect(0, "status")
        .clone()
}

/// A checkout without running git: a `.git` directory is a marker.
fn bare_checkout(env: &TestEnv, rel: &str) -> PathBuf {
    let d = env.dir(rel);
    std::fs::create_dir_all(d.join(".git")).unwrap();
    d
}

#[test]
fn a_layout_removed_by_hand_heals_and_release_that_says_released_has_released() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    let run = run_dir(&repo);
    for part in ["tmp", "locks", "tombs", "keys", ""] {
        let a = acquire(&env, &repo, &[]);
        a.expect(0, "acquired");
        std::fs::remove_dir_all(run.join(part)).unwrap();
        if part == "locks" || part.is_empty() {
            // The lock went with it: the next acquire creates it afresh.
            assert_eq!(status(&env, &repo)["state"], "free", "{part}");
        } else {
            // The lock is still there: a forced release removes it, for real.
            release(&env, &repo, &["--force"]).expect(0, "released");
            assert_eq!(status(&env, &repo)["state"], "free", "after rm {part}");
        }
        acquire(&env, &repo, &[]).expect(0, "acquired");
        release(&env, &repo, &[]).expect(0, "released");
        for sub in ["tmp", "locks", "tombs", "keys"] {
            assert!(run.join(sub).is_dir(), "{sub} re-created after rm {part}");
        }
    }
}

/// xorshift64*, seeded from the clock and printed so a failure can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn seed() -> u64 {
    std::env::var("FS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            u64::from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .subsec_nanos(),
            ) | 1
        })
}

#[test]
fn sigkill_while_the_layer_is_first_created_never_leaves_it_stuck() {
    let env = TestEnv::new();
    let seed = seed();
    eprintln!("FS_SEED={seed}");
    let mut rng = Rng(seed);
    let mut killed = 0;
    for i in 0..120 {
        let repo = bare_checkout(&env, &format!("k{i}"));
        let mut child = Cmd::new(&repo)
            .args(["acquire", "s", "--repo", "o/r"])
            .command()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.next() % 4000));
        if child.kill().is_ok() {
            killed += 1;
        }
        child.wait().unwrap();
        // Whatever the kill left, the lock works: release, then acquire.
        let was = if status(&env, &repo)["state"] == "free" {
            "not_held"
        } else {
            "released"
        };
        release(&env, &repo, &[]).expect(0, was);
        acquire(&env, &repo, &[]).expect(0, "acquired");
    }
    eprintln!("{killed} of 120 acquires killed in flight");
}

fn fence_of(out: &common::Out) -> u64 {
    out.expect(0, "acquired")["fence"].as_u64().unwrap()
}

#[test]
fn fences_never_repeat_or_go_back_when_the_counter_is_damaged() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    let counter = run_dir(&repo).join(format!("keys/{NAME}.fence"));
    let mut last = 0;
    let mut step = |damage: &dyn Fn()| {
        damage();
        let f = fence_of(&acquire(&env, &repo, &[]));
        assert!(f > last, "fence {f} after {last}");
        last = f;
        release(&env, &repo, &[]).expect(0, "released");
    };
    for _ in 0..3 {
        step(&|| {});
    }
    step(&|| std::fs::write(&counter, "3x").unwrap());
    step(&|| std::fs::write(&counter, "").unwrap());
    step(&|| std::fs::remove_file(&counter).unwrap());
    step(&|| std::fs::remove_dir_all(counter.parent().unwrap()).unwrap());
    // Damaged while held: the record in place counts too.
    let f = fence_of(&acquire(&env, &repo, &["--ttl", "1"]));
    std::fs::write(&counter, "garbage").unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    let t = acquire(&env, &repo, &[]);
    assert!(fence_of(&t) > f);
    release(&env, &repo, &[]).expect(0, "released");
    // The last fence there is: refused, never wrapped to 0.
    std::fs::write(&counter, format!("{}\n", u64::MAX)).unwrap();
    let out = acquire(&env, &repo, &[]);
    let v = out.expect_error("io");
    assert!(
        v["message"].as_str().unwrap().contains("fence"),
        "{}",
        out.stdout
    );
    assert_eq!(status(&env, &repo)["state"], "free");
}

#[test]
fn readers_never_report_corrupt_while_the_lock_is_retaken() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    acquire(&env, &repo, &[]).expect(0, "acquired");
    let stop = AtomicBool::new(false);
    let (reads, corrupt, cycles) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    // Unconditional release, then acquire: the lock directory
                    // is buried and re-published back to back.
                    release(&env, &repo, &[]);
                    acquire(&env, &repo, &[]);
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for _ in 0..6 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let v = status(&env, &repo);
                    reads.fetch_add(1, Ordering::Relaxed);
                    if v["stale_reason"] == "corrupt" {
                        corrupt.fetch_add(1, Ordering::Relaxed);
                        eprintln!("corrupt: {v}");
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
    acquire(&env, &repo, &["--ttl", "1"]).expect(0, "acquired");
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
    let mut child = Cmd::new(&repo)
        .args(["acquire", "s", "--repo", "o/r"])
        .command()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
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
    let out = common::Out::from(out);
    let v = out.expect_error("store_unavailable");
    let msg = v["message"].as_str().unwrap();
    assert!(msg.contains(&pid.to_string()), "names the process: {msg}");
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(20),
        "{waited:?}"
    );
    // Once it is gone, everything works again.
    let again = acquire(&env, &repo, &[]);
    assert_eq!(
        again.expect(0, "acquired")["took_over"]["reason"],
        "expired"
    );
}

#[test]
fn one_lock_whatever_the_spelling() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let sub = env.dir("r/docs/sub");
    let a = env
        .cmd(&repo)
        .args(["acquire", "Issue-Triage", "--repo", "Apache/Airflow"])
        .run();
    let lock = a.expect(0, "acquired")["lock"].as_str().unwrap().to_owned();
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
            let out = env
                .cmd(cwd)
                .args(&args)
                .args(["acquire", skill, "--repo", r])
                .run();
            let v = out.expect(3, "already_running");
            assert_eq!(v["lock"], lock.as_str(), "{args:?} {skill} {r}");
            assert_eq!(
                v["holder"]["skill"], "Issue-Triage",
                "the record keeps the spelling"
            );
        }
    }
    assert!(!sub.join(".apache-magpie-local").exists());
    let l = env.cmd(&repo).arg("list").run();
    let v = l.expect(0, "list");
    assert_eq!(v["locks"].as_array().unwrap().len(), 1);
    assert_eq!(v["locks"][0]["skill"], "Issue-Triage");
    for bad in ["a__b/c", "a_/c", "./c", "a/..", "a/.git"] {
        env.cmd(&repo)
            .args(["acquire", "s", "--repo", bad])
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
    acquire(&env, &repo, &[]).expect(0, "acquired");
    let old = format!(
        r#"{{"started":"{}","expires":"{}","note":"written by 0.0.9"}}"#,
        rfc3339_in(-60),
        rfc3339_in(3600)
    );
    std::fs::write(lock_record(&repo), &old).unwrap();
    let st = status(&env, &repo);
    assert_eq!(st["state"], "held", "{st}");
    assert!(st["expires_in"].as_u64().unwrap() > 3500);
    let a = acquire(&env, &repo, &[]);
    assert_eq!(
        a.expect(3, "already_running")["holder"]["note"],
        "written by 0.0.9"
    );
    // No token can renew or release it; it ends with its lease.
    env.cmd(&repo)
        .args(["renew", "s", "--repo", "o/r", "--token", "00"])
        .run()
        .expect(4, "not_owner");
    std::fs::write(
        lock_record(&repo),
        format!(r#"{{"expires":"{}","owner_pid":1}}"#, rfc3339_in(-1)),
    )
    .unwrap();
    let t = acquire(&env, &repo, &[]);
    assert_eq!(t.expect(0, "acquired")["took_over"]["reason"], "expired");
}

#[test]
fn release_with_nothing_held_needs_no_write() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    acquire(&env, &repo, &[]).expect(0, "acquired");
    release(&env, &repo, &[]).expect(0, "released");
    // No guard can be made: as on a read-only file system (root ignores modes).
    let keys = run_dir(&repo).join("keys");
    std::fs::remove_dir_all(&keys).unwrap();
    std::fs::write(&keys, "not a directory").unwrap();
    release(&env, &repo, &[]).expect(0, "not_held");
    release(&env, &repo, &["--force"]).expect(0, "not_held");
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
    let rec: Value =
        serde_json::from_str(&std::fs::read_to_string(lock_record(&repo)).unwrap()).unwrap();
    assert_eq!(rec["owner_pid"], 1, "{rec}");
    // Outside, pid 1 is another process: never judged, so never taken over.
    let st = status(&env, &repo);
    assert_eq!(st["state"], "held", "{st}");
    acquire(&env, &repo, &[]).expect(3, "already_running");
    inner.wait().unwrap();
    // Its owner is gone now, but that is not certain from here: the lease decides.
    acquire(&env, &repo, &[]).expect(3, "already_running");
}

#[test]
fn a_record_from_another_machine_with_the_same_hostname_is_judged_by_its_lease() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    acquire(&env, &repo, &["--owner-pid", &child.id().to_string()]).expect(0, "acquired");
    let path = lock_record(&repo);
    let mut rec: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // A cloned VM or a `--hostname` container: same hostname, another machine and boot.
    rec["machine"] = "0123456789abcdef0123456789abcdef".into();
    rec["boot_id"] = "00000000-0000-0000-0000-000000000000".into();
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let st = status(&env, &repo);
    assert_eq!(st["state"], "held", "{st}");
    acquire(&env, &repo, &[]).expect(3, "already_running");
}

#[test]
fn a_takeover_whose_publish_fails_records_what_it_did() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    acquire(&env, &repo, &["--ttl", "1"]).expect(0, "acquired");
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
    assert_eq!(status(&env, &repo)["state"], "free");
    let events = history(&env, &repo);
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["acquired", "took_over"], "{events:?}");
    let last = &events[1];
    assert!(
        last["fence"].is_null(),
        "no new fence was published: {last}"
    );
    assert!(
        last["reason"].as_str().unwrap().contains("not published"),
        "{last}"
    );
}

/// A takeover of a stale lock with a record rewrites the record in place;
/// when that write fails, the stale lock is exactly as it was (no gap in
/// which it was free, no history event), and the next takeover works.
#[test]
fn a_takeover_that_cannot_write_leaves_the_stale_lock_as_it_was() {
    let env = TestEnv::new();
    let repo = bare_checkout(&env, "r");
    acquire(&env, &repo, &["--ttl", "1"]).expect(0, "acquired");
    std::thread::sleep(Duration::from_millis(2100));
    let before = status(&env, &repo);
    let lock = run_dir(&repo).join("locks").join(format!("{NAME}.lock"));
    // The lock directory read-only (a bind mount, which binds root too).
    let script = format!(
        "mount --bind {0} {0} && mount -o remount,bind,ro {0} && exec {BIN} acquire s --repo o/r",
        lock.display()
    );
    let Some(out) = in_private_mounts(&repo, &script) else {
        return;
    };
    out.expect_error("io");
    let after = status(&env, &repo);
    assert_eq!(after["holder"], before["holder"], "{after}");
    assert_eq!(after["state"], before["state"], "{after}");
    let events = history(&env, &repo);
    assert_eq!(events.len(), 1, "only the first acquire: {events:?}");
    let v = acquire(&env, &repo, &[]).expect(0, "acquired").clone();
    assert_eq!(v["took_over"]["holder"]["fence"], 1, "{v}");
    assert!(v["fence"].as_u64().unwrap() > 1, "{v}");
}

/// Runs `script` with `sh` in a private user and mount namespace (so it may
/// mount); None (the test is skipped, and says so) where that is not allowed.
fn in_private_mounts(repo: &Path, script: &str) -> Option<common::Out> {
    let out = Command::new("unshare")
        .args(["-r", "-m", "sh", "-c", script])
        .current_dir(repo)
        .output();
    match out {
        Ok(o) if common::Out::from(o.clone()).json.is_null() => {
            eprintln!(
                "SKIPPED: no private mounts here: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            None
        }
        Ok(o) => Some(common::Out::from(o)),
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
        let a = lock.acquire_since(since, &[]);
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
