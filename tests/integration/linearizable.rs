//! Linearizability of one lock under faults (issue 20; how to read it and
//! the figures are in `docs/stress.md`).
//!
//! Several worker threads run the real binary against the same locks:
//! acquire, renew, release, check and status, each with the token it holds
//! (or an old one). Meanwhile a fault thread SIGKILLs clients in the middle
//! of their call and, on etcd, freezes the member (a proxy that holds every
//! byte, both ways, for a while: what a SIGSTOPped member looks like, late
//! requests included) or cuts every connection; on git it cuts the
//! connections to a loopback `git daemon` through the same kind of proxy.
//! A killed call, and a change that answered `error`, is an operation whose
//! outcome is unknown: it may have taken effect at any point after it was
//! invoked, or never. A read with no answer is dropped.
//!
//! The history is then checked by stateright's `LinearizabilityTester` (an
//! independent checker; only the sequential model below is ours) against a
//! sequential lock: tokens are fresh, fences strictly increase, renew,
//! release and check answer from the holder, and **lease expiry**: the lock
//! may be taken over, or found free, only once the lease the holder was
//! last told (`expires` of its acquire or renew) has run out, judged on the
//! wall clock of this machine, which every process here shares. A reader
//! may call the lease gone (`check` saying `expired`, `status` saying
//! `stale`) at most one second earlier, the second etcd's truncation of the
//! remaining time can cost, or when the owner is certainly dead (SPEC §8);
//! a reader racing a release answers held or free. The workers draw an
//! hour-long ttl too, so such a lie cannot hide in a short lease's window.
//! Linearizability is local (Herlihy and Wing), so each lock's history is
//! checked on its own: the workers move to a new lock every few seconds, or
//! sooner after 150 calls or four changes of unknown outcome on it, which keeps each history
//! small enough for the checker's search even on a loaded machine.
//!
//! The checker is shown to catch a planted bug: the same model and driver
//! over an in-memory store inside this test that skips the compare-and-swap
//! (it decides on a read and writes without checking the lock is as it
//! read it) must be found non-linearizable, and the same store with the
//! compare-and-swap must pass. The planted store exists only in this test.
//!
//! Short mode (in `cargo test`): `SKILL_LOCK_LIN_SECS` (default 8) seconds of
//! load per store. Long mode: `SKILL_LOCK_LIN_SECS=120`. The etcd half needs
//! `SKILL_LOCK_TEST_ETCD`; it is skipped visibly without it (a failure under
//! `SKILL_LOCK_TEST_ETCD_REQUIRED`). Each run prints its ops, unknown ops,
//! faults and verdict per store.
//!
//! Covers: SPEC §7, §8.

use crate::harness;

use harness::chaos::{self, Invoke, Proxy, Rng, Seed, Slot, boot_ns};
use harness::{Lock, Reply};
use harness::{TestEnv, wall_ms};
use skill_lock::record::Timestamp;
use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// The sequential model.

/// One call, as the client made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Acquire {
        ttl: u64,
        inv_ms: i64,
    },
    Renew {
        token: String,
        ttl: u64,
        inv_ms: i64,
    },
    Release {
        token: String,
    },
    Check {
        token: String,
    },
    Status,
}

/// What the call answered (`ret_ms`: when its answer came, wall clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    Acquired {
        token: String,
        fence: u64,
        expires_ms: i64,
        ret_ms: i64,
    },
    AlreadyRunning {
        fence: Option<u64>,
    },
    Renewed {
        fence: u64,
        expires_ms: i64,
    },
    /// renew, check: another token holds it.
    NotOwner {
        fence: Option<u64>,
    },
    /// renew, release, check: no lock.
    NotHeld {
        ret_ms: i64,
    },
    Released {
        fence: Option<u64>,
    },
    Refused {
        fence: Option<u64>,
    },
    Held {
        fence: u64,
    },
    /// check: the holder's lease is gone (or its owner is dead).
    Expired {
        ret_ms: i64,
        owner_dead: bool,
    },
    StatusHeld {
        fence: Option<u64>,
    },
    StatusStale {
        fence: Option<u64>,
        ret_ms: i64,
        owner_dead: bool,
    },
    StatusFree {
        ret_ms: i64,
    },
    /// The answer of an operation whose outcome is unknown.
    Unknown,
}

/// A holder as the model knows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Holder {
    /// None: an acquisition whose answer nobody got (its token is unknown).
    token: Option<String>,
    /// None until an answer names it (an unknown acquisition's).
    fence: Option<u64>,
    /// The lease's end as its holder was last told (a lower bound of the
    /// cluster's); i64::MIN when nobody was told.
    expires_ms: i64,
    /// A renewal of it whose answer nobody got may have revived it under
    /// a new fence (SPEC §2.2): the next fence shown may be a new one.
    may_revive: bool,
}

/// The lock, sequentially.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct LockModel {
    holder: Option<Holder>,
    /// The greatest fence handed out that an answer showed.
    last_fence: u64,
}

impl LockModel {
    /// Could the lease of the holder have run out by `at_ms`? (Never
    /// before the `expires` its holder was told.)
    fn gone_by(&self, at_ms: i64) -> bool {
        self.holder.as_ref().is_none_or(|h| at_ms >= h.expires_ms)
    }

    /// May a reader answering at `at_ms` call the holder's lease gone
    /// (`stale`, `expired`)? Only within the second before the `expires`
    /// its holder was told (etcd truncates the remaining time to whole
    /// seconds), or when its owner is certainly dead (SPEC §8): never while
    /// a release races it, never early.
    fn may_look_gone(&self, at_ms: i64, owner_dead: bool) -> bool {
        owner_dead
            || self
                .holder
                .as_ref()
                .is_none_or(|h| at_ms >= h.expires_ms.saturating_sub(TRUNCATION_MS))
    }

    fn holds(&self, token: &str) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|h| h.token.as_deref() == Some(token))
    }

    /// An answer naming the holder's fence (None: it named none): equal to
    /// the one known, or, for an unknown acquisition, learnt now (above
    /// every fence before it).
    fn fence_is(&mut self, fence: Option<u64>) -> bool {
        let Some(h) = self.holder.as_mut() else {
            return false;
        };
        match (h.fence, fence) {
            (_, None) => true,
            (Some(known), Some(f)) if known == f => true,
            // A renewal whose answer was lost revived it.
            (Some(_), Some(f)) if h.may_revive && f > self.last_fence => {
                h.fence = Some(f);
                h.may_revive = false;
                self.last_fence = f;
                true
            }
            (Some(_), Some(_)) => false,
            (None, Some(f)) if f > self.last_fence => {
                h.fence = Some(f);
                self.last_fence = f;
                true
            }
            (None, Some(_)) => false,
        }
    }
}

impl SequentialSpec for LockModel {
    type Op = Op;
    type Ret = Ret;

    /// The effect of an operation whose outcome is unknown, had it taken
    /// effect (the checker also tries it never having done so).
    fn invoke(&mut self, op: &Op) -> Ret {
        match op {
            Op::Acquire { .. } => {
                self.holder = Some(Holder {
                    token: None,
                    fence: None,
                    expires_ms: i64::MIN,
                    may_revive: false,
                });
            }
            Op::Renew { token, ttl, inv_ms } if self.holds(token) => {
                if let Some(h) = self.holder.as_mut() {
                    // Renewed at some point after it was invoked: its lease
                    // reaches at least this far (etcd rounds down to the second).
                    let at_least = inv_ms + i64::try_from(*ttl).unwrap() * 1000 - 1000;
                    h.expires_ms = h.expires_ms.max(at_least);
                    h.may_revive = true;
                }
            }
            Op::Release { token } if self.holds(token) => self.holder = None,
            _ => {}
        }
        Ret::Unknown
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        match (op, ret) {
            (
                Op::Acquire { .. },
                Ret::Acquired {
                    token,
                    fence,
                    expires_ms,
                    ret_ms,
                },
            ) => {
                let above = self
                    .holder
                    .as_ref()
                    .and_then(|h| h.fence)
                    .map_or(self.last_fence, |f| f.max(self.last_fence));
                if !self.gone_by(*ret_ms) || *fence <= above {
                    return false;
                }
                self.holder = Some(Holder {
                    token: Some(token.clone()),
                    fence: Some(*fence),
                    expires_ms: *expires_ms,
                    may_revive: false,
                });
                self.last_fence = *fence;
                true
            }
            (Op::Acquire { .. }, Ret::AlreadyRunning { fence }) => self.fence_is(*fence),
            (Op::Renew { token, .. }, Ret::Renewed { fence, expires_ms }) => {
                if !self.holds(token) {
                    return false;
                }
                // A renewal decided when a reader may already call the
                // lease stale (the second before the end its holder was
                // told, or later) revives it under a new fence (SPEC §2.2).
                // (When exactly it was decided is not known here: a store
                // may grant more than the ttl asked; a new fence above every
                // other is its mark.)
                let revives = *fence > self.last_fence;
                if revives {
                    self.last_fence = *fence;
                    if let Some(h) = self.holder.as_mut() {
                        h.fence = Some(*fence);
                    }
                } else if !self.fence_is(Some(*fence)) {
                    return false;
                }
                if let Some(h) = self.holder.as_mut() {
                    h.expires_ms = *expires_ms;
                }
                true
            }
            (Op::Renew { token, .. } | Op::Check { token }, Ret::NotOwner { fence }) => {
                self.holder.is_some() && !self.holds(token) && self.fence_is(*fence)
            }
            (Op::Renew { .. } | Op::Release { .. } | Op::Check { .. }, Ret::NotHeld { ret_ms }) => {
                self.gone_by(*ret_ms)
            }
            (Op::Release { token }, Ret::Released { fence }) => {
                if !self.holds(token) || !self.fence_is(*fence) {
                    return false;
                }
                self.holder = None;
                true
            }
            (Op::Release { token }, Ret::Refused { fence }) => {
                self.holder.is_some() && !self.holds(token) && self.fence_is(*fence)
            }
            (Op::Check { token }, Ret::Held { fence }) => {
                self.holds(token) && self.fence_is(Some(*fence))
            }
            // Conservative, within the truncation window only: the holder
            // is told its lease is gone.
            (Op::Check { token }, Ret::Expired { ret_ms, owner_dead }) => {
                self.holds(token) && self.may_look_gone(*ret_ms, *owner_dead)
            }
            (Op::Status, Ret::StatusHeld { fence }) => {
                self.holder.is_some() && self.fence_is(*fence)
            }
            (
                Op::Status,
                Ret::StatusStale {
                    fence,
                    ret_ms,
                    owner_dead,
                },
            ) => {
                self.holder.is_some()
                    && self.may_look_gone(*ret_ms, *owner_dead)
                    && self.fence_is(*fence)
            }
            (Op::Status, Ret::StatusFree { ret_ms }) => self.gone_by(*ret_ms),
            _ => false,
        }
    }
}

// ---------------------------------------------------------------------------
// Histories and the verdict.

/// How much earlier than the `expires` its holder was told a reader may
/// call a lease gone: the second etcd's truncation of the remaining time
/// can cost (SPEC §8).
const TRUNCATION_MS: i64 = 1000;

/// One call in a history.
#[derive(Clone, Debug)]
pub struct Call {
    /// The client that made it (its calls are in program order).
    pub worker: usize,
    pub lock: String,
    pub op: Op,
    pub invoked: Instant,
    /// None: killed, or an error (outcome unknown).
    pub answer: Option<(Ret, Instant)>,
}

/// What a history came to.
#[derive(Debug, Default)]
pub struct Verdict {
    pub ops: usize,
    pub unknown: usize,
    pub locks: usize,
    /// The first lock whose history is not linearizable, with its calls.
    pub violation: Option<String>,
}

fn is_change(op: &Op) -> bool {
    matches!(
        op,
        Op::Acquire { .. } | Op::Renew { .. } | Op::Release { .. }
    )
}

/// Seconds the checker may search one lock's history.
const LOCK_BOUND_SECS: u64 = 120;

/// Checks every lock's history on its own.
pub fn verdict(calls: &[Call]) -> Verdict {
    let mut by_lock: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for c in calls {
        by_lock.entry(&c.lock).or_default().push(c);
    }
    let mut v = Verdict {
        locks: by_lock.len(),
        ..Verdict::default()
    };
    // Tokens are fresh: no token is handed out twice, on any lock.
    let mut tokens = std::collections::HashSet::new();
    for c in calls {
        if let Some((Ret::Acquired { token, .. }, _)) = &c.answer
            && !tokens.insert(token.clone())
        {
            v.violation = Some(format!("token {token} was handed out twice"));
        }
    }
    for (lock, calls) in by_lock {
        // Events in real time. A checker thread is a run of one client's
        // answered calls, up to one whose outcome is unknown (the client then
        // goes on as a new thread), numbered in the order the runs began,
        // which the search tries first.
        let mut calls = calls;
        calls.sort_by_key(|c| c.invoked);
        let mut events: Vec<(Instant, bool, usize)> = Vec::new();
        let mut kept = Vec::new();
        let mut tids = Vec::new();
        let mut current: BTreeMap<usize, usize> = BTreeMap::new();
        let mut next_tid = 0;
        for c in calls {
            if c.answer.is_none() && !is_change(&c.op) {
                continue; // a read with no answer changed nothing
            }
            let i = kept.len();
            let tid = if c.answer.is_none() {
                // In flight for ever, on a thread of its own numbered after
                // every answered one: the search tries it only when the
                // answered calls cannot go on without it. The client's order
                // is kept by real time (its earlier calls had answered).
                current.remove(&c.worker);
                1_000_000 + i
            } else {
                *current.entry(c.worker).or_insert_with(|| {
                    next_tid += 1;
                    next_tid
                })
            };
            kept.push(c);
            tids.push(tid);
            events.push((c.invoked, false, i));
            if let Some((_, at)) = &c.answer {
                events.push((*at, true, i));
            }
        }
        events.sort_by_key(|(t, ret, _)| (*t, !*ret));
        let mut tester = LinearizabilityTester::new(LockModel::default());
        for (_, is_ret, i) in &events {
            let c = kept[*i];
            let tid = tids[*i];
            let step = if *is_ret {
                tester
                    .on_return(tid, c.answer.as_ref().unwrap().0.clone())
                    .map(|_| ())
            } else {
                tester.on_invoke(tid, c.op.clone()).map(|_| ())
            };
            step.unwrap();
        }
        v.ops += kept.len();
        v.unknown += kept.iter().filter(|c| c.answer.is_none()).count();
        if v.violation.is_some() {
            continue;
        }
        // The search is exponential at worst: each lock gets a bound, and
        // a lock it cannot decide in time is reported with its history.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .stack_size(1 << 30)
            .spawn(move || {
                let _ = tx.send(tester.is_consistent());
            })
            .unwrap();
        let outcome = match rx.recv_timeout(Duration::from_secs(LOCK_BOUND_SECS)) {
            Ok(true) => continue,
            Ok(false) => "is not linearizable",
            Err(_) => "was not decided within the checker's bound",
        };
        {
            let t0 = kept.first().map(|c| c.invoked).unwrap();
            let ms = |t: Instant| t.duration_since(t0).as_millis();
            let lines: Vec<String> = kept
                .iter()
                .map(|c| match &c.answer {
                    Some((r, at)) => {
                        format!(
                            "  {:>6}..{:<6} ms {:?} -> {r:?}",
                            ms(c.invoked),
                            ms(*at),
                            c.op
                        )
                    }
                    None => format!("  {:>6}..       ms {:?} -> unknown", ms(c.invoked), c.op),
                })
                .collect();
            v.violation = Some(format!(
                "the history of {lock} {outcome}:\n{}",
                lines.join("\n")
            ));
        }
    }
    v
}

// ---------------------------------------------------------------------------
// Driving the real binary.

fn ms_of(time: &str) -> i64 {
    Timestamp::parse(time).map_or(i64::MIN, |t| t.0 * 1000)
}

/// The answer of one invocation, read as the model's (from its typed
/// mirror: the exit status the one its result means).
fn read_answer(op: &Op, code: i32, reply: &Reply, ret_ms: i64) -> Option<Ret> {
    let fence_of = |h: &Option<harness::Holder>| h.as_ref().map(|h| h.fence);
    let owner_dead = |reason: Option<&str>| reason == Some("owner_dead");
    Some(match (op, code, reply) {
        (
            Op::Acquire { .. },
            0,
            Reply::Acquired {
                token,
                fence,
                expires,
                ..
            },
        ) => Ret::Acquired {
            token: token.clone(),
            fence: *fence,
            expires_ms: ms_of(expires),
            ret_ms,
        },
        (Op::Acquire { .. }, 3, Reply::AlreadyRunning { holder, .. }) => Ret::AlreadyRunning {
            fence: Some(holder.fence),
        },
        (Op::Renew { .. }, 0, Reply::Renewed { fence, expires, .. }) => Ret::Renewed {
            fence: *fence,
            expires_ms: ms_of(expires),
        },
        (Op::Renew { .. } | Op::Check { .. }, 4, Reply::NotOwner { holder, .. }) => Ret::NotOwner {
            fence: fence_of(holder),
        },
        (Op::Renew { .. } | Op::Check { .. }, 4, Reply::NotHeld { .. })
        | (Op::Release { .. }, 0, Reply::NotHeld { .. }) => Ret::NotHeld { ret_ms },
        (Op::Release { .. }, 0, Reply::Released { holder, .. }) => Ret::Released {
            fence: fence_of(holder),
        },
        (Op::Release { .. }, 4, Reply::Refused { holder, .. }) => Ret::Refused {
            fence: fence_of(holder),
        },
        (Op::Check { .. }, 0, Reply::Held { fence, .. }) => Ret::Held { fence: *fence },
        (Op::Check { .. }, 4, Reply::Expired { stale_reason, .. }) => Ret::Expired {
            ret_ms,
            owner_dead: owner_dead(Some(stale_reason)),
        },
        (
            Op::Status,
            0,
            Reply::Status {
                state,
                holder,
                stale_reason,
                ..
            },
        ) => match state.as_str() {
            "held" => Ret::StatusHeld {
                fence: fence_of(holder),
            },
            "stale" => Ret::StatusStale {
                fence: fence_of(holder),
                ret_ms,
                owner_dead: owner_dead(stale_reason.as_deref()),
            },
            "free" => Ret::StatusFree { ret_ms },
            _ => return None,
        },
        _ => return None,
    })
}

/// Where the workers run: a command line for the store under test.
pub struct Target {
    pub name: &'static str,
    /// The lock of this name (`--repo o/r`) in the store under test.
    pub make: Box<dyn Fn(&str) -> Lock + Send + Sync>,
    /// The ttls the workers ask for.
    pub ttls: Vec<u64>,
    /// How long each lock is used before the workers move to the next
    /// (shorter where many calls end unknown: the checker's search grows
    /// with them).
    pub epoch: Duration,
    /// Mean time between two faults.
    pub fault_every: Duration,
}

/// Runs one call; None when it was killed or answered an error.
fn run_call(target: &Target, slot: &Slot, op: &Op, lock: &str) -> (Option<Ret>, Instant) {
    let (verb, token, ttl) = match op {
        Op::Acquire { ttl, .. } => ("acquire", None, Some(ttl)),
        Op::Renew { token, ttl, .. } => ("renew", Some(token), Some(ttl)),
        Op::Release { token } => ("release", Some(token), None),
        Op::Check { token } => ("check", Some(token), None),
        Op::Status => ("status", None, None),
    };
    let ttl = ttl.map(u64::to_string);
    let mut extra = Vec::new();
    if let Some(ttl) = &ttl {
        extra.extend(["--ttl", ttl.as_str()]);
    }
    if let Some(token) = token {
        extra.extend(["--token", token.as_str()]);
    }
    let cmd = (target.make)(lock).op(verb).args(&extra).into_command();
    let how = Invoke {
        slot: Some(slot),
        ..Invoke::default()
    };
    let ran = chaos::invoke(cmd, how);
    // When it ended, on the monotonic and the wall clock.
    let since = Duration::from_nanos(boot_ns().saturating_sub(ran.t1));
    let answered = Instant::now() - since;
    let ret_ms = wall_ms() - i64::try_from(since.as_millis()).unwrap();
    if ran.killed {
        return (None, answered);
    }
    let stdout = &ran.out.stdout;
    let reply = ran
        .reply()
        .unwrap_or_else(|| panic!("not a known reply to {op:?}: {stdout}"));
    if ran.out.code == 2 {
        assert!(
            matches!(&reply, Reply::Error { error, .. } if error == "store_unavailable"),
            "{stdout}"
        );
        return (None, answered);
    }
    let ret = read_answer(op, ran.out.code, &reply, ret_ms);
    assert!(ret.is_some(), "unexpected answer to {op:?}: {stdout}");
    (ret, answered)
}

const WORKERS: usize = 5;

/// What a run did.
pub struct Run {
    pub calls: Vec<Call>,
    pub killed: usize,
    pub faults: usize,
}

/// The lock the workers use now: the next one every `epoch`, or sooner after
/// `MAX_CALLS` calls on it or `MAX_UNKNOWN` changes of unknown outcome, so no
/// lock's history grows past what the checker decides in time (its search
/// grows exponentially with such calls; a loaded machine makes more of
/// them). Each lock's history is still checked whole.
struct Epochs {
    epoch: Duration,
    /// The lock's number, when it began, its calls and its unknown changes.
    now: Mutex<(usize, Instant, usize, usize)>,
}

/// Unknown changes after which the workers move to the next lock.
const MAX_UNKNOWN: usize = 4;

/// Calls after which the workers move to the next lock.
const MAX_CALLS: usize = 150;

impl Epochs {
    fn new(epoch: Duration) -> Self {
        Self {
            epoch,
            now: Mutex::new((0, Instant::now(), 0, 0)),
        }
    }

    fn current(&self) -> usize {
        let mut now = self.now.lock().unwrap();
        if now.1.elapsed() >= self.epoch || now.2 >= MAX_CALLS || now.3 >= MAX_UNKNOWN {
            *now = (now.0 + 1, Instant::now(), 0, 0);
        }
        now.0
    }

    /// Counts a call on `lock`, and whether its outcome is unknown.
    fn ended(&self, lock: &str, unknown: bool) {
        let mut now = self.now.lock().unwrap();
        if lock == format!("lin{}", now.0) {
            now.2 += 1;
            now.3 += usize::from(unknown);
        }
    }
}

/// Runs the workers against `target` for `secs`, with `fault` called by
/// the fault thread every few hundred ms (it gets the clients' slots).
pub fn drive(
    target: &Target,
    secs: u64,
    seed: &Seed,
    fault: &(dyn Fn(&mut Rng) -> bool + Sync),
) -> Run {
    let stop = AtomicBool::new(false);
    let killed = AtomicUsize::new(0);
    let faults = AtomicUsize::new(0);
    let slots: Vec<Slot> = (0..WORKERS).map(|_| Mutex::new(None)).collect();
    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let calls = Mutex::new(Vec::new());
    let epochs = Epochs::new(target.epoch);
    std::thread::scope(|s| {
        for (w, slot) in slots.iter().enumerate() {
            let (calls, stop, epochs) = (&calls, &stop, &epochs);
            s.spawn(move || {
                let mut rng = seed.rng(w as u64);
                // The token this worker holds, with its lock; an old one.
                let mut held: Option<(String, String)> = None;
                let mut old: Option<(String, String)> = None;
                let mut walk_away = false;
                while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                    let lock = format!("lin{}", epochs.current());
                    let ttl = target.ttls[rng.below(target.ttls.len() as u64) as usize];
                    let (op, on) = match &held {
                        Some((l, t)) if *l != lock => (Op::Release { token: t.clone() }, l.clone()),
                        Some((l, t)) => match rng.below(100) {
                            0..30 => (Op::Check { token: t.clone() }, l.clone()),
                            30..50 => (
                                Op::Renew {
                                    token: t.clone(),
                                    ttl,
                                    inv_ms: wall_ms(),
                                },
                                l.clone(),
                            ),
                            50..70 => (Op::Release { token: t.clone() }, l.clone()),
                            70..85 => {
                                // Walks away without releasing (a holder that
                                // died): the others take over when its lease
                                // ends, the moment the lease expiry rule is about.
                                walk_away = true;
                                (Op::Status, l.clone())
                            }
                            _ => (Op::Status, l.clone()),
                        },
                        None => match (rng.below(100), &old) {
                            (0..60, _) => (
                                Op::Acquire {
                                    ttl,
                                    inv_ms: wall_ms(),
                                },
                                lock.clone(),
                            ),
                            (60..70, Some((l, t))) if *l == lock => {
                                (Op::Check { token: t.clone() }, l.clone())
                            }
                            (70..80, Some((l, t))) if *l == lock => (
                                Op::Renew {
                                    token: t.clone(),
                                    ttl,
                                    inv_ms: wall_ms(),
                                },
                                l.clone(),
                            ),
                            (80..85, Some((l, t))) if *l == lock => {
                                (Op::Release { token: t.clone() }, l.clone())
                            }
                            _ => (Op::Status, lock.clone()),
                        },
                    };
                    let invoked = Instant::now();
                    let op = match op {
                        Op::Acquire { ttl, .. } => Op::Acquire {
                            ttl,
                            inv_ms: wall_ms(),
                        },
                        Op::Renew { token, ttl, .. } => Op::Renew {
                            token,
                            ttl,
                            inv_ms: wall_ms(),
                        },
                        other => other,
                    };
                    let (ret, at) = run_call(target, slot, &op, &on);
                    epochs.ended(&on, ret.is_none() && is_change(&op));
                    if std::mem::take(&mut walk_away) {
                        old = held.take();
                    }
                    match (&op, &ret) {
                        (_, Some(Ret::Acquired { token, .. })) => {
                            held = Some((on.clone(), token.clone()))
                        }
                        (Op::Release { .. }, _)
                        | (
                            _,
                            Some(Ret::NotOwner { .. } | Ret::NotHeld { .. } | Ret::Expired { .. }),
                        ) => {
                            if let Some(h) = held.take() {
                                old = Some(h);
                            }
                        }
                        _ => {}
                    }
                    calls.lock().unwrap().push(Call {
                        worker: w,
                        lock: on,
                        op,
                        invoked,
                        answer: ret.map(|r| (r, at)),
                    });
                    std::thread::sleep(Duration::from_millis(rng.below(15)));
                }
            });
        }
        // The fault thread: SIGKILL a client mid-call, or the store's own fault.
        let (slots, stop, killed, faults) = (&slots, &stop, &killed, &faults);
        s.spawn(move || {
            let mut rng = seed.rng(WORKERS as u64);
            while Instant::now() < until {
                let mean = u64::try_from(target.fault_every.as_millis()).unwrap();
                std::thread::sleep(Duration::from_millis(mean / 4 + rng.below(mean * 3 / 2)));
                if rng.chance(70) {
                    let slot = &slots[rng.index(slots.len())];
                    // A few ms into the call, where it is doing its work.
                    std::thread::sleep(Duration::from_millis(rng.below(30)));
                    if chaos::kill_in(slot) {
                        killed.fetch_add(1, Ordering::SeqCst);
                    }
                } else if fault(&mut rng) {
                    faults.fetch_add(1, Ordering::SeqCst);
                }
            }
            stop.store(true, Ordering::SeqCst);
        });
    });
    Run {
        calls: calls.into_inner().unwrap(),
        killed: killed.into_inner(),
        faults: faults.into_inner(),
    }
}

fn secs() -> u64 {
    std::env::var("SKILL_LOCK_LIN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}

/// [`verdict`] on a thread of its own with a deep stack (the checker's
/// search recurses once per operation), or None past `secs`.
pub fn decided(calls: Vec<Call>, secs: u64) -> Option<Verdict> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .stack_size(1 << 30)
        .spawn(move || {
            let _ = tx.send(verdict(&calls));
        })
        .unwrap();
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

/// Checks a run within a bound (the checker's search is exponential in the
/// worst case: a history it cannot decide in time fails, visibly).
fn judge(store: &str, run: Run, seed: &Seed) {
    let seed = seed.value;
    let killed = run.killed;
    let faults = run.faults;
    let v = decided(run.calls, 120)
        .unwrap_or_else(|| panic!("{store}: the checker did not decide in 120 s (seed {seed})"));
    println!(
        "linearizable {store}: seed {seed}, {} ops on {} locks, {} of unknown outcome ({killed} clients killed), {faults} store faults: {}",
        v.ops,
        v.locks,
        v.unknown,
        if v.violation.is_none() {
            "linearizable"
        } else {
            "NOT linearizable"
        }
    );
    if let Some(why) = v.violation {
        panic!("{store} (seed {seed}): {why}");
    }
    assert!(
        v.ops > 50,
        "{store}: too few operations ({}) to judge",
        v.ops
    );
}

fn seed() -> Seed {
    Seed::from_env("linearizable", "SKILL_LOCK_LIN_SEED")
}

// ---------------------------------------------------------------------------
// The three stores.

/// A lease no run outlives: a reader that calls it gone while it is held
/// (one racing a release, say) is caught, since only the last second of a
/// lease may be called gone.
const LONG: u64 = 3600;

#[test]
fn file_store_is_linearizable_under_client_kills() {
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let target = Target {
        name: "file",
        make: Box::new(move |lock| Lock::new(&cwd, lock, "o/r")),
        ttls: vec![1, 2, LONG],
        epoch: Duration::from_secs(2),
        fault_every: Duration::from_millis(200),
    };
    let seed = seed();
    let run = drive(&target, secs(), &seed, &|_| false);
    judge(target.name, run, &seed);
}

#[test]
fn etcd_store_is_linearizable_under_client_kills_and_a_freezing_member() {
    let Some(ep) = harness::etcd_endpoint("etcd linearizability") else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let proxy = Proxy::start(&ep);
    let url = format!(
        "etcd://{}/lin-{}-{}/",
        proxy.addr(),
        std::process::id(),
        env.root.file_name().unwrap().to_string_lossy()
    );
    let target = Target {
        name: "etcd",
        make: Box::new(move |lock| {
            Lock::new(&cwd, lock, "o/r")
                .with_env("SKILL_LOCK_STORE", &url)
                .with_env("SKILL_LOCK_ETCD_TIMEOUT", "2")
        }),
        ttls: vec![1, 2, 3, LONG],
        epoch: Duration::from_secs(2),
        fault_every: Duration::from_millis(200),
    };
    let seed = seed();
    let run = drive(&target, secs(), &seed, &|rng: &mut Rng| {
        if rng.chance(70) {
            proxy.freeze(Duration::from_millis(200 + rng.below(2300)));
        } else {
            proxy.sever();
        }
        true
    });
    judge(target.name, run, &seed);
}

#[test]
fn git_store_is_linearizable_under_client_kills_and_dropped_connections() {
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let served = env.dir("served");
    harness::gitd::bare_repo(&served.join("locks.git"));
    let daemon = harness::gitd::Daemon::start(&served, 24450);
    let proxy = Proxy::start(&format!("127.0.0.1:{}", daemon.port));
    let url = format!("git:git://{}/locks.git", proxy.addr());
    let cache = env.path("cache");
    let target = Target {
        name: "git",
        make: Box::new(move |lock| {
            Lock::new(&cwd, lock, "o/r")
                .with_env("SKILL_LOCK_STORE", &url)
                .with_env("SKILL_LOCK_GIT_CACHE", &cache)
                .with_env("SKILL_LOCK_CLOCK_SKEW", "0")
        }),
        ttls: vec![1, 2, LONG],
        epoch: Duration::from_millis(1000),
        fault_every: Duration::from_millis(600),
    };
    let seed = seed();
    let run = drive(&target, secs(), &seed, &|_| {
        proxy.sever();
        true
    });
    judge(target.name, run, &seed);
    drop(daemon);
}

// ---------------------------------------------------------------------------
// The checker catches a planted bug (and passes the same store done right).

mod planted {
    use super::*;
    use skill_lock::engine::{
        self, Acquire, AcquireRequest, Check, Context, Release, Renew, State,
    };
    use skill_lock::error::Result;
    use skill_lock::history::Event;
    use skill_lock::key::LockKey;
    use skill_lock::lease::StaleReason;
    use skill_lock::store::{Committed, Current, Decision, Listed, Place, Seen, Store};

    /// Locks in memory; `cas: false` decides on a read and writes without
    /// checking that the lock is still as it read it (no compare-and-swap).
    pub struct Memory {
        cas: bool,
        state: Mutex<(BTreeMap<String, Current>, u64)>,
    }

    impl Store for Memory {
        fn describe(&self) -> String {
            "memory".into()
        }

        fn location(&self, key: &LockKey) -> Place {
            Place::at(key.name())
        }

        fn read(&self, key: &LockKey) -> Result<Current> {
            let g = self.state.lock().unwrap();
            Ok(g.0.get(&key.name()).cloned().unwrap_or(Current::Free))
        }

        fn last_fence(&self, _: &LockKey) -> Result<Option<u64>> {
            Ok(Some(self.state.lock().unwrap().1).filter(|f| *f > 0))
        }

        fn update<K, W>(
            &self,
            key: &LockKey,
            decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
        ) -> Result<Committed<K, W>> {
            let name = key.name();
            let mut g = self.state.lock().unwrap();
            let current = g.0.get(&name).cloned().unwrap_or(Current::Free);
            let decision = if self.cas {
                decide(&current)?
            } else {
                // The planted bug: the guard is let go between the read and the write.
                drop(g);
                std::thread::sleep(Duration::from_millis(2));
                let d = decide(&current)?;
                std::thread::sleep(Duration::from_millis(2));
                g = self.state.lock().unwrap();
                d
            };
            let committed = match decision {
                Decision::Keep(outcome, _) => Committed::Done(outcome),
                Decision::Acquire(acq) => {
                    g.1 += 1;
                    acq.finish(g.1, None).committed().0
                }
                Decision::Renew(renewal) => renewal.finish().committed().0,
                Decision::Delete(outcome, _) => {
                    g.0.remove(&name);
                    Committed::Done(outcome)
                }
            };
            if let Committed::Wrote(_, w) = &committed {
                g.0.insert(name, Current::Held(Seen::recorded(w.record.clone())));
            }
            Ok(committed)
        }

        fn visit_locks(&self, _: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
            Ok(0)
        }

        fn history(&self, _: Option<&LockKey>, _: usize) -> Result<Vec<Event>> {
            Ok(Vec::new())
        }
    }

    /// One call through the engine, read as the model's.
    fn call(store: &Memory, op: &Op, lock: &str) -> Ret {
        let key = LockKey::new(lock, "o/r").unwrap();
        let ctx = Context::here();
        let ms = |t: Timestamp| t.0 * 1000;
        match op {
            Op::Acquire { ttl, .. } => {
                let req = AcquireRequest {
                    ttl: *ttl,
                    note: None,
                    owner_pid: None,
                    owner_pgid: None,
                    since: None,
                };
                match engine::acquire(store, &key, &req, &ctx).unwrap() {
                    Acquire::Acquired { token, holder, .. } => Ret::Acquired {
                        token,
                        fence: holder.fence,
                        expires_ms: ms(holder.expires),
                        ret_ms: wall_ms(),
                    },
                    Acquire::AlreadyRunning { holder, .. } => Ret::AlreadyRunning {
                        fence: Some(holder.fence),
                    },
                }
            }
            Op::Renew { token, ttl, .. } => {
                match engine::renew(store, &key, Some(token), Some(*ttl), &ctx).unwrap() {
                    Renew::Renewed { holder, .. } => Ret::Renewed {
                        fence: holder.fence,
                        expires_ms: ms(holder.expires),
                    },
                    Renew::NotOwner { holder, .. } => Ret::NotOwner {
                        fence: Some(holder.fence),
                    },
                    Renew::NotHeld { .. } => Ret::NotHeld { ret_ms: wall_ms() },
                }
            }
            Op::Release { token } => {
                match engine::release(store, &key, Some(token), false, &ctx).unwrap() {
                    Release::Released { holder, .. } => Ret::Released {
                        fence: holder.map(|h| h.fence),
                    },
                    Release::NotHeld => Ret::NotHeld { ret_ms: wall_ms() },
                    Release::Refused { holder } => Ret::Refused {
                        fence: holder.map(|h| h.fence),
                    },
                }
            }
            Op::Check { token } => match engine::check(store, &key, token, &ctx).unwrap() {
                Check::Held { holder, .. } => Ret::Held {
                    fence: holder.fence,
                },
                Check::NotOwner { holder } => Ret::NotOwner {
                    fence: holder.map(|h| h.fence),
                },
                Check::NotHeld => Ret::NotHeld { ret_ms: wall_ms() },
                Check::Expired { reason, .. } => Ret::Expired {
                    ret_ms: wall_ms(),
                    owner_dead: reason == StaleReason::OwnerDead,
                },
            },
            Op::Status => match engine::status(store, &key, &ctx).unwrap().state {
                State::Held { holder, .. } => Ret::StatusHeld {
                    fence: Some(holder.fence),
                },
                State::Stale { holder, reason, .. } => Ret::StatusStale {
                    fence: holder.map(|h| h.fence),
                    ret_ms: wall_ms(),
                    owner_dead: reason == StaleReason::OwnerDead,
                },
                State::Free => Ret::StatusFree { ret_ms: wall_ms() },
            },
        }
    }

    /// Four threads on locks of 200 ms each (small histories: a
    /// non-linearizable one is searched exhaustively), for `ms`.
    pub fn run(cas: bool, ms: u64) -> Vec<Call> {
        let store = Memory {
            cas,
            state: Mutex::new((BTreeMap::new(), 0)),
        };
        let start = Instant::now();
        let calls = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for w in 0..4u64 {
                let (store, calls) = (&store, &calls);
                s.spawn(move || {
                    let mut rng = Rng::new(w + 1);
                    let mut held: Option<(String, String)> = None;
                    while start.elapsed() < Duration::from_millis(ms) {
                        let lock = format!("p{}", start.elapsed().as_millis() / 200);
                        let (op, on) = match &held {
                            Some((l, t)) if *l != lock || rng.chance(40) => {
                                (Op::Release { token: t.clone() }, l.clone())
                            }
                            Some((l, t)) => (Op::Check { token: t.clone() }, l.clone()),
                            None if rng.chance(70) => (
                                Op::Acquire {
                                    ttl: 5,
                                    inv_ms: wall_ms(),
                                },
                                lock.clone(),
                            ),
                            None => (Op::Status, lock.clone()),
                        };
                        let invoked = Instant::now();
                        let ret = call(store, &op, &on);
                        let at = Instant::now();
                        match (&op, &ret) {
                            (_, Ret::Acquired { token, .. }) => {
                                held = Some((on.clone(), token.clone()));
                            }
                            (Op::Release { .. }, _) | (_, Ret::NotOwner { .. }) => held = None,
                            _ => {}
                        }
                        calls.lock().unwrap().push(Call {
                            worker: w as usize,
                            lock: on,
                            op,
                            invoked,
                            answer: Some((ret, at)),
                        });
                        std::thread::sleep(Duration::from_millis(4 + rng.below(8)));
                    }
                });
            }
        });
        calls.into_inner().unwrap()
    }
}

#[test]
fn the_checker_catches_a_store_that_skips_the_compare_and_swap() {
    let right = decided(planted::run(true, 1200), 60).expect("decided in 60 s");
    assert!(
        right.violation.is_none(),
        "the store with its compare-and-swap was judged not linearizable: {:?}",
        right.violation
    );
    let broken = decided(planted::run(false, 1200), 60).expect("decided in 60 s");
    println!(
        "planted bug: {} ops on {} locks with the compare-and-swap: linearizable; without it: {}",
        right.ops,
        broken.locks,
        if broken.violation.is_some() {
            "NOT linearizable (caught)"
        } else {
            "missed"
        }
    );
    assert!(
        broken.violation.is_some(),
        "a store without compare-and-swap went unnoticed ({} ops)",
        broken.ops
    );
}

/// The model on its own, on histories small enough to read.
#[test]
fn the_model_refuses_an_early_takeover_a_repeated_fence_and_a_ghost_nobody_made() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let call = |op: Op, from: u64, to: Option<(Ret, u64)>| Call {
        worker: usize::try_from(from).unwrap(),
        lock: "l".into(),
        op,
        invoked: at(from),
        answer: to.map(|(r, t)| (r, at(t))),
    };
    let acq = |token: &str, fence: u64, expires_ms: i64, ret_ms: i64| Ret::Acquired {
        token: token.into(),
        fence,
        expires_ms,
        ret_ms,
    };
    let a = || Op::Acquire { ttl: 2, inv_ms: 0 };
    // Taken over after the lease it was told: fine; before: refused.
    let ok = [
        call(a(), 0, Some((acq("a", 1, 2000, 10), 10))),
        call(a(), 2000, Some((acq("b", 2, 4000, 2010), 2010))),
    ];
    assert!(verdict(&ok).violation.is_none());
    let early = [
        call(a(), 0, Some((acq("a", 1, 2000, 10), 10))),
        call(a(), 1000, Some((acq("b", 2, 3000, 1250), 1250))),
    ];
    assert!(verdict(&early).violation.is_some());
    // Fences strictly increase.
    let repeated = [
        call(a(), 0, Some((acq("a", 5, 2000, 10), 10))),
        call(
            Op::Release { token: "a".into() },
            20,
            Some((Ret::Released { fence: Some(5) }, 30)),
        ),
        call(a(), 40, Some((acq("b", 5, 2000, 50), 50))),
    ];
    assert!(verdict(&repeated).violation.is_some());
    // A lock held by nobody's token: allowed only after an acquire whose
    // outcome is unknown.
    let status_held = |fence| Some((Ret::StatusHeld { fence: Some(fence) }, 110));
    let ghost = [call(a(), 0, None), call(Op::Status, 100, status_held(3))];
    assert!(verdict(&ghost).violation.is_none());
    let no_ghost = [call(Op::Status, 100, status_held(3))];
    assert!(verdict(&no_ghost).violation.is_some());
    // Check answers from the holder.
    let check = |token: &str, ret: Ret| {
        call(
            Op::Check {
                token: token.into(),
            },
            20,
            Some((ret, 30)),
        )
    };
    let held_by_a = call(a(), 0, Some((acq("a", 1, 9000, 10), 10)));
    assert!(
        verdict(&[held_by_a.clone(), check("a", Ret::Held { fence: 1 })])
            .violation
            .is_none()
    );
    assert!(
        verdict(&[held_by_a, check("b", Ret::Held { fence: 1 })])
            .violation
            .is_some()
    );
}

/// Readers may call a lease gone only in its last second, or when its
/// owner is certainly dead: a `stale` or `expired` answer that races a
/// release of a long lease is a lie (SPEC §8).
#[test]
fn the_model_lets_a_reader_call_a_lease_gone_only_in_its_last_second() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let call = |worker: usize, op: Op, from: u64, to: (Ret, u64)| Call {
        worker,
        lock: "l".into(),
        op,
        invoked: at(from),
        answer: Some((to.0, at(to.1))),
    };
    let acquired = |expires_ms| {
        call(
            0,
            Op::Acquire { ttl: 5, inv_ms: 0 },
            0,
            (
                Ret::Acquired {
                    token: "a".into(),
                    fence: 1,
                    expires_ms,
                    ret_ms: 10,
                },
                10,
            ),
        )
    };
    let stale = |ret_ms, owner_dead| Ret::StatusStale {
        fence: Some(1),
        ret_ms,
        owner_dead,
    };
    let release = call(
        0,
        Op::Release { token: "a".into() },
        100,
        (Ret::Released { fence: Some(1) }, 130),
    );
    // A status racing the release of a long lease: held or free, never stale.
    for (ret, lies) in [
        (Ret::StatusHeld { fence: Some(1) }, false),
        (Ret::StatusFree { ret_ms: 125 }, false),
        (stale(125, false), true),
        (stale(125, true), false),
    ] {
        let history = [
            acquired(3_600_000),
            release.clone(),
            call(1, Op::Status, 105, (ret.clone(), 125)),
        ];
        assert_eq!(verdict(&history).violation.is_some(), lies, "{ret:?}");
    }
    // In the last second of the lease its holder was told, stale is allowed.
    let late = [
        acquired(1_100),
        call(1, Op::Status, 105, (stale(125, false), 125)),
    ];
    assert!(verdict(&late).violation.is_none());
    let early = [
        acquired(1_200),
        call(1, Op::Status, 105, (stale(125, false), 125)),
    ];
    assert!(verdict(&early).violation.is_some());
    // The same for check by the holder.
    let check = |ret_ms| {
        call(
            0,
            Op::Check { token: "a".into() },
            105,
            (
                Ret::Expired {
                    ret_ms,
                    owner_dead: false,
                },
                125,
            ),
        )
    };
    assert!(verdict(&[acquired(1_100), check(125)]).violation.is_none());
    assert!(
        verdict(&[acquired(3_600_000), check(125)])
            .violation
            .is_some()
    );
}
