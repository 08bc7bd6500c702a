//! `skill-lock mcp` (SPEC §2.9), driven by a client no one here wrote: the
//! Python `mcp` package's stdio client (tests/integration/mcp_client.py,
//! in the virtual environment `scripts/mcp-venv` makes, which `.ci/run`
//! calls), plus the raw protocol for the end of a session (input closed,
//! SIGTERM) and the bytes on the wire.
//!
//! The Python tests skip, saying SKIPPED, only when the environment is
//! missing and CI is not set; under CI=true a missing environment fails.
//!
//! Covers: SPEC §2.9, §2.1, §2.2, §2.3, §2.6, §6, §9.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::harness::{BIN, TestEnv, Value};

/// Generous: the machine running the suite may be loaded.
const PATIENCE: Duration = Duration::from_secs(120);

/// The Python of the `mcp` environment, or why there is none.
fn venv_python() -> Option<PathBuf> {
    let dir = std::env::var_os("SKILL_LOCK_MCP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcp-venv"));
    let python = dir.join("bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import mcp.client.stdio"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(python);
    }
    let why = format!(
        "no Python environment with the mcp package at {} (make it with scripts/mcp-venv)",
        dir.display()
    );
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true and {why}"
    );
    println!("SKIPPED: {why}");
    None
}

/// Runs one scenario of mcp_client.py against a fresh checkout.
fn scenario(name: &str) {
    let Some(python) = venv_python() else { return };
    let env = TestEnv::new();
    let root = env.git_repo("checkout");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/mcp_client.py");
    let mut cmd = Command::new(python);
    cmd.arg(script)
        .arg(name)
        .current_dir(&root)
        .env_clear()
        .env("SKILL_LOCK_BIN", BIN)
        .env("SKILL_LOCK_TEST_ROOT", &root)
        .env("HOME", env.dir("home"));
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    let out = cmd.output().expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("ok {name}")),
        "scenario {name} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    print!("{stdout}");
}

#[test]
fn mcp_lists_the_five_tools_with_their_schemas_and_rules() {
    scenario("tools");
}

#[test]
fn mcp_acquires_checks_renews_and_releases_the_lock_the_shell_sees() {
    scenario("cycle");
}

#[test]
fn mcp_two_servers_contend_for_one_lock() {
    scenario("contend");
}

#[test]
fn mcp_one_runs_fence_never_acts_on_another_runs_acquisition() {
    scenario("same_session");
}

#[test]
fn mcp_a_killed_servers_lock_is_taken_over_as_owner_dead() {
    scenario("killed");
}

#[test]
fn mcp_bad_arguments_get_the_commands_errors() {
    scenario("bad_arguments");
}

/// A server spoken to in raw JSON-RPC lines, every line it wrote kept.
struct Raw {
    child: Child,
    lines: mpsc::Receiver<String>,
    wire: Vec<String>,
    next_id: u64,
}

impl Raw {
    fn start(cwd: &Path) -> Self {
        let mut child = Command::new(BIN)
            .arg("mcp")
            .current_dir(cwd)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the server starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut raw = Self {
            child,
            lines,
            wire: Vec::new(),
            next_id: 0,
        };
        let init = raw.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            }),
        );
        assert!(
            init["result"]["capabilities"]["tools"].is_object(),
            "{init}"
        );
        raw.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        raw
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.child.stdin.as_mut().expect("input open");
        writeln!(stdin, "{message}").expect("the server reads");
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        loop {
            let line = self
                .lines
                .recv_timeout(PATIENCE)
                .expect("the server answers");
            self.wire.push(line.clone());
            let message: Value = serde_json::from_str(&line).expect("one JSON-RPC message a line");
            if message["id"] == id {
                return message;
            }
        }
    }

    /// Calls a tool; its structured content.
    fn call(&mut self, tool: &str, args: Value) -> Value {
        let answer = self.request(
            "tools/call",
            serde_json::json!({"name": tool, "arguments": args}),
        );
        answer["result"]["structuredContent"].clone()
    }

    /// Waits for the process to end; whether it exited 0.
    fn wait_exit(&mut self) -> bool {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            assert!(Instant::now() < deadline, "the server never ended");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn status_state(env: &TestEnv, root: &Path) -> Value {
    let out = env
        .cmd(root)
        .args(["status", "triage", "--repo", "apache/airflow"])
        .run();
    out.json["state"].clone()
}

/// No line the server wrote holds a `"token"` field, or the token itself
/// (a 32-hex string whose SHA-256 is the record's `token_sha256`).
fn assert_no_token(wire: &[String], token_sha256: &str) {
    for line in wire {
        assert!(
            !line.contains("\"token\""),
            "a token field on the wire: {line}"
        );
        let bytes = line.as_bytes();
        for start in 0..bytes.len().saturating_sub(31) {
            let candidate = &bytes[start..start + 32];
            if candidate.iter().all(u8::is_ascii_hexdigit) {
                let hash: String = Sha256::digest(candidate)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                assert_ne!(hash, token_sha256, "the token on the wire: {line}");
            }
        }
    }
}

fn acquire_raw(raw: &mut Raw, root: &Path) -> (Value, String) {
    let acquired = raw.call(
        "acquire",
        serde_json::json!({"skill": "triage", "repo": "apache/airflow", "root": root, "ttl": 3600}),
    );
    assert_eq!(acquired["result"], "acquired", "{acquired}");
    let lock = PathBuf::from(acquired["lock"].as_str().unwrap());
    let record: Value =
        serde_json::from_slice(&std::fs::read(lock.join("owner.json")).unwrap()).unwrap();
    let hash = record["token_sha256"].as_str().unwrap().to_owned();
    (acquired, hash)
}

#[test]
fn mcp_a_server_whose_input_closes_releases_at_once() {
    let env = TestEnv::new();
    let root = env.git_repo("checkout");
    let mut raw = Raw::start(&root);
    let (acquired, hash) = acquire_raw(&mut raw, &root);
    assert_eq!(
        acquired["owner_pid"].as_u64(),
        Some(u64::from(raw.child.id()))
    );
    assert_eq!(status_state(&env, &root), "held");
    drop(raw.child.stdin.take());
    assert!(
        raw.wait_exit(),
        "the server exits 0 at the end of its input"
    );
    // Released, not left to its hour-long lease.
    assert_eq!(status_state(&env, &root), "free");
    assert_no_token(&raw.wire, &hash);
}

#[test]
fn mcp_a_server_ended_by_sigterm_releases_first() {
    let env = TestEnv::new();
    let root = env.git_repo("checkout");
    let mut raw = Raw::start(&root);
    let (_, hash) = acquire_raw(&mut raw, &root);
    let pid = i32::try_from(raw.child.id()).unwrap();
    // SAFETY: kill(2) on our own child, with a valid signal number.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert!(raw.wait_exit(), "the server exits 0 on SIGTERM");
    assert_eq!(status_state(&env, &root), "free");
    assert_no_token(&raw.wire, &hash);
}

/// The `mcpServers` entry a plugin ships starts `skill-lock mcp` through
/// uvx from the plugin's own directory, with no shell: no `~`, no `$HOME`,
/// nothing a shell would have to expand but `${CLAUDE_PLUGIN_ROOT}`.
#[test]
fn mcp_the_plugins_server_entry_needs_no_shell() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/plugin/.mcp.json");
    let entry: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let server = &entry["mcpServers"]["skill-lock"];
    assert_eq!(server["command"], "uvx", "{server}");
    let args: Vec<&str> = server["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        ["--from", "${CLAUDE_PLUGIN_ROOT}/skill-lock", "skill-lock", "mcp"]
    );
    let text = entry.to_string();
    assert!(!text.contains('~') && !text.contains("$HOME"), "{text}");
    assert_eq!(
        server["env"]["SKILL_LOCK_LAUNCHER"],
        "uvx --from ${CLAUDE_PLUGIN_ROOT}/skill-lock skill-lock"
    );
}
