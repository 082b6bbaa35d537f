//! Denial recording (`.smithfs/why` and the journal) and the open-handle budgets charged per smith.

use super::error::{FsError, FsResult};
use super::why::DenialRecord;
use super::{budget, Caller, SmithFs};
use crate::identity::Identity;
use crate::policy::{self, Decision, Denial, OpenBudget};
use crate::trigger::Trigger;

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
            time: crate::time::now_rfc3339(),
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
            self.emit(Trigger::AccessDenied {
                smith: rec.smith,
                pid: rec.pid,
                op: rec.op,
                path: rec.path,
                errno: rec.errno,
                rule: rec.rule,
            });
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
        let budget = match refused.why {
            budget::Refusal::Smith { limit } => OpenBudget::PerSmith { limit },
            budget::Refusal::Mount { limit } => OpenBudget::Mount { limit },
        };
        let d = policy::open_budget_denial(&self.identity_name(who), budget);
        Err(self.record_denial(caller, who, op, path(), d, refused.first))
    }

    pub(super) fn identity_name(&self, who: Identity) -> String {
        match who {
            Identity::Smith(s) => self
                .registry
                .full_id(s)
                .map_or_else(|| format!("smith #{}", s.0), String::from),
            Identity::Operator => "operator".into(),
            Identity::Unknown => "unknown".into(),
        }
    }
}
