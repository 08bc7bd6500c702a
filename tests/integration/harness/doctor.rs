//! `doctor`'s object (SPEC §2.10), typed: the tests read its fields here
//! and nowhere else.

use serde::Deserialize;

use super::Out;

/// A path and the rule that chose it.
#[derive(Debug, Deserialize)]
pub struct Placed {
    pub path: String,
    pub rule: String,
}

/// The store and where its choice came from.
#[derive(Debug, Deserialize)]
pub struct StoreReport {
    pub from: String,
    pub url: Option<String>,
    pub lock: Option<String>,
    pub answers: Option<bool>,
}

/// One refusal and its fix.
#[derive(Debug, Deserialize)]
pub struct Refusal {
    pub what: String,
    pub message: String,
}

/// The whole object.
#[derive(Debug, Deserialize)]
pub struct Doctor {
    pub result: String,
    pub ok: bool,
    pub root: Option<Placed>,
    pub layer: Option<Placed>,
    pub store: Option<StoreReport>,
    pub refusals: Vec<Refusal>,
}

impl Doctor {
    /// Every refusal's message, one a line.
    pub fn refused(&self) -> String {
        self.refusals
            .iter()
            .map(|r| format!("{}: {}\n", r.what, r.message))
            .collect()
    }
}

/// `out`'s stdout as `doctor`'s one object.
#[track_caller]
pub fn doctor(out: &Out) -> Doctor {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "doctor printed no object of its shape ({e}): {}",
            out.stdout
        )
    })
}
