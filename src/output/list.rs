//! `list` (SPEC §2.5), written entry by entry as the store hands the locks
//! over, so that they are never all in memory: after them come
//! `tombstones` and, only when an older version's layout still holds some,
//! `legacy`.

use std::io::{BufWriter, Write};

use super::writer::{open_stdout, unwritten};
use super::{Channel, ExitStatus, ListEntry, Report};
use crate::engine::Entry;
use crate::error::Error;

/// `list` (SPEC §2.5), written as it is read: `{"result":"list","store":..,
/// "locks":[` then one [`ListEntry`] per lock, then `],"tombstones":N}`.
struct ListWriter<W: Write> {
    out: W,
    first: bool,
}

impl<W: Write> ListWriter<W> {
    fn start(mut out: W, store: &str) -> std::io::Result<Self> {
        out.write_all(br#"{"result":"list","store":"#)?;
        crate::visible::to_writer(&mut out, store)?;
        out.write_all(br#","locks":["#)?;
        Ok(Self { out, first: true })
    }

    /// Writes one judged lock.
    fn entry(&mut self, judged: Entry) -> std::io::Result<()> {
        let entry = ListEntry::from(judged);
        if !self.first {
            self.out.write_all(b",")?;
        }
        self.first = false;
        crate::visible::to_writer(&mut self.out, &entry)?;
        Ok(())
    }

    fn finish(mut self, tombstones: usize, legacy: &[ListEntry]) -> std::io::Result<W> {
        write!(self.out, r#"],"tombstones":{tombstones}"#)?;
        if !legacy.is_empty() {
            self.out.write_all(br#","legacy":"#)?;
            serde_json::to_writer(&mut self.out, legacy)?;
        }
        writeln!(self.out, "}}")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Counts the bytes that reached the writer, to know whether anything did.
struct Counted<W: Write> {
    inner: W,
    written: usize,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The `list` object on stdout, written as the engine hands over each
/// lock (the command layer passes [`ListPrinter::entry`] to
/// [`crate::engine::list`] as its sink), so the locks are never all in memory. A
/// result that could not be written in full (standard output closed, full
/// or a broken pipe) is a failure, said on stderr (SPEC §3).
pub(crate) struct ListPrinter {
    list: ListWriter<BufWriter<Counted<std::io::StdoutLock<'static>>>>,
    /// Why standard output failed under an entry.
    closed: Option<String>,
}

impl ListPrinter {
    /// Opens standard output and starts the object of the store described
    /// as `store`.
    ///
    /// # Errors
    /// The exit status when standard output cannot be written (said on
    /// stderr): the store is not read then.
    pub(crate) fn start(store: &str) -> Result<Self, ExitStatus> {
        let started = open_stdout().and_then(|out| {
            let counted = Counted {
                inner: out,
                written: 0,
            };
            ListWriter::start(BufWriter::with_capacity(64 * 1024, counted), store)
        });
        match started {
            Ok(list) => Ok(Self { list, closed: None }),
            Err(e) => {
                unwritten(&e, "");
                Err(ExitStatus::Error)
            }
        }
    }

    /// Writes one judged lock.
    ///
    /// # Errors
    /// Standard output failed: the store's visit stops there.
    pub(crate) fn entry(&mut self, judged: Entry) -> Result<(), Error> {
        self.list.entry(judged).map_err(|e| {
            self.closed = Some(e.to_string());
            Error::io("write", "standard output", e)
        })
    }

    /// Ends the object once the store's visit is over (`visited`: the
    /// tombstones it saw, or why it stopped), with the locks an older
    /// version left in working-tree layers (`legacy`), and returns the exit
    /// status.
    ///
    /// # Errors
    /// A store failure before any byte reached stdout (the caller prints the
    /// error object instead). A failure after that ends the broken line, puts
    /// the error object on stderr and returns [`ExitStatus::Error`].
    pub(crate) fn finish(
        self,
        visited: Result<usize, Error>,
        legacy: Vec<Entry>,
    ) -> Result<ExitStatus, Error> {
        let failed = |e: &dyn std::fmt::Display| {
            unwritten(e, "");
            Ok(ExitStatus::Error)
        };
        match visited {
            Ok(tombstones) => {
                let legacy: Vec<ListEntry> = legacy.into_iter().map(ListEntry::from).collect();
                match self.list.finish(tombstones, &legacy) {
                    Ok(_) => Ok(ExitStatus::Success),
                    Err(e) => failed(&e),
                }
            }
            Err(err) => {
                if let Some(why) = self.closed {
                    return failed(&why);
                }
                let (mut stdout, _unwritten) = self.list.out.into_parts();
                if stdout.written == 0 {
                    return Err(err);
                }
                let _ = stdout.write_all(b"\n");
                Ok(Report::error(&err, None).emit(Channel::Stderr))
            }
        }
    }
}
