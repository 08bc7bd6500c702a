//! Git remotes for the git store's tests: a bare repository reached as
//! `file://`, and a `git daemon` on loopback (ports 24400-24499), stopped
//! (its whole process group) when dropped.

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// Next port to try, per test binary: `base` is 24400 or 24450.
static NEXT: AtomicU16 = AtomicU16::new(0);

/// A free loopback port in `base..base + 50`.
pub fn free_port(base: u16) -> u16 {
    for _ in 0..50 {
        let p = base + NEXT.fetch_add(1, Ordering::SeqCst) % 50;
        if TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port in {base}..{}", base + 50);
}

/// `git init --bare DIR`.
pub fn bare_repo(dir: &Path) -> PathBuf {
    let st = Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(Stdio::null())
        .status()
        .expect("git runs");
    assert!(st.success());
    dir.to_path_buf()
}

/// A `git daemon` serving every repository under a directory, push enabled.
pub struct Daemon {
    child: Child,
    pub port: u16,
}

impl Daemon {
    /// Starts it on a free port of `base..base + 50` and waits until it accepts.
    pub fn start(base_path: &Path, base: u16) -> Self {
        Self::start_with(base_path, base, &[])
    }

    /// As [`Daemon::start`], with more `git daemon` options.
    pub fn start_with(base_path: &Path, base: u16, extra: &[&str]) -> Self {
        for _ in 0..5 {
            let port = free_port(base);
            let child = Command::new("git")
                .args([
                    "daemon",
                    "--enable=receive-pack",
                    "--export-all",
                    "--reuseaddr",
                    "--informative-errors",
                    "--listen=127.0.0.1",
                ])
                .arg(format!("--port={port}"))
                .args(extra)
                .arg(format!("--base-path={}", base_path.display()))
                .arg(base_path)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("HOME", base_path)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("git daemon starts");
            let mut d = Self { child, port };
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                if let Ok(Some(_)) = d.child.try_wait() {
                    break; // port taken meanwhile: try another
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return d;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            d.stop();
        }
        panic!("git daemon did not start");
    }

    /// `git://127.0.0.1:PORT/NAME`.
    pub fn url(&self, name: &str) -> String {
        format!("git://127.0.0.1:{}/{name}", self.port)
    }

    fn stop(&mut self) {
        // SAFETY: signals only the process group this test started.
        unsafe {
            libc::killpg(self.child.id() as i32, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
