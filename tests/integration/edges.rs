//! Bad input at the edges (SPEC §7 "Bad input", issue 3): every case gets a
//! clear error object or a documented safe outcome, never a panic or a
//! half-written file.
//!
//! Covers: SPEC §2, §7.

use crate::common;

use common::{TestEnv, tree};
use std::path::{Path, PathBuf};

fn lock_dir(repo: &Path) -> PathBuf {
    repo.join(".git/apache-magpie/run/locks/s@o__r.lock")
}

#[test]
fn lock_directory_replaced_by_a_file_or_a_symlink_is_corrupt_and_taken_over() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    env.cmd(&repo)
        .args(["acquire", "s", "--repo", "o/r"])
        .run()
        .expect(0, "acquired");
    let lock = lock_dir(&repo);
    // A symlink to a directory holding a perfectly valid record is still not a lock.
    let decoy = env.dir("decoy");
    std::fs::rename(&lock, decoy.join("x.lock")).unwrap();
    std::os::unix::fs::symlink(decoy.join("x.lock"), &lock).unwrap();
    let st = env.cmd(&repo).args(["status", "s", "--repo", "o/r"]).run();
    assert_eq!(st.expect(0, "status")["stale_reason"], "corrupt");
    let a = env.cmd(&repo).args(["acquire", "s", "--repo", "o/r"]).run();
    assert_eq!(a.expect(0, "acquired")["took_over"]["reason"], "corrupt");
    assert!(
        decoy.join("x.lock/owner.json").is_file(),
        "the symlink's target was touched"
    );
    assert!(lock.is_dir() && !lock.is_symlink());

    // A plain file in place of the lock directory.
    env.cmd(&repo)
        .args(["release", "s", "--repo", "o/r"])
        .run()
        .expect(0, "released");
    std::fs::write(&lock, "junk").unwrap();
    let st = env.cmd(&repo).args(["status", "s", "--repo", "o/r"]).run();
    assert_eq!(st.expect(0, "status")["stale_reason"], "corrupt");
    env.cmd(&repo)
        .args(["acquire", "s", "--repo", "o/r"])
        .run()
        .expect(0, "acquired");
    assert!(lock.join("owner.json").is_file());
    // An empty lock directory (no record) is corrupt too.
    env.cmd(&repo)
        .args(["release", "s", "--repo", "o/r"])
        .run()
        .expect(0, "released");
    std::fs::create_dir(&lock).unwrap();
    let l = env.cmd(&repo).arg("list").run();
    assert_eq!(l.expect(0, "list")["locks"][0]["stale_reason"], "corrupt");
}

#[test]
fn unwritable_personal_layer_is_an_io_error_that_changes_nothing() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    // A file where the personal layer directory must be: nothing can be created
    // below it, whoever runs the test (root ignores permission bits).
    std::fs::write(repo.join(".git/apache-magpie"), "not a directory").unwrap();
    let before = tree(&repo);
    let out = env.cmd(&repo).args(["acquire", "s", "--repo", "o/r"]).run();
    let v = out.expect_error("io");
    assert!(
        v["message"].as_str().unwrap().contains("apache-magpie"),
        "{}",
        out.stdout
    );
    assert_eq!(tree(&repo), before);
    // Every other command says the same, and creates nothing either.
    for args in [
        &["status", "s", "--repo", "o/r"][..],
        &["release", "s", "--repo", "o/r"],
        &["list"],
    ] {
        env.cmd(&repo).args(args).run().expect_error("io");
    }
    assert_eq!(tree(&repo), before);
}

#[test]
fn a_git_file_pointing_nowhere_is_no_root_with_a_fix() {
    let env = TestEnv::new();
    let wt = env.dir("wt");
    std::fs::write(wt.join(".git"), "gitdir: /nonexistent/.git/worktrees/wt\n").unwrap();
    let out = env.cmd(&wt).args(["acquire", "s", "--repo", "o/r"]).run();
    let v = out.expect_error("no_root");
    assert!(
        v["message"].as_str().unwrap().contains("git worktree"),
        "{}",
        out.stdout
    );
    assert_eq!(tree(&wt), [".git"]);
}

fn rewrite_record(lock: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = lock.join("owner.json");
    let mut rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut rec);
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
}

#[test]
fn records_from_clocks_far_in_the_past_or_future() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    env.cmd(&repo)
        .args(["acquire", "s", "--repo", "o/r"])
        .run()
        .expect(0, "acquired");
    // Written on another boot, expiring in the year 9999: an impossible lease,
    // judged corrupt instead of blocking the lock for millennia.
    rewrite_record(&lock_dir(&repo), |r| {
        r["boot_id"] = "another-boot".into();
        r["expires"] = "9999-12-31T23:59:59Z".into();
    });
    let st = env.cmd(&repo).args(["status", "s", "--repo", "o/r"]).run();
    assert_eq!(st.expect(0, "status")["stale_reason"], "corrupt");
    let a = env.cmd(&repo).args(["acquire", "s", "--repo", "o/r"]).run();
    assert_eq!(a.expect(0, "acquired")["took_over"]["reason"], "corrupt");
    // Expired long ago (1970), on another boot: plainly expired.
    rewrite_record(&lock_dir(&repo), |r| {
        r["boot_id"] = "another-boot".into();
        r["expires"] = "1970-01-01T00:00:01Z".into();
    });
    let st = env.cmd(&repo).args(["status", "s", "--repo", "o/r"]).run();
    let v = st.expect(0, "status");
    assert_eq!(
        (v["stale_reason"].as_str(), v["expires_in"].as_u64()),
        (Some("expired"), Some(0))
    );
    // Same boot: the boot-time clock decides, whatever the wall time says.
    env.cmd(&repo)
        .args(["acquire", "s", "--repo", "o/r", "--ttl", "600"])
        .run()
        .expect(0, "acquired");
    rewrite_record(&lock_dir(&repo), |r| {
        r["expires"] = "1970-01-01T00:00:01Z".into()
    });
    let st = env.cmd(&repo).args(["status", "s", "--repo", "o/r"]).run();
    assert_eq!(st.expect(0, "status")["state"], "held");
}

#[test]
fn arbitrary_bytes_in_a_record_are_corrupt_never_a_crash() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    env.cmd(&repo)
        .args(["acquire", "s", "--repo", "o/r"])
        .run()
        .expect(0, "acquired");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for len in [0usize, 1, 7, 100, 5000, 70_000] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed & 0xff) as u8
            })
            .collect();
        std::fs::write(lock_dir(&repo).join("owner.json"), &bytes).unwrap();
        let st = env.cmd(&repo).args(["status", "s", "--repo", "o/r"]).run();
        assert_eq!(
            st.expect(0, "status")["stale_reason"],
            "corrupt",
            "len {len}"
        );
        assert!(st.stderr.is_empty(), "{}", st.stderr);
    }
}

/// A personal layer this user may not enter (another user's, or read-only):
/// the error names the open that failed and the layer, and says to use
/// `--store file:DIR`, which then works. As root the binary runs as `nobody`.
#[test]
fn a_foreign_personal_layer_suggests_a_store_of_ones_own() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let env = TestEnv::new();
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    mode(&env.root, 0o755);
    let repo = env.git_repo("r");
    let layer = repo.join(".git/apache-magpie");
    std::fs::create_dir_all(&layer).unwrap();
    std::fs::write(layer.join("skill-lock.toml"), "").unwrap();
    let mine = env.dir("mine");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // A directory of one's own: owned by the user the binary runs as, and
    // writable by no one else (SPEC §5 "Trust").
    if root {
        std::os::unix::fs::chown(&mine, Some(65534), Some(65534)).unwrap();
    }
    mode(&mine, 0o700);
    mode(&layer, if root { 0o700 } else { 0o000 });
    let run = |extra: &[&str]| {
        let mut cmd = env
            .cmd(&repo)
            .args(["acquire", "s", "--repo", "o/r"])
            .args(extra)
            .command();
        if root {
            cmd.uid(65534).gid(65534);
        }
        common::Out::from(cmd.output().unwrap())
    };
    let out = run(&[]);
    mode(&layer, 0o755);
    let m = out.expect_error("io")["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        m.starts_with(&format!("could not open {}: ", layer.display())),
        "{m}"
    );
    assert!(m.contains("--store file:DIR"), "{m}");
    mode(&layer, if root { 0o700 } else { 0o000 });
    let url = format!("file:{}", mine.display());
    let out = run(&["--store", &url]);
    mode(&layer, 0o755);
    out.expect(0, "acquired");
}
