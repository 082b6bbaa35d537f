//! Entries: lookup, forget, getattr, setattr, readlink; reserved names.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::control::ControlFile;
use super::error::{FsError, FsResult};
use super::ids::{BackingIno, Fh, NodeId};
use super::inode::Inode;
use super::io::kill_suid_sgid;
use super::{backing, control, Attr, Cache, Caller, SetAttr, SmithFs};
use crate::identity::Identity;
use crate::policy::zone::{Area, Zone};
use crate::policy::{self, Op};
use crate::tree::layout::STATE_DIR;

impl SmithFs {
    pub(super) fn attr_of(&self, st: libc::stat) -> Attr {
        let mut st = st;
        st.st_ino = self.inodes.ids.node_id(BackingIno::of(&st)).0;
        Attr(st)
    }

    /// Names in the store's root that the mount never shows or lets anyone create.
    pub(super) fn reserved(parent: NodeId, name: &OsStr) -> bool {
        let n = name.as_bytes();
        (parent == NodeId::ROOT && (n == STATE_DIR.as_bytes() || n == control::DIR_NAME.as_bytes()))
            || backing::is_daemon_temp(n)
    }

    /// Refuse a change to the control directory `.smithfs/` or to a name the mount never shows
    /// (`.smithfs-state`, the daemon's temporary names), recording the reason like any denial
    /// (docs/SPEC.md §3, §7). `parent`/`name` name the entry the caller tried to change.
    pub(super) fn refuse_reserved(
        &self,
        caller: &Caller,
        who: Identity,
        op: &str,
        parent: NodeId,
        name: &OsStr,
    ) -> FsError {
        let path = if control::is_virtual(parent) {
            format!("{}/{}", control::DIR_NAME, name.to_string_lossy())
        } else if parent == NodeId::ROOT {
            name.to_string_lossy().into_owned()
        } else {
            self.inodes.get(parent).map_or_else(
                |_| name.to_string_lossy().into_owned(),
                |d| self.child_path(&d, name),
            )
        };
        let d = policy::reserved_name();
        let errno = d.errno;
        let _ = self.denied(caller, who, op, path, d);
        FsError::Reserved(errno)
    }

    pub(super) fn name_in(name: &OsStr) -> FsResult<CString> {
        Ok(backing::component(name)?)
    }

    /// Resolve `name` in `parent`, raising its lookup count (FUSE lookup). Allowed to every
    /// identity (docs/SPEC.md §3).
    pub fn lookup(&self, parent: NodeId, name: &OsStr) -> FsResult<(Attr, Cache)> {
        if parent == NodeId::ROOT && name.as_bytes() == control::DIR_NAME.as_bytes() {
            return Ok((self.control_attr(control::DIR_ID), Cache::Never));
        }
        if parent == control::DIR_ID {
            let f = ControlFile::by_name(name).ok_or(FsError::NoSuchControlFile)?;
            return Ok((self.control_attr(f.id()), Cache::Never));
        }
        if Self::reserved(parent, name) {
            return Err(FsError::Hidden);
        }
        let dir = self.inodes.get(parent)?;
        let cname = Self::name_in(name)?;
        self.lookup_in(&dir, &cname)
            .map(|(inode, a)| (a, self.cache_for(&inode)))
    }

    /// A FUSE lookup as the kernel is answered: [`SmithFs::lookup`], except that a name missing
    /// from a directory whose entries the kernel caches ([`Cache::Normal`], [`Cache::Brief`]) is
    /// answered as a negative entry — [`Attr::missing`] (node id 0) with the directory's cache
    /// class — which the kernel keeps for that long (docs/PROTOCOL-NOTES.md U13). Names the daemon
    /// makes behind the kernel in such directories are announced with `notify_inval_entry`, which
    /// drops a negative entry too. Other errors, and misses in `conversations/`, `.smithfs/` and
    /// the areas whose completions trigger runs (`inbox/`, `outbox/`), are replied as errors
    /// (never kept): a trigger is sent before the kernel has the reply of the rename or release
    /// that completed the name, and a run it starts must not meet a negative entry kept from
    /// an earlier miss (docs/PROTOCOL-NOTES.md U13).
    ///
    /// A FIFO or a unix socket is found only by a caller that may read and write it where it
    /// lies (the Operator always), else EACCES with a `why` record: opening a FIFO and connecting
    /// to a socket never reach the daemon, so its rights on them are decided here, at every
    /// path walk — such entries are never cached ([`Cache::Never`]), and a walk through a dentry
    /// another caller looked up asks again (docs/PROTOCOL-NOTES.md XT23).
    pub fn lookup_entry(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &OsStr,
    ) -> FsResult<(Attr, Cache)> {
        match self.lookup(parent, name) {
            Ok((a, c)) if is_rendezvous(a.0.st_mode) => {
                let node = NodeId(a.0.st_ino);
                match self.check_rendezvous(caller, node) {
                    Ok(()) => Ok((a, c)),
                    Err(e) => {
                        // The kernel never gets this entry: give back the lookup it counted.
                        self.forget(node, 1);
                        Err(e)
                    }
                }
            }
            Err(e) if e.errno() == nix::errno::Errno::ENOENT => match self.miss_cache(parent) {
                Some(c) => Ok((Attr::missing(), c)),
                None => Err(e),
            },
            r => r,
        }
    }

    /// How long the kernel may keep a miss in directory `parent`: as its entries where they
    /// are cached, never in a trigger area (see [`SmithFs::lookup_entry`]).
    fn miss_cache(&self, parent: NodeId) -> Option<Cache> {
        if let Some(dir) = self.inodes.find(parent) {
            if let Zone::Smith(z) = self.zone(&dir) {
                if matches!(z.area, Area::Inbox | Area::Outbox) {
                    return None;
                }
            }
        }
        match self.cache_of(parent) {
            c @ (Cache::Normal | Cache::Brief) => Some(c),
            Cache::Volatile | Cache::Never => None,
        }
    }

    /// How long the kernel may cache node `ino`'s entry and attributes ([`Cache`]): never for
    /// `.smithfs/`, not at all where the store changes without a notification (`conversations/`),
    /// 1 s for the mount root, else long.
    pub fn cache_of(&self, ino: NodeId) -> Cache {
        if control::is_virtual(ino) {
            return Cache::Never;
        }
        match self.inodes.find(ino) {
            Some(inode) => self.cache_for(&inode),
            None => Cache::Normal,
        }
    }

    pub(super) fn cache_for(&self, inode: &Inode) -> Cache {
        if inode.id == NodeId::ROOT {
            return Cache::Brief;
        }
        if is_rendezvous(inode.kind) {
            return Cache::Never;
        }
        match self.zone(inode) {
            Zone::Smith(z) if z.area == Area::Conversations => Cache::Volatile,
            _ => Cache::Normal,
        }
    }

    /// May `caller` reach the FIFO or socket `node` (read and write it where it lies)? The
    /// Operator may.
    fn check_rendezvous(&self, caller: &Caller, node: NodeId) -> FsResult<()> {
        let inode = self.inodes.get(node)?;
        let who = self.identify(caller);
        if who == Identity::Operator {
            return Ok(());
        }
        let what = "reach a FIFO or socket";
        self.check_inode(caller, who, Op::Read, what, &inode)?;
        self.check_inode(caller, who, Op::Write, what, &inode)
    }

    pub(super) fn lookup_in(&self, dir: &Inode, cname: &CStr) -> FsResult<(Arc<Inode>, Attr)> {
        let fd = backing::lookup(dir.fd()?.as_fd(), cname)?;
        let st = backing::stat(fd.as_fd())?;
        let inode = self.inodes.remember(fd, &st);
        self.place(&inode, dir, cname.to_bytes(), st.st_nlink);
        Ok((inode, self.attr_of(st)))
    }

    /// A reply names `inode`, which the table holds, again as `name` in `dir` (a link, a
    /// READDIRPLUS entry), with `st` just read from its descriptor: one more kernel reference,
    /// the name recorded, its attributes. `None` when it was forgotten meanwhile: the caller
    /// looks the name up instead.
    pub(super) fn named_again(
        &self,
        inode: &Arc<Inode>,
        dir: &Inode,
        name: &[u8],
        st: libc::stat,
    ) -> Option<Attr> {
        if !self.inodes.referenced_again(inode) {
            return None;
        }
        self.place(inode, dir, name, st.st_nlink);
        Some(self.attr_of(st))
    }

    /// Drop `n` kernel references to `ino` (FUSE forget).
    pub fn forget(&self, ino: NodeId, n: u64) {
        if !control::is_virtual(ino) && self.inodes.forget(ino, n) {
            self.storage_forgotten(self.inodes.ids.backing_ino(ino));
        }
    }

    pub(super) fn control_attr(&self, id: NodeId) -> Attr {
        let root = self
            .inodes
            .root()
            .fd()
            .ok()
            .and_then(|f| backing::stat(f.as_fd()).ok());
        // SAFETY: an all-zero stat is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if let Some(r) = root {
            st.st_atime = r.st_atime;
            st.st_mtime = r.st_mtime;
            st.st_ctime = r.st_ctime;
            st.st_uid = r.st_uid;
            st.st_gid = r.st_gid;
            st.st_blksize = r.st_blksize;
        }
        st.st_ino = id.0;
        match ControlFile::by_id(id) {
            Some(f) => {
                st.st_mode = libc::S_IFREG | f.mode();
                st.st_nlink = 1;
                st.st_size = self.control_size(f) as i64;
            }
            None => {
                st.st_mode = libc::S_IFDIR | 0o555;
                st.st_nlink = 2;
            }
        }
        Attr(st)
    }

    /// Attributes of `ino`, through the handle `fh` if given (FUSE getattr).
    pub fn getattr(&self, ino: NodeId, fh: Option<Fh>) -> FsResult<Attr> {
        if control::is_virtual(ino) {
            return Ok(self.control_attr(ino));
        }
        if let Some(fh) = fh {
            if let Ok(h) = self.files.get(fh) {
                let st = backing::stat(h.fd.as_fd())?;
                h.inode.note_links(st.st_nlink);
                return Ok(self.attr_of(st));
            }
        }
        let inode = self.inodes.get(ino)?;
        let st = backing::stat(inode.fd()?.as_fd())?;
        inode.note_links(st.st_nlink);
        Ok(self.attr_of(st))
    }

    /// Change attributes (FUSE setattr): mode, owner, size, times, in that order.
    /// Truncation through a handle is judged by the handle's opener; everything else by the
    /// caller (docs/SPEC.md §2).
    pub fn setattr(&self, caller: &Caller, ino: NodeId, set: &SetAttr) -> FsResult<Attr> {
        if control::is_virtual(ino) {
            // Truncating ctl on open (`echo … > ctl`) is harmless; nothing else changes.
            if ino == ControlFile::Ctl.id()
                && set.mode.is_none()
                && set.uid.is_none()
                && set.gid.is_none()
            {
                return Ok(self.control_attr(ino));
            }
            return Err(FsError::ControlFixed);
        }
        let inode = self.inodes.get(ino)?;
        let handle = set.fh.and_then(|fh| self.files.get(fh).ok());
        let who = self.identify(caller);
        let by_caller = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some();
        if by_caller {
            self.check_inode(caller, who, Op::Write, "setattr", &inode)?;
        }
        if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() {
            // As the caller: the store applies chmod's and chown's own rules (only the owner
            // changes a mode, only root gives a file away, the set-group-ID bit of a group the
            // caller is not in is dropped) — without `default_permissions` (a uid per smith)
            // nothing else would (notes XT24).
            let _cred = self.attr_creds(caller, who)?;
            if let Some(mode) = set.mode {
                backing::chmod(inode.fd()?.as_fd(), mode & 0o7777)?;
            }
            if set.uid.is_some() || set.gid.is_some() {
                backing::chown(
                    inode.fd()?.as_fd(),
                    set.uid.unwrap_or(u32::MAX),
                    set.gid.unwrap_or(u32::MAX),
                )?;
            }
        }
        if let Some(size) = set.size {
            match &handle {
                Some(h) => {
                    if !h.may_write {
                        return Err(FsError::NotOpenForWriting);
                    }
                    let done = backing::ftruncate(h.fd.as_fd(), size);
                    self.settle_fd(h.fd.as_fd());
                    done?;
                    h.dirty.store(true, Ordering::Relaxed);
                }
                None => {
                    self.check_inode(caller, who, Op::Write, "truncate", &inode)?;
                    // truncate(2) refuses all but a regular file, and reopening a FIFO would
                    // block (docs/PROTOCOL-NOTES.md R51): no kernel sends this, a node may.
                    match inode.kind {
                        libc::S_IFREG => {}
                        libc::S_IFDIR => return Err(FsError::Backing(nix::errno::Errno::EISDIR)),
                        _ => return Err(FsError::NotTruncatable),
                    }
                    let fd = backing::reopen(inode.fd()?.as_fd(), libc::O_WRONLY)?;
                    let done = backing::ftruncate(fd.as_fd(), size);
                    self.settle_fd(fd.as_fd());
                    done?;
                }
            }
            if caller.uid != 0 && set.mode.is_none() {
                // The reply carries the new attributes.
                kill_suid_sgid(&inode, caller)?;
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let omit = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            };
            let times = [set.atime.unwrap_or(omit), set.mtime.unwrap_or(omit)];
            backing::utimens(inode.fd()?.as_fd(), &times)?;
        }
        Ok(self.attr_of(backing::stat(inode.fd()?.as_fd())?))
    }

    /// The target of the symlink `ino` (FUSE readlink).
    pub fn readlink(&self, caller: &Caller, ino: NodeId) -> FsResult<Vec<u8>> {
        let inode = self.inodes.get(ino)?;
        self.check_inode(caller, self.identify(caller), Op::Read, "readlink", &inode)?;
        Ok(backing::readlink(inode.fd()?.as_fd())?)
    }
}

/// A FIFO or a unix socket (`mode`'s `S_IFMT`): a rendezvous between processes that the daemon
/// never sees once the path is walked.
fn is_rendezvous(mode: u32) -> bool {
    matches!(mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK)
}
