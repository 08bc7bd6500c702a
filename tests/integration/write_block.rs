//! The write-lock block held to its promise (SPEC §1): a skill that follows
//! docs/write-lock.md word for word never posts the same thing twice, however
//! its runs overlap, wait, die or freeze, but for a post in flight when its
//! run was killed or frozen past its lease.
//!
//! The block's commands are taken from docs/write-lock.md itself (each fenced
//! command follows a `<!-- write-lock step: NAME -->` line), placeholders
//! substituted, the launcher replaced by the binary under test, and the
//! lease scaled from 900 s to a few seconds; no hand-written copy. The glue
//! around them is the block's prose: branch on the exit status, read again
//! unless `status` said `free` and `others_since` is `false`, renew right
//! before each post, release with the token. The skill posts to a fake
//! forge on loopback that records every comment. The same orderings run
//! once more with the sessions speaking MCP (the block's "MCP form", one
//! `skill-lock mcp` per session, killed and frozen with it), mixed with
//! shell runs.
//!
//! Besides random campaigns, it plays the orderings that once doubled,
//! each deterministic on the file and git stores (gates and pauses, not
//! timing): a holder paused past its lease (`stale`) that revives and
//! posts, on etcd in the early-stale second; `--wait` behind such a holder;
//! `--since` forgotten; a renew that lost its token prefix; a script that
//! exits 3 under the block's `run` line (`--conflict-exit-code`).
//!
//! Covers: SPEC §1, §2, §2.1, §2.2, §2.4, §2.7, §2.9, §8.

use crate::harness;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::TestEnv;
use harness::chaos::Seed;

const LAUNCHER: &str = "uvx --from ~/.claude/magpie/skill-lock skill-lock";

/// The block's commands, as bash, one field per step.
struct Steps {
    status: String,
    acquire: String,
    renew: String,
    release: String,
    run: String,
}

/// The block's commands, as bash, each taken from its step in the doc.
fn steps() -> Steps {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/write-lock.md"))
            .unwrap();
    let mut out = BTreeMap::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .strip_prefix("<!-- write-lock step: ")
            .and_then(|l| l.strip_suffix(" -->"))
        else {
            continue;
        };
        assert_eq!(lines.next(), Some("```"), "step {name}: a fence follows");
        let cmd = lines.next().unwrap();
        assert_eq!(lines.next(), Some("```"), "step {name}: one line");
        out.insert(name.to_owned(), to_bash(name, cmd));
    }
    let mut step = |name: &str| {
        out.remove(name)
            .unwrap_or_else(|| panic!("docs/write-lock.md lacks step {name}"))
    };
    Steps {
        status: step("status"),
        acquire: step("acquire"),
        renew: step("renew"),
        release: step("release"),
        run: step("run"),
    }
}

/// One command of the block as bash: the launcher is `$SL`, placeholders
/// are variables, and the documented 900 s lease is `$TTL`.
fn to_bash(name: &str, cmd: &str) -> String {
    assert!(
        cmd.contains(LAUNCHER),
        "step {name} runs the launcher: {cmd}"
    );
    let mut bash = cmd.replace(LAUNCHER, "\"$SL\"");
    for (from, to) in [
        ("\"<note>\"", "\"$NOTE\""),
        ("<skill>", "\"$SKILL\""),
        ("<owner/repo>", "\"$REPO\""),
        ("<fence>", "\"$FENCE\""),
        ("<token>", "\"$TOKEN\""),
        ("<script>", "\"$SCRIPT\""),
        ("--ttl 900", "--ttl \"$TTL\""),
    ] {
        bash = bash.replace(from, to);
    }
    assert!(
        !bash.contains('<'),
        "step {name}: a placeholder left: {bash}"
    );
    bash
}

/// The skill: the block's steps and its prose, as a script. `REREAD=1` is
/// the block as written: read again unless step 1 said `free` and
/// `others_since` is `false`; `REREAD=0` removes the re-read step; and
/// `REREAD=old` is the rule the block had before (read again only when
/// `others_since` is `true` or step 1 said `held`). `PAUSE_AT=N` makes the
/// run wait before its Nth renew (touching `$PAUSE.at`) until `$PAUSE`
/// exists: a run frozen there, deterministically.
fn skill_script(steps: &Steps) -> String {
    format!(
        r#"set -u
field() {{ printf '%s\n' "$2" | sed -n "s/.*\"$1\":\"\{{0,1\}}\([^,}}\"]*\).*/\1/p"; }}
status_step() {{ {status}; }}
acquire_step() {{ {acquire} ${{WAIT:+--wait "$WAIT"}}; }}
renew_step() {{ {renew}; }}
release_step() {{ {release}; }}
out=$(status_step) || exit 2
state=$(field state "$out"); FENCE=$(field fence "$out")
echo "state $state"
case $FENCE in ''|null) FENCE=0 ;; esac
todo=$(curl -sf "$FORGE/todo") || exit 2
if [ -n "${{GATE:-}}" ]; then touch "$GATE.read"; while [ ! -e "$GATE" ]; do sleep 0.02; done; fi
sleep "$THINK"
rc=0; out=$(acquire_step) || rc=$?
case $rc in 0) ;; 3) exit 3 ;; *) exit 2 ;; esac
TOKEN=$(field token "$out")
case $out in *'"took_over":{{'*) echo took_over ;; esac
echo "acquired $(field fence "$out")"
others=$(field others_since "$out")
case $REREAD in
  1) if [ "$state" != free ] || [ "$others" != false ]; then reread=1; else reread=0; fi ;;
  old) if [ "$others" = true ] || [ "$state" = held ]; then reread=1; else reread=0; fi ;;
  *) reread=0 ;;
esac
if [ "$reread" = 1 ]; then
  todo=$(curl -sf "$FORGE/todo") || {{ release_step >/dev/null; exit 2; }}
fi
k=0
for n in $todo; do
  k=$((k + 1))
  if [ "$k" = "${{PAUSE_AT:-0}}" ]; then touch "$PAUSE.at"; while [ ! -e "$PAUSE" ]; do sleep 0.02; done; fi
  rc=0; renew_step >/dev/null || rc=$?
  case $rc in 0) ;; 4) release_step >/dev/null; exit 4 ;; *) release_step >/dev/null; exit 2 ;; esac
  curl -sf -X POST "$FORGE/comment/$n?run=$RUN" >/dev/null || {{ release_step >/dev/null; exit 2; }}
  sleep "$POST_GAP"
done
release_step >/dev/null
exit 0
"#,
        status = steps.status,
        acquire = steps.acquire,
        renew = steps.renew,
        release = steps.release,
    )
}

/// The exit status the block's `run` line gives for "held, not run".
const CONFLICT: i32 = 75;

/// The `run` form: the script reads under the lock, then posts.
fn run_form_script(steps: &Steps) -> String {
    format!(
        "set -u\nrc=0; {run} 2>/dev/null || rc=$?\nexit $rc\n",
        run = steps.run
    )
}

const POSTER: &str = r#"set -u
todo=$(curl -sf "$FORGE/todo") || exit 2
for n in $todo; do
  curl -sf -X POST "$FORGE/comment/$n?run=$RUN" >/dev/null || exit 2
  sleep "$POST_GAP"
done
exit "${POSTER_EXIT:-0}"
"#;

/// One comment the forge recorded.
#[derive(Debug, Clone)]
struct Post {
    issue: u32,
    run: u32,
    at: Instant,
}

/// A forge on loopback: issues appear over time (three at once, then one
/// every `every`), `GET /todo` lists those with no comment yet, `POST
/// /comment/N?run=R` records one.
struct Forge {
    port: u16,
    posts: Arc<Mutex<Vec<Post>>>,
}

impl Forge {
    fn start(every: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let posts = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let shared = posts.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let posts = shared.clone();
                std::thread::spawn(move || serve(conn, &posts, start, every));
            }
        });
        Self { port, posts }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn posts(&self) -> Vec<Post> {
        self.posts.lock().unwrap().clone()
    }
}

fn serve(mut conn: TcpStream, posts: &Mutex<Vec<Post>>, start: Instant, every: Duration) {
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut words = head.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let body = {
        let mut posts = posts.lock().unwrap();
        if method == "POST" {
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            let issue = path.trim_start_matches("/comment/").parse().unwrap_or(0);
            let run = query.trim_start_matches("run=").parse().unwrap_or(0);
            posts.push(Post {
                issue,
                run,
                at: Instant::now(),
            });
            String::new()
        } else {
            let open = 3 + u32::try_from(start.elapsed().as_millis() / every.as_millis()).unwrap();
            (1..=open)
                .filter(|i| !posts.iter().any(|p| p.issue == *i))
                .map(|i| format!("{i}\n"))
                .collect()
        }
    };
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A store the runs use: the default file store of the checkout, etcd, git.
struct Store {
    name: &'static str,
    vars: Vec<(&'static str, String)>,
    ttl: u64,
    _daemon: Option<harness::gitd::Daemon>,
}

fn stores(env: &TestEnv) -> Vec<Store> {
    let mut out = vec![Store {
        name: "file",
        vars: vec![],
        ttl: 2,
        _daemon: None,
    }];
    let remote = harness::gitd::bare_repo(&env.path("locks.git"));
    out.push(Store {
        name: "git",
        vars: vec![
            (
                "SKILL_LOCK_STORE",
                format!("git:file://{}", remote.display()),
            ),
            (
                "SKILL_LOCK_GIT_CACHE",
                env.path("git-cache").display().to_string(),
            ),
            ("SKILL_LOCK_CLOCK_SKEW", "0".into()),
        ],
        ttl: 3,
        _daemon: None,
    });
    if let Some(eps) = harness::etcd_endpoints("the write block on etcd") {
        out.push(Store {
            name: "etcd",
            vars: vec![(
                "SKILL_LOCK_STORE",
                format!("etcd://{eps}{}", harness::etcd_prefix(env, "write-block")),
            )],
            ttl: 2,
            _daemon: None,
        });
    }
    out
}

/// Everything one run is started with.
struct RunSpec<'a> {
    id: u32,
    script: &'a Path,
    store: &'a Store,
    forge: &'a Forge,
    think: Duration,
    post_gap: Duration,
    /// `REREAD` (see [`skill_script`]).
    reread: &'static str,
    wait: Option<u64>,
    gate: Option<PathBuf>,
    /// Further environment, set last (it may replace `TTL`).
    extra: Vec<(&'static str, String)>,
}

fn start_run(env: &TestEnv, repo: &Path, spec: &RunSpec) -> Child {
    let poster = env.path("poster.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(spec.script)
        .current_dir(repo)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .env("SL", harness::BIN)
        .env("SKILL", "issue-triage")
        .env("REPO", "apache/airflow")
        .env("NOTE", format!("write-block run {}", spec.id))
        .env("TTL", spec.store.ttl.to_string())
        .env("SCRIPT", format!("{}", poster.display()))
        .env("FORGE", spec.forge.url())
        .env("RUN", spec.id.to_string())
        .env("THINK", format!("{:.3}", spec.think.as_secs_f64()))
        .env("POST_GAP", format!("{:.3}", spec.post_gap.as_secs_f64()))
        .env("REREAD", spec.reread)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(w) = spec.wait {
        cmd.env("WAIT", w.to_string());
    }
    if let Some(g) = &spec.gate {
        cmd.env("GATE", g);
    }
    for (k, v) in &spec.store.vars {
        cmd.env(k, v);
    }
    for (k, v) in &spec.extra {
        cmd.env(k, v);
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn().unwrap()
}

fn signal_group(child: &Child, sig: i32) {
    // SAFETY: kill(2) on the run's own process group.
    unsafe { libc::kill(-(child.id() as i32), sig) };
}

/// Doubles: issues with more than one comment, split into those a kill or
/// freeze explains (a post by a run made after it was killed or resumed
/// from a freeze past its lease: in flight) and the rest.
fn doubles(posts: &[Post], faulted: &BTreeMap<u32, Instant>) -> (usize, usize) {
    let mut by_issue: BTreeMap<u32, Vec<&Post>> = BTreeMap::new();
    for p in posts {
        by_issue.entry(p.issue).or_default().push(p);
    }
    let (mut in_flight, mut unexplained) = (0, 0);
    for list in by_issue.values().filter(|l| l.len() > 1) {
        let explained = list
            .iter()
            .any(|p| faulted.get(&p.run).is_some_and(|t| p.at >= *t));
        if explained {
            in_flight += list.len() - 1;
        } else {
            unexplained += list.len() - 1;
        }
    }
    (in_flight, unexplained)
}

fn write_scripts(env: &TestEnv) -> (PathBuf, PathBuf) {
    let steps = steps();
    let block = env.path("skill.sh");
    std::fs::write(&block, skill_script(&steps)).unwrap();
    let run_form = env.path("skill-run.sh");
    std::fs::write(&run_form, run_form_script(&steps)).unwrap();
    // `run` starts CMD directly: the poster needs a shebang and the x bit.
    let poster = env.path("poster.sh");
    std::fs::write(&poster, format!("#!/bin/bash\n{POSTER}")).unwrap();
    std::fs::set_permissions(&poster, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (block, run_form)
}

/// The block as a skill author might have copied it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    /// Word for word.
    AsWritten,
    /// `--since <fence>` left out of step 2.
    NoSince,
    /// The `SKILL_LOCK_TOKEN=<token>` prefix left out of step 3's renew.
    RenewWithoutToken,
}

/// Writes the block's script (and the poster) with `variant`'s mistake.
fn variant_script(env: &TestEnv, variant: Variant) -> PathBuf {
    let (block, _) = write_scripts(env);
    let mut steps = steps();
    match variant {
        Variant::AsWritten => return block,
        Variant::NoSince => {
            assert!(
                steps.acquire.contains(" --since \"$FENCE\""),
                "{}",
                steps.acquire
            );
            steps.acquire = steps.acquire.replace(" --since \"$FENCE\"", "");
        }
        Variant::RenewWithoutToken => {
            assert!(
                steps.renew.starts_with("SKILL_LOCK_TOKEN=\"$TOKEN\" "),
                "{}",
                steps.renew
            );
            steps.renew = steps.renew.replace("SKILL_LOCK_TOKEN=\"$TOKEN\" ", "");
        }
    }
    let path = env.path(&format!("skill-{variant:?}.sh"));
    std::fs::write(&path, skill_script(&steps)).unwrap();
    path
}

/// Waits for `path` to exist (a run reached a gate).
#[track_caller]
fn until_exists(path: &Path) {
    let t = Instant::now();
    while !path.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for the forge to hold `n` posts by run `run`.
#[track_caller]
fn until_posted(forge: &Forge, run: u32, n: usize) {
    let t = Instant::now();
    while forge.posts().iter().filter(|p| p.run == run).count() < n {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "run {run} never posted {n}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One scripted ordering: its checkout, store, forge and scripts.
struct Scene {
    env: TestEnv,
    repo: PathBuf,
    store: Store,
    forge: Forge,
}

impl Scene {
    fn new(store: &Store) -> Self {
        let env = TestEnv::new();
        let repo = env.git_repo("repo");
        write_scripts(&env);
        Self {
            env,
            repo,
            store: Store {
                name: store.name,
                vars: store.vars.clone(),
                ttl: store.ttl,
                _daemon: None,
            },
            forge: Forge::start(Duration::from_secs(3600)),
        }
    }

    /// Starts run `id` of `script` with `reread`; `tweak` sets the rest.
    fn start(
        &self,
        id: u32,
        script: &Path,
        reread: &'static str,
        tweak: impl FnOnce(&mut RunSpec),
    ) -> Child {
        let mut spec = RunSpec {
            id,
            script,
            store: &self.store,
            forge: &self.forge,
            think: Duration::ZERO,
            post_gap: Duration::ZERO,
            reread,
            wait: None,
            gate: None,
            extra: Vec::new(),
        };
        tweak(&mut spec);
        start_run(&self.env, &self.repo, &spec)
    }

    /// Past the end of a lease of this store, well past it (CI is loaded).
    fn past_the_lease(&self) {
        std::thread::sleep(Duration::from_millis(self.store.ttl * 1000 + 2000));
    }

    fn doubles(&self) -> usize {
        doubles(&self.forge.posts(), &BTreeMap::new()).1
    }

    /// The lock's `state` as `status` says it now, in this scene's store.
    fn state(&self) -> String {
        let mut cmd = harness::Cmd::new(&self.repo).args([
            "status",
            "issue-triage",
            "--repo",
            "apache/airflow",
        ]);
        for (k, v) in &self.store.vars {
            cmd = cmd.env(k, v);
        }
        cmd.run().reply().state().to_owned()
    }

    /// Until a reader calls the paused holder's lease anything but `held`:
    /// past its end (file, git: deterministic), or on etcd the moment a
    /// reader first calls it `stale`, up to a second before its end (SPEC
    /// §8), while its holder may still renew.
    fn until_readers_call_it_stale(&self) {
        if self.store.name != "etcd" {
            self.past_the_lease();
            return;
        }
        let t = Instant::now();
        while self.state() == "held" {
            assert!(t.elapsed() < Duration::from_secs(60), "never stale");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// How one scripted ordering went.
struct Outcome {
    /// Comments posted twice.
    doubles: usize,
    /// The ordering happened as scripted: B's step 1 said `stale` and A's
    /// renew then revived the lease (A posted all three). Always on the
    /// file and git stores; on etcd only when B read in the second before
    /// the lease ended and A's renewal landed before it did.
    happened: bool,
}

/// Run A posts one issue, then stops before its next renew (frozen) past
/// its lease (on etcd: until a reader first calls it `stale`, the early
/// window of SPEC §8): B's step 1 says `stale`, B reads the two issues left. A
/// resumes: its renew revives the lease (`was_expired`, a new fence), it
/// posts both and releases. Then B acquires. With `wait`, B's acquire
/// comes while A is still posting, and waits for it.
fn revived_after_stale(store: &Store, reread: &'static str, wait: bool) -> Outcome {
    let scene = Scene::new(store);
    let block = scene.env.path("skill.sh");
    let pause = scene.env.path("pause-a");
    let gate = scene.env.path("gate-b");
    let mut a = scene.start(1, &block, reread, |s| {
        s.extra = vec![
            ("PAUSE_AT", "2".into()),
            ("PAUSE", pause.display().to_string()),
        ];
        if wait {
            s.post_gap = Duration::from_millis(1500);
        }
    });
    until_exists(&scene.env.path("pause-a.at"));
    scene.until_readers_call_it_stale();
    let b = scene.start(2, &block, reread, |s| {
        s.gate = Some(gate.clone());
        s.wait = wait.then_some(60);
    });
    until_exists(&scene.env.path("gate-b.read"));
    std::fs::write(&pause, "").unwrap();
    let a_code = if wait && store.name != "etcd" {
        // A revived its lease and is posting: B's acquire waits behind it.
        until_posted(&scene.forge, 1, 2);
        std::fs::write(&gate, "").unwrap();
        a.wait().unwrap().code()
    } else {
        let code = a.wait().unwrap().code();
        std::fs::write(&gate, "").unwrap();
        code
    };
    let b = b.wait_with_output().unwrap();
    assert_eq!(b.status.code(), Some(0), "B acquires after A");
    let b_read_stale = String::from_utf8_lossy(&b.stdout).contains("state stale");
    let a_posts = scene.forge.posts().iter().filter(|p| p.run == 1).count();
    let happened = b_read_stale && a_code == Some(0) && a_posts == 3;
    if store.name != "etcd" {
        assert!(
            happened,
            "{}: B read {}, A exited {a_code:?} after {a_posts} posts",
            store.name,
            String::from_utf8_lossy(&b.stdout)
        );
    }
    Outcome {
        doubles: scene.doubles(),
        happened,
    }
}

/// Runs `revived_after_stale` until the ordering happened (at most 6
/// times: on etcd it hangs on a second), asserting 0 doubles with the
/// block on every try; the doubles of the last try, and whether the
/// ordering happened at all.
fn revived_tries(store: &Store, reread: &'static str, wait: bool) -> Outcome {
    for _ in 0..6 {
        let o = revived_after_stale(store, reread, wait);
        if reread == "1" {
            assert_eq!(o.doubles, 0, "{}: the block doubled a post", store.name);
        }
        if o.happened {
            return o;
        }
    }
    Outcome {
        doubles: 0,
        happened: false,
    }
}

/// SPEC §2.2: a lease revived after a reader called it `stale` takes a new
/// fence, and the block reads again unless `status` said `free`: the run
/// that read while it was stale posts nothing twice. Without the re-read
/// step it posts both issues again (today's main with the old rule did
/// too: `others_since` was `false` and `status` had said `stale`).
#[test]
fn stale_then_revived_then_released_never_doubles() {
    let env = TestEnv::new();
    for store in stores(&env) {
        let with = revived_tries(&store, "1", false);
        let old = revived_tries(&store, "old", false);
        let without = revived_tries(&store, "0", false);
        println!(
            "stale, revived, released on {}: {} doubles with the block, {} with the old \
             re-read rule (a new fence makes others_since true), {} without re-reading \
             (ordering happened: {}, {}, {})",
            store.name,
            with.doubles,
            old.doubles,
            without.doubles,
            with.happened,
            old.happened,
            without.happened
        );
        assert_eq!(with.doubles, 0, "{}: the block doubled a post", store.name);
        if old.happened {
            assert_eq!(
                old.doubles, 0,
                "{}: the revival took no new fence",
                store.name
            );
        }
        if without.happened {
            assert_eq!(without.doubles, 2, "{}: B did not post", store.name);
        }
    }
}

/// `--wait` behind a holder that revives its lease after B read the lock
/// as `stale`: B waits for it, then reads again and posts nothing twice.
#[test]
fn waiting_behind_a_holder_that_revives_never_doubles() {
    let env = TestEnv::new();
    for store in stores(&env) {
        let with = revived_tries(&store, "1", true);
        let without = revived_tries(&store, "0", true);
        println!(
            "--wait behind a revived holder on {}: {} doubles with the block, {} without \
             re-reading (ordering happened: {}, {})",
            store.name, with.doubles, without.doubles, with.happened, without.happened
        );
        assert_eq!(with.doubles, 0, "{}: the block doubled a post", store.name);
        if without.happened {
            assert_eq!(without.doubles, 2, "{}: B did not post", store.name);
        }
    }
}

/// `--since` forgotten: `others_since` is `null`, which the block reads as
/// "unknown: read again". The old rule (read again only when it is `true`
/// or `status` said `held`) posts all three again.
#[test]
fn since_forgotten_reads_again_and_never_doubles() {
    let env = TestEnv::new();
    for store in stores(&env) {
        let with = scripted_interleaving(&store, "1", Variant::NoSince);
        let old = scripted_interleaving(&store, "old", Variant::NoSince);
        println!(
            "--since forgotten on {}: {with} doubles with the block, {old} with the old rule",
            store.name
        );
        assert_eq!(with, 0, "{}: the block doubled a post", store.name);
        assert_eq!(old, 3, "{}: the ordering did not happen", store.name);
    }
}

/// A run whose renew lost its `SKILL_LOCK_TOKEN=` prefix acquires, freezes
/// past its lease, and another run takes the lock over and posts. Resumed,
/// its tokenless renew is refused (exit 2, SPEC §2.2): it posts nothing
/// under the other run's lease (it used to renew it, exit 0, and post).
#[test]
fn a_renew_without_the_token_is_refused_and_never_doubles() {
    let env = TestEnv::new();
    for store in stores(&env) {
        let scene = Scene::new(&store);
        let careless = variant_script(&scene.env, Variant::RenewWithoutToken);
        let block = scene.env.path("skill.sh");
        let pause = scene.env.path("pause-b");
        let mut b = scene.start(2, &careless, "1", |s| {
            s.extra = vec![
                ("PAUSE_AT", "1".into()),
                ("PAUSE", pause.display().to_string()),
            ];
        });
        until_exists(&scene.env.path("pause-b.at"));
        scene.past_the_lease();
        let mut a = scene.start(1, &block, "1", |s| {
            s.post_gap = Duration::from_millis(700);
        });
        until_posted(&scene.forge, 1, 1);
        std::fs::write(&pause, "").unwrap();
        assert_eq!(b.wait().unwrap().code(), Some(2), "{}: refused", store.name);
        assert_eq!(a.wait().unwrap().code(), Some(0), "{}", store.name);
        let posts = scene.forge.posts();
        assert!(
            posts.iter().all(|p| p.run == 1),
            "{}: the tokenless run posted",
            store.name
        );
        assert_eq!(scene.doubles(), 0, "{}", store.name);
    }
}

/// The `run` line of the block: a script that exits 3 itself is told from
/// "held, not run" (`--conflict-exit-code`), so a skill that retries only
/// when the lock was held never runs a finished script again.
#[test]
fn a_script_exiting_3_under_run_is_told_from_held() {
    let env = TestEnv::new();
    for store in stores(&env) {
        let scene = Scene::new(&store);
        let run_form = scene.env.path("skill-run.sh");
        let block = scene.env.path("skill.sh");
        // Held by a run of the block (a long lease): not run, exit 75.
        let pause = scene.env.path("pause-a");
        let mut a = scene.start(1, &block, "1", |s| {
            s.extra = vec![
                ("PAUSE_AT", "1".into()),
                ("PAUSE", pause.display().to_string()),
                ("TTL", "120".into()),
            ];
        });
        until_exists(&scene.env.path("pause-a.at"));
        let held = scene.start(2, &run_form, "1", |_| {});
        let code = held.wait_with_output().unwrap().status.code();
        assert_eq!(code, Some(CONFLICT), "{}: held, not run", store.name);
        std::fs::write(&pause, "").unwrap();
        assert_eq!(a.wait().unwrap().code(), Some(0), "{}", store.name);
        // A script that exits 3 itself: its own status, not "held".
        let mut r = scene.start(3, &run_form, "1", |s| {
            s.extra = vec![("POSTER_EXIT", "3".into())];
        });
        let code = r.wait().unwrap().code();
        assert_eq!(code, Some(3), "{}: the script's own status", store.name);
        assert_eq!(
            scene.forge.posts().iter().filter(|p| p.run == 1).count(),
            3,
            "{}",
            store.name
        );
        assert_eq!(scene.doubles(), 0, "{}", store.name);
    }
}

/// A reads, B reads, A acquires, posts and releases, then B acquires: B
/// must read again (its `others_since` is true) and post nothing. Without
/// the re-read step, B posts everything A posted.
fn scripted_interleaving(store: &Store, reread: &'static str, variant: Variant) -> usize {
    scripted_interleaving_in(store, reread, Some(variant)).unwrap_or(0)
}

/// [`scripted_interleaving`], the runs in the shell form with `variant`'s
/// mistake, or (`None`) in the MCP form; `None` when the MCP client is
/// missing (SKIPPED).
fn scripted_interleaving_in(
    store: &Store,
    reread: &'static str,
    variant: Option<Variant>,
) -> Option<usize> {
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let store = Store {
        name: store.name,
        vars: store.vars.clone(),
        ttl: store.ttl,
        _daemon: None,
    };
    let script = match variant {
        Some(variant) => variant_script(&env, variant),
        None => write_mcp_script(&env)?,
    };
    let forge = Forge::start(Duration::from_secs(3600));
    let spec = |id, gate: &str| RunSpec {
        id,
        script: &script,
        store: &store,
        forge: &forge,
        think: Duration::ZERO,
        post_gap: Duration::ZERO,
        reread,
        wait: None,
        gate: Some(env.path(gate)),
        extra: Vec::new(),
    };
    let mut a = start_run(&env, &repo, &spec(1, "gate-a"));
    let mut b = start_run(&env, &repo, &spec(2, "gate-b"));
    for g in ["gate-a.read", "gate-b.read"] {
        let t = Instant::now();
        while !env.path(g).exists() {
            assert!(t.elapsed() < Duration::from_secs(20), "{g} never read");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    std::fs::write(env.path("gate-a"), "").unwrap();
    assert_eq!(a.wait().unwrap().code(), Some(0), "A posts and releases");
    std::fs::write(env.path("gate-b"), "").unwrap();
    assert_eq!(b.wait().unwrap().code(), Some(0), "B acquires after A");
    let posts = forge.posts();
    assert_eq!(
        posts.iter().filter(|p| p.run == 1).count(),
        3,
        "{}: A posts the three open issues",
        store.name
    );
    Some(doubles(&posts, &BTreeMap::new()).1)
}

#[test]
fn a_run_that_read_before_another_posted_reads_again_and_posts_nothing() {
    let env = TestEnv::new();
    for store in stores(&env) {
        let with = scripted_interleaving(&store, "1", Variant::AsWritten);
        let without = scripted_interleaving(&store, "0", Variant::AsWritten);
        println!(
            "scripted interleaving on {}: {with} doubles with the block's re-read step, {without} without it",
            store.name
        );
        assert_eq!(with, 0, "{}: the block doubled a post", store.name);
        assert_eq!(
            without, 3,
            "{}: without the re-read step every post doubles",
            store.name
        );
    }
}

/// Many overlapping runs of the block, the `--wait` and `run` forms mixed
/// in, some SIGKILLed, some frozen past their lease: no comment posted
/// twice but those in flight at a kill or freeze.
#[test]
fn overlapping_runs_killed_and_frozen_never_post_twice() {
    let env = TestEnv::new();
    for store in stores(&env) {
        campaign(&store, 24);
    }
}

/// What happens to one run of the campaign.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Kill(Duration),
    Freeze(Duration),
}

fn campaign(store: &Store, runs: u32) {
    let env = TestEnv::new();
    campaign_in(&env, store, runs, None);
}

/// The campaign; with `mcp`, seven runs in ten follow the MCP form (that
/// script), the rest the shell block and `run`, all on one lock.
fn campaign_in(env: &TestEnv, store: &Store, runs: u32, mcp: Option<&Path>) {
    let repo = env.git_repo("repo");
    let (block, run_form) = write_scripts(env);
    let forge = Forge::start(Duration::from_millis(400));
    let seed = Seed::from_env("write-block campaign", "WRITE_BLOCK_SEED");
    let mut rng = seed.rng(u64::from(runs) ^ store.ttl);
    // When each run starts, what happens to it, and how it is started.
    let plan: Vec<(Duration, Fault, RunSpec)> = (1..=runs)
        .map(|id| {
            let form = rng.below(100);
            let fault = match rng.below(100) {
                0..=19 => Fault::Kill(Duration::from_millis(100 + rng.below(1500))),
                20..=39 => Fault::Freeze(Duration::from_millis(100 + rng.below(1200))),
                _ => Fault::None,
            };
            let spec = RunSpec {
                id,
                script: match mcp {
                    Some(mcp) if form >= 30 => mcp,
                    _ if form < 15 => &run_form,
                    _ => &block,
                },
                store,
                forge: &forge,
                think: Duration::from_millis(rng.below(400)),
                post_gap: Duration::from_millis(100 + rng.below(300)),
                reread: "1",
                wait: (15..30).contains(&form).then_some(4),
                gate: None,
                extra: Vec::new(),
            };
            (Duration::from_millis(rng.below(8000)), fault, spec)
        })
        .collect();
    let started = Instant::now();
    let mut live: Vec<Option<(Child, Instant)>> = plan.iter().map(|_| None).collect();
    let mut faults: Vec<Fault> = plan.iter().map(|p| p.1).collect();
    // Runs killed or frozen, and since when: what they post from then on
    // may have been in flight.
    let mut faulted: BTreeMap<u32, Instant> = BTreeMap::new();
    let mut frozen: Vec<(usize, Instant)> = Vec::new();
    loop {
        let now = Instant::now();
        // A Python client per MCP run: more to start on a loaded machine.
        let deadline = Duration::from_secs(if mcp.is_some() { 300 } else { 60 });
        assert!(
            now < started + deadline,
            "{}: the campaign did not end",
            store.name
        );
        let mut pending = !frozen.is_empty();
        for (i, (at, _, spec)) in plan.iter().enumerate() {
            let Some((child, since)) = &mut live[i] else {
                if now >= started + *at {
                    live[i] = Some((start_run(env, &repo, spec), now));
                }
                pending = true;
                continue;
            };
            match faults[i] {
                Fault::Kill(after) if now >= *since + after => {
                    signal_group(child, libc::SIGKILL);
                    signal_server(env, spec.id, libc::SIGKILL);
                    faulted.insert(spec.id, now);
                    faults[i] = Fault::None;
                }
                Fault::Freeze(after) if now >= *since + after => {
                    signal_group(child, libc::SIGSTOP);
                    signal_server(env, spec.id, libc::SIGSTOP);
                    faulted.insert(spec.id, now);
                    let lease = Duration::from_millis(store.ttl * 1000 + 1500);
                    frozen.push((i, now + lease));
                    faults[i] = Fault::None;
                }
                _ => {}
            }
            if child.try_wait().unwrap().is_none() {
                pending = true;
            }
        }
        frozen.retain(|(i, until)| {
            if now < *until {
                return true;
            }
            if let Some((child, _)) = &live[*i] {
                signal_group(child, libc::SIGCONT);
                signal_server(env, plan[*i].2.id, libc::SIGCONT);
            }
            false
        });
        if !pending {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let (mut acquisitions, mut takeovers) = (0, 0);
    for (child, _) in live.into_iter().flatten() {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        acquisitions += text.matches("acquired").count();
        takeovers += text.matches("took_over").count();
    }
    // A `run` form's CMD outlives a SIGKILL of the wrapper's group (SPEC
    // §2.7): let it finish before counting.
    std::thread::sleep(Duration::from_millis(store.ttl * 1000));
    let posts = forge.posts();
    let (in_flight, unexplained) = doubles(&posts, &faulted);
    println!(
        "write block on {}: {runs} runs ({} killed or frozen), {acquisitions} acquisitions \
         (block form), {takeovers} takeovers, {} posts, {unexplained} doubled, {in_flight} \
         doubled in flight at a kill or freeze",
        store.name,
        faulted.len(),
        posts.len()
    );
    assert!(posts.len() >= 5, "{}: the runs posted", store.name);
    assert_eq!(unexplained, 0, "{}: a comment was posted twice", store.name);
}

// ===== The MCP form (issue 36): the same orderings, the sessions speaking
// MCP (tests/integration/mcp_skill.py, one `skill-lock mcp` per run). =====

/// A bash script that runs one MCP-form session (mcp_skill.py), for
/// [`start_run`]; `None` (SKIPPED) when the Python client is missing.
fn write_mcp_script(env: &TestEnv) -> Option<PathBuf> {
    let python = harness::mcp::venv_python()?;
    let skill = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/mcp_skill.py");
    let script = env.path("skill-mcp.sh");
    let pids = env.dir("server-pids");
    std::fs::write(
        &script,
        format!(
            "export SERVER_PID_FILE='{}'/\"$RUN\"\nexec '{}' '{}'\n",
            pids.display(),
            python.display(),
            skill.display()
        ),
    )
    .unwrap();
    Some(script)
}

/// Sends `sig` to the MCP server of run `id`, once it holds the lock (the
/// Python client runs its server in a session of its own).
fn signal_server(env: &TestEnv, id: u32, sig: i32) {
    let file = env.path("server-pids").join(id.to_string());
    if let Some(pid) = std::fs::read_to_string(file)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    {
        // SAFETY: kill(2) with a valid signal number.
        unsafe { libc::kill(pid, sig) };
    }
}

#[cfg(feature = "mcp")]
#[test]
fn mcp_a_session_that_read_before_another_posted_reads_again_and_posts_nothing() {
    let env = TestEnv::new();
    let file = stores(&env).remove(0);
    let Some(with) = scripted_interleaving_in(&file, "1", None) else {
        return;
    };
    let without = scripted_interleaving_in(&file, "0", None).unwrap_or(0);
    println!(
        "scripted interleaving, MCP form, file store: {with} doubles with the read-again rule, \
         {without} without it"
    );
    assert_eq!(with, 0, "the MCP form doubled a post");
    assert_eq!(without, 3, "without the read-again rule every post doubles");
}

/// The campaign with seven runs in ten speaking MCP (their servers killed
/// and frozen with them), the shell block and `run` on the same lock.
#[cfg(feature = "mcp")]
#[test]
fn mcp_overlapping_sessions_killed_and_frozen_never_post_twice() {
    let env = TestEnv::new();
    let Some(mcp) = write_mcp_script(&env) else {
        return;
    };
    // A Python client per run: a longer lease than the shell form's, so a
    // loaded machine does not lose leases between a renew and its post.
    let file = Store {
        ttl: 4,
        ..stores(&env).remove(0)
    };
    campaign_in(&env, &file, 16, Some(&mcp));
}
