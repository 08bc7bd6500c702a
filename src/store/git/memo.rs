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
const LIST_MEMO_HEADER: &[u8] = b"skill-lock list memo 3\n";

/// `file` opened for reading, with its size, when it is a regular file
/// (never a link or anything else).
fn open_regular(file: &Path) -> Option<(std::fs::File, u64)> {
    let meta = std::fs::symlink_metadata(file).ok()?;
    if !meta.is_file() {
        return None;
    }
    Some((std::fs::File::open(file).ok()?, meta.len()))
}

/// Reads at most `max` bytes of a regular file (`None`: absent, not a
/// regular file, or larger).
fn read_bounded(file: &Path, max: usize) -> Option<Vec<u8>> {
    let (f, size) = open_regular(file)?;
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(max) + 1);
    f.take(max as u64 + 1).read_to_end(&mut bytes).ok()?;
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
/// Found by a binary search of the memo's index, reading a few small
/// pieces of the file: the cost does not grow with the locks it holds.
pub(super) fn listed(remote: &Remote, prefix: &str, r: &str) -> Option<(String, Vec<u8>)> {
    listed_in(&list_memo_file(remote, prefix), r)
}

/// [`listed`] in the memo file `file`.
fn listed_in(file: &Path, r: &str) -> Option<(String, Vec<u8>)> {
    let (mut f, size) = open_regular(file)?;
    let mut head = [0u8; LIST_MEMO_HEADER.len() + 8];
    read_at(&mut f, 0, &mut head)?;
    let (magic, count) = head.split_at(LIST_MEMO_HEADER.len());
    let count = u64::from_le_bytes(count.try_into().ok()?);
    let index = head.len() as u64;
    if magic != LIST_MEMO_HEADER || count.checked_mul(8)?.checked_add(index)? > size {
        return None;
    }
    let (mut lo, mut hi) = (0, count);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let mut at = [0u8; 8];
        read_at(&mut f, index + 8 * mid, &mut at)?;
        let at = u64::from_le_bytes(at);
        let mut line = vec![0u8; usize::try_from(size.checked_sub(at)?.min(1024)).ok()?];
        read_at(&mut f, at, &mut line)?;
        let nl = line.iter().position(|b| *b == b'\n')?;
        let (oid, len, name) = entry_head(&line[..nl])?;
        match name.cmp(r) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => {
                let mut body = vec![0u8; len + 1];
                read_at(&mut f, at + nl as u64 + 1, &mut body)?;
                return (body.pop() == Some(b'\n')).then(|| (oid.to_owned(), body));
            }
        }
    }
    None
}

/// Reads exactly `buf.len()` bytes of `f` at `offset`.
fn read_at(f: &mut std::fs::File, offset: u64, buf: &mut [u8]) -> Option<()> {
    use std::io::Seek as _;
    f.seek(std::io::SeekFrom::Start(offset)).ok()?;
    f.read_exact(buf).ok()
}

/// An entry's head line, `OID LEN REF`: its parts, when well formed.
fn entry_head(line: &[u8]) -> Option<(&str, usize, &str)> {
    let (oid, rest) = std::str::from_utf8(line).ok()?.split_once(' ')?;
    let (len, name) = rest.split_once(' ')?;
    let len: usize = len.parse().ok()?;
    (is_oid(oid) && len <= LIST_MEMO_ENTRY).then_some((oid, len, name))
}

/// Hands each entry of a list memo (commit, ref, where its state file is)
/// to `each` until it answers `false`; `false` when the memo is damaged.
/// The memo: its header line, the number of entries (8 bytes, little
/// endian), where each entry starts (8 bytes each, in the order of their
/// refs), then the entries: `OID LEN REF\n`, LEN bytes and a newline.
fn each_listed(bytes: &[u8], each: &mut dyn FnMut(&str, &str, Range<usize>) -> bool) -> bool {
    let Some(rest) = bytes.strip_prefix(LIST_MEMO_HEADER) else {
        return false;
    };
    let Some(count) = rest
        .get(..8)
        .and_then(|c| c.try_into().ok())
        .map(u64::from_le_bytes)
        .and_then(|c| usize::try_from(c).ok())
    else {
        return false;
    };
    let Some(mut at) = count
        .checked_mul(8)
        .and_then(|n| n.checked_add(LIST_MEMO_HEADER.len() + 8))
        .filter(|at| *at <= bytes.len())
    else {
        return false;
    };
    let mut seen = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
            return false;
        };
        let Some((oid, len, name)) = entry_head(&rest[..nl]) else {
            return false;
        };
        let body = rest.get(nl + 1..).unwrap_or_default();
        if body.len() <= len || body[len] != b'\n' {
            return false;
        }
        let start = at + nl + 1;
        seen += 1;
        if !each(oid, name, start..start + len) {
            return true;
        }
        at = start + len + 1;
    }
    seen == count
}

/// Keeps `entries` (commit, ref, state file) for the next `list` of
/// `prefix`: those small enough, up to the memo's bound.
pub(super) fn save_list_memo(remote: &Remote, prefix: &str, entries: &[(&str, &str, &[u8])]) {
    write_whole(&list_memo_file(remote, prefix), &list_memo_bytes(entries));
}

/// The memo file holding `entries`, indexed by ref.
fn list_memo_bytes(entries: &[(&str, &str, &[u8])]) -> Vec<u8> {
    let mut kept: Vec<&(&str, &str, &[u8])> = Vec::with_capacity(entries.len());
    let mut total = 0;
    for e in entries {
        let (oid, r, body) = e;
        if body.len() > LIST_MEMO_ENTRY || !is_oid(oid) || r.contains(['\n', ' ']) {
            continue;
        }
        total += body.len() + r.len() + 100;
        if total > LIST_MEMO_MAX {
            break;
        }
        kept.push(e);
    }
    kept.sort_unstable_by(|a, b| a.1.cmp(b.1));
    kept.dedup_by(|a, b| a.1 == b.1);
    let mut bytes = LIST_MEMO_HEADER.to_vec();
    bytes.extend_from_slice(&(kept.len() as u64).to_le_bytes());
    let index = bytes.len();
    bytes.resize(index + 8 * kept.len(), 0);
    for (i, (oid, r, body)) in kept.iter().enumerate() {
        let at = bytes.len() as u64;
        bytes[index + 8 * i..index + 8 * i + 8].copy_from_slice(&at.to_le_bytes());
        bytes.extend_from_slice(format!("{oid} {} {r}\n", body.len()).as_bytes());
        bytes.extend_from_slice(body);
        bytes.push(b'\n');
    }
    bytes
}

/// Is this state file small enough for the list memo?
pub(super) fn memo_worthy(body: &[u8]) -> bool {
    body.len() <= LIST_MEMO_ENTRY
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn oid(i: usize) -> String {
        format!("{i:040x}")
    }

    /// Writes a memo of `refs` (state file: `state of REF`), handed over in
    /// an order unrelated to the refs' (by each ref read backwards), as
    /// `list` hands them in its own order.
    fn memo_of(refs: &[String]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("memo");
        let mut bodies: Vec<(String, String, String)> = refs
            .iter()
            .enumerate()
            .map(|(i, r)| (oid(i), r.clone(), format!("state of {r}")))
            .collect();
        bodies.sort_by_key(|(_, r, _)| r.chars().rev().collect::<String>());
        let entries: Vec<(&str, &str, &[u8])> = bodies
            .iter()
            .map(|(o, r, b)| (o.as_str(), r.as_str(), b.as_bytes()))
            .collect();
        std::fs::write(&file, list_memo_bytes(&entries)).unwrap();
        (dir, file)
    }

    proptest! {
        /// Every ref kept is found, with its commit and state file; a ref
        /// not kept (before, between or after them) is not; a full read
        /// walks all of them.
        #[test]
        fn every_ref_kept_is_found_by_the_index_and_no_other(
            refs in proptest::collection::btree_set("refs/skill-lock/[a-z]{1,6}@o__r", 0..60),
            other in "refs/skill-lock/[a-z]{1,7}@o__r",
        ) {
            let refs: Vec<String> = refs.into_iter().collect();
            let (_dir, file) = memo_of(&refs);
            for (i, r) in refs.iter().enumerate() {
                let (o, body) = listed_in(&file, r).unwrap();
                prop_assert_eq!(o, oid(i));
                prop_assert_eq!(body, format!("state of {r}").into_bytes());
            }
            if !refs.contains(&other) {
                prop_assert!(listed_in(&file, &other).is_none());
            }
            let bytes = std::fs::read(&file).unwrap();
            let mut walked = Vec::new();
            let whole = each_listed(&bytes, &mut |_, name, body| {
                walked.push((name.to_owned(), bytes[body].to_vec()));
                true
            });
            prop_assert!(whole);
            prop_assert_eq!(walked.len(), refs.len());
        }
    }

    #[test]
    fn a_damaged_memo_answers_nothing_rather_than_a_wrong_entry() {
        let refs: Vec<String> = (0..20)
            .map(|i| format!("refs/skill-lock/s{i:02}@o__r"))
            .collect();
        let (_dir, file) = memo_of(&refs);
        let whole = std::fs::read(&file).unwrap();
        // Cut short: the full read refuses it; a lookup past the cut finds nothing.
        std::fs::write(&file, &whole[..whole.len() - 10]).unwrap();
        assert!(!each_listed(&whole[..whole.len() - 10], &mut |_, _, _| {
            true
        }));
        assert!(listed_in(&file, &refs[19]).is_none());
        // An index claiming more entries than the file can hold.
        let mut lying = whole.clone();
        lying[LIST_MEMO_HEADER.len()..LIST_MEMO_HEADER.len() + 8]
            .copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&file, &lying).unwrap();
        assert!(listed_in(&file, &refs[3]).is_none());
        assert!(!each_listed(&lying, &mut |_, _, _| true));
        // The format before the index is not read as this one.
        let old = [
            b"skill-lock list memo 2\n".as_slice(),
            &whole[LIST_MEMO_HEADER.len()..],
        ]
        .concat();
        std::fs::write(&file, &old).unwrap();
        assert!(listed_in(&file, &refs[3]).is_none());
        // Not a regular file: nothing.
        assert!(listed_in(file.parent().unwrap(), &refs[3]).is_none());
    }
}
