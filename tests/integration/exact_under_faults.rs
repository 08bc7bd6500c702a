//! Exact answers under faults (issue 20, SPEC §8): the `expires` a holder is
//! told is never later than the cluster's lease can run out; `renew`
//! reports the ttl granted; an acquire that answers `error` after its
//! answer was lost (the member froze just after it received the
//! transaction) leaves no lock held past the time bound, and answers
//! within that bound, settling included; a history larger than one gRPC
//! message is read in pages; git's `history --limit` past git's own range
//! answers every event, never an empty list.
//!
//! The etcd tests need `SKILL_LOCK_TEST_ETCD=host:port` (one plain member);
//! skipped visibly without it, a failure under `SKILL_LOCK_TEST_ETCD_REQUIRED`.
//! The frozen member is a TCP proxy of this test that forwards the
//! transaction and then never forwards another byte, on any connection
//! (what a SIGSTOPped member looks like to a client), so the window is hit
//! every time rather than one run in fifty.
//!
//! Covers: SPEC §7, §8.

use crate::harness;
use harness::chaos::{Fault, Proxy, Then};
use harness::http2::FrameWatch;

use base64::Engine as _;
use harness::Lock;
use harness::etcdctl;
use harness::set_field;
use harness::{TestEnv, Value};
use skill_lock::record::Timestamp;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn etcd(test: &str) -> Option<String> {
    harness::etcd_endpoint(test)
}

fn prefix(env: &TestEnv) -> String {
    harness::etcd_prefix(env, "exact_under_faults")
}

/// The lock `skill` of `o/r` in `store`, seen from `cwd`.
fn lock(cwd: &Path, store: &str, skill: &str) -> Lock {
    Lock::new(cwd, skill, "o/r").with_env("SKILL_LOCK_STORE", store)
}

/// A reply's time, in milliseconds since the epoch.
#[track_caller]
fn ms_of(time: &str) -> i64 {
    Timestamp::parse(time).unwrap().0 * 1000
}

/// Sleeps until `at_ms` past a whole second of the wall clock.
fn just_after_a_second(at_ms: i64) {
    let into = harness::wall_ms().rem_euclid(1000);
    let wait = (1000 + at_ms - into).rem_euclid(1000);
    std::thread::sleep(Duration::from_millis(u64::try_from(wait).unwrap()));
}

#[test]
fn the_holder_is_never_told_a_later_expires_than_the_cluster_gives() {
    let Some(ep) = etcd("the_holder_is_never_told_a_later_expires_than_the_cluster_gives") else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let store = format!("etcd://{ep}{}", prefix(&env));
    // Just after a whole second is where rounding `expires` up from the
    // decision told the holder most (the issue's 5 of 5 rounds).
    for (round, ttl) in [3u64, 3, 2].into_iter().enumerate() {
        let skill = format!("told-{round}");
        just_after_a_second(40);
        let lock = lock(&cwd, &store, &skill);
        let first = lock.op("acquire").ttl(ttl).reply().is("acquired");
        let expires = ms_of(first.expires());
        // A contender keeps trying; the moment its acquire answered is
        // after the lock was taken, which must not be before `expires`.
        let taken_by = loop {
            let o = lock.op("acquire").ttl(60).reply();
            let answered = harness::wall_ms();
            if o.result() == "acquired" {
                break answered;
            }
            o.is("already_running");
            assert!(answered < expires + 30_000, "never freed");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            taken_by >= expires,
            "round {round}: a contender held the lock {} ms before the expires the holder was told ({})",
            expires - taken_by,
            first.expires()
        );
    }
}

#[test]
fn renew_reports_the_ttl_the_cluster_granted() {
    let Some(ep) = etcd("renew_reports_the_ttl_the_cluster_granted") else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let store = format!("etcd://{ep}{}", prefix(&env));
    let lock = lock(&cwd, &store, "granted");
    let a = lock.op("acquire").ttl(30).reply().is("acquired");
    let (token, key) = (a.token(), a.lock());
    assert_eq!(a.ttl(), etcdctl::granted_ttl(&ep, key), "{a:?}");
    // Below the cluster's minimum lease (2 s by default): it grants more,
    // and renew says what it granted, as acquire does.
    let before = harness::wall_ms();
    let r = lock.op("renew").ttl(1).token(token).reply().is("renewed");
    let granted = etcdctl::granted_ttl(&ep, key);
    assert_eq!(r.ttl(), granted, "{r:?}");
    let expires = ms_of(r.expires());
    let granted_ms = i64::try_from(granted).unwrap() * 1000;
    assert!(
        expires <= harness::wall_ms() + granted_ms && expires >= before + granted_ms - 1000,
        "renew said expires {} for a lease of {granted} s granted between {before} and now",
        r.expires()
    );
    lock.release(token).is("released");
}

/// A proxy to `target` that forwards everything until the first
/// transaction with a record has reached the member, and from then on
/// forwards nothing, in either direction, on any connection, old or new:
/// the member froze right after it received the transaction.
fn freezing_proxy(target: &str) -> Proxy {
    Proxy::tapped(
        target,
        Box::new(|| {
            let mut watch = FrameWatch::new(300);
            Box::new(move |bytes: &[u8]| {
                if watch.feed(bytes) {
                    Then::Fault(Fault::Hang)
                } else {
                    Then::Go
                }
            })
        }),
    )
}

#[test]
fn an_acquire_lost_to_a_frozen_member_answers_in_time_and_leaves_no_ghost() {
    let Some(ep) = etcd("an_acquire_lost_to_a_frozen_member_answers_in_time_and_leaves_no_ghost")
    else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let pfx = prefix(&env);
    let direct = format!("etcd://{ep}{pfx}");
    for round in 0..3 {
        let skill = format!("ghost-{round}");
        let proxy = freezing_proxy(&ep);
        let through = format!("etcd://{}{pfx}", proxy.addr());
        let began = Instant::now();
        let o = lock(&cwd, &through, &skill)
            .op("acquire")
            .env("SKILL_LOCK_ETCD_TIMEOUT", "1")
            .ttl(60)
            .run();
        let took = began.elapsed();
        let answered = Instant::now();
        // The member is unreachable once it has the transaction: the
        // outcome cannot be read back, so the answer is an error...
        o.expect_error("store_unavailable");
        // ...within the bound (1 s, settling included; process start aside).
        assert!(
            took < Duration::from_millis(2000),
            "round {round}: the error came after {took:?} for a 1 s timeout: {}",
            o.stdout
        );
        // The transaction did land: the lock it made, whose token nobody
        // has, must be gone within the bound of its answer (the short lease
        // the acquisition is first written on: the cluster's minimum, 2 s by
        // default, past the 1 s bound; plus etcd's half-second expiry sweep).
        let state = loop {
            let s = lock(&cwd, &direct, &skill).status();
            if s.state() == "free" || answered.elapsed() > Duration::from_millis(3500) {
                break s;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(
            state.state(),
            "free",
            "round {round}: {:?} after an acquire answered an error, the lock is held by a token nobody has: {state:?}",
            answered.elapsed(),
        );
    }
}

#[test]
fn a_history_larger_than_one_message_is_read_in_pages() {
    let Some(ep) = etcd("a_history_larger_than_one_message_is_read_in_pages") else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let pfx = prefix(&env);
    let store = format!("etcd://{ep}{pfx}");
    let note = "n".repeat(1000);
    let big = lock(&cwd, &store, "big");
    big.op("acquire").ttl(30).note(&note).reply().is("acquired");
    // 5,000 events of the longest note (about 6 MB, past tonic's 4 MiB
    // message limit), written straight into the store in batches through
    // etcd's JSON gateway; each a copy of the real one, numbered.
    let real = etcdctl::first_value(&ep, &format!("{pfx}history/"));
    let template: Value = serde_json::from_slice(&real).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let total: usize = 5000;
    for batch in 0..total / 100 {
        let ops: Vec<Value> = (0..100)
            .map(|i| {
                let n = batch * 100 + i;
                let mut ev = template.clone();
                set_field(&mut ev, "pid", n);
                let key = format!(
                    "{pfx}history/{:020}-{n:016x}",
                    1_000_000_000_000_000_000u64 + n as u64
                );
                serde_json::json!({"request_put": {
                    "key": b64.encode(key),
                    "value": b64.encode(serde_json::to_vec(&ev).unwrap()),
                }})
            })
            .collect();
        let body = serde_json::json!({ "success": ops }).to_string();
        let mut curl = Command::new("curl")
            .args(["-sf", "-X", "POST", "--data-binary", "@-"])
            .arg(format!("http://{ep}/v3/kv/txn"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("curl runs");
        curl.stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        assert!(
            curl.wait().unwrap().success(),
            "etcd's gateway refused a batch"
        );
    }
    let slow = big.with_env("SKILL_LOCK_ETCD_TIMEOUT", "20");
    for (args, want) in [
        (slow.op("history").limit(3), 3),
        (slow.store_op("history").limit(100_000), total + 1),
        (slow.op("history").limit(100_000), total + 1),
    ] {
        let h = args.expect(0, "history");
        let events = h.events();
        assert_eq!(events.len(), want, "{want}");
        // Newest last, in the order they were written: the last is the
        // last one planted, and the pids of the planted ones increase.
        assert_eq!(events[events.len() - 1].pid as usize, total - 1, "{want}");
        let pids: Vec<u32> = events
            .iter()
            .skip(events.len() - want.min(3))
            .map(|e| e.pid)
            .collect();
        assert!(pids.windows(2).all(|w| w[0] < w[1]), "{want}: {pids:?}");
    }
}

#[test]
fn git_history_with_a_limit_past_gits_range_answers_every_event() {
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let remote = harness::gitd::bare_repo(&env.path("remote.git"));
    let lim = lock(&cwd, &format!("git:file://{}", remote.display()), "lim")
        .with_env("SKILL_LOCK_GIT_CACHE", env.path("cache"));
    for _ in 0..2 {
        let a = lim.op("acquire").ttl(60).reply().is("acquired");
        lim.release(a.token()).is("released");
    }
    for limit in [2_147_483_647, 2_147_483_648, u64::MAX] {
        let h = lim.op("history").limit(limit).expect(0, "history");
        assert_eq!(h.events().len(), 4, "--limit {limit}: {h:?}");
    }
}
