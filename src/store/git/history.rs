//! `history`: the events of one lock's chains or of every lock's, all
//! walked in one git process (see `walk.rs`).

use std::collections::HashMap;
use std::time::Instant;

use super::chain::StateFile;
use super::cmd;
use super::config::{ARCHIVE_PREFIX, REF_PREFIX};
use super::objects;
use super::remote::Remote;
use super::walk;
use crate::error::Result;
use crate::history::Event;
use crate::key::{LockKey, is_digest_stem};

/// Is `name` (after the lock ref prefix) what a lock's ref is named?
fn is_lock_stem(name: &str) -> bool {
    LockKey::from_name(name).is_some_and(|k| k.ref_stem() == name) || is_digest_stem(name)
}

/// The newest `limit` events of `key`'s chains, or of every lock's, oldest
/// first: one `ls-remote`, a fetch of what the cache lacks, the archived
/// epochs in one `cat-file` pair, and every chain walked in one process.
pub(super) fn history(remote: &Remote, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
    let deadline = Instant::now() + remote.config.timeout;
    let lock_prefix = remote.ns_prefix(REF_PREFIX);
    let arch_prefix = remote.ns_prefix(ARCHIVE_PREFIX);
    let patterns = match key {
        Some(k) => vec![
            remote.lock_ref(k),
            format!("{arch_prefix}{}/*", k.ref_stem()),
        ],
        None => vec![format!("{lock_prefix}*"), format!("{arch_prefix}*")],
    };
    let refs = remote.ls_remote(&patterns, "refs/", deadline)?;
    // Chains by lock name: the archived ones and the live one.
    let mut chains: std::collections::BTreeMap<String, (Vec<String>, Option<String>)> =
        std::collections::BTreeMap::new();
    for (r, oid) in &refs {
        if let Some(name) = r.strip_prefix(&lock_prefix) {
            if is_lock_stem(name) {
                chains.entry(name.to_owned()).or_default().1 = Some(oid.clone());
            }
        } else if let Some((name, slot)) = r
            .strip_prefix(&arch_prefix)
            .and_then(|rest| rest.rsplit_once('/'))
            && is_lock_stem(name)
            && slot.bytes().all(|b| b.is_ascii_digit())
        {
            chains
                .entry(name.to_owned())
                .or_default()
                .0
                .push(oid.clone());
        }
    }
    let wanted: Vec<(String, String)> = refs
        .iter()
        .filter(|(r, _)| r.starts_with(&lock_prefix) || r.starts_with(&arch_prefix))
        .map(|(r, o)| (r.clone(), o.clone()))
        .collect();
    objects::fetch_plans(remote, &wanted, &patterns, deadline)?;
    // Oldest chain first: by the epoch in each archived tip's state,
    // read for every lock at once.
    let archived_all: Vec<String> = chains
        .values()
        .flat_map(|(a, _)| a.iter().cloned())
        .collect();
    let mut epochs: HashMap<String, u64> = HashMap::new();
    objects::read_found(remote, &archived_all, &mut |i, found| {
        let e = match found {
            objects::Found::State(b) => serde_json::from_slice::<StateFile>(&b)
                .ok()
                .map_or(0, |s| s.epoch),
            _ => 0,
        };
        epochs.insert(archived_all[i].clone(), e);
        Ok(())
    })?;
    // Each lock's chains, the live one first, then the archived ones
    // newest first; all walked in one git process.
    let heads: Vec<Vec<String>> = chains
        .into_values()
        .map(|(mut archived, tip)| {
            archived.sort_by_key(|o| epochs.get(o).copied().unwrap_or(0));
            tip.into_iter().chain(archived.into_iter().rev()).collect()
        })
        .collect();
    let mut walks: Vec<walk::Walk> = heads
        .iter()
        .map(|h| walk::Walk::new(h.clone(), limit))
        .collect();
    walk::walk_all(remote, &mut walks)?;
    let mut all = Vec::new();
    for (w, heads) in walks.into_iter().zip(&heads) {
        let mut events = match w.into_events() {
            Some(events) => events,
            // A chain with a merge (not made by this tool): `git log`.
            None => events_by_log(remote, heads, limit)?,
        };
        all.append(&mut events);
    }
    // Locks interleave by time; each lock's own order is kept.
    all.sort_by_key(|e| e.time);
    let skip = all.len().saturating_sub(limit);
    Ok(all.split_off(skip))
}

/// The newest `limit` events of one lock's chains (`heads`: the live
/// one first, then the archived ones newest first), oldest first, one
/// `git log` a chain.
fn events_by_log(remote: &Remote, heads: &[String], limit: usize) -> Result<Vec<Event>> {
    let mut events = Vec::new();
    for oid in heads {
        if events.len() >= limit {
            break;
        }
        let mut older = events_of(remote, oid, limit - events.len())?;
        older.append(&mut events);
        events = older;
    }
    Ok(events)
}

/// The newest `limit` events in the chain ending at `tip`, oldest first.
fn events_of(remote: &Remote, tip: &str, limit: usize) -> Result<Vec<Event>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    // Each commit holds one to three events: read enough commits (git
    // takes a count up to i32::MAX; a chain is never longer).
    let n = format!(
        "--max-count={}",
        limit.min(usize::try_from(i32::MAX).unwrap_or(usize::MAX))
    );
    // Streamed, one commit message at a time; one larger than any
    // change writes is skipped unread (SPEC §8: read bounded).
    let mut commits: Vec<Vec<Event>> = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    let mut skip = false;
    let max = usize::try_from(objects::MAX_OBJECT).unwrap_or(usize::MAX);
    let mut end_commit = |cur: &mut Vec<u8>, skip: &mut bool| {
        if !*skip && !cur.is_empty() {
            commits.push(walk::events_in(cur));
        }
        cur.clear();
        *skip = false;
    };
    let out = remote.local_streaming(&["log", &n, "--format=%x1e%B", tip], None, &mut |chunk| {
        for (i, piece) in chunk.split(|b| *b == 0x1e).enumerate() {
            if i > 0 {
                end_commit(&mut cur, &mut skip);
            }
            if cur.len() + piece.len() > max {
                skip = true;
                cur.clear();
            } else if !skip {
                cur.extend_from_slice(piece);
            }
        }
        cmd::Flow::More
    })?;
    end_commit(&mut cur, &mut skip);
    if !out.ok() {
        return Err(remote.cache_error(&format!(
            "git log of the lock history failed: {}",
            out.stderr.trim()
        )));
    }
    // Newest commit first; within a commit, events are in order.
    let mut events: Vec<Event> = commits.into_iter().rev().flatten().collect();
    let skip = events.len().saturating_sub(limit);
    Ok(events.split_off(skip))
}
