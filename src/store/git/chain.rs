//! A lock's chain of commits: the state file each commit holds, reading a
//! ref into what the engine is shown, and making the next commit.

#![allow(clippy::wildcard_imports)]
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::*;
use crate::error::{Error, Result};
use crate::history::Event;
use crate::key::LockKey;
use crate::record::{OwnerRecord, Timestamp, random_suffix};
use crate::store::{Current, Identity, LeaseEnd, Seen};

/// The file a lock's commit holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StateFile {
    pub(super) format: u32,
    pub(super) state: String,
    pub(super) fence: u64,
    pub(super) depth: u64,
    /// Roll-overs so far: the chain's number, for ordering archived chains.
    #[serde(default)]
    pub(super) epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) record: Option<serde_json::Value>,
}

/// A lock's ref as read.
#[derive(Debug, Clone)]
pub(super) struct RefState {
    /// The commit the ref points at (None: no ref).
    pub(super) oid: Option<String>,
    /// The state, as stored, and how it is judged (see [`GitStore::seen`]).
    pub(super) current: Current,
    /// The last fence, when it is known.
    pub(super) fence: Option<u64>,
    /// Commits in the chain up to `oid`.
    pub(super) depth: u64,
    /// The chain's number (roll-overs before it).
    pub(super) epoch: u64,
    /// `oid` is a readable commit a new state may name as its parent.
    pub(super) chainable: bool,
}

impl GitStore {
    /// Reads `lock.json` of each commit (None: no such commit or file here).
    pub(super) fn read_states(&self, oids: &[&str]) -> Result<Vec<Option<Vec<u8>>>> {
        if oids.is_empty() {
            return Ok(Vec::new());
        }
        let mut input = String::new();
        for oid in oids {
            let _ = writeln!(input, "{oid}:{STATE_FILE}");
        }
        let out = self.local(&["cat-file", "--batch"], Some(input.as_bytes()))?;
        if !out.ok() {
            return Err(self.cache_error(&format!("git cat-file failed: {}", out.stderr.trim())));
        }
        let mut res = Vec::with_capacity(oids.len());
        let mut rest: &[u8] = &out.stdout;
        for _ in oids {
            let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
                res.push(None);
                continue;
            };
            let header = String::from_utf8_lossy(&rest[..nl]).into_owned();
            rest = &rest[nl + 1..];
            let parts: Vec<&str> = header.split(' ').collect();
            if parts.len() == 3
                && let Ok(size) = parts[2].parse::<usize>()
                && rest.len() > size
            {
                let body = rest[..size].to_vec();
                rest = &rest[size + 1..];
                res.push((parts[1] == "blob").then_some(body));
            } else {
                res.push(None);
            }
        }
        Ok(res)
    }

    pub(super) fn is_commit(&self, oid: &str) -> Result<bool> {
        Ok(self
            .local(&["cat-file", "-e", &format!("{oid}^{{commit}}")], None)?
            .ok())
    }

    /// Interprets a state file.
    /// `None`: the commit's objects are not all in the cache (yet); never
    /// judged corrupt for that.
    pub(super) fn interpret(&self, oid: &str, body: Option<Vec<u8>>) -> Result<Option<RefState>> {
        let corrupt = |why: String, fence: Option<u64>, depth: u64| {
            Some(RefState {
                oid: Some(oid.to_owned()),
                current: Current::Corrupt(why),
                fence,
                depth,
                epoch: 0,
                chainable: fence.is_some(),
            })
        };
        let Some(body) = body else {
            if !self.is_commit(oid)? {
                return Ok(None);
            }
            // The state file is absent only if the tree is readable and lacks it.
            let tree = self.local(&["ls-tree", "--name-only", oid], None)?;
            let listed = String::from_utf8_lossy(&tree.stdout)
                .lines()
                .any(|l| l == STATE_FILE);
            if !tree.ok() || listed {
                return Ok(None);
            }
            let fence = self.recover_fence(oid)?;
            return Ok(corrupt(
                format!("the lock ref's commit {oid} holds no {STATE_FILE}"),
                fence,
                0,
            ));
        };
        let state: StateFile = match serde_json::from_slice(&body) {
            Ok(s) => s,
            Err(e) => {
                let fence = self.recover_fence(oid)?;
                return Ok(corrupt(format!("unreadable {STATE_FILE}: {e}"), fence, 0));
            }
        };
        if state.format != STATE_FORMAT {
            return Ok(corrupt(
                format!("unknown state format {}", state.format),
                Some(state.fence),
                state.depth,
            ));
        }
        let current = match (state.state.as_str(), &state.record) {
            ("free", _) => Current::Free,
            ("held", Some(rec)) => {
                let bytes = serde_json::to_vec(rec).unwrap_or_default();
                match OwnerRecord::parse(&bytes) {
                    Ok(mut r) => {
                        r.holder.fence = state.fence;
                        Current::Held(self.seen(r))
                    }
                    Err(why) => Current::Corrupt(why),
                }
            }
            (other, _) => Current::Corrupt(format!("unknown lock state {other:?}")),
        };
        Ok(Some(RefState {
            oid: Some(oid.to_owned()),
            current,
            fence: Some(state.fence),
            depth: state.depth,
            epoch: state.epoch,
            chainable: true,
        }))
    }

    /// The newest fence readable in the ancestors of an unreadable state.
    pub(super) fn recover_fence(&self, oid: &str) -> Result<Option<u64>> {
        let out = self.local(&["rev-list", "--max-count=200", oid], None)?;
        if !out.ok() {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let oids: Vec<&str> = text.lines().collect();
        let bodies = self.read_states(&oids)?;
        Ok(bodies
            .into_iter()
            .flatten()
            .filter_map(|b| serde_json::from_slice::<StateFile>(&b).ok())
            .map(|s| s.fence)
            .max())
    }

    /// Reads one lock: one ls-remote, and a fetch only when the commit is new here.
    pub(super) fn read_seen(&self, key: &LockKey, deadline: Instant) -> Result<RefState> {
        self.read_seen_ref(&self.lock_ref(key), deadline)
    }

    /// [`Self::read_seen`] of the lock ref `r`.
    pub(super) fn read_seen_ref(&self, r: &str, deadline: Instant) -> Result<RefState> {
        let r = r.to_owned();
        let mut fetched = false;
        loop {
            let refs = self.ls_remote(std::slice::from_ref(&r), &r, deadline)?;
            let Some(oid) = refs.get(&r).cloned() else {
                return Ok(RefState {
                    oid: None,
                    current: Current::Free,
                    fence: Some(0),
                    depth: 0,
                    epoch: 0,
                    chainable: false,
                });
            };
            let mut body = self.read_states(&[oid.as_str()])?.pop().flatten();
            if body.is_none() && !self.is_commit(&oid)? {
                let failed = self.fetch(&[(r.clone(), oid.clone())], deadline)?;
                fetched = true;
                if !self.is_commit(&oid)? {
                    match failed {
                        Some(why) if transient(&why) => {
                            std::thread::sleep(jitter(Duration::from_millis(50)));
                        }
                        Some(why) if !why.contains("couldn't find remote ref") => {
                            return Err(self.unavailable(&format!("git fetch failed: {why}")));
                        }
                        _ => {}
                    }
                    // The ref moved between the two calls, or points at no commit.
                    if Instant::now() >= deadline {
                        return Err(
                            self.unavailable("the lock ref kept moving or points at no commit")
                        );
                    }
                    // Its type, read once (another process's fetch may have
                    // brought the commit since the check above).
                    let kind = self.local(&["cat-file", "-t", &oid], None)?;
                    let kind = String::from_utf8_lossy(&kind.stdout).trim().to_owned();
                    if !kind.is_empty() && kind != "commit" {
                        return Ok(RefState {
                            oid: Some(oid.clone()),
                            current: Current::Corrupt(format!(
                                "the lock ref points at {oid}, which is not a commit"
                            )),
                            fence: None,
                            depth: 0,
                            epoch: 0,
                            chainable: false,
                        });
                    }
                    if kind != "commit" {
                        continue;
                    }
                }
                body = self.read_states(&[oid.as_str()])?.pop().flatten();
            }
            if let Some(seen) = self.interpret(&oid, body)? {
                return Ok(seen);
            }
            // The commit is here but not all of its objects: another process
            // may still be writing them, or a killed fetch left them out.
            if Instant::now() >= deadline {
                return Err(self.unavailable(&format!(
                    "the objects of {oid} stay incomplete in the cache {}",
                    self.config.cache.display()
                )));
            }
            if fetched {
                std::thread::sleep(Duration::from_millis(20));
            } else {
                let _ = self.fetch(&[(r.clone(), oid.clone())], deadline)?;
            }
            fetched = !fetched;
        }
    }

    /// How a record is judged: by this host's wall clock, its lease ending
    /// [`GitConfig::clock_skew`] seconds after `expires` (hosts' clocks
    /// differ), unless it was written in this boot with a boot-clock
    /// deadline (then judged on that clock, as in the file store).
    ///
    /// An owner recorded in another boot (another machine, or this one
    /// before a reboot) is foreign: on a store shared by machines a hostname
    /// proves nothing, so such a lock is judged by its lease alone and a pid
    /// of another machine is never looked up here.
    pub(super) fn seen(&self, record: OwnerRecord) -> Seen {
        let lease_end = if same_boot(&record) {
            LeaseEnd::Recorded
        } else {
            let skew = i64::try_from(self.config.clock_skew).unwrap_or(0);
            LeaseEnd::Wall(Timestamp(record.holder.expires.0.saturating_add(skew)))
        };
        let ours = &crate::liveness::Origin::here().boot_id;
        let identity = if record.holder.boot_id.is_none() || record.holder.boot_id != *ours {
            Identity::Foreign
        } else {
            Identity::Comparable
        };
        Seen {
            record,
            lease_end,
            identity,
        }
    }

    /// Writes the blob, tree and commit of a new state.
    pub(super) fn make_commit(
        &self,
        state: &StateFile,
        parent: Option<&str>,
        message: &str,
    ) -> Result<String> {
        let body = serde_json::to_vec(state).map_err(|e| Error::Internal(e.to_string()))?;
        let blob = self.local(&["hash-object", "-w", "--stdin"], Some(&body))?;
        let blob = self.oid_of(&blob, "hash-object")?;
        let tree_in = format!("100644 blob {blob}\t{STATE_FILE}\n");
        let tree = self.local(&["mktree"], Some(tree_in.as_bytes()))?;
        let tree = self.oid_of(&tree, "mktree")?;
        let mut args = vec!["commit-tree", tree.as_str()];
        if let Some(p) = parent {
            args.extend(["-p", p]);
        }
        args.extend(["-F", "-"]);
        let commit = self.local(&args, Some(message.as_bytes()))?;
        self.oid_of(&commit, "commit-tree")
    }

    pub(super) fn oid_of(&self, out: &Output, what: &str) -> Result<String> {
        let oid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.ok() && oid.len() >= 40 && oid.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(oid)
        } else {
            Err(self.cache_error(&format!("git {what} failed: {}", out.stderr.trim())))
        }
    }

    /// Is `ancestor` our commit, at the tip or under it?
    pub(super) fn contains(&self, tip: &str, ancestor: &str) -> Result<bool> {
        if tip == ancestor {
            return Ok(true);
        }
        Ok(self
            .local(&["merge-base", "--is-ancestor", ancestor, tip], None)?
            .ok())
    }
}

pub(super) fn message(key: &LockKey, change: &str, fence: u64, events: &[Event]) -> Result<String> {
    let mut m = format!("skill-lock: {change} {} (fence {fence})\n\n", key.name());
    for ev in events {
        let line = serde_json::to_string(ev).map_err(|e| Error::Internal(e.to_string()))?;
        m.push_str(&line);
        m.push('\n');
    }
    // Two identical changes must never make the same commit.
    let _ = write!(m, "\nnonce: {}\n", random_suffix());
    Ok(m)
}

/// Was `rec` written in this boot, with a boot-clock deadline (judged on
/// that clock, so no clock-skew allowance applies)?
fn same_boot(rec: &OwnerRecord) -> bool {
    let ours = &crate::liveness::Origin::here().boot_id;
    rec.holder.deadline_boot_ms.is_some() && ours.is_some() && rec.holder.boot_id == *ours
}
