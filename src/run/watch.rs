//! The supervisor's watch loop of `run` (the steps are told in
//! [`crate::run`]): forwards signals, schedules renewals, gives the verdict
//! on each renewal and report, and says why the watch ended.

use std::process::ExitStatus;
use std::sync::mpsc;
use std::time::Duration;

use super::renewer::Renewer;
use super::{CmdTree, Notice, TreeOwner, TreeReport, lease_clock};
use crate::engine::Renew;
use crate::error::Result;

/// Why the watch ended.
pub(super) enum End {
    /// No process of CMD's tree is left; CMD's status.
    Done(Option<ExitStatus>),
    /// The lease was lost or ends unconfirmed; CMD's status, when already
    /// seen, and whether the tree was already reported gone.
    Lost(Option<ExitStatus>, bool),
    /// CMD could not be started (the reason).
    Failed(String),
    /// The owner of the tree vanished before the tree was empty; CMD's
    /// status, if seen.
    TreeGone(Option<ExitStatus>),
}

/// What the watch came to.
pub(super) struct Watched {
    /// Why it ended.
    pub(super) end: End,
    /// How many renewals were confirmed.
    pub(super) renewals: u64,
    /// The last signal (console event) this wrapper took.
    pub(super) last_signal: Option<libc::c_int>,
}

/// What the watch keeps while it runs.
#[derive(Default)]
struct Tally {
    renewals: u64,
    exited: Option<ExitStatus>,
    last_signal: Option<libc::c_int>,
}

impl Tally {
    fn ended(self, end: End) -> Watched {
        Watched {
            end,
            renewals: self.renewals,
            last_signal: self.last_signal,
        }
    }
}

/// The supervisor's loop: forwards signals, schedules renewals, and ends
/// when no process of CMD's tree is left, or the lease is lost or about to
/// end unconfirmed, or the tree's owner is gone.
pub(super) fn watch(
    rx: &mpsc::Receiver<Notice>,
    renew: &mpsc::Sender<Duration>,
    renewer: &mut Renewer,
    tree: &mut CmdTree,
    fence: u64,
) -> Watched {
    let mut seen = Tally::default();
    loop {
        let now = lease_clock();
        if now >= renewer.stop_at() {
            eprintln!(
                "skill-lock run: no renewal confirmed the lease, which ends in {} ms; stopping the command and everything it started",
                renewer.confirmed_end().saturating_sub(now).as_millis()
            );
            let end = End::Lost(seen.exited, false);
            return seen.ended(end);
        }
        if renewer.due(now) && renew.send(renewer.confirmed_end()).is_ok() {
            renewer.sent();
        }
        let end = match rx.recv_timeout(renewer.sleep(now)) {
            Ok(Notice::Signal(sig)) => {
                seen.last_signal = Some(sig);
                tree.signal(sig);
                None
            }
            Ok(Notice::Tree(report)) => {
                if let TreeReport::Started(pid) = report {
                    tree.started(pid);
                }
                on_report(report, &mut seen.exited, renewer)
            }
            Ok(Notice::Renewal { began, result }) => {
                on_renewal(began, result, renewer, tree, &mut seen, fence)
            }
            Ok(Notice::TooLate) => {
                eprintln!(
                    "skill-lock run: the lease ended before its renewal could be sent (this process was paused past it); stopping the command and everything it started"
                );
                Some(End::Lost(seen.exited, false))
            }
            Err(_) => None,
        };
        if let Some(end) = end {
            return seen.ended(end);
        }
    }
}

/// What a report on the tree means for the watch (`Some`: it ends);
/// `exited` keeps CMD's status once reported.
fn on_report(
    report: TreeReport,
    exited: &mut Option<ExitStatus>,
    renewer: &Renewer,
) -> Option<End> {
    if let TreeReport::Exited { status, .. } = &report {
        *exited = *status;
    }
    if matches!(report, TreeReport::Exited { .. } | TreeReport::Empty)
        && lease_clock() >= renewer.stop_at()
    {
        // This wrapper was stopped or starved past the stop moment, and
        // the tree was stopped in its place.
        eprintln!(
            "skill-lock run: no renewal confirmed the lease in time; the command and everything it started were stopped"
        );
        return Some(End::Lost(*exited, report == TreeReport::Empty));
    }
    match report {
        TreeReport::Started(_) => None,
        TreeReport::Failed(message) => Some(End::Failed(message)),
        TreeReport::Exited { leftovers, .. } => {
            if leftovers {
                eprintln!("{}", CmdTree::LEFTOVERS);
            }
            None
        }
        TreeReport::Empty => Some(End::Done(*exited)),
        TreeReport::Gone => {
            eprintln!("{}", CmdTree::TREE_GONE);
            Some(End::TreeGone(*exited))
        }
    }
}

/// The verdict on a renewal's answer (`Some`: the lease is lost); a
/// confirmed renewal moves the lease end, and the tree's stop moment, on.
/// A renewal that revived the lease (it had ended, or a reader may have
/// called it stale: SPEC §2.2) took a new fence, not the `fence` CMD was
/// told: the lease CMD writes under is over, so it is lost (SPEC §2.7).
fn on_renewal(
    began: Duration,
    result: Result<Renew>,
    renewer: &mut Renewer,
    tree: &mut CmdTree,
    seen: &mut Tally,
    fence: u64,
) -> Option<End> {
    let exited = seen.exited;
    match result {
        Ok(Renew::Renewed { holder, .. }) if holder.fence != fence => {
            eprintln!(
                "skill-lock run: the lease had ended when this renewal reached the store (this process was paused past it), so the renewal revived it under fence {}, not the fence {fence} the command was told; stopping the command and everything it started",
                holder.fence
            );
            Some(End::Lost(exited, false))
        }
        Ok(Renew::Renewed { .. }) => {
            renewer.confirmed(began);
            tree.arm(renewer.stop_at());
            seen.renewals += 1;
            None
        }
        Ok(Renew::NotOwner { holder, .. }) => {
            Renewer::report_lost(&holder);
            Some(End::Lost(exited, false))
        }
        Ok(Renew::NotHeld { .. }) => {
            eprintln!(
                "skill-lock run: the lock was released by someone else; stopping the command and everything it started"
            );
            Some(End::Lost(exited, false))
        }
        Err(e) => {
            renewer.report_failure(&e);
            None
        }
    }
}
