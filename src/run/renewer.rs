//! The lease `run` holds, on a clock that never steps (SPEC §2.7 "CMD
//! never writes unprotected"): the end last confirmed by a renewal, when the
//! next renewal is due, and the moment to start stopping CMD's processes,
//! a margin before that end, so that the last of them is gone before it.

use crate::clock::lease_clock;
use crate::record::Holder;
use crate::visible::visible;
use std::time::Duration;

/// How long before the confirmed lease end `run` starts stopping the
/// group, and the grace between its SIGTERM and SIGKILL: a quarter of the
/// ttl, at most 10 s; the grace is half of it, so the SIGKILL is sent half
/// the margin before the end (125 ms for ttl 1, 5 s from ttl 40 up), which
/// leaves that long for it to land and for the wrapper to see the group gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Margins {
    /// Stop this long before the confirmed end.
    pub stop: Duration,
    /// SIGTERM, then SIGKILL this much later.
    pub grace: Duration,
}

impl Margins {
    /// The margins of a lease of `ttl` seconds.
    #[must_use]
    pub(super) fn of(ttl: u64) -> Self {
        let stop = (Duration::from_secs(ttl) / 4).min(Duration::from_secs(10));
        Self {
            stop,
            grace: stop / 2,
        }
    }
}

/// The renewal policy and the lease end last confirmed, on [`lease_clock`].
///
/// A renewal that began at `t` and succeeded confirms the lease until
/// `t + ttl` (the store's new expiry is at least that: it reads its clock
/// later and rounds up). Renewals are due every ttl/3; a failed one is
/// retried after a tenth of the ttl (50 ms to 1 s), not another ttl/3.
#[derive(Debug, Clone)]
pub(super) struct Renewer {
    ttl: Duration,
    margins: Margins,
    confirmed_end: Duration,
    next: Duration,
    in_flight: bool,
}

impl Renewer {
    /// A lease of `ttl` seconds whose acquire began at `began`.
    #[must_use]
    pub(super) fn new(ttl: u64, began: Duration) -> Self {
        let ttl_d = Duration::from_secs(ttl);
        Self {
            ttl: ttl_d,
            margins: Margins::of(ttl),
            confirmed_end: began + ttl_d,
            next: began + Self::every(ttl_d),
            in_flight: false,
        }
    }

    fn every(ttl: Duration) -> Duration {
        (ttl / 3).max(Duration::from_millis(100))
    }

    /// The margins in use.
    #[must_use]
    pub(super) fn margins(&self) -> Margins {
        self.margins
    }

    /// The end of the lease last confirmed.
    #[must_use]
    pub(super) fn confirmed_end(&self) -> Duration {
        self.confirmed_end
    }

    /// When the group must start being stopped unless a renewal confirms more.
    #[must_use]
    pub(super) fn stop_at(&self) -> Duration {
        self.confirmed_end.saturating_sub(self.margins.stop)
    }

    /// Should a renewal be sent now?
    #[must_use]
    pub(super) fn due(&self, now: Duration) -> bool {
        !self.in_flight && now >= self.next
    }

    /// A renewal was sent.
    pub(super) fn sent(&mut self) {
        self.in_flight = true;
    }

    /// The renewal that began at `began` succeeded.
    pub(super) fn confirmed(&mut self, began: Duration) {
        self.in_flight = false;
        self.confirmed_end = self.confirmed_end.max(began + self.ttl);
        self.next = began + Self::every(self.ttl);
    }

    /// The renewal failed at `now`: retry soon.
    pub(super) fn failed(&mut self, now: Duration) {
        self.in_flight = false;
        let retry = (self.ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        self.next = now + retry;
    }

    /// A renewal failed with `why`: says so on stderr, with what is left of
    /// the confirmed lease, and retries soon (both platforms' `run`).
    pub(super) fn report_failure(&mut self, why: &impl std::fmt::Display) {
        let now = lease_clock();
        eprintln!(
            "skill-lock run: renewal failed ({}); retrying; the lease ends in {} ms",
            visible(&why.to_string()),
            self.confirmed_end().saturating_sub(now).as_millis()
        );
        self.failed(now);
    }

    /// A renewal found the lock held by `holder`: says so on stderr, its
    /// host shown so that a terminal acts on nothing in it (both
    /// platforms' `run`; the record may be forged).
    pub(super) fn report_lost(holder: &Holder) {
        eprintln!(
            "skill-lock run: the lease was lost (now held by {} pid {:?}, fence {}); stopping the command and everything it started",
            visible(&holder.host),
            holder.owner_pid,
            holder.fence
        );
    }

    /// How long to sleep from `now` before something is due (at most
    /// 200 ms, so a resume from suspend is noticed on the lease clock).
    #[must_use]
    pub(super) fn sleep(&self, now: Duration) -> Duration {
        let wake = if self.in_flight {
            self.stop_at()
        } else {
            self.next.min(self.stop_at())
        };
        wake.saturating_sub(now).min(Duration::from_millis(200))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn margins_leave_room_before_the_end() {
        let m = Margins::of(1);
        assert_eq!((m.stop, m.grace), (S / 4, S / 8));
        let m = Margins::of(7200);
        assert_eq!((m.stop, m.grace), (10 * S, 5 * S));
        for ttl in [1, 2, 3, 10, 60, 7200] {
            let m = Margins::of(ttl);
            assert!(
                m.grace < m.stop && m.stop < Duration::from_secs(ttl),
                "{ttl}"
            );
        }
    }

    #[test]
    fn renewer_confirms_retries_quickly_and_names_the_stop() {
        let t0 = 100 * S;
        let mut r = Renewer::new(3, t0);
        assert_eq!(r.confirmed_end(), t0 + 3 * S);
        assert_eq!(
            Some(r.stop_at()),
            (t0 + 3 * S).checked_sub(Margins::of(3).stop)
        );
        assert!(!r.due(t0) && r.due(t0 + S));
        r.sent();
        assert!(!r.due(t0 + 2 * S), "one renewal at a time");
        r.failed(t0 + S);
        assert!(
            r.due(t0 + S + S * 3 / 10),
            "a failure is retried after ttl/10"
        );
        assert_eq!(r.confirmed_end(), t0 + 3 * S, "a failure confirms nothing");
        r.sent();
        r.confirmed(t0 + 2 * S);
        assert_eq!(r.confirmed_end(), t0 + 5 * S);
        assert!(!r.due(t0 + 2 * S) && r.due(t0 + 3 * S));
        // An older renewal that finishes late never moves the end back.
        r.confirmed(t0);
        assert_eq!(r.confirmed_end(), t0 + 5 * S);
        assert!(r.sleep(t0) <= Duration::from_millis(200));
    }
}
