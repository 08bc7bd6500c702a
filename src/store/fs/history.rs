//! The file store's event history (SPEC §2.8), in `P/run/`.
//!
//! `history.jsonl` holds one JSON object a line, appended under an exclusive
//! `flock` on `history.lock` (so lines never interleave), which the store
//! takes inside the per-lock critical section (so the order of a lock's
//! events is the order of its changes). After [`ROTATE_EVENTS`] lines the
//! file becomes `history.1.jsonl` (replacing the older one), so between
//! [`ROTATE_EVENTS`] and twice that many events are kept, and the disk used
//! is bounded. Every file is opened through the layer handle ([`Dir`]): no
//! link is followed, a FIFO or device is refused, and a read takes at most
//! [`READ_SPAN`] bytes of a file and skips any line longer than
//! [`MAX_LINE`], so a planted huge or endless file costs a bounded read.
//!
//! No append is ever torn, even by SIGKILL: the kernel cuts a buffered
//! write short on a fatal signal only between its page-cache chunks (a
//! page, 4 KiB at least), so each write is kept inside one 4 KiB block of
//! the file, filling the rest of a block with one blank line (spaces, which
//! readers skip) where the next event would cross it. An event is in the
//! file whole or not at all (one longer than a block, which no real event
//! is, could still be cut).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::PathBuf;

use super::dir::{Dir, FileExt, Open};
use crate::error::{Error, Result};
use crate::history::Event;
use crate::key::LockKey;

/// Events per history file before it is rotated.
const ROTATE_EVENTS: u64 = 10_000;
/// The most bytes read from the end of one history file (two files of
/// [`ROTATE_EVENTS`] events of at most one block each fit many times over).
const READ_SPAN: u64 = 64 * 1024 * 1024;
/// A longer line is no event of ours: it is skipped, never held in memory.
const MAX_LINE: usize = 64 * 1024;

const CURRENT: &str = "history.jsonl";
const ROTATED: &str = "history.1.jsonl";
const GUARD: &str = "history.lock";

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

/// Appends events to the history in `run`; the caller holds the lock's
/// critical section.
///
/// # Errors
/// I/O failure, or a planted file where the history belongs; callers
/// report it and carry on (SPEC §2.8).
pub(super) fn append(run: &Dir, events: &[Event]) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let Some(guard) = run.file(GUARD, Open::ReadWriteCreate)? else {
        return Ok(());
    };
    let gpath = run.join(GUARD);
    // Bounded: a process stopped while appending must not stop every lock.
    crate::flock::lock_bounded(&guard, &gpath)?;
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
        None => count_lines(run)?,
    };
    if count >= ROTATE_EVENTS {
        match run.rename(CURRENT, run, ROTATED.as_ref(), false) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("rotate", run.join(CURRENT), e)),
        }
        count = 0;
    }
    let path = run.join(CURRENT);
    let Some(mut f) = run.file(CURRENT, Open::AppendCreate)? else {
        return Ok(());
    };
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
            let mut line = serde_json::to_vec(ev).map_err(|e| Error::Internal(e.to_string()))?;
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

/// Opens history file `name` for reading, positioned at most [`READ_SPAN`]
/// bytes before its end (past the partial line there, if it starts mid-way).
fn open_tail(run: &Dir, name: &str) -> Result<Option<(File, u64)>> {
    let Some(mut f) = run.file(name, Open::Read)? else {
        return Ok(None);
    };
    let path = run.join(name);
    let len = f.metadata().map_err(|e| Error::io("stat", &path, e))?.len();
    let start = len.saturating_sub(READ_SPAN);
    f.seek(SeekFrom::Start(start))
        .map_err(|e| Error::io("read", &path, e))?;
    Ok(Some((f, start)))
}

/// Calls `each` with every line of `file` (without its newline) of at most
/// [`MAX_LINE`] bytes; `partial_first`: the first line may be cut (the read
/// starts mid-file) and is skipped.
fn for_each_line(
    file: File,
    partial_first: bool,
    path: &std::path::Path,
    each: &mut dyn FnMut(&[u8]),
) -> Result<()> {
    let mut r = BufReader::with_capacity(64 * 1024, file);
    let mut line = Vec::new();
    let mut skipping = partial_first;
    loop {
        let buf = r.fill_buf().map_err(|e| Error::io("read", path, e))?;
        if buf.is_empty() {
            if !skipping && !line.is_empty() {
                each(&line);
            }
            return Ok(());
        }
        let (chunk, end) = match memchr::memchr(b'\n', buf) {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if !skipping {
            if line.len() + chunk.len() > MAX_LINE {
                skipping = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = end.unwrap_or(buf.len());
        r.consume(used);
        if end.is_some() {
            if !skipping {
                each(&line);
            }
            line.clear();
            skipping = false;
        }
    }
}

/// The newest `limit` events (for one lock or all), oldest first.
///
/// # Errors
/// I/O failure reading the files, or a planted file where one belongs.
pub(super) fn read(run: &Dir, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
    let Some(guard) = run.file(GUARD, Open::Read)? else {
        return Ok(Vec::new());
    };
    crate::flock::lock_bounded_as(&guard, &run.join(GUARD), true)?;
    let name = key.map(LockKey::name);
    let mut out = VecDeque::with_capacity(limit.min(4096));
    for file in [ROTATED, CURRENT] {
        let Some((f, start)) = open_tail(run, file)? else {
            continue;
        };
        for_each_line(f, start > 0, &run.join(file), &mut |line| {
            let Ok(ev) = serde_json::from_slice::<Event>(line) else {
                return;
            };
            if name.as_ref().is_some_and(|n| *n != ev.lock) {
                return;
            }
            if out.len() == limit {
                out.pop_front();
            }
            if limit > 0 {
                out.push_back(ev);
            }
        })?;
    }
    Ok(out.into())
}

/// The highest fence the newest event of lock `name` in the history names
/// (its own or the holder it replaced), with the file that names it; 0 and
/// `None` when the history knows none.
///
/// Reads backwards from the end of the current file, then the rotated one,
/// parsing only the lines that name the lock, and stops at the first such
/// event with a fence: a lock's fences only grow, so the newest is the
/// highest. The common case (the lock changed lately) reads one block.
///
/// # Errors
/// I/O failure, or a planted file where one belongs.
pub(super) fn newest_fence(run: &Dir, name: &str) -> Result<(u64, Option<PathBuf>)> {
    let needle = format!("\"lock\":{}", serde_json::Value::from(name));
    let finder = memchr::memmem::Finder::new(needle.as_bytes());
    for file in [CURRENT, ROTATED] {
        let Some(f) = run.file(file, Open::Read)? else {
            continue;
        };
        let path = run.join(file);
        let len = f.metadata().map_err(|e| Error::io("stat", &path, e))?.len();
        let floor = len.saturating_sub(READ_SPAN);
        let mut end = len;
        let mut carry: Vec<u8> = Vec::new();
        while end > floor {
            let start = end.saturating_sub(64 * 1024).max(floor);
            let mut chunk = vec![0u8; usize::try_from(end - start).unwrap_or(0)];
            f.read_exact_at(&mut chunk, start)
                .map_err(|e| Error::io("read", &path, e))?;
            chunk.extend_from_slice(&carry);
            // The first line of the chunk may be cut: keep it for the next round.
            let first_nl = if start > floor {
                memchr::memchr(b'\n', &chunk).map_or(chunk.len(), |i| i + 1)
            } else {
                0
            };
            let whole = &chunk[first_nl..];
            for line in whole.rsplit(|&b| b == b'\n') {
                if line.len() > MAX_LINE || finder.find(line).is_none() {
                    continue;
                }
                let Ok(ev) = serde_json::from_slice::<Event>(line) else {
                    continue;
                };
                let fence = [ev.fence, ev.previous.as_ref().map(|h| h.fence)]
                    .into_iter()
                    .flatten()
                    .max();
                if ev.lock == name
                    && let Some(fence) = fence
                {
                    return Ok((fence, Some(path)));
                }
            }
            carry = chunk[..first_nl].to_vec();
            if carry.len() > MAX_LINE {
                carry.clear();
            }
            end = start;
        }
    }
    Ok((0, None))
}

fn count_lines(run: &Dir) -> Result<u64> {
    let Some((f, start)) = open_tail(run, CURRENT)? else {
        return Ok(0);
    };
    let mut n = 0u64;
    for_each_line(f, start > 0, &run.join(CURRENT), &mut |_| n += 1)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::EventKind;
    use crate::record::Timestamp;
    use proptest::prelude::*;
    use std::fs::OpenOptions;

    /// The history of one directory, for tests.
    struct History(Dir);

    impl History {
        fn append(&self, events: &[Event]) -> Result<()> {
            append(&self.0, events)
        }
        fn read(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
            read(&self.0, key, limit)
        }
    }

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
        let h = History(Dir::anchor(t.path()).unwrap().unwrap());
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
        let h = History(Dir::anchor(t.path()).unwrap().unwrap());
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
