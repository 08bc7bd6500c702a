//! What the git store's cache directory needs of the OS, declared once as
//! [`CacheOs`] and implemented for [`Os`] on Unix and on Windows: the
//! compiler checks both against the one declaration.

use std::fs::DirBuilder;
use std::path::Path;

/// The per-OS part of the cache directory: making it private, telling
/// whether a directory is the invoking user's alone, and naming that user.
pub(super) trait CacheOs {
    /// Sets `builder` to create directories only their owner may use.
    fn private(builder: &mut DirBuilder) -> &mut DirBuilder;
    /// Is `dir` the invoking user's and writable by nobody else?
    fn ours_alone(dir: &Path) -> std::io::Result<bool>;
    /// The invoking user, in the name of a directory of their own.
    fn user_tag() -> String;
}

/// This OS.
pub(super) struct Os;

#[cfg(unix)]
impl CacheOs for Os {
    /// Directories created 0700.
    fn private(builder: &mut DirBuilder) -> &mut DirBuilder {
        std::os::unix::fs::DirBuilderExt::mode(builder, 0o700)
    }

    fn ours_alone(dir: &Path) -> std::io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let meta = std::fs::metadata(dir)?;
        Ok(meta.uid() == uid && meta.mode() & 0o022 == 0)
    }

    fn user_tag() -> String {
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }.to_string()
    }
}

/// On Windows the temporary directory is the user's own (in the profile),
/// and a directory inherits its parent's ACL.
#[cfg(windows)]
impl CacheOs for Os {
    /// Nothing to set: the directory inherits its parent's ACL.
    fn private(builder: &mut DirBuilder) -> &mut DirBuilder {
        builder
    }

    /// The temporary directory is the user's own.
    fn ours_alone(_dir: &Path) -> std::io::Result<bool> {
        Ok(true)
    }

    /// The temporary directory is the user's own: any name will do.
    fn user_tag() -> String {
        "user".to_owned()
    }
}
