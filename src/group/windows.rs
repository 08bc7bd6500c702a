//! Windows: a Job Object, the one group of processes that is killed as one
//! and that no member can leave; [`Job`] is also what `run` on Windows
//! holds its command's tree in.

use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
use std::process::{Child, Command};

use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JobObjectBasicAccountingInformation, JobObjectExtendedLimitInformation,
    QueryInformationJobObject, SetInformationJobObject, TerminateJobObject,
};

/// A Job Object that kills every process in it when its last handle is
/// closed (this process ending, however, closes it), and lets none break
/// away.
#[derive(Debug)]
pub(crate) struct Job(OwnedHandle);

impl Job {
    /// A new, empty job.
    ///
    /// # Errors
    /// The OS error.
    pub(crate) fn new() -> std::io::Result<Self> {
        // SAFETY: no name, default security; the handle is owned below.
        let h = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if h.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a handle CreateJobObjectW just returned.
        let job = Self(unsafe { OwnedHandle::from_raw_handle(h) });
        // SAFETY: zeroed plain data; only the limit flags are set.
        let mut limits: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
        limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
        // SAFETY: a valid job handle and a buffer of the class's size.
        let ok = unsafe {
            SetInformationJobObject(
                job.0.as_raw_handle(),
                JobObjectExtendedLimitInformation,
                (&raw const limits).cast(),
                u32::try_from(std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>())
                    .unwrap_or(0),
            )
        };
        if ok == 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(job)
    }

    /// Puts `child` into the job (what it starts from then on is in the
    /// job too).
    ///
    /// # Errors
    /// The OS error.
    pub(crate) fn assign(&self, child: &Child) -> std::io::Result<()> {
        // SAFETY: valid job and process handles (the child's, open with
        // every right).
        if unsafe { AssignProcessToJobObject(self.0.as_raw_handle(), child.as_raw_handle()) } == 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// How many processes of the job are still running (`None`: unknown).
    #[must_use]
    pub(crate) fn active(&self) -> Option<u32> {
        // SAFETY: zeroed plain data the call fills in.
        let mut info: JOBOBJECT_BASIC_ACCOUNTING_INFORMATION = unsafe { std::mem::zeroed() };
        // SAFETY: a valid job handle and a buffer of the class's size.
        let ok = unsafe {
            QueryInformationJobObject(
                self.0.as_raw_handle(),
                JobObjectBasicAccountingInformation,
                (&raw mut info).cast(),
                u32::try_from(std::mem::size_of::<JOBOBJECT_BASIC_ACCOUNTING_INFORMATION>())
                    .unwrap_or(0),
                std::ptr::null_mut(),
            )
        };
        (ok != 0).then_some(info.ActiveProcesses)
    }

    /// Ends every process of the job with `code`.
    pub(crate) fn terminate(&self, code: u32) {
        // SAFETY: a valid job handle.
        unsafe { TerminateJobObject(self.0.as_raw_handle(), code) };
    }
}

/// A child and what it starts, in a Job Object of their own.
pub(crate) struct Group(Job);

impl super::Platform for Group {
    /// Nothing to ready: the child is put into a job once spawned.
    fn prepare(_cmd: &mut Command) {}

    fn of(child: &Child) -> std::io::Result<Self> {
        let job = Job::new()?;
        job.assign(child)?;
        Ok(Self(job))
    }

    fn kill(&self) {
        self.0.terminate(1);
    }
}
