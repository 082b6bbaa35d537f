//! Rename, including moves of registered smith dirs by the operator.

use std::ffi::{CStr, OsStr};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use super::error::{FsError, FsResult};
use super::ids::{BackingIno, NodeId};
use super::inode::Inode;
use super::{backing, control, rebuild, Caller, Dest, MovedSmith, SmithFs};
use crate::identity::Identity;
use crate::policy::{
    self, decide_linked_rename, decide_rename, decide_smith_dir_move, Area, Decision, Depth,
    Family, MoveTo, SmithDirMove, Zone,
};
use crate::trigger::Trigger;

impl SmithFs {
    /// Rename (FUSE rename; `flags` are `RENAME_NOREPLACE`/`RENAME_EXCHANGE`): delete at the
    /// source and create at the destination (docs/SPEC.md §3). A moved directory carries its
    /// subtree to the new zone.
    pub fn rename(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &OsStr,
        newparent: NodeId,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        if Self::reserved(parent, name) && !control::is_virtual(parent) {
            return Err(FsError::Hidden);
        }
        let who = self.identify(caller);
        if control::is_virtual(parent) {
            return Err(self.refuse_reserved(caller, who, "rename", parent, name));
        }
        if control::is_virtual(newparent) || Self::reserved(newparent, newname) {
            return Err(self.refuse_reserved(caller, who, "rename", newparent, newname));
        }
        let from = self.inodes.get(parent)?;
        let to = self.inodes.get(newparent)?;
        let cname = Self::name_in(name)?;
        let cnew = Self::name_in(newname)?;
        // The whiteout left at the source is a character device (0, 0): a device node,
        // which only the operator may create (docs/SPEC.md §3).
        let whiteout = policy::decide_rename_whiteout(&who, flags & libc::RENAME_WHITEOUT != 0);
        self.enforce(caller, who, whiteout, "rename", || {
            self.child_path(&from, name)
        })?;
        let (src_zone, src_st) = self.existing_zone(&from, &cname, name)?;
        let replaced = self.existing_zone(&to, &cnew, newname).ok();
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if src_st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if let Some((moved, _, _)) = self.registry.smith_at(BackingIno::of(&src_st)) {
                let m = MovedSmith {
                    smith: moved,
                    zone: src_zone,
                    st: src_st,
                };
                let dst = Dest {
                    dir: &to,
                    cname: &cnew,
                    name: newname,
                    replaced: replaced.as_ref(),
                };
                return self.rename_smith_dir(caller, who, &from, name, &cname, &m, &dst, flags);
            }
        }
        let dst_zone = self.new_zone(&to, newname);
        let src_live = self.subtree_live(&src_zone);
        let replaced_live = replaced.as_ref().is_some_and(|(z, _)| self.subtree_live(z));
        let back = self.new_zone(&from, name);
        // A file with other names moves within its zone only (EXDEV, like link). The kernel
        // holds the inode's lock across link(2) and a non-directory's rename(2), so no link
        // through the mount slips in between this stat and the rename.
        let linked =
            |st: &libc::stat| st.st_mode & libc::S_IFMT != libc::S_IFDIR && st.st_nlink > 1;
        let d = self.with_ctx(|ctx| {
            let there = decide_rename(
                &who,
                &src_zone,
                src_live,
                &dst_zone,
                replaced.as_ref().map(|(z, _)| (z, replaced_live)),
                ctx,
            )
            .and(|| match linked(&src_st) {
                true => decide_linked_rename(&who, &src_zone, &dst_zone, ctx),
                false => Decision::Allow,
            });
            match (&replaced, exchange, there.is_allowed()) {
                (Some((rz, rst)), true, true) => decide_rename(
                    &who,
                    rz,
                    replaced_live,
                    &back,
                    Some((&src_zone, src_live)),
                    ctx,
                )
                .and(|| match linked(rst) {
                    true => decide_linked_rename(&who, rz, &back, ctx),
                    false => Decision::Allow,
                }),
                _ => there,
            }
        });
        self.enforce(caller, who, d, "rename", || self.child_path(&from, name))?;
        backing::rename(from.fd()?.as_fd(), &cname, to.fd()?.as_fd(), &cnew, flags)?;
        if src_st.st_mode & libc::S_IFMT == libc::S_IFDIR
            || replaced
                .as_ref()
                .is_some_and(|(_, st)| exchange && st.st_mode & libc::S_IFMT == libc::S_IFDIR)
        {
            self.zone_epoch.fetch_add(1, Ordering::AcqRel);
        }
        if let Some((_, st)) = &replaced {
            if !exchange && st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_ino != src_st.st_ino
            {
                // An (empty) smith dir replaced by a rename is gone like one removed by rmdir.
                self.smith_dir_gone(BackingIno::of(st));
            }
        }
        self.moved(&src_st, (from.id, name.as_bytes()), &to, newname.as_bytes());
        // Storage (docs/SPEC.md §8): the moved entry is charged where it now is; a replaced one
        // loses a name.
        self.storage_moved(&src_st, &to, &cnew, &dst_zone);
        match &replaced {
            Some((_, st)) if exchange => self.storage_moved(st, &from, &cname, &back),
            Some((_, st)) => self.storage_unlinked(&to, st),
            None => {}
        }
        if let Ok(fd) = from.fd() {
            self.settle_fd(fd.as_fd());
        }
        if let Ok(fd) = to.fd() {
            self.settle_fd(fd.as_fd());
        }
        match &replaced {
            Some((_, st)) if exchange => {
                self.moved(st, (to.id, newname.as_bytes()), &from, name.as_bytes());
            }
            Some((_, st)) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                self.unnamed(st, to.id, newname.as_bytes());
            }
            Some(_) | None => {}
        }
        if let Some(moved) = self
            .inodes
            .find(self.inodes.ids.node_id(BackingIno::of(&src_st)))
        {
            self.completed_at(caller, &to, newname, &moved);
        } else if src_st.st_mode & libc::S_IFMT == libc::S_IFREG {
            self.completed_name(caller, &to, newname);
        }
        Ok(())
    }

    /// Rename the registered smith dir `m` (`name` in `from`) to `dst` (docs/PROTOCOL-NOTES.md,
    /// C35): allowed to the operator alone, never for the root, while no run in its subtree
    /// is live (else EBUSY). Directly into a smith's `children/` it is admitted as a mkdir there
    /// would be (docs/SPEC.md §4) and stays a smith dir: the old subtree is unregistered and the
    /// new location registered by scanning it, under new full ids. Anywhere else it becomes
    /// ordinary data of its new zone, its smiths unregistered as by rmdir. Serialised with the
    /// destination smith's mkdirs, so the §4 limits hold under races.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rename_smith_dir(
        &self,
        caller: &Caller,
        who: Identity,
        from: &Inode,
        name: &OsStr,
        cname: &CStr,
        m: &MovedSmith,
        dst: &Dest<'_>,
        flags: u32,
    ) -> FsResult<()> {
        let into = match self.zone(dst.dir) {
            Zone::Smith(z) if z.area == Area::Children && z.depth == Depth::Top => Some(z.owner),
            Zone::Smith(_) | Zone::Outside { .. } => None,
        };
        let family_lock = into.map(|p| self.registry.family(p));
        let _serial = family_lock.as_ref().map(|l| l.lock());
        let family = match into {
            Some(p) => {
                let info = self.registry.get(p).ok_or(FsError::UnknownSmith)?;
                let subtree = self.registry.subtree(m.smith);
                let own_level = subtree.first().map_or(0, |s| s.level);
                let deepest = subtree.iter().map(|s| s.level).max().unwrap_or(own_level);
                let leaving = usize::from(info.children.contains(&m.smith));
                Some(Family {
                    parent: p,
                    parent_level: info.level,
                    highest_used: info.highest_child,
                    n_children: info.children.len().saturating_sub(leaving),
                    subtree_depth: deepest.saturating_sub(own_level),
                })
            }
            None => None,
        };
        let data_zone = self.new_zone(dst.dir, dst.name);
        let replaced = dst.replaced.map(|(z, _)| (z, self.subtree_live(z)));
        let mv = SmithDirMove {
            src: &m.zone,
            src_live: self.subtree_live(&m.zone),
            to: match &family {
                Some(f) => MoveTo::Children(f),
                None => MoveTo::Data(&data_zone),
            },
            name: dst.name,
            replaced,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
        };
        let number = match self.with_ctx(|ctx| decide_smith_dir_move(&who, &mv, ctx)) {
            Ok(n) => n,
            Err(d) => {
                return Err(self.denied(caller, who, "rename", self.child_path(from, name), d))
            }
        };
        let old_full = self
            .registry
            .full_id(m.smith)
            .map(String::from)
            .unwrap_or_default();
        // Remembered child numbers move with the subtree, re-keyed by the new full ids.
        let carried: std::collections::HashMap<String, u32> = match &family {
            Some(f) => {
                let new_full = format!(
                    "{}/{}",
                    self.registry
                        .full_id(f.parent)
                        .map(String::from)
                        .unwrap_or_default(),
                    dst.name.to_string_lossy()
                );
                self.registry
                    .subtree(m.smith)
                    .into_iter()
                    .filter_map(|s| {
                        let rest = s.full_id.strip_prefix(old_full.as_str())?;
                        Some((format!("{new_full}{rest}"), s.highest_child?))
                    })
                    .collect()
            }
            None => std::collections::HashMap::new(),
        };
        backing::rename(
            from.fd()?.as_fd(),
            cname,
            dst.dir.fd()?.as_fd(),
            dst.cname,
            flags,
        )?;
        // The rename is done: from here on nothing fails the request (the kernel must learn the
        // new name), problems are logged.
        if let Some((_, st)) = dst.replaced {
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                self.smith_dir_gone(BackingIno::of(st));
            }
        }
        // By index, not by inode number: a concurrent rescan may already have registered the
        // new location under that inode number.
        self.smith_gone(m.smith);
        let mut registered = Vec::new();
        if let (Some(f), Some(n)) = (&family, number) {
            let scanned = dst.dir.fd().map_err(|e| e.to_string()).and_then(|fd| {
                rebuild::scan_moved(fd.as_fd(), dst.cname, f.parent, &self.registry, &carried)
                    .map_err(|e| e.to_string())
            });
            match scanned {
                Ok(idx) => registered = self.registry.subtree(idx),
                Err(e) => tracing::error!(
                    "cannot register the smith dir {old_full} moved to {}: {e}",
                    self.child_path(dst.dir, dst.name)
                ),
            }
            self.registry.note_child_number(f.parent, n);
            if let Err(e) = rebuild::save_highest(self.state.as_fd(), &self.registry) {
                tracing::error!("cannot remember child numbers: {e}");
            }
        }
        // Zones below the moved directory are recomputed from the registry as it is now.
        self.zone_epoch.fetch_add(1, Ordering::AcqRel);
        self.moved(
            &m.st,
            (from.id, name.as_bytes()),
            dst.dir,
            dst.name.as_bytes(),
        );
        for s in &registered {
            self.identities.register_smith(s.idx, &s.full_id);
        }
        // Its smiths were registered anew (or became data): count the store again.
        self.storage_recount();
        match registered.first() {
            Some(top) => tracing::info!(from = %old_full, to = %top.full_id, "smith dir moved"),
            None => tracing::info!(
                from = %old_full,
                to = %self.child_path(dst.dir, dst.name),
                "smith dir moved out of the tree"
            ),
        }
        for s in &registered {
            self.emit(Trigger::SmithCreated {
                smith: s.idx,
                moved: true,
            });
        }
        Ok(())
    }
}
