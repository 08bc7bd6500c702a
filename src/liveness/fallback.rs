//! Other Unix systems: hostname only; no boot id or start time yet, so a pid
//! is judged by existence alone (macOS: `sysctl kern.proc.pid` would add the
//! start time, `kern.bootsessionuuid` the boot id).

use crate::lease::BootClock;

pub(super) fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec())
        .ok()
        .filter(|h| !h.is_empty())
}

pub(super) fn boot_clock() -> Option<BootClock> {
    None
}

pub(super) fn process_start(_pid: u32) -> Option<u64> {
    None
}
