//! Creating entries: mknod, mkdir (with the child scaffold), symlink, link.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::error::{FsError, FsResult};
use super::ids::{BackingIno, NodeId};
use super::inode::Inode;
use super::{backing, control, rebuild, scaffold_write, Attr, Caller, SmithFs};
use crate::identity::Identity;
use crate::policy::{
    check_new_child, decide_link, Area, Decision, Depth, Family, NewKind, Op, Zone,
};
use crate::tree::model::SmithIdx;
use crate::tree::scaffold_plan::plan_smith;
use crate::trigger::Trigger;

impl SmithFs {
    /// Check a create of `name` in `parent` and return the directory and the C name.
    pub(super) fn creating(
        &self,
        caller: &Caller,
        who: Identity,
        parent: NodeId,
        name: &OsStr,
        kind: NewKind,
        label: &str,
    ) -> FsResult<(Arc<Inode>, CString)> {
        if control::is_virtual(parent) || Self::reserved(parent, name) {
            return Err(self.refuse_reserved(caller, who, label, parent, name));
        }
        let dir = self.inodes.get(parent)?;
        let cname = Self::name_in(name)?;
        let zone = self.new_zone(&dir, name);
        let d = self.decide_zone(who, Op::Create(kind), &zone);
        self.enforce(caller, who, d, label, || self.child_path(&dir, name))?;
        self.admit_storage(
            caller,
            who,
            &zone,
            Self::new_entry_bytes(kind),
            1,
            label,
            || self.child_path(&dir, name),
        )?;
        Ok((dir, cname))
    }

    /// What a new entry of `kind` is estimated to allocate before it exists (docs/SPEC.md §8,
    /// note L19): a directory takes one 4 KiB block on ext4, a symlink's target up to one block
    /// (a short one lives in the inode; the estimate is the bound), other nodes nothing until
    /// written. The books then take what the store really allocated (`settle_new`).
    fn new_entry_bytes(kind: NewKind) -> u64 {
        match kind {
            NewKind::Dir | NewKind::Symlink => 4096,
            _ => 0,
        }
    }

    /// Look up the entry `cname` (`name`) just created in `dir` and charge it (docs/SPEC.md §8).
    pub(super) fn lookup_created(
        &self,
        dir: &Inode,
        cname: &CStr,
        name: &OsStr,
    ) -> FsResult<(Arc<Inode>, Attr)> {
        let (inode, attr) = self.lookup_in(dir, cname)?;
        let mut st = attr.0;
        st.st_ino = self.inodes.ids.backing_ino(NodeId(st.st_ino)).0;
        self.settle_new(dir, name.as_bytes(), &self.new_zone(dir, name), &st);
        Ok((inode, attr))
    }

    /// Create a node (FUSE mknod): regular file, FIFO, socket or device, owned by the caller.
    pub fn mknod(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> FsResult<Attr> {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFIFO => NewKind::Fifo,
            libc::S_IFSOCK => NewKind::Socket,
            libc::S_IFCHR | libc::S_IFBLK => NewKind::Device,
            _ => NewKind::File,
        };
        let who = self.identify(caller);
        let (dir, cname) = self.creating(caller, who, parent, name, kind, "mknod")?;
        {
            let dir_fd = dir.fd()?;
            let _cred = self.create_creds(caller, who, &dir, dir_fd.as_fd())?;
            backing::mknod(dir_fd.as_fd(), &cname, mode, u64::from(rdev))?;
        }
        self.lookup_created(&dir, &cname, name).map(|(_, a)| a)
    }

    /// Create a directory owned by the caller (FUSE mkdir). In a smith's `children/` this is
    /// the scaffold (docs/SPEC.md §4).
    pub fn mkdir(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &OsStr,
        mode: u32,
    ) -> FsResult<Attr> {
        let who = self.identify(caller);
        if !control::is_virtual(parent) && !Self::reserved(parent, name) {
            let dir = self.inodes.get(parent)?;
            if let Zone::Smith(z) = self.zone(&dir) {
                if z.area == Area::Children && z.depth == Depth::Top {
                    return self.make_child(caller, who, &dir, z.owner, name);
                }
            }
        }
        let (dir, cname) = self.creating(caller, who, parent, name, NewKind::Dir, "mkdir")?;
        {
            let dir_fd = dir.fd()?;
            let _cred = self.create_creds(caller, who, &dir, dir_fd.as_fd())?;
            backing::mkdir(dir_fd.as_fd(), &cname, mode)?;
        }
        self.lookup_created(&dir, &cname, name).map(|(_, a)| a)
    }

    /// The scaffold: check §4 in order, build the child under a temporary name, rename it into
    /// place, register it — serialised per parent so the limits hold under races.
    pub(super) fn make_child(
        &self,
        caller: &Caller,
        who: Identity,
        dir: &Arc<Inode>,
        parent: SmithIdx,
        name: &OsStr,
    ) -> FsResult<Attr> {
        let cname = Self::name_in(name)?;
        let family_lock = self.registry.family(parent);
        let _serial = family_lock.lock();
        if backing::stat_at(dir.fd()?.as_fd(), &cname).is_ok() {
            return Err(FsError::Exists);
        }
        let info = self.registry.get(parent).ok_or(FsError::UnknownSmith)?;
        let family = Family {
            parent,
            parent_level: info.level,
            highest_used: info.highest_child,
            n_children: info.children.len(),
            subtree_depth: 0,
        };
        let number = match self.with_ctx(|ctx| check_new_child(&who, &family, name, ctx)) {
            Ok(n) => n,
            Err(d) => return Err(self.denied(caller, who, "mkdir", self.child_path(dir, name), d)),
        };
        let id = name.to_str().ok_or(FsError::BadName)?;
        let full_id = info.full_id.child(id).ok_or(FsError::BadName)?;
        let plan = plan_smith(&self.opts.templates, &full_id).map_err(|e| {
            tracing::error!("scaffold of {full_id}: {e}");
            FsError::Scaffold
        })?;
        let mut plan = plan;
        if self.opts.project {
            plan.entries
                .extend(crate::workspace::plan_workspace(&full_id).ok_or(FsError::Scaffold)?);
        }
        let children = dir.fd()?;
        let mount_point = &self.opts.mount_point;
        let started = std::time::Instant::now();
        // Whose the new smith dir is (docs/SPEC.md §12, "Ownership"): with the sandbox, the
        // smith's uid whoever made it (a child made by the operator is the agents' too); else
        // the caller's. `conversations/` stays the daemon's.
        let owner = match &self.opts.agents {
            Some(a) => a.uid_of(&full_id).map_err(|e| {
                tracing::error!(smith = %full_id, "scaffold: {e}");
                FsError::Scaffold
            })?,
            None => (caller.uid, caller.gid),
        };
        let store_root = self.store_root();
        let store_root = store_root.fd()?;
        // home/ seeded from templates/home/ and conversations/ given back to the daemon, under
        // the temporary name: part of the atomic whole (§4).
        let modes_decide = self.modes_decide();
        let finish_home = |tmp: &CStr| -> backing::SysResult<()> {
            let new_dir =
                std::path::PathBuf::from(format!("/proc/self/fd/{}", children.as_fd().as_raw_fd()))
                    .join(OsStr::from_bytes(tmp.to_bytes()));
            let seed = std::path::PathBuf::from(format!(
                "/proc/self/fd/{}",
                store_root.as_fd().as_raw_fd()
            ))
            .join(crate::sandbox::tree::TEMPLATES_HOME);
            let io = |e: std::io::Error| {
                tracing::error!(smith = %full_id, "scaffold: home/: {e}");
                nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
            };
            crate::sandbox::tree::seed(
                &seed,
                &new_dir.join(crate::sandbox::tree::HOME),
                Some(owner),
            )
            .map_err(io)?;
            if !modes_decide {
                crate::sandbox::tree::close_own_areas(&new_dir).map_err(io)?;
            }
            // SAFETY: geteuid/getegid have no preconditions.
            let daemon = unsafe { (libc::geteuid(), libc::getegid()) };
            std::os::unix::fs::lchown(
                new_dir.join(crate::sandbox::tree::DAEMON_OWNED),
                Some(daemon.0),
                Some(daemon.1),
            )
            .map_err(io)
        };
        // The workspace is not a system call: its failure is the scaffold's (FsError::Scaffold),
        // passed through `build_tree` as that variant's errno and told apart afterwards.
        let mut workspace_failed: Option<String> = None;
        let mut finish = |tmp: &CStr| -> backing::SysResult<()> {
            finish_home(tmp)?;
            if !self.opts.project {
                return Ok(());
            }
            let ws = std::path::Path::new(OsStr::from_bytes(tmp.to_bytes()))
                .join(crate::workspace::AREA);
            let base = crate::workspace::Base::Parent(std::path::Path::new("../workspace"));
            // The parent's repository is the parent's to write: git reads it only inside a
            // Landlock domain that holds what the parent may read (docs/PROTOCOL-NOTES.md W16).
            let root = self.store_root();
            let sandbox = match root
                .fd()
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno() as i32))
                .and_then(|r| {
                    crate::workspace::sandbox::for_child(r.as_fd(), children.as_fd(), tmp)
                }) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(smith = %full_id, "cannot make the workspace: no sandbox for git: {e}");
                    workspace_failed = Some(format!("no sandbox for git: {e}"));
                    return Err(FsError::Scaffold.errno());
                }
            };
            let run = crate::workspace::GitRun {
                cwd: children.as_fd(),
                detach: (!mount_point.as_os_str().is_empty()).then_some(mount_point.as_path()),
                creds: Some(owner),
                sandbox: Some(&sandbox),
                deadline: Some(crate::workspace::scaffold_git_deadline()),
            };
            match crate::workspace::populate(&run, &ws, &full_id, base) {
                Ok(commit) => {
                    tracing::info!(smith = %full_id, %commit, ms = started.elapsed().as_millis() as u64, "workspace made");
                    Ok(())
                }
                Err(e) => {
                    tracing::error!(smith = %full_id, "cannot make the workspace: {e}");
                    workspace_failed = Some(e.to_string());
                    Err(FsError::Scaffold.errno())
                }
            }
        };
        let made = scaffold_write::create_smith_dir(
            children.as_fd(),
            &cname,
            &plan,
            Some(owner),
            Some(&mut finish),
        );
        match (made, workspace_failed) {
            (Ok(()), _) => {}
            (Err(_), Some(reason)) => {
                let d = crate::policy::workspace_failed(full_id.as_str(), &reason);
                return Err(self.denied(caller, who, "mkdir", self.child_path(dir, name), d));
            }
            (Err(e), None) => return Err(FsError::Backing(e)),
        }
        let st = backing::stat_at(dir.fd()?.as_fd(), &cname)?;
        let idx = self
            .registry
            .register(Some(parent), id, BackingIno::of(&st), None)
            .ok_or(FsError::BadName)?;
        self.registry.note_child_number(parent, number);
        if let Err(e) = rebuild::save_highest(self.state.as_fd(), &self.registry) {
            tracing::error!("cannot remember child numbers: {e}");
        }
        self.identities.register_smith(idx, &full_id);
        // What the scaffold wrote costs the parent (config, .claude/) and the child (its
        // workspace): docs/PROTOCOL-NOTES.md, L10.
        self.charge_subtree(
            dir,
            &cname,
            &Zone::smith_dir(idx, Some(parent), info.level + 1),
        );
        tracing::info!(smith = %full_id, "smith created");
        self.emit(Trigger::SmithCreated {
            smith: idx,
            moved: false,
        });
        self.lookup_in(dir, &cname).map(|(_, a)| a)
    }

    /// Create a symlink owned by the caller (FUSE symlink).
    pub fn symlink(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &OsStr,
        target: &OsStr,
    ) -> FsResult<Attr> {
        let who = self.identify(caller);
        let (dir, cname) = self.creating(caller, who, parent, name, NewKind::Symlink, "symlink")?;
        let ctarget = CString::new(target.as_bytes()).map_err(|_| FsError::BadName)?;
        {
            let dir_fd = dir.fd()?;
            let _cred = self.create_creds(caller, who, &dir, dir_fd.as_fd())?;
            backing::symlink(&ctarget, dir_fd.as_fd(), &cname)?;
        }
        self.lookup_created(&dir, &cname, name).map(|(_, a)| a)
    }

    /// Add the name `newname` in `newparent` for `ino` (FUSE link): only within one zone, else
    /// EXDEV (docs/SPEC.md §3).
    pub fn link(
        &self,
        caller: &Caller,
        ino: NodeId,
        newparent: NodeId,
        newname: &OsStr,
    ) -> FsResult<Attr> {
        let who = self.identify(caller);
        if control::is_virtual(ino)
            || control::is_virtual(newparent)
            || Self::reserved(newparent, newname)
        {
            return Err(self.refuse_reserved(caller, who, "link", newparent, newname));
        }
        let inode = self.inodes.get(ino)?;
        let dir = self.inodes.get(newparent)?;
        let cname = Self::name_in(newname)?;
        let src = self.zone(&inode);
        let dst = self.new_zone(&dir, newname);
        let others = self.other_zones(&inode);
        // Every zone the file has names in must allow it (the intersection rule).
        let d = self.with_ctx(|ctx| {
            std::iter::once(&src)
                .chain(others.iter())
                .map(|z| decide_link(&who, z, &dst, ctx))
                .find(|d| !d.is_allowed())
                .unwrap_or(Decision::Allow)
        });
        self.enforce(caller, who, d, "link", || self.child_path(&dir, newname))?;
        let fd = inode.fd()?;
        backing::link(fd.as_fd(), dir.fd()?.as_fd(), &cname)?;
        // One inode, charged once: only the directory may have grown.
        self.settle_fd(dir.fd()?.as_fd());
        // The new name is the inode the kernel holds: no lookup of it needed (unless forgotten
        // meanwhile, not expected: the kernel holds the source during a link).
        let st = backing::stat(fd.as_fd())?;
        let (linked, attr) = match self.named_again(&inode, &dir, cname.to_bytes(), st) {
            Some(attr) => (inode, attr),
            None => self.lookup_in(&dir, &cname)?,
        };
        self.completed_at(caller, &dir, newname, &linked);
        Ok(attr)
    }
}
