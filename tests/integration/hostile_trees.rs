//! The hostile campaign on every kind of tree that is not a plain git clone
//! (SPEC §5 "What a tree can forge", "Project root R", "Personal layer P",
//! "Nothing a tree carries configures the tool", "Upgrading from the
//! original tool"; §8 "The user's configuration file" and the git store's
//! remotes): real svn working copies (`svnadmin create`, `file://`), svn
//! externals, archives made by `tar` holding `.git/`, `.git` files and
//! `.svn/`, archives made by `git archive`, another user's markers in a
//! shared directory, and the original tool's directory in every shape.
//!
//! Each test checks the harm itself: the file a committed hook would write
//! does not exist; nothing outside the layer changes; two runs never both
//! acquire; planted state blocks no other name.
//!
//! Covers: SPEC §5, §7, §8.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::harness::{Lock, Reply};
use crate::hostile_clone::{
    LOCAL, NAME, PAST, REPO, SKILL, World, answer, bare_repo_with_hooks, changes, contend,
    every_command, outside, real_state, snapshot, with, within, write,
};

/// What one case plants in a tree.
type Plant<'a> = &'a dyn Fn(&Path);
/// The same, owned.
type Planter<'a> = Box<dyn Fn(&Path) + 'a>;

/// Runs `prog args` in `dir`; panics with its stderr when it fails.
#[track_caller]
fn sh(dir: &Path, prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{prog} runs: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Is svn installed (`.ci/run` installs `subversion`)? Without it a test
/// says SKIPPED, except in CI, where it fails.
fn have_svn(test: &str) -> bool {
    let found = Command::new("svnadmin")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: svn is not installed (apt-get install subversion)"
        );
        println!("SKIPPED {test}: svn is not installed");
    }
    found
}

/// A world and the folder an svn working copy's content is made in, when
/// svn is here (else SKIPPED, or a failure in CI).
fn svn_world(test: &str) -> Option<(World, PathBuf)> {
    if !have_svn(test) {
        return None;
    }
    let w = World::new();
    let content = w.env.dir("content");
    Some((w, content))
}

/// An svn repository at `rel` whose trunk holds the folder `content` as it
/// is (ignored names included), and a working copy of it at `wc`.
fn svn_checkout(w: &World, rel: &str, content: &Path, wc: &str) -> (String, PathBuf) {
    let repo = w.path(rel);
    sh(&w.env.root, "svnadmin", &["create", repo.to_str().unwrap()]);
    let url = format!("file://{}", repo.display());
    sh(
        content,
        "svn",
        &[
            "import",
            "-q",
            "--no-ignore",
            "--no-auth-cache",
            "-m",
            "hostile",
            ".",
            &format!("{url}/trunk"),
        ],
    );
    let wc = w.path(wc);
    sh(
        &w.env.root,
        "svn",
        &[
            "checkout",
            "-q",
            &format!("{url}/trunk"),
            wc.to_str().unwrap(),
        ],
    );
    (url, wc)
}

/// Makes `dir` look like a git directory to anyone reading files (HEAD,
/// objects/, refs/), as a tree can carry one.
fn fake_git_dir(dir: &Path, config: &str) {
    write(&dir.join("HEAD"), "ref: refs/heads/main\n");
    write(&dir.join("objects/.keep"), "");
    write(&dir.join("refs/heads/.keep"), "");
    write(&dir.join("config"), config);
}

/// The configuration of a git directory whose `origin` is `url`.
fn with_origin(url: &Path) -> String {
    format!(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n[remote \"origin\"]\n\turl = {}\n",
        url.display()
    )
}

/// Every command, plus `acquire` through `git:origin` given both ways.
fn every_command_and_origin(cwd: &Path) -> Vec<(&'static str, crate::harness::Cmd)> {
    let mut all = every_command(cwd);
    let lock = Lock::new(cwd, SKILL, REPO);
    all.push(("acquire", lock.op("acquire").store("git:origin")));
    all.push((
        "acquire",
        lock.op("acquire").env("SKILL_LOCK_STORE", "git:origin"),
    ));
    all
}

/// Runs every command from each of `cwds` and asserts the hooks never ran
/// and nothing outside `.svn/` and the tree's own layer changed.
#[track_caller]
fn runs_nothing(w: &World, tree: &Path, cwds: &[PathBuf], marker: &Path, layers: &[PathBuf]) {
    let before = outside(snapshot(tree), layers);
    let world_before = outside(snapshot(&w.env.root), &[tree.to_path_buf()]);
    for cwd in cwds {
        for (verb, cmd) in every_command_and_origin(cwd) {
            let out = cmd.run();
            assert!(
                !marker.exists(),
                "`{verb}` in {} ran the tree's hooks: {}{}",
                cwd.display(),
                out.stdout,
                out.stderr
            );
            // Whatever it answered, it is one object with a result.
            let _ = answer(verb, &out);
        }
    }
    let after = outside(snapshot(tree), layers);
    assert_eq!(
        changes(&before, &after),
        Vec::<String>::new(),
        "the tree was written"
    );
    let world_after = outside(snapshot(&w.env.root), &[tree.to_path_buf()]);
    assert_eq!(
        changes(&world_before, &world_after),
        Vec::<String>::new(),
        "something outside the tree was written"
    );
}

/// SPEC §5, §8: an svn working copy committing a `.git` file saying
/// `gitdir: .` (its top made to look like a git directory), a
/// `apache-magpie/skill-lock.toml` choosing `git:tools/store.git`, that
/// bare repository with hooks, and a `sub/.git/` whose `origin` is the same
/// repository: no command, with no flag or with `git:origin`, runs a hook.
#[test]
fn an_svn_checkout_that_commits_git_runs_nothing() {
    let Some((w, content)) = svn_world("an_svn_checkout_that_commits_git_runs_nothing") else {
        return;
    };
    let marker = w.path("pwned");
    std::fs::create_dir_all(content.join("tools")).unwrap();
    bare_repo_with_hooks(&w, &content.join("tools/store.git"), &marker);
    write(
        &content.join("apache-magpie/skill-lock.toml"),
        "store = \"git:tools/store.git\"\n",
    );
    write(&content.join("src/lib.rs"), "\n");
    // The working copy will be at <root>/wc: name its hooked repository.
    let hooked = w.path("wc/tools/store.git");
    fake_git_dir(&content.join("sub/.git"), &with_origin(&hooked));
    let (_, wc) = svn_checkout(&w, "repo", &content, "wc");
    let layers = [wc.join(".svn")];
    runs_nothing(
        &w,
        &wc,
        &[wc.clone(), wc.join("sub"), wc.join("src")],
        &marker,
        &layers,
    );
    // The control: the committed repository is live, a push runs its hooks.
    // And with `.git` at the top too (a file saying `gitdir: .`, the top a
    // git directory): refused, never followed.
    fake_git_dir(&content, &with_origin(&hooked));
    write(&content.join(".git"), "gitdir: .\n");
    let (_, wc2) = svn_checkout(&w, "repo2", &content, "wc2");
    for cwd in [wc2.clone(), wc2.join("sub")] {
        let out = Lock::new(&cwd, SKILL, REPO).op("acquire").run();
        let m = out.error_message("no_root");
        assert!(m.contains("both .git and .svn"), "{m}");
    }
    runs_nothing(
        &w,
        &wc2,
        &[wc2.clone(), wc2.join("sub")],
        &marker,
        &[wc2.join(".svn")],
    );
}

/// Packs `content` into `<rel>.tar` with tar and unpacks it at `rel`, as a
/// release archive is (`.git/`, `.git` files and `.svn/` kept).
fn tarball(w: &World, content: &Path, rel: &str) -> PathBuf {
    let tar = w.path(&format!("{rel}.tar"));
    sh(content, "tar", &["-cf", tar.to_str().unwrap(), "."]);
    let dir = w.env.dir(rel);
    sh(
        &dir,
        "tar",
        &["-xf", tar.to_str().unwrap(), "--no-same-owner"],
    );
    std::fs::remove_file(&tar).unwrap();
    dir
}

/// SPEC §5, §8: unpacked archives that carry `.git/apache-magpie/` or
/// `.svn/apache-magpie/` configuration choosing a hooked repository, a
/// `.git/` whose `origin` names it, or a bare repository in a folder named
/// `origin/`: no command runs a hook; the planted configuration is refused
/// by name while nothing the user set chooses the store; `git:origin`
/// answers `usage` (a local path is no network URL; a name is never a path).
#[test]
fn archives_carrying_git_and_svn_run_nothing() {
    let w = World::new();
    let marker = w.path("pwned");
    let hooked = w.path("hooked.git");
    bare_repo_with_hooks(&w, &hooked, &marker);
    let config = format!("store = \"git:{}\"\n", hooked.display());
    let cases: [(&str, Plant<'_>); 4] = [
        ("git-config", &|c: &Path| {
            fake_git_dir(&c.join(".git"), "[core]\n\tbare = false\n");
            write(&c.join(".git/apache-magpie/skill-lock.toml"), &config);
        }),
        ("svn-config", &|c: &Path| {
            write(&c.join(".svn/wc.db"), "SQLite format 3\0");
            write(&c.join(".svn/apache-magpie/skill-lock.toml"), &config);
        }),
        ("git-origin", &|c: &Path| {
            fake_git_dir(&c.join(".git"), &with_origin(&hooked));
        }),
        ("origin-folder", &|c: &Path| {
            fake_git_dir(&c.join(".git"), "[core]\n\tbare = false\n");
            bare_repo_with_hooks(&w, &c.join("origin"), &marker);
        }),
    ];
    for (name, make) in cases {
        let content = w.env.dir(&format!("content-{name}"));
        write(&content.join("src/lib.rs"), "\n");
        make(&content);
        let tree = tarball(&w, &content, name);
        let layers = [
            tree.join(".git/apache-magpie"),
            tree.join(".svn/apache-magpie"),
        ];
        runs_nothing(
            &w,
            &tree,
            &[tree.clone(), tree.join("src")],
            &marker,
            &layers,
        );
        let lock = Lock::new(&tree, SKILL, REPO);
        let m = lock
            .op("acquire")
            .store("git:origin")
            .run()
            .error_message("usage");
        assert!(m.contains("origin"), "{name}: {m}");
        if name.ends_with("-config") {
            let planted = lock.op("acquire").run().error_message("usage");
            assert!(planted.contains("skill-lock.toml"), "{name}: {planted}");
        }
    }
}

/// SPEC §5: a `git archive` of a repository that commits `.svn/` with a
/// configuration: the export is an svn-looking folder whose planted
/// configuration is refused by name and never used.
#[test]
fn a_git_archive_carrying_svn_configuration_is_refused() {
    let w = World::new();
    let marker = w.path("pwned");
    let origin = w.env.dir("origin");
    w.git(&origin, &["init", "-q"]);
    bare_repo_with_hooks(&w, &origin.join("store.git"), &marker);
    w.commit(
        &origin,
        &[
            (".svn/wc.db", "SQLite format 3\0"),
            (
                ".svn/apache-magpie/skill-lock.toml",
                "store = \"git:store.git\"\n",
            ),
            ("src/lib.rs", "\n"),
        ],
        "svn-looking",
    );
    let export = w.export(&origin, "export");
    for cwd in [export.clone(), export.join("src")] {
        for (verb, cmd) in every_command(&cwd) {
            let out = cmd.run();
            assert!(!marker.exists(), "`{verb}` ran the export's hooks");
            match answer(verb, &out) {
                Reply::Error { error, message, .. } => {
                    assert_eq!(error, "usage", "{verb}: {message}");
                    assert!(
                        message.contains(".svn/apache-magpie/skill-lock.toml"),
                        "{message}"
                    );
                }
                other => panic!("{verb} used the planted configuration: {other:?}"),
            }
        }
    }
}

/// SPEC §5 root rule 1: in an svn working copy, committed `.git`
/// directories and files anywhere, and an svn external, make no second
/// project: two runs from any two places never both acquire, and the lock
/// is in the working copy's `.svn/`.
#[test]
fn nothing_an_svn_checkout_commits_splits_the_lock() {
    let Some((w, content)) = svn_world("nothing_an_svn_checkout_commits_splits_the_lock") else {
        return;
    };
    fake_git_dir(&content.join("a/.git"), "[core]\n\tbare = false\n");
    fake_git_dir(&content.join("a/b/.git"), "[core]\n\tbare = false\n");
    fake_git_dir(&content.join("sub"), "[core]\n\tbare = false\n");
    write(&content.join("sub/.git"), "gitdir: .\n");
    write(&content.join("plain/x.txt"), "\n");
    let (_, wc) = svn_checkout(&w, "repo", &content, "wc");
    // An external: another repository's trunk checked out inside.
    let ext_content = w.env.dir("ext-content");
    write(&ext_content.join("lib.txt"), "\n");
    let (ext_url, _) = svn_checkout(&w, "ext-repo", &ext_content, "ext-wc");
    sh(
        &wc,
        "svn",
        &[
            "propset",
            "-q",
            "svn:externals",
            &format!("{ext_url}/trunk ext"),
            ".",
        ],
    );
    sh(&wc, "svn", &["commit", "-q", "-m", "external"]);
    sh(&wc, "svn", &["update", "-q"]);
    assert!(
        wc.join("ext/.svn").is_dir(),
        "the external is a working copy"
    );
    let layer = wc.join(".svn/apache-magpie");
    let places: Vec<PathBuf> = ["", "a", "a/b", "sub", "plain", "ext"]
        .iter()
        .map(|r| wc.join(r))
        .collect();
    contend(&places, &layer);
}

/// SPEC §5 layer rule 3: a later svn commit that adds `.git` at the top of
/// the working copy, brought in by `svn update` under a held lock, never
/// lets a second run acquire: the checkout is refused from then on.
#[test]
fn an_svn_update_that_adds_git_at_the_top_never_frees_a_held_lock() {
    let Some((w, content)) =
        svn_world("an_svn_update_that_adds_git_at_the_top_never_frees_a_held_lock")
    else {
        return;
    };
    write(&content.join("README"), "\n");
    let (url, wc) = svn_checkout(&w, "repo", &content, "wc");
    let first = Lock::new(&wc, SKILL, REPO);
    let token = first.acquire().token().to_owned();
    // The attacker's working copy commits a .git at the top.
    let theirs = w.path("theirs");
    sh(
        &w.env.root,
        "svn",
        &[
            "checkout",
            "-q",
            &format!("{url}/trunk"),
            theirs.to_str().unwrap(),
        ],
    );
    fake_git_dir(&theirs.join(".git"), "[core]\n\tbare = false\n");
    sh(
        &theirs,
        "svn",
        &["add", "-q", "--no-ignore", "--force", ".git"],
    );
    sh(&theirs, "svn", &["commit", "-q", "-m", "a .git at the top"]);
    sh(&wc, "svn", &["update", "-q"]);
    assert!(wc.join(".git/HEAD").is_file(), "the update brought .git");
    for cwd in [wc.clone(), wc.join(".git").parent().unwrap().to_path_buf()] {
        let out = Lock::new(&cwd, SKILL, REPO).op("acquire").run();
        assert_ne!(
            out.code, 0,
            "a second run acquired after the update: {}",
            out.stdout
        );
        out.error_message("no_root");
    }
    // The first run's lock is where it was, still its own.
    let lock = wc.join(format!(".svn/apache-magpie/run/locks/{NAME}.lock"));
    assert!(lock.is_dir(), "the held lock is still in .svn");
    let _ = token;
}

/// SPEC §5: a `.git` file saying `gitdir: ..` (the folder that holds the
/// user's checkouts) is refused: nothing is created outside the checkout.
#[test]
fn a_git_file_leading_out_of_the_checkout_creates_nothing_outside() {
    let w = World::new();
    let checkouts = w.env.dir("checkouts");
    let co = checkouts.join("co");
    write(&co.join(".git"), "gitdir: ..\n");
    write(&co.join("src/lib.rs"), "\n");
    write(
        &checkouts.join("other/README"),
        "the user's other checkout\n",
    );
    let before = snapshot(&checkouts);
    for cwd in [co.clone(), co.join("src")] {
        for (verb, cmd) in every_command(&cwd) {
            let out = cmd.run();
            match answer(verb, &out) {
                Reply::Error { error, message, .. } => {
                    assert_eq!(error, "no_root", "{verb}: {message}");
                    assert!(message.contains("doctor"), "{message}");
                }
                other => panic!("{verb} followed gitdir: ..: {other:?}"),
            }
        }
    }
    assert_eq!(
        changes(&before, &snapshot(&checkouts)),
        Vec::<String>::new()
    );
}

/// SPEC §5 "Upgrading from the original tool": a committed
/// `.apache-magpie-local/run` that is a link, a file, or only holds
/// `locks/.keep`, and records that expired long ago (naming this process
/// group and boot) or claim 30 days ahead, hold no name: `acquire`, `run`
/// and `list` work, for this skill and every other.
#[test]
fn legacy_state_in_any_shape_blocks_nothing_beyond_a_live_lease() {
    let w = World::new();
    let (record, _) = real_state(&w, "scratch");
    let far_ahead = with(&record, &within(30 * 24 * 3600));
    // SAFETY: getpgrp has no preconditions.
    let pgid = unsafe { libc::getpgrp() };
    let expired_live_group = with(
        &record,
        &[
            ("expires", "2020-01-01T00:00:00Z".into()),
            ("owner_pgid", pgid.into()),
        ],
    );
    let shapes: Vec<(&str, Planter<'_>)> = vec![
        (
            "link",
            Box::new(|c: &Path| {
                std::fs::create_dir_all(c.join(LOCAL)).unwrap();
                std::os::unix::fs::symlink("/etc", c.join(LOCAL).join("run")).unwrap();
            }),
        ),
        (
            "file",
            Box::new(|c: &Path| write(&c.join(LOCAL).join("run"), "x\n")),
        ),
        (
            "keep",
            Box::new(|c: &Path| write(&c.join(LOCAL).join("run/locks/.keep"), "")),
        ),
        (
            "expired",
            Box::new(|c: &Path| {
                write(
                    &c.join(LOCAL)
                        .join(format!("run/locks/{NAME}.lock/owner.json")),
                    &expired_live_group,
                );
            }),
        ),
        (
            "far",
            Box::new(|c: &Path| {
                write(
                    &c.join(LOCAL)
                        .join(format!("run/locks/{NAME}.lock/owner.json")),
                    &far_ahead,
                );
            }),
        ),
    ];
    let _ = PAST;
    for (name, make) in shapes {
        let origin = w.env.dir(&format!("origin-{name}"));
        w.git(&origin, &["init", "-q"]);
        make(&origin);
        w.commit(&origin, &[("src/lib.rs", "\n")], name);
        let clone = w.clone(&origin, &format!("clone-{name}"), &[]);
        for skill in [SKILL, "pr-stale-sweep"] {
            let lock = Lock::new(&clone, skill, REPO);
            let token = match lock.acquire() {
                Reply::Acquired { token, .. } => token,
                other => panic!("{name}: {skill}: {other:?}"),
            };
            assert!(matches!(lock.release(&token), Reply::Released { .. }));
            let out = lock.op("run").command(["true"]).run();
            assert_eq!(out.code, 0, "{name}: run: {}", out.stderr);
        }
        assert!(
            matches!(Lock::new(&clone, SKILL, REPO).list(), Reply::List { .. }),
            "{name}"
        );
    }
}

/// SPEC §5 "Upgrading from the original tool": a live lock of the original
/// tool in an adopted subfolder (`co/sub/.apache-magpie-local/`), found
/// from where the original would have looked, holds the name until its
/// expiry; a `skill-lock.toml` there naming an etcd store is never read and
/// never silently replaced by the local store.
#[test]
fn the_original_tools_live_lock_in_an_adopted_subfolder_holds_its_name() {
    let w = World::new();
    let (record, _) = real_state(&w, "scratch");
    let co = w.env.dir("co");
    w.git(&co, &["init", "-q"]);
    let sub = co.join("sub");
    write(&sub.join(".apache-magpie.lock"), "");
    let planted = sub.join(LOCAL).join(format!("run/locks/{NAME}.lock"));
    write(&planted.join("owner.json"), &with(&record, &within(3600)));
    match Lock::new(&sub, SKILL, REPO).acquire() {
        Reply::AlreadyRunning { lock, .. } => assert_eq!(Path::new(&lock), planted),
        other => panic!("acquired beside the original tool's live lock: {other:?}"),
    }
    // Another name is not blocked; from the checkout's top (where the
    // original would not look) the name is free.
    let other = Lock::new(&sub, "pr-stale-sweep", REPO).acquire();
    assert!(matches!(other, Reply::Acquired { .. }), "{other:?}");
    // Its expiry alone decides.
    write(
        &planted.join("owner.json"),
        &with(&record, &[("expires", PAST.into())]),
    );
    assert!(matches!(
        Lock::new(&sub, SKILL, REPO).acquire(),
        Reply::Acquired { .. }
    ));
    // A configuration there naming a shared store: refused, by name.
    let config = sub.join(LOCAL).join("skill-lock.toml");
    write(&config, "store = \"etcd://127.0.0.1:9/shared\"\n");
    let m = Lock::new(&sub, SKILL, REPO)
        .op("status")
        .run()
        .error_message("usage");
    assert!(m.contains(config.to_str().unwrap()), "{m}");
}

/// SPEC §5: another user's directories and markers never make a project:
/// a `.svn` another user created in a shared folder is nobody's project,
/// and the walk stops below a directory another user owns. Needs root (to
/// make another user's files); says SKIPPED otherwise.
#[test]
fn another_users_markers_in_a_shared_folder_are_nobodys_project() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!(
            "SKIPPED another_users_markers_in_a_shared_folder_are_nobodys_project: needs root"
        );
        return;
    }
    let w = World::new();
    let nobody = 65534;
    // A shared folder (as /tmp) owned by another user, with their .svn.
    let shared = w.env.dir("shared");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    write(&shared.join(".svn/wc.db"), "");
    let mine = w.env.dir("shared/mine/src");
    std::os::unix::fs::chown(shared.join(".svn"), Some(nobody), Some(nobody)).unwrap();
    std::os::unix::fs::chown(shared.join(".svn/wc.db"), Some(nobody), Some(nobody)).unwrap();
    // The .svn is another user's: it counts for nobody.
    Lock::new(&mine, SKILL, REPO)
        .op("acquire")
        .run()
        .expect_error("no_root");
    // The folder itself another user's: the walk stops below it.
    std::os::unix::fs::chown(&shared, Some(nobody), Some(nobody)).unwrap();
    std::os::unix::fs::chown(shared.join(".svn"), Some(0), Some(0)).unwrap();
    std::os::unix::fs::chown(shared.join(".svn/wc.db"), Some(0), Some(0)).unwrap();
    Lock::new(&mine, SKILL, REPO)
        .op("acquire")
        .run()
        .expect_error("no_root");
    assert!(
        !shared.join(".svn/apache-magpie").exists(),
        "a layer was made in another user's folder"
    );
}

/// SPEC §8 "The user's configuration file": it chooses the store for a
/// repository (`owner/name` over `owner/*` over `store`), so every clone
/// contends for one lock; a tree's `skill-lock.toml` is then ignored; a
/// file others can write, or one that is no file, is `usage`, never absent.
#[test]
fn the_users_configuration_file_chooses_the_store_for_every_clone() {
    let w = World::new();
    let origin = w.origin("origin", &[("src/lib.rs", "\n")]);
    let a = w.clone(&origin, "a", &[]);
    let b = w.clone(&origin, "b", &[]);
    let shared = w.env.dir("shared-locks");
    let config = w.path("home-config/skill-lock.toml");
    write(
        &config,
        &format!(
            "store = \"file\"\n[repos]\n\"apache/*\" = \"file:{}\"\n\"apache/kafka\" = \"file:{}/kafka\"\n",
            shared.display(),
            shared.display()
        ),
    );
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let at =
        |dir: &Path, repo: &str| Lock::new(dir, SKILL, repo).with_env("SKILL_LOCK_CONFIG", &config);
    // Without it, two clones are two locks (the file store is per clone).
    let t = Lock::new(&a, SKILL, REPO).acquire().token().to_owned();
    assert!(matches!(
        Lock::new(&b, SKILL, REPO).acquire(),
        Reply::Acquired { .. }
    ));
    let _ = t;
    // With it, one.
    let first = at(&a, REPO).acquire();
    match &first {
        Reply::Acquired { lock, .. } => assert!(Path::new(lock).starts_with(&shared), "{lock}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        at(&b, REPO).acquire(),
        Reply::AlreadyRunning { .. }
    ));
    match at(&b, "apache/kafka").acquire() {
        Reply::Acquired { lock, .. } => {
            assert!(Path::new(&lock).starts_with(shared.join("kafka")), "{lock}")
        }
        other => panic!("{other:?}"),
    }
    // A planted skill-lock.toml in the clone's layer: ignored when the
    // user's choice applies.
    write(
        &a.join(".git/apache-magpie/skill-lock.toml"),
        "store = \"etcd://127.0.0.1:9\"\n",
    );
    assert!(matches!(
        at(&a, REPO).acquire(),
        Reply::AlreadyRunning { .. }
    ));
    // Others can write it: usage, naming it and the fix.
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o666)).unwrap();
    let m = at(&a, REPO).op("status").run().error_message("usage");
    assert!(
        m.contains(config.to_str().unwrap()) && m.contains("chmod go-w"),
        "{m}"
    );
    // A folder where the file should be: usage, never "absent".
    std::fs::remove_file(&config).unwrap();
    std::fs::create_dir(&config).unwrap();
    let m = at(&a, REPO).op("status").run().error_message("usage");
    assert!(m.contains("not a regular file"), "{m}");
    // A relative path there is refused (it would mean another place in
    // every directory).
    std::fs::remove_dir(&config).unwrap();
    write(&config, "store = \"git:tools/store.git\"\n");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let m = at(&a, REPO).op("status").run().error_message("usage");
    assert!(m.contains("relative"), "{m}");
}

/// SPEC §2.10: `doctor` names the root and its rule, the layer, the
/// configuration file and the store's origin (exit 0); with a refusal (a
/// tree's `skill-lock.toml`, a configuration file others can write) it
/// lists each with its fix and exits 2; `--text` says the same for a person.
#[test]
fn doctor_says_where_things_are_and_why() {
    use crate::harness::doctor::doctor;
    let w = World::new();
    let origin = w.origin("origin", &[("src/lib.rs", "\n")]);
    let clone = w.clone(&origin, "clone", &[]);
    let run = |args: &[&str], env: &[(&str, &Path)]| {
        let mut cmd = crate::harness::Cmd::new(&clone.join("src"))
            .arg("doctor")
            .args(args);
        for (k, v) in env {
            cmd = cmd.env(k, v);
        }
        let out = cmd.run();
        (out.code, doctor(&out))
    };
    let (code, d) = run(&[SKILL, "--repo", REPO], &[]);
    assert_eq!(
        (code, d.result.as_str(), d.ok),
        (0, "doctor", true),
        "{d:?}"
    );
    let root = d.root.as_ref().unwrap();
    assert_eq!(root.path, clone.to_str().unwrap(), "{d:?}");
    assert!(root.rule.contains("root rule 1"), "{d:?}");
    let layer = d.layer.as_ref().unwrap();
    assert_eq!(
        layer.path,
        clone.join(".git/apache-magpie").to_str().unwrap()
    );
    assert!(layer.rule.contains("layer rule 1"), "{d:?}");
    let store = d.store.as_ref().unwrap();
    assert!(store.from.contains("default"), "{d:?}");
    assert!(store.url.is_some(), "{d:?}");
    let lock = store.lock.as_deref().unwrap_or_default();
    assert!(lock.ends_with(&format!("{NAME}.lock")), "{d:?}");
    assert_eq!(store.answers, Some(true), "{d:?}");
    // The user's configuration file: which line chose the store.
    let config = w.path("cfg/skill-lock.toml");
    let shared = w.env.dir("shared");
    write(
        &config,
        &format!("[repos]\n\"apache/*\" = \"file:{}\"\n", shared.display()),
    );
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, d) = run(&[SKILL, "--repo", REPO], &[("SKILL_LOCK_CONFIG", &config)]);
    assert_eq!(code, 0, "{d:?}");
    let from = &d.store.as_ref().unwrap().from;
    assert!(
        from.contains("line 2") && from.contains("apache/*"),
        "{d:?}"
    );
    // `store = "file"`: the personal layer, chosen by that line.
    write(&config, "store = \"file\"\n");
    let (code, d) = run(&[SKILL, "--repo", REPO], &[("SKILL_LOCK_CONFIG", &config)]);
    assert_eq!(code, 0, "{d:?}");
    let store = d.store.as_ref().unwrap();
    assert!(store.from.contains("line 1"), "{d:?}");
    assert!(
        store
            .lock
            .as_deref()
            .unwrap_or_default()
            .contains(".git/apache-magpie"),
        "{d:?}"
    );
    // Refusals: a tree's skill-lock.toml, a configuration file others can write.
    let planted = clone.join(".git/apache-magpie/skill-lock.toml");
    write(&planted, "store = \"etcd://127.0.0.1:9\"\n");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, d) = run(&[], &[("SKILL_LOCK_CONFIG", &config)]);
    assert_eq!((code, d.ok), (2, false), "{d:?}");
    let refused = d.refused();
    assert!(refused.contains(planted.to_str().unwrap()), "{refused}");
    assert!(refused.contains("chmod go-w"), "{refused}");
    // For a person.
    let out = crate::harness::Cmd::new(&clone)
        .args(["doctor", "--text"])
        .run();
    assert!(
        out.stdout.contains("root:") && out.stdout.contains("refused"),
        "{}",
        out.stdout
    );
    assert_eq!(out.code, 2);
}

/// SPEC §5: every layout git users have keeps working under the rules a
/// tree cannot turn: a linked worktree kept inside the main checkout shares
/// its lock; the `.bare` + `.git` file pattern and its worktrees share one;
/// a clone inside another repository's ignored folder is its own project; a
/// home directory under git does not swallow the clones inside it.
#[test]
fn every_layout_git_users_have_keeps_working() {
    let w = World::new();
    let origin = w.origin(
        "origin",
        &[("src/lib.rs", "\n"), (".gitignore", "vendor/\n")],
    );
    // A worktree kept inside the main checkout.
    let main = w.clone(&origin, "main", &[]);
    let inner = main.join(".worktrees/wt");
    w.git(
        &main,
        &["worktree", "add", "-q", "-b", "wt", inner.to_str().unwrap()],
    );
    contend(
        &[main.clone(), inner.clone(), inner.join("src")],
        &main.join(".git/apache-magpie"),
    );
    // The `.bare` + `.git` file pattern.
    let proj = w.env.dir("proj");
    w.git(
        &proj,
        &[
            "clone",
            "-q",
            "--bare",
            &format!("file://{}", origin.display()),
            ".bare",
        ],
    );
    write(&proj.join(".git"), "gitdir: ./.bare\n");
    let wt = proj.join("main");
    w.git(&proj, &["worktree", "add", "-q", wt.to_str().unwrap()]);
    contend(
        &[proj.clone(), wt.clone(), wt.join("src")],
        &proj.join(".bare/apache-magpie"),
    );
    // A clone inside another repository's ignored folder: its own project.
    let url = format!("file://{}", origin.display());
    let own_project = |parent: &Path, rel: &str| {
        w.git(parent, &["clone", "-q", &url, rel]);
        let dir = parent.join(rel);
        contend(
            &[dir.clone(), dir.join("src")],
            &dir.join(".git/apache-magpie"),
        );
    };
    own_project(&main, "vendor/dep");
    // A home directory under git, with a clone inside.
    let home = w.env.dir("home-under-git");
    w.git(&home, &["init", "-q"]);
    std::fs::create_dir_all(home.join("src")).unwrap();
    own_project(&home.join("src"), "work");
    let dotfiles = Lock::new(&home, SKILL, REPO);
    match dotfiles.acquire() {
        Reply::Acquired { lock, .. } => {
            assert!(
                Path::new(&lock).starts_with(home.join(".git/apache-magpie")),
                "{lock}"
            )
        }
        other => panic!("the home checkout: {other:?}"),
    }
}

/// SPEC §5: as root under `sudo`, the user in `SUDO_UID` is the invoking
/// user: their checkout is a project, their layer passes the checks, and
/// what the tool creates belongs to them (their own later runs can use it).
/// Without `SUDO_UID`, root finds no project in another user's checkout.
/// Needs root; says SKIPPED otherwise.
#[test]
fn under_sudo_the_invoking_users_checkout_and_files_are_theirs() {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED under_sudo_the_invoking_users_checkout_and_files_are_theirs: needs root");
        return;
    }
    let w = World::new();
    let nobody: u32 = 65534;
    let top = w.env.dir("alice");
    let co = top.join("co");
    std::fs::create_dir_all(&co).unwrap();
    w.git(&co, &["init", "-q"]);
    sh(
        &w.env.root,
        "chown",
        &["-R", &format!("{nobody}:{nobody}"), top.to_str().unwrap()],
    );
    std::os::unix::fs::chown(&w.env.root, Some(nobody), Some(nobody)).unwrap();
    let lock = Lock::new(&co, SKILL, REPO);
    lock.op("acquire").run().expect_error("no_root");
    let as_sudo = Lock::new(&co, SKILL, REPO)
        .with_env("SUDO_UID", nobody.to_string())
        .with_env("SUDO_GID", nobody.to_string());
    let token = match as_sudo.acquire() {
        Reply::Acquired { token, lock, .. } => {
            let meta = std::fs::metadata(Path::new(&lock).join("owner.json")).unwrap();
            assert_eq!(meta.uid(), nobody, "the record belongs to the sudo user");
            let p = co.join(".git/apache-magpie");
            assert_eq!(
                std::fs::metadata(&p).unwrap().uid(),
                nobody,
                "the layer too"
            );
            token
        }
        other => panic!("under sudo: {other:?}"),
    };
    assert!(matches!(as_sudo.release(&token), Reply::Released { .. }));
    std::os::unix::fs::chown(&w.env.root, Some(0), Some(0)).unwrap();
}
