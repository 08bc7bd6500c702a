//! What `etcdctl` says about a cluster, read through named questions: a
//! test asks for the ttl a lease was granted or a key's stored value, and
//! etcdctl's own JSON (`-w json`) is read here, never field by field in a test.

use std::process::{Command, Stdio};

use base64::Engine as _;
use serde_json::Value;

/// `etcdctl` against `ep`, its standard output as JSON.
#[track_caller]
fn json(ep: &str, args: &[&str]) -> Value {
    let out = Command::new("etcdctl")
        .args(["--endpoints", ep, "-w", "json"])
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("etcdctl runs");
    assert!(out.status.success(), "etcdctl {args:?} failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The TTL the cluster granted to the lease of key `key`.
#[track_caller]
pub fn granted_ttl(ep: &str, key: &str) -> u64 {
    let got = json(ep, &["get", key]);
    let lease = got.pointer("/kvs/0/lease").and_then(Value::as_i64);
    let lease = lease.unwrap_or_else(|| panic!("no lease on {key}: {got}"));
    let ttl = json(ep, &["lease", "timetolive", &format!("{lease:x}")]);
    ttl.pointer("/granted-ttl")
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no granted-ttl: {ttl}"))
}

/// The stored value of the first key under `prefix`, decoded.
#[track_caller]
pub fn first_value(ep: &str, prefix: &str) -> Vec<u8> {
    let got = json(ep, &["get", "--prefix", prefix]);
    let value = got.pointer("/kvs/0/value").and_then(Value::as_str);
    let value = value.unwrap_or_else(|| panic!("nothing under {prefix}: {got}"));
    base64::engine::general_purpose::STANDARD
        .decode(value)
        .unwrap_or_else(|e| panic!("etcdctl's value is not base64: {e}"))
}
