//! Quoting for PowerShell and cmd alike.

use std::ffi::OsStr;

/// PowerShell and cmd.
pub(super) struct Os;

impl super::Platform for Os {
    /// Bare when `s` only has safe characters, else in double quotes,
    /// which both shells read the same way when the string holds no `"`,
    /// `%`, `$` or backtick; a string with one of those is quoted for
    /// PowerShell alone (single quotes).
    fn quote(s: &str) -> String {
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

    /// As `quote` does (a name that is not valid UTF-16 is shown with
    /// U+FFFD: Windows file names almost never are).
    fn quote_os(s: &OsStr) -> String {
        Self::quote(&s.to_string_lossy())
    }
}
