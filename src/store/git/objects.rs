//! Reading lock states out of the cache, bounded (SPEC §8: whatever a
//! remote serves is read bounded): the size and type of every object first
//! (`cat-file --batch-check`, which never unpacks one), then the contents of
//! the state files small enough to be one (`cat-file --batch`), streamed.
//! Any number of locks costs the same two git processes (three when a tree
//! lacks its state file).

use std::fmt::Write as _;
use std::time::Instant;

use super::cmd::Flow;
use super::remote::{Remote, is_oid};
use crate::error::{Error, Result};

/// The file in a lock's commit that holds its state.
pub(super) const STATE_FILE: &str = "lock.json";
/// Largest `lock.json` read: a record (SPEC §8: 64 KiB) and the state
/// around it. A larger one is corrupt, and is never read.
pub(super) const MAX_STATE: usize = crate::record::MAX_RECORD_BYTES + 4096;
/// Largest commit or tree of a lock looked into (a commit holds a change's
/// events; a tree, one entry).
pub(super) const MAX_OBJECT: u64 = 1 << 20;
/// Longest header line of `cat-file --batch` accepted.
const MAX_HEADER: usize = 512;

/// What the cache holds of one lock commit.
#[derive(Debug)]
pub(super) enum Found {
    /// Its state file, at most [`MAX_STATE`] bytes.
    State(Vec<u8>),
    /// Everything is here and it holds no state file that can be read
    /// (why). `sane`: it is a commit of a reasonable size, whose ancestors
    /// may be read for the last fence.
    Bad { why: String, sane: bool },
    /// Not all of its objects are in the cache (yet).
    Missing,
}

/// One object, as `cat-file --batch-check` describes it.
#[derive(Debug)]
enum Info {
    Missing,
    Here {
        oid: String,
        kind: String,
        size: u64,
    },
}

impl Info {
    fn parse(line: &str) -> Self {
        let mut parts = line.split(' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(oid), Some(kind), Some(size), None) if is_oid(oid) => {
                size.parse().map_or(Self::Missing, |size| Self::Here {
                    oid: oid.to_owned(),
                    kind: kind.to_owned(),
                    size,
                })
            }
            // `<name> missing`, `<name> ambiguous`.
            _ => Self::Missing,
        }
    }
}

/// What is left to learn of one lock commit after the sizes are known.
#[derive(Debug)]
pub(super) enum Plan {
    Done(Found),
    /// Its state file: this blob, of this size.
    Read(String),
    /// Its tree has no readable `lock.json` path: is the blob missing, or
    /// is there no such entry? (Read the tree.)
    Tree(String),
}

impl Plan {
    /// Not all of the commit's objects are in the cache.
    pub(super) fn missing(&self) -> bool {
        matches!(self, Self::Done(Found::Missing))
    }
}

/// Decides what to read of a commit from its three `--batch-check` lines:
/// `REV`, `REV^{tree}`, `REV:lock.json`.
fn plan(commit: Info, tree: Info, file: Info) -> Plan {
    let bad = |why: String, sane: bool| Plan::Done(Found::Bad { why, sane });
    let commit = match commit {
        Info::Missing => return Plan::Done(Found::Missing),
        Info::Here { oid, kind, .. } if kind != "commit" => {
            return bad(
                format!("the lock ref points at {oid}, a {kind}, not a commit"),
                false,
            );
        }
        Info::Here { oid, size, .. } if size > MAX_OBJECT => {
            return bad(
                format!("the lock's commit {oid} is {size} bytes, more than a lock state's can be"),
                false,
            );
        }
        Info::Here { oid, .. } => oid,
    };
    let tree = match tree {
        Info::Missing => return Plan::Done(Found::Missing),
        Info::Here { size, .. } if size > MAX_OBJECT => {
            return bad(
                format!("the tree of {commit} is {size} bytes, more than a lock state's can be"),
                true,
            );
        }
        Info::Here { oid, .. } => oid,
    };
    match file {
        Info::Missing => Plan::Tree(tree),
        Info::Here { kind, .. } if kind != "blob" => bad(
            format!("the {STATE_FILE} of {commit} is a {kind}, not a file"),
            true,
        ),
        Info::Here { size, .. } if size > MAX_STATE as u64 => bad(
            format!(
                "the {STATE_FILE} of {commit} is {size} bytes, more than a lock state can be ({MAX_STATE}); it was not read"
            ),
            true,
        ),
        Info::Here { oid, .. } => Plan::Read(oid),
    }
}

/// Does a (binary) tree list `name`? `hash_len`: bytes of an object id.
fn tree_lists(tree: &[u8], name: &str, hash_len: usize) -> bool {
    let mut rest = tree;
    while let Some(sp) = rest.iter().position(|b| *b == b' ') {
        let after = &rest[sp + 1..];
        let Some(nul) = after.iter().position(|b| *b == 0) else {
            return false;
        };
        if &after[..nul] == name.as_bytes() {
            return true;
        }
        rest = after.get(nul + 1 + hash_len..).unwrap_or_default();
    }
    false
}

/// Why reading a batch stopped.
#[derive(Debug)]
enum Stop {
    /// git's answer was not what was asked for.
    Format(String),
    /// The receiver's own error.
    Each(Error),
}

/// Splits `cat-file --batch` output, fed in pieces, into its objects, each
/// handed over as it completes (or `None`: missing); one larger than `max`
/// is an error and ends it.
struct Batch<'a> {
    pending: Vec<u8>,
    /// Where the unread part of `pending` starts.
    at: usize,
    /// The object being read: its size.
    size: Option<usize>,
    index: usize,
    max: usize,
    each: &'a mut dyn FnMut(usize, Option<Vec<u8>>) -> Result<()>,
}

impl Batch<'_> {
    fn feed(&mut self, chunk: &[u8]) -> std::result::Result<(), Stop> {
        if self.at > 0 && self.at >= self.pending.len() / 2 {
            self.pending.drain(..self.at);
            self.at = 0;
        }
        self.pending.extend_from_slice(chunk);
        loop {
            let rest = &self.pending[self.at..];
            match self.size {
                None => {
                    let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
                        if rest.len() > MAX_HEADER {
                            return Err(Stop::Format(
                                "git cat-file sent a header line too long".into(),
                            ));
                        }
                        return Ok(());
                    };
                    let header = String::from_utf8_lossy(&rest[..nl]).into_owned();
                    self.at += nl + 1;
                    match Info::parse(&header) {
                        Info::Missing => self.hand(None)?,
                        Info::Here { size, .. } => {
                            let size = usize::try_from(size).unwrap_or(usize::MAX);
                            if size > self.max {
                                return Err(Stop::Format(format!(
                                    "git cat-file sent an object of {size} bytes where at most {} were expected",
                                    self.max
                                )));
                            }
                            self.size = Some(size);
                        }
                    }
                }
                Some(size) => {
                    if rest.len() <= size {
                        return Ok(());
                    }
                    let body = rest[..size].to_vec();
                    self.at += size + 1;
                    self.size = None;
                    self.hand(Some(body))?;
                }
            }
        }
    }

    fn hand(&mut self, body: Option<Vec<u8>>) -> std::result::Result<(), Stop> {
        let i = self.index;
        self.index += 1;
        (self.each)(i, body).map_err(Stop::Each)
    }
}

/// Reads `lock.json` of each commit `revs` names (an object id, or a
/// cache ref), handing each over to `each` in order.
///
/// No object is ever unpacked unless it is small enough for its part
/// (a state file: [`MAX_STATE`]; a commit or tree: [`MAX_OBJECT`]), and
/// state files are streamed from git, so any number of locks is read
/// in two git processes (three when a tree lacks its state file).
pub(super) fn read_found(
    remote: &Remote,
    revs: &[String],
    each: &mut dyn FnMut(usize, Found) -> Result<()>,
) -> Result<()> {
    if revs.is_empty() {
        return Ok(());
    }
    let plans = probe(remote, revs)?;
    finish(remote, plans, each)
}

/// Reads what [`probe`] left to read, handing each commit's
/// state over to `each` in order.
pub(super) fn finish(
    remote: &Remote,
    mut plans: Vec<Plan>,
    each: &mut dyn FnMut(usize, Found) -> Result<()>,
) -> Result<()> {
    look_into_trees(remote, &mut plans)?;
    let reads: Vec<(usize, String)> = plans
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            Plan::Read(b) => Some((i, b.clone())),
            _ => None,
        })
        .collect();
    let mut next = 0;
    let mut hand_up_to = |upto: usize, plans: &mut [Plan]| -> Result<()> {
        while next < upto {
            let p = std::mem::replace(&mut plans[next], Plan::Done(Found::Missing));
            let found = match p {
                Plan::Done(f) => f,
                Plan::Read(_) | Plan::Tree(_) => Found::Missing,
            };
            each(next, found)?;
            next += 1;
        }
        Ok(())
    };
    let oids: Vec<String> = reads.iter().map(|(_, b)| b.clone()).collect();
    batch(remote, &oids, MAX_STATE, &mut |k, body| {
        let i = reads[k].0;
        hand_up_to(i, &mut plans)?;
        plans[i] = Plan::Done(body.map_or(Found::Missing, Found::State));
        hand_up_to(i + 1, &mut plans)
    })?;
    hand_up_to(plans.len(), &mut plans)
}

/// Settles each [`Plan::Tree`]: a tree that lists the state file lacks
/// its blob (missing); one that does not is no lock state.
fn look_into_trees(remote: &Remote, plans: &mut [Plan]) -> Result<()> {
    let trees: Vec<(usize, String)> = plans
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            Plan::Tree(t) => Some((i, t.clone())),
            _ => None,
        })
        .collect();
    let oids: Vec<String> = trees.iter().map(|(_, t)| t.clone()).collect();
    let cap = usize::try_from(MAX_OBJECT).unwrap_or(usize::MAX);
    batch(remote, &oids, cap, &mut |k, body| {
        let (i, tree) = &trees[k];
        plans[*i] = Plan::Done(match body {
            Some(b) if !tree_lists(&b, STATE_FILE, tree.len() / 2) => Found::Bad {
                why: format!("the lock's commit holds no {STATE_FILE}"),
                sane: true,
            },
            _ => Found::Missing,
        });
        Ok(())
    })
}

/// [`read_found`] of one commit.
pub(super) fn read_one(remote: &Remote, rev: &str) -> Result<Found> {
    let mut found = Found::Missing;
    read_found(remote, &[rev.to_owned()], &mut |_, f| {
        found = f;
        Ok(())
    })?;
    Ok(found)
}

/// The sizes and types of each commit, its tree and its state file:
/// what to read of each.
pub(super) fn probe(remote: &Remote, revs: &[String]) -> Result<Vec<Plan>> {
    if revs.is_empty() {
        return Ok(Vec::new());
    }
    let mut input = String::new();
    for r in revs {
        let _ = writeln!(input, "{r}\n{r}^{{tree}}\n{r}:{STATE_FILE}");
    }
    // An answer line is an object id, a type and a size, or the question
    // and "missing".
    let cap = input.len() * 2 + revs.len() * 3 * 100;
    let out = remote.local_capped(&["cat-file", "--batch-check"], Some(input.as_bytes()), cap)?;
    if !out.ok() {
        return Err(remote.cache_error(&format!(
            "git cat-file --batch-check failed: {}",
            out.stderr.trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() != revs.len() * 3 {
        return Err(remote.cache_error(&format!(
            "git cat-file --batch-check answered {} lines to {} questions",
            lines.len(),
            revs.len() * 3
        )));
    }
    Ok(lines
        .chunks(3)
        .map(|c| plan(Info::parse(c[0]), Info::parse(c[1]), Info::parse(c[2])))
        .collect())
}

/// Streams the contents of `oids` (each at most `max` bytes, as their
/// sizes said) to `each`, in order.
fn batch(
    remote: &Remote,
    oids: &[String],
    max: usize,
    each: &mut dyn FnMut(usize, Option<Vec<u8>>) -> Result<()>,
) -> Result<()> {
    if oids.is_empty() {
        return Ok(());
    }
    let mut input = String::new();
    for o in oids {
        let _ = writeln!(input, "{o}");
    }
    let mut failed: Option<Stop> = None;
    let mut batch = Batch {
        pending: Vec::new(),
        at: 0,
        size: None,
        index: 0,
        max,
        each,
    };
    let out =
        remote.local_streaming(&["cat-file", "--batch"], Some(input.as_bytes()), &mut |c| {
            match batch.feed(c) {
                Ok(()) => Flow::More,
                Err(stop) => {
                    failed.get_or_insert(stop);
                    Flow::Stop
                }
            }
        })?;
    let got = batch.index;
    match failed {
        Some(Stop::Format(why)) => return Err(remote.cache_error(&why)),
        Some(Stop::Each(e)) => return Err(e),
        None => {}
    }
    if !out.ok() || got != oids.len() {
        return Err(remote.cache_error(&format!(
            "git cat-file --batch gave {got} of {} objects: {}",
            oids.len(),
            out.stderr.trim()
        )));
    }
    Ok(())
}

/// Missing commits fetched by their refs' names; more are fetched by pattern.
const FETCH_BY_NAME: usize = 32;

/// What to read of each commit of `refs` (ref, commit as listed), after
/// one fetch of those the cache lacks: by name when they are few, else
/// by `patterns` (each git process's work grows with the refs, their
/// number never does). A ref that moved since it was listed is read
/// where the fetch found it: its index is in the second list.
pub(super) fn fetch_plans(
    remote: &Remote,
    refs: &[(String, String)],
    patterns: &[String],
    deadline: Instant,
) -> Result<(Vec<Plan>, Vec<usize>)> {
    let oids: Vec<String> = refs.iter().map(|(_, o)| o.clone()).collect();
    let mut plans = probe(remote, &oids)?;
    let missing: Vec<usize> = (0..plans.len()).filter(|i| plans[*i].missing()).collect();
    if missing.is_empty() {
        return Ok((plans, Vec::new()));
    }
    let names: Vec<String> = if missing.len() <= FETCH_BY_NAME {
        missing.iter().map(|i| refs[*i].0.clone()).collect()
    } else {
        patterns.to_vec()
    };
    let mut failed = remote.fetch(&names, deadline)?;
    if failed.is_some() && names != patterns {
        // One ref gone since it was listed fails a fetch by names whole.
        failed = remote.fetch(patterns, deadline)?;
    }
    let mut left = missing;
    let mut moved_ones = Vec::new();
    for moved in [false, true] {
        let names: Vec<String> = left
            .iter()
            .map(|i| {
                if moved {
                    remote.cache_ref(&refs[*i].0)
                } else {
                    refs[*i].1.clone()
                }
            })
            .collect();
        let again = probe(remote, &names)?;
        let mut still = Vec::new();
        for (i, p) in left.into_iter().zip(again) {
            if p.missing() {
                still.push(i);
            } else if moved {
                moved_ones.push(i);
            }
            plans[i] = p;
        }
        left = still;
        if left.is_empty() {
            return Ok((plans, moved_ones));
        }
    }
    let (r, oid) = &refs[left[0]];
    Err(remote.unavailable(&format!(
        "the objects of {r} ({oid}) did not arrive{}",
        failed
            .map(|w| format!(": git fetch failed: {w}"))
            .unwrap_or_default()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef01234567";

    fn here(kind: &str, size: u64) -> Info {
        Info::parse(&format!("{A} {kind} {size}"))
    }

    #[test]
    fn sizes_decide_what_is_read() {
        let read = plan(here("commit", 200), here("tree", 40), here("blob", 600));
        assert!(matches!(read, Plan::Read(ref b) if b == A));
        // A huge state file is never read: corrupt, its ancestors readable.
        let huge = plan(
            here("commit", 200),
            here("tree", 40),
            here("blob", 200 << 20),
        );
        assert!(
            matches!(huge, Plan::Done(Found::Bad { sane: true, .. })),
            "{huge:?}"
        );
        let big_commit = plan(here("commit", 2 << 20), Info::Missing, Info::Missing);
        assert!(matches!(
            big_commit,
            Plan::Done(Found::Bad { sane: false, .. })
        ));
        let tag = plan(here("tag", 100), here("tree", 40), here("blob", 10));
        assert!(matches!(tag, Plan::Done(Found::Bad { sane: false, .. })));
        let missing = plan(
            Info::parse(&format!("{A} missing")),
            Info::Missing,
            Info::Missing,
        );
        assert!(matches!(missing, Plan::Done(Found::Missing)));
        let no_tree = plan(here("commit", 200), Info::Missing, Info::Missing);
        assert!(matches!(no_tree, Plan::Done(Found::Missing)));
        let ask_tree = plan(here("commit", 200), here("tree", 40), Info::Missing);
        assert!(matches!(ask_tree, Plan::Tree(_)));
        let dir = plan(here("commit", 200), here("tree", 40), here("tree", 40));
        assert!(matches!(dir, Plan::Done(Found::Bad { sane: true, .. })));
    }

    #[test]
    fn trees_are_read_entry_by_entry() {
        let mut t = b"100644 a.txt\0".to_vec();
        t.extend_from_slice(&[b' '; 20]);
        t.extend_from_slice(b"100644 lock.json\0");
        t.extend_from_slice(&[0u8; 20]);
        assert!(tree_lists(&t, "lock.json", 20));
        assert!(!tree_lists(&t, "lock.jso", 20));
        assert!(!tree_lists(&t[..10], "lock.json", 20));
    }

    #[test]
    fn batch_output_is_split_in_pieces_and_bounded() {
        let mut out = Vec::new();
        out.extend_from_slice(format!("{A} blob 3\nabc\n{A} missing\n{A} blob 0\n\n").as_bytes());
        for split in 1..out.len() {
            let mut got = Vec::new();
            let mut each = |i: usize, b: Option<Vec<u8>>| {
                got.push((i, b));
                Ok(())
            };
            let mut batch = Batch {
                pending: Vec::new(),
                at: 0,
                size: None,
                index: 0,
                max: 10,
                each: &mut each,
            };
            for piece in out.chunks(split) {
                batch.feed(piece).unwrap();
            }
            assert_eq!(
                got,
                vec![(0, Some(b"abc".to_vec())), (1, None), (2, Some(Vec::new()))]
            );
        }
        let mut each = |_: usize, _: Option<Vec<u8>>| Ok(());
        let mut batch = Batch {
            pending: Vec::new(),
            at: 0,
            size: None,
            index: 0,
            max: 2,
            each: &mut each,
        };
        assert!(batch.feed(format!("{A} blob 3\n").as_bytes()).is_err());
    }
}
