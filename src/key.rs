//! Lock key: the validated (skill, repo) pair and its injective name (SPEC §5 "Names").
//!
//! Invariant: two different keys never map to the same name, and every name
//! this module produces parses back to the key it came from. Skill and repo
//! are compared case-insensitively (forges and macOS file systems do), so the
//! name carries their lowercase form while the key keeps the spelling the user
//! gave for display. A trailing `.git` on the repo (as `git remote get-url`
//! spells it) is dropped before anything else.
//!
//! Every name works on every command (SPEC §5 "Names"): where a store makes
//! a path component or a ref of the name ([`LockKey::file_stem`],
//! [`LockKey::ref_stem`]), a name that fits is used as it is, byte for byte
//! what earlier versions used (an older and a newer binary find the same
//! lock during an upgrade), and only a name that does not fit (the longest
//! names are 267 bytes) takes a digest form: a readable prefix, `+` (which
//! no name contains, so a digest stem never equals a name), and the SHA-256
//! of the whole lowercase name. So the mapping stays injective and
//! case-folded on both sides of the limit.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use crate::error::Error;

/// Maximum length of a skill name.
pub const SKILL_MAX: usize = 64;
/// Maximum length of each part of `owner/name`.
pub const REPO_PART_MAX: usize = 100;
/// The longest name: `<skill>@<owner>__<name>`.
pub const NAME_MAX: usize = SKILL_MAX + 1 + REPO_PART_MAX + 2 + REPO_PART_MAX;

/// The longest path component the tool creates, in bytes: `NAME_MAX` of
/// Linux file systems (ext4, xfs, btrfs, tmpfs) and of macOS (APFS), and
/// Windows' limit of 255 UTF-16 code units per component (NTFS, ReFS; the
/// names here are ASCII, one unit a byte). Windows' limit on a whole path
/// (`MAX_PATH`, 260) does not bind the file store, whose Windows layer
/// opens every file relative to a directory handle with NT calls; git
/// checks its own paths (`core.longpaths`).
pub const COMPONENT_MAX: usize = 255;
/// The longest suffix the file store appends to a lock's stem:
/// `.fence.tmp` (`.lock`, `.guard`, `.fence` are shorter; a tombstone
/// `<stem>.<pid>.<random>` cuts its stem short instead, as it is never
/// looked up by name).
pub const FILE_SUFFIX_MAX: usize = ".fence.tmp".len();
/// The suffix git appends to a ref's file while it changes it.
pub const REF_SUFFIX_MAX: usize = ".lock".len();
/// Between the readable prefix and the digest of a stem made for a name
/// that does not fit: a character no valid name contains.
pub const DIGEST_SEPARATOR: char = '+';
/// Hex digits of the SHA-256 in a digest stem.
const DIGEST_HEX: usize = 64;

/// A validated lock identity: one skill over one repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKey {
    skill: String,
    repo: String,
}

fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Checks a skill name: 1..=64 of `[A-Za-z0-9._-]`, starting with a letter or digit.
///
/// # Errors
/// [`Error::InvalidSkill`] saying which rule failed.
pub fn validate_skill(skill: &str) -> Result<(), Error> {
    let bad = |why: &str| {
        Err(Error::InvalidSkill {
            skill: skill.to_owned(),
            why: why.to_owned(),
        })
    };
    if skill.is_empty() {
        return bad("it is empty");
    }
    if skill.len() > SKILL_MAX {
        return bad("it is longer than 64 characters");
    }
    if !skill.chars().all(name_char) {
        return bad("only letters, digits, '.', '_' and '-' are allowed");
    }
    if !skill.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return bad("it must start with a letter or a digit");
    }
    Ok(())
}

/// Checks a repository `owner/name`.
///
/// Beyond SPEC §5, an owner may not end with `_`: `a_` + `__` + `b` and
/// `a` + `__` + `_b` would both be `a___b`, breaking injectivity. No forge
/// allows `_` in an owner, so nothing real is refused.
///
/// # Errors
/// [`Error::InvalidRepo`] saying which rule failed.
pub fn validate_repo(repo: &str) -> Result<(), Error> {
    let bad = |why: &str| {
        Err(Error::InvalidRepo {
            repo: repo.to_owned(),
            why: why.to_owned(),
        })
    };
    let Some((owner, name)) = repo.split_once('/') else {
        return bad("it must be owner/name, with exactly one '/'");
    };
    if name.contains('/') {
        return bad("it must be owner/name, with exactly one '/'");
    }
    for (part, what) in [(owner, "owner"), (name, "name")] {
        if part.is_empty() || part.len() > REPO_PART_MAX {
            return bad(&format!("the {what} must be 1 to 100 characters"));
        }
        if !part.chars().all(name_char) {
            return bad(&format!(
                "the {what} may hold only letters, digits, '.', '_' and '-'"
            ));
        }
        if part == "." || part == ".." {
            return bad(&format!("the {what} may not be '.' or '..'"));
        }
    }
    if owner.contains("__") {
        return bad("the owner may not contain '__'");
    }
    if owner.ends_with('_') {
        return bad("the owner may not end with '_'");
    }
    Ok(())
}

/// The repo without a trailing `.git` (any case): `apache/airflow.git` is
/// `apache/airflow`.
#[must_use]
pub fn strip_git_suffix(repo: &str) -> &str {
    let n = repo.len();
    if n >= 4 && repo.is_char_boundary(n - 4) && repo[n - 4..].eq_ignore_ascii_case(".git") {
        &repo[..n - 4]
    } else {
        repo
    }
}

impl LockKey {
    /// Validates both parts (the repo after dropping a trailing `.git`);
    /// nothing is touched before this succeeds.
    ///
    /// # Errors
    /// [`Error::InvalidSkill`] or [`Error::InvalidRepo`].
    pub fn new(skill: &str, repo: &str) -> Result<Self, Error> {
        validate_skill(skill)?;
        let stripped = strip_git_suffix(repo);
        validate_repo(stripped).map_err(|e| match e {
            Error::InvalidRepo { why, .. } => Error::InvalidRepo {
                repo: repo.to_owned(),
                why,
            },
            other => other,
        })?;
        Ok(Self {
            skill: skill.to_owned(),
            repo: stripped.to_owned(),
        })
    }

    /// The skill, as given.
    #[must_use]
    pub fn skill(&self) -> &str {
        &self.skill
    }

    /// The repository, spelled as given (without a trailing `.git`).
    #[must_use]
    pub fn repo(&self) -> &str {
        &self.repo
    }

    /// The injective name `<skill>@<owner>__<name>`, all lowercase.
    #[must_use]
    pub fn name(&self) -> String {
        let repo = self.repo.to_ascii_lowercase();
        let (owner, name) = repo.split_once('/').unwrap_or((&repo, ""));
        format!("{}@{owner}__{name}", self.skill.to_ascii_lowercase())
    }

    /// The lock's stem in the file store (`locks/<stem>.lock`,
    /// `keys/<stem>.guard`, ...): the name when it and the longest suffix
    /// fit in one path component, else its digest form (see the module doc).
    #[must_use]
    pub fn file_stem(&self) -> String {
        self.stem(COMPONENT_MAX - FILE_SUFFIX_MAX, |_| true)
    }

    /// The last component of the lock's ref in the git store: the name
    /// when git takes it as a ref component (no `..`, not ending in `.` or
    /// `.lock`) and it fits with git's `.lock` appended, else its digest form.
    #[must_use]
    pub fn ref_stem(&self) -> String {
        self.stem(COMPONENT_MAX - REF_SUFFIX_MAX, ref_component_ok)
    }

    fn stem(&self, max: usize, usable: fn(&str) -> bool) -> String {
        let name = self.name();
        if name.len() <= max && usable(&name) {
            return name;
        }
        let mut digest = String::with_capacity(DIGEST_HEX);
        for b in Sha256::digest(name.as_bytes()) {
            let _ = write!(digest, "{b:02x}");
        }
        // Readable only: '.' becomes '-', so no ".." or trailing '.' reaches a ref.
        let readable: String = name
            .chars()
            .take(max - 1 - DIGEST_HEX)
            .map(|c| if c == '.' { '-' } else { c })
            .collect();
        format!("{readable}{DIGEST_SEPARATOR}{digest}")
    }

    /// Parses a name made by [`LockKey::name`] back into a key (in lowercase).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        let (skill, rest) = name.split_once('@')?;
        let (owner, repo_name) = rest.split_once("__")?;
        let key = Self::new(skill, &format!("{owner}/{repo_name}")).ok()?;
        (key.name() == name).then_some(key)
    }

    /// True when both keys name the same lock (compared case-insensitively).
    #[must_use]
    pub fn same_lock(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

/// Is `name` usable as one component of a git ref (`git check-ref-format`)?
/// Names start with a letter or digit and hold no character git refuses,
/// so only these rules can fail.
fn ref_component_ok(name: &str) -> bool {
    !name.contains("..") && !name.ends_with('.') && !name.to_ascii_lowercase().ends_with(".lock")
}

/// Is `stem` a digest stem (a readable prefix, [`DIGEST_SEPARATOR`], 64
/// lowercase hex digits)? Its key is then read from elsewhere (the
/// record) and checked against it with [`LockKey::file_stem`] or
/// [`LockKey::ref_stem`].
#[must_use]
pub fn is_digest_stem(stem: &str) -> bool {
    stem.rsplit_once(DIGEST_SEPARATOR)
        .is_some_and(|(readable, digest)| {
            !readable.is_empty()
                && digest.len() == DIGEST_HEX
                && digest
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_follow_the_spec_layout() {
        let k = LockKey::new("issue-triage", "Apache/Airflow").unwrap();
        assert_eq!(k.name(), "issue-triage@apache__airflow");
        assert_eq!(k.repo(), "Apache/Airflow");
    }

    #[test]
    fn spellings_of_one_lock_share_its_name() {
        let k = LockKey::new("issue-triage", "apache/airflow").unwrap();
        for (s, r) in [
            ("Issue-Triage", "Apache/Airflow"),
            ("issue-triage", "apache/airflow.git"),
            ("ISSUE-TRIAGE", "apache/Airflow.GIT"),
        ] {
            let other = LockKey::new(s, r).unwrap();
            assert!(other.same_lock(&k), "{s} {r}");
            assert_eq!(other.skill(), s, "the spelling given is kept");
        }
        assert_eq!(
            LockKey::new("s", "apache/airflow.git").unwrap().repo(),
            "apache/airflow"
        );
        for r in ["o/.git", "o/..git", "o/...git"] {
            assert!(LockKey::new("s", r).is_err(), "{r}");
        }
        assert!(matches!(
            LockKey::new("s", "a__b/c.git"),
            Err(Error::InvalidRepo { repo, .. }) if repo == "a__b/c.git"
        ));
    }

    #[test]
    fn refuses_each_rule() {
        for s in [
            "",
            "-x",
            ".x",
            "_x",
            "a/b",
            "a@b",
            "a b",
            &"a".repeat(65),
            "é",
        ] {
            assert!(validate_skill(s).is_err(), "{s:?}");
        }
        for r in [
            "", "a", "a/b/c", "/b", "a/", "./b", "../b", "a/.", "a/..", "a__b/c", "a_/b", "a b/c",
            "a/b c", "a/b@c",
        ] {
            assert!(validate_repo(r).is_err(), "{r:?}");
        }
        assert!(validate_repo(&format!("{}/b", "a".repeat(101))).is_err());
        assert!(validate_repo(&format!("a/{}", "b".repeat(100))).is_ok());
        assert!(validate_repo("a_b/_c_").is_ok());
    }

    /// A key of `skill_len`, `owner_len` and `name_len` characters.
    fn sized(skill_len: usize, owner_len: usize, name_len: usize) -> LockKey {
        LockKey::new(
            &"s".repeat(skill_len),
            &format!("{}/{}", "o".repeat(owner_len), "n".repeat(name_len)),
        )
        .unwrap()
    }

    /// What `git check-ref-format` refuses in one component of a ref.
    fn git_takes_component(c: &str) -> bool {
        !c.is_empty()
            && !c.starts_with('.')
            && !c.ends_with('.')
            && !c.to_ascii_lowercase().ends_with(".lock")
            && !c.contains("..")
            && !c.contains("@{")
            && c != "@"
            && !c
                .chars()
                .any(|ch| ch.is_ascii_control() || " ~^:?*[\\".contains(ch))
    }

    #[test]
    fn names_that_fit_keep_their_stem_byte_for_byte() {
        // 64 + 1 + 100 + 2 + 78 = 245 bytes: with ".fence.tmp", 255.
        let fits = sized(SKILL_MAX, REPO_PART_MAX, 78);
        assert_eq!(fits.name().len(), COMPONENT_MAX - FILE_SUFFIX_MAX);
        assert_eq!(fits.file_stem(), fits.name());
        assert_eq!(fits.ref_stem(), fits.name());
        let over = sized(SKILL_MAX, REPO_PART_MAX, 79);
        assert_ne!(over.file_stem(), over.name());
        assert!(is_digest_stem(&over.file_stem()));
        // git's own budget is 250 (".lock"): 246..=250 keep their ref.
        let ref_fits = sized(SKILL_MAX, REPO_PART_MAX, 83);
        assert_eq!(ref_fits.name().len(), COMPONENT_MAX - REF_SUFFIX_MAX);
        assert_eq!(ref_fits.ref_stem(), ref_fits.name());
        assert!(is_digest_stem(
            &sized(SKILL_MAX, REPO_PART_MAX, 84).ref_stem()
        ));
        let longest = sized(SKILL_MAX, REPO_PART_MAX, REPO_PART_MAX);
        assert_eq!(longest.name().len(), NAME_MAX);
        assert_eq!(
            longest.file_stem().len() + FILE_SUFFIX_MAX,
            COMPONENT_MAX,
            "a digest stem uses the whole budget"
        );
        // Today's names, as every earlier version spelled them.
        let k = LockKey::new("Issue-Triage", "Apache/Airflow.git").unwrap();
        assert_eq!(k.file_stem(), "issue-triage@apache__airflow");
        assert_eq!(k.ref_stem(), "issue-triage@apache__airflow");
    }

    #[test]
    fn names_git_refuses_as_a_ref_take_the_digest_form_there_only() {
        for (skill, repo) in [
            ("a..b", "o/r"),
            ("s", "o/r.lock"),
            ("s", "o/r."),
            ("s", "o/x..y"),
        ] {
            let k = LockKey::new(skill, repo).unwrap();
            assert_eq!(k.file_stem(), k.name(), "{skill} {repo}");
            assert!(is_digest_stem(&k.ref_stem()), "{skill} {repo}");
            assert!(git_takes_component(&k.ref_stem()), "{}", k.ref_stem());
        }
    }

    fn part() -> impl Strategy<Value = String> {
        "[A-Za-z0-9._-]{1,12}"
    }

    proptest! {
        #[test]
        fn mapping_is_injective_and_folds_repo_case_only(
            s1 in "[A-Za-z0-9][A-Za-z0-9._-]{0,8}", o1 in part(), n1 in part(),
            s2 in "[A-Za-z0-9][A-Za-z0-9._-]{0,8}", o2 in part(), n2 in part(),
        ) {
            let a = LockKey::new(&s1, &format!("{o1}/{n1}"));
            let b = LockKey::new(&s2, &format!("{o2}/{n2}"));
            if let (Ok(a), Ok(b)) = (a, b) {
                let same = s1.eq_ignore_ascii_case(&s2)
                    && o1.eq_ignore_ascii_case(&o2)
                    && strip_git_suffix(&n1).eq_ignore_ascii_case(strip_git_suffix(&n2));
                prop_assert_eq!(a.name() == b.name(), same);
            }
        }

        /// Names with the same letters in other cases and `.git` suffixes
        /// collide exactly when the rules say they are one lock.
        #[test]
        fn mapping_is_injective_over_near_spellings(
            s in "[a-c][a-c._-]{0,3}", o in "[a-c_.-]{1,4}", n in "[a-c_.-]{1,4}",
            flips in proptest::collection::vec(any::<bool>(), 24), git1 in any::<bool>(), git2 in any::<bool>(),
            s2 in "[a-c][a-c._-]{0,3}", o2 in "[a-c_.-]{1,4}", n2 in "[a-c_.-]{1,4}",
        ) {
            let flip = |t: &str, off: usize| -> String {
                t.chars().enumerate().map(|(i, c)| if flips[(i + off) % flips.len()] { c.to_ascii_uppercase() } else { c }).collect()
            };
            let r1 = format!("{}/{}{}", flip(&o, 0), flip(&n, 5), if git1 { ".git" } else { "" });
            let r2 = format!("{o2}/{n2}{}", if git2 { ".GIT" } else { "" });
            if let (Ok(a), Ok(b)) = (LockKey::new(&flip(&s, 11), &r1), LockKey::new(&s2, &r2)) {
                let same = s.eq_ignore_ascii_case(&s2)
                    && strip_git_suffix(&r1).eq_ignore_ascii_case(strip_git_suffix(&r2));
                prop_assert_eq!(a.name() == b.name(), same, "{:?} {:?}", a, b);
                prop_assert!(LockKey::from_name(&a.name()).is_some_and(|k| k.same_lock(&a)));
            }
        }

        #[test]
        fn names_round_trip(s in "[A-Za-z0-9][A-Za-z0-9._-]{0,20}", o in part(), n in part()) {
            if let Ok(k) = LockKey::new(&s, &format!("{o}/{n}")) {
                let back = LockKey::from_name(&k.name()).unwrap();
                prop_assert_eq!(back.skill(), k.skill().to_ascii_lowercase());
                prop_assert_eq!(back.repo(), k.repo().to_ascii_lowercase());
            }
        }

        /// Around the limits: stems are injective and case-folded exactly
        /// as names are, on both sides of the limit; no component the
        /// stores make passes 255 bytes; a ref stem is one git takes; a
        /// digest stem never parses as a name.
        #[test]
        fn stems_are_injective_and_fit_at_the_limits(
            s in "[A-Za-z0-9][A-Za-z0-9._-]{40,63}",
            o in "[A-Za-z0-9][A-Za-z0-9.-]{80,99}",
            n in "[A-Za-z0-9._-]{60,100}",
            cut in 0usize..24, flip in 0usize..300, dots in any::<bool>(),
        ) {
            let n = if dots { format!("{n}..lock") } else { n };
            let n = n.get(..n.len().min(REPO_PART_MAX)).unwrap_or(&n).to_owned();
            let Ok(a) = LockKey::new(&s, &format!("{o}/{n}")) else { return Ok(()) };
            // Near neighbours of `a`: cut short, one letter in another case,
            // one character changed.
            let short = &n[..n.len().saturating_sub(cut).max(1)];
            let flipped: String = n.chars().enumerate()
                .map(|(i, c)| if i == flip % n.len() { c.to_ascii_uppercase() } else { c })
                .collect();
            let changed: String = n.chars().enumerate()
                .map(|(i, c)| if i == flip % n.len() { if c == 'x' { 'y' } else { 'x' } } else { c })
                .collect();
            for other in [short, &flipped, &changed] {
                let Ok(b) = LockKey::new(&s.to_ascii_uppercase(), &format!("{o}/{other}")) else { continue };
                let same = a.name() == b.name();
                prop_assert_eq!(a.file_stem() == b.file_stem(), same, "{:?} {:?}", a, b);
                prop_assert_eq!(a.ref_stem() == b.ref_stem(), same, "{:?} {:?}", a, b);
            }
            for (stem, suffix) in [(a.file_stem(), FILE_SUFFIX_MAX), (a.ref_stem(), REF_SUFFIX_MAX)] {
                prop_assert!(stem.len() + suffix <= COMPONENT_MAX, "{}", stem);
                prop_assert_eq!(is_digest_stem(&stem), stem != a.name());
                if stem != a.name() {
                    prop_assert!(LockKey::from_name(&stem).is_none());
                }
            }
            prop_assert!(git_takes_component(&a.ref_stem()), "{}", a.ref_stem());
        }

        #[test]
        fn arbitrary_strings_are_refused_or_round_trip(s in ".{0,10}", r in ".{0,12}") {
            if let Ok(k) = LockKey::new(&s, &r) {
                prop_assert!(LockKey::from_name(&k.name()).is_some());
            }
        }
    }
}
