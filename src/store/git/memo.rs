//! What this host remembers of the remote, to read less of it: the state
//! it last wrote to (or read of) each lock ref, and the state files of the
//! commits `list` last read, with the ref each was read at (so a change of
//! a lock this host only listed is decided on what `list` saw). Both live in the cache (`skill-lock-tips/`),
//! are written whole (a temporary file renamed into place) and read bounded,
//! from regular files only; a lost or damaged one only costs the reads it
//! would have saved. A commit's state file never changes (an object id
//! names its content), so a remembered one is as good as one read from git.

use std::collections::HashMap;
use std::io::Read as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::objects::MAX_STATE;
use super::remote::{Remote, is_oid};

/// State files `list` keeps for the next one: each at most this big...
const LIST_MEMO_ENTRY: usize = 4096;
/// ...and all of them at most this much.
const LIST_MEMO_MAX: usize = 32 << 20;
const LIST_MEMO_HEADER: &[u8] = b"skill-lock list memo 2\n";

/// Reads at most `max` bytes of a regular file (`None`: absent, not a
/// regular file, or larger).
fn read_bounded(file: &Path, max: usize) -> Option<Vec<u8>> {
    let meta = std::fs::symlink_metadata(file).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .ok()?
        .take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() <= max).then_some(bytes)
}

/// Writes `bytes` to `file` whole, or not at all (best effort).
fn write_whole(file: &Path, bytes: &[u8]) {
    let Some(dir) = file.parent() else { return };
    let _ = std::fs::create_dir_all(dir);
    let tmp = dir.join(format!(".{}", crate::record::random_suffix()));
    if std::fs::write(&tmp, bytes).is_err() || std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn tip_file(remote: &Remote, r: &str) -> PathBuf {
    let h = crate::record::hash_token(&format!("{}\n{r}", remote.config.remote));
    remote.config.cache.join("skill-lock-tips").join(&h[..32])
}

/// The commit this host last wrote to `r` or read there, and its state
/// file: a line with the object id, then the state.
pub(super) fn memo(remote: &Remote, r: &str) -> Option<(String, Vec<u8>)> {
    let bytes = read_bounded(&tip_file(remote, r), MAX_STATE + 128)?;
    let nl = bytes.iter().position(|b| *b == b'\n')?;
    let oid = std::str::from_utf8(&bytes[..nl]).ok()?;
    if !is_oid(oid) {
        return None;
    }
    Some((oid.to_owned(), bytes[nl + 1..].to_vec()))
}

/// Remembers (or forgets) the commit this host last pushed to `r`, or
/// read there, with its state file. Best effort: a lost note only costs
/// the read it would have saved.
pub(super) fn remember(remote: &Remote, r: &str, tip: Option<(&str, &[u8])>) {
    let file = tip_file(remote, r);
    let Some((oid, body)) = tip else {
        let _ = std::fs::remove_file(&file);
        return;
    };
    let mut bytes = Vec::with_capacity(oid.len() + 1 + body.len());
    bytes.extend_from_slice(oid.as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(body);
    write_whole(&file, &bytes);
}

/// Has this host never seen lock ref `r`: no note of it (written, read or
/// forgotten after a lost race) and no copy of it fetched into the cache?
/// Then the lock is most likely absent on the remote (a lock is a ref only
/// once someone took it), and a change guesses so, leased on the empty
/// value: a wrong guess is rejected by the server and costs one connection.
/// Any doubt (a ref store other than loose files, a `packed-refs` too large
/// to read here) answers `false`, which costs only the read it would have
/// saved.
pub(super) fn never_seen(remote: &Remote, r: &str) -> bool {
    let cache = &remote.config.cache;
    if std::fs::symlink_metadata(tip_file(remote, r)).is_ok()
        || std::fs::symlink_metadata(cache.join("reftable")).is_ok()
    {
        return false;
    }
    let local = remote.cache_ref(r);
    if std::fs::symlink_metadata(cache.join(&local)).is_ok() {
        return false;
    }
    let packed = cache.join("packed-refs");
    if std::fs::symlink_metadata(&packed).is_err() {
        return true;
    }
    let Some(bytes) = read_bounded(&packed, 4 << 20) else {
        return false;
    };
    let needle = format!(" {local}\n");
    !bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn list_memo_file(remote: &Remote, prefix: &str) -> PathBuf {
    let h = crate::record::hash_token(&format!("{}\n{prefix}", remote.config.remote));
    remote
        .config
        .cache
        .join("skill-lock-tips")
        .join(format!("list-{}", &h[..32]))
}

/// The state files of the commits the last `list` of a prefix read, by
/// commit: the memo file as read, and where each commit's state file is
/// in it (no copy of each).
#[derive(Default)]
pub(super) struct ListMemo {
    bytes: Vec<u8>,
    at: HashMap<String, Range<usize>>,
    /// Its entries (one a ref).
    entries: usize,
}

impl ListMemo {
    /// The state file of `oid`, if the memo holds it.
    pub(super) fn get(&self, oid: &str) -> Option<&[u8]> {
        self.at.get(oid).and_then(|r| self.bytes.get(r.clone()))
    }

    /// Its entries, one a ref listed.
    pub(super) fn len(&self) -> usize {
        self.entries
    }
}

/// The memo of the last `list` of `prefix` (empty when there is no such
/// memo, or it is damaged).
pub(super) fn list_memo(remote: &Remote, prefix: &str) -> ListMemo {
    let Some(bytes) = read_bounded(&list_memo_file(remote, prefix), LIST_MEMO_MAX + (1 << 20))
    else {
        return ListMemo::default();
    };
    let mut at = HashMap::new();
    let mut entries = 0;
    if !each_listed(&bytes, &mut |oid, _, body| {
        at.insert(oid.to_owned(), body);
        entries += 1;
        true
    }) {
        return ListMemo::default();
    }
    ListMemo { bytes, at, entries }
}

/// The commit the last `list` of `prefix` saw at ref `r`, and its state
/// file: what this host last read of a lock it never wrote nor read alone.
pub(super) fn listed(remote: &Remote, prefix: &str, r: &str) -> Option<(String, Vec<u8>)> {
    let bytes = read_bounded(&list_memo_file(remote, prefix), LIST_MEMO_MAX + (1 << 20))?;
    let mut found = None;
    each_listed(&bytes, &mut |oid, name, body| {
        if name == r {
            found = Some((oid.to_owned(), body));
        }
        found.is_none()
    });
    let (oid, body) = found?;
    Some((oid, bytes.get(body)?.to_vec()))
}

/// Hands each entry of a list memo (commit, ref, where its state file is)
/// to `each` until it answers `false`; `false` when the memo is damaged.
/// Entries: `OID LEN REF\n`, then LEN bytes and a newline.
fn each_listed(bytes: &[u8], each: &mut dyn FnMut(&str, &str, Range<usize>) -> bool) -> bool {
    if !bytes.starts_with(LIST_MEMO_HEADER) {
        return false;
    }
    let mut at = LIST_MEMO_HEADER.len();
    while at < bytes.len() {
        let rest = &bytes[at..];
        let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
            return false;
        };
        let head = std::str::from_utf8(&rest[..nl]).ok();
        let Some((oid, (len, name))) = head
            .and_then(|h| h.split_once(' '))
            .and_then(|(oid, rest)| Some((oid, rest.split_once(' ')?)))
        else {
            return false;
        };
        let len: usize = len.parse().unwrap_or(usize::MAX);
        let body = rest.get(nl + 1..).unwrap_or_default();
        if !is_oid(oid) || len > LIST_MEMO_ENTRY || body.len() <= len || body[len] != b'\n' {
            return false;
        }
        let start = at + nl + 1;
        if !each(oid, name, start..start + len) {
            return true;
        }
        at = start + len + 1;
    }
    true
}

/// Keeps `entries` (commit, ref, state file) for the next `list` of
/// `prefix`: those small enough, up to the memo's bound.
pub(super) fn save_list_memo(remote: &Remote, prefix: &str, entries: &[(&str, &str, &[u8])]) {
    let mut bytes = LIST_MEMO_HEADER.to_vec();
    for (oid, r, body) in entries {
        if body.len() > LIST_MEMO_ENTRY || !is_oid(oid) || r.contains(['\n', ' ']) {
            continue;
        }
        if bytes.len() + body.len() + r.len() + 100 > LIST_MEMO_MAX {
            break;
        }
        bytes.extend_from_slice(format!("{oid} {} {r}\n", body.len()).as_bytes());
        bytes.extend_from_slice(body);
        bytes.push(b'\n');
    }
    write_whole(&list_memo_file(remote, prefix), &bytes);
}

/// Is this state file small enough for the list memo?
pub(super) fn memo_worthy(body: &[u8]) -> bool {
    body.len() <= LIST_MEMO_ENTRY
}
