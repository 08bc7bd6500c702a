//! `doctor` (SPEC §2.10): where things are and why, read-only, as
//! `git config --show-origin` does: the root and the rule that chose it,
//! the personal layer, the store and where its choice came from, whether it
//! answers, and every refusal a command here would meet, each with its fix.

use serde_json::{Map, Value, json};

use crate::config::{self, Environment, StoreSource};
use crate::engine::{self, Context};
use crate::key::LockKey;
use crate::layer;
use crate::output::ExitStatus;
use crate::root;
use crate::store::Store;

/// What `doctor` was asked.
#[derive(Debug)]
pub(crate) struct Request {
    /// `<skill> --repo`, when given: the lock's path or key too.
    pub key: Option<LockKey>,
    /// `--root`.
    pub root: Option<std::path::PathBuf>,
    /// `--store`.
    pub store: Option<std::ffi::OsString>,
    /// `--text`: for a person.
    pub text: bool,
}

/// One refusal a command here would meet, and what fixes it.
fn refusal(what: &str, message: impl Into<String>) -> Value {
    let message: String = message.into();
    json!({ "what": what, "message": message })
}

/// Runs `doctor`: prints one JSON object (or text) and returns 0 when
/// nothing is refused, else 2.
pub(crate) fn run(req: &Request, env: &Environment) -> ExitStatus {
    let mut out = Map::new();
    let mut refusals = Vec::new();
    out.insert("result".into(), json!("doctor"));
    out.insert("cwd".into(), json!(env.cwd.display().to_string()));
    where_it_is(req, env, &mut out, &mut refusals);
    config_file(env, &mut out, &mut refusals);
    store(req, env, &mut out, &mut refusals);
    let ok = refusals.is_empty();
    out.insert("ok".into(), json!(ok));
    out.insert("refusals".into(), Value::Array(refusals));
    let printed = if req.text {
        text(&Value::Object(out))
    } else {
        in_order(&out)
    };
    let status = if ok {
        ExitStatus::Success
    } else {
        ExitStatus::Error
    };
    crate::output::print_plain(&printed, status)
}

/// The root, the layer, and a configuration file the tree carries.
fn where_it_is(
    req: &Request,
    env: &Environment,
    out: &mut Map<String, Value>,
    refusals: &mut Vec<Value>,
) {
    let r = match root::discover(req.root.as_deref(), &env.cwd, &env.user) {
        Ok(r) => r,
        Err(e) => {
            out.insert("root".into(), Value::Null);
            out.insert("layer".into(), Value::Null);
            refusals.push(refusal(e.code(), e.to_string()));
            return;
        }
    };
    out.insert(
        "root".into(),
        json!({ "path": r.dir.display().to_string(), "rule": r.rule.describe() }),
    );
    out.insert(
        "original_root".into(),
        json!(r.original.as_ref().map(|o| o.display().to_string())),
    );
    match layer::resolve(&r.dir) {
        Ok(l) => {
            out.insert(
                "layer".into(),
                json!({ "path": l.dir.display().to_string(), "rule": l.kind.describe() }),
            );
            if let Some(found) = l.planted_config(r.original.as_deref()) {
                refusals.push(refusal(
                    "tree_config",
                    format!(
                        "{} is in the tree and is never read; choose the store in your \
                         configuration file, with --store or SKILL_LOCK_STORE, then delete it \
                         (commands refuse while nothing you set chooses the store)",
                        found.display()
                    ),
                ));
            }
        }
        Err(e) => {
            out.insert("layer".into(), Value::Null);
            refusals.push(refusal(e.code(), e.to_string()));
        }
    }
}

/// The user's configuration file: where, whether it is there, and whether
/// it passes its checks.
fn config_file(env: &Environment, out: &mut Map<String, Value>, refusals: &mut Vec<Value>) {
    let place = crate::user_config::locate(&env.config, &env.user);
    out.insert(
        "config_file".into(),
        json!(place.as_ref().map(|p| json!({
            "path": p.path.display().to_string(),
            "from": p.from,
            "exists": std::fs::symlink_metadata(&p.path).is_ok(),
        }))),
    );
    if let Err(e) = config::user_config(env) {
        refusals.push(refusal("config_file", e.to_string()));
    }
}

/// The store, where its choice came from, and whether it answers.
fn store(
    req: &Request,
    env: &Environment,
    out: &mut Map<String, Value>,
    refusals: &mut Vec<Value>,
) {
    let repo = req.key.as_ref().map(LockKey::repo);
    let choice =
        match config::choose_store(req.store.as_ref(), req.root.as_deref(), env, repo, true) {
            Ok(choice) => choice,
            Err(e) => {
                out.insert("store".into(), Value::Null);
                let message = e.to_string();
                if !refusals
                    .iter()
                    .any(|r| r["message"].as_str() == Some(&message))
                {
                    refusals.push(refusal(e.code(), message));
                }
                return;
            }
        };
    let from = match choice.source {
        StoreSource::Flag => "--store".to_owned(),
        StoreSource::Env => "SKILL_LOCK_STORE".to_owned(),
        StoreSource::ConfigFile => choice
            .origin
            .clone()
            .unwrap_or_else(|| "the configuration file".into()),
        StoreSource::Default => "the default: the file store in the personal layer".into(),
    };
    let mut store = Map::new();
    store.insert("from".into(), json!(from));
    match choice.open() {
        Ok(opened) => {
            store.insert("url".into(), json!(opened.describe()));
            if let Some(key) = &req.key {
                store.insert("lock".into(), json!(opened.location(key).lock));
                let answers = engine::status(&opened, key, &Context::here())
                    .map_err(|e| refusals.push(refusal(e.code(), e.to_string())))
                    .is_ok();
                store.insert("answers".into(), json!(answers));
            }
        }
        Err(e) => {
            store.insert("answers".into(), json!(false));
            refusals.push(refusal(e.code(), e.to_string()));
        }
    }
    let legacy: Vec<Value> = choice
        .legacy
        .iter()
        .map(|l| json!(l.dir().display().to_string()))
        .collect();
    store.insert("legacy".into(), json!(legacy));
    out.insert("store".into(), Value::Object(store));
}

/// The fields in the order a reader expects (`result` first, as in every
/// object), one line.
fn in_order(out: &Map<String, Value>) -> String {
    const ORDER: [&str; 9] = [
        "result",
        "ok",
        "cwd",
        "root",
        "layer",
        "original_root",
        "config_file",
        "store",
        "refusals",
    ];
    let fields: Vec<String> = ORDER
        .iter()
        .filter_map(|k| Some(format!("{}:{}", json!(k), out.get(*k)?)))
        .collect();
    format!("{{{}}}\n", fields.join(","))
}

/// The same report for a person.
fn text(v: &Value) -> String {
    use std::fmt::Write as _;
    let s = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    let mut t = String::new();
    let _ = writeln!(t, "directory:   {}", s(&v["cwd"]));
    for (name, label) in [("root", "root:        "), ("layer", "layer:       ")] {
        match &v[name] {
            Value::Null => {
                let _ = writeln!(t, "{label}(none)");
            }
            x => {
                let _ = writeln!(
                    t,
                    "{label}{}\n             {}",
                    s(&x["path"]),
                    s(&x["rule"])
                );
            }
        }
    }
    match &v["config_file"] {
        Value::Null => {
            let _ = writeln!(t, "config file: (none: no HOME or SKILL_LOCK_CONFIG)");
        }
        c => {
            let state = if c["exists"] == json!(true) {
                "present"
            } else {
                "absent"
            };
            let _ = writeln!(
                t,
                "config file: {} ({state}; from {})",
                s(&c["path"]),
                s(&c["from"])
            );
        }
    }
    match &v["store"] {
        Value::Null => {
            let _ = writeln!(t, "store:       (refused, below)");
        }
        st => {
            let _ = writeln!(t, "store:       {}", s(&st["url"]));
            let _ = writeln!(t, "             chosen by {}", s(&st["from"]));
            if !st["lock"].is_null() {
                let _ = writeln!(t, "lock:        {}", s(&st["lock"]));
            }
            if !st["answers"].is_null() {
                let _ = writeln!(t, "answers:     {}", st["answers"]);
            }
        }
    }
    let refusals = v["refusals"].as_array().cloned().unwrap_or_default();
    if refusals.is_empty() {
        let _ = writeln!(t, "ok:          nothing here is refused");
    }
    for r in refusals {
        let _ = writeln!(t, "refused ({}): {}", s(&r["what"]), s(&r["message"]));
    }
    t
}
