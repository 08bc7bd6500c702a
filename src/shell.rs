//! Quoting for the user's shell (POSIX sh; PowerShell and cmd on Windows):
//! every command line this tool prints (a hint, the fix an error message
//! names) pastes back as the same words.
//! A leaf module, so that the stores' messages need nothing of the hints.

/// Quotes `s` for a POSIX shell (left bare when it only has safe characters).
#[cfg(unix)]
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

/// Quotes `s` for PowerShell and cmd alike (Windows): bare when it only
/// has safe characters, else in double quotes, which both shells read the
/// same way when the string holds no `"`, `%`, `$` or backtick; a string
/// with one of those is quoted for PowerShell alone (single quotes).
#[cfg(windows)]
#[must_use]
pub fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./@:=+,\\".contains(&b))
    {
        s.to_owned()
    } else if !s.contains(['"', '%', '$', '`']) {
        format!("\"{s}\"")
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}
