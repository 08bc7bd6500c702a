//! Output (SPEC §3): the JSON wire objects, their exit statuses, and the only
//! writer to stdout.
//!
//! Every invocation but `--help`/`--version`/`completions` prints exactly one
//! JSON object as one line. [`Report`] is one type per wire object, tagged by
//! `result` (`wire.rs`); each object knows its [`ExitStatus`] (`exit.rs`),
//! and the conversions from engine outcomes to objects are `convert.rs`.
//! `writer.rs` is the one writer to standard output and the [`Channel`]
//! an object goes to; whether standard output was closed at start is asked
//! per OS (`unix.rs`, `windows.rs`). The `list` object is written entry by
//! entry as the store hands the locks over ([`ListPrinter`], `list.rs`), so
//! its locks are never all in memory; after them come `tombstones` and,
//! only when an older version's layout still holds some, `legacy`: the locks
//! found in a working tree's `.apache-magpie-local/`. `completions.rs`
//! prints the shell completion scripts.

mod completions;
mod convert;
mod exit;
mod list;
mod wire;
mod writer;

per_os!();

pub(crate) use completions::print_completions;
pub(crate) use exit::ExitStatus;
pub(crate) use list::ListPrinter;
pub(crate) use wire::{About, ListEntry, Report};
pub(crate) use writer::{Channel, print_plain, stdout_closed, unwritten};
