//! The etcd store at its edges (SPEC §7 time safety, §8): a lease the
//! cluster still holds is never read as expired, a hung endpoint is skipped
//! like a dead one, and a change whose answer was lost is settled by reading
//! it back, never reported as an error for a lock that was in fact taken.
//!
//! Needs `SKILL_LOCK_TEST_ETCD=host:port` (one plain-text member is enough);
//! skipped visibly without it, a failure under `SKILL_LOCK_TEST_ETCD_REQUIRED`.
//! The faults come from the chaos kit's proxy and a listener that never
//! answers, on loopback, started by each test.
//!
//! Covers: SPEC §7, §8.

use crate::harness;
use harness::chaos::{Proxy, Then};
use harness::http2::FrameWatch;

use harness::TestEnv;
use harness::{Lock, Reply};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn etcd(test: &str) -> Option<String> {
    harness::etcd_endpoint(test)
}

fn prefix(env: &TestEnv) -> String {
    harness::etcd_prefix(env, "leases")
}

/// The lock `skill` of `o/r` in the etcd store `store`, seen from `cwd`.
fn lock(cwd: &Path, store: &str, skill: &str) -> Lock {
    Lock::new(cwd, skill, "o/r").with_env("SKILL_LOCK_STORE", store)
}

/// A listener that accepts connections and never answers (nor closes them).
fn hung_endpoint() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    addr
}

/// A proxy to `target` that, on the connection which carries the first
/// transaction with a record, forwards the request and then swallows every
/// answer on that connection (the member committed; the client never hears
/// it). Other connections pass untouched.
fn answer_eating_proxy(target: &str) -> Proxy {
    let fired = Arc::new(AtomicBool::new(false));
    Proxy::tapped(
        target,
        Box::new(move || {
            let (fired, mut watch) = (fired.clone(), FrameWatch::new(300));
            Box::new(move |bytes: &[u8]| {
                if watch.feed(bytes) && !fired.swap(true, Ordering::SeqCst) {
                    Then::Deafen
                } else {
                    Then::Go
                }
            })
        }),
    )
}

#[test]
fn a_lease_the_cluster_still_holds_is_never_taken_over_early() {
    let Some(ep) = etcd("a_lease_the_cluster_still_holds_is_never_taken_over_early") else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let store = format!("etcd://{ep}{}", prefix(&env));
    for ttl in [2u64, 3] {
        let skill = format!("lease-{ttl}");
        let began = Instant::now();
        let lock = lock(&cwd, &store, &skill);
        let first = lock.op("acquire").ttl(ttl).reply().is("acquired");
        assert!(
            matches!(first, Reply::Acquired { ttl: t, .. } if t == ttl),
            "etcd grants a ttl of 2 s and more exactly: {first:?}"
        );
        // The holder is never told it has more than its lease left.
        let c = lock.check(first.token());
        if let Reply::Held { expires_in, .. } = c {
            assert!(expires_in <= ttl, "{c:?}");
        }
        // A second run keeps trying; it must not win before the lease ran out.
        let taken_at = loop {
            match lock.op("acquire").ttl(60).reply() {
                Reply::Acquired { .. } => break began.elapsed(),
                Reply::AlreadyRunning { .. } => {}
                other => panic!("{other:?}"),
            }
            assert!(
                began.elapsed() < Duration::from_secs(ttl + 30),
                "never freed"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            taken_at >= Duration::from_secs(ttl),
            "a ttl {ttl} lease was taken over {taken_at:?} after its acquire began"
        );
    }
}

#[test]
fn a_hung_first_endpoint_is_skipped_like_a_dead_one() {
    let Some(ep) = etcd("a_hung_first_endpoint_is_skipped_like_a_dead_one") else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let store = format!("etcd://{},{ep}{}", hung_endpoint(), prefix(&env));
    let began = Instant::now();
    let lock = lock(&cwd, &store, "hung");
    let o = lock.op("acquire").ttl(30).reply().is("acquired");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    let r = lock.release(o.token());
    assert_eq!(r.result(), "released", "{r:?}");
}

#[test]
fn a_lost_answer_is_settled_by_reading_it_back() {
    let Some(ep) = etcd("a_lost_answer_is_settled_by_reading_it_back") else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let pfx = prefix(&env);
    let direct = format!("etcd://{ep}{pfx}");
    // A stale lock to take over (its lease ends in 2 s), then a takeover
    // whose answer is swallowed after the member committed it.
    let direct = lock(&cwd, &direct, "lost");
    direct.op("acquire").ttl(2).reply().is("acquired");
    std::thread::sleep(Duration::from_millis(3500));
    let proxy = answer_eating_proxy(&ep);
    let through = format!("etcd://{}{pfx}", proxy.addr());
    let o = lock(&cwd, &through, "lost")
        .with_env("SKILL_LOCK_ETCD_TIMEOUT", "2")
        .op("acquire")
        .ttl(600)
        .run();
    // Whatever it answers, it must be the truth: acquired with the token that
    // holds the lock, or an error with the lock left free (never a ghost).
    let status = direct.status();
    match o.reply() {
        got @ Reply::Acquired { .. } => {
            // The token holds the lock: held, or (when the settling used the
            // whole deadline and the lease could not be moved onto its full
            // ttl) run out exactly when the holder was told it would.
            let c = direct.check(got.token());
            match (&got, &c) {
                (_, Reply::Held { .. }) => {}
                (
                    Reply::Acquired { expires, fence, .. },
                    Reply::Expired {
                        expires: ended,
                        fence: f,
                        ..
                    },
                ) => assert!(
                    ended == expires && f == fence,
                    "told {got:?}, the lock says {c:?}"
                ),
                _ => panic!("acquired {got:?}, but check says {c:?}"),
            }
        }
        _ => {
            o.expect_error("store_unavailable");
            assert_eq!(
                status.state(),
                "free",
                "the command failed but left a lock nobody holds the token of: {status:?}"
            );
        }
    }
    assert_eq!(
        o.code, 0,
        "the answer was lost but the member answers on a new connection: {}",
        o.stdout
    );
}
