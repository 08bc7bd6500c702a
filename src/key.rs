//! Lock key: the validated (skill, repo) pair and its injective name (SPEC §5 "Names").
//!
//! Invariant: two different keys never map to the same name, and every name
//! this module produces parses back to the key it came from. Skill and repo
//! are compared case-insensitively (forges and macOS file systems do), so the
//! name carries their lowercase form while the key keeps the spelling the user
//! gave for display. A trailing `.git` on the repo (as `git remote get-url`
//! spells it) is dropped before anything else.

use crate::error::Error;

/// Maximum length of a skill name.
pub const SKILL_MAX: usize = 64;
/// Maximum length of each part of `owner/name`.
pub const REPO_PART_MAX: usize = 100;

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

        #[test]
        fn arbitrary_strings_are_refused_or_round_trip(s in ".{0,10}", r in ".{0,12}") {
            if let Ok(k) = LockKey::new(&s, &r) {
                prop_assert!(LockKey::from_name(&k.name()).is_some());
            }
        }
    }
}
