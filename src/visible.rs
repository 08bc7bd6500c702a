//! Text that reaches a terminal (SPEC §3): what a store or a record holds
//! (a holder's host or note, a git remote's message) is written so that a
//! terminal interprets none of it and it adds no line.
//!
//! A store writer can forge a record whose `host` carries ESC, CSI or BEL
//! sequences, a CR or LF that starts a line of its own, a C1 control
//! (U+0080..U+009F, which some terminals obey as ESC sequences), or a
//! bidirectional override (U+202E and kin) that makes a line display
//! other than it reads. Each such character is shown escaped instead: on
//! standard error as `\u{1b}`, in JSON as `\u001b` (which decodes to the
//! same text, so every JSON reader sees the record as stored).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io;

use serde::Serialize;

/// Would a terminal act on `c`, or show it as a line break or a reordering?
/// Every control character (C0, DEL, C1), the bidirectional controls, and
/// the Unicode line and paragraph separators.
#[must_use]
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `text` for a terminal: every character [`is_unsafe`] shown as `\u{..}`,
/// so the text stays one line that a terminal only displays.
#[must_use]
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unsafe(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Writes `value` as compact JSON in which every character [`is_unsafe`]
/// is a `\uXXXX` escape (serde_json escapes only C0 controls, `"` and `\`).
///
/// # Errors
/// The writer's, or serialization's.
pub fn to_writer<W: io::Write, T: Serialize + ?Sized>(
    writer: W,
    value: &T,
) -> serde_json::Result<()> {
    value.serialize(&mut serde_json::Serializer::with_formatter(
        writer, Escaping,
    ))
}

/// serde_json's compact format, with the extra escapes of [`to_writer`].
struct Escaping;

impl serde_json::ser::Formatter for Escaping {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        // Printable ASCII, nearly every fragment, needs no look at characters.
        if fragment.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return writer.write_all(fragment.as_bytes());
        }
        let mut rest = fragment;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| is_unsafe(c)) {
            writer.write_all(&rest.as_bytes()[..at])?;
            // Every unsafe character is in the Basic Multilingual Plane.
            write!(writer, "\\u{:04x}", u32::from(c))?;
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every character this module escapes, and a few it keeps.
    fn hostile() -> String {
        let mut s: String = (0u32..0x20)
            .chain(0x7f..0xa0)
            .filter_map(char::from_u32)
            .collect();
        s.push_str("\u{061C}\u{200E}\u{200F}\u{202A}\u{202B}\u{202C}\u{202D}\u{202E}");
        s.push_str("\u{2066}\u{2067}\u{2068}\u{2069}\u{2028}\u{2029}");
        s
    }

    #[test]
    fn every_unsafe_character_is_escaped_on_one_line() {
        let text = format!("vm{}é日\\x", hostile());
        let shown = visible(&text);
        assert!(!shown.chars().any(is_unsafe), "{shown}");
        assert!(shown.starts_with("vm\\u{0}\\u{1}") && shown.ends_with("é日\\x"));
        assert!(shown.contains("\\u{1b}") && shown.contains("\\u{9b}"));
        assert!(shown.contains("\\u{202e}") && shown.contains("\\u{2028}"));
        assert_eq!(visible("plain host-1.example"), "plain host-1.example");
    }

    #[test]
    fn json_escapes_them_and_reads_back_the_same() {
        let text = format!("a{}b\"\\", hostile());
        let mut out = Vec::new();
        to_writer(&mut out, &serde_json::json!({ "host": text })).unwrap();
        let line = String::from_utf8(out).unwrap();
        assert!(!line.chars().any(is_unsafe), "{line}");
        assert!(line.contains("\\u001b") && line.contains("\\u009b") && line.contains("\\u202e"));
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["host"], text.as_str());
    }

    proptest! {
        /// Any text: the terminal form holds nothing unsafe, and the JSON
        /// form holds nothing unsafe and decodes to the text itself.
        #[test]
        fn any_text_is_shown_safely(text in "\\PC{0,20}|[\\x00-\\x{9f}\\x{2000}-\\x{206f}]{0,20}") {
            prop_assert!(!visible(&text).chars().any(is_unsafe));
            let mut out = Vec::new();
            to_writer(&mut out, &text).unwrap();
            let line = String::from_utf8(out).unwrap();
            prop_assert!(!line.chars().any(is_unsafe), "{}", line);
            prop_assert_eq!(serde_json::from_str::<String>(&line).unwrap(), text);
        }
    }
}
