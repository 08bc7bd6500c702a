//! The MCP side of the harness: the Python `mcp` client's environment and
//! its scenarios (tests/integration/mcp_client.py), a server spoken to in
//! raw JSON-RPC lines with every line it wrote kept, and the plugin's
//! `mcpServers` entry, each read into plain fields for `mcp.rs`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::{BIN, Cmd, TestEnv, Value};

/// Generous: the machine running the suite may be loaded.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// The Python of the `mcp` environment (`scripts/mcp-venv`): at
/// `SKILL_LOCK_MCP_VENV`, else target/mcp-venv of this checkout. `None`
/// (after printing SKIPPED) when there is none and CI is not `true`; under
/// CI=true a missing environment fails the test.
pub fn venv_python() -> Option<PathBuf> {
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

/// Runs one scenario of mcp_client.py against a fresh checkout; it asserts
/// itself and prints `ok NAME` last.
pub fn scenario(name: &str) {
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

/// What a raw `acquire` answered, and the record's hash of its token.
#[derive(Debug)]
pub struct RawAcquired {
    /// `result`.
    pub result: String,
    /// `owner_pid`.
    pub owner_pid: Option<u64>,
    /// `token_sha256` of the record it wrote.
    pub token_sha256: String,
}

/// A server spoken to in raw JSON-RPC lines, every line it wrote kept.
pub struct Raw {
    child: Child,
    lines: mpsc::Receiver<String>,
    wire: Vec<String>,
    next_id: u64,
}

impl Raw {
    /// Starts `skill-lock mcp` in `cwd` and initializes the session.
    pub fn start(cwd: &Path) -> Self {
        let mut child = Cmd::new(cwd)
            .arg("mcp")
            .into_command()
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

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
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

    /// Acquires triage on apache/airflow under `root` for an hour.
    pub fn acquire(&mut self, root: &Path) -> RawAcquired {
        let answer = self.request(
            "tools/call",
            serde_json::json!({"name": "acquire", "arguments": {
                "skill": "triage", "repo": "apache/airflow", "root": root, "ttl": 3600,
            }}),
        );
        let acquired = &answer["result"]["structuredContent"];
        let lock = PathBuf::from(acquired["lock"].as_str().unwrap_or_default());
        let record: Value = std::fs::read(lock.join("owner.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        RawAcquired {
            result: acquired["result"].as_str().unwrap_or_default().to_owned(),
            owner_pid: acquired["owner_pid"].as_u64(),
            token_sha256: record["token_sha256"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        }
    }

    /// Closes the server's input (the harness ending the session).
    pub fn close_input(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Waits for the process to end; whether it exited 0.
    pub fn wait_exit(&mut self) -> bool {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            assert!(Instant::now() < deadline, "the server never ended");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// No line the server wrote holds a `"token"` field, or the token
    /// itself (a 32-hex string whose SHA-256 is `token_sha256`).
    pub fn assert_no_token(&self, token_sha256: &str) {
        assert_eq!(token_sha256.len(), 64, "no token hash to look for");
        for line in &self.wire {
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
}

/// `state` of `skill-lock status triage --repo apache/airflow` in `root`.
pub fn status_state(root: &Path) -> String {
    let out = Cmd::new(root)
        .args(["status", "triage", "--repo", "apache/airflow"])
        .run();
    out.json["state"].as_str().unwrap_or_default().to_owned()
}

/// The `skill-lock` entry of packaging/plugin/.mcp.json.
#[derive(Debug)]
pub struct PluginEntry {
    /// `command`.
    pub command: String,
    /// `args`.
    pub args: Vec<String>,
    /// `env.SKILL_LOCK_LAUNCHER`.
    pub launcher: String,
    /// The whole file, as JSON text.
    pub text: String,
}

/// Reads packaging/plugin/.mcp.json.
pub fn plugin_entry() -> PluginEntry {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/plugin/.mcp.json");
    let entry: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let server = &entry["mcpServers"]["skill-lock"];
    let text_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    PluginEntry {
        command: text_of(&server["command"]),
        args: server["args"]
            .as_array()
            .map(|a| a.iter().map(text_of).collect())
            .unwrap_or_default(),
        launcher: text_of(&server["env"]["SKILL_LOCK_LAUNCHER"]),
        text: entry.to_string(),
    }
}
