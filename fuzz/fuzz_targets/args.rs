//! The argument checks, on NUL-separated pieces of the input: no panic, a
//! valid key's name round-trips through `LockKey::from_name`, names are one
//! safe path component, the mapping is injective (two keys share a name
//! exactly when skill matches and repo matches case-insensitively), and so
//! are the stems the stores make of them, also for the pieces stretched to
//! the longest names (every stem fits in 255 bytes with its suffixes), and what
//! `parse_ttl` / `validate_note` accept obeys SPEC §2.1.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use libfuzzer_sys::fuzz_target;
use skill_lock::fuzzing::{NOTE_MAX, validate_note};
use skill_lock::key::{COMPONENT_MAX, FILE_SUFFIX_MAX, LockKey, REF_SUFFIX_MAX, is_digest_stem};
use skill_lock::lease::{MAX_TTL, parse_ttl};

fn key(skill: &[u8], repo: &[u8]) -> Option<LockKey> {
    let (skill, repo) = (
        std::str::from_utf8(skill).ok()?,
        std::str::from_utf8(repo).ok()?,
    );
    let key = LockKey::new(skill, repo).ok()?;
    let name = key.name();
    let back = LockKey::from_name(&name)
        .unwrap_or_else(|| panic!("{skill:?} {repo:?}: name {name:?} does not parse back"));
    assert_eq!(back.name(), name);
    assert_eq!(back.skill(), skill.to_ascii_lowercase());
    assert_eq!(back.repo(), repo.to_ascii_lowercase());
    assert!(
        !name.is_empty()
            && !name.contains('/')
            && !name.contains('\0')
            && name != "."
            && name != "..",
        "{name:?} is not one path component"
    );
    // The stems the stores make: the name where it fits, else a digest
    // stem, which never parses as a name; either fits with its suffixes.
    for (stem, suffix) in [
        (key.file_stem(), FILE_SUFFIX_MAX),
        (key.ref_stem(), REF_SUFFIX_MAX),
    ] {
        assert!(stem.len() + suffix <= COMPONENT_MAX, "{stem:?}");
        assert_eq!(is_digest_stem(&stem), stem != name, "{stem:?}");
        assert!(stem == name || LockKey::from_name(&stem).is_none(), "{stem:?}");
    }
    Some(key)
}

/// Stretches `part` to `len` bytes by repeating it (names at the limits
/// are rare in raw input).
fn stretched(part: &[u8], len: usize) -> Vec<u8> {
    part.iter().copied().cycle().take(len).collect()
}

fuzz_target!(|data: &[u8]| {
    let parts: Vec<&[u8]> = data.split(|&b| b == 0).collect();
    for p in &parts {
        if let Ok(text) = std::str::from_utf8(p)
            && let Ok(ttl) = parse_ttl(text)
        {
            assert!((1..=MAX_TTL).contains(&ttl), "ttl {ttl} from {text:?}");
            assert_eq!(
                text.trim_start_matches('+').trim_start_matches('0'),
                ttl.to_string(),
                "{text:?}"
            );
        }
        if let Ok(note) = validate_note(&OsString::from_vec(p.to_vec())) {
            assert!(note.len() <= NOTE_MAX, "note of {} bytes", note.len());
            assert!(
                !note.chars().any(|c| c.is_control() && c != '\t'),
                "{note:?}"
            );
            assert_eq!(note.as_bytes(), *p);
        }
    }
    for pair in parts.windows(2) {
        key(pair[0], pair[1]);
    }
    if let [s1, r1, s2, r2, ..] = parts[..]
        && let (Some(a), Some(b)) = (key(s1, r1), key(s2, r2))
    {
        let same = a.skill().eq_ignore_ascii_case(b.skill())
            && a.repo().eq_ignore_ascii_case(b.repo());
        assert_eq!(a.name() == b.name(), same, "{a:?} {b:?}");
        assert_eq!(a.file_stem() == b.file_stem(), same, "{a:?} {b:?}");
        assert_eq!(a.ref_stem() == b.ref_stem(), same, "{a:?} {b:?}");
    }
    // The same pieces stretched to the longest names and around the limit.
    if let [s, o, n, extra, ..] = parts[..]
        && !s.is_empty()
        && !o.is_empty()
        && !n.is_empty()
    {
        let cut = extra.first().map_or(0, |b| usize::from(b % 32));
        let repo = |n_len: usize| {
            let mut r = stretched(o, 100);
            r.push(b'/');
            r.extend(stretched(n, n_len));
            r
        };
        let long = key(&stretched(s, 64), &repo(100));
        let near = key(&stretched(s, 64), &repo(100 - cut));
        if let (Some(a), Some(b)) = (long, near) {
            let same = a.name() == b.name();
            assert_eq!(a.file_stem() == b.file_stem(), same, "{a:?} {b:?}");
            assert_eq!(a.ref_stem() == b.ref_stem(), same, "{a:?} {b:?}");
        }
    }
});
