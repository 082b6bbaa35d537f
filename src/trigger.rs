//! What the filesystem tells the scheduler (docs/SPEC.md §5, §6, §7): the one message type on
//! the scheduler's queue from outside it. The fs detects completions (a handle released after
//! write access, `O_TRUNC` or `O_CREAT`; a rename or link onto the name), registry changes,
//! denials and `ctl`'s `cancel`, and hands one of these to its scheduler link
//! ([`crate::fs::Scheduling::trigger`], implemented by [`crate::sched::SchedulerPort`]), which never
//! blocks. A leaf: it names only tree types.

use crate::tree::model::SmithIdx;

/// One event detected by the filesystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// A `task-*.md` directly in `smith`'s `inbox/` completed.
    TaskAssigned {
        /// The smith whose inbox it is.
        smith: SmithIdx,
        /// The file's name in the inbox (`task-001.md`).
        file: String,
    },
    /// A `task-*.md` directly in `smith`'s `inbox/` completed but breaks the task-name rule
    /// (docs/SPEC.md §5): kept as data, journaled once as `task.ignored` (`path`, `reason`).
    TaskIgnored {
        /// The smith whose inbox it is.
        smith: SmithIdx,
        /// The file's name (lossily UTF-8: it may be any bytes).
        file: String,
        /// Which part of the rule it breaks, as a clause (`has a space (0x20) …`).
        reason: String,
    },
    /// `smith`'s `outbox/result.md` completed.
    ResultPublished {
        /// The smith that published.
        smith: SmithIdx,
    },
    /// A child dir was scaffolded and registered, or a smith dir the operator moved into a
    /// `children/` was registered under its new full id.
    SmithCreated {
        /// The new smith.
        smith: SmithIdx,
        /// Moved into place (its files, `outbox/result.md` included, predate it), not scaffolded.
        moved: bool,
    },
    /// A smith dir was removed or moved out of the tree by the operator: `smith` and its subtree
    /// are gone from the registry. Not journaled; the scheduler forgets them, so their parent
    /// is not kept waiting for them (`children.settled`).
    SmithRemoved {
        /// The top of the removed subtree.
        smith: SmithIdx,
    },
    /// An operation was denied (docs/SPEC.md §3); journaled as `access.denied`.
    AccessDenied {
        /// The caller's smith; `None` for the operator or Unknown.
        smith: Option<SmithIdx>,
        /// The caller's pid (0 for kernel requests).
        pid: u32,
        /// The operation (`open`, `unlink`, …).
        op: String,
        /// The path, relative to the mount root.
        path: String,
        /// The errno returned.
        errno: i32,
        /// The rule that denied it.
        rule: String,
    },
    /// Denials of one identity and second beyond the rate limit (docs/SPEC.md §7); journaled
    /// as `access.denied.suppressed` with `count`.
    DenialsSuppressed(Suppressed),
    /// Ignored task names of one inbox and second beyond the rate limit (docs/SPEC.md §5,
    /// notes H22); journaled as one `task.ignored` with `count` (its `smith` the inbox's).
    IgnoredSuppressed(Suppressed),
    /// `cancel <full-id>` was written to `ctl` by an authorised identity (docs/SPEC.md §6): the
    /// smith and its subtree are cancelled (journaled by the scheduler as `run.cancelled`).
    Cancel {
        /// The smith to cancel (with its subtree).
        smith: SmithIdx,
    },
    /// `retry <full-id>` was written to `ctl` by an authorised identity (`smithfs retry`,
    /// docs/SPEC.md §6): a failed or cancelled smith runs again with `SMITH_WAKE=retry`.
    Retry {
        /// The smith to run again.
        smith: SmithIdx,
    },
}

impl Trigger {
    /// The journal event name.
    pub fn event_name(&self) -> &'static str {
        match self {
            Trigger::TaskAssigned { .. } => "task.assigned",
            Trigger::TaskIgnored { .. } => "task.ignored",
            Trigger::ResultPublished { .. } => "result.published",
            Trigger::SmithCreated { .. } => "smith.created",
            Trigger::SmithRemoved { .. } => "smith.removed",
            Trigger::AccessDenied { .. } => "access.denied",
            Trigger::DenialsSuppressed(_) => "access.denied.suppressed",
            Trigger::IgnoredSuppressed(_) => "task.ignored",
            Trigger::Cancel { .. } => "cancel",
            Trigger::Retry { .. } => "retry",
        }
    }
}

/// The suppressed denials of one identity in one second: one `access.denied.suppressed` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suppressed {
    /// The identity's smith; `None` for the operator or Unknown.
    pub smith: Option<SmithIdx>,
    /// The second (Unix time) they happened in.
    pub second: u64,
    /// How many were not written in full.
    pub count: u64,
}
