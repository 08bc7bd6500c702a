//! Event history (SPEC §2.8): every change of a lock's state, for the
//! operator's question after a doubled post.
//!
//! The file history is `run/history.jsonl`, one JSON object a line, appended
//! under an exclusive `flock` on `run/history.lock` (so lines never
//! interleave), which the stores take inside the per-lock critical section
//! (so the order of a lock's events is the order of its changes). After
//! [`ROTATE_EVENTS`] lines the file becomes `history.1.jsonl` (replacing the
//! older one), so between [`ROTATE_EVENTS`] and twice that many events are
//! kept, and the disk used is bounded. No event ever holds a token.
//!
//! No append is ever torn, even by SIGKILL: the kernel cuts a buffered
//! write short on a fatal signal only between its page-cache chunks (a
//! page, 4 KiB at least), so each write is kept inside one 4 KiB block of
//! the file, filling the rest of a block with one blank line (spaces, which
//! readers skip) where the next event would cross it. An event is in the
//! file whole or not at all (one longer than a block, which no real event
//! is, could still be cut).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::record::{Holder, Timestamp};

/// Events per history file before it is rotated.
pub const ROTATE_EVENTS: u64 = 10_000;

/// The span no single append write crosses (see the module docs).
const BLOCK: u64 = 4096;

/// The writes that append `lines` (each ending in a newline) at file offset
/// `pos`, none crossing a [`BLOCK`] boundary except a single line longer
/// than a block. Where a line would cross, the block is first filled with
/// one blank line. `torn`: the file's last line has no newline (a crash in the
/// middle of an older version's append), which the first write supplies so
/// the torn line never swallows the next event.
fn plan_appends(pos: u64, torn: bool, lines: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut writes = Vec::new();
    let mut start = pos;
    let mut cur: Vec<u8> = if torn { vec![b'\n'] } else { Vec::new() };
    for line in lines {
        let end = start + cur.len() as u64;
        if end.is_multiple_of(BLOCK) && !cur.is_empty() {
            // `cur` fills its block to the end: the next bytes start another.
            writes.push(std::mem::take(&mut cur));
            start = end;
        }
        let room = BLOCK - end % BLOCK;
        let len = line.len() as u64;
        if len <= room {
            cur.extend_from_slice(line);
            continue;
        }
        if len <= BLOCK {
            // Fill this block with one blank line (spaces, then the newline;
            // `cur` is empty or ends in a newline); the line starts the next.
            cur.resize(cur.len() + usize::try_from(room - 1).unwrap_or(0), b' ');
            cur.push(b'\n');
            start = end + room;
            writes.push(std::mem::replace(&mut cur, line.clone()));
        } else {
            start = end + len;
            if !cur.is_empty() {
                writes.push(std::mem::take(&mut cur));
            }
            writes.push(line.clone());
        }
    }
    if !cur.is_empty() {
        writes.push(cur);
    }
    writes
}

/// What happened to a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A run acquired the lock (after a takeover too).
    Acquired,
    /// A stale lock was replaced; `previous` is the holder removed.
    TookOver,
    /// A lease was extended.
    Renewed,
    /// A lock was released by its holder (or without a token).
    Released,
    /// An operator's `--force` removed someone else's lock.
    ForcedRelease,
    /// A release or renew with a token that did not hold the lock.
    Refused,
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When it happened.
    pub time: Timestamp,
    /// What happened.
    pub event: EventKind,
    /// The lock's name (`skill@owner__name`), for filtering.
    pub lock: String,
    /// Skill, as given by the run that made the change.
    pub skill: String,
    /// Repository, as given by the run that made the change.
    pub repo: String,
    /// Fence of the acquisition concerned.
    pub fence: Option<u64>,
    /// Host of the process that made the change.
    pub host: String,
    /// Process that made the change.
    pub pid: u32,
    /// Owner pid of the (new) holder, if any.
    pub owner_pid: Option<u32>,
    /// Note of the (new) holder.
    pub note: Option<String>,
    /// Why: `expired`/`owner_dead`/`corrupt` for a takeover, or what was refused.
    pub reason: Option<String>,
    /// Expiry after an acquire or renewal.
    pub expires: Option<Timestamp>,
    /// The holder that was replaced, released or refused.
    pub previous: Option<Holder>,
}

impl Event {
    /// A new event about `key` made by this process now.
    #[must_use]
    pub fn new(kind: EventKind, key: &LockKey, time: Timestamp, host: &str) -> Self {
        Self {
            time,
            event: kind,
            lock: key.name(),
            skill: key.skill().to_owned(),
            repo: key.repo().to_owned(),
            fence: None,
            host: host.to_owned(),
            pid: std::process::id(),
            owner_pid: None,
            note: None,
            reason: None,
            expires: None,
            previous: None,
        }
    }
}

/// The history files of one file store.
#[derive(Debug, Clone)]
pub struct FileHistory {
    dir: PathBuf,
}

impl FileHistory {
    /// The history kept in directory `dir` (the store's `run/`).
    #[must_use]
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    fn current(&self) -> PathBuf {
        self.dir.join("history.jsonl")
    }

    fn rotated(&self) -> PathBuf {
        self.dir.join("history.1.jsonl")
    }

    fn guard(&self, create: bool) -> Result<Option<File>> {
        let path = self.dir.join("history.lock");
        match OpenOptions::new()
            .read(true)
            .write(create)
            .create(create)
            .mode(0o600)
            .open(&path)
        {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => Ok(None),
            Err(e) => Err(Error::io("open", path, e)),
        }
    }

    /// Appends events; the caller holds the lock's critical section.
    ///
    /// # Errors
    /// I/O failure; callers report it and carry on (SPEC §2.8).
    pub fn append(&self, events: &[Event]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let Some(guard) = self.guard(true)? else {
            return Ok(());
        };
        let gpath = self.dir.join("history.lock");
        // Bounded: a process stopped while appending must not stop every lock.
        crate::store::fs::lock_bounded(&guard, &gpath)?;
        // The guard file holds the number of lines in the current file.
        let mut buf = [0u8; 20];
        let n = guard
            .read_at(&mut buf, 0)
            .map_err(|e| Error::io("read", &gpath, e))?;
        let counted = std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        let mut count = match counted {
            Some(c) => c,
            None => count_lines(&self.current())?,
        };
        if count >= ROTATE_EVENTS {
            match std::fs::rename(self.current(), self.rotated()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("rotate", self.current(), e)),
            }
            count = 0;
        }
        let path = self.current();
        let mut f = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        // A line cut short by a crash must not swallow the next event.
        let len = f.metadata().map_err(|e| Error::io("stat", &path, e))?.len();
        let mut last = [b'\n'];
        if len > 0 {
            f.read_exact_at(&mut last, len - 1)
                .map_err(|e| Error::io("read", &path, e))?;
        }
        let lines = events
            .iter()
            .map(|ev| {
                let mut line =
                    serde_json::to_vec(ev).map_err(|e| Error::Internal(e.to_string()))?;
                line.push(b'\n');
                Ok(line)
            })
            .collect::<Result<Vec<_>>>()?;
        for write in plan_appends(len, last[0] != b'\n', &lines) {
            f.write_all(&write)
                .map_err(|e| Error::io("append to", &path, e))?;
        }
        count += events.len() as u64;
        guard
            .write_all_at(format!("{count:<20}").as_bytes(), 0)
            .map_err(|e| Error::io("write", &gpath, e))?;
        Ok(())
    }

    /// The newest `limit` events (for one lock or all), oldest first.
    ///
    /// # Errors
    /// I/O failure reading the files.
    pub fn read(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        let Some(guard) = self.guard(false)? else {
            return Ok(Vec::new());
        };
        crate::store::fs::lock_bounded_as(&guard, &self.dir.join("history.lock"), true)?;
        let name = key.map(LockKey::name);
        let mut out = std::collections::VecDeque::with_capacity(limit.min(4096));
        for path in [self.rotated(), self.current()] {
            let f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("open", path, e)),
            };
            for line in BufReader::new(f).split(b'\n') {
                let line = line.map_err(|e| Error::io("read", &path, e))?;
                let Ok(ev) = serde_json::from_slice::<Event>(&line) else {
                    continue;
                };
                if name.as_ref().is_some_and(|n| *n != ev.lock) {
                    continue;
                }
                if out.len() == limit {
                    out.pop_front();
                }
                if limit > 0 {
                    out.push_back(ev);
                }
            }
        }
        Ok(out.into())
    }
}

fn count_lines(path: &Path) -> Result<u64> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io("open", path, e)),
    };
    f.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io("read", path, e))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        let got = f.read(&mut buf).map_err(|e| Error::io("read", path, e))?;
        if got == 0 {
            return Ok(n);
        }
        n += buf[..got].iter().filter(|&&b| b == b'\n').count() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The planned writes carry every line, in order, whole (blank
        /// padding aside), and no write crosses a block boundary unless it
        /// is one line longer than a block.
        #[test]
        fn appends_never_cross_a_block_and_carry_every_line(
            pos in 0u64..20_000,
            torn in any::<bool>(),
            lens in proptest::collection::vec(1usize..6000, 0..12),
        ) {
            let lines: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let mut l = vec![b'a' + u8::try_from(i % 26).unwrap(); n];
                    l.push(b'\n');
                    l
                })
                .collect();
            let writes = plan_appends(pos, torn, &lines);
            let mut at = pos;
            for w in &writes {
                let len = w.len() as u64;
                let inside = at % BLOCK + len <= BLOCK;
                prop_assert!(inside || lines.contains(w), "write of {len} at {at}");
                at += len;
            }
            let all: Vec<u8> = writes.concat();
            if torn {
                prop_assert_eq!(all.first(), Some(&b'\n'));
            }
            let got: Vec<&[u8]> = all
                .split(|&b| b == b'\n')
                .filter(|l| l.iter().any(|&b| b != b' '))
                .collect();
            let want: Vec<&[u8]> = lines.iter().map(|l| &l[..l.len() - 1]).collect();
            prop_assert_eq!(got, want);
        }
    }

    /// In the file itself, no event straddles a 4 KiB block, so no SIGKILL
    /// can leave half of one.
    #[test]
    fn no_event_in_the_file_crosses_a_block() {
        let t = tempfile::tempdir().unwrap();
        let h = FileHistory::new(t.path());
        let key = LockKey::new("s", "o/r").unwrap();
        for i in 0..300u64 {
            let mut ev = Event::new(EventKind::Acquired, &key, Timestamp(0), "h");
            ev.fence = Some(i);
            ev.note = Some("n".repeat(usize::try_from(i * 7 % 900).unwrap()));
            h.append(&[ev.clone(), ev]).unwrap();
        }
        let text = std::fs::read(t.path().join("history.jsonl")).unwrap();
        let mut at = 0u64;
        let mut events = 0;
        for line in text.split_inclusive(|&b| b == b'\n') {
            let end = at + line.len() as u64;
            if line.iter().any(|&b| !b" \n".contains(&b)) {
                assert_eq!(at / BLOCK, (end - 1) / BLOCK, "event at {at}..{end}");
                events += 1;
            }
            at = end;
        }
        assert_eq!(events, 600);
        assert_eq!(h.read(None, usize::MAX).unwrap().len(), 600);
    }

    #[test]
    fn rotates_and_keeps_at_least_the_bound() {
        let t = tempfile::tempdir().unwrap();
        let h = FileHistory::new(t.path());
        let key = LockKey::new("s", "o/r").unwrap();
        let other = LockKey::new("s", "o/other").unwrap();
        let total = 50_000;
        for i in 0..total {
            let mut ev = Event::new(
                EventKind::Acquired,
                if i % 2 == 0 { &key } else { &other },
                Timestamp(0),
                "h",
            );
            ev.fence = Some(i);
            h.append(&[ev]).unwrap();
        }
        let all = h.read(None, usize::MAX).unwrap();
        assert!(all.len() as u64 >= ROTATE_EVENTS && all.len() as u64 <= 2 * ROTATE_EVENTS + 1);
        assert_eq!(all.last().unwrap().fence, Some(total - 1));
        assert!(all.windows(2).all(|w| w[0].fence < w[1].fence));
        // A torn last line (a crash mid-append) does not swallow the next event.
        let mut f = OpenOptions::new()
            .append(true)
            .open(t.path().join("history.jsonl"))
            .unwrap();
        f.write_all(b"{\"time\":\"2026-").unwrap();
        let mut ev = Event::new(EventKind::Released, &other, Timestamp(0), "h");
        ev.fence = Some(u64::MAX);
        h.append(&[ev]).unwrap();
        assert_eq!(h.read(None, 1).unwrap()[0].fence, Some(u64::MAX));
        // The disk bound: two files of at most ROTATE_EVENTS (+1) events,
        // and blank padding at most one line per 4 KiB block.
        for f in ["history.jsonl", "history.1.jsonl"] {
            let text = std::fs::read_to_string(t.path().join(f)).unwrap();
            let events = text.lines().filter(|l| !l.trim().is_empty()).count() as u64;
            assert!(events <= ROTATE_EVENTS + 1, "{f}: {events}");
            let blank = text.lines().filter(|l| l.trim().is_empty()).count() as u64;
            assert!(
                blank <= text.len() as u64 / BLOCK + 1,
                "{f}: {blank} blank lines"
            );
        }
        let mine = h.read(Some(&key), 3).unwrap();
        assert_eq!(
            mine.iter().map(|e| e.fence.unwrap()).collect::<Vec<_>>(),
            [total - 6, total - 4, total - 2]
        );
    }
}
