//! `SmithFs`: the filesystem operations as plain functions over the backing store, returning
//! `FsResult<…>`. The FUSE glue (`crate::fuse`) translates requests into these calls, so every
//! operation can be exercised without a kernel.
//!
//! Every operation that reaches the daemon calls [`SmithFs::check`] exactly once per object it
//! touches (PROTOCOL.md §3); requests that carry a file handle are judged by the handle's
//! recorded opener (PROTOCOL.md §2).

pub mod backing;
pub mod error;
pub mod handle;
pub mod inode;
pub mod scaffold;

use std::ffi::{CStr, OsStr};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nix::errno::Errno;

use self::backing::CredGuard;
pub use self::error::{FsError, FsResult};
use self::handle::{DirHandle, FileHandle, HandleTable};
use self::inode::{Inode, InodeTable, ROOT_ID};
use crate::identity::Identity;

/// The name of smithfs's own state directory in the store's root, never visible through the
/// mount (PROTOCOL.md §1).
pub const STATE_DIR: &str = ".smithfs-state";

/// The process behind a request, as the kernel reports it.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// Thread id in the daemon's pid namespace; 0 for kernel-originated requests.
    pub pid: u32,
    /// Filesystem uid.
    pub uid: u32,
    /// Filesystem gid.
    pub gid: u32,
}

/// What an operation asks of an object, for the access check (PROTOCOL.md §3 operation classes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Open for reading, readdir, getxattr/listxattr, readlink.
    Read,
    /// Open for writing or `O_TRUNC`, truncate, fallocate, chmod/chown/utimes, set/removexattr.
    Write,
    /// Create a name in a directory (create, mkdir, mknod, symlink, link or rename destination).
    Create,
    /// Remove a name from a directory (unlink, rmdir, rename source, replaced by rename).
    Delete,
}

/// Attributes of an inode as the mount shows them: the backing `stat` with `st_ino` replaced by
/// the node id.
#[derive(Clone, Copy)]
pub struct Attr(pub libc::stat);

impl std::fmt::Debug for Attr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attr")
            .field("ino", &self.0.st_ino)
            .field("mode", &format_args!("{:o}", self.0.st_mode))
            .field("size", &self.0.st_size)
            .finish()
    }
}

/// Changes requested by a setattr (each `None` keeps the value).
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    /// New mode bits (permission and setuid/setgid/sticky).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate).
    pub size: Option<u64>,
    /// New access time (`UTIME_NOW` in `tv_nsec` for now).
    pub atime: Option<libc::timespec>,
    /// New modification time.
    pub mtime: Option<libc::timespec>,
    /// The handle the change was made through (ftruncate, fchmod …).
    pub fh: Option<u64>,
}

/// One entry produced by readdir.
#[derive(Debug)]
pub struct DirEntryOut<'a> {
    /// Node id (or the backing inode number for `.` and `..`, which the kernel does not count).
    pub ino: u64,
    /// Cookie to resume after this entry.
    pub offset: u64,
    /// `S_IFMT` bits of the entry's type.
    pub kind: u32,
    /// Entry name.
    pub name: &'a OsStr,
    /// For readdirplus: the looked-up attributes (the lookup count was raised by one).
    pub attr: Option<Attr>,
}

/// Options fixed for the life of a mount.
#[derive(Clone, Debug, Default)]
pub struct FsOptions {}

/// The filesystem: the inode table, the handle tables and the access check.
#[derive(Debug)]
pub struct SmithFs {
    inodes: InodeTable,
    files: HandleTable<FileHandle>,
    dirs: HandleTable<DirHandle>,
    #[allow(dead_code)]
    opts: FsOptions,
}

impl SmithFs {
    /// A filesystem over the backing store whose root is the `O_PATH` descriptor `root`.
    pub fn new(root: std::os::fd::OwnedFd, opts: FsOptions) -> FsResult<SmithFs> {
        Ok(SmithFs {
            inodes: InodeTable::new(root)?,
            files: HandleTable::default(),
            dirs: HandleTable::default(),
            opts,
        })
    }

    /// The identity a request is judged by (PROTOCOL.md §2). Until smiths are bound, every
    /// process is the operator; request pid 0 is Unknown.
    pub fn identify(&self, caller: &Caller) -> Identity {
        if caller.pid == 0 {
            Identity::Unknown
        } else {
            Identity::Operator
        }
    }

    /// The one access check every operation calls (PROTOCOL.md §3): may `who` do `access` on
    /// `inode` (for Create/Delete: on the entry `name` in directory `inode`)?
    pub fn check(
        &self,
        who: Identity,
        _access: Access,
        _inode: &Inode,
        _name: Option<&OsStr>,
    ) -> FsResult<()> {
        match who {
            Identity::Unknown => Err(FsError::Reserved(Errno::EACCES)),
            Identity::Operator | Identity::Smith(_) => Ok(()),
        }
    }

    fn attr_of(&self, st: libc::stat) -> Attr {
        let mut st = st;
        st.st_ino = self.inodes.ids.node_id(st.st_ino);
        Attr(st)
    }

    /// Names in the store's root that the mount never shows or lets anyone create.
    fn reserved(parent: u64, name: &OsStr) -> bool {
        parent == ROOT_ID && name.as_bytes() == STATE_DIR.as_bytes()
    }

    fn name_in(name: &OsStr) -> FsResult<std::ffi::CString> {
        Ok(backing::component(name)?)
    }

    /// Resolve `name` in `parent`, raising its lookup count (FUSE lookup).
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        if Self::reserved(parent, name) {
            return Err(FsError::Reserved(Errno::ENOENT));
        }
        let dir = self.inodes.get(parent)?;
        let cname = Self::name_in(name)?;
        self.lookup_in(&dir, &cname).map(|(_, a)| a)
    }

    fn lookup_in(&self, dir: &Inode, cname: &CStr) -> FsResult<(Arc<Inode>, Attr)> {
        let fd = backing::lookup(dir.fd(), cname)?;
        let st = backing::stat(fd.as_fd())?;
        let inode = self.inodes.remember(fd, &st);
        Ok((inode, self.attr_of(st)))
    }

    /// Drop `n` kernel references to `ino` (FUSE forget).
    pub fn forget(&self, ino: u64, n: u64) {
        self.inodes.forget(ino, n);
    }

    /// Attributes of `ino`, through the handle `fh` if given (FUSE getattr).
    pub fn getattr(&self, ino: u64, fh: Option<u64>) -> FsResult<Attr> {
        if let Some(fh) = fh {
            if let Ok(h) = self.files.get(fh) {
                return Ok(self.attr_of(backing::stat(h.fd.as_fd())?));
            }
        }
        let inode = self.inodes.get(ino)?;
        Ok(self.attr_of(backing::stat(inode.fd())?))
    }

    /// Change attributes (FUSE setattr): mode, owner, size, times, in that order.
    /// Truncation through a handle is judged by the handle's opener; everything else by the
    /// caller (PROTOCOL.md §2).
    pub fn setattr(&self, caller: &Caller, ino: u64, set: &SetAttr) -> FsResult<Attr> {
        let inode = self.inodes.get(ino)?;
        let handle = set.fh.and_then(|fh| self.files.get(fh).ok());
        let who = self.identify(caller);
        let by_caller = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some();
        if by_caller {
            self.check(who, Access::Write, &inode, None)?;
        }
        if let Some(mode) = set.mode {
            backing::chmod(inode.fd(), mode & 0o7777)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            backing::chown(
                inode.fd(),
                set.uid.unwrap_or(u32::MAX),
                set.gid.unwrap_or(u32::MAX),
            )?;
        }
        if let Some(size) = set.size {
            match &handle {
                Some(h) => {
                    if !h.may_write {
                        return Err(FsError::Backing(Errno::EBADF));
                    }
                    backing::ftruncate(h.fd.as_fd(), size)?;
                    h.dirty.store(true, Ordering::Relaxed);
                }
                None => {
                    self.check(who, Access::Write, &inode, None)?;
                    let fd = backing::reopen(inode.fd(), libc::O_WRONLY)?;
                    backing::ftruncate(fd.as_fd(), size)?;
                }
            }
            if caller.uid != 0 && set.mode.is_none() {
                kill_suid_sgid(&inode)?;
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let omit = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            };
            let times = [set.atime.unwrap_or(omit), set.mtime.unwrap_or(omit)];
            backing::utimens(inode.fd(), &times)?;
        }
        Ok(self.attr_of(backing::stat(inode.fd())?))
    }

    /// The target of the symlink `ino` (FUSE readlink).
    pub fn readlink(&self, caller: &Caller, ino: u64) -> FsResult<Vec<u8>> {
        let inode = self.inodes.get(ino)?;
        self.check(self.identify(caller), Access::Read, &inode, None)?;
        Ok(backing::readlink(inode.fd())?)
    }

    fn creating(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
    ) -> FsResult<(Arc<Inode>, std::ffi::CString)> {
        if Self::reserved(parent, name) {
            return Err(FsError::Reserved(Errno::EPERM));
        }
        let dir = self.inodes.get(parent)?;
        let cname = Self::name_in(name)?;
        self.check(self.identify(caller), Access::Create, &dir, Some(name))?;
        Ok((dir, cname))
    }

    /// Create a node (FUSE mknod): regular file, FIFO, socket or device, owned by the caller.
    pub fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> FsResult<Attr> {
        let (dir, cname) = self.creating(caller, parent, name)?;
        {
            let _cred = as_caller(caller)?;
            backing::mknod(dir.fd(), &cname, mode, u64::from(rdev))?;
        }
        self.lookup_in(&dir, &cname).map(|(_, a)| a)
    }

    /// Create a directory owned by the caller (FUSE mkdir).
    pub fn mkdir(&self, caller: &Caller, parent: u64, name: &OsStr, mode: u32) -> FsResult<Attr> {
        let (dir, cname) = self.creating(caller, parent, name)?;
        {
            let _cred = as_caller(caller)?;
            backing::mkdir(dir.fd(), &cname, mode)?;
        }
        self.lookup_in(&dir, &cname).map(|(_, a)| a)
    }

    /// Create a symlink owned by the caller (FUSE symlink).
    pub fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
    ) -> FsResult<Attr> {
        let (dir, cname) = self.creating(caller, parent, name)?;
        let ctarget = std::ffi::CString::new(target.as_bytes())
            .map_err(|_| FsError::Backing(Errno::EINVAL))?;
        {
            let _cred = as_caller(caller)?;
            backing::symlink(&ctarget, dir.fd(), &cname)?;
        }
        self.lookup_in(&dir, &cname).map(|(_, a)| a)
    }

    /// Add the name `newname` in `newparent` for `ino` (FUSE link).
    pub fn link(
        &self,
        caller: &Caller,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> FsResult<Attr> {
        let inode = self.inodes.get(ino)?;
        let (dir, cname) = self.creating(caller, newparent, newname)?;
        backing::link(inode.fd(), dir.fd(), &cname)?;
        self.lookup_in(&dir, &cname).map(|(_, a)| a)
    }

    /// Remove the name `name` from `parent` (FUSE unlink, or rmdir when `is_dir`).
    pub fn remove(&self, caller: &Caller, parent: u64, name: &OsStr, is_dir: bool) -> FsResult<()> {
        if Self::reserved(parent, name) {
            return Err(FsError::Reserved(Errno::ENOENT));
        }
        let dir = self.inodes.get(parent)?;
        let cname = Self::name_in(name)?;
        self.check(self.identify(caller), Access::Delete, &dir, Some(name))?;
        backing::unlink(dir.fd(), &cname, is_dir)?;
        Ok(())
    }

    /// Rename (FUSE rename; `flags` are `RENAME_NOREPLACE`/`RENAME_EXCHANGE`): delete at the
    /// source and create at the destination (PROTOCOL.md §3).
    pub fn rename(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        if Self::reserved(parent, name) {
            return Err(FsError::Reserved(Errno::ENOENT));
        }
        if Self::reserved(newparent, newname) {
            return Err(FsError::Reserved(Errno::EPERM));
        }
        let who = self.identify(caller);
        let from = self.inodes.get(parent)?;
        let to = self.inodes.get(newparent)?;
        let cname = Self::name_in(name)?;
        let cnew = Self::name_in(newname)?;
        self.check(who, Access::Delete, &from, Some(name))?;
        self.check(who, Access::Create, &to, Some(newname))?;
        backing::rename(from.fd(), &cname, to.fd(), &cnew, flags)?;
        Ok(())
    }

    /// Open `ino` with `flags` (FUSE open); returns the handle number.
    pub fn open(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<u64> {
        let inode = self.inodes.get(ino)?;
        let who = self.identify(caller);
        let acc = flags & libc::O_ACCMODE;
        let may_write = acc != libc::O_RDONLY;
        let truncates = flags & libc::O_TRUNC != 0;
        if acc != libc::O_WRONLY {
            self.check(who, Access::Read, &inode, None)?;
        }
        if may_write || truncates {
            self.check(who, Access::Write, &inode, None)?;
        }
        let fd = backing::reopen(inode.fd(), flags)?;
        if truncates && caller.uid != 0 {
            kill_suid_sgid(&inode)?;
        }
        Ok(self.files.insert(FileHandle {
            fd,
            inode,
            opener: who,
            flags,
            may_write,
            dirty: std::sync::atomic::AtomicBool::new(truncates),
        }))
    }

    /// Create and open `name` in `parent` (FUSE create); the new file belongs to the caller.
    pub fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Attr, u64)> {
        let (dir, cname) = self.creating(caller, parent, name)?;
        let fd = {
            let _cred = as_caller(caller)?;
            backing::open_beneath(dir.fd(), &cname, flags | libc::O_CREAT, mode)?
        };
        let (inode, attr) = self.lookup_in(&dir, &cname)?;
        let may_write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let fh = self.files.insert(FileHandle {
            fd,
            inode,
            opener: self.identify(caller),
            flags,
            may_write,
            dirty: std::sync::atomic::AtomicBool::new(true),
        });
        Ok((attr, fh))
    }

    /// Read up to `size` bytes at `offset` through handle `fh` (FUSE read).
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
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
    pub fn write(&self, fh: u64, offset: u64, data: &[u8], kill_suidgid: bool) -> FsResult<u32> {
        let h = self.files.get(fh)?;
        if !h.may_write {
            return Err(FsError::Backing(Errno::EBADF));
        }
        if kill_suidgid {
            kill_suid_sgid(&h.inode)?;
        }
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
        h.dirty.store(true, Ordering::Relaxed);
        Ok(done as u32)
    }

    /// Flush (FUSE flush, at each close of a descriptor): nothing is buffered in the daemon.
    pub fn flush(&self, fh: u64) -> FsResult<()> {
        self.files.get(fh).map(drop)
    }

    /// Release the handle `fh` (FUSE release, at the last close).
    pub fn release(&self, fh: u64) -> FsResult<()> {
        self.files.remove(fh).map(drop).ok_or(FsError::Stale)
    }

    /// Flush a file to stable storage (FUSE fsync).
    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.files.get(fh)?;
        Ok(backing::fsync(h.fd.as_fd(), datasync)?)
    }

    /// Open the directory `ino` for reading (FUSE opendir).
    pub fn opendir(&self, caller: &Caller, ino: u64) -> FsResult<u64> {
        let inode = self.inodes.get(ino)?;
        let who = self.identify(caller);
        self.check(who, Access::Read, &inode, None)?;
        let stream = backing::DirStream::open(inode.fd())?;
        Ok(self.dirs.insert(DirHandle {
            stream: parking_lot::Mutex::new(stream),
            inode,
            opener: who,
        }))
    }

    /// List the directory behind handle `fh` from cookie `offset`, feeding entries to `add`
    /// until it returns `true` (buffer full). With `plus`, each entry but `.`/`..` is looked up;
    /// an entry that does not fit is forgotten again.
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(&DirEntryOut<'_>) -> bool,
    ) -> FsResult<()> {
        let h = self.dirs.get(fh)?;
        let at_root = h.inode.id == ROOT_ID;
        let mut stream = h.stream.lock();
        stream.seek(offset);
        while let Some(ent) = stream.next_entry()? {
            let name = OsStr::from_bytes(&ent.name);
            if at_root && Self::reserved(ROOT_ID, name) {
                continue;
            }
            let dot = ent.name == b"." || ent.name == b"..";
            let kind = u32::from(ent.kind) << 12;
            let mut out = DirEntryOut {
                ino: self.inodes.ids.node_id(ent.ino),
                offset: ent.next_offset,
                kind,
                name,
                attr: None,
            };
            if plus {
                if dot {
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    st.st_ino = ent.ino;
                    st.st_mode = kind;
                    out.attr = Some(Attr(st));
                } else {
                    let cname = std::ffi::CString::new(ent.name.clone())
                        .map_err(|_| FsError::Backing(Errno::EINVAL))?;
                    match self.lookup_in(&h.inode, &cname) {
                        Ok((_, attr)) => {
                            out.ino = attr.0.st_ino;
                            out.attr = Some(attr);
                        }
                        // Removed since it was listed: skip it.
                        Err(_) => continue,
                    }
                }
            }
            if add(&out) {
                if plus && !dot {
                    self.inodes.forget(out.ino, 1);
                }
                break;
            }
        }
        Ok(())
    }

    /// Close the directory handle `fh` (FUSE releasedir).
    pub fn releasedir(&self, fh: u64) -> FsResult<()> {
        self.dirs.remove(fh).map(drop).ok_or(FsError::Stale)
    }

    /// Flush a directory (FUSE fsyncdir).
    pub fn fsyncdir(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.dirs.get(fh)?;
        let stream = h.stream.lock();
        Ok(backing::fsync(stream.fd(), datasync)?)
    }

    /// Filesystem statistics of the store (FUSE statfs).
    pub fn statfs(&self, ino: u64) -> FsResult<libc::statvfs> {
        let inode = self.inodes.get(ino).unwrap_or_else(|_| self.inodes.root());
        Ok(backing::statfs(inode.fd())?)
    }

    /// Set an extended attribute (FUSE setxattr), judged by the caller.
    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        let inode = self.inodes.get(ino)?;
        self.check(self.identify(caller), Access::Write, &inode, None)?;
        let cname = xattr_name(name)?;
        Ok(backing::setxattr(inode.fd(), &cname, value, flags)?)
    }

    /// Get an extended attribute (FUSE getxattr): with `size == 0`, its size in `Err`-free
    /// form as `XattrReply::Size`.
    pub fn getxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        size: u32,
    ) -> FsResult<XattrReply> {
        let inode = self.inodes.get(ino)?;
        self.check(self.identify(caller), Access::Read, &inode, None)?;
        let cname = xattr_name(name)?;
        xattr_reply(size, |buf| backing::getxattr(inode.fd(), &cname, buf))
    }

    /// List extended attribute names (FUSE listxattr).
    pub fn listxattr(&self, caller: &Caller, ino: u64, size: u32) -> FsResult<XattrReply> {
        let inode = self.inodes.get(ino)?;
        self.check(self.identify(caller), Access::Read, &inode, None)?;
        xattr_reply(size, |buf| backing::listxattr(inode.fd(), buf))
    }

    /// Remove an extended attribute (FUSE removexattr).
    pub fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<()> {
        let inode = self.inodes.get(ino)?;
        self.check(self.identify(caller), Access::Write, &inode, None)?;
        let cname = xattr_name(name)?;
        Ok(backing::removexattr(inode.fd(), &cname)?)
    }

    /// Allocate or punch space through handle `fh` (FUSE fallocate), judged by its opener.
    pub fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        let h = self.files.get(fh)?;
        if !h.may_write {
            return Err(FsError::Backing(Errno::EBADF));
        }
        backing::fallocate(h.fd.as_fd(), mode, offset, length)?;
        h.dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Seek for data or holes through handle `fh` (FUSE lseek).
    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        let h = self.files.get(fh)?;
        Ok(backing::lseek(h.fd.as_fd(), offset, whence)?)
    }

    /// Copy a range between two handles (FUSE copy_file_range), judged by their openers.
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> FsResult<u32> {
        let hin = self.files.get(fh_in)?;
        let hout = self.files.get(fh_out)?;
        if !hout.may_write {
            return Err(FsError::Backing(Errno::EBADF));
        }
        let len = len.min(u64::from(u32::MAX >> 1)) as usize;
        let n =
            backing::copy_file_range(hin.fd.as_fd(), off_in, hout.fd.as_fd(), off_out, len, flags)?;
        hout.dirty.store(true, Ordering::Relaxed);
        Ok(n as u32)
    }

    /// Numbers of held inodes and open handles (files, directories), for status and tests.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.inodes.len(), self.files.len(), self.dirs.len())
    }
}

/// Reply to a getxattr/listxattr: the needed size (when asked with size 0) or the data.
#[derive(Debug)]
pub enum XattrReply {
    /// The value's size in bytes.
    Size(u32),
    /// The value.
    Data(Vec<u8>),
}

fn xattr_reply(
    size: u32,
    get: impl Fn(&mut [u8]) -> backing::SysResult<usize>,
) -> FsResult<XattrReply> {
    if size == 0 {
        let n = get(&mut [])?;
        return Ok(XattrReply::Size(n as u32));
    }
    let mut buf = vec![0u8; size as usize];
    let n = get(&mut buf)?;
    buf.truncate(n);
    Ok(XattrReply::Data(buf))
}

fn xattr_name(name: &OsStr) -> FsResult<std::ffi::CString> {
    std::ffi::CString::new(name.as_bytes()).map_err(|_| FsError::Backing(Errno::EINVAL))
}

/// Clear setuid, and setgid when group-executable, as a write or truncate by a caller without
/// CAP_FSETID must (the kernel leaves this to us under `FUSE_HANDLE_KILLPRIV_V2`).
fn kill_suid_sgid(inode: &Inode) -> FsResult<()> {
    if inode.kind != libc::S_IFREG {
        return Ok(());
    }
    let st = backing::stat(inode.fd())?;
    let mut mode = st.st_mode & 0o7777;
    let before = mode;
    mode &= !libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        mode &= !libc::S_ISGID;
    }
    if mode != before {
        backing::chmod(inode.fd(), mode)?;
    }
    Ok(())
}

/// Switch this thread's filesystem credentials to the caller's for a create.
fn as_caller(caller: &Caller) -> FsResult<CredGuard> {
    if caller.uid == 0 {
        return Ok(CredGuard::switch(0, 0, &[])?);
    }
    let groups = caller_groups(caller.pid);
    Ok(CredGuard::switch(caller.uid, caller.gid, &groups)?)
}

/// Supplementary groups of process `pid` (empty when unknown).
fn caller_groups(pid: u32) -> Vec<u32> {
    if pid == 0 {
        return Vec::new();
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
