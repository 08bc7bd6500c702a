//! A 3-member etcd cluster on loopback whose members can be killed,
//! stopped and restarted; ports in 33000-33999, each test in a hundred of
//! its own (the first block of it that nothing holds now).

use super::client::signal;
use std::net::TcpListener;
use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

/// The first `base` of `hundred, hundred + 20, ...` (below `hundred + 100`)
/// where every `base + offset` can be listened on now.
pub fn free_block(hundred: u16, offsets: &[u16]) -> u16 {
    (hundred..hundred + 100)
        .step_by(20)
        .find(|base| {
            offsets
                .iter()
                .all(|o| TcpListener::bind(("127.0.0.1", base + o)).is_ok())
        })
        .unwrap_or_else(|| panic!("no free block of ports in {hundred}..{}", hundred + 100))
}

/// Are `etcd` and `etcdctl` installed? (Skipped visibly without them,
/// unless `SKILL_LOCK_TEST_ETCD_REQUIRED` makes that a failure.)
pub fn have_etcd(test: &str) -> bool {
    crate::harness::have_programs(test, &[("etcd", "--version"), ("etcdctl", "version")])
}

/// How fast an etcd test cluster notices a lost leader.
#[derive(Clone, Copy)]
pub struct Tuning {
    /// `--heartbeat-interval`, milliseconds.
    pub heartbeat_ms: u32,
    /// `--election-timeout`, milliseconds.
    pub election_ms: u32,
}

/// Member `i` of an etcd cluster on loopback whose members listen for
/// clients on `clients[k]` (a URL, `http://` or `https://`) and for peers
/// on `127.0.0.1:peers[k]`, named `n0`, `n1`, ... with data under `dir`.
/// The caller adds what else it needs (TLS files) and spawns it.
pub fn member(dir: &Path, i: usize, clients: &[String], peers: &[u16], t: Tuning) -> Command {
    let initial = peers
        .iter()
        .enumerate()
        .map(|(k, p)| format!("n{k}=http://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let peer = format!("http://127.0.0.1:{}", peers[i]);
    let mut cmd = Command::new("etcd");
    cmd.args(["--name", &format!("n{i}")])
        .arg("--data-dir")
        .arg(dir.join(format!("n{i}")))
        .args(["--listen-client-urls", &clients[i]])
        .args(["--advertise-client-urls", &clients[i]])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &initial])
        .args(["--initial-cluster-state", "new"])
        .args(["--initial-cluster-token", &format!("t{}", peers[0])])
        .args(["--heartbeat-interval", &t.heartbeat_ms.to_string()])
        .args(["--election-timeout", &t.election_ms.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// A 3-member etcd cluster on loopback: clients on `base+1..=base+3`,
/// peers on `base+11..=base+13`; a member may be killed (`None` until
/// restarted), stopped and continued. Every member is stopped when dropped.
pub struct Cluster {
    dir: PathBuf,
    base: u16,
    tuning: Tuning,
    members: Mutex<Vec<Option<Child>>>,
    /// Member ids, as `endpoint status` names them.
    ids: Vec<u64>,
}

impl Cluster {
    /// Starts the members, data under `dir`, on the first free block of
    /// `hundred..hundred + 100`, and waits (30 s at most) until each
    /// answers and they elected a leader.
    pub fn start(dir: &Path, hundred: u16, tuning: Tuning) -> Self {
        let mut c = Self {
            dir: dir.to_owned(),
            base: free_block(hundred, &[1, 2, 3, 11, 12, 13]),
            tuning,
            members: Mutex::new(Vec::new()),
            ids: Vec::new(),
        };
        *c.members.lock().unwrap() = (0..3).map(|i| Some(c.spawn(i))).collect();
        let start = Instant::now();
        loop {
            if c.ids.len() < 3 {
                let ids: Vec<Option<u64>> = (0..3).map(|i| c.status(i).map(|s| s.0)).collect();
                if ids.iter().all(Option::is_some) {
                    c.ids = ids.into_iter().flatten().collect();
                }
            }
            if c.ids.len() == 3 && c.leader().is_some() {
                return c;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the 3-member cluster did not elect a leader in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn spawn(&self, i: usize) -> Child {
        let clients: Vec<String> = (0..3)
            .map(|k| format!("http://127.0.0.1:{}", self.client_port(k)))
            .collect();
        let peers: Vec<u16> = (0..3).map(|k| self.base + 11 + k as u16).collect();
        member(&self.dir, i, &clients, &peers, self.tuning)
            .spawn()
            .expect("etcd starts")
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.base + 1 + i as u16
    }

    /// `etcd://` every member, under `/prefix/`.
    pub fn url(&self, prefix: &str) -> String {
        let eps: Vec<String> = (0..3)
            .map(|i| format!("127.0.0.1:{}", self.client_port(i)))
            .collect();
        format!("etcd://{}/{prefix}/", eps.join(","))
    }

    /// (member id, leader id) from member `i` itself.
    fn status(&self, i: usize) -> Option<(u64, u64)> {
        let out = Command::new("etcdctl")
            .args(["--endpoints", &format!("127.0.0.1:{}", self.client_port(i))])
            .args(["--dial-timeout", "1s", "--command-timeout", "1s"])
            .args(["endpoint", "status", "-w", "json"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let s = &v.as_array()?.first()?["Status"];
        Some((s["header"]["member_id"].as_u64()?, s["leader"].as_u64()?))
    }

    /// Index of the leader, as the first running member that knows one sees it.
    pub fn leader(&self) -> Option<usize> {
        (0..3).find_map(|i| {
            let (_, leader) = self.status(i).filter(|s| s.1 != 0)?;
            self.ids.iter().position(|&id| id == leader)
        })
    }

    /// Member `i`'s pid, unless it is killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.lock().unwrap()[i].as_ref().map(Child::id)
    }

    /// Sends `sig` to member `i` (SIGSTOP, SIGCONT...), unless it is killed.
    pub fn signal(&self, i: usize, sig: i32) {
        if let Some(pid) = self.pid(i) {
            signal(pid, sig);
        }
    }

    /// SIGKILLs member `i`.
    pub fn kill(&self, i: usize) {
        if let Some(mut c) = self.members.lock().unwrap()[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data, if it was killed.
    pub fn restart(&self, i: usize) {
        let mut m = self.members.lock().unwrap();
        if m[i].is_none() {
            m[i] = Some(self.spawn(i));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut m = self
            .members
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for c in m.iter_mut().flatten() {
            signal(c.id(), libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
