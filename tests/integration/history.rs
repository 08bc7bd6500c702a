//! SPEC §2.8 under concurrency: the history is complete and well formed when
//! many processes change locks at once, and fences only grow.
//!
//! Covers: SPEC §2.8, §7.

use crate::common;

use common::{TestEnv, Value};
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
                    let out = common::Cmd::new(&repo)
                        .args(["acquire", "sweep", "--repo", r, "--ttl", "60"])
                        .run();
                    if out.code == 0 {
                        acquired += 1;
                        let t = out.json["token"].as_str().unwrap().to_owned();
                        common::Cmd::new(&repo)
                            .args(["release", "sweep", "--repo", r, "--token", &t])
                            .run()
                            .expect(0, "released");
                    } else {
                        out.expect(3, "already_running");
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
    let events: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty()) // padding: no event straddles a 4 KiB block
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn line {l:?}: {e}")))
        .collect();
    let count = |kind: &str| events.iter().filter(|e| e["event"] == kind).count();
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
        let lock = e["lock"].as_str().unwrap().to_owned();
        let kind = e["event"].as_str().unwrap().to_owned();
        let fence = e["fence"].as_u64().unwrap();
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
    let out = env
        .cmd(&repo)
        .args(["history", "sweep", "--repo", "O/Even", "--limit", "4"])
        .run();
    let h = out.expect(0, "history");
    let shown = h["events"].as_array().unwrap();
    assert_eq!(shown.len(), 4);
    let even: Vec<&Value> = events
        .iter()
        .filter(|e| e["lock"] == "sweep@o__even")
        .collect();
    assert_eq!(
        shown.as_slice(),
        &even[even.len() - 4..]
            .iter()
            .map(|v| (*v).clone())
            .collect::<Vec<_>>()[..]
    );
}
