//! `history` of every lock in one git process (SPEC §8: a bounded number of
//! git processes, whatever the number of locks): one `git cat-file --batch`
//! that walks each lock's chains parent by parent, asked for the next
//! commit of a chain once the last one is read, and stopped on each lock
//! exactly where `git log --max-count` of each chain stopped before (the
//! newest `limit` commits of a chain, the chains newest first until the lock
//! has `limit` events).

use std::collections::VecDeque;
use std::sync::mpsc;

use super::cmd::{Feed, Flow};
use super::objects::MAX_OBJECT;
use super::remote::{Remote, is_oid};
use crate::error::Result;
use crate::history::Event;

/// The most of one commit kept: a message up to [`MAX_OBJECT`] and its
/// header. A larger commit's header (its parents come first) is read from
/// what is kept; its message is skipped unread, as one larger than any
/// change writes.
const KEPT: usize = (1 << 20) + (64 << 10);

// KEPT's first term is MAX_OBJECT (which is a u64).
const _: () = assert!(MAX_OBJECT == 1 << 20);

/// One lock's walk.
pub(super) struct Walk {
    /// The heads of the chains still to walk, newest chain first.
    chains: VecDeque<String>,
    /// The events to reach.
    limit: usize,
    /// The events of the chains walked, oldest first.
    events: Vec<Event>,
    /// The events of the commits read of the chain being walked, newest
    /// commit first.
    commits: Vec<Vec<Event>>,
    /// Commits to read of the chain being walked.
    budget: usize,
    /// A commit with two parents was met: `git log` walks such a chain in
    /// date order, which this walk does not imitate; the caller reads the
    /// lock the old way.
    merged: bool,
}

impl Walk {
    /// A walk of `chains` (the live tip first, then the archived chains
    /// newest first) for the newest `limit` events.
    pub(super) fn new(chains: Vec<String>, limit: usize) -> Self {
        Self {
            chains: chains.into(),
            limit,
            events: Vec::new(),
            commits: Vec::new(),
            budget: 0,
            merged: false,
        }
    }

    /// Its events, oldest first; `None` when a merge was met (read it with
    /// `git log`).
    pub(super) fn into_events(self) -> Option<Vec<Event>> {
        (!self.merged).then_some(self.events)
    }

    /// The next chain's head to ask for, if the walk goes on.
    fn next_chain(&mut self) -> Option<String> {
        if self.events.len() >= self.limit {
            return None;
        }
        let head = self.chains.pop_front()?;
        self.budget = self.limit - self.events.len();
        self.commits.clear();
        Some(head)
    }

    /// Ends the chain being walked: its newest `budget` events go before
    /// those of the newer chains.
    fn end_chain(&mut self) {
        let mut older: Vec<Event> = self.commits.drain(..).rev().flatten().collect();
        let skip = older.len().saturating_sub(self.budget);
        let mut older = older.split_off(skip);
        older.append(&mut self.events);
        self.events = older;
    }

    /// Takes a commit of the chain being walked; the next object to ask
    /// for, if any.
    fn take(&mut self, parents: &[String], events: Vec<Event>) -> Option<String> {
        if parents.len() > 1 {
            self.merged = true;
            return None;
        }
        self.commits.push(events);
        if self.commits.len() < self.budget
            && let Some(p) = parents.first()
        {
            return Some(p.clone());
        }
        self.end_chain();
        self.next_chain()
    }
}

/// Where the reader of `cat-file --batch` is.
enum At {
    /// In the header line of the next object.
    Header(Vec<u8>),
    /// In an object's content: bytes left (its newline included), and what
    /// is kept of it.
    Body { left: usize, kept: Vec<u8> },
}

/// A conversation with `cat-file --batch`: what was asked, for which
/// walk, and where the reader is in the answer.
struct Talk<'a> {
    walks: &'a mut [Walk],
    /// The walk each object asked for and not yet read is for, in order.
    asked: VecDeque<usize>,
    /// Git's input; dropped (its end) once every walk is done.
    tx: Option<mpsc::Sender<Vec<u8>>>,
    at: At,
}

impl Talk<'_> {
    /// Asks for `oid` on behalf of walk `i`.
    fn ask(&mut self, i: usize, oid: &str) -> std::result::Result<(), String> {
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send(format!("{oid}\n").into_bytes()).is_ok());
        if !sent {
            return Err("git cat-file stopped reading".into());
        }
        self.asked.push_back(i);
        Ok(())
    }

    /// Reads a piece of git's answer.
    fn feed(&mut self, mut chunk: &[u8]) -> std::result::Result<(), String> {
        while !chunk.is_empty() {
            match &mut self.at {
                At::Header(line) => {
                    let Some(nl) = chunk.iter().position(|b| *b == b'\n') else {
                        line.extend_from_slice(chunk);
                        if line.len() > 512 {
                            return Err("an unreadable answer of git cat-file".into());
                        }
                        return Ok(());
                    };
                    line.extend_from_slice(&chunk[..nl]);
                    chunk = &chunk[nl + 1..];
                    let head = String::from_utf8_lossy(line).into_owned();
                    let mut parts = head.split(' ');
                    let (oid, kind, size) = (parts.next(), parts.next(), parts.next());
                    let Some(size) = size.and_then(|s| s.parse::<usize>().ok()) else {
                        return Err(format!("{} is not here ({head})", oid.unwrap_or("?")));
                    };
                    if kind != Some("commit") {
                        return Err(format!("{} is not a commit ({head})", oid.unwrap_or("?")));
                    }
                    self.at = At::Body {
                        left: size.saturating_add(1),
                        kept: Vec::new(),
                    };
                }
                At::Body { left, kept } => {
                    let n = (*left).min(chunk.len());
                    let room = KEPT.saturating_sub(kept.len()).min(n);
                    kept.extend_from_slice(&chunk[..room]);
                    *left -= n;
                    chunk = &chunk[n..];
                    if *left == 0 {
                        let kept = std::mem::take(kept);
                        self.at = At::Header(Vec::new());
                        self.object(&kept)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes a whole commit for the walk that asked for it, and asks for
    /// what that walk needs next.
    fn object(&mut self, kept: &[u8]) -> std::result::Result<(), String> {
        let Some(i) = self.asked.pop_front() else {
            return Err("git cat-file answered more than was asked".into());
        };
        let (parents, events) = parse_commit(kept)?;
        if let Some(next) = self.walks[i].take(&parents, events) {
            self.ask(i, &next)?;
        }
        if self.asked.is_empty() {
            // Every walk is done: the end of git's input.
            self.tx = None;
        }
        Ok(())
    }
}

/// Walks every lock of `walks` in one `cat-file --batch`.
///
/// # Errors
/// A chain with a missing or non-commit object (as `git log` fails on
/// one), a parent that is not an object id, or git failing.
pub(super) fn walk_all(remote: &Remote, walks: &mut [Walk]) -> Result<()> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let mut talk = Talk {
        walks,
        asked: VecDeque::new(),
        tx: Some(tx),
        at: At::Header(Vec::new()),
    };
    for i in 0..talk.walks.len() {
        if let Some(head) = talk.walks[i].next_chain() {
            talk.ask(i, &head).map_err(|why| remote.cache_error(&why))?;
        }
    }
    if talk.asked.is_empty() {
        return Ok(());
    }
    let mut failed: Option<String> = None;
    let out =
        remote.local_feeding(
            &["cat-file", "--batch"],
            Feed::Channel(rx),
            &mut |chunk| match talk.feed(chunk) {
                Ok(()) => Flow::More,
                Err(why) => {
                    failed = Some(why);
                    Flow::Stop
                }
            },
        )?;
    if let Some(why) = failed {
        return Err(remote.cache_error(&format!("reading the lock history: {why}")));
    }
    if !out.ok() || !talk.asked.is_empty() {
        return Err(remote.cache_error(&format!(
            "git cat-file of the lock history failed: {}",
            out.stderr.trim()
        )));
    }
    Ok(())
}

/// A commit's parents and the events its message holds (none when the
/// message is larger than any change writes, or was not all kept).
fn parse_commit(kept: &[u8]) -> std::result::Result<(Vec<String>, Vec<Event>), String> {
    // The newline that ends the object is not its content.
    let whole = kept.len() < KEPT;
    let body = if whole {
        kept.strip_suffix(b"\n").unwrap_or(kept)
    } else {
        kept
    };
    let (header, message) = match body.windows(2).position(|w| w == b"\n\n") {
        Some(p) => (&body[..p], Some(&body[p + 2..])),
        None => (body, None),
    };
    let mut parents = Vec::new();
    for line in header.split(|b| *b == b'\n') {
        if let Some(p) = line.strip_prefix(b"parent ") {
            let p = String::from_utf8_lossy(p).into_owned();
            if !is_oid(&p) {
                return Err(format!(
                    "a commit names a parent that is no object id ({p})"
                ));
            }
            parents.push(p);
        }
    }
    let max = usize::try_from(MAX_OBJECT).unwrap_or(usize::MAX);
    let events = match message {
        Some(m) if whole && m.len() <= max => events_in(m),
        _ => Vec::new(),
    };
    Ok((parents, events))
}

/// The history events a commit message holds (one JSON object a line).
pub(super) fn events_in(message: &[u8]) -> Vec<Event> {
    String::from_utf8_lossy(message)
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Event>(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Object id number `n`.
    fn oid(n: usize) -> String {
        format!("{n:040x}")
    }

    #[test]
    fn a_walk_reads_at_most_limit_commits_a_chain_and_the_chains_newest_first() {
        // Commits without events: every chain is read up to `limit` commits.
        let mut w = Walk::new(vec![oid(1), oid(10)], 3);
        assert_eq!(w.next_chain(), Some(oid(1)));
        // The live chain: 1 <- 2 <- 3 <- 4; three commits read, then the archive.
        assert_eq!(w.take(&[oid(2)], Vec::new()), Some(oid(2)));
        assert_eq!(w.take(&[oid(3)], Vec::new()), Some(oid(3)));
        assert_eq!(w.take(&[oid(4)], Vec::new()), Some(oid(10)));
        // The archived chain ends at its root (no parent): the walk is done.
        assert_eq!(w.take(&[], Vec::new()), None);
        assert_eq!(w.into_events().map(|e| e.len()), Some(0));
        // A merge: the lock is left to `git log`.
        let mut w = Walk::new(vec![oid(1)], 3);
        assert_eq!(w.next_chain(), Some(oid(1)));
        assert_eq!(w.take(&[oid(2), oid(3)], Vec::new()), None);
        assert!(w.into_events().is_none());
        // A limit of 0 reads nothing.
        assert_eq!(Walk::new(vec![oid(1)], 0).next_chain(), None);
    }

    #[test]
    fn a_commit_says_its_parents_and_events() {
        let p = "a".repeat(40);
        let c = format!(
            "tree {}\nparent {p}\nauthor a <a> 1 +0000\ncommitter a <a> 1 +0000\n\nskill-lock: x\n\nnot an event\n\nnonce: 1\n\n",
            "b".repeat(40)
        );
        let (parents, events) = parse_commit(c.as_bytes()).unwrap();
        assert_eq!(parents, vec![p]);
        assert!(events.is_empty());
    }
}
