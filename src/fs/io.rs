//! File I/O: open, create, passthrough, read, write, flush, release, fsync, fallocate, lseek, copy_file_range.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use super::control::ControlFile;
use super::creds::caller_groups;
use super::error::{FsError, FsResult};
use super::ids::{Fh, NodeId};
use super::inode::BackingRef;
use super::inode::{Inode, Passthrough};
use super::open::{HandleFd, OpenFile};
use super::{backing, control, Attr, Cache, Caller, SmithFs};
use crate::policy::{NewKind, Op};

impl SmithFs {
    /// Open `ino` with `flags` (FUSE open); returns the handle number and how to cache it.
    pub fn open(&self, caller: &Caller, ino: NodeId, flags: i32) -> FsResult<(Fh, Cache)> {
        if let Some(f) = ControlFile::by_id(ino) {
            return self
                .open_control(caller, f, flags)
                .map(|fh| (fh, Cache::Never));
        }
        if control::is_virtual(ino) {
            return Err(FsError::ControlIsDir);
        }
        let inode = self.inodes.get(ino)?;
        let who = self.identify(caller);
        let acc = flags & libc::O_ACCMODE;
        let may_write = acc != libc::O_RDONLY;
        let truncates = flags & libc::O_TRUNC != 0;
        if acc != libc::O_WRONLY {
            self.check_inode(caller, who, Op::Read, "open for reading", &inode)?;
        }
        if may_write || truncates {
            self.check_inode(caller, who, Op::Write, "open for writing", &inode)?;
        }
        // A kernel opens FIFOs, sockets and device nodes itself and never sends OPEN for one;
        // a remote node may, and opening a FIFO would block a daemon thread until a partner
        // came (docs/PROTOCOL-NOTES.md R51).
        if is_special(inode.kind) {
            return Err(FsError::SpecialFile);
        }
        let slot = self.charge(caller, who, "open", || self.path_of(&inode))?;
        let file = reopen_for(&inode, flags)?;
        if truncates {
            self.settle_fd(file.fd.as_fd());
        }
        if truncates && caller.uid != 0 && kill_suid_sgid(&inode, caller)? {
            self.attrs_changed(inode.id);
        }
        // A limited writer's writes must reach the daemon (docs/SPEC.md §8). While other opens
        // of the file are passed through, the kernel takes only a passthrough open beside them
        // (any other is EINVAL): the writer joins them, admitted only while it is below its
        // limits, and the books catch up at its release (docs/PROTOCOL-NOTES.md, L13).
        if may_write
            && matches!(*inode.passthrough.lock(), Passthrough::Active { .. })
            && self.checks_writes_of(who)
        {
            let zone = self.zone(&inode);
            self.admit_storage(caller, who, &zone, 4096, 0, "open for writing", || {
                self.path_of(&inode)
            })?;
        }
        // Opened with write access or O_TRUNC: its release completes the file (§5).
        let open = OpenFile::new(
            file,
            inode,
            who,
            caller,
            flags,
            may_write || truncates,
            slot,
        );
        Ok((self.files.insert(open), Cache::Normal))
    }

    /// Create and open `name` in `parent` (FUSE create); the new file belongs to the caller.
    pub fn create(
        &self,
        caller: &Caller,
        parent: NodeId,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Attr, Fh)> {
        let who = self.identify(caller);
        let (dir, cname) = self.creating(caller, who, parent, name, NewKind::File, "create")?;
        let slot = self.charge(caller, who, "create", || self.child_path(&dir, name))?;
        let file = {
            let dir_fd = dir.fd()?;
            let _cred = self.create_creds(caller, who, &dir, dir_fd.as_fd())?;
            create_open(dir_fd.as_fd(), &cname, flags, mode)?
        };
        let (inode, attr) = self.lookup_created(&dir, &cname, name)?;
        // A new file: its release completes it (§5).
        let open = OpenFile::new(file, inode, who, caller, flags, true, slot);
        Ok((attr, self.files.insert(open)))
    }

    /// The passthrough backing for the freshly opened handle `fh` of a regular file: the inode's
    /// shared registration, or a new one made by `register` from an `O_RDWR` descriptor. `None`
    /// when this inode cannot be passed through (its opens then go through the daemon).
    ///
    /// The inode's passthrough lock is held across the reopen and `register` (one ioctl), so
    /// concurrent opens of one file share one registration.
    pub fn passthrough(
        &self,
        fh: Fh,
        register: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> std::io::Result<BackingRef>,
    ) -> Option<BackingRef> {
        let h = self.files.get(fh).ok()?;
        if h.inode.kind != libc::S_IFREG {
            return None;
        }
        // A limited writer is never passed through (docs/SPEC.md §8): the file's opens go
        // through the daemon until all are closed, unless other opens already pass through
        // (then it joins them, see `open`).
        let checked = h.may_write && self.checks_writes_of(h.opener);
        let mut pt = h.inode.passthrough.lock();
        let backing = match &mut *pt {
            Passthrough::Idle if checked => {
                *pt = Passthrough::Cached { users: 1 };
                h.passthrough.store(true, Ordering::Relaxed);
                return None;
            }
            Passthrough::Never => return None,
            Passthrough::Cached { users } => {
                *users += 1;
                h.passthrough.store(true, Ordering::Relaxed);
                return None;
            }
            Passthrough::Active { backing, users } => {
                *users += 1;
                backing.clone()
            }
            Passthrough::Idle if setid(&h.fd) => {
                *pt = Passthrough::Cached { users: 1 };
                h.passthrough.store(true, Ordering::Relaxed);
                return None;
            }
            Passthrough::Idle => {
                // The handle's own file serves when it is a plain O_RDWR one (see
                // `create_open` and `reopen_for`): the kernel keeps its own reference, and a
                // reopen through /proc/self/fd (a path walk, an open and a close) is saved.
                let made = if h.shareable {
                    register(h.fd.as_fd())
                } else {
                    h.inode
                        .fd()
                        .map_err(|e| std::io::Error::from(e.errno()))
                        .and_then(|f| {
                            backing::reopen(f.as_fd(), libc::O_RDWR).map_err(std::io::Error::from)
                        })
                        .and_then(|fd| register(fd.as_fd()))
                };
                match made {
                    Ok(backing) => {
                        *pt = Passthrough::Active {
                            backing: backing.clone(),
                            users: 1,
                        };
                        backing
                    }
                    Err(e) => {
                        tracing::debug!(ino = h.inode.id.0, "no passthrough: {e}");
                        *pt = Passthrough::Never;
                        return None;
                    }
                }
            }
        };
        h.passthrough.store(true, Ordering::Relaxed);
        Some(backing)
    }

    /// Read up to `size` bytes at `offset` through handle `fh` (FUSE read).
    pub fn read(&self, ino: NodeId, fh: Fh, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        if control::is_virtual(ino) {
            return self.read_control(fh, offset, size);
        }
        let h = self.files.get(fh)?;
        let mut buf = vec![0u8; size as usize];
        let mut done = 0usize;
        while done < buf.len() {
            let n = backing::pread(h.fd.as_fd(), &mut buf[done..], offset + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// Write `data` at `offset` through handle `fh` (FUSE write); `kill_suidgid` is the kernel's
    /// request to clear setuid/setgid (`FUSE_WRITE_KILL_SUIDGID`, with `HANDLE_KILLPRIV_V2`).
    /// A write to `.smithfs/ctl` runs its commands as the writing process (docs/SPEC.md §7).
    pub fn write(
        &self,
        caller: &Caller,
        ino: NodeId,
        fh: Fh,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> FsResult<u32> {
        if control::is_virtual(ino) {
            return self.write_control(caller, fh, data);
        }
        let h = self.files.get(fh)?;
        if !h.may_write {
            return Err(FsError::NotOpenForWriting);
        }
        if kill_suidgid && kill_suid_sgid(&h.inode, caller)? {
            self.attrs_changed(h.inode.id);
        }
        let append = h.flags & libc::O_APPEND != 0;
        self.admit_write(
            caller,
            h.opener,
            &h.inode,
            h.fd.as_fd(),
            offset,
            data.len() as u64,
            append,
            "write",
        )?;
        let written = self.write_all(&h, offset, data);
        self.settle_fd(h.fd.as_fd());
        let done = written?;
        h.dirty.store(true, Ordering::Relaxed);
        Ok(done as u32)
    }

    /// Write `data` at `offset` (or at the end, with `O_APPEND`) through `h`; the bytes written.
    fn write_all(&self, h: &OpenFile, offset: u64, data: &[u8]) -> FsResult<usize> {
        let mut done = 0usize;
        while done < data.len() {
            let n = if h.flags & libc::O_APPEND != 0 {
                backing::write(h.fd.as_fd(), &data[done..])?
            } else {
                backing::pwrite(h.fd.as_fd(), &data[done..], offset + done as u64)?
            };
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    /// Flush (FUSE flush, at each close of a descriptor): nothing is buffered in the daemon.
    pub fn flush(&self, ino: NodeId, fh: Fh) -> FsResult<()> {
        if control::is_virtual(ino) {
            return Ok(());
        }
        self.files.get(fh).map(drop)
    }

    /// Release the handle `fh` (FUSE release, at the last close). Releasing a handle that wrote
    /// completes the file (docs/SPEC.md §5).
    pub fn release(&self, ino: NodeId, fh: Fh) -> FsResult<()> {
        self.close_handle(ino, fh, true)
    }

    /// Close handle `fh` of `ino` that its holder never closed: a remote connection dropped
    /// while it was open (docs/SPEC.md §13). Like [`SmithFs::release`] but a file written
    /// through it does not complete (docs/SPEC.md §5): a writer cut off mid-write publishes
    /// nothing (docs/PROTOCOL-NOTES.md R6).
    pub fn abandon(&self, ino: NodeId, fh: Fh) -> FsResult<()> {
        self.close_handle(ino, fh, false)
    }

    fn close_handle(&self, ino: NodeId, fh: Fh, complete: bool) -> FsResult<()> {
        if control::is_virtual(ino) {
            return self.controls.remove(fh).map(drop).ok_or(FsError::Stale);
        }
        let h = self.files.remove(fh).ok_or(FsError::Stale)?;
        if h.may_write {
            // Passthrough writes never reached the daemon: the books catch up at the close.
            self.settle_fd(h.fd.as_fd());
        }
        if h.passthrough.load(Ordering::Relaxed) {
            let mut pt = h.inode.passthrough.lock();
            match &mut *pt {
                Passthrough::Active { users, .. } | Passthrough::Cached { users } => {
                    *users -= 1;
                    if *users == 0 {
                        // Dropping the last reference closes the kernel registration.
                        *pt = Passthrough::Idle;
                    }
                }
                Passthrough::Idle | Passthrough::Never => {}
            }
        }
        if complete && h.dirty.load(Ordering::Relaxed) && h.inode.kind == libc::S_IFREG {
            let (parent, name) = {
                let p = h.inode.place.lock();
                (p.parent, p.name.clone())
            };
            if let Some(dir) = self.inodes.find(parent) {
                self.completed_name_by(&dir, &name, (h.opener, h.opener_pid, h.opener_uid));
            }
        }
        Ok(())
    }

    /// Flush a file to stable storage (FUSE fsync).
    pub fn fsync(&self, ino: NodeId, fh: Fh, datasync: bool) -> FsResult<()> {
        if control::is_virtual(ino) {
            return Ok(());
        }
        let h = self.files.get(fh)?;
        Ok(backing::fsync(h.fd.as_fd(), datasync)?)
    }

    /// Allocate or punch space through handle `fh` (FUSE fallocate), judged by its opener.
    pub fn fallocate(&self, fh: Fh, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        let h = self.files.get(fh)?;
        let caller = &h.opener_caller();
        if !h.may_write {
            return Err(FsError::NotOpenForWriting);
        }
        // Punching or collapsing frees space; every other mode may allocate the whole range.
        let frees = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_COLLAPSE_RANGE) != 0;
        let adds = if frees { 0 } else { length };
        let zone = self.zone(&h.inode);
        self.admit_storage(caller, h.opener, &zone, adds, 0, "fallocate", || {
            self.path_of(&h.inode)
        })?;
        let done = backing::fallocate(h.fd.as_fd(), mode, offset, length);
        self.settle_fd(h.fd.as_fd());
        done?;
        h.dirty.store(true, Ordering::Relaxed);
        // The kernel's FUSE client sends fallocate without dropping the set-id bits, and the
        // daemon (root, `CAP_FSETID`) keeps them on the backing file: drop them as a write by
        // the caller would (`should_remove_suid`).
        if caller.uid != 0 {
            kill_set_ids(h.fd.as_fd())?;
        }
        Ok(())
    }

    /// Seek for data or holes through handle `fh` (FUSE lseek).
    pub fn lseek(&self, ino: NodeId, fh: Fh, offset: i64, whence: i32) -> FsResult<i64> {
        if let Some(f) = ControlFile::by_id(ino) {
            self.controls.get(fh)?;
            return self.lseek_control(f, offset, whence);
        }
        let h = self.files.get(fh)?;
        Ok(backing::lseek(h.fd.as_fd(), offset, whence)?)
    }

    /// Copy a range between two handles (FUSE copy_file_range), judged by their openers.
    pub fn copy_file_range(
        &self,
        fh_in: Fh,
        off_in: u64,
        fh_out: Fh,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> FsResult<u32> {
        let hin = self.files.get(fh_in)?;
        let hout = self.files.get(fh_out)?;
        if !hout.may_write {
            return Err(FsError::NotOpenForWriting);
        }
        let len = len.min(u64::from(u32::MAX >> 1)) as usize;
        let zone = self.zone(&hout.inode);
        self.admit_storage(
            &hout.opener_caller(),
            hout.opener,
            &zone,
            len as u64,
            0,
            "copy_file_range",
            || self.path_of(&hout.inode),
        )?;
        let n =
            backing::copy_file_range(hin.fd.as_fd(), off_in, hout.fd.as_fd(), off_out, len, flags);
        self.settle_fd(hout.fd.as_fd());
        let n = n?;
        hout.dirty.store(true, Ordering::Relaxed);
        Ok(n as u32)
    }
}

/// Reopen `inode`'s file for a FUSE open with the caller's `flags`. A regular file asked for
/// read-only or write-only access, with none of [`backing::IO_FLAGS`], while no passthrough
/// backing serves its inode yet, is opened `O_RDWR` instead when the store allows it (not on a
/// read-only store, an immutable file or a running executable): the handle's own file can then
/// be the inode's passthrough backing, which saves a second reopen through `/proc/self/fd`.
/// What the caller may do through the handle is unchanged: the kernel sends no WRITE for a
/// read-only open and no READ for a write-only one, and the daemon's own read and write check
/// the handle's flags. Otherwise, or when that open fails, the caller's flags are used.
fn reopen_for(inode: &Inode, flags: i32) -> FsResult<HandleFd> {
    let fd = inode.fd()?;
    let upgrade = inode.kind == libc::S_IFREG
        && flags & libc::O_ACCMODE != libc::O_RDWR
        && flags & backing::IO_FLAGS == 0
        && matches!(*inode.passthrough.lock(), Passthrough::Idle);
    if upgrade {
        let rw = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
        if let Ok(file) = backing::reopen(fd.as_fd(), rw) {
            return Ok(HandleFd::opened(file, rw));
        }
    }
    Ok(HandleFd::opened(backing::reopen(fd.as_fd(), flags)?, flags))
}

/// Open `name` in `dir` for a FUSE create with the caller's `flags` (credentials already
/// switched). A write-only create that makes a new file opens it `O_RDWR` instead (a newly
/// created file is opened without a permission check, so this never fails where `O_WRONLY`
/// would succeed): the handle's own file can then be the inode's passthrough backing
/// ([`HandleFd`]). The handle keeps the caller's flags, so what the caller may do through it
/// is unchanged (the kernel sends no READ for a write-only open). When the name exists (or the
/// exclusive create fails otherwise) the caller's flags are used as given, with `O_NONBLOCK`
/// until the result is known to be a regular file: a FIFO, socket or device node found under
/// the name is closed unused and refused ([`FsError::SpecialFile`]), so a CREATE never blocks
/// a daemon thread opening a FIFO (docs/PROTOCOL-NOTES.md R51; a kernel never sends CREATE for
/// a name it found to be one, a remote node may).
fn create_open(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    flags: i32,
    mode: u32,
) -> FsResult<HandleFd> {
    let flags = flags | libc::O_CREAT;
    if flags & libc::O_ACCMODE == libc::O_WRONLY && flags & backing::IO_FLAGS == 0 {
        let rw = (flags & !libc::O_ACCMODE) | libc::O_RDWR | libc::O_EXCL;
        match backing::open_beneath(dir, name, rw, mode) {
            Ok(fd) => return Ok(HandleFd::opened(fd, rw)),
            Err(e) if flags & libc::O_EXCL != 0 => return Err(e.into()),
            Err(_) => {}
        }
    }
    let fd = backing::open_beneath(dir, name, flags | libc::O_NONBLOCK, mode)?;
    let st = backing::stat(fd.as_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            FsError::Backing(nix::errno::Errno::EISDIR)
        } else {
            FsError::SpecialFile
        });
    }
    if flags & libc::O_NONBLOCK == 0 {
        backing::set_status_flags(fd.as_fd(), flags)?;
    }
    Ok(HandleFd::opened(fd, flags))
}

/// Whether `kind` (`S_IFMT` bits) is a FIFO, socket or device node: what the daemon never opens.
pub(super) fn is_special(kind: u32) -> bool {
    matches!(
        kind,
        libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK
    )
}

pub(super) fn setid(fd: &OwnedFd) -> bool {
    backing::stat(fd.as_fd()).is_ok_and(|st| st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0)
}

/// Clear setuid and setgid as a write or truncate by a caller without CAP_FSETID must on Linux
/// (the kernel leaves this to us under `FUSE_HANDLE_KILLPRIV_V2`): setuid always; setgid when
/// group-executable, or when the caller is not in the file's group (`setattr_should_drop_sgid`).
/// Returns whether the mode changed (the kernel's cached attributes are then stale).
pub(super) fn kill_suid_sgid(inode: &Inode, caller: &Caller) -> FsResult<bool> {
    if inode.kind != libc::S_IFREG {
        return Ok(false);
    }
    let st = backing::stat(inode.fd()?.as_fd())?;
    let before = st.st_mode & 0o7777;
    let mut mode = before & !libc::S_ISUID;
    if mode & libc::S_ISGID != 0 {
        let in_group = caller.gid == st.st_gid || caller_groups(caller.pid).contains(&st.st_gid);
        if mode & libc::S_IXGRP != 0 || !in_group {
            mode &= !libc::S_ISGID;
        }
    }
    if mode != before {
        backing::chmod(inode.fd()?.as_fd(), mode)?;
    }
    Ok(mode != before)
}

/// Drop a file's set-user-ID bit, and its set-group-ID bit when it is group-executable, as the
/// kernel does on a write by a process without `CAP_FSETID` (`should_remove_suid`).
///
/// Errors: `fstat`'s or `fchmod`'s errno.
fn kill_set_ids(fd: std::os::fd::BorrowedFd<'_>) -> FsResult<()> {
    use std::os::fd::AsRawFd;
    let st = nix::sys::stat::fstat(fd.as_raw_fd())?;
    let mode = st.st_mode & 0o7777;
    let mut kill = libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        kill |= libc::S_ISGID;
    }
    if mode & kill != 0 {
        nix::sys::stat::fchmod(
            fd.as_raw_fd(),
            nix::sys::stat::Mode::from_bits_truncate(mode & !kill),
        )?;
    }
    Ok(())
}
