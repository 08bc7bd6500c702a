//! The five tools of `skill-lock mcp` (SPEC §2.9): their names,
//! descriptions (the write-lock block's rules, for an agent that reads only
//! the tool list), input and output schemas, and the validation of a call's
//! arguments into what the commands take, with the commands' own errors.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::key::LockKey;

/// One tool of the server; each is the command of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Name {
    /// `status` (SPEC §2.4).
    Status,
    /// `acquire` (SPEC §2.1), with `since`, `ttl`, `note`.
    Acquire,
    /// `renew` (SPEC §2.2), of this server's acquisition `fence`.
    Renew,
    /// `release` (SPEC §2.3), of this server's acquisition `fence`.
    Release,
    /// `check` (SPEC §2.6), of this server's acquisition `fence`.
    Check,
}

impl Name {
    /// Every tool, in the order they are listed.
    pub(crate) const ALL: [Self; 5] = [
        Self::Status,
        Self::Acquire,
        Self::Renew,
        Self::Check,
        Self::Release,
    ];

    /// The tool's name on the wire.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::Acquire => "acquire",
            Self::Renew => "renew",
            Self::Release => "release",
            Self::Check => "check",
        }
    }

    /// The tool called `name`.
    ///
    /// # Errors
    /// [`Error::Usage`] naming the tools there are.
    pub(crate) fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == name)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "unknown tool {name:?}: this server has status, acquire, renew, check and release"
                ))
            })
    }

    /// The arguments the tool takes (any other is refused).
    fn arguments(self) -> &'static [&'static str] {
        match self {
            Self::Status => &["skill", "repo", "root"],
            Self::Acquire => &["skill", "repo", "root", "since", "ttl", "note"],
            Self::Renew => &["skill", "repo", "root", "fence", "ttl"],
            Self::Release | Self::Check => &["skill", "repo", "root", "fence"],
        }
    }
}

/// What every tool's description ends with: the handle, and what the
/// server does on its own (nothing but release at the end of the session).
const COMMON: &str = "\
`skill`, `repo` and `root` name the lock: `root` is the absolute path of the checkout the \
skill works in (the directory its shell commands run in), so this tool and the shell form \
`skill-lock ... --repo` reach the same lock. Every answer has `result`; an `error` answer \
(isError) has `error` and `message`, which says what to fix. Tokens never leave this server: \
renew, check and release take the `fence` that this server's acquire answered, and act only \
on locks this server acquired. The server releases every lock it holds when the session \
ends; it never renews on its own and never forces.";

/// The tool's description: the write-lock block's rule for this step.
fn description(name: Name) -> String {
    let rule = match name {
        Name::Status => {
            "Step 1 of the write lock, BEFORE reading what the run will act on: note the lock's \
             `state` (held, stale or free) and `fence` (null when none; pass it to acquire as \
             `since`). Read-only. Then read and classify, posting nothing."
        }
        Name::Acquire => {
            "Step 2, before the first write: takes the lock when free or stale. Pass `since` = the \
             `fence` status showed (0 or null when it showed none) and `ttl` (seconds; 900 suits a \
             write phase). `acquired`: go on, and keep `fence`: it is this acquisition's handle for \
             renew, check and release. READ AGAIN everything you will act on unless status said \
             `free` AND `others_since` is false (a lock that was held or stale may have been \
             written under since). `took_over` not null: this run replaced a stale lock, say so \
             in the recap. `already_running`: another run holds it: post NOTHING and stop the \
             write phase; tell the user `holder` (note, host, started, expires) and `hint` word \
             for word, which an operator runs only once that holder is known dead, never you. \
             `error`: post nothing; nothing was taken."
        }
        Name::Renew => {
            "Step 3, IMMEDIATELY before EACH post: extends this acquisition's lease (default: \
             the ttl it was acquired with). `renewed`: make the post (`was_expired` true: the \
             lease had run out but nobody took the lock; the answer's `fence` is then new and is \
             the handle from now on; mention it in the recap). `not_owner` or `not_held`: the \
             lease is lost: STOP posting at once, even mid-batch, release, and report which \
             posts were made. `error`: the lease cannot be confirmed: do not post; release."
        }
        Name::Check => {
            "Read-only: whether this acquisition still holds a live lease. `held`: yes \
             (`expires_in` seconds left). `not_owner`, `expired`, `not_held`: it does not; post \
             nothing more. Before a post, prefer renew, which checks the same and extends."
        }
        Name::Release => {
            "Step 4, after the recap, and on stop-and-surface (a failed post, a renew that \
             answered not_owner/not_held/error, an abandoned run): releases this acquisition. \
             `released` or `not_held` (already gone): done. `refused`: another run took the \
             lock over after this lease ran out (`holder`): say so in the recap. It never \
             removes another run's lock."
        }
    };
    format!("{rule} {COMMON}")
}

/// The JSON Schema of the tool's arguments.
fn input_schema(name: Name) -> Value {
    let mut properties = json!({
        "skill": {"type": "string", "description": "The skill's name: 1-64 of [A-Za-z0-9._-], starting with a letter or digit."},
        "repo": {"type": "string", "description": "The repository posted to, as owner/name (e.g. apache/airflow)."},
        "root": {"type": "string", "description": "Absolute path of the checkout the skill works in (the project root, as --root)."},
    });
    let extra = match name {
        Name::Status => json!({}),
        Name::Acquire => json!({
            "since": {"type": ["integer", "null"], "minimum": 0, "description": "The fence status showed before the run read what it acts on (null or 0 when none). The answer's others_since then says whether another run acquired the lock since."},
            "ttl": {"type": "integer", "minimum": 1, "maximum": 2_592_000, "description": "Lease in seconds (default 7200; 900 suits a write phase)."},
            "note": {"type": "string", "description": "Which run this is, kept in the record (at most 1,000 bytes, no control characters but tab)."},
        }),
        Name::Renew => json!({
            "fence": {"type": "integer", "minimum": 0, "description": "The fence this server's acquire answered (or a later renew, when the lease was revived)."},
            "ttl": {"type": "integer", "minimum": 1, "maximum": 2_592_000, "description": "New lease in seconds (default: the ttl it was acquired with)."},
        }),
        Name::Release | Name::Check => json!({
            "fence": {"type": "integer", "minimum": 0, "description": "The fence this server's acquire answered."},
        }),
    };
    if let (Some(all), Value::Object(more)) = (properties.as_object_mut(), extra) {
        all.extend(more);
    }
    let mut required = vec!["skill", "repo", "root"];
    if matches!(name, Name::Renew | Name::Release | Name::Check) {
        required.push("fence");
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// The JSON Schema of the tool's answer: the command's own object.
fn output_schema(name: Name) -> Value {
    let results: &[&str] = match name {
        Name::Status => &["status", "error"],
        Name::Acquire => &["acquired", "already_running", "error"],
        Name::Renew => &["renewed", "not_owner", "not_held", "error"],
        Name::Check => &["held", "not_owner", "not_held", "expired", "error"],
        Name::Release => &["released", "not_held", "refused", "error"],
    };
    let holder = json!({"type": ["object", "null"], "description": "The owner record (SPEC §4), never its token."});
    let int_or_null = json!({"type": ["integer", "null"]});
    let string_or_null = json!({"type": ["string", "null"]});
    json!({
        "type": "object",
        "properties": {
            "result": {"type": "string", "enum": results},
            "skill": {"type": "string"},
            "repo": {"type": "string"},
            "lock": {"type": "string", "description": "The lock's path, or its key in a network store."},
            "fence": int_or_null,
            "state": {"type": "string", "enum": ["held", "stale", "free"]},
            "stale_reason": {"type": "string"},
            "holder": holder,
            "expires_in": int_or_null,
            "started": {"type": "string"},
            "expires": {"type": "string"},
            "renewed": string_or_null,
            "ttl": {"type": "integer"},
            "note": string_or_null,
            "owner_pid": int_or_null,
            "took_over": {"type": ["object", "null"]},
            "others_since": {"type": ["boolean", "null"]},
            "hint": {"type": "string"},
            "was_expired": {"type": "boolean"},
            "forced": {"type": "boolean"},
            "error": {"type": "string"},
            "message": {"type": "string"},
        },
        "required": ["result"],
    })
}

fn object(v: Value) -> Arc<JsonObject> {
    Arc::new(match v {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    })
}

/// The tool as `tools/list` shows it.
pub(crate) fn definition(name: Name) -> Tool {
    let read_only = matches!(name, Name::Status | Name::Check);
    Tool::new(name.as_str(), description(name), object(input_schema(name)))
        .with_raw_output_schema(object(output_schema(name)))
        .with_annotations(
            ToolAnnotations::new()
                .read_only(read_only)
                .destructive(false)
                .open_world(false),
        )
}

/// A call's arguments, checked against what the tool takes.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    name: Name,
    args: &'a JsonObject,
}

impl<'a> Call<'a> {
    /// The arguments of a call of `name`; none it does not take.
    ///
    /// # Errors
    /// [`Error::Usage`] for an argument the tool does not take (a token or
    /// `force` above all: this server never takes one, never forces).
    pub(crate) fn new(name: Name, args: &'a JsonObject) -> Result<Self> {
        if let Some(other) = args
            .keys()
            .find(|k| !name.arguments().contains(&k.as_str()))
        {
            let why = match other.as_str() {
                "token" => "tokens never leave this server: pass the `fence` its acquire answered",
                "force" => "this server never forces; an operator runs release --force in a shell",
                _ => "it is not one of this tool's arguments",
            };
            return Err(Error::Usage(format!(
                "{} takes no argument {other:?} ({why}); it takes {}",
                name.as_str(),
                name.arguments().join(", ")
            )));
        }
        Ok(Self { name, args })
    }

    /// The tool called.
    pub(crate) fn name(&self) -> Name {
        self.name
    }

    /// A string argument; `None` when absent or null.
    fn text(&self, arg: &str) -> Result<Option<&'a str>> {
        match self.args.get(arg) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(Error::Usage(format!(
                "{} argument {arg:?} must be a string, not {other}",
                self.name.as_str()
            ))),
        }
    }

    /// A whole-number argument, as the command line would carry it
    /// (a number, or a string of one); `None` when absent or null.
    fn number(&self, arg: &str) -> Result<Option<String>> {
        match self.args.get(arg) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(other) => Err(Error::Usage(format!(
                "{} argument {arg:?} must be a whole number, not {other}",
                self.name.as_str()
            ))),
        }
    }

    fn required(&self, arg: &str, what: &str) -> Result<&'a str> {
        self.text(arg)?
            .ok_or_else(|| Error::Usage(format!("{} needs {arg:?}: {what}", self.name.as_str())))
    }

    /// `skill` and `repo`, validated as the command validates them.
    ///
    /// # Errors
    /// [`Error::Usage`] when one is missing; [`Error::InvalidSkill`],
    /// [`Error::InvalidRepo`].
    pub(crate) fn key(&self) -> Result<LockKey> {
        let skill = self.required("skill", "the skill's name, e.g. \"issue-triage\"")?;
        let repo = self.required(
            "repo",
            "the repository as owner/name, e.g. \"apache/airflow\"",
        )?;
        LockKey::new(skill, repo)
    }

    /// `skill` and `repo` as given, for the error object.
    pub(crate) fn lock_as_given(&self) -> Option<(String, String)> {
        let skill = self.args.get("skill")?.as_str()?.to_owned();
        let repo = self.args.get("repo")?.as_str()?.to_owned();
        Some((skill, repo))
    }

    /// `root`: the checkout the skill works in.
    ///
    /// # Errors
    /// [`Error::Usage`] when it is missing or empty.
    pub(crate) fn root(&self) -> Result<PathBuf> {
        let root = self.required(
            "root",
            "the absolute path of the checkout the skill works in (the directory its shell \
             commands run in), so that this tool and the shell commands reach the same lock",
        )?;
        if root.is_empty() {
            return Err(Error::Usage(format!(
                "{} argument \"root\" is empty: give the absolute path of the checkout the skill works in",
                self.name.as_str()
            )));
        }
        Ok(PathBuf::from(root))
    }

    /// `ttl`, checked as `--ttl` is; `None` when not given.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`].
    pub(crate) fn ttl(&self) -> Result<Option<u64>> {
        self.number("ttl")?
            .map(|t| crate::lease::parse_ttl(&t))
            .transpose()
    }

    /// `note`, checked as `--note` is.
    ///
    /// # Errors
    /// [`Error::InvalidNote`].
    pub(crate) fn note(&self) -> Result<Option<String>> {
        self.text("note")?
            .map(|n| crate::config::validate_note(&OsString::from(n)))
            .transpose()
    }

    /// `since`, checked as `--since` is (null stands for 0).
    ///
    /// # Errors
    /// [`Error::Usage`].
    pub(crate) fn since(&self) -> Result<Option<u64>> {
        match self.args.get("since") {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(0)),
            Some(_) => self
                .number("since")?
                .map(|s| crate::config::parse_since(&s))
                .transpose(),
        }
    }

    /// `fence`: the handle of one of this server's acquisitions.
    ///
    /// # Errors
    /// [`Error::Usage`] when it is missing or not a whole number.
    pub(crate) fn fence(&self) -> Result<u64> {
        let how = "pass the `fence` that this server's acquire answered (its handle for renew, \
                   check and release)";
        let text = self.number("fence")?.ok_or_else(|| {
            Error::Usage(format!("{} needs \"fence\": {how}", self.name.as_str()))
        })?;
        text.parse::<u64>().map_err(|_| {
            Error::Usage(format!(
                "{} argument \"fence\" {text:?} is not a whole number: {how}",
                self.name.as_str()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> JsonObject {
        match v {
            Value::Object(map) => map,
            _ => JsonObject::new(),
        }
    }

    #[test]
    fn every_tool_requires_the_lock_and_its_root_and_takes_no_token() {
        for name in Name::ALL {
            let tool = definition(name);
            let required = tool.input_schema["required"].as_array().unwrap();
            for arg in ["skill", "repo", "root"] {
                assert!(required.contains(&json!(arg)), "{name:?}: {arg}");
            }
            let props = tool.input_schema["properties"].as_object().unwrap();
            assert!(!props.contains_key("token") && !props.contains_key("force"));
            assert!(tool.output_schema.is_some(), "{name:?}");
            assert_eq!(Name::parse(name.as_str()).unwrap(), name);
        }
        assert_eq!(Name::parse("store").unwrap_err().code(), "usage");
    }

    #[test]
    fn arguments_are_checked_as_the_command_checks_them() {
        let a = args(json!({"skill": "s", "repo": "o/r", "root": "/x", "ttl": 0}));
        let call = Call::new(Name::Acquire, &a).unwrap();
        assert_eq!(call.ttl().unwrap_err().code(), "invalid_ttl");
        let a =
            args(json!({"skill": "s", "repo": "o/r", "root": "/x", "ttl": "900", "since": null}));
        let call = Call::new(Name::Acquire, &a).unwrap();
        assert_eq!(call.ttl().unwrap(), Some(900));
        assert_eq!(call.since().unwrap(), Some(0));
        assert_eq!(call.note().unwrap(), None);
        let a = args(json!({"skill": "s", "repo": "o/r", "root": "/x", "note": "a\nb"}));
        let call = Call::new(Name::Acquire, &a).unwrap();
        assert_eq!(call.note().unwrap_err().code(), "invalid_note");
        let a = args(json!({"skill": "-s", "repo": "o/r", "root": "/x"}));
        assert_eq!(
            Call::new(Name::Status, &a)
                .unwrap()
                .key()
                .unwrap_err()
                .code(),
            "invalid_skill"
        );
        let a = args(json!({"skill": "s", "repo": "o/r"}));
        let err = Call::new(Name::Status, &a).unwrap().root().unwrap_err();
        assert!(
            err.code() == "usage" && err.to_string().contains("root"),
            "{err}"
        );
    }

    #[test]
    fn a_token_force_or_missing_fence_is_refused() {
        let a = args(json!({"skill": "s", "repo": "o/r", "root": "/x", "token": "t"}));
        let err = Call::new(Name::Release, &a).unwrap_err();
        assert!(err.to_string().contains("fence"), "{err}");
        let a = args(json!({"skill": "s", "repo": "o/r", "root": "/x", "fence": 1, "force": true}));
        assert_eq!(Call::new(Name::Release, &a).unwrap_err().code(), "usage");
        let a = args(json!({"skill": "s", "repo": "o/r", "root": "/x"}));
        let err = Call::new(Name::Renew, &a).unwrap().fence().unwrap_err();
        assert_eq!(err.code(), "usage");
        let a = args(json!({"skill": "s", "repo": "o/r", "root": "/x", "fence": "7"}));
        assert_eq!(Call::new(Name::Check, &a).unwrap().fence().unwrap(), 7);
        let a = args(json!({"skill": "s", "repo": "o/r", "root": "/x", "fence": -1}));
        assert_eq!(
            Call::new(Name::Check, &a)
                .unwrap()
                .fence()
                .unwrap_err()
                .code(),
            "usage"
        );
    }
}
