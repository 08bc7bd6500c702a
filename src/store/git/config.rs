//! Settings of a git store (SPEC §8): the URL, the remote it names, and
//! the checks every remote passes wherever it came from (no option, no
//! command-running transport, no credential shown).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cmd::{self, git_command, run};
use super::os::{CacheOs, Os};
use crate::error::{Error, Result};
use crate::vars::{Vars, var};

/// Default deadline of one command's git work.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default clock-skew allowance, seconds.
pub const DEFAULT_CLOCK_SKEW: u64 = 30;
/// Largest clock-skew allowance accepted, seconds (it must stay well inside
/// the slack that tells an impossible lease from a long one).
pub const MAX_CLOCK_SKEW: u64 = 120;
/// Commits in a lock's chain before a change starts a new root commit
/// (default of `SKILL_LOCK_GIT_HISTORY_DEPTH`).
pub const ROLL_DEPTH: u64 = 1000;
/// Where lock refs live on the remote.
pub const REF_PREFIX: &str = "refs/skill-lock/";
/// Where a lock's previous chain is kept after a roll-over.
pub const ARCHIVE_PREFIX: &str = "refs/skill-lock-archive/";
/// Archived chains kept per lock (`<archive prefix><name>/<epoch mod this>`).
pub const ARCHIVE_SLOTS: u64 = 10;

/// Settings of a git store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitConfig {
    /// The URL as given (`git:origin#team`), for `list` and hints.
    pub url: String,
    /// What `git push`/`ls-remote`/`fetch` are given: the remote as written
    /// after [`GitConfig::parse`]; after [`GitConfig::resolve`] (which
    /// opening the store does) a remote name is its URL and a relative path
    /// is absolute.
    pub remote: String,
    /// The directory a relative path is taken against (the current
    /// directory), or the checkout whose remote a name refers to.
    pub checkout: PathBuf,
    /// The checkout's git directory as SPEC §5 verified it: a remote name
    /// is resolved there and nowhere else (`None`: no git checkout here).
    pub git_dir: Option<PathBuf>,
    /// Optional namespace under `refs/skill-lock/`.
    pub namespace: Option<String>,
    /// Deadline of one command's git work (`SKILL_LOCK_GIT_TIMEOUT`, seconds).
    pub timeout: Duration,
    /// Clock-skew allowance, seconds (`SKILL_LOCK_CLOCK_SKEW`).
    pub clock_skew: u64,
    /// The private bare repository objects are made in and fetched into.
    pub cache: PathBuf,
    /// Commits in a lock's chain before a new root (`SKILL_LOCK_GIT_HISTORY_DEPTH`).
    pub history_depth: u64,
    /// Entries the user's own `GIT_CONFIG_COUNT` already sets (ours follow them).
    pub config_count: usize,
    /// `GIT_SSH_COMMAND` or `GIT_SSH` is set: ssh is the user's to configure.
    pub user_ssh: bool,
}

/// The name git is given for the remote; its URL is passed in the environment.
pub const REMOTE_NAME: &str = "skill-lock-store";

/// Refuses a remote git could read as an option, or whose transport runs a
/// command (`ext::`, `fd::`), wherever it came from (SPEC §8).
///
/// # Errors
/// [`Error::Usage`].
pub fn validate_remote(remote: &str, url: &str) -> Result<()> {
    let shown = redact(url);
    if remote.starts_with('-') {
        return Err(Error::Usage(format!(
            "store {shown:?}: the remote {:?} starts with '-', which git would read as an option; name a remote, a URL or a path",
            redact(remote)
        )));
    }
    let transport = remote.split_once("::").map(|(t, _)| t.to_ascii_lowercase());
    if matches!(transport.as_deref(), Some("ext" | "fd")) {
        return Err(Error::Usage(format!(
            "store {shown:?}: the {}:: transport runs commands or uses file descriptors; use an ssh, https, git or file URL",
            transport.unwrap_or_default()
        )));
    }
    if remote.chars().any(char::is_control) {
        return Err(Error::Usage(format!(
            "store {shown:?}: the remote holds control characters"
        )));
    }
    Ok(())
}

/// Is `s` a local path rather than a URL or an scp-like `host:path`?
pub(super) fn is_local_path(s: &str) -> bool {
    if s.contains("://") {
        return false;
    }
    match (s.find(':'), s.find('/')) {
        (None, _) => true,
        (Some(c), Some(sl)) => sl < c,
        (Some(_), None) => false,
    }
}

/// Hides the secrets of URLs in `text`: a password (`user:secret@`) and,
/// but for ssh, whose user name is no secret (`ssh://git@host`), the whole
/// user part (`https://TOKEN@host`).
#[must_use]
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let scheme = head[..i]
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '\'' || c == '"')
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let user = &authority[..at];
                let ssh = matches!(scheme.as_str(), "ssh" | "git+ssh" | "ssh+git");
                match user.split_once(':') {
                    Some((name, _)) if ssh => {
                        out.push_str(name);
                        out.push_str(":***");
                    }
                    None if ssh => out.push_str(user),
                    _ => out.push_str("***"),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Does `url` carry a secret that [`redact`] hides?
#[must_use]
pub fn has_secret(url: &str) -> bool {
    redact(url) != url
}

pub(super) fn validate_namespace(ns: &str, url: &str) -> Result<()> {
    let ok = ns.split('/').all(|seg| {
        !seg.is_empty()
            && seg.len() <= 64
            && !seg.starts_with('.')
            && !seg.to_ascii_lowercase().ends_with(".lock")
            && !seg.contains("..")
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "store {:?}: the namespace after '#' is 1-64 of [A-Za-z0-9._-] per '/'-separated part, e.g. git:origin#team",
            redact(url)
        )))
    }
}

pub(super) fn parse_seconds(vars: &Vars, var: &str, max: f64) -> Result<Option<f64>> {
    match vars.get(var) {
        None => Ok(None),
        Some(t) => t
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s <= max)
            .map(Some)
            .ok_or_else(|| Error::Usage(format!("{var}={t:?}: give seconds, 0 to {max}"))),
    }
}

/// The cache repository: `SKILL_LOCK_GIT_CACHE` (relative to `cwd`), else
/// the user's cache directory, else a private directory under the
/// temporary directory.
pub(super) fn cache_dir(vars: &Vars, cwd: &Path) -> PathBuf {
    if let Some(d) = vars.get(var::GIT_CACHE) {
        return cwd.join(d);
    }
    if let Some(d) = vars.get(var::XDG_CACHE_HOME) {
        return Path::new(&d).join("skill-lock").join("git");
    }
    if let Some(h) = vars.get(var::HOME) {
        return Path::new(&h).join(".cache").join("skill-lock").join("git");
    }
    let uid = Os::user_tag();
    std::env::temp_dir()
        .join(format!("skill-lock-{uid}"))
        .join("git")
}

impl GitConfig {
    /// Parses `git:REMOTE[#NAMESPACE]`, with timeout, skew, history depth
    /// and cache from `vars`. Pure: nothing is run or read; a REMOTE is
    /// resolved against the checkout at `cwd` by [`GitConfig::resolve`].
    ///
    /// # Errors
    /// [`Error::Usage`] for a malformed URL, namespace, remote or setting.
    pub fn parse(url: &str, cwd: &Path, vars: &Vars) -> Result<Self> {
        let Some(rest) = url.strip_prefix("git:") else {
            return Err(Error::Usage(format!("{url:?} is not a git: store URL")));
        };
        let (remote, namespace) = match rest.rsplit_once('#') {
            Some((r, ns)) => {
                validate_namespace(ns, url)?;
                (r, Some(ns.to_owned()))
            }
            None => (rest, None),
        };
        if remote.is_empty() {
            return Err(Error::Usage(format!(
                "store {url:?}: name a remote, e.g. git:origin or git:file:///srv/coord.git"
            )));
        }
        let timeout = parse_seconds(vars, var::GIT_TIMEOUT, 600.0)?
            .filter(|s| *s > 0.0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64);
        let clock_skew = parse_seconds(vars, var::CLOCK_SKEW, 120.0)?.map_or(
            DEFAULT_CLOCK_SKEW,
            // Whole seconds, rounded up: rounding favours the holder.
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "parse_seconds bounds it to 0..=120"
            )]
            |s| s.ceil() as u64,
        );
        let history_depth = match vars.get(var::GIT_HISTORY_DEPTH) {
            None => ROLL_DEPTH,
            Some(t) => t
                .parse::<u64>()
                .ok()
                .filter(|d| (2..=1_000_000).contains(d))
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "{}={t:?}: give a whole number of commits, 2 to 1000000",
                        var::GIT_HISTORY_DEPTH
                    ))
                })?,
        };
        validate_remote(remote, url)?;
        let config_count = vars
            .get(var::GIT_CONFIG_COUNT)
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        Ok(Self {
            config_count,
            history_depth,
            url: url.to_owned(),
            remote: remote.to_owned(),
            checkout: cwd.to_path_buf(),
            git_dir: None,
            namespace,
            timeout,
            clock_skew: clock_skew.min(MAX_CLOCK_SKEW),
            cache: cache_dir(vars, cwd),
            user_ssh: vars.get(var::GIT_SSH_COMMAND).is_some() || vars.get(var::GIT_SSH).is_some(),
        })
    }

    /// The URL as given, but with a relative local path made absolute when
    /// that is what the remote resolved to ([`GitConfig::resolve`]): a
    /// remote's name, a URL or an absolute path stay as given.
    #[must_use]
    pub fn url_from_anywhere(&self) -> String {
        let Some(rest) = self.url.strip_prefix("git:") else {
            return self.url.clone();
        };
        let (given, namespace) = match rest.rsplit_once('#') {
            Some((r, ns)) => (r, format!("#{ns}")),
            None => (rest, String::new()),
        };
        let made_absolute = is_local_path(given)
            && Path::new(given).is_relative()
            && self.remote == absolute_if_local(given, &self.checkout);
        if made_absolute {
            format!("git:{}{namespace}", self.remote)
        } else {
            self.url.clone()
        }
    }

    /// Does the URL name a remote of the checkout (a REMOTE with no `/`,
    /// `\\` or `:`), rather than a URL or a path (SPEC §8)?
    #[must_use]
    pub fn names_a_remote(&self) -> bool {
        is_remote_name(&self.remote)
    }

    /// Does the URL name a relative local path (`git:tools/store.git`)?
    #[must_use]
    pub fn names_a_relative_path(&self) -> bool {
        !self.names_a_remote()
            && is_local_path(&self.remote)
            && Path::new(&self.remote).is_relative()
    }

    /// Resolves the remote: a name becomes the push URL (else the URL) of
    /// that remote of the checkout's verified git directory, which must be
    /// a network URL; a local path is made absolute; what it resolved to is
    /// checked again as if typed.
    ///
    /// # Errors
    /// [`Error::Usage`] for a name that is no remote of a git checkout here,
    /// that answers a local path or `file://` URL, or a refused remote.
    pub fn resolve(mut self) -> Result<Self> {
        let remote = if self.names_a_remote() {
            resolve_name(&self.remote, self.git_dir.as_deref(), &self.url)?
        } else {
            absolute_if_local(&self.remote, &self.checkout)
        };
        validate_remote(&remote, &self.url)?;
        self.remote = remote;
        Ok(self)
    }
}

/// A REMOTE with no `/`, `\\` or `:` is always a remote's name, never a path.
fn is_remote_name(remote: &str) -> bool {
    !remote.contains(['/', '\\', ':'])
}

/// Is `url` a network URL (`https://`, `http://`, `ssh://`, `git://`, or
/// scp-like `host:path`), as a remote name must answer? A local path or a
/// `file://` URL would let a forged checkout's repository run its hooks;
/// a `<transport>::` address runs a helper.
pub(super) fn is_network_url(url: &str) -> bool {
    if url.contains("::") {
        return false;
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        let scheme = scheme.to_ascii_lowercase();
        return matches!(
            scheme.as_str(),
            "https" | "http" | "ssh" | "git" | "git+ssh" | "ssh+git"
        ) && !rest.is_empty();
    }
    // scp-like: a host of two or more characters (`C:` is a Windows drive).
    match url.split_once(':') {
        Some((host, path)) => {
            !is_local_path(url)
                && host.chars().count() > 1
                && !host.starts_with('-')
                && !path.is_empty()
        }
        None => false,
    }
}

/// The URL of remote `name` of the verified git directory `git_dir`, by
/// `git remote get-url --push` with `GIT_DIR` set (never git's own search,
/// which would find a `.git` an svn working copy carries).
fn resolve_name(name: &str, git_dir: Option<&Path>, url: &str) -> Result<String> {
    let Some(git_dir) = git_dir else {
        return Err(Error::Usage(format!(
            "store {url:?}: {name:?} is the name of a remote, and here is no git checkout to \
             have one (SPEC §5 layer rule 1); name the repository itself, e.g. \
             git:https://host/locks.git or git:/srv/locks.git (`skill-lock doctor` says more)"
        )));
    };
    let mut cmd = git_command();
    cmd.current_dir(git_dir)
        .env("GIT_DIR", git_dir)
        .args(["remote", "get-url", "--push", "--", name]);
    let answered = match run(
        &mut cmd,
        None,
        Instant::now() + Duration::from_secs(5),
        cmd::STDOUT_CAP,
    ) {
        Ok(Some(out)) if out.ok() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        _ => String::new(),
    };
    if answered.is_empty() {
        return Err(Error::Usage(format!(
            "store {url:?}: {name:?} is not a remote of the checkout whose git directory is {} \
             (see `git remote -v`); a name is never taken as a path: name the repository \
             itself, e.g. git:https://host/locks.git or git:/srv/locks.git",
            git_dir.display()
        )));
    }
    validate_remote(&answered, url)?;
    if !is_network_url(&answered) {
        return Err(Error::Usage(format!(
            "store {url:?}: the remote {name:?} answers {:?}, which is no network URL; a local \
             repository named by a checkout could be anyone's and git would run its hooks, so \
             name it yourself if it is yours (git:/srv/locks.git, --store or your \
             configuration file)",
            redact(&answered)
        )));
    }
    Ok(answered)
}

pub(super) fn absolute_if_local(remote: &str, base: &Path) -> String {
    if is_local_path(remote) && !Path::new(remote).is_absolute() {
        base.join(remote).to_string_lossy().into_owned()
    } else {
        remote.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_namespaces() {
        let cwd = Path::new("/nonexistent-skill-lock-test");
        let parse = |url: &str, cwd: &Path| {
            GitConfig::parse(url, cwd, &Vars::default()).and_then(GitConfig::resolve)
        };
        let c = parse("git:file:///srv/coord.git#team/a", cwd).unwrap();
        assert_eq!(c.remote, "file:///srv/coord.git");
        assert_eq!(c.namespace.as_deref(), Some("team/a"));
        let c = parse("git:git@github.com:org/coord.git", cwd).unwrap();
        assert_eq!(
            (c.remote.as_str(), c.namespace),
            ("git@github.com:org/coord.git", None)
        );
        let c = parse("git:../coord.git", Path::new("/w/x")).unwrap();
        assert_eq!(c.remote, "/w/x/../coord.git");
        for bad in [
            "git:",
            "git:#team",
            "git:/x#",
            "git:/x#a@b",
            "git:/x#a/../b",
            "git:/x#.a",
            "git:nosuchremote",
        ] {
            assert!(parse(bad, cwd).is_err(), "{bad}");
        }
    }

    /// Settings come from the snapshot given, never from the process.
    #[test]
    fn settings_come_from_the_variables_given() {
        let cwd = Path::new("/w");
        let vars = Vars::default()
            .with(var::GIT_TIMEOUT, "7.5")
            .with(var::CLOCK_SKEW, "2.1")
            .with(var::GIT_CACHE, "cache")
            .with(var::GIT_SSH, "plink");
        let c = GitConfig::parse("git:origin", cwd, &vars).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(7_500));
        assert_eq!(c.clock_skew, 3, "rounded up: rounding favours the holder");
        assert_eq!(c.cache, Path::new("/w/cache"));
        assert!(c.user_ssh);
        assert_eq!(
            c.remote, "origin",
            "parsing runs nothing: the name is resolved on open"
        );
        let home = Vars::default().with(var::HOME, "/home/u");
        let c = GitConfig::parse("git:origin", cwd, &home).unwrap();
        assert_eq!(c.cache, Path::new("/home/u/.cache/skill-lock/git"));
        assert!(!c.user_ssh);
        let bad = Vars::default().with(var::GIT_TIMEOUT, "soon");
        assert!(GitConfig::parse("git:origin", cwd, &bad).is_err());
    }

    #[test]
    fn redacts_user_info() {
        assert_eq!(
            redact("fatal: https://u:s3cret@example.com/r.git and ssh://git@h/x"),
            "fatal: https://***@example.com/r.git and ssh://git@h/x"
        );
        assert_eq!(
            redact("git:https://ghp_TOKEN@github.com/o/r ssh://me:pw@h/x"),
            "git:https://***@github.com/o/r ssh://me:***@h/x"
        );
        assert!(has_secret("git:https://u:p@h/r") && !has_secret("git:ssh://git@h/r"));
        assert_eq!(redact("no url here"), "no url here");
    }

    #[test]
    fn local_paths() {
        assert!(is_local_path("/srv/x.git"));
        assert!(is_local_path("../x"));
        assert!(is_local_path("./a:b"));
        assert!(!is_local_path("host:x"));
        assert!(!is_local_path("git@h:o/r.git"));
        assert!(!is_local_path("file:///x"));
    }
}
