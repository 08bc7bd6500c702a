//! `list`: every lock ref, read in a bounded number of git processes
//! whatever their number, and handed over in `list`'s order.

use std::collections::HashMap;
use std::time::Instant;

use super::chain;
use super::config::REF_PREFIX;
use super::memo;
use super::objects::{self, Found};
use super::remote::Remote;
use crate::error::{Error, Result};
use crate::key::{LockKey, is_digest_stem};
use crate::store::{Current, Listed};

/// Reads every lock ref in a bounded number of git processes, whatever
/// their number (SPEC §8): one `ls-remote`; the state files the last
/// `list` read, from its memo; for the other commits a
/// `cat-file --batch-check`, one `fetch` of those the cache lacks (and a
/// second check of them), and one `cat-file --batch` that streams their
/// state files. Each lock is handed over as it is read, in `list`'s order.
pub(super) fn visit_locks(
    remote: &Remote,
    visit: &mut dyn FnMut(Listed) -> Result<()>,
) -> Result<usize> {
    let deadline = Instant::now() + remote.config.timeout;
    let prefix = remote.ns_prefix(REF_PREFIX);
    let pattern = format!("{prefix}*");
    let refs = remote.ls_remote(std::slice::from_ref(&pattern), &prefix, deadline)?;
    let named = named_in_order(refs, &prefix);
    let memo = memo::list_memo(remote, &prefix);
    // Each ref's state file in the memo, looked up once.
    let remembered: Vec<Option<&[u8]>> = named.iter().map(|(_, _, o)| memo.get(o)).collect();
    let fresh = remembered.iter().any(Option::is_none);
    // Those the memo lacks: read from the cache, after one fetch.
    let unread: Vec<usize> = (0..named.len())
        .filter(|i| remembered[*i].is_none())
        .collect();
    let wanted: Vec<(String, String)> = unread
        .iter()
        .map(|i| (named[*i].1.clone(), named[*i].2.clone()))
        .collect();
    let (plans, moved) = objects::fetch_plans(remote, &wanted, &[pattern], deadline)?;
    // A ref that moved since it was listed was read at its new commit:
    // not kept under the old one.
    let moved: std::collections::HashSet<usize> = moved.iter().map(|k| unread[*k]).collect();
    // What the next `list` is to find in the memo: by index into `named`,
    // with the state file when it was read rather than remembered.
    let mut kept: Vec<(usize, Option<Vec<u8>>)> = Vec::new();
    let mut next = 0;
    let mut hand = |i: usize, from: Source| -> Result<()> {
        let (key, r, oid) = &named[i];
        let seen = match from {
            Source::Memo(body) => {
                kept.push((i, None));
                chain::interpret_state(remote, oid, body)
            }
            Source::Read(Found::State(body)) => {
                let seen = chain::interpret_state(remote, oid, &body);
                if memo::memo_worthy(&body) && !moved.contains(&i) {
                    kept.push((i, Some(body)));
                }
                seen
            }
            Source::Read(other) => chain::interpret(remote, oid, other).ok_or_else(|| {
                remote.unavailable(&format!("the objects of {r} ({oid}) are not in the cache"))
            })?,
        };
        if seen.current == Current::Free {
            return Ok(());
        }
        let Some(key) = key
            .clone()
            .or_else(|| recorded_key(&seen.current, &r[prefix.len()..]))
        else {
            return Ok(()); // a digest stem whose record does not name it
        };
        visit(Listed::new(key, r.clone(), seen.current))
    };
    // The memo's, up to `upto`; then each one read, in its place.
    let mut from_memo = |upto: usize, hand: &mut dyn FnMut(usize, Source) -> Result<()>| {
        while next < upto {
            if let Some(body) = remembered[next] {
                hand(next, Source::Memo(body))?;
            }
            next += 1;
        }
        Ok::<(), Error>(())
    };
    objects::finish(remote, plans, &mut |k, found| {
        from_memo(unread[k], &mut hand)?;
        hand(unread[k], Source::Read(found))?;
        from_memo(unread[k] + 1, &mut hand)
    })?;
    from_memo(named.len(), &mut hand)?;
    if fresh || memo.len() != kept.len() {
        save_memo(remote, &prefix, &named, &remembered, &kept);
    }
    Ok(0)
}

/// Keeps the state files `kept` (by index into `named`; with the state
/// file when it was read, else the memo's) for the next `list`.
fn save_memo(
    remote: &Remote,
    prefix: &str,
    named: &[(Option<LockKey>, String, String)],
    remembered: &[Option<&[u8]>],
    kept: &[(usize, Option<Vec<u8>>)],
) {
    let entries: Vec<(&str, &str, &[u8])> = kept
        .iter()
        .filter_map(|(i, body)| {
            let (_, r, oid) = &named[*i];
            Some((
                oid.as_str(),
                r.as_str(),
                body.as_deref().or(remembered[*i])?,
            ))
        })
        .collect();
    memo::save_list_memo(remote, prefix, &entries);
}

/// Where a lock's state file came from.
enum Source<'m> {
    /// The memo of the last `list`.
    Memo(&'m [u8]),
    /// The cache, read now.
    Read(Found),
}

/// The lock refs of `list`, each with its key (a digest stem's key is
/// known only once its record is read), in `list`'s order; a digest stem
/// (a name too long for a ref) sorts by its readable prefix.
fn named_in_order(
    refs: HashMap<String, String>,
    prefix: &str,
) -> Vec<(Option<LockKey>, String, String)> {
    let mut named: Vec<(Option<LockKey>, String, String)> = refs
        .into_iter()
        .filter_map(|(r, oid)| {
            let name = r.strip_prefix(prefix)?;
            let key = LockKey::from_name(name).filter(|k| k.ref_stem() == name);
            (key.is_some() || is_digest_stem(name)).then_some((key, r, oid))
        })
        .collect();
    named.sort_by_cached_key(|(k, r, _)| {
        let order = k.as_ref().map_or_else(
            || (r[prefix.len()..].to_owned(), String::new()),
            crate::store::list_order,
        );
        (order, r.clone())
    });
    named
}

/// The key a digest stem `stem` stands for, read from the lock's record
/// and believed only when it maps to that stem (lowercase, as a key
/// parsed from a name is).
fn recorded_key(current: &Current, stem: &str) -> Option<LockKey> {
    let holder = &current.record()?.holder;
    let name = LockKey::new(&holder.skill, &holder.repo).ok()?.name();
    LockKey::from_name(&name).filter(|k| k.ref_stem() == stem)
}
