//! Removing entries: unlink and rmdir, and unregistering removed smith dirs.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use super::error::{FsError, FsResult};
use super::ids::{BackingIno, NodeId};
use super::{backing, control, Caller, SmithFs};
use crate::policy::{Op, Removal};
use crate::tree::model::SmithIdx;
use crate::trigger::Trigger;

impl SmithFs {
    /// Remove the name `name` from `parent` (FUSE unlink, or rmdir when `is_dir`).
    pub fn remove(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &OsStr,
        is_dir: bool,
    ) -> FsResult<()> {
        if control::is_virtual(parent) {
            let who = self.identify(caller);
            let op = if is_dir { "rmdir" } else { "unlink" };
            return Err(self.refuse_reserved(caller, who, op, parent, name));
        }
        if Self::reserved(parent, name) {
            return Err(FsError::Hidden);
        }
        let who = self.identify(caller);
        let dir = self.inodes.get(parent)?;
        let cname = Self::name_in(name)?;
        let (zone, st) = self.existing_zone(&dir, &cname, name)?;
        let how = if is_dir {
            Removal::Rmdir
        } else {
            Removal::Unlink
        };
        let op = Op::Delete {
            how,
            subtree_live: self.subtree_live(&zone),
        };
        let d = self.decide_zone(who, op, &zone);
        self.enforce(
            caller,
            who,
            d,
            if is_dir { "rmdir" } else { "unlink" },
            || self.child_path(&dir, name),
        )?;
        backing::unlink(dir.fd()?.as_fd(), &cname, is_dir)?;
        self.storage_unlinked(&dir, &st);
        if is_dir {
            self.smith_dir_gone(BackingIno::of(&st));
        } else {
            self.unnamed(&st, dir.id, name.as_bytes());
        }
        Ok(())
    }

    /// The directory with backing inode `ino` no longer exists (rmdir, or replaced by a
    /// rename): if it was a smith dir, forget that smith and its subtree, and release what the
    /// identity resolver held for them (their cgroups, docs/SPEC.md §2).
    pub(super) fn smith_dir_gone(&self, ino: BackingIno) {
        if let Some((idx, _, _)) = self.registry.smith_at(ino) {
            self.smith_gone(idx);
        }
    }

    /// Forget smith `idx` and its subtree, and release what the identity resolver and the open
    /// files' budget held for them.
    pub(super) fn smith_gone(&self, idx: SmithIdx) {
        let gone = self.registry.unregister(idx);
        if gone.is_empty() {
            return;
        }
        for g in gone {
            self.identities.unregister_smith(g);
            self.open_limits.forget(g);
        }
        self.emit(Trigger::SmithRemoved { smith: idx });
    }
}
