//! What a chaos run observed: the witness (who wrote under which fence,
//! believing its lease valid until when), checked for two holders at once
//! and for fences going back; named counters; the violations found.

use std::collections::BTreeMap;
use std::fs::File;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

/// One write a holder made believing it held `lock` under `fence`, from
/// `enter` to `exit` ([`boot_ns`]), its lease valid (as far as it could be
/// sure) until `believed` ([`Mark::UNCHECKED`] for a writer that never checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub lock: usize,
    pub fence: u64,
    pub holder: usize,
    pub enter: u64,
    pub exit: u64,
    pub believed: u64,
}

impl Mark {
    /// `believed` of a writer that never checks (`run`'s command): only the
    /// tool keeps it from writing unprotected, so its writes always count.
    pub const UNCHECKED: u64 = u64::MAX;

    /// Its line in the witness file.
    pub fn line(&self) -> String {
        format!(
            "{} {} {} {} {} {}\n",
            self.lock, self.fence, self.holder, self.enter, self.exit, self.believed
        )
    }

    /// A line of the witness file read back.
    pub fn parse(line: &str) -> Option<Self> {
        let f: Vec<u64> = line
            .split(' ')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [lock, fence, holder, enter, exit, believed] = f[..] else {
            return None;
        };
        Some(Self {
            lock: usize::try_from(lock).ok()?,
            fence,
            holder: usize::try_from(holder).ok()?,
            enter,
            exit,
            believed,
        })
    }

    /// Did the write end while its writer still believed its lease valid?
    pub fn believed_valid(&self) -> bool {
        self.exit <= self.believed
    }
}

impl AsRef<Self> for Mark {
    fn as_ref(&self) -> &Self {
        self
    }
}

/// The witness file: one `O_APPEND` line per write, from every process.
pub struct Witness {
    path: PathBuf,
}

impl Witness {
    /// An empty witness file at `path`.
    pub fn create(path: PathBuf) -> Self {
        File::create(&path).expect("witness file");
        Self { path }
    }

    /// Where it is (for a writer in another process).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A writer's own handle (append mode: whole lines never interleave).
    pub fn pen(&self) -> Pen {
        Pen::append(&self.path)
    }

    /// Every line, in write order.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.path)
            .expect("witness file")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Every mark, and the lines that are none (numbered from 1).
    pub fn marks(&self) -> (Vec<Mark>, Vec<String>) {
        let mut bad = Vec::new();
        let mut marks = Vec::new();
        for (n, line) in self.lines().iter().enumerate() {
            match Mark::parse(line) {
                Some(m) => marks.push(m),
                None => bad.push(format!("witness line {} unreadable: {line:?}", n + 1)),
            }
        }
        (marks, bad)
    }

    /// Its size in bytes (to see whether anything still writes).
    pub fn len(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }
}

/// One writer's handle on the witness file.
pub struct Pen(File);

impl Pen {
    /// The witness file at `path` opened for appending (by a writer in
    /// another process too).
    pub fn append(path: &Path) -> Self {
        Self(
            OpenOptions::new()
                .append(true)
                .open(path)
                .expect("witness file"),
        )
    }

    /// Appends `m`'s line.
    pub fn write(&mut self, m: &Mark) {
        self.raw(&m.line());
    }

    /// Appends a line of another shape (a shell writer's, say).
    pub fn raw(&mut self, line: &str) {
        self.0.write_all(line.as_bytes()).expect("witness write");
    }
}

/// Writes of one lock by two holders (fence or holder differ) in flight at
/// once, as (the one entered first, the other): the candidates for two
/// holders at once, for the test to judge.
pub fn overlaps<T: AsRef<Mark>>(writes: &[T]) -> Vec<(&T, &T)> {
    let mut sorted: Vec<&T> = writes.iter().collect();
    sorted.sort_by_key(|w| (w.as_ref().lock, w.as_ref().enter));
    let mut out = Vec::new();
    let mut active: Vec<&T> = Vec::new();
    for b in sorted {
        let m = b.as_ref();
        active.retain(|a| a.as_ref().lock == m.lock && a.as_ref().exit > m.enter);
        for a in &active {
            let n = a.as_ref();
            if (n.fence, n.holder) != (m.fence, m.holder) {
                out.push((*a, b));
            }
        }
        active.push(b);
    }
    out
}

/// Writes of one lock that began after a write of a later fence had ended,
/// as (that write of the latest such fence, the write): in write order
/// fences went backwards.
pub fn regressions(writes: &[Mark]) -> Vec<(Mark, Mark)> {
    let mut per_lock: BTreeMap<usize, Vec<Mark>> = BTreeMap::new();
    for w in writes {
        per_lock.entry(w.lock).or_default().push(*w);
    }
    let mut out = Vec::new();
    for mut ws in per_lock.into_values() {
        ws.sort_by_key(|w| w.enter);
        let mut by_exit = ws.clone();
        by_exit.sort_by_key(|w| w.exit);
        let (mut done, mut max) = (0, None::<Mark>);
        for b in &ws {
            while done < by_exit.len() && by_exit[done].exit <= b.enter {
                if max.is_none_or(|m| by_exit[done].fence > m.fence) {
                    max = Some(by_exit[done]);
                }
                done += 1;
            }
            if let Some(m) = max.filter(|m| m.fence > b.fence) {
                out.push((m, *b));
            }
        }
    }
    out
}

// ----------------------------------------------------------------- stats

/// Named counters, shared by every thread of a run, printed in the order
/// they were declared.
pub struct Stats {
    names: &'static [&'static str],
    counts: Vec<AtomicU64>,
}

impl Stats {
    /// Counters `names`, all zero.
    pub fn new(names: &'static [&'static str]) -> Self {
        Self {
            names,
            counts: names.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[track_caller]
    fn slot(&self, name: &str) -> &AtomicU64 {
        let i = self.names.iter().position(|n| *n == name);
        &self.counts[i.unwrap_or_else(|| panic!("no counter {name:?}"))]
    }

    /// Adds one to `name`.
    #[track_caller]
    pub fn bump(&self, name: &str) {
        self.add(name, 1);
    }

    /// Adds `n` to `name`.
    #[track_caller]
    pub fn add(&self, name: &str, n: u64) {
        self.slot(name).fetch_add(n, Ordering::Relaxed);
    }

    /// Raises `name` to `v` if below; its value before.
    #[track_caller]
    pub fn max(&self, name: &str, v: u64) -> u64 {
        self.slot(name).fetch_max(v, Ordering::Relaxed)
    }

    /// The value of `name` now.
    #[track_caller]
    pub fn count(&self, name: &str) -> u64 {
        self.slot(name).load(Ordering::Relaxed)
    }

    /// Adds every counter of `other` (the same names) to this one.
    pub fn merge(&self, other: &Self) {
        for name in other.names {
            self.add(name, other.count(name));
        }
    }

    /// `name=value` of every counter, in order.
    pub fn line(&self) -> String {
        self.names
            .iter()
            .map(|n| format!("{n}={}", self.count(n)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Violations of one run, each printed as it is found.
pub struct Violations {
    tag: &'static str,
    found: Mutex<Vec<String>>,
}

impl Violations {
    /// None yet; each is printed after `tag`.
    pub fn new(tag: &'static str) -> Self {
        Self {
            tag,
            found: Mutex::new(Vec::new()),
        }
    }

    /// Records (and prints) one.
    pub fn add(&self, what: String) {
        eprintln!("{}: VIOLATION: {what}", self.tag);
        self.found.lock().unwrap().push(what);
    }

    /// Every one so far, leaving none.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.found.lock().unwrap())
    }
}

/// Fails with the first `n` violations, naming the seed, when there are any.
#[track_caller]
pub fn assert_none(violations: &[String], n: usize, seed: u64, what: &str) {
    assert!(
        violations.is_empty(),
        "{what} (seed {seed}): {} violations; first ones:\n{}",
        violations.len(),
        violations
            .iter()
            .take(n)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_witness_finds_two_holders_at_once_and_fences_going_back() {
    let m = |lock, fence, holder, enter, exit| Mark {
        lock,
        fence,
        holder,
        enter,
        exit,
        believed: Mark::UNCHECKED,
    };
    // Overlapping writes of two holders of lock 0; one holder's own writes
    // and another lock's never count.
    let writes = [
        m(0, 1, 0, 0, 10),
        m(0, 2, 1, 5, 15),
        m(0, 2, 1, 12, 20),
        m(1, 7, 2, 0, 30),
    ];
    let pairs: Vec<(u64, u64)> = overlaps(&writes)
        .iter()
        .map(|(a, b)| (a.enter, b.enter))
        .collect();
    assert_eq!(pairs, [(0, 5)]);
    // Fence 1 written after fence 2 had finished: backwards.
    let back = [m(0, 2, 0, 0, 10), m(0, 1, 1, 20, 30), m(0, 3, 1, 40, 50)];
    let found: Vec<(u64, u64)> = regressions(&back)
        .iter()
        .map(|(later, b)| (later.fence, b.fence))
        .collect();
    assert_eq!(found, [(2, 1)]);
}
