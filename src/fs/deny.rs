//! Denial recording (`.smithfs/why` and the journal) and the open-handle budgets charged per smith.

use nix::errno::Errno;

use super::error::{FsError, FsResult};
use super::why::DenialRecord;
use super::{budget, Caller, FsEvent, SmithFs};
use crate::identity::Identity;
use crate::policy::{Decision, Denial};

impl SmithFs {
    /// Apply a decision: Ok, or record the denial (why + journal) and return its errno.
    pub(super) fn enforce(
        &self,
        caller: &Caller,
        who: Identity,
        decision: Decision,
        op: &str,
        path: impl FnOnce() -> String,
    ) -> FsResult<()> {
        match decision {
            Decision::Allow => Ok(()),
            Decision::Deny(d) => Err(self.denied(caller, who, op, path(), d)),
        }
    }

    pub(super) fn denied(
        &self,
        caller: &Caller,
        who: Identity,
        op: &str,
        path: String,
        d: Denial,
    ) -> FsError {
        self.record_denial(caller, who, op, path, d, true)
    }

    /// Record a denial for `.smithfs/why`; with `journal`, also send it to the journal
    /// (`access.denied`).
    pub(super) fn record_denial(
        &self,
        caller: &Caller,
        who: Identity,
        op: &str,
        path: String,
        d: Denial,
        journal: bool,
    ) -> FsError {
        let errno = d.errno;
        let rec = DenialRecord {
            who: self.identity_name(who),
            smith: match who {
                Identity::Smith(s) => Some(s),
                Identity::Operator | Identity::Unknown => None,
            },
            pid: caller.pid,
            uid: caller.uid,
            time: crate::cli::init::now_rfc3339(),
            op: op.to_string(),
            path,
            errno: errno as i32,
            rule: d.rule.to_string(),
            why: d.why,
            alternative: d.alternative,
        };
        tracing::debug!(?rec, "denied");
        self.why.record(who, rec.clone());
        if journal {
            self.emit(FsEvent::Denied(Box::new(rec)));
        }
        FsError::Denied(errno)
    }

    /// Take the budget slot of one more open handle of `who`, or refuse the open: EMFILE when
    /// the smith holds `limits.max_open_files_per_smith` handles, ENFILE when the mount's share
    /// of the daemon's descriptors is used up. Every refusal is explained in `.smithfs/why`;
    /// the first of an episode is also journaled (a program retrying in a loop does not flood
    /// the journal).
    pub(super) fn charge(
        &self,
        caller: &Caller,
        who: Identity,
        op: &str,
        path: impl FnOnce() -> String,
    ) -> FsResult<budget::Slot> {
        let refused = match self.open_limits.charge(who) {
            Ok(slot) => return Ok(slot),
            Err(r) => r,
        };
        let d = match refused.why {
            budget::Refusal::Smith { limit } => Denial {
                errno: Errno::EMFILE,
                rule: "open-files-per-smith",
                why: format!(
                    "{} already holds {limit} open files in this mount, the limit per smith (limits.max_open_files_per_smith): each open file or directory costs the daemon a descriptor, and its descriptors are shared by every smith.",
                    self.identity_name(who)
                ),
                alternative: "close files that are no longer needed (a memory mapping keeps its file open until it is unmapped), or ask the operator to raise limits.max_open_files_per_smith in config.json".into(),
            },
            budget::Refusal::Mount { limit } => Denial {
                errno: Errno::ENFILE,
                rule: "open-files-mount",
                why: format!(
                    "All {limit} open files the mount allows are in use (every smith and the operator together); the daemon keeps its other descriptors for its own work."
                ),
                alternative: "close files that are no longer needed, or run the daemon with a higher RLIMIT_NOFILE (as root it raises its own to fs.nr_open)".into(),
            },
        };
        Err(self.record_denial(caller, who, op, path(), d, refused.first))
    }

    pub(super) fn identity_name(&self, who: Identity) -> String {
        match who {
            Identity::Smith(s) => self
                .registry
                .full_id(s)
                .unwrap_or_else(|| format!("smith #{}", s.0)),
            Identity::Operator => "operator".into(),
            Identity::Unknown => "unknown".into(),
        }
    }
}
