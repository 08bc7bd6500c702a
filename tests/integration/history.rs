//! SPEC §2.8 under concurrency: the history is complete and well formed when
//! many processes change locks at once, and fences only grow; what
//! `history` tells of one lock's holders.
//!
//! Covers: SPEC §2.8, §7.

use crate::harness;

use harness::TestEnv;
use harness::{HistoryEvent, Lock};
use std::collections::HashMap;

#[test]
fn concurrent_writers_leave_a_complete_well_formed_history() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let repo = repo.clone();
            std::thread::spawn(move || {
                let mut acquired = 0u32;
                for i in 0..25 {
                    let r = if (w + i) % 2 == 0 { "o/even" } else { "o/odd" };
                    let lock = Lock::new(&repo, "sweep", r);
                    let a = lock.op("acquire").ttl(60).reply();
                    if a.result() == "acquired" {
                        acquired += 1;
                        lock.release(a.token()).is("released");
                    } else {
                        a.is("already_running");
                    }
                }
                acquired
            })
        })
        .collect();
    let acquired: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(acquired > 0);

    let text = std::fs::read_to_string(repo.join(".git/apache-magpie/run/history.jsonl")).unwrap();
    assert!(text.ends_with('\n'));
    // Each line reads as the event `history` shows, every field known.
    let events: Vec<HistoryEvent> = text
        .lines()
        .filter(|l| !l.trim().is_empty()) // padding: no event straddles a 4 KiB block
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn line {l:?}: {e}")))
        .collect();
    let count = |kind: &str| events.iter().filter(|e| e.event == kind).count();
    assert_eq!(
        count("acquired") as u32,
        acquired,
        "one acquired event per successful acquire"
    );
    assert_eq!(
        count("released") as u32,
        acquired,
        "one released event per release"
    );

    // Per lock: events alternate acquired/released and fences strictly grow.
    let mut last: HashMap<String, (String, u64)> = HashMap::new();
    for e in &events {
        let (lock, kind) = (e.lock.clone(), e.event.clone());
        let fence = e.fence.unwrap();
        if let Some((prev_kind, prev_fence)) = last.get(&lock) {
            match kind.as_str() {
                "acquired" => {
                    assert_eq!(prev_kind, "released", "{lock}: acquired while held");
                    assert!(
                        fence > *prev_fence,
                        "{lock}: fence {fence} after {prev_fence}"
                    );
                }
                "released" => {
                    assert_eq!(
                        (prev_kind.as_str(), *prev_fence),
                        ("acquired", fence),
                        "{lock}"
                    );
                }
                other => panic!("unexpected event {other}"),
            }
        } else {
            assert_eq!(kind, "acquired");
        }
        last.insert(lock, (kind, fence));
    }

    // The command shows the same, oldest first, limited to the newest N.
    let h = Lock::new(&repo, "sweep", "O/Even")
        .op("history")
        .limit(4)
        .reply();
    let shown = h.events();
    assert_eq!(shown.len(), 4);
    let even: Vec<&HistoryEvent> = events
        .iter()
        .filter(|e| e.lock == "sweep@o__even")
        .collect();
    assert_eq!(shown.iter().collect::<Vec<_>>(), even[even.len() - 4..]);
}

#[test]
fn history_tells_who_held_it() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "issue-triage", "apache/airflow");
    let a = lock.op("acquire").ttl(1).note("first").reply();
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let b = lock.op("acquire").note("second").reply();
    let tb = b.token().to_owned();
    lock.release(a.token()).is("refused");
    lock.renew(&tb).is("renewed");
    lock.force_release().is("released");
    Lock::new(&repo, "other", "o/r").acquire().is("acquired");
    let h = lock.history();
    assert_eq!(
        h.event_kinds(),
        [
            "acquired",
            "took_over",
            "acquired",
            "refused",
            "renewed",
            "forced_release"
        ]
    );
    let ev = h.events();
    assert_eq!(
        (ev[0].fence, ev[0].note.as_deref()),
        (Some(1), Some("first"))
    );
    assert_eq!(ev[1].reason.as_deref(), Some("expired"));
    let previous = ev[1].previous.as_ref().unwrap();
    assert_eq!(previous.note.as_deref(), Some("first"));
    assert_eq!(
        (ev[2].fence, ev[2].note.as_deref()),
        (Some(2), Some("second"))
    );
    assert_eq!(ev[5].previous.as_ref().map(|p| p.fence), Some(2));
    let all = lock.store_op("history").limit(2).reply();
    assert_eq!(all.events().len(), 2);
    assert_eq!(all.events()[1].skill, "other");
    let text = std::fs::read_to_string(repo.join(".git/apache-magpie/run/history.jsonl")).unwrap();
    assert!(!text.contains(&tb), "history holds a token");
}
