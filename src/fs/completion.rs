//! Completion of `task-*.md` and `result.md` (PROTOCOL.md §5).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::inode::Inode;
use super::SmithFs;
use crate::policy::{Area, Depth, Zone};
use crate::trigger::Trigger;

impl SmithFs {
    /// If `inode` (a regular file now named `name` in `dir`) is a protocol file, report its
    /// completion (PROTOCOL.md §5).
    pub(super) fn completed_at(&self, dir: &Inode, name: &OsStr, inode: &Inode) {
        if inode.kind == libc::S_IFREG {
            self.completed_name(dir, name);
        }
    }

    pub(super) fn completed_name(&self, dir: &Inode, name: &OsStr) {
        if let Some(e) = completion(self.zone(dir), name.as_bytes()) {
            self.emit(e);
        }
    }
}

/// The completion event for a regular file named `name` in a directory of zone `dir`
/// (PROTOCOL.md §5): `task-*.md` directly in an inbox, `result.md` directly in an outbox.
pub fn completion(dir: Zone, name: &[u8]) -> Option<Trigger> {
    let Zone::Smith(z) = dir else {
        return None;
    };
    if z.depth != Depth::Top {
        return None;
    }
    match z.area {
        Area::Inbox if name.starts_with(b"task-") && name.ends_with(b".md") => {
            Some(Trigger::TaskAssigned {
                smith: z.owner,
                file: String::from_utf8_lossy(name).into_owned(),
            })
        }
        Area::Outbox if name == b"result.md" => Some(Trigger::ResultPublished { smith: z.owner }),
        Area::SmithDir
        | Area::SmithMd
        | Area::Config
        | Area::Claude
        | Area::Inbox
        | Area::Private
        | Area::Outbox
        | Area::Conversations
        | Area::Children
        | Area::Other => None,
    }
}
