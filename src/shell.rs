//! Quoting for a POSIX shell: every command line this tool prints (a
//! hint, the fix an error message names) pastes back as the same words.
//! A leaf module, so that the stores' messages need nothing of the hints.

/// Quotes `s` for a POSIX shell (left bare when it only has safe characters).
#[must_use]
pub fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./@:=+,".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
