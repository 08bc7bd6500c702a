//! A lock's chain of commits: the state file each commit holds, reading a
//! ref into what the engine is shown, and making the next commit.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cmd::{Output, jitter, transient};
use super::memo;
use super::objects::{Found, STATE_FILE, read_found, read_one};
use super::remote::Remote;
use crate::error::{Error, Result};
use crate::history::Event;
use crate::key::LockKey;
use crate::record::{OwnerRecord, Timestamp, random_suffix};
use crate::store::{Current, Identity, LeaseEnd, Seen};

/// The layout version of the state file.
pub(super) const STATE_FORMAT: u32 = 1;

/// The change a commit makes, as its message names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CommitKind {
    /// A new acquisition (create or takeover).
    Acquired,
    /// A renewal.
    Renewed,
    /// A release.
    Released,
    /// No change, recorded: a refusal of a held lock.
    Refused,
}

impl CommitKind {
    /// As the commit message says it.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Renewed => "renewed",
            Self::Released => "released",
            Self::Refused => "refused",
        }
    }
}

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
    /// The owner record, as written (parsed once, by [`OwnerRecord::parse`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) record: Option<Box<serde_json::value::RawValue>>,
}

/// A lock's ref as read.
#[derive(Debug, Clone)]
pub(super) struct RefState {
    /// The commit the ref points at (None: no ref).
    pub(super) oid: Option<String>,
    /// The state, as stored, and how it is judged (see [`seen`]).
    pub(super) current: Current,
    /// The last fence, when it is known.
    pub(super) fence: Option<u64>,
    /// Commits in the chain up to `oid`.
    pub(super) depth: u64,
    /// The chain's number (roll-overs before it).
    pub(super) epoch: u64,
    /// `oid` is a readable commit a new state may name as its parent.
    pub(super) chainable: bool,
    /// Its state is unreadable but its commit sane: its last fence may be
    /// read from its ancestors ([`with_fence`]).
    pub(super) recover: bool,
}

impl RefState {
    /// No ref: a free lock that was never taken.
    pub(super) fn absent() -> Self {
        Self {
            oid: None,
            current: Current::Free,
            fence: Some(0),
            depth: 0,
            epoch: 0,
            chainable: false,
            recover: false,
        }
    }
}

/// What a commit holds, as the engine is shown it. `None`: its objects
/// are not all in the cache (yet); never judged corrupt for that.
pub(super) fn interpret(remote: &Remote, oid: &str, found: Found) -> Option<RefState> {
    match found {
        Found::Missing => None,
        Found::Bad { why, sane } => Some(RefState {
            oid: Some(oid.to_owned()),
            current: Current::Corrupt(why),
            fence: None,
            depth: 0,
            epoch: 0,
            chainable: false,
            recover: sane,
        }),
        Found::State(body) => Some(interpret_state(remote, oid, &body)),
    }
}

/// Interprets a state file.
pub(super) fn interpret_state(remote: &Remote, oid: &str, body: &[u8]) -> RefState {
    let corrupt = |why: String, fence: Option<u64>, depth: u64| RefState {
        oid: Some(oid.to_owned()),
        current: Current::Corrupt(why),
        fence,
        depth,
        epoch: 0,
        chainable: fence.is_some(),
        recover: fence.is_none(),
    };
    let state: StateFile = match serde_json::from_slice(body) {
        Ok(s) => s,
        Err(e) => return corrupt(format!("unreadable {STATE_FILE}: {e}"), None, 0),
    };
    if state.format != STATE_FORMAT {
        return corrupt(
            format!("unknown state format {}", state.format),
            Some(state.fence),
            state.depth,
        );
    }
    let current = match (state.state.as_str(), &state.record) {
        ("free", _) => Current::Free,
        ("held", Some(rec)) => match OwnerRecord::parse(rec.get().as_bytes()) {
            Ok(mut r) => {
                r.holder.fence = state.fence;
                Current::Held(seen(remote, r))
            }
            Err(why) => Current::Corrupt(why),
        },
        (other, _) => Current::Corrupt(format!("unknown lock state {other:?}")),
    };
    RefState {
        oid: Some(oid.to_owned()),
        current,
        fence: Some(state.fence),
        depth: state.depth,
        epoch: state.epoch,
        chainable: true,
        recover: false,
    }
}

/// `seen`, with the last fence of an unreadable state taken from its
/// history (read only when a change needs it: never by a reader).
pub(super) fn with_fence(remote: &Remote, mut seen: RefState) -> Result<RefState> {
    if seen.fence.is_none()
        && seen.recover
        && let Some(oid) = &seen.oid
    {
        seen.fence = recover_fence(remote, oid)?;
        seen.chainable = seen.fence.is_some();
    }
    Ok(seen)
}

/// The newest fence readable in the ancestors of an unreadable state.
pub(super) fn recover_fence(remote: &Remote, oid: &str) -> Result<Option<u64>> {
    let out = remote.local_capped(&["rev-list", "--max-count=200", oid], None, 200 * 70)?;
    if !out.ok() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let oids: Vec<String> = text
        .lines()
        .filter(|l| super::remote::is_oid(l))
        .map(str::to_owned)
        .collect();
    let mut best: Option<u64> = None;
    read_found(remote, &oids, &mut |_, found| {
        if let Found::State(b) = found
            && let Ok(s) = serde_json::from_slice::<StateFile>(&b)
        {
            best = best.max(Some(s.fence));
        }
        Ok(())
    })?;
    Ok(best)
}

/// Reads one lock for a change: one `git fetch` that lists the ref and
/// brings its commit when it is new here (a read that finds the lock
/// changed costs one connection, not two), then the state as
/// [`read_seen`] reads it. With a git older than 2.41, as
/// `read_seen`.
pub(super) fn read_fetching(remote: &Remote, key: &LockKey, deadline: Instant) -> Result<RefState> {
    if remote.no_porcelain.get().is_some() {
        return read_seen(remote, key, deadline);
    }
    let r = remote.lock_ref(key);
    let oid = match remote.fetch_tip(&r, deadline) {
        Ok(Some(oid)) => oid,
        Ok(None) => return Ok(RefState::absent()),
        Err(Some(e)) => return Err(e),
        Err(None) => {
            let _ = remote.no_porcelain.set(());
            return read_seen(remote, key, deadline);
        }
    };
    if let Some((memo, body)) = memo::memo(remote, &r)
        && memo == oid
    {
        return Ok(interpret_state(remote, &oid, &body));
    }
    let found = read_one(remote, &oid)?;
    if let Found::State(body) = &found {
        memo::remember(remote, &r, Some((&oid, body)));
    }
    match interpret(remote, &oid, found) {
        Some(seen) => Ok(seen),
        // Its objects are not all here (yet): read it the long way.
        None => read_seen(remote, key, deadline),
    }
}

/// Reads one lock: one ls-remote; the state this host last wrote or
/// read when the ref still names it; otherwise a bounded read of the
/// cache, after a fetch when the commit is new here.
pub(super) fn read_seen(remote: &Remote, key: &LockKey, deadline: Instant) -> Result<RefState> {
    let r = remote.lock_ref(key);
    loop {
        let refs = remote.ls_remote(std::slice::from_ref(&r), &r, deadline)?;
        let Some(oid) = refs.get(&r).cloned() else {
            return Ok(RefState::absent());
        };
        if let Some((memo, body)) = memo::memo(remote, &r)
            && memo == oid
        {
            return Ok(interpret_state(remote, &oid, &body));
        }
        let mut found = read_one(remote, &oid)?;
        if matches!(found, Found::Missing) {
            let failed = remote.fetch(std::slice::from_ref(&r), deadline)?;
            found = read_one(remote, &oid)?;
            if matches!(found, Found::Missing) {
                match failed {
                    Some(why) if transient(&why) => {
                        std::thread::sleep(jitter(Duration::from_millis(50)));
                    }
                    Some(why) if !why.contains("couldn't find remote ref") => {
                        return Err(remote.unavailable(&format!("git fetch failed: {why}")));
                    }
                    _ => {}
                }
                // The ref moved between the two calls.
                if Instant::now() >= deadline {
                    return Err(remote.unavailable(&format!(
                            "the lock ref kept moving, or the objects of {oid} never arrived in the cache {}",
                            remote.config.cache.display()
                        )));
                }
                continue;
            }
        }
        if let Found::State(body) = &found {
            memo::remember(remote, &r, Some((&oid, body)));
        }
        if let Some(seen) = interpret(remote, &oid, found) {
            return Ok(seen);
        }
    }
}

/// How a record is judged: by this host's wall clock, its lease ending
/// [`super::GitConfig::clock_skew`] seconds after `expires` (hosts' clocks
/// differ), unless it was written in this boot with a boot-clock
/// deadline (then judged on that clock, as in the file store).
///
/// An owner recorded in another boot (another machine, or this one
/// before a reboot) is foreign: on a store shared by machines a hostname
/// proves nothing, so such a lock is judged by its lease alone and a pid
/// of another machine is never looked up here.
pub(super) fn seen(remote: &Remote, record: OwnerRecord) -> Seen {
    let lease_end = if same_boot(&record) {
        LeaseEnd::Recorded
    } else {
        let skew = i64::try_from(remote.config.clock_skew).unwrap_or(0);
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

/// Writes the blob, tree and commit of a new state with git (a cache
/// whose objects are not named by SHA-1).
pub(super) fn make_commit_by_git(
    remote: &Remote,
    body: &[u8],
    parent: Option<&str>,
    message: &str,
) -> Result<String> {
    let blob = remote.local(&["hash-object", "-w", "--stdin"], Some(body))?;
    let blob = oid_of(remote, &blob, "hash-object")?;
    let tree_in = format!("100644 blob {blob}\t{STATE_FILE}\n");
    let tree = remote.local(&["mktree"], Some(tree_in.as_bytes()))?;
    let tree = oid_of(remote, &tree, "mktree")?;
    let mut args = vec!["commit-tree", tree.as_str()];
    if let Some(p) = parent {
        args.extend(["-p", p]);
    }
    args.extend(["-F", "-"]);
    let commit = remote.local(&args, Some(message.as_bytes()))?;
    oid_of(remote, &commit, "commit-tree")
}

pub(super) fn oid_of(remote: &Remote, out: &Output, what: &str) -> Result<String> {
    let oid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.ok() && oid.len() >= 40 && oid.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(oid)
    } else {
        Err(remote.cache_error(&format!("git {what} failed: {}", out.stderr.trim())))
    }
}

/// Is `ancestor` our commit, at the tip or under it?
pub(super) fn contains(remote: &Remote, tip: &str, ancestor: &str) -> Result<bool> {
    if tip == ancestor {
        return Ok(true);
    }
    Ok(remote
        .local(&["merge-base", "--is-ancestor", ancestor, tip], None)?
        .ok())
}

pub(super) fn message(
    key: &LockKey,
    change: CommitKind,
    fence: u64,
    events: &[Event],
) -> Result<String> {
    let change = change.as_str();
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
