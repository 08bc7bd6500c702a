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

use crate::harness;

use harness::TestEnv;
use harness::chaos::{Proxy, Rng, Seed, Then};
use harness::http2::GrpcMessages;
use harness::{Lock, Reply};
use std::sync::{Arc, Mutex};
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
    let token = lock.op("acquire").ttl(3600).reply().token().to_owned();
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
                        0 => lock.status(),
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
    let Some(ep) = harness::etcd_endpoint(test) else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let url = format!("etcd://{ep}{}", harness::etcd_prefix(&env, "reads"));
    let lock = Lock::new(&cwd, "race", "o/r").in_store(&url);
    let list = || lock.list();
    let seed = Seed::from_env(test, "SKILL_LOCK_READS_SEED");
    let mut rng = seed.rng(0);
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

// ---------------------------------------------------------------------------
// `list` in pages.

/// A key (or value) as the etcd gRPC gateway's JSON spells bytes.
fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// One key-value of a gateway `range` answer (numbers come as strings).
#[derive(serde::Deserialize)]
struct GatewayKv {
    value: String,
    #[serde(default)]
    lease: Option<String>,
}

#[derive(serde::Deserialize)]
struct GatewayRange {
    #[serde(default)]
    kvs: Vec<GatewayKv>,
}

/// POSTs `body` (JSON) to the etcd gRPC gateway at `ep` (`path` under
/// `/v3/`), through a file (a body can be megabytes); the answer's text.
fn gateway(env: &TestEnv, ep: &str, path: &str, body: &str) -> String {
    let file = env.path("gateway-body.json");
    std::fs::write(&file, body).unwrap();
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "30", "--data-binary"])
        .arg(format!("@{}", file.display()))
        .arg(format!("http://{ep}/v3/{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "gateway {path}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Puts `(key, value)` pairs on `lease` in transactions of 100 puts.
fn put_all(env: &TestEnv, ep: &str, kvs: &[(String, Vec<u8>)], lease: &str) {
    for chunk in kvs.chunks(100) {
        let ops: Vec<String> = chunk
            .iter()
            .map(|(k, v)| {
                format!(
                    r#"{{"request_put":{{"key":"{}","value":"{}","lease":"{lease}"}}}}"#,
                    b64(k.as_bytes()),
                    b64(v)
                )
            })
            .collect();
        gateway(
            env,
            ep,
            "kv/txn",
            &format!(r#"{{"success":[{}]}}"#, ops.join(",")),
        );
    }
}

/// More than gRPC's 4 MiB under one prefix: 3,000 locks with 1,000-byte
/// notes (copies of one real record, renamed, on its lease), and three
/// values of 1.4 MB each (another tool's, under lock names): `list`
/// answers `list` with every lock, the 3,000 held, the three corrupt.
#[test]
fn list_reads_a_store_larger_than_a_grpc_message_in_pages() {
    let test = "list_reads_a_store_larger_than_a_grpc_message_in_pages";
    let Some(ep) = harness::etcd_endpoint(test) else {
        return;
    };
    if !harness::have_programs(test, &[("curl", "--version")]) {
        return;
    }
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let prefix = harness::etcd_prefix(&env, "reads");
    let url = format!("etcd://{ep}{prefix}");
    let note = "n".repeat(1000);
    let lock = Lock::new(&cwd, "big", "o/r").in_store(&url);
    let token = lock
        .op("acquire")
        .ttl(3600)
        .note(&note)
        .reply()
        .token()
        .to_owned();
    let key = format!("{prefix}locks/big@o__r");
    let read = gateway(
        &env,
        &ep,
        "kv/range",
        &format!(r#"{{"key":"{}"}}"#, b64(key.as_bytes())),
    );
    let range: GatewayRange = serde_json::from_str(&read).unwrap();
    let kv = range.kvs.first().expect("the lock's key");
    let lease = kv.lease.clone().expect("the lock's lease");
    use base64::Engine;
    let record = base64::engine::general_purpose::STANDARD
        .decode(&kv.value)
        .unwrap();
    let record = String::from_utf8(record).unwrap();
    assert!(record.starts_with(r#"{"skill":"big","#), "{record}");
    let copies: Vec<(String, Vec<u8>)> = (0..3000)
        .map(|i| {
            let skill = format!("big-{i:04}");
            let value = record.replacen(r#""skill":"big""#, &format!(r#""skill":"{skill}""#), 1);
            (format!("{prefix}locks/{skill}@o__r"), value.into_bytes())
        })
        .collect();
    let total: usize = copies.iter().map(|(_, v)| v.len()).sum();
    put_all(&env, &ep, &copies, &lease);
    let huge: Vec<(String, Vec<u8>)> = (1..=3)
        .map(|i| {
            (
                format!("{prefix}locks/huge-{i}@o__r"),
                vec![b'h'; 1_400_000],
            )
        })
        .collect();
    for kv in &huge {
        put_all(&env, &ep, std::slice::from_ref(kv), &lease);
    }
    let total = total + 3 * 1_400_000;
    assert!(total > 5 << 20, "{total} bytes stored");
    let began = Instant::now();
    let out = Lock::new(&cwd, "big", "o/r")
        .in_store(&url)
        .with_env("SKILL_LOCK_ETCD_TIMEOUT", "30")
        .store_op("list")
        .run();
    let took = began.elapsed();
    let Reply::List { locks, .. } = out.reply() else {
        panic!("list of {total} bytes: {}", out.stdout)
    };
    println!("list of 3,004 locks, {total} bytes under one prefix: {took:?}");
    assert_eq!(locks.len(), 3004, "every lock listed");
    let held = locks.iter().filter(|l| l.state == "held").count();
    let corrupt: Vec<&str> = locks
        .iter()
        .filter(|l| l.stale_reason.as_deref() == Some("corrupt"))
        .map(|l| l.skill.as_str())
        .collect();
    assert_eq!(held, 3001, "the 3,000 copies and the lock itself are held");
    assert_eq!(corrupt, ["huge-1", "huge-2", "huge-3"]);
    // In list's order: by skill.
    let skills: Vec<&str> = locks.iter().map(|l| l.skill.as_str()).collect();
    let mut sorted = skills.clone();
    sorted.sort_unstable();
    assert_eq!(skills, sorted);
    // Every copy is on the lock's lease: releasing it clears them all.
    assert!(matches!(lock.release(&token), Reply::Released { .. }));
}

// ---------------------------------------------------------------------------
// Every range request carries a limit, on the wire.

/// A protobuf field: its number and its value (varint, or bytes).
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The top-level fields of a protobuf message (None: not one).
fn fields(msg: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < msg.len() {
        let tag = varint(msg, &mut at)?;
        let field = match tag & 7 {
            0 => Field::Varint(varint(msg, &mut at)?),
            2 => {
                let len = usize::try_from(varint(msg, &mut at)?).ok()?;
                let bytes = msg.get(at..at + len)?;
                at += len;
                Field::Bytes(bytes)
            }
            1 => {
                at += 8;
                Field::Other
            }
            5 => {
                at += 4;
                Field::Other
            }
            _ => return None,
        };
        out.push((tag >> 3, field));
    }
    Some(out)
}

/// The limit of a message that is a `RangeRequest` for a key under
/// `prefix`: its first field is the key (field 1, bytes, starting with the
/// prefix; a transaction's first field is a comparison, a lease request's a
/// number), its limit field 3 (`Some(0)`: none).
fn range_limit(msg: &[u8], prefix: &[u8]) -> Option<u64> {
    let fields = fields(msg)?;
    match fields.first() {
        Some((1, Field::Bytes(key))) if key.starts_with(prefix) => {}
        _ => return None,
    }
    Some(
        fields
            .iter()
            .find_map(|(n, f)| match (n, f) {
                (3, Field::Varint(l)) => Some(*l),
                _ => None,
            })
            .unwrap_or(0),
    )
}

#[test]
fn every_range_request_carries_a_limit() {
    let Some(ep) = harness::etcd_endpoint("every_range_request_carries_a_limit") else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let prefix = harness::etcd_prefix(&env, "reads");
    // Every gRPC message a client sends, through a tap on the proxy.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tap_seen = seen.clone();
    let proxy = Proxy::tapped(
        &ep,
        Box::new(move || {
            let (seen, mut grpc) = (tap_seen.clone(), GrpcMessages::new());
            Box::new(move |bytes: &[u8]| {
                seen.lock().unwrap().extend(grpc.feed(bytes));
                Then::Go
            })
        }),
    );
    let url = format!("etcd://{}{prefix}", proxy.addr());
    let lock = Lock::new(&cwd, "limits", "o/r").in_store(&url);
    let token = lock.acquire().token().to_owned();
    assert!(matches!(lock.status(), Reply::Status { .. }));
    assert!(matches!(lock.check(&token), Reply::Held { .. }));
    assert!(matches!(lock.renew(&token), Reply::Renewed { .. }));
    let list = lock.list();
    assert!(matches!(list, Reply::List { .. }), "{list:?}");
    assert!(matches!(lock.history(), Reply::History { .. }));
    let all = lock.store_history();
    assert!(matches!(all, Reply::History { .. }), "{all:?}");
    assert!(matches!(lock.release(&token), Reply::Released { .. }));
    let messages = seen.lock().unwrap().clone();
    let limits: Vec<u64> = messages
        .iter()
        .filter_map(|m| range_limit(m, prefix.as_bytes()))
        .collect();
    println!(
        "{} gRPC messages, {} range requests, limits {limits:?}",
        messages.len(),
        limits.len()
    );
    assert!(limits.len() >= 7, "too few range requests seen: {limits:?}");
    assert!(
        limits.iter().all(|l| *l > 0),
        "a range request without a limit: {limits:?}"
    );
}
