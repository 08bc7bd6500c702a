//! Where a personal layer is, and how it is opened: from its anchor, one
//! component at a time without following a link, P and P/run checked.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{Dir, Misfit, found, not_a};
use crate::error::{Error, Result};

/// Where a personal layer is: an anchor the user chose (the checkout, the
/// git common directory, a `file:DIR`), opened as given, and the names below
/// it that lead to P, each opened without following a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Location {
    anchor: PathBuf,
    below: Vec<OsString>,
}

/// The open layer: P and P/run, both checked.
#[derive(Debug)]
pub(in crate::store::fs) struct Opened {
    /// P.
    pub(in crate::store::fs) p: Dir,
    /// P/run.
    pub(in crate::store::fs) run: Dir,
}

impl Location {
    /// The layer at `anchor/below[0]/below[1]/...`.
    #[must_use]
    pub(crate) fn new(anchor: &Path, below: &[&str]) -> Self {
        Self {
            anchor: anchor.to_path_buf(),
            below: below.iter().map(OsString::from).collect(),
        }
    }

    /// The path of P.
    #[must_use]
    pub(crate) fn dir(&self) -> PathBuf {
        self.below
            .iter()
            .fold(self.anchor.clone(), |p, n| p.join(n))
    }

    /// Opens P, created (0700) when absent and `create`; `None` when absent
    /// and not `create`. P must be the invoking user's alone.
    ///
    /// # Errors
    /// [`Error::Untrusted`] for a link on the way, a foreign or
    /// writable-by-others P; [`Error::Io`].
    fn open_p(&self, create: bool) -> Result<Option<Dir>> {
        let Some((last, between)) = self.below.split_last() else {
            let anchor = if create {
                Some(Dir::anchor_create(&self.anchor)?)
            } else {
                Dir::anchor(&self.anchor)?
            };
            if let Some(a) = &anchor {
                a.check_owner()?;
            }
            return Ok(anchor);
        };
        let Some(mut at) = Dir::anchor(&self.anchor)? else {
            return Ok(None);
        };
        for name in between {
            at = match at.dir_plain(name) {
                Ok(Some(d)) => d,
                Ok(None) => return Ok(None),
                Err(Misfit::Io(e)) => return Err(Error::io("open", at.join(name), e)),
                Err(_) => {
                    return Err(not_a(
                        &at.join(name),
                        "a directory",
                        found(at.stat_at(name)?.as_ref()),
                    ));
                }
            };
        }
        at.dir(last, create)
    }

    /// Opens P and P/run (created when absent and `create`).
    ///
    /// # Errors
    /// As [`Location::open_p`].
    pub(in crate::store::fs) fn open(&self, create: bool) -> Result<Option<Opened>> {
        let Some(p) = self.open_p(create)? else {
            return Ok(None);
        };
        Ok(p.dir("run", create)?.map(|run| Opened { p, run }))
    }
}
