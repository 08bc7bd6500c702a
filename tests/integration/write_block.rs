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
//! when `others_since` is true or `status` said `held`, renew before each
//! post, release with the token. The skill posts to a fake forge on
//! loopback that records every comment. The same orderings run once more
//! with the sessions speaking MCP (the block's "MCP form", one `skill-lock
//! mcp` per session, killed and frozen with it), mixed with shell runs.
//!
//! Covers: SPEC §1, §2.1, §2.4, §2.7, §2.9.

use crate::common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestEnv;
use common::chaos::Seed;

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

/// The skill: the block's steps and its prose, as a script. `REREAD=0`
/// removes the one step that reads again after acquiring.
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
case $FENCE in ''|null) FENCE=0 ;; esac
todo=$(curl -sf "$FORGE/todo") || exit 2
if [ -n "${{GATE:-}}" ]; then touch "$GATE.read"; while [ ! -e "$GATE" ]; do sleep 0.02; done; fi
sleep "$THINK"
rc=0; out=$(acquire_step) || rc=$?
case $rc in 0) ;; 3) exit 3 ;; *) exit 2 ;; esac
TOKEN=$(field token "$out")
case $out in *'"took_over":{{'*) echo took_over ;; esac
echo "acquired $(field fence "$out")"
if [ "$REREAD" = 1 ] && {{ [ "$(field others_since "$out")" = true ] || [ "$state" = held ]; }}; then
  todo=$(curl -sf "$FORGE/todo") || {{ release_step >/dev/null; exit 2; }}
fi
for n in $todo; do
  renew_step >/dev/null || {{ release_step >/dev/null; exit 4; }}
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

/// The `run` form: the script reads under the lock, then posts.
fn run_form_script(steps: &Steps) -> String {
    format!(
        "set -u\nrc=0; {run} 2>/dev/null || rc=$?\n[ $rc = 3 ] && exit 3\nexit $rc\n",
        run = steps.run
    )
}

const POSTER: &str = r#"set -u
todo=$(curl -sf "$FORGE/todo") || exit 2
for n in $todo; do
  curl -sf -X POST "$FORGE/comment/$n?run=$RUN" >/dev/null || exit 2
  sleep "$POST_GAP"
done
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
    _daemon: Option<common::gitd::Daemon>,
}

fn stores(env: &TestEnv) -> Vec<Store> {
    let mut out = vec![Store {
        name: "file",
        vars: vec![],
        ttl: 2,
        _daemon: None,
    }];
    let remote = common::gitd::bare_repo(&env.path("locks.git"));
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
    if let Some(eps) = common::etcd_endpoints("the write block on etcd") {
        out.push(Store {
            name: "etcd",
            vars: vec![(
                "SKILL_LOCK_STORE",
                format!("etcd://{eps}{}", common::etcd_prefix(env, "write-block")),
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
    reread: bool,
    wait: Option<u64>,
    gate: Option<PathBuf>,
}

fn start_run(env: &TestEnv, repo: &Path, spec: &RunSpec) -> Child {
    let poster = env.path("poster.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(spec.script)
        .current_dir(repo)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .env("SL", common::BIN)
        .env("SKILL", "issue-triage")
        .env("REPO", "apache/airflow")
        .env("NOTE", format!("write-block run {}", spec.id))
        .env("TTL", spec.store.ttl.to_string())
        .env("SCRIPT", format!("{}", poster.display()))
        .env("FORGE", spec.forge.url())
        .env("RUN", spec.id.to_string())
        .env("THINK", format!("{:.3}", spec.think.as_secs_f64()))
        .env("POST_GAP", format!("{:.3}", spec.post_gap.as_secs_f64()))
        .env("REREAD", if spec.reread { "1" } else { "0" })
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

/// A reads, B reads, A acquires, posts and releases, then B acquires: B
/// must read again (its `others_since` is true) and post nothing. Without
/// the re-read step, B posts everything A posted.
fn scripted_interleaving(store: &Store, reread: bool) -> usize {
    scripted_interleaving_in(store, reread, false).unwrap_or(0)
}

/// [`scripted_interleaving`], the runs in the shell form or (`mcp`) in the
/// MCP form; `None` when the MCP client is missing (SKIPPED).
fn scripted_interleaving_in(store: &Store, reread: bool, mcp: bool) -> Option<usize> {
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let store = Store {
        name: store.name,
        vars: store.vars.clone(),
        ttl: store.ttl,
        _daemon: None,
    };
    let (block, _) = write_scripts(&env);
    let script = if mcp { write_mcp_script(&env)? } else { block };
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
        let with = scripted_interleaving(&store, true);
        let without = scripted_interleaving(&store, false);
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
                reread: true,
                wait: (15..30).contains(&form).then_some(4),
                gate: None,
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
    let python = common::mcp::venv_python()?;
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
    let Some(with) = scripted_interleaving_in(&file, true, true) else {
        return;
    };
    let without = scripted_interleaving_in(&file, false, true).unwrap_or(0);
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
