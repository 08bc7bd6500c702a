//! The user's configuration file (SPEC §8): the one file, outside every
//! tree, that maps repositories to stores, so that every clone, worktree,
//! machine and launcher of one user picks the same store for a repository.
//!
//! Found at `SKILL_LOCK_CONFIG`, else `$XDG_CONFIG_HOME/apache-magpie/`,
//! else `~/.config/apache-magpie/` (Windows: `%APPDATA%\apache-magpie\`),
//! `skill-lock.toml`. It may be a link; what it resolves to must be a
//! regular file the user (or root) owns that nobody else can write. A file
//! that exists but fails any check is an error, never "absent": reading it
//! as absent would silently move a shared lock to a local one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::ownership::User;

/// The file's name in the configuration folder.
pub(crate) const FILE_NAME: &str = "skill-lock.toml";
/// Apache Magpie's folder in the user's configuration folder.
pub(crate) const FOLDER: &str = "apache-magpie";
/// The most bytes read of the file.
const LIMIT: usize = 64 * 1024;

/// Where the user's configuration file is, and why there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    /// The path (not resolved: a link is followed when it is read).
    pub path: PathBuf,
    /// What chose it (`SKILL_LOCK_CONFIG`, `XDG_CONFIG_HOME`, ...).
    pub from: &'static str,
}

/// The inputs that locate the file, as the environment gave them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Inputs {
    /// `SKILL_LOCK_CONFIG`.
    pub explicit: Option<PathBuf>,
    /// `XDG_CONFIG_HOME`.
    pub xdg_config_home: Option<PathBuf>,
    /// `HOME`.
    pub home: Option<PathBuf>,
    /// `APPDATA` (Windows).
    pub appdata: Option<PathBuf>,
}

/// Locates the user's configuration file. Under sudo (root with
/// `SUDO_UID`), the invoking user's home from the password file is used
/// unless `SKILL_LOCK_CONFIG` names the file.
pub(crate) fn locate(inputs: &Inputs, user: &User) -> Option<Place> {
    if let Some(p) = &inputs.explicit {
        return Some(Place {
            path: p.clone(),
            from: "SKILL_LOCK_CONFIG",
        });
    }
    let at = |dir: &Path| dir.join(FOLDER).join(FILE_NAME);
    if cfg!(windows) {
        return inputs.appdata.as_deref().map(|d| Place {
            path: at(d),
            from: "%APPDATA%",
        });
    }
    if let Some(home) = sudo_home(user) {
        return Some(Place {
            path: at(&home.join(".config")),
            from: "the sudo user's ~/.config",
        });
    }
    if let Some(d) = inputs
        .xdg_config_home
        .as_deref()
        .filter(|d| d.is_absolute())
    {
        return Some(Place {
            path: at(d),
            from: "$XDG_CONFIG_HOME",
        });
    }
    inputs.home.as_deref().map(|h| Place {
        path: at(&h.join(".config")),
        from: "~/.config",
    })
}

/// The home directory of the user sudo ran us for, when it differs from ours.
#[cfg(unix)]
fn sudo_home(user: &User) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let uid = user.uid();
    if euid != 0 || uid == 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.get(2)?.parse::<u32>().ok()? == uid {
            f.get(5).map(PathBuf::from)
        } else {
            None
        }
    })
}

#[cfg(windows)]
fn sudo_home(_user: &User) -> Option<PathBuf> {
    None
}

/// The file as written.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    store: Option<String>,
    #[serde(default)]
    repos: BTreeMap<String, String>,
}

/// A store setting of the file, and the line it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The store URL.
    pub url: String,
    /// The key that chose it (`store`, `"apache/*"`, `"apache/airflow"`).
    pub key: String,
    /// Its line, 1-based.
    pub line: usize,
}

/// The user's configuration, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserConfig {
    /// Where it was read.
    pub place: Place,
    /// `store = "URL"`: every repository's default.
    pub default: Option<Entry>,
    /// `[repos]`, keys lower-cased: `owner/name` and `owner/*`.
    pub repos: Vec<(String, Entry)>,
}

impl UserConfig {
    /// Reads the file at `place`: `None` when nothing is there.
    ///
    /// # Errors
    /// [`Error::Usage`] naming the file and what fixes it, for a file that
    /// exists but cannot be read, fails the ownership and permission checks,
    /// is too big, not UTF-8, not valid TOML, or has an unknown key or a
    /// malformed repository pattern.
    pub(crate) fn read(place: Place, user: &User) -> Result<Option<Self>> {
        let shown = place.path.display().to_string();
        let bad = |why: String| {
            Error::Usage(format!(
                "the configuration file {shown} (from {}) is not used: {why}",
                place.from
            ))
        };
        let meta = match std::fs::metadata(&place.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return match std::fs::symlink_metadata(&place.path) {
                    // A link to nowhere is a mistake, not "no file".
                    Ok(_) => Err(bad(
                        "it is a link to nothing; point it at your file or remove it".into(),
                    )),
                    Err(_) => Ok(None),
                };
            }
            Err(e) => return Err(bad(format!("it cannot be read ({e}); make it readable"))),
        };
        if !meta.is_file() {
            return Err(bad(
                "it is not a regular file; make it one (a link to one is fine)".into(),
            ));
        }
        check_owner(&meta, user).map_err(bad)?;
        let bytes = crate::bounded::read_regular(&place.path, LIMIT).map_err(|e| {
            bad(format!(
                "{e}; keep it a regular file of at most {} KiB",
                LIMIT / 1024
            ))
        })?;
        let text = String::from_utf8(bytes)
            .map_err(|_| bad("it is not UTF-8; save it as UTF-8".into()))?;
        let raw: Raw = toml::from_str(&text)
            .map_err(|e| bad(format!("{}; fix that line", e.to_string().trim_end())))?;
        let line_of = |needle: &str| {
            text.lines()
                .position(|l| l.trim_start().starts_with(needle))
                .map_or(0, |i| i + 1)
        };
        let default = raw.store.map(|url| Entry {
            url,
            key: "store".into(),
            line: line_of("store"),
        });
        let mut repos = Vec::new();
        for (pattern, url) in raw.repos {
            let line = line_of(&format!("\"{pattern}\""))
                .max(line_of(&format!("'{pattern}'")))
                .max(line_of(&pattern));
            check_pattern(&pattern).map_err(|why| {
                bad(format!(
                    "line {line}: {pattern:?} {why}; write \"owner/name\" or \"owner/*\""
                ))
            })?;
            repos.push((
                pattern.to_ascii_lowercase(),
                Entry {
                    url,
                    key: pattern,
                    line,
                },
            ));
        }
        Ok(Some(Self {
            place,
            default,
            repos,
        }))
    }

    /// The entry that chooses the store of `repo` (`owner/name`), the most
    /// specific first: `owner/name`, then `owner/*`, then `store`. With no
    /// repository (`list`, `history` of every lock), `store` alone.
    pub(crate) fn entry_for(&self, repo: Option<&str>) -> Option<&Entry> {
        if let Some(repo) = repo {
            let repo = repo.to_ascii_lowercase();
            let owner_any = repo.split_once('/').map(|(o, _)| format!("{o}/*"));
            for want in [Some(repo.as_str()), owner_any.as_deref()]
                .into_iter()
                .flatten()
            {
                if let Some((_, e)) = self.repos.iter().find(|(k, _)| k == want) {
                    return Some(e);
                }
            }
        }
        self.default.as_ref()
    }

    /// The same entry in words, for messages and `doctor`.
    pub(crate) fn describe(&self, e: &Entry) -> String {
        format!(
            "{} line {} ({})",
            self.place.path.display(),
            e.line,
            if e.key == "store" {
                "store".to_owned()
            } else {
                format!("[repos] {:?}", e.key)
            }
        )
    }
}

/// Is `pattern` `owner/name` or `owner/*`, with names as SPEC §4 allows?
fn check_pattern(pattern: &str) -> std::result::Result<(), &'static str> {
    let Some((owner, name)) = pattern.split_once('/') else {
        return Err("is no repository pattern");
    };
    let name = if name == "*" { "x" } else { name };
    crate::key::LockKey::new("x", &format!("{owner}/{name}"))
        .map(|_| ())
        .map_err(|_| "is no valid repository name")
}

/// The file must be the user's (or root's) and writable by nobody else.
#[cfg(unix)]
fn check_owner(meta: &std::fs::Metadata, user: &User) -> std::result::Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if !(user.owns_meta(meta) || meta.uid() == 0) {
        return Err(format!(
            "it is owned by uid {}, not by you or root; `chown` it to yourself",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "group or others can write it (mode {:o}); run `chmod go-w` on it",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// On Windows the file lives in the user's profile (`%APPDATA%`), which
/// the default ACLs keep from other users; its owner is not judged here.
#[cfg(windows)]
#[allow(
    clippy::unnecessary_wraps,
    reason = "one signature with Unix, where the check can refuse"
)]
fn check_owner(_meta: &std::fs::Metadata, _user: &User) -> std::result::Result<(), String> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> Place {
        let path = dir.join(FILE_NAME);
        std::fs::write(&path, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        Place {
            path,
            from: "SKILL_LOCK_CONFIG",
        }
    }

    #[test]
    fn the_most_specific_entry_wins() {
        let t = tempfile::tempdir().unwrap();
        let place = write(
            t.path(),
            "store = \"file:/var/locks\"\n[repos]\n\"Apache/*\" = \"git:/srv/a.git\"\n\"apache/airflow\" = \"etcd://h:2379\"\n",
        );
        let c = UserConfig::read(place, &User::new(None)).unwrap().unwrap();
        assert_eq!(
            c.entry_for(Some("apache/AIRFLOW")).unwrap().url,
            "etcd://h:2379"
        );
        assert_eq!(
            c.entry_for(Some("apache/kafka")).unwrap().url,
            "git:/srv/a.git"
        );
        let other = c.entry_for(Some("other/x")).unwrap();
        assert_eq!((other.url.as_str(), other.line), ("file:/var/locks", 1));
        assert_eq!(c.entry_for(None).unwrap().key, "store");
        assert_eq!(c.entry_for(Some("apache/kafka")).unwrap().line, 3);
    }

    #[test]
    fn bad_files_are_errors_never_absent() {
        let t = tempfile::tempdir().unwrap();
        let u = User::new(None);
        let missing = Place {
            path: t.path().join("none.toml"),
            from: "SKILL_LOCK_CONFIG",
        };
        assert_eq!(UserConfig::read(missing, &u).unwrap(), None);
        for text in [
            "stor = \"file:/x\"\n",
            "[repos]\n\"nope\" = \"file:/x\"\n",
            "store = 3\n",
        ] {
            let place = write(t.path(), text);
            let e = UserConfig::read(place, &u).unwrap_err().to_string();
            assert!(e.contains("is not used"), "{e}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let place = write(t.path(), "store = \"file:/x\"\n");
            std::fs::set_permissions(&place.path, std::fs::Permissions::from_mode(0o666)).unwrap();
            let e = UserConfig::read(place, &u).unwrap_err().to_string();
            assert!(e.contains("chmod go-w"), "{e}");
            let link = t.path().join("dangling.toml");
            std::os::unix::fs::symlink(t.path().join("gone"), &link).unwrap();
            let place = Place {
                path: link,
                from: "SKILL_LOCK_CONFIG",
            };
            assert!(UserConfig::read(place, &u).is_err());
        }
    }
}
