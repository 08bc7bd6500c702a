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
        let mut text = Vec::with_capacity(512 * events.len() + 1);
        if last[0] != b'\n' {
            text.push(b'\n');
        }
        for ev in events {
            serde_json::to_writer(&mut text, ev).map_err(|e| Error::Internal(e.to_string()))?;
            text.push(b'\n');
        }
        f.write_all(&text)
            .map_err(|e| Error::io("append to", &path, e))?;
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
        // The disk bound: two files of at most ROTATE_EVENTS (+1) lines.
        for f in ["history.jsonl", "history.1.jsonl"] {
            let lines = std::fs::read_to_string(t.path().join(f))
                .unwrap()
                .lines()
                .count() as u64;
            assert!(lines <= ROTATE_EVENTS + 1, "{f}: {lines}");
        }
        let mine = h.read(Some(&key), 3).unwrap();
        assert_eq!(
            mine.iter().map(|e| e.fence.unwrap()).collect::<Vec<_>>(),
            [total - 6, total - 4, total - 2]
        );
    }
}
