//! The clocks (SPEC §6, §7 "Time safety", §2.7): where every judgement and
//! every wait reads the time.
//!
//! - [`Clock`]: where a decision reads the wall clock and the boot clock
//!   ([`Now`]): the system, or one fixed reading a test pins;
//! - [`lease_clock`]: the clock `run` keeps the lease it last confirmed on,
//!   and every bounded wait measures with: it never steps and counts time
//!   suspended, so a wall-clock jump can neither shorten nor stretch a wait.

use std::time::Duration;

use crate::liveness::{self, Origin};
use crate::record::Timestamp;

/// The boot-time clock of this host: which clock it is, and its reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootClock {
    /// `/proc/sys/kernel/random/boot_id` on Linux.
    pub id: String,
    /// The time namespace (inode of `/proc/self/ns/time`), where the kernel
    /// has them: another time namespace has another `CLOCK_BOOTTIME`.
    pub time_ns: Option<u64>,
    /// `CLOCK_BOOTTIME` in milliseconds (counts suspend, never steps).
    pub ms: u64,
}

/// One reading of the clocks, taken once per command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Now {
    /// Wall clock, milliseconds since the Unix epoch.
    pub wall_ms: i64,
    /// Boot-time clock, where the OS has one.
    pub boot: Option<BootClock>,
}

impl Now {
    /// Reads the system clocks.
    #[must_use]
    #[allow(
        clippy::disallowed_methods,
        reason = "the one reading of the wall clock"
    )]
    pub fn read() -> Self {
        let wall_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let here = Origin::here();
        let boot = match (&here.boot_id, liveness::boot_ms()) {
            (Some(id), Some(ms)) => Some(BootClock {
                id: id.clone(),
                time_ns: here.time_ns,
                ms,
            }),
            _ => None,
        };
        Self { wall_ms, boot }
    }

    /// The wall time, whole seconds (rounded down).
    #[must_use]
    pub fn wall(&self) -> Timestamp {
        Timestamp(self.wall_ms.div_euclid(1000))
    }
}

/// Where a decision reads the time: the system clocks, or one fixed reading
/// (a test pins it so that a decision sees exactly the time it was given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Clock {
    /// Read the system clocks each time ([`Now::read`]).
    System,
    /// Always this reading.
    Fixed(Now),
}

impl Clock {
    /// The time now, by this clock.
    #[must_use]
    pub fn now(&self) -> Now {
        match self {
            Self::System => Now::read(),
            Self::Fixed(now) => now.clone(),
        }
    }
}

/// The clock leases are kept on: never steps, and counts time suspended,
/// as time since an arbitrary origin (see `sys`).
#[must_use]
pub fn lease_clock() -> Duration {
    sys::lease_clock()
}

/// Windows: `GetTickCount64`, which counts sleep and hibernation, in
/// milliseconds.
#[cfg(windows)]
mod sys {
    use std::time::Duration;

    pub(super) fn lease_clock() -> Duration {
        // SAFETY: no preconditions.
        Duration::from_millis(unsafe {
            windows_sys::Win32::System::SystemInformation::GetTickCount64()
        })
    }
}

/// Unix: Linux `CLOCK_BOOTTIME`; elsewhere `CLOCK_MONOTONIC`, which on
/// macOS counts sleep too.
#[cfg(unix)]
mod sys {
    use std::time::Duration;

    #[cfg(target_os = "linux")]
    const LEASE_CLOCK: libc::clockid_t = libc::CLOCK_BOOTTIME;
    #[cfg(not(target_os = "linux"))]
    const LEASE_CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;

    pub(super) fn lease_clock() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid timespec to write into.
        if unsafe { libc::clock_gettime(LEASE_CLOCK, &raw mut ts) } != 0 {
            return Duration::ZERO;
        }
        Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
    }
}
