//! The contract of SPEC §2-§6 through the real binary, in real temporary git
//! repositories, worktrees, svn-like folders and plain folders.
//!
//! Covers: SPEC §2, §3, §4, §5, §6.

use crate::common;

use common::verbs::{Lock, Reply, reply};
use common::{TestEnv, Value, tree};
use std::path::Path;

fn acquire(env: &TestEnv, cwd: &Path, extra: &[&str]) -> Value {
    env.cmd(cwd)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .args(extra)
        .run()
        .expect(0, "acquired")
        .clone()
}

const HOLDER_FIELDS: [&str; 11] = [
    "skill",
    "repo",
    "started",
    "expires",
    "renewed",
    "ttl",
    "note",
    "host",
    "owner_pid",
    "fence",
    "format",
];

fn assert_holder(h: &Value) {
    for f in HOLDER_FIELDS {
        assert!(h.get(f).is_some(), "holder lacks {f}: {h}");
    }
    assert!(
        h.get("token").is_none() && h.get("token_sha256").is_none(),
        "holder shows the token: {h}"
    );
}

fn is_rfc3339_second(v: &Value) -> bool {
    let s = v.as_str().unwrap_or("");
    s.len() == 20 && s.ends_with('Z') && s.as_bytes()[10] == b'T'
}

#[test]
fn acquire_held_release_cycle_in_a_git_checkout() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let a = acquire(&env, &repo, &["--note", "run 1\tok", "--ttl", "600"]);
    let token = a["token"].as_str().unwrap().to_owned();
    assert_eq!(token.len(), 32);
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert_eq!(a["ttl"], 600);
    assert_eq!(a["note"], "run 1\tok");
    assert_eq!(a["took_over"], Value::Null);
    assert_eq!(a["fence"], 1);
    assert!(is_rfc3339_second(&a["started"]) && is_rfc3339_second(&a["expires"]));
    let lock = repo.join(".git/apache-magpie/run/locks/issue-triage@apache__airflow.lock");
    assert_eq!(a["lock"], lock.display().to_string());
    assert!(lock.join("owner.json").is_file());
    let record = std::fs::read_to_string(lock.join("owner.json")).unwrap();
    assert!(!record.contains(&token), "the token is stored only hashed");
    assert_eq!(
        std::fs::read_to_string(repo.join(".git/apache-magpie/run/.gitignore")).unwrap(),
        "*\n"
    );

    // A second run, spelling the repo differently, finds it held.
    let held = env
        .cmd(&repo)
        .args(["acquire", "issue-triage", "--repo", "Apache/AIRFLOW"])
        .run();
    let v = held.expect(3, "already_running");
    assert_holder(&v["holder"]);
    assert_eq!(v["holder"]["note"], "run 1\tok");
    assert_eq!(v["repo"], "Apache/AIRFLOW");
    let left = v["expires_in"].as_u64().unwrap();
    assert!((598..=601).contains(&left), "{left}");
    let hint = v["hint"].as_str().unwrap();
    // Not on PATH here: the hint names this program by its absolute path.
    assert!(
        hint.starts_with(&format!(
            "{} release issue-triage --repo Apache/AIRFLOW --force",
            common::BIN
        )),
        "{hint}"
    );
    assert!(!held.stdout.contains(&token));

    // Other skill, other repo: no contention.
    env.cmd(&repo)
        .args(["acquire", "issue-stale-sweep", "--repo", "apache/airflow"])
        .run()
        .expect(0, "acquired");
    env.cmd(&repo)
        .args(["acquire", "issue-triage", "--repo", "apache/other"])
        .run()
        .expect(0, "acquired");

    let st = env
        .cmd(&repo)
        .args(["status", "issue-triage", "--repo", "apache/airflow"])
        .run();
    let s = st.expect(0, "status");
    assert_eq!(s["state"], "held");
    assert_holder(&s["holder"]);

    // The same steps in verbs, read into typed replies.
    let triage = Lock::new(&repo, "issue-triage", "apache/airflow");
    assert!(matches!(triage.check(&token), Reply::Held { fence: 1, .. }));
    assert!(matches!(triage.check("0123"), Reply::NotOwner { .. }));
    let Reply::Released {
        forced: false,
        holder: Some(removed),
        ..
    } = triage.release(&token)
    else {
        panic!("not released with its token")
    };
    assert_eq!(removed.fence, 1);
    assert!(!lock.exists());
    let out = triage.cmd("release", &[]).run();
    assert!(matches!(reply(&out), Reply::NotHeld { .. }) && out.code == 0);
    let out = triage.cmd("check", &["--token", &token]).run();
    assert!(matches!(reply(&out), Reply::NotHeld { .. }) && out.code == 4);
    let s = env
        .cmd(&repo)
        .args(["status", "issue-triage", "--repo", "apache/airflow"])
        .run();
    assert_eq!(s.expect(0, "status")["state"], "free");

    // The fence survives release.
    let again = acquire(&env, &repo, &[]);
    assert_eq!(again["fence"], 2);
    assert_eq!(again["ttl"], 7200);
    assert_eq!(again["note"], Value::Null);
}

#[test]
fn modes_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    acquire(&env, &repo, &[]);
    let p = repo.join(".git/apache-magpie");
    for rel in tree(&p) {
        let meta = std::fs::metadata(p.join(&rel)).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        let want = if meta.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, want, "{rel}");
    }
}

#[test]
fn roots_and_personal_layers() {
    let env = TestEnv::new();
    // Plain checkout, from a subdirectory.
    let repo = env.git_repo("plain");
    let sub = repo.join("a/b");
    std::fs::create_dir_all(&sub).unwrap();
    let a = acquire(&env, &sub, &[]);
    assert!(
        a["lock"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/.git/apache-magpie/run/locks/", repo.display()))
    );

    // Linked worktree shares the main clone's common dir: they contend.
    let main = env.git_repo("main");
    let wt = env.worktree(&main, "wt");
    assert!(wt.join(".git").is_file());
    let a = acquire(&env, &wt, &[]);
    assert!(
        a["lock"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/.git/apache-magpie/", main.display()))
    );
    env.cmd(&main)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .run()
        .expect(3, "already_running");
    assert!(!wt.join(".apache-magpie-local").exists());

    // Adopted git project: the git common directory too, never the working
    // tree (SPEC §5 rule 1), from a worktree too.
    let adopted = env.git_repo("adopted");
    std::fs::write(adopted.join(".apache-magpie.lock"), "").unwrap();
    let awt = env.worktree(&adopted, "awt");
    std::fs::write(awt.join(".apache-magpie.lock"), "").unwrap();
    let a = acquire(&env, &awt, &[]);
    assert_eq!(
        a["lock"],
        adopted
            .join(".git/apache-magpie/run/locks/issue-triage@apache__airflow.lock")
            .display()
            .to_string()
    );
    assert!(!awt.join(".apache-magpie-local").exists());
    assert!(!adopted.join(".apache-magpie-local").exists());
    env.cmd(&adopted)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .run()
        .expect(3, "already_running");

    // svn-like folder.
    let svn = env.svn_dir("svn");
    std::fs::create_dir_all(svn.join("trunk")).unwrap();
    let a = acquire(&env, &svn.join("trunk"), &[]);
    assert!(
        a["lock"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/.svn/apache-magpie/run/locks/", svn.display()))
    );

    // Plain folder with --root (also after the command word, and relative).
    let plain = env.dir("folder");
    let a = env
        .cmd(&env.root)
        .args([
            "acquire",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--root",
            "folder",
        ])
        .run();
    assert!(
        a.expect(0, "acquired")["lock"]
            .as_str()
            .unwrap()
            .starts_with(&format!(
                "{}/.apache-magpie-local/run/locks/",
                plain.display()
            ))
    );
    env.cmd(&env.root)
        .args([
            "--root",
            plain.to_str().unwrap(),
            "status",
            "issue-triage",
            "--repo",
            "apache/airflow",
        ])
        .run()
        .expect(0, "status");

    // No root at all.
    let nowhere = env.dir("nowhere");
    let out = env
        .cmd(&nowhere)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .run();
    // The temp dir may sit below a checkout on odd machines; only judge when it does not.
    if !Path::new("/tmp/.git").exists() {
        out.expect_error("no_root");
        assert!(tree(&nowhere).is_empty());
    }
    env.cmd(&nowhere)
        .args([
            "status",
            "issue-triage",
            "--repo",
            "a/b",
            "--root",
            "/does/not/exist",
        ])
        .run()
        .expect_error("no_root");
}

#[test]
fn expired_lease_is_taken_over_and_old_token_is_powerless() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let old = acquire(&env, &repo, &["--ttl", "1", "--note", "old"]);
    let old_token = old["token"].as_str().unwrap().to_owned();
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let s = env
        .cmd(&repo)
        .args(["status", "issue-triage", "--repo", "apache/airflow"])
        .run();
    let s = s.expect(0, "status");
    assert_eq!(
        (s["state"].as_str(), s["stale_reason"].as_str()),
        (Some("stale"), Some("expired"))
    );
    env.cmd(&repo)
        .args([
            "check",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &old_token,
        ])
        .run()
        .expect(4, "expired");
    let new = acquire(&env, &repo, &["--note", "new"]);
    assert_eq!(new["took_over"]["reason"], "expired");
    assert_eq!(new["took_over"]["holder"]["note"], "old");
    assert!(new["fence"].as_u64() > old["fence"].as_u64());
    let new_token = new["token"].as_str().unwrap();

    // The taken-over run can neither renew, check nor release the new holder's lock.
    let r = env
        .cmd(&repo)
        .args([
            "renew",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &old_token,
        ])
        .run();
    assert_eq!(r.expect(4, "not_owner")["holder"]["note"], "new");
    env.cmd(&repo)
        .args([
            "check",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &old_token,
        ])
        .run()
        .expect(4, "not_owner");
    let r = env
        .cmd(&repo)
        .args([
            "release",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &old_token,
        ])
        .run();
    assert_eq!(r.expect(4, "refused")["holder"]["note"], "new");
    env.cmd(&repo)
        .args([
            "check",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            new_token,
        ])
        .run()
        .expect(0, "held");

    // The operator's override.
    let f = env
        .cmd(&repo)
        .args([
            "release",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &old_token,
            "--force",
        ])
        .run();
    let f = f.expect(0, "released");
    assert_eq!(f["forced"], true);
    assert_eq!(f["holder"]["note"], "new");
}

#[test]
fn renew_extends_and_may_revive_its_own_expired_lease() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let a = acquire(&env, &repo, &["--ttl", "1"]);
    let token = a["token"].as_str().unwrap().to_owned();
    let r = env
        .cmd(&repo)
        .args([
            "renew",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &token,
            "--ttl",
            "100",
        ])
        .run();
    let r = r.expect(0, "renewed");
    assert_eq!(
        (r["ttl"].as_u64(), r["was_expired"].as_bool()),
        (Some(100), Some(false))
    );
    assert!(is_rfc3339_second(&r["expires"]) && is_rfc3339_second(&r["renewed"]));
    assert_eq!(r["fence"], a["fence"]);
    // Default ttl of renew is the lock's own ttl (now 100).
    let r = env
        .cmd(&repo)
        .args(["renew", "issue-triage", "--repo", "apache/airflow"])
        .run();
    assert_eq!(r.expect(0, "renewed")["ttl"], 100);
    let r = env
        .cmd(&repo)
        .args([
            "renew",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &token,
            "--ttl",
            "1",
        ])
        .run();
    r.expect(0, "renewed");
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let r = env
        .cmd(&repo)
        .args([
            "renew",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &token,
            "--ttl",
            "60",
        ])
        .run();
    assert_eq!(r.expect(0, "renewed")["was_expired"], true);
    env.cmd(&repo)
        .args([
            "check",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &token,
        ])
        .run()
        .expect(0, "held");
    env.cmd(&repo)
        .args(["release", "issue-triage", "--repo", "apache/airflow"])
        .run()
        .expect(0, "released");
    env.cmd(&repo)
        .args(["renew", "issue-triage", "--repo", "apache/airflow"])
        .run()
        .expect(4, "not_held");
}

#[test]
fn dead_owner_pid_makes_the_lock_stale() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let a = acquire(&env, &repo, &["--owner-pid", &pid]);
    assert_eq!(a["owner_pid"], child.id());
    env.cmd(&repo)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .run()
        .expect(3, "already_running");
    child.kill().unwrap();
    child.wait().unwrap();
    let s = env
        .cmd(&repo)
        .args(["status", "issue-triage", "--repo", "apache/airflow"])
        .run();
    assert_eq!(s.expect(0, "status")["stale_reason"], "owner_dead");
    let b = acquire(&env, &repo, &[]);
    assert_eq!(b["took_over"]["reason"], "owner_dead");
    assert_eq!(b["took_over"]["holder"]["owner_pid"], a["owner_pid"]);

    // A pid recorded on another host is not judged here.
    env.cmd(&repo)
        .args(["release", "issue-triage", "--repo", "apache/airflow"])
        .run()
        .expect(0, "released");
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    env.cmd(&repo)
        .env("SKILL_LOCK_HOST", "elsewhere")
        .args([
            "acquire",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--owner-pid",
            &child.id().to_string(),
        ])
        .run()
        .expect(0, "acquired");
    child.kill().unwrap();
    child.wait().unwrap();
    env.cmd(&repo)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .run()
        .expect(3, "already_running");
}

#[test]
fn corrupt_record_is_stale_and_taken_over() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let a = acquire(&env, &repo, &[]);
    let lock = Path::new(a["lock"].as_str().unwrap()).to_path_buf();
    std::fs::write(lock.join("owner.json"), b"{\"half\": ").unwrap();
    let s = env
        .cmd(&repo)
        .args(["status", "issue-triage", "--repo", "apache/airflow"])
        .run();
    let s = s.expect(0, "status");
    assert_eq!(
        (s["state"].as_str(), s["stale_reason"].as_str()),
        (Some("stale"), Some("corrupt"))
    );
    let l = env.cmd(&repo).arg("list").run();
    assert_eq!(l.expect(0, "list")["locks"][0]["stale_reason"], "corrupt");
    let b = acquire(&env, &repo, &[]);
    assert_eq!(b["took_over"]["reason"], "corrupt");
    assert_eq!(b["took_over"]["holder"], Value::Null);
    assert_eq!(b["fence"], 2);
}

#[test]
fn list_is_sorted_and_complete() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    for (skill, r) in [
        ("pr-triage", "b/x"),
        ("issue-triage", "Zed/a"),
        ("issue-triage", "apache/b"),
        ("a1", "o/r"),
    ] {
        env.cmd(&repo)
            .args(["acquire", skill, "--repo", r])
            .run()
            .expect(0, "acquired");
    }
    let out = env.cmd(&repo).arg("list").run();
    let v = out.expect(0, "list");
    let got: Vec<(String, String)> = v["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["skill"].as_str().unwrap().to_owned(),
                l["repo"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want = [
        ("a1", "o/r"),
        ("issue-triage", "apache/b"),
        ("issue-triage", "Zed/a"),
        ("pr-triage", "b/x"),
    ];
    assert_eq!(got, want.map(|(a, b)| (a.to_owned(), b.to_owned())));
    for l in v["locks"].as_array().unwrap() {
        assert_eq!(l["state"], "held");
        assert_holder(&l["holder"]);
        assert!(l["expires_in"].as_u64().unwrap() > 7000);
    }
    assert_eq!(v["tombstones"], 0);
    assert!(
        v["store"]
            .as_str()
            .unwrap()
            .ends_with(".git/apache-magpie/run/locks")
    );
    // Read-only in a fresh checkout: creates nothing.
    let fresh = env.git_repo("fresh");
    let before = tree(&fresh);
    env.cmd(&fresh).arg("list").run().expect(0, "list");
    env.cmd(&fresh)
        .args(["status", "s", "--repo", "o/r"])
        .run()
        .expect(0, "status");
    assert_eq!(tree(&fresh), before);
}

#[test]
fn bad_input_is_refused_with_nothing_created() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let before = tree(&repo);
    let cases: &[(&[&str], &str)] = &[
        (&["acquire", "", "--repo", "a/b"], "invalid_skill"),
        (&["acquire", "-x", "--repo", "a/b"], "usage"),
        (&["acquire", ".x", "--repo", "a/b"], "invalid_skill"),
        (&["acquire", "a/b", "--repo", "a/b"], "invalid_skill"),
        (&["acquire", "a@b", "--repo", "a/b"], "invalid_skill"),
        (
            &["acquire", &"s".repeat(65), "--repo", "a/b"],
            "invalid_skill",
        ),
        (&["acquire", "s", "--repo", "ab"], "invalid_repo"),
        (&["acquire", "s", "--repo", "a/b/c"], "invalid_repo"),
        (&["acquire", "s", "--repo", "../b"], "invalid_repo"),
        (&["acquire", "s", "--repo", "a/.."], "invalid_repo"),
        (&["acquire", "s", "--repo", "a__x/b"], "invalid_repo"),
        (&["acquire", "s", "--repo", "a_/b"], "invalid_repo"),
        (&["acquire", "s", "--repo", "a b/c"], "invalid_repo"),
        (
            &["acquire", "s", "--repo", &format!("{}/b", "o".repeat(101))],
            "invalid_repo",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--ttl", "0"],
            "invalid_ttl",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--ttl", "2592001"],
            "invalid_ttl",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--ttl", "ten"],
            "invalid_ttl",
        ),
        (
            &["renew", "s", "--repo", "a/b", "--ttl", "-5"],
            "invalid_ttl",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--note", "two\nlines"],
            "invalid_note",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--note", &"n".repeat(1001)],
            "invalid_note",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--owner-pid", "0"],
            "invalid_pid",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--owner-pid", "abc"],
            "invalid_pid",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--owner-pid", "2147483647"],
            "invalid_pid",
        ),
        (&["acquire", "s", "--repo", "a/b", "--since", "-1"], "usage"),
        (
            &["acquire", "s", "--repo", "a/b", "--since", "fence"],
            "usage",
        ),
        (&["acquire", "s", "--repo", "a/b", "--since", ""], "usage"),
        (&["acquire", "s"], "usage"),
        (&["check", "s", "--repo", "a/b"], "usage"),
        (&["frobnicate"], "usage"),
        (&[], "usage"),
        (&["acquire", "s", "--repo", "a/b", "--bogus"], "usage"),
        (
            &["acquire", "s", "--repo", "a/b", "--store", "redis://x"],
            "usage",
        ),
    ];
    for (args, code) in cases {
        let out = env.cmd(&repo).args(*args).run();
        assert_eq!(out.json["error"], *code, "{args:?}: {}", out.stdout);
        out.expect_error(code);
    }
    // A note of exactly 1,000 bytes (multi-byte) is fine.
    let note = "é".repeat(500);
    env.cmd(&repo)
        .args(["status", "s", "--repo", "a/b"])
        .run()
        .expect(0, "status");
    assert_eq!(tree(&repo), before, "bad input created files");
    env.cmd(&repo)
        .args(["acquire", "s", "--repo", "a/b", "--note", &note])
        .run()
        .expect(0, "acquired");
}

#[test]
fn non_utf8_arguments_are_refused() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let bad = OsStr::from_bytes(b"s\xff");
    let out = env
        .cmd(&repo)
        .arg("acquire")
        .arg(bad)
        .args(["--repo", "a/b"])
        .run();
    out.expect_error("invalid_skill");
    let out = env
        .cmd(&repo)
        .args(["acquire", "s", "--repo", "a/b", "--note"])
        .arg(bad)
        .run();
    out.expect_error("invalid_note");
}

#[test]
fn help_and_version_are_text_and_exit_zero() {
    let env = TestEnv::new();
    let h = env.cmd(&env.root).arg("--help").run();
    assert_eq!(h.code, 0);
    for word in [
        "acquire",
        "renew",
        "release",
        "status",
        "list",
        "check",
        "history",
        "Exit status",
    ] {
        assert!(h.stdout.contains(word), "--help lacks {word}");
    }
    let v = env.cmd(&env.root).arg("--version").run();
    assert_eq!(
        (v.code, v.stdout.trim()),
        (
            0,
            format!("skill-lock {}", env!("CARGO_PKG_VERSION")).as_str()
        )
    );
    let a = env.cmd(&env.root).args(["acquire", "--help"]).run();
    assert!(a.code == 0 && a.stdout.contains("--owner-pid"));
}

#[test]
fn file_store_url_and_environment_select_another_directory() {
    let env = TestEnv::new();
    let elsewhere = env.dir("shared-locks");
    let nowhere = env.dir("no-root-needed");
    let url = format!("file:{}", elsewhere.display());
    let a = env
        .cmd(&nowhere)
        .args(["acquire", "s", "--repo", "o/r", "--store", &url])
        .run();
    let a = a.expect(0, "acquired");
    assert!(
        a["lock"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/run/locks/", elsewhere.display()))
    );
    let held = env
        .cmd(&nowhere)
        .env("SKILL_LOCK_STORE", &url)
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    let held = held.expect(3, "already_running");
    assert!(
        held["hint"]
            .as_str()
            .unwrap()
            .ends_with(&format!("--force --store {url}"))
    );
    // The personal layer's skill-lock.toml.
    let repo = env.git_repo("r");
    std::fs::create_dir_all(repo.join(".git/apache-magpie")).unwrap();
    std::fs::write(
        repo.join(".git/apache-magpie/skill-lock.toml"),
        format!("store = \"{url}\"\n"),
    )
    .unwrap();
    env.cmd(&repo)
        .args(["acquire", "s", "--repo", "o/r"])
        .run()
        .expect(3, "already_running");
}

#[test]
fn history_tells_who_held_it() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let a = acquire(&env, &repo, &["--ttl", "1", "--note", "first"]);
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let b = acquire(&env, &repo, &["--note", "second"]);
    let tb = b["token"].as_str().unwrap().to_owned();
    env.cmd(&repo)
        .args([
            "release",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            a["token"].as_str().unwrap(),
        ])
        .run()
        .expect(4, "refused");
    env.cmd(&repo)
        .args([
            "renew",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--token",
            &tb,
        ])
        .run()
        .expect(0, "renewed");
    env.cmd(&repo)
        .args([
            "release",
            "issue-triage",
            "--repo",
            "apache/airflow",
            "--force",
        ])
        .run()
        .expect(0, "released");
    env.cmd(&repo)
        .args(["acquire", "other", "--repo", "o/r"])
        .run()
        .expect(0, "acquired");
    let h = env
        .cmd(&repo)
        .args(["history", "issue-triage", "--repo", "apache/airflow"])
        .run();
    let h = h.expect(0, "history");
    let kinds: Vec<&str> = h["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "acquired",
            "took_over",
            "acquired",
            "refused",
            "renewed",
            "forced_release"
        ]
    );
    let ev = &h["events"];
    assert_eq!(
        (ev[0]["fence"].as_u64(), ev[0]["note"].as_str()),
        (Some(1), Some("first"))
    );
    assert_eq!(ev[1]["reason"], "expired");
    assert_eq!(ev[1]["previous"]["note"], "first");
    assert_eq!(
        (ev[2]["fence"].as_u64(), ev[2]["note"].as_str()),
        (Some(2), Some("second"))
    );
    assert_eq!(ev[5]["previous"]["fence"], 2);
    let all = env.cmd(&repo).args(["history", "--limit", "2"]).run();
    let all = all.expect(0, "history");
    assert_eq!(all["events"].as_array().unwrap().len(), 2);
    assert_eq!(all["events"][1]["skill"], "other");
    let text = std::fs::read_to_string(repo.join(".git/apache-magpie/run/history.jsonl")).unwrap();
    assert!(!text.contains(&tb), "history holds a token");
}

/// The write phase shown by `--help`, as a script: its lines, unindented.
fn help_write_phase(env: &TestEnv) -> String {
    let help = env.cmd(&env.root).arg("--help").run().stdout;
    let start = help
        .find("Typical write phase")
        .expect("--help shows the write phase");
    let block = &help[start..];
    let end = block
        .find("\n\n")
        .expect("the example ends with a blank line");
    block[..end]
        .lines()
        .skip(1)
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_help_write_phase_matches_the_docs_and_runs_under_set_euo_pipefail() {
    let env = TestEnv::new();
    let script = help_write_phase(&env);
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/write-lock.md"))
            .unwrap();
    for (verb, token) in [
        ("status", false),
        ("acquire", false),
        ("renew", true),
        ("release", true),
    ] {
        let in_help = format!("skill-lock {verb} issue-triage --repo apache/airflow");
        let in_docs = format!("skill-lock {verb} <skill> --repo <owner/repo>");
        assert!(script.contains(&in_help), "--help lacks {in_help}");
        assert!(docs.contains(&in_docs), "docs lack {in_docs}");
        if token {
            // The token travels in every command, in the variable that
            // keeps it out of the process list, never in one that must
            // outlive a shell.
            let with = format!("SKILL_LOCK_TOKEN=$token {in_help}");
            assert!(script.contains(&with), "--help lacks {with}");
            assert!(docs.contains(&format!(
                "SKILL_LOCK_TOKEN=<token> uvx --from ~/.claude/magpie/skill-lock {in_docs}"
            )));
        }
    }
    assert!(script.contains("--since $since") && docs.contains("--since <fence>"));
    // `skill-lock` on PATH is the binary under test.
    let bin = env.dir("bin");
    std::os::unix::fs::symlink(common::BIN, bin.join("skill-lock")).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let repo = env.git_repo("r");
    let run = || {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("set -euo pipefail\n{script}"))
            .current_dir(&repo)
            .env_clear()
            .env("PATH", &path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let status = |what: &str| {
        env.cmd(&repo)
            .args(["status", "issue-triage", "--repo", "apache/airflow"])
            .run()
            .expect(0, "status")["state"]
            == what
    };
    // Free: it posts, and the exit trap releases with the token.
    let (code, out, err) = run();
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("post 1") && out.contains(r#""result":"released""#),
        "{out}"
    );
    assert!(status("free"));
    // Held by another run: no post, exit 0, and that run's lock is untouched.
    env.cmd(&repo)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .run()
        .expect(0, "acquired");
    let (code, out, err) = run();
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("held, not posting") && !out.contains("post 1"),
        "{out}"
    );
    assert!(status("held"));
}

#[test]
fn usage_errors_suggest_and_point_to_the_subcommands_help() {
    let env = TestEnv::new();
    let msg = |args: &[&str]| {
        let out = env.cmd(&env.root).args(args).run();
        let out = if args[0] == "run" {
            // run's object goes to stderr.
            crate::common::Out {
                json: serde_json::from_str(out.stderr.trim_end()).unwrap(),
                ..out
            }
        } else {
            out
        };
        out.expect_error("usage")["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let m = msg(&["aquire", "s", "--repo", "a/b"]);
    assert!(m.contains("did you mean 'acquire'?"), "{m}");
    assert!(m.ends_with("run 'skill-lock --help' for usage"), "{m}");
    let m = msg(&["run", "x", "--repo", "a/b", "sh", "-c", "true"]);
    assert!(m.contains("put -- before the command"), "{m}");
    assert!(m.ends_with("run 'skill-lock run --help' for usage"), "{m}");
    let m = msg(&["acquire", "x", "--repo"]);
    assert_eq!(
        m,
        "a value is required for '--repo <OWNER/NAME>' but none was supplied; \
         run 'skill-lock acquire --help' for usage"
    );
    let m = msg(&["renew", "x", "--repo", "a/b", "--tokn", "t"]);
    assert!(m.contains("did you mean '--token'?"), "{m}");
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
        env.cmd(&repo)
            .args(["acquire", skill, "--repo", repo_name, "--note"])
            .arg("x".repeat(400))
            .run()
            .expect(0, "acquired");
    }
    want.sort_by_key(|(s, r)| (s.to_ascii_lowercase(), r.to_ascii_lowercase()));
    let out = env.cmd(&repo).arg("list").run();
    assert!(out.stdout.len() > 2 * 64 * 1024, "spans several buffers");
    let v = out.expect(0, "list");
    let got: Vec<(String, String)> = v["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["skill"].as_str().unwrap().to_owned(),
                l["repo"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(v["tombstones"], 0);
}
