//! Completion of `task-*.md` and `result.md` (docs/SPEC.md §5), and the task-name rule's `why`:
//! an inbox name that looks like a task but breaks the rule is kept as data, the scheduler
//! journals it once as `task.ignored`, and the writer's `.smithfs/why` names a name that works.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::inode::Inode;
use super::why::DenialRecord;
use super::{Caller, SmithFs};
use crate::identity::Identity;
use crate::policy::{Area, Depth, Zone};
use crate::tree::layout::{classify_task_name, suggest_task_name, TaskName};
use crate::trigger::Trigger;

/// Who completed a file: identity, thread id, uid.
pub(super) type Writer = (Identity, u32, u32);

impl SmithFs {
    /// If `inode` (a regular file now named `name` in `dir`, put there by `caller`) is a
    /// protocol file, report its completion (docs/SPEC.md §5).
    pub(super) fn completed_at(&self, caller: &Caller, dir: &Inode, name: &OsStr, inode: &Inode) {
        if inode.kind == libc::S_IFREG {
            self.completed_name(caller, dir, name);
        }
    }

    /// [`SmithFs::completed_by`] for the caller of a rename or link.
    pub(super) fn completed_name(&self, caller: &Caller, dir: &Inode, name: &OsStr) {
        let who = self.identify(caller);
        self.completed_name_by(dir, name.as_bytes(), (who, caller.pid, caller.uid));
    }

    /// Report the completion of `dir/name` by `writer`; a refused task name also leaves the
    /// writer a `why` that names a name that would work.
    pub(super) fn completed_name_by(&self, dir: &Inode, name: &[u8], writer: Writer) {
        let Some(t) = completion(self.zone(dir), name) else {
            return;
        };
        if let Trigger::TaskIgnored { reason, .. } = &t {
            let (who, pid, uid) = writer;
            let path = format!("{}/{}", self.path_of(dir), String::from_utf8_lossy(name));
            let good = suggest_task_name(name);
            let rec = DenialRecord {
                who: self.identity_name(who),
                smith: match who {
                    Identity::Smith(s) => Some(s),
                    Identity::Operator | Identity::Unknown => None,
                },
                pid,
                uid,
                time: crate::time::now_rfc3339(),
                op: "complete task".into(),
                path,
                errno: 0,
                rule: "task-name".into(),
                why: format!(
                    "The inbox file {:?} is kept as data and starts no run: its name {reason}.",
                    String::from_utf8_lossy(name)
                ),
                alternative: format!(
                    "Rename it to {good} (a task name is task-[A-Za-z0-9][A-Za-z0-9._-]*.md, at \
                     most 255 bytes)."
                ),
            };
            self.why.record(who, rec);
        }
        self.emit(t);
    }
}

/// The completion event for a regular file named `name` in a directory of zone `dir`
/// (docs/SPEC.md §5): a task name directly in an inbox (`task.assigned`, or `task.ignored` for a
/// `task-*.md` that breaks the name rule), `result.md` directly in an outbox.
pub fn completion(dir: Zone, name: &[u8]) -> Option<Trigger> {
    let Zone::Smith(z) = dir else {
        return None;
    };
    if z.depth != Depth::Top {
        return None;
    }
    match z.area {
        Area::Inbox => match classify_task_name(name) {
            TaskName::Valid => Some(Trigger::TaskAssigned {
                smith: z.owner,
                file: String::from_utf8_lossy(name).into_owned(),
            }),
            TaskName::Ignored(reason) => Some(Trigger::TaskIgnored {
                smith: z.owner,
                file: String::from_utf8_lossy(name).into_owned(),
                reason,
            }),
            TaskName::Other => None,
        },
        Area::Outbox if name == b"result.md" => Some(Trigger::ResultPublished { smith: z.owner }),
        Area::SmithDir
        | Area::SmithMd
        | Area::Config
        | Area::Claude
        | Area::Private
        | Area::Outbox
        | Area::Conversations
        | Area::Children
        | Area::Other
        | Area::Workspace
        | Area::Home => None,
    }
}
