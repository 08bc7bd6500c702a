//! A hostile-repository campaign (SPEC §5 "Project root R", "Personal layer
//! P", "Trust", "Nothing a repository carries configures the tool"; §7
//! "Hostile layers", "Mutual exclusion"): repositories built to attack, then
//! really cloned (`git clone` of a `file://` origin, bare, with a separate
//! git directory, with worktrees, as a submodule) or exported (`git archive |
//! tar x`: a folder that is no checkout, rule 3), and a user who only runs
//! `skill-lock` in them, as a sweep of strangers' pull requests does.
//!
//! Each test checks the harmful effect itself, never only a message: the
//! file a committed hook would write does not exist; a loopback listener the
//! test owns sees no connection; nothing outside the personal layer changes
//! (paths, modes, contents of the whole temporary world); two runs of one
//! skill on one repository never both acquire; planted lock state never
//! leaves a lock with no way out.
//!
//! Covers: SPEC §5, §7.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::harness::set_field;
use crate::harness::{Cmd, Out, TestEnv, Value};
use crate::harness::{Lock, Reply};

pub(crate) const SKILL: &str = "issue-triage";
pub(crate) const REPO: &str = "apache/airflow";
/// The lock's name in a file store (`<skill>@<owner>__<name>`).
pub(crate) const NAME: &str = "issue-triage@apache__airflow";
pub(crate) const OTHER: &str = "pr-stale-sweep";
pub(crate) const OTHER_NAME: &str = "pr-stale-sweep@apache__airflow";
/// A well-formed token nobody holds.
pub(crate) const NO_TOKEN: &str = "0123456789abcdef0123456789abcdef";
/// The largest fence there is.
const MAX: u64 = u64::MAX;
/// The folder of rule 3, where earlier versions also kept an adopted
/// project's locks and configuration.
pub(crate) const LOCAL: &str = ".apache-magpie-local";

/// A temporary world: the repositories, their clones, and a home directory
/// for git with no configuration in it.
pub(crate) struct World {
    pub(crate) env: TestEnv,
    pub(crate) home: PathBuf,
}

impl World {
    pub(crate) fn new() -> Self {
        let env = TestEnv::new();
        let home = env.dir("home");
        Self { env, home }
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.env.path(rel)
    }

    /// Runs git in `dir` as a user with no configuration of their own
    /// (`GIT_CONFIG_NOSYSTEM`, an empty `HOME`); returns its stdout.
    #[track_caller]
    pub(crate) fn git(&self, dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(["-c", "init.defaultBranch=main"])
            .args(["-c", "protocol.file.allow=always"])
            .args(["-c", "advice.detachedHead=false"])
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", &self.home)
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE")
            .stdin(Stdio::null())
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A new repository at `rel` whose first commit holds `files`.
    pub(crate) fn origin(&self, rel: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.env.dir(rel);
        self.git(&dir, &["init", "-q"]);
        self.commit(&dir, files, "hostile");
        dir
    }

    /// Writes `files` below `dir` and commits everything there, ignored or not.
    pub(crate) fn commit(&self, dir: &Path, files: &[(&str, &str)], msg: &str) {
        for (rel, body) in files {
            write(&dir.join(rel), body);
        }
        self.git(dir, &["add", "-f", "-A", "."]);
        self.git(dir, &["commit", "-q", "--allow-empty", "-m", msg]);
    }

    /// `git clone [extra] file://<origin> <rel>`, as from a forge.
    pub(crate) fn clone(&self, origin: &Path, rel: &str, extra: &[&str]) -> PathBuf {
        let url = format!("file://{}", origin.display());
        let mut args = vec!["clone", "-q"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[&url, rel]);
        self.git(&self.env.root, &args);
        self.path(rel)
    }

    /// The tree of `origin`'s HEAD unpacked at `rel` (`git archive | tar x`,
    /// as a release tarball is): no checkout at all (SPEC §5 rule 3).
    pub(crate) fn export(&self, origin: &Path, rel: &str) -> PathBuf {
        let tar = self.path(&format!("{rel}.tar"));
        self.git(
            origin,
            &[
                "-c",
                "tar.umask=0022",
                "archive",
                "-o",
                tar.to_str().unwrap(),
                "HEAD",
            ],
        );
        let dir = self.env.dir(rel);
        let st = Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .args(["--no-same-owner", "--no-same-permissions", "-C"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "tar -x {}", tar.display());
        std::fs::remove_file(&tar).unwrap();
        dir
    }

    /// A repository whose first commit (branch `pre-adoption`) predates its
    /// adoption and whose second (on `main`) adds `.apache-magpie.lock`.
    pub(crate) fn adopted_origin(&self, rel: &str) -> PathBuf {
        let dir = self.origin(rel, &[("README", "before\n"), ("src/lib.rs", "\n")]);
        self.git(&dir, &["branch", "pre-adoption"]);
        self.commit(&dir, &[(".apache-magpie.lock", "")], "adopt");
        dir
    }
}

pub(crate) fn write(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
}

/// The typed answer of `verb` (`run` prints its object on stderr).
#[track_caller]
pub(crate) fn answer(verb: &str, out: &Out) -> Reply {
    if verb == "run" {
        out.run_reply()
    } else {
        out.reply()
    }
}

/// Every command of SPEC §2 on one lock (and on the store), run from `cwd`
/// as a user sweeping a checkout runs them.
pub(crate) fn every_command(cwd: &Path) -> Vec<(&'static str, Cmd)> {
    let lock = Lock::new(cwd, SKILL, REPO);
    vec![
        ("acquire", lock.op("acquire")),
        ("status", lock.op("status")),
        ("list", lock.store_op("list")),
        ("renew", lock.op("renew").force()),
        ("check", lock.op("check").token(NO_TOKEN)),
        ("history", lock.op("history")),
        ("history", lock.store_op("history")),
        ("run", lock.op("run").command(["true"])),
        ("release", lock.op("release")),
    ]
}

/// The answer a command gives where a repository committed a
/// configuration: `usage`, naming the file.
#[track_caller]
pub(crate) fn refused_for(verb: &str, out: &Out, config: &Path) {
    match answer(verb, out) {
        Reply::Error { error, message, .. } => {
            assert_eq!(error, "usage", "{verb}: {message}");
            assert!(
                message.contains(config.to_str().unwrap()),
                "{verb}: the message names {}: {message}",
                config.display()
            );
        }
        other => panic!("{verb} used a committed configuration: {other:?}"),
    }
}

/// The hooks a push into (or a fetch from) a repository can run.
const HOOKS: [&str; 6] = [
    "pre-receive",
    "update",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
];

/// A bare repository at `dir`, made to be committed as plain files, whose
/// every hook appends its name to `marker` (outside every checkout).
pub(crate) fn bare_repo_with_hooks(w: &World, dir: &Path, marker: &Path) {
    w.git(
        dir.parent().unwrap(),
        &[
            "init",
            "-q",
            "--bare",
            dir.file_name().unwrap().to_str().unwrap(),
        ],
    );
    for e in std::fs::read_dir(dir.join("hooks")).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    for hook in HOOKS {
        let path = dir.join("hooks").join(hook);
        write(
            &path,
            &format!("#!/bin/sh\necho {hook} >> '{}'\n", marker.display()),
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // Git commits no empty directory: keep the ones that make it a repository.
    for keep in ["refs/heads", "refs/tags", "objects/info", "objects/pack"] {
        write(&dir.join(keep).join(".gitkeep"), "");
    }
}

/// SPEC §5: a committed `.apache-magpie-local/skill-lock.toml` naming a git
/// store at a bare repository the same commit carries, with hooks. A push
/// there would run the repository's code as the user. Nothing a repository
/// carries configures the tool, in a clone (rule 1) or in an export of it
/// (rule 3), from its top or a subdirectory: no hook ever runs.
#[test]
fn a_committed_config_naming_a_bare_repo_with_hooks_runs_nothing() {
    let w = World::new();
    let marker = w.path("pwned");
    let origin = w.env.dir("origin");
    w.git(&origin, &["init", "-q"]);
    bare_repo_with_hooks(&w, &origin.join("lockstore.git"), &marker);
    w.commit(
        &origin,
        &[
            (".apache-magpie.lock", ""),
            (
                ".apache-magpie-local/skill-lock.toml",
                "store = \"git:lockstore.git\"\n",
            ),
            ("src/lib.rs", "\n"),
        ],
        "adopt, with a lock store",
    );
    // The control: in a clone, the committed repository is live and a push
    // into it runs its hooks.
    let control = w.clone(&origin, "control", &[]);
    w.git(
        &control,
        &["push", "-q", "lockstore.git", "HEAD:refs/heads/x"],
    );
    assert!(
        marker.exists(),
        "control: the committed hooks run on a push"
    );
    std::fs::remove_file(&marker).unwrap();

    let clone = w.clone(&origin, "clone", &[]);
    let export = w.export(&origin, "export");
    for root in [&clone, &export] {
        let config = root.join(LOCAL).join("skill-lock.toml");
        for cwd in [root.clone(), root.join("src")] {
            for (verb, cmd) in every_command(&cwd) {
                let out = cmd.run();
                assert!(
                    !marker.exists(),
                    "`{verb}` in {} ran the repository's hooks ({:?}): {}",
                    cwd.display(),
                    std::fs::read_to_string(&marker).unwrap_or_default(),
                    out.stdout
                );
                refused_for(verb, &out, &config);
            }
        }
    }
}

/// A loopback listener the test owns: a thread accepts (non-blocking) and
/// counts every connection, dropping each at once.
pub(crate) struct Listener {
    pub(crate) port: u16,
    count: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    pub(crate) fn new() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let count = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (Arc::clone(&count), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok(_) => {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Self {
            port,
            count,
            stop,
            thread: Some(thread),
        }
    }

    /// Connections accepted so far (after a moment, so that one a command
    /// made just before it ended is counted too).
    pub(crate) fn connections(&self) -> usize {
        std::thread::sleep(Duration::from_millis(20));
        self.count.load(Ordering::SeqCst)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// SPEC §5: a committed configuration naming an etcd host (here a loopback
/// port the test listens on) never makes a command connect there, so the
/// user's `SKILL_LOCK_ETCD_USER`/`SKILL_LOCK_ETCD_PASSWORD` go nowhere.
#[test]
fn a_committed_config_naming_a_host_never_connects_to_it() {
    let w = World::new();
    let host = Listener::new();
    let origin = w.origin(
        "origin",
        &[
            (".apache-magpie.lock", ""),
            (
                ".apache-magpie-local/skill-lock.toml",
                &format!("store = \"etcd://127.0.0.1:{}\"\n", host.port),
            ),
            ("src/lib.rs", "\n"),
        ],
    );
    let clone = w.clone(&origin, "clone", &[]);
    let export = w.export(&origin, "export");
    for root in [&clone, &export] {
        let config = root.join(LOCAL).join("skill-lock.toml");
        for cwd in [root.clone(), root.join("src")] {
            for (verb, cmd) in every_command(&cwd) {
                let out = cmd
                    .env("SKILL_LOCK_ETCD_USER", "victim")
                    .env("SKILL_LOCK_ETCD_PASSWORD", "hunter2")
                    .run();
                assert_eq!(
                    host.connections(),
                    0,
                    "`{verb}` in {} connected to the repository's host: {}",
                    cwd.display(),
                    out.stdout
                );
                refused_for(verb, &out, &config);
            }
        }
    }
}

/// Every path below `dir` (and `dir` itself) with its mode (`st_mode`: type
/// and permissions) and what it holds: a file's SHA-256, a link's target,
/// `dir` for a directory.
pub(crate) fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, String)> {
    fn walk(p: &Path, out: &mut BTreeMap<PathBuf, (u32, String)>) {
        let meta = std::fs::symlink_metadata(p).unwrap();
        let what = if meta.file_type().is_symlink() {
            format!("-> {}", std::fs::read_link(p).unwrap().display())
        } else if meta.is_dir() {
            for e in std::fs::read_dir(p).unwrap() {
                walk(&e.unwrap().path(), out);
            }
            "dir".to_owned()
        } else {
            Sha256::digest(std::fs::read(p).unwrap())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        };
        out.insert(p.to_path_buf(), (meta.mode(), what));
    }
    let mut out = BTreeMap::new();
    walk(dir, &mut out);
    out
}

/// `snap` without what lies at or below any of `layers`.
pub(crate) fn outside(
    mut snap: BTreeMap<PathBuf, (u32, String)>,
    layers: &[PathBuf],
) -> BTreeMap<PathBuf, (u32, String)> {
    snap.retain(|p, _| !layers.iter().any(|l| p.starts_with(l)));
    snap
}

/// What differs between two snapshots, one line a path.
pub(crate) fn changes(
    before: &BTreeMap<PathBuf, (u32, String)>,
    after: &BTreeMap<PathBuf, (u32, String)>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (p, was) in before {
        match after.get(p) {
            None => out.push(format!("deleted {}", p.display())),
            Some(now) if now != was => {
                out.push(format!("changed {}: {was:?} -> {now:?}", p.display()));
            }
            Some(_) => {}
        }
    }
    for p in after.keys().filter(|p| !before.contains_key(*p)) {
        out.push(format!("created {}", p.display()));
    }
    out
}

/// SPEC §5, §7: a committed configuration naming a file store outside the
/// checkout (`file:../somewhere`, resolved against the root, and an
/// absolute `file:/...` naming a folder that exists) never makes a command
/// create, write or delete anything outside the personal layer: a snapshot
/// of the whole temporary world (the clones' working trees and git
/// directories, the exports, the targets, the origins) is the same before
/// and after every command.
#[test]
fn a_committed_config_naming_a_path_writes_nothing_outside_the_layer() {
    let w = World::new();
    let far = w.env.dir("far");
    write(&far.join("keep.txt"), "the user's own\n");
    let adopted = |rel: &str, store: &str| {
        w.origin(
            rel,
            &[
                (".apache-magpie.lock", ""),
                (
                    ".apache-magpie-local/skill-lock.toml",
                    &format!("store = \"{store}\"\n"),
                ),
                ("src/lib.rs", "\n"),
            ],
        )
    };
    let relative = adopted("origin-rel", "file:../somewhere");
    let absolute = adopted("origin-abs", &format!("file:{}", far.display()));
    let roots = [
        w.clone(&relative, "clone-rel", &[]),
        w.clone(&absolute, "clone-abs", &[]),
        w.export(&relative, "export-rel"),
        w.export(&absolute, "export-abs"),
    ];
    let layers = [
        roots[0].join(".git/apache-magpie"),
        roots[1].join(".git/apache-magpie"),
        roots[2].join(LOCAL).join("run"),
        roots[3].join(LOCAL).join("run"),
    ];
    for root in &roots {
        let config = root.join(LOCAL).join("skill-lock.toml");
        for cwd in [root.clone(), root.join("src")] {
            for (verb, cmd) in every_command(&cwd) {
                let before = outside(snapshot(&w.env.root), &layers);
                let out = cmd.run();
                let after = outside(snapshot(&w.env.root), &layers);
                let changed = changes(&before, &after);
                assert!(
                    changed.is_empty(),
                    "`{verb}` in {} changed the world outside its layer:\n{}\n{}",
                    cwd.display(),
                    changed.join("\n"),
                    out.stdout
                );
                refused_for(verb, &out, &config);
            }
        }
    }
}

/// A record and a history line as this version writes them, from a real
/// acquisition (30 days of lease) in a plain folder `rel`: the record's
/// lease is judged by its `expires` alone (the boot-clock deadline dropped),
/// so a test can set it.
pub(crate) fn real_state(w: &World, rel: &str) -> (Value, Value) {
    let scratch = w.env.dir(rel);
    let lock = Lock::new(&scratch, SKILL, REPO);
    match lock.op("acquire").root(".").ttl(2_592_000).reply() {
        Reply::Acquired { .. } => {}
        other => panic!("scratch acquire: {other:?}"),
    }
    let run = scratch.join(LOCAL).join("run");
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
    let mut record: Value =
        serde_json::from_str(&read(run.join(format!("locks/{NAME}.lock/owner.json")))).unwrap();
    set_field(&mut record, "deadline_boot_ms", Value::Null);
    let history = read(run.join("history.jsonl"));
    let event: Value = serde_json::from_str(history.lines().next().unwrap()).unwrap();
    (record, event)
}

/// The fields of a record whose lease started now and ends in `secs`.
pub(crate) fn within(secs: i64) -> Vec<(&'static str, Value)> {
    let fmt = time::format_description::well_known::Rfc3339;
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap();
    let at = |t: time::OffsetDateTime| Value::from(t.format(&fmt).unwrap());
    vec![
        ("started", at(now)),
        ("expires", at(now + time::Duration::seconds(secs))),
        ("ttl", secs.into()),
    ]
}

/// `v` with its fields set, as one line of text.
pub(crate) fn with(v: &Value, fields: &[(&str, Value)]) -> String {
    let mut v = v.clone();
    for (f, to) in fields {
        set_field(&mut v, f, to.clone());
    }
    format!("{v}\n")
}

pub(crate) const PAST: &str = "2001-01-01T00:00:00Z";

/// SPEC §5 rule 1 and the upgrade: lock state of every kind committed under
/// `.apache-magpie-local/run/` lies, in a git clone, in the working tree and
/// is not the lock. A run in the clone acquires in the git directory, with
/// fences of its own (a planted counter or history at `u64::MAX` feeds
/// nothing), and writes nothing in the working tree. A live lock an older
/// version left there is never ignored while its lease runs: `acquire` and
/// `run` refuse (`io`, naming it) and take nothing, `list` shows it under
/// `legacy`; once its lease has run out, `acquire` works.
#[test]
fn committed_lock_state_in_a_git_clone_is_not_the_lock() {
    let w = World::new();
    let (record, event) = real_state(&w, "scratch");
    // A live lease of the original tool: an hour left (at most 24 hours
    // ahead holds the name, SPEC §5 "Upgrading from the original tool").
    let live = with(&record, &within(3600));
    let history = [NAME, OTHER_NAME]
        .iter()
        .map(|n| with(&event, &[("lock", (*n).into()), ("fence", MAX.into())]))
        .collect::<String>();
    let run = ".apache-magpie-local/run";
    let max = format!("{MAX}\n");
    let origin = w.origin(
        "origin",
        &[
            (".apache-magpie.lock", ""),
            ("src/lib.rs", "\n"),
            (&format!("{run}/.gitignore"), "!*\n"),
            (&format!("{run}/locks/{NAME}.lock/owner.json"), &live),
            (
                &format!("{run}/locks/{OTHER_NAME}.lock/owner.json"),
                "{oops",
            ),
            (&format!("{run}/keys/{NAME}.fence"), &max),
            (&format!("{run}/keys/{OTHER_NAME}.fence"), "garbage\n"),
            (&format!("{run}/history.jsonl"), &history),
            (&format!("{run}/history.1.jsonl"), &history),
            (&format!("{run}/tombs/{NAME}.1.planted/owner.json"), &live),
        ],
    );
    let clone = w.clone(&origin, "clone", &[]);
    let p = clone.join(".git/apache-magpie");
    let tree = outside(snapshot(&clone), &[clone.join(".git")]);

    // Another lock: taken in the git directory, fence 1 (nothing planted
    // feeds it), and held against a second run.
    let other = Lock::new(&clone, OTHER, REPO);
    let token = match other.acquire() {
        Reply::Acquired {
            lock, fence, token, ..
        } => {
            assert!(
                Path::new(&lock).starts_with(&p) && Path::new(&lock).is_dir(),
                "the lock is in the git directory: {lock}"
            );
            assert_eq!(fence, 1, "a planted counter or history fed the fence");
            token
        }
        other => panic!("acquire in the clone: {other:?}"),
    };
    match Lock::new(&clone.join("src"), OTHER, REPO).acquire() {
        Reply::AlreadyRunning { .. } => {}
        other => panic!("a second run acquired too: {other:?}"),
    }
    assert!(matches!(other.release(&token), Reply::Released { .. }));

    // The planted live lock: refused while its lease runs, nothing taken,
    // nothing run.
    let planted = clone.join(run).join(format!("locks/{NAME}.lock"));
    let ours = p.join(format!("run/locks/{NAME}.lock"));
    let ran = w.path("ran");
    let lock = Lock::new(&clone, SKILL, REPO);
    let runs = [
        ("acquire", lock.op("acquire")),
        ("run", lock.op("run").command([Path::new("touch"), &ran])),
    ];
    for (verb, cmd) in runs {
        let out = cmd.run();
        assert!(
            !ours.exists() && !ran.exists(),
            "`{verb}` acquired beside a live lock an older version holds: {}{}",
            out.stdout,
            out.stderr
        );
        match answer(verb, &out) {
            Reply::AlreadyRunning { lock, hint, .. } => {
                assert_eq!(Path::new(&lock), planted, "{verb}: {hint}");
                assert!(hint.contains(planted.to_str().unwrap()), "{verb}: {hint}");
            }
            other => panic!("{verb}: {other:?}"),
        }
    }
    match Lock::new(&clone, SKILL, REPO).list() {
        Reply::List { locks, legacy, .. } => {
            assert!(locks.is_empty(), "{locks:?}");
            let shown = legacy.iter().find(|e| e.skill == SKILL);
            assert!(
                shown.is_some_and(|e| e.state == "held" && Path::new(&e.lock) == planted),
                "list shows the planted live lock under legacy: {legacy:?}"
            );
        }
        other => panic!("list: {other:?}"),
    }
    let after = outside(snapshot(&clone), &[clone.join(".git")]);
    assert_eq!(
        changes(&tree, &after),
        Vec::<String>::new(),
        "the working tree is written"
    );

    // Its lease over, the lock is taken, in the git directory.
    write(
        &planted.join("owner.json"),
        &with(&record, &[("expires", PAST.into())]),
    );
    match lock.acquire() {
        Reply::Acquired { lock, fence, .. } => {
            assert!(Path::new(&lock).starts_with(&p), "{lock}");
            assert_eq!(fence, 1);
        }
        other => panic!("acquire after the old lease: {other:?}"),
    }
    match Lock::new(&clone.join("src"), SKILL, REPO).acquire() {
        Reply::AlreadyRunning { .. } => {}
        other => panic!("a second run acquired too: {other:?}"),
    }
}

/// The files of the layer `layer` that `message` names (absolute paths
/// that exist), deepest first.
fn named_in(message: &str, layer: &Path) -> Vec<PathBuf> {
    let prefix = layer.to_str().unwrap();
    let mut found: Vec<PathBuf> = message
        .match_indices(prefix)
        .map(|(i, _)| {
            let rest = &message[i..];
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            PathBuf::from(rest[..end].trim_end_matches([':', ';', ',', ')', '\'', '"', '.']))
        })
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// Runs `verb` (on the lock, or on the store for `list` and `history`) in
/// the folder `dir` until it works, doing at each answer what it says:
/// an error must name a file of the layer, which is deleted; a lock held
/// is released with the exact `hint` line, pasted into a shell. A lock
/// with no way out (an error naming no file, or no end) is an `Err`.
fn until_it_works(dir: &Path, verb: &str) -> Result<(), String> {
    let layer = dir.join(LOCAL);
    let lock = Lock::new(dir, SKILL, REPO);
    let mut seen = Vec::new();
    for _ in 0..6 {
        let out = match verb {
            "list" | "history" => lock.store_op(verb).run(),
            _ => lock.op(verb).run(),
        };
        match out.reply() {
            Reply::Acquired { token, .. } => {
                return match lock.release(&token) {
                    Reply::Released { .. } => Ok(()),
                    other => Err(format!("release after acquire: {other:?}")),
                };
            }
            Reply::Status { .. } | Reply::List { .. } | Reply::History { .. } => {
                return Ok(());
            }
            Reply::AlreadyRunning { hint, .. } => {
                let out = Out::from(
                    Command::new("sh")
                        .args(["-c", &hint])
                        .current_dir(dir)
                        .env_clear()
                        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                        .output()
                        .unwrap(),
                );
                match out.reply() {
                    Reply::Released { .. } => seen.push(format!("released by the hint {hint}")),
                    other => return Err(format!("the hint {hint:?} answered {other:?}")),
                }
            }
            Reply::Error { message, .. } => {
                let named = named_in(&message, &layer);
                let Some(file) = named.first() else {
                    return Err(format!(
                        "`{verb}` answered an error naming no file of the layer \
                         (after: {seen:?}): {message}"
                    ));
                };
                if !["delete", "remove"].iter().any(|w| message.contains(w)) {
                    return Err(format!(
                        "`{verb}`: the error says not how to clear it: {message}"
                    ));
                }
                let meta = std::fs::symlink_metadata(file).unwrap();
                if meta.is_dir() {
                    std::fs::remove_dir_all(file).unwrap();
                } else {
                    std::fs::remove_file(file).unwrap();
                }
                seen.push(format!("deleted {} ({message})", file.display()));
            }
            other => return Err(format!("`{verb}` answered {other:?}")),
        }
    }
    Err(format!("`{verb}` never works again: no way out ({seen:?})"))
}

/// SPEC §5 "Nothing a repository carries configures the tool" (its last
/// sentence): in a folder that is no checkout (rule 3: an export of an
/// adopted repository), lock state the repository planted in
/// `.apache-magpie-local/run/` (counters and history lines at `u64::MAX`,
/// garbage, records whose lease runs far ahead, tombstones, a `.gitignore`
/// of `!*`, a directory where a file goes) costs at worst an error that
/// names the file: once that file is deleted (or the lock released with
/// the hint's line), `acquire` and `release` work again, and so do
/// `status`, `list` and `history`.
#[test]
fn planted_state_in_an_exported_folder_never_leaves_a_lock_with_no_way_out() {
    let w = World::new();
    let (record, event) = real_state(&w, "scratch");
    let max = format!("{MAX}\n");
    let far_future = "2099-01-01T00:00:00Z";
    let previous_max = with(&record, &[("fence", MAX.into())]);
    let previous_max: Value = serde_json::from_str(&previous_max).unwrap();
    // What each case commits, below `.apache-magpie-local/run/` (or below
    // the root, for a path that starts with `/`).
    let cases: Vec<(&str, Vec<(String, String)>)> = vec![
        (
            "counter at u64::MAX",
            vec![(format!("keys/{NAME}.fence"), max.clone())],
        ),
        (
            "counter of garbage",
            vec![(format!("keys/{NAME}.fence"), "x\n".into())],
        ),
        (
            "counter is a directory",
            vec![(format!("keys/{NAME}.fence/x"), String::new())],
        ),
        (
            "history line with fence u64::MAX",
            vec![(
                "history.jsonl".into(),
                with(&event, &[("fence", MAX.into())]),
            )],
        ),
        (
            "rotated history line with fence u64::MAX",
            vec![(
                "history.1.jsonl".into(),
                with(&event, &[("fence", MAX.into())]),
            )],
        ),
        (
            "history line whose previous holder has fence u64::MAX",
            vec![(
                "history.jsonl".into(),
                with(
                    &event,
                    &[("event", "took_over".into()), ("previous", previous_max)],
                ),
            )],
        ),
        (
            "history of garbage",
            vec![("history.jsonl".into(), "{\n\0\0garbage\n".into())],
        ),
        (
            "history is a directory",
            vec![("history.jsonl/x".into(), String::new())],
        ),
        (
            "record of garbage",
            vec![(format!("locks/{NAME}.lock/owner.json"), "{garbage".into())],
        ),
        (
            "record whose lease ends far in the future",
            vec![(
                format!("locks/{NAME}.lock/owner.json"),
                with(&record, &[("expires", far_future.into())]),
            )],
        ),
        (
            "live record",
            vec![(format!("locks/{NAME}.lock/owner.json"), with(&record, &[]))],
        ),
        (
            "live record with fence u64::MAX",
            vec![(
                format!("locks/{NAME}.lock/owner.json"),
                with(&record, &[("fence", MAX.into())]),
            )],
        ),
        (
            "expired record with fence u64::MAX",
            vec![(
                format!("locks/{NAME}.lock/owner.json"),
                with(&record, &[("fence", MAX.into()), ("expires", PAST.into())]),
            )],
        ),
        (
            "lock that is a file",
            vec![(format!("locks/{NAME}.lock"), "x".into())],
        ),
        ("locks that is a file", vec![("locks".into(), "x".into())]),
        (
            "tombstone with a live record",
            vec![(
                format!("tombs/{NAME}.1.planted/owner.json"),
                with(&record, &[]),
            )],
        ),
        (
            "run/.gitignore of !*",
            vec![(".gitignore".into(), "!*\n".into())],
        ),
        (
            "guard is a directory",
            vec![(format!("keys/{NAME}.guard/x"), String::new())],
        ),
        ("keys that is a file", vec![("keys".into(), "x".into())]),
        ("tombs that is a file", vec![("tombs".into(), "x".into())]),
        ("tmp that is a file", vec![("tmp".into(), "x".into())]),
        (
            "a lock left half-built in tmp",
            vec![(format!("tmp/{NAME}/owner.json"), with(&record, &[]))],
        ),
        (
            "history guard is a directory",
            vec![("history.lock/x".into(), String::new())],
        ),
        (
            "run that is a file",
            vec![(format!("/{LOCAL}/run"), "x".into())],
        ),
        (
            "layer that is a file",
            vec![(format!("/{LOCAL}"), "x".into())],
        ),
        (
            "everything at once",
            vec![
                (format!("keys/{NAME}.fence"), max.clone()),
                (
                    "history.jsonl".into(),
                    with(&event, &[("fence", MAX.into())]),
                ),
                (
                    format!("locks/{NAME}.lock/owner.json"),
                    with(&record, &[("fence", MAX.into())]),
                ),
            ],
        ),
    ];
    let mut failed = Vec::new();
    for (i, (label, files)) in cases.iter().enumerate() {
        for verb in ["acquire", "status", "list", "history"] {
            let mut committed: Vec<(String, String)> = files
                .iter()
                .map(|(rel, body)| match rel.strip_prefix('/') {
                    Some(top) => (top.to_owned(), body.clone()),
                    None => (format!("{LOCAL}/run/{rel}"), body.clone()),
                })
                .collect();
            committed.push((".apache-magpie.lock".into(), String::new()));
            let borrowed: Vec<(&str, &str)> = committed
                .iter()
                .map(|(r, b)| (r.as_str(), b.as_str()))
                .collect();
            let origin = w.origin(&format!("origin-{i}-{verb}"), &borrowed);
            let export = w.export(&origin, &format!("export-{i}-{verb}"));
            // And the lock works from then on.
            if let Err(e) =
                until_it_works(&export, verb).and_then(|()| until_it_works(&export, "acquire"))
            {
                failed.push(format!("{label} ({verb}): {e}"));
            }
        }
    }
    assert!(failed.is_empty(), "no way out:\n{}", failed.join("\n"));
}

/// SPEC §5 rule 1: a committed `.gitignore` that un-ignores everything
/// (`!*`, `!.git`, `!.apache-magpie-local/`) and a routine `git clean
/// -fdx` (or `-ffdx`, or `git stash --all`) in the clone while a lock is
/// held never free it: the next run finds it held, and the holder's token
/// still holds it.
#[test]
fn gitignore_tricks_and_git_clean_never_free_a_held_lock() {
    let w = World::new();
    let origin = w.origin(
        "origin",
        &[
            (".apache-magpie.lock", ""),
            (
                ".gitignore",
                "!*\n!.git\n!.git/\n!.git/**\n!.apache-magpie-local/\n!.apache-magpie-local/**\n",
            ),
            (".apache-magpie-local/.gitignore", "!*\n"),
            (".apache-magpie-local/run/.gitignore", "!*\n"),
            ("src/lib.rs", "\n"),
        ],
    );
    let clone = w.clone(&origin, "clone", &[]);
    let first = Lock::new(&clone, SKILL, REPO);
    let token = match first.acquire() {
        Reply::Acquired { token, .. } => token,
        other => panic!("acquire: {other:?}"),
    };
    let sweeps: [&[&str]; 5] = [
        &["clean", "-fd"],
        &["clean", "-fdX"],
        &["clean", "-fdx"],
        &["clean", "-ffdx"],
        &["stash", "--all"],
    ];
    for sweep in sweeps {
        w.git(&clone, sweep);
        match Lock::new(&clone.join("src"), SKILL, REPO).acquire() {
            Reply::AlreadyRunning { .. } => {}
            other => panic!("after git {sweep:?} a second run acquired: {other:?}"),
        }
        match first.check(&token) {
            Reply::Held { .. } => {}
            other => panic!("after git {sweep:?} the holder lost its lock: {other:?}"),
        }
    }
}

/// Two runs of one skill on one repository, started from any two of
/// `places`, never both acquire: the lock is held against the second, which
/// sees the first's token hold it; and from everywhere the lock is in
/// `layer` (checked last, so that a split shows as what it does).
#[track_caller]
pub(crate) fn contend(places: &[PathBuf], layer: &Path) {
    let mut locks = Vec::new();
    for a in places {
        for b in places.iter().filter(|b| *b != a) {
            let first = Lock::new(a, SKILL, REPO);
            let (token, lock) = match first.acquire() {
                Reply::Acquired { token, lock, .. } => (token, lock),
                other => panic!("from {}: {other:?}", a.display()),
            };
            let second = Lock::new(b, SKILL, REPO);
            match second.acquire() {
                Reply::AlreadyRunning { .. } => {}
                other => panic!(
                    "{} then {}: both acquired: {other:?}",
                    a.display(),
                    b.display()
                ),
            }
            match second.check(&token) {
                Reply::Held { .. } => {}
                other => panic!("{} sees another lock: {other:?}", b.display()),
            }
            match first.release(&token) {
                Reply::Released { .. } => {}
                other => panic!("release: {other:?}"),
            }
            locks.push((a, lock));
        }
    }
    for (from, lock) in locks {
        assert!(
            Path::new(&lock).starts_with(layer),
            "from {}: the lock is {lock}, not in {}",
            from.display(),
            layer.display()
        );
    }
}

/// SPEC §5 "Project root R": a `.svn/` or an `.apache-magpie.lock` that a
/// repository commits in a subdirectory makes no second project: from
/// every folder of the clone (and `--root` at such a subdirectory) one lock.
#[test]
fn markers_and_svn_below_a_clone_make_no_second_lock() {
    let w = World::new();
    let origin = w.origin(
        "origin",
        &[
            ("README", "\n"),
            ("sub/.svn/entries", "12\n"),
            ("sub/.svn/wc.db", "SQLite format 3\0"),
            ("sub/inner/.apache-magpie.lock", ""),
            ("adopted/.apache-magpie.lock", ""),
            ("adopted/deeper/file", "\n"),
        ],
    );
    let clone = w.clone(&origin, "clone", &[]);
    let layer = clone.join(".git/apache-magpie");
    let places: Vec<PathBuf> = ["", "sub", "sub/inner", "adopted", "adopted/deeper"]
        .iter()
        .map(|rel| clone.join(rel))
        .collect();
    contend(&places, &layer);
    let first = Lock::new(&clone, SKILL, REPO);
    let token = first.acquire().token().to_owned();
    for root in ["sub", "sub/inner", "adopted/deeper"] {
        match first.op("acquire").root(root).reply() {
            Reply::AlreadyRunning { .. } => {}
            other => panic!("--root {root}: both acquired: {other:?}"),
        }
    }
    assert!(matches!(first.release(&token), Reply::Released { .. }));
}

/// SPEC §5 rule 1: a clone with a separate git directory (`.git` is a file)
/// and linked worktrees of it, one on a branch from before the project was
/// adopted: one lock, in the separate git directory.
#[test]
fn a_separate_git_dir_and_its_worktrees_share_one_lock() {
    let w = World::new();
    let origin = w.adopted_origin("origin");
    let gitdir = w.env.dir("gitdirs").join("sep");
    let clone = w.clone(
        &origin,
        "clone",
        &["--separate-git-dir", gitdir.to_str().unwrap()],
    );
    let old = w.path("wt-old");
    let new = w.path("wt-new");
    w.git(
        &clone,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "old",
            old.to_str().unwrap(),
            "pre-adoption",
        ],
    );
    w.git(
        &clone,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "new",
            new.to_str().unwrap(),
            "main",
        ],
    );
    assert!(!old.join(".apache-magpie.lock").exists() && new.join(".apache-magpie.lock").exists());
    contend(
        &[clone.clone(), clone.join("src"), old, new],
        &gitdir.join("apache-magpie"),
    );
}

/// SPEC §5 rule 1: the worktrees of a bare clone (the common workflow), one
/// on `main` (adopted), one on a branch from before the adoption: one lock,
/// in the bare repository.
#[test]
fn the_worktrees_of_a_bare_clone_share_one_lock_before_and_after_adoption() {
    let w = World::new();
    let origin = w.adopted_origin("origin");
    let bare = w.clone(&origin, "bare.git", &["--bare"]);
    let main = w.path("wt-main");
    let old = w.path("wt-old");
    w.git(
        &bare,
        &["worktree", "add", "-q", main.to_str().unwrap(), "main"],
    );
    w.git(
        &bare,
        &[
            "worktree",
            "add",
            "-q",
            old.to_str().unwrap(),
            "pre-adoption",
        ],
    );
    assert!(!old.join(".apache-magpie.lock").exists() && main.join(".apache-magpie.lock").exists());
    contend(
        &[main.clone(), main.join("src"), old.clone(), old.join("src")],
        &bare.join("apache-magpie"),
    );
}

/// SPEC §5 root rule 1: a submodule (made by `clone --recurse-submodules`)
/// makes no second project for the same (skill, repo).
#[test]
fn a_submodule_belongs_to_its_superproject() {
    let w = World::new();
    let origin = w.adopted_origin("origin");
    let upstream = w.origin("super", &[("README", "super\n")]);
    let url = format!("file://{}", origin.display());
    w.git(&upstream, &["submodule", "add", "-q", &url, "mod"]);
    w.git(&upstream, &["commit", "-q", "-m", "add mod"]);
    let clone = w.clone(&upstream, "clone", &["--recurse-submodules"]);
    let module = clone.join("mod");
    assert!(module.join(".apache-magpie.lock").exists());
    // SPEC §5 root rule 1: a submodule (its git directory below the
    // superproject's `modules/`) belongs to the superproject, as an svn
    // external belongs to its outer working copy: one lock from all three.
    let layer = clone.join(".git/apache-magpie");
    contend(&[clone.clone(), module.clone(), module.join("src")], &layer);
}

/// SPEC §5 rule 1: a branch switch that removes (or adds) the project's
/// `.apache-magpie.lock` while a lock is held never frees it.
#[test]
fn a_branch_switch_that_removes_the_marker_never_frees_a_held_lock() {
    let w = World::new();
    let origin = w.adopted_origin("origin");
    let clone = w.clone(&origin, "clone", &[]);
    let lock = Lock::new(&clone, SKILL, REPO);
    for (from, to) in [("main", "pre-adoption"), ("pre-adoption", "main")] {
        w.git(&clone, &["checkout", "-q", from]);
        let token = lock.acquire().token().to_owned();
        w.git(&clone, &["checkout", "-q", to]);
        assert_eq!(
            clone.join(".apache-magpie.lock").exists(),
            to == "main",
            "the switch to {to}"
        );
        match lock.acquire() {
            Reply::AlreadyRunning { .. } => {}
            other => panic!("after the switch to {to} a second run acquired: {other:?}"),
        }
        match lock.check(&token) {
            Reply::Held { .. } => {}
            other => panic!("after the switch to {to} the holder lost its lock: {other:?}"),
        }
        assert!(matches!(lock.release(&token), Reply::Released { .. }));
    }
}
