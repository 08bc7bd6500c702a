//! Bad input at the edges (SPEC §7 "Bad input", issue 3): every case gets a
//! clear error object or a documented safe outcome, never a panic or a
//! half-written file.
//!
//! Covers: SPEC §2, §7.

use crate::harness;

use harness::Lock;
use harness::{TestEnv, tree};
use std::path::{Path, PathBuf};

fn lock_dir(repo: &Path) -> PathBuf {
    repo.join(".git/apache-magpie/run/locks/s@o__r.lock")
}

/// The lock `s` of `o/r`, seen from `repo`.
fn lock(repo: &Path) -> Lock {
    Lock::new(repo, "s", "o/r")
}

/// The `stale_reason` `status` shows of `s` of `o/r` in `repo`.
#[track_caller]
fn stale_reason(repo: &Path) -> Option<String> {
    lock(repo).status().stale_reason().map(str::to_owned)
}

/// The reason `acquire` gives for taking `s` of `o/r` over, in `repo`.
#[track_caller]
fn takeover_reason(repo: &Path) -> String {
    let a = lock(repo).acquire().is("acquired");
    a.took_over().unwrap().reason.clone()
}

#[test]
fn lock_directory_replaced_by_a_file_or_a_symlink_is_corrupt_and_taken_over() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    lock(&repo).acquire().is("acquired");
    let dir = lock_dir(&repo);
    // A symlink to a directory holding a perfectly valid record is still not a lock.
    let decoy = env.dir("decoy");
    std::fs::rename(&dir, decoy.join("x.lock")).unwrap();
    std::os::unix::fs::symlink(decoy.join("x.lock"), &dir).unwrap();
    assert_eq!(stale_reason(&repo).as_deref(), Some("corrupt"));
    assert_eq!(takeover_reason(&repo), "corrupt");
    assert!(
        decoy.join("x.lock/owner.json").is_file(),
        "the symlink's target was touched"
    );
    assert!(dir.is_dir() && !dir.is_symlink());

    // A plain file in place of the lock directory.
    lock(&repo).op("release").expect(0, "released");
    std::fs::write(&dir, "junk").unwrap();
    assert_eq!(stale_reason(&repo).as_deref(), Some("corrupt"));
    lock(&repo).acquire().is("acquired");
    assert!(dir.join("owner.json").is_file());
    // An empty lock directory (no record) is corrupt too.
    lock(&repo).op("release").expect(0, "released");
    std::fs::create_dir(&dir).unwrap();
    let l = lock(&repo).list();
    assert_eq!(l.locks()[0].stale_reason.as_deref(), Some("corrupt"));
}

#[test]
fn unwritable_personal_layer_is_an_io_error_that_changes_nothing() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    // A file where the personal layer directory must be: nothing can be created
    // below it, whoever runs the test (root ignores permission bits).
    std::fs::write(repo.join(".git/apache-magpie"), "not a directory").unwrap();
    let before = tree(&repo);
    let out = lock(&repo).op("acquire").run();
    let message = out.error_message("io");
    assert!(message.contains("apache-magpie"), "{}", out.stdout);
    assert_eq!(tree(&repo), before);
    // Every other command says the same, and creates nothing either.
    for out in [
        lock(&repo).op("status").run(),
        lock(&repo).op("release").run(),
        lock(&repo).store_op("list").run(),
    ] {
        out.expect_error("io");
    }
    assert_eq!(tree(&repo), before);
}

#[test]
fn a_git_file_pointing_nowhere_is_no_root_with_a_fix() {
    let env = TestEnv::new();
    let wt = env.dir("wt");
    std::fs::write(wt.join(".git"), "gitdir: /nonexistent/.git/worktrees/wt\n").unwrap();
    let out = lock(&wt).op("acquire").run();
    let message = out.error_message("no_root");
    assert!(message.contains("git worktree"), "{}", out.stdout);
    assert_eq!(tree(&wt), [".git"]);
}

/// Sets fields of the lock's owner record, as another boot or clock would.
fn rewrite_record(lock: &Path, fields: &[(&str, &str)]) {
    let fields: Vec<(&str, serde_json::Value)> =
        fields.iter().map(|(k, v)| (*k, (*v).into())).collect();
    harness::edit_json_file(&lock.join("owner.json"), &fields);
}

#[test]
fn records_from_clocks_far_in_the_past_or_future() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    lock(&repo).acquire().is("acquired");
    // Written on another boot, expiring in the year 9999: an impossible lease,
    // judged corrupt instead of blocking the lock for millennia.
    rewrite_record(
        &lock_dir(&repo),
        &[
            ("boot_id", "another-boot"),
            ("expires", "9999-12-31T23:59:59Z"),
        ],
    );
    assert_eq!(stale_reason(&repo).as_deref(), Some("corrupt"));
    assert_eq!(takeover_reason(&repo), "corrupt");
    // Expired long ago (1970), on another boot: plainly expired.
    rewrite_record(
        &lock_dir(&repo),
        &[
            ("boot_id", "another-boot"),
            ("expires", "1970-01-01T00:00:01Z"),
        ],
    );
    let v = lock(&repo).status();
    assert_eq!(
        (v.stale_reason(), v.expires_in()),
        (Some("expired"), Some(0))
    );
    // Same boot: the boot-time clock decides, whatever the wall time says.
    lock(&repo).op("acquire").ttl(600).reply().is("acquired");
    rewrite_record(&lock_dir(&repo), &[("expires", "1970-01-01T00:00:01Z")]);
    assert_eq!(lock(&repo).state(), "held");
}

#[test]
fn arbitrary_bytes_in_a_record_are_corrupt_never_a_crash() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    lock(&repo).acquire().is("acquired");
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
        let st = lock(&repo).op("status").run();
        let reason = st.expect_reply(0, "status");
        assert_eq!(reason.stale_reason(), Some("corrupt"), "len {len}");
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
    let run = |store: Option<&str>| {
        let call = lock(&repo).op("acquire");
        let call = match store {
            Some(url) => call.store(url),
            None => call,
        };
        let mut cmd = call.into_command();
        if root {
            cmd.uid(65534).gid(65534);
        }
        harness::Out::from(cmd.output().unwrap())
    };
    let out = run(None);
    mode(&layer, 0o755);
    if root {
        // As nobody, root's checkout is another user's: the walk stops below
        // it (SPEC §5, git's safe.directory rule) and says to name a store.
        let m = out.error_message("no_root");
        assert!(m.contains("another user owns"), "{m}");
        assert!(m.contains("--store"), "{m}");
    } else {
        let m = out.error_message("io");
        assert!(
            m.starts_with(&format!("could not open {}: ", layer.display())),
            "{m}"
        );
        assert!(m.contains("--store file:DIR"), "{m}");
    }
    mode(&layer, if root { 0o700 } else { 0o000 });
    let url = format!("file:{}", mine.display());
    let out = run(Some(&url));
    mode(&layer, 0o755);
    out.expect(0, "acquired");
}
