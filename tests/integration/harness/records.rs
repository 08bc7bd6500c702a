//! The records a store keeps, as tests read, plant or edit them on disk:
//! typed where a test reads a field ([`Record`], [`GitState`]), the rest
//! kept as it is.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Value;

/// The parts of a stored lock record (the file store's `owner.json`, the
/// `record` of the git store's `lock.json`) that tests read or change; the
/// rest is kept as it is.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Record {
    pub skill: String,
    pub started: String,
    pub expires: String,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// A state as the git store keeps it (`lock.json`): its `record` typed,
/// the rest kept as it is.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct GitState {
    pub record: Record,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// `v` (an object a test plants) with `field` set to `to`.
#[track_caller]
pub fn set_field(v: &mut serde_json::Value, field: &str, to: impl Into<serde_json::Value>) {
    v.as_object_mut()
        .expect("a JSON object")
        .insert(field.to_owned(), to.into());
}

impl Record {
    /// Its `owner_pid`, if it has one.
    pub fn owner_pid(&self) -> Option<u64> {
        self.rest
            .get("owner_pid")
            .and_then(serde_json::Value::as_u64)
    }
}

/// A JSON file read as `T`, failing the test naming the file.
#[track_caller]
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A JSON value read as `T` (a state a test built, read typed).
#[track_caller]
pub fn typed<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

/// `v` as JSON bytes, its keys in the order a `serde_json::Value` prints
/// them (sorted), whatever order its typed fields are declared in.
#[track_caller]
pub fn json_bytes(v: &impl Serialize) -> Vec<u8> {
    let value = serde_json::to_value(v).unwrap_or_else(|e| panic!("{e}"));
    serde_json::to_vec(&value).unwrap_or_else(|e| panic!("{e}"))
}

/// One field of a JSON object file (an owner record a store wrote), for a
/// test about what is on disk rather than about a reply.
#[track_caller]
pub fn json_file_field(path: &Path, field: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v.get(field).cloned().unwrap_or(Value::Null)
}

/// Sets fields of a JSON object file, as a hand or another version would.
#[track_caller]
pub fn edit_json_file(path: &Path, fields: &[(&str, Value)]) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    for (name, value) in fields {
        v[*name] = value.clone();
    }
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}
