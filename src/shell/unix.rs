//! Quoting for a POSIX shell.

use std::ffi::OsStr;
use std::fmt::Write as _;

/// POSIX sh.
pub(super) struct Os;

impl super::Platform for Os {
    /// Quotes `s` for a POSIX shell (left bare when it only has safe
    /// characters); see `quote_os`.
    fn quote(s: &str) -> String {
        quote_bytes(s.as_bytes())
    }

    /// Quotes `s`, whatever its bytes, for a POSIX shell, as one word on one
    /// line of text that a terminal only displays: printable text in single
    /// quotes; bytes that are not UTF-8, and characters a terminal would act
    /// on ([`crate::visible::is_unsafe`]: controls, newlines, bidi overrides),
    /// as `"$(printf '\NNN')"`, octal escapes that any POSIX `printf` turns
    /// back into the same bytes. (A command substitution drops the newlines
    /// that end it, so such a run takes the next character with it; a word
    /// that ends in a newline loses it, which a caller naming a directory
    /// avoids by ending it with `/`.)
    fn quote_os(s: &OsStr) -> String {
        use std::os::unix::ffi::OsStrExt;
        quote_bytes(s.as_bytes())
    }
}

fn quote_bytes(b: &[u8]) -> String {
    if !b.is_empty()
        && b.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./@:=+,".contains(b))
    {
        // Only safe ASCII: valid UTF-8.
        return String::from_utf8_lossy(b).into_owned();
    }
    let mut word = Word::default();
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            word.push(c);
        }
        if !chunk.invalid().is_empty() {
            word.flush_quoted();
            word.raw.extend_from_slice(chunk.invalid());
        }
    }
    word.finish()
}

/// A word being quoted: what is done, a single-quoted run, a printf run.
#[derive(Default)]
struct Word {
    out: String,
    quoted: String,
    raw: Vec<u8>,
}

impl Word {
    fn push(&mut self, c: char) {
        let mut buf = [0u8; 4];
        if crate::visible::is_unsafe(c) {
            self.flush_quoted();
            self.raw
                .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        } else if self.raw.last() == Some(&b'\n') {
            // Kept from the end of the substitution, where it would be dropped.
            self.raw
                .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        } else {
            self.flush_raw();
            self.quoted.push(c);
        }
    }

    fn flush_quoted(&mut self) {
        if !self.quoted.is_empty() {
            self.out.push('\'');
            self.out.push_str(&self.quoted.replace('\'', r"'\''"));
            self.out.push('\'');
            self.quoted.clear();
        }
    }

    fn flush_raw(&mut self) {
        if !self.raw.is_empty() {
            self.out.push_str("\"$(printf '");
            for b in &self.raw {
                let _ = write!(self.out, "\\{b:03o}");
            }
            self.out.push_str("')\"");
            self.raw.clear();
        }
    }

    fn finish(mut self) -> String {
        self.flush_quoted();
        self.flush_raw();
        if self.out.is_empty() {
            self.out.push_str("''");
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use crate::shell::{quote, quote_os};
    use proptest::prelude::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    /// What `sh` makes of `word`: the bytes of its one argument.
    fn through_sh(word: &str) -> Vec<u8> {
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("printf '%s' {word}")])
            .output()
            .expect("sh runs");
        assert!(out.status.success(), "{word}");
        out.stdout
    }

    #[test]
    fn plain_words_stay_bare_and_others_are_quoted() {
        assert_eq!(quote("apache/airflow"), "apache/airflow");
        assert_eq!(quote("/a b/c'd"), r"'/a b/c'\''d'");
        assert_eq!(quote(""), "''");
        assert_eq!(
            quote_os(OsStr::from_bytes(b"/r\xff\x1bx")),
            r#"'/r'"$(printf '\377\033')"'x'"#
        );
    }

    proptest! {
        /// Any bytes but NUL (which no argument holds), but a final newline
        /// (see `quote_os`): one line, nothing a terminal acts on, and the
        /// same bytes back through `sh`.
        #[test]
        fn any_bytes_come_back_through_sh(
            bytes in proptest::collection::vec(1u8..=255, 0..24),
        ) {
            prop_assume!(bytes.last() != Some(&b'\n'));
            let word = quote_os(OsStr::from_bytes(&bytes));
            prop_assert!(!word.chars().any(crate::visible::is_unsafe), "{:?}", word);
            prop_assert_eq!(through_sh(&word), bytes);
        }
    }
}
