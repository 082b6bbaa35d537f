//! The backing store: every syscall that touches the directory underneath the mount.
//!
//! The mount point is also the backing store (an overmount), so nothing here may use a path
//! that starts at `/` or at the working directory: such a path would re-enter our own mount and
//! could deadlock. Every access is relative to a held descriptor:
//! - names are resolved one component at a time with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS)` and `O_NOFOLLOW`, so a symlink or `..` in the
//!   store never leads outside it;
//! - an inode is an `O_PATH` descriptor; operations that need a real open file reopen it through
//!   `/proc/self/fd/N` (the daemon's own descriptor table, never a user-controlled link).
//!
//! All functions return `nix::errno::Errno` from the failing syscall unchanged, so the caller
//! echoes the backing errno (STYLE.md habit 3).
//!
//! Long on purpose: every syscall the daemon makes on the store is here, one small wrapper each, so
//! that no other module touches the store by path (issue 9).

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;

/// Result of a backing-store syscall: the value or the raw errno.
pub type SysResult<T> = Result<T, Errno>;

/// What this layer refuses itself, before any system call: each is mapped once, in
/// [`Refused::errno`], to the errno the kernel gives for the same input. Every other errno of a
/// [`SysResult`] is one a system call returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not one path component (empty, `.`, `..`, a `/`), a NUL byte in a name or path, or a
    /// path with a component that is not a plain name: EINVAL.
    BadName,
    /// A component over `NAME_MAX` (255) bytes: ENAMETOOLONG, as open(2).
    NameTooLong,
    /// A size or offset beyond `off_t`: EFBIG, as ftruncate(2).
    TooLarge,
    /// A file handle too short or too long to be one: EINVAL, as open_by_handle_at(2).
    BadHandle,
    /// A write(2) that returned 0 for a non-empty buffer (no progress; a loop writing all of a
    /// buffer stops): EIO.
    WroteNothing,
}

impl Refused {
    /// The errno this refusal is reported with.
    pub const fn errno(self) -> Errno {
        match self {
            Refused::BadName | Refused::BadHandle => Errno::EINVAL,
            Refused::NameTooLong => Errno::ENAMETOOLONG,
            Refused::TooLarge => Errno::EFBIG,
            Refused::WroteNothing => Errno::EIO,
        }
    }
}

impl From<Refused> for Errno {
    fn from(r: Refused) -> Errno {
        r.errno()
    }
}

/// An inode number of the backing store (`st_ino` of a store file). Not a FUSE node id
/// (`crate::fs::NodeId`): the filesystem makes those from these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackingIno(pub u64);

impl BackingIno {
    /// The inode number of `st`.
    pub fn of(st: &libc::stat) -> BackingIno {
        BackingIno(st.st_ino)
    }
}

impl std::fmt::Display for BackingIno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

fn cvt(ret: libc::c_int) -> SysResult<libc::c_int> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

fn cvt_long(ret: libc::c_long) -> SysResult<libc::c_long> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: libc::ssize_t) -> SysResult<usize> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret as usize)
    }
}

/// A name as a C string. A name with an interior NUL or a `/` cannot be one path component:
/// EINVAL. `.` and `..` are refused too (FUSE never sends them for lookups we serve).
pub fn component(name: &OsStr) -> SysResult<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(Refused::BadName.into());
    }
    if bytes.len() > 255 {
        return Err(Refused::NameTooLong.into());
    }
    Ok(CString::new(bytes).map_err(|_| Refused::BadName)?)
}

/// Prefixes of the temporary names the daemon's atomic writes use (a scaffold being built, a
/// file being replaced). They never show through the mount, and a crash's leftovers are removed
/// at the next start (docs/SPEC.md §4, §9: never visible half-made).
pub const TEMP_PREFIXES: [&[u8]; 2] = [b".smithfs-new.", b".smithfs-tmp."];

/// Is `name` one of the daemon's temporary names?
pub fn is_daemon_temp(name: &[u8]) -> bool {
    TEMP_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// `/proc/self/fd/N` as a NUL-terminated string on the stack (no allocation: this is on the
/// path of every open).
pub struct ProcFdPath {
    buf: [u8; 32],
}

impl ProcFdPath {
    /// The path, NUL-terminated.
    pub fn as_ptr(&self) -> *const libc::c_char {
        self.buf.as_ptr().cast()
    }
}

/// `/proc/self/fd/N`: the daemon's own magic link to a descriptor it holds.
pub fn proc_fd_path(fd: RawFd) -> ProcFdPath {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    let mut buf = [0u8; 32];
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 12];
    let mut n = fd.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (i, d) in digits[..len].iter().rev().enumerate() {
        buf[PREFIX.len() + i] = *d;
    }
    // buf[PREFIX.len() + len] is already 0: the terminator.
    ProcFdPath { buf }
}

fn take_fd(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful syscall that creates a new descriptor,
    // and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Open the directory `path` (resolved normally, before the mount exists) as an `O_PATH`
/// descriptor: the root of the backing store.
///
/// Errors: the `open(2)` errno (ENOENT, ENOTDIR, EACCES …).
pub fn open_store_root(path: &std::path::Path) -> SysResult<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| Refused::BadName)?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let fd = cvt(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    Ok(take_fd(fd))
}

/// The `open(2)` flags `openat2` accepts.
const OPEN_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_TRUNC
    | libc::O_NONBLOCK
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_DIRECT
    | libc::O_NOATIME
    | libc::O_DIRECTORY
    | libc::O_NOFOLLOW
    | libc::O_CLOEXEC
    | libc::O_PATH
    | libc::O_TMPFILE
    | libc::O_LARGEFILE
    | libc::O_NOCTTY;

/// Resolve `name` (one component) beneath `dir` with `openat2`, never following a symlink,
/// never leaving the store: `RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS`.
///
/// `flags` are `open(2)` flags; `O_NOFOLLOW | O_CLOEXEC` are always added.
pub fn open_beneath(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> SysResult<OwnedFd> {
    // SAFETY: a plain C struct of integers, for which all-zero bytes are a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    // openat2 refuses unknown flag bits and mode bits beyond 07777 (FUSE passes both).
    let flags = flags & OPEN_FLAGS;
    how.flags = (flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64;
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        u64::from(mode & 0o7777)
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_XDEV | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: `how` is a valid open_how of the size passed; `name` is NUL-terminated.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                name.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        match cvt_long(ret) {
            Ok(fd) => return Ok(take_fd(fd as libc::c_int)),
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `O_PATH` descriptor for `name` in `dir`: the handle of an inode.
pub fn lookup(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<OwnedFd> {
    open_beneath(dir, name, libc::O_PATH, 0)
}

/// Reopen an inode's `O_PATH` descriptor as a real open file with `flags`.
///
/// `O_CREAT`, `O_EXCL` and `O_NOCTTY` are removed; `O_CLOEXEC` is added. A directory
/// (`O_DIRECTORY`) is reopened as `.` relative to itself, one path component; anything else
/// through `/proc/self/fd/N` (four components and a magic link), the only way for a file. A
/// directory its opener may read but not search (mode `r--`: `.` is a lookup in it, EACCES for a
/// daemon without `CAP_DAC_OVERRIDE`) is reopened through `/proc/self/fd/N` too, which checks
/// only the read right, as an `opendir` of the native directory does (notes SB16).
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> SysResult<OwnedFd> {
    let flags = (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_NOFOLLOW))
        | libc::O_CLOEXEC;
    let through_proc = || {
        let path = proc_fd_path(fd.as_raw_fd());
        // SAFETY: `path` is NUL-terminated.
        cvt(unsafe { libc::open(path.as_ptr(), flags) })
    };
    let ret = if flags & libc::O_DIRECTORY != 0 {
        // SAFETY: `fd` is a valid descriptor and "." is NUL-terminated.
        match cvt(unsafe { libc::openat(fd.as_raw_fd(), c".".as_ptr(), flags) }) {
            Err(Errno::EACCES) => through_proc()?,
            r => r?,
        }
    } else {
        through_proc()?
    };
    Ok(take_fd(ret))
}

/// Flags that change what I/O through an open file does: a file with any of them cannot serve
/// as the passthrough backing shared by every open of its inode (`O_SYNC` includes `O_DSYNC`'s
/// bit).
pub const IO_FLAGS: i32 = libc::O_APPEND
    | libc::O_DIRECT
    | libc::O_SYNC
    | libc::O_DSYNC
    | libc::O_NONBLOCK
    | libc::O_NOATIME
    | libc::O_PATH;

/// `fcntl(fd, F_DUPFD_CLOEXEC, 3)`: a second descriptor of the same open file.
pub fn dup(fd: BorrowedFd<'_>) -> SysResult<OwnedFd> {
    // SAFETY: fcntl with an integer argument on a valid descriptor.
    let ret = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    Ok(take_fd(ret))
}

/// `fcntl(fd, F_SETFL, flags)`: set the open file's status flags (only `O_APPEND`,
/// `O_NONBLOCK`, `O_DIRECT`, `O_NOATIME` and `O_ASYNC` of `flags` are taken; the others are
/// ignored, as fcntl(2) does).
pub fn set_status_flags(fd: BorrowedFd<'_>, flags: i32) -> SysResult<()> {
    // SAFETY: fcntl with an integer argument on a valid descriptor.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) })?;
    Ok(())
}

/// `fstatat(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`: the attributes of a held inode.
pub fn stat(fd: BorrowedFd<'_>) -> SysResult<libc::stat> {
    // SAFETY: a plain C struct of integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; the empty path is NUL-terminated.
    cvt(unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<libc::stat> {
    // SAFETY: a plain C struct of integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer and NUL-terminated name.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

/// `fstatfs` on a held inode.
pub fn statfs(fd: BorrowedFd<'_>) -> SysResult<libc::statvfs> {
    // SAFETY: a plain C struct of integers, for which all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    cvt(unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `mkdirat(dir, name, mode)`.
pub fn mkdir(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<()> {
    // SAFETY: NUL-terminated name.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// `mknodat(dir, name, mode, rdev)`.
pub fn mknod(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> SysResult<()> {
    // SAFETY: NUL-terminated name.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) }).map(drop)
}

/// `symlinkat(target, dir, name)`.
pub fn symlink(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    // SAFETY: NUL-terminated strings.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// Create a new hard link `newdir/newname` to the held inode `fd`.
pub fn link(fd: BorrowedFd<'_>, newdir: BorrowedFd<'_>, newname: &CStr) -> SysResult<()> {
    let path = proc_fd_path(fd.as_raw_fd());
    // SAFETY: NUL-terminated strings. AT_SYMLINK_FOLLOW follows only the daemon's magic link
    // to the held inode, never a link in the store (the target itself is not followed).
    cvt(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            path.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
    .map(drop)
}

/// `unlinkat(dir, name, 0)` or with `AT_REMOVEDIR`.
pub fn unlink(dir: BorrowedFd<'_>, name: &CStr, is_dir: bool) -> SysResult<()> {
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: NUL-terminated name.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `renameat2(olddir, oldname, newdir, newname, flags)`; flags are `RENAME_*`.
pub fn rename(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: u32,
) -> SysResult<()> {
    // SAFETY: NUL-terminated names.
    cvt(unsafe {
        libc::renameat2(
            olddir.as_raw_fd(),
            oldname.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `readlinkat(fd, "")` on a held symlink inode.
pub fn readlink(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: buffer of the given length.
    let n = cvt_size(unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// `chmod` of a held inode (through the daemon's magic link; symlinks have no mode).
pub fn chmod(fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
    let path = proc_fd_path(fd.as_raw_fd());
    // SAFETY: NUL-terminated path.
    cvt(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`; `u32::MAX` keeps a value.
pub fn chown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: empty NUL-terminated path.
    cvt(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// `utimensat` on a held inode; `times` are `[atime, mtime]` with `UTIME_NOW`/`UTIME_OMIT`.
pub fn utimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> SysResult<()> {
    // SAFETY: `times` points at two timespecs; empty NUL-terminated path.
    cvt(unsafe {
        libc::utimensat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            times.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// `ftruncate` on an open file.
pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> SysResult<()> {
    let size = i64::try_from(size).map_err(|_| Refused::TooLarge)?;
    // SAFETY: plain syscall on a descriptor we hold.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), size) }).map(drop)
}

/// `pread` into `buf`, retrying on EINTR; returns the number of bytes read.
pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> SysResult<usize> {
    loop {
        // SAFETY: `buf` is a valid writable buffer of the given length.
        let ret = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                offset as libc::off_t,
            )
        };
        match cvt_size(ret) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// `pwrite` of `data`, retrying on EINTR; returns the number of bytes written.
pub fn pwrite(fd: BorrowedFd<'_>, data: &[u8], offset: u64) -> SysResult<usize> {
    loop {
        // SAFETY: `data` is a valid readable buffer of the given length.
        let ret = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                offset as libc::off_t,
            )
        };
        match cvt_size(ret) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// `write` at the file's current position (for `O_APPEND` descriptors).
pub fn write(fd: BorrowedFd<'_>, data: &[u8]) -> SysResult<usize> {
    loop {
        // SAFETY: `data` is a valid readable buffer of the given length.
        let ret = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
        match cvt_size(ret) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// `fsync` or `fdatasync`.
pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> SysResult<()> {
    // SAFETY: plain syscalls on a held descriptor.
    cvt(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

/// `fallocate(fd, mode, offset, length)`.
pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, length: u64) -> SysResult<()> {
    // SAFETY: plain syscall on a held descriptor.
    cvt(unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            mode,
            offset as libc::off_t,
            length as libc::off_t,
        )
    })
    .map(drop)
}

/// `lseek(fd, offset, whence)` (used for `SEEK_DATA`/`SEEK_HOLE`).
pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> SysResult<i64> {
    // SAFETY: plain syscall on a held descriptor.
    let ret = unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) };
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

/// `copy_file_range` between two open files; returns the bytes copied.
pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: usize,
    flags: u32,
) -> SysResult<usize> {
    let mut off_in = off_in as libc::loff_t;
    let mut off_out = off_out as libc::loff_t;
    // SAFETY: offsets are valid in/out pointers for the duration of the call.
    cvt_size(unsafe {
        libc::copy_file_range(
            fd_in.as_raw_fd(),
            &mut off_in,
            fd_out.as_raw_fd(),
            &mut off_out,
            len,
            flags,
        )
    })
}

/// Which xattr call to make on a held inode (reached through the daemon's magic link).
fn xattr_path(fd: BorrowedFd<'_>) -> ProcFdPath {
    proc_fd_path(fd.as_raw_fd())
}

/// `getxattr`; with an empty `buf`, returns the value's size.
pub fn getxattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    let path = xattr_path(fd);
    // SAFETY: NUL-terminated strings; `buf` valid for its length (a null pointer when empty).
    cvt_size(unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            if buf.is_empty() {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            buf.len(),
        )
    })
}

/// `listxattr`; with an empty `buf`, returns the list's size.
pub fn listxattr(fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize> {
    let path = xattr_path(fd);
    // SAFETY: as for getxattr.
    cvt_size(unsafe {
        libc::listxattr(
            path.as_ptr(),
            if buf.is_empty() {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            buf.len(),
        )
    })
}

/// `setxattr(name, value, flags)`.
pub fn setxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> SysResult<()> {
    let path = xattr_path(fd);
    // SAFETY: NUL-terminated strings and a valid value buffer.
    cvt(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// `removexattr(name)`.
pub fn removexattr(fd: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    let path = xattr_path(fd);
    // SAFETY: NUL-terminated strings.
    cvt(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// A directory stream over an open directory, positioned by `telldir` cookies.
///
/// Owns its `DIR*`; not `Sync` — callers keep it behind a mutex.
pub struct DirStream {
    dir: *mut libc::DIR,
}

// SAFETY: a DIR* may move between threads; it is only used by one thread at a time (callers
// hold it behind a mutex).
unsafe impl Send for DirStream {}

/// One entry read from a [`DirStream`].
pub struct DirEntry {
    /// Backing inode number.
    pub ino: BackingIno,
    /// Cookie to resume after this entry.
    pub next_offset: u64,
    /// `DT_*` type.
    pub kind: u8,
    /// Entry name (no NUL).
    pub name: Vec<u8>,
}

impl DirStream {
    /// Open the held directory inode `fd` for reading.
    pub fn open(fd: BorrowedFd<'_>) -> SysResult<DirStream> {
        let dirfd = reopen(fd, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let raw = std::os::fd::IntoRawFd::into_raw_fd(dirfd);
        // SAFETY: `raw` is an open directory descriptor whose ownership passes to the DIR*.
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            let e = Errno::last();
            // SAFETY: fdopendir failed, so we still own `raw`.
            unsafe { libc::close(raw) };
            return Err(e);
        }
        Ok(DirStream { dir })
    }

    /// The stream's descriptor (for fsyncdir).
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the DIR* owns a valid descriptor for as long as `self` lives.
        unsafe { BorrowedFd::borrow_raw(libc::dirfd(self.dir)) }
    }

    /// Position the stream at cookie `offset` (0 = start).
    pub fn seek(&mut self, offset: u64) {
        // SAFETY: `self.dir` is a valid DIR*.
        unsafe {
            if offset == 0 {
                libc::rewinddir(self.dir);
            } else {
                libc::seekdir(self.dir, offset as libc::c_long);
            }
        }
    }

    /// Read the next entry, or `None` at the end.
    pub fn next_entry(&mut self) -> SysResult<Option<DirEntry>> {
        Errno::clear();
        // SAFETY: `self.dir` is a valid DIR*.
        let ent = unsafe { libc::readdir64(self.dir) };
        if ent.is_null() {
            let e = Errno::last_raw();
            return if e == 0 {
                Ok(None)
            } else {
                Err(Errno::from_raw(e))
            };
        }
        // SAFETY: readdir64 returned a valid dirent that lives until the next call on `dir`.
        let ent = unsafe { &*ent };
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr(ent.d_name.as_ptr()) }
            .to_bytes()
            .to_vec();
        Ok(Some(DirEntry {
            ino: BackingIno(ent.d_ino),
            next_offset: ent.d_off as u64,
            kind: ent.d_type,
            name,
        }))
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: `self.dir` is a valid DIR* that we own; closedir also closes its descriptor.
        unsafe { libc::closedir(self.dir) };
    }
}

/// Switch this thread's filesystem credentials to a caller's, for creating entries that must
/// belong to the caller (as root, new files belong to the caller's uid/gid and groups).
///
/// `setfsuid`/`setfsgid` and the raw `setgroups` syscall are per-thread on Linux. Dropping the
/// guard restores root credentials.
pub struct CredGuard {
    active: bool,
}

impl CredGuard {
    /// Become `uid`/`gid` with supplementary `groups` for filesystem checks on this thread.
    /// A no-op when `uid == 0` or the daemon is not root.
    pub fn switch(uid: u32, gid: u32, groups: &[u32]) -> SysResult<CredGuard> {
        // SAFETY: geteuid has no preconditions.
        if uid == 0 || unsafe { libc::geteuid() } != 0 {
            return Ok(CredGuard { active: false });
        }
        // SAFETY: per-thread credential syscalls with valid arguments; `groups` is valid for
        // its length.
        unsafe {
            cvt_long(libc::syscall(
                libc::SYS_setgroups,
                groups.len(),
                groups.as_ptr(),
            ))?;
            libc::setfsgid(gid);
            libc::setfsuid(uid);
        }
        Ok(CredGuard { active: true })
    }

    /// [`CredGuard::switch`], and then `CAP_DAC_OVERRIDE` raised again in this thread's
    /// effective set (the kernel dropped it with the fsuid; it stays permitted): the create
    /// that follows is made as `uid`/`gid` — the new inode is theirs from its first instant, no
    /// chown after — while the store's mode bits on the directory do not stop it. For
    /// `sandbox.uid_per_smith`, where the rules of docs/SPEC.md §3 alone decide between smiths
    /// and a parent creates in a child's `inbox/` (the child's uid, 0755). Restored with the
    /// fsuid on drop (the kernel raises the file capabilities again at fsuid 0).
    ///
    /// # Errors
    /// `setgroups`', `capget`'s or `capset`'s errno (the switch is undone).
    pub fn switch_overriding_modes(uid: u32, gid: u32, groups: &[u32]) -> SysResult<CredGuard> {
        let guard = CredGuard::switch(uid, gid, groups)?;
        if !guard.active {
            return Ok(guard);
        }
        raise_dac_override()?;
        Ok(guard)
    }
}

/// The capget/capset header and data of `_LINUX_CAPABILITY_VERSION_3` (two 32-bit words).
/// (`crate::process` has the same types; this layer is a leaf and imports nothing of the crate.)
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// capability(7)'s number of `CAP_DAC_OVERRIDE`.
const CAP_DAC_OVERRIDE: u32 = 1;

/// `CAP_DAC_OVERRIDE` back into this thread's effective set (it must be permitted).
fn raise_dac_override() -> SysResult<()> {
    let header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget/capset of this thread with pointers to locals of the kernel's layout.
    unsafe {
        cvt_long(libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()))?;
        data[0].effective |= 1 << CAP_DAC_OVERRIDE;
        cvt_long(libc::syscall(libc::SYS_capset, &header, data.as_ptr()))?;
    }
    Ok(())
}

impl Drop for CredGuard {
    fn drop(&mut self) {
        if self.active {
            // SAFETY: restoring root's per-thread credentials.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(0);
                libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<u32>());
            }
        }
    }
}

/// Open `name` in `dir` for the daemon's own use, never following a symlink.
pub fn open_file(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> SysResult<OwnedFd> {
    open_beneath(dir, name, flags, mode)
}

/// Open (creating if needed, with `mode`) the directory `name` in `dir` for the daemon's own
/// writes, never following a symlink: returns an `O_PATH | O_DIRECTORY` descriptor.
pub fn ensure_dir(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<OwnedFd> {
    ensure_dir_made(dir, name, mode).map(|(fd, _)| fd)
}

/// [`ensure_dir`], also saying whether the directory was made now (a name that appeared behind
/// the kernel, which a mounted daemon announces: docs/PROTOCOL-NOTES.md U4, U13).
pub fn ensure_dir_made(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<(OwnedFd, bool)> {
    let made = match mkdir(dir, name, mode) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(e),
    };
    Ok((
        open_beneath(dir, name, libc::O_PATH | libc::O_DIRECTORY, 0)?,
        made,
    ))
}

/// Write `data` to `dir/name` atomically: a temporary name, fsync, then rename over `name`.
/// A crash leaves either the old file or the new one, never a torn one (docs/SPEC.md §9).
pub fn write_atomic(dir: BorrowedFd<'_>, name: &CStr, data: &[u8], mode: u32) -> SysResult<()> {
    write_renamed(dir, name, data, mode, true)
}

/// Like [`write_atomic`] without the fsync: readers and a crash of the daemon see the old file
/// or the new one, never a torn one (the kernel has the data), but after a crash of the machine
/// the file may be old or empty — the durability of the journal, which is not fsynced either.
/// For the daemon's bookkeeping on the scheduler's path (`meta.json`), where an fsync (1–30 ms
/// on a loaded disk) would delay the next run.
pub fn write_replace(dir: BorrowedFd<'_>, name: &CStr, data: &[u8], mode: u32) -> SysResult<()> {
    write_renamed(dir, name, data, mode, false)
}

/// Copy the regular file `src` to `dir/name` atomically (docs/SPEC.md §9): streamed with
/// `copy_file_range` over the data segments that `SEEK_DATA`/`SEEK_HOLE` report, so holes stay
/// holes and memory use is O(1) (a 100 GiB sparse file costs what its data costs); falls back to
/// a 64 KiB `pread`/`pwrite` loop where `copy_file_range` is not supported. fsynced, then renamed
/// over `name`.
///
/// Errors: any read, write or rename error; `name` is then untouched.
pub fn copy_atomic(
    src: BorrowedFd<'_>,
    dir: BorrowedFd<'_>,
    name: &CStr,
    mode: u32,
) -> SysResult<()> {
    let size = u64::try_from(stat(src)?.st_size).unwrap_or(0);
    fill_renamed(dir, name, mode, true, |dst| {
        ftruncate(dst, size)?;
        for (start, end) in data_segments(src, size)? {
            copy_range(src, dst, start, end)?;
        }
        Ok(())
    })
}

/// The data segments `[start, end)` of the file `fd` of `size` bytes, by `SEEK_DATA` and
/// `SEEK_HOLE`; the whole file as one segment where the filesystem cannot tell.
pub fn data_segments(fd: BorrowedFd<'_>, size: u64) -> SysResult<Vec<(u64, u64)>> {
    let size_i = i64::try_from(size).map_err(|_| Refused::TooLarge)?;
    let mut out = Vec::new();
    let mut off = 0i64;
    while off < size_i {
        let data = match lseek(fd, off, libc::SEEK_DATA) {
            Ok(d) => d,
            Err(Errno::ENXIO) => break, // only a hole is left
            Err(Errno::EINVAL | Errno::EOPNOTSUPP) => {
                return Ok(vec![(0, size)]);
            }
            Err(e) => return Err(e),
        };
        let hole = match lseek(fd, data, libc::SEEK_HOLE) {
            Ok(h) => h.min(size_i),
            Err(Errno::ENXIO) => size_i,
            Err(e) => return Err(e),
        };
        if hole <= data {
            break;
        }
        out.push((data as u64, hole as u64));
        off = hole;
    }
    Ok(out)
}

/// Copy bytes `[start, end)` of `src` to the same offsets of `dst`.
fn copy_range(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, start: u64, end: u64) -> SysResult<()> {
    let mut off = start;
    while off < end {
        let len = usize::try_from(end - off)
            .unwrap_or(usize::MAX)
            .min(1 << 30);
        match copy_file_range(src, off, dst, off, len, 0) {
            Ok(0) => return Ok(()), // the source shrank under us
            Ok(n) => off += n as u64,
            Err(Errno::EINTR) => {}
            Err(Errno::EXDEV | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::EINVAL) => {
                return copy_range_rw(src, dst, off, end);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`copy_range`] by `pread`/`pwrite` through one 64 KiB buffer.
fn copy_range_rw(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, start: u64, end: u64) -> SysResult<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut off = start;
    while off < end {
        let want = usize::try_from(end - off)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = pread(src, &mut buf[..want], off)?;
        if n == 0 {
            return Ok(());
        }
        let mut w = 0;
        while w < n {
            w += pwrite(dst, &buf[w..n], off + w as u64)?;
        }
        off += n as u64;
    }
    Ok(())
}

/// Do the regular files `a` and `b` have the same content? Compared segment by segment over
/// their data (holes read as zeros, so a hole matches zeros written as data), through two 64
/// KiB buffers: O(1) memory, and the holes of sparse files cost nothing.
pub fn same_content(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> SysResult<bool> {
    let size = u64::try_from(stat(a)?.st_size).unwrap_or(0);
    if u64::try_from(stat(b)?.st_size).unwrap_or(0) != size {
        return Ok(false);
    }
    // Compare where either has data; elsewhere both read as zeros.
    let mut segs = data_segments(a, size)?;
    segs.extend(data_segments(b, size)?);
    segs.sort_unstable();
    let mut ba = vec![0u8; 64 * 1024];
    let mut bb = vec![0u8; 64 * 1024];
    let mut done = 0u64; // everything below was compared
    for (start, end) in segs {
        let mut off = start.max(done);
        while off < end {
            let want = usize::try_from(end - off)
                .unwrap_or(usize::MAX)
                .min(ba.len());
            let na = pread(a, &mut ba[..want], off)?;
            let nb = pread(b, &mut bb[..want], off)?;
            if na != nb || ba[..na] != bb[..nb] {
                return Ok(false);
            }
            if na == 0 {
                break;
            }
            off += na as u64;
        }
        done = done.max(end);
    }
    Ok(true)
}

fn write_renamed(
    dir: BorrowedFd<'_>,
    name: &CStr,
    data: &[u8],
    mode: u32,
    sync: bool,
) -> SysResult<()> {
    fill_renamed(dir, name, mode, sync, |fd| {
        let mut off = 0usize;
        while off < data.len() {
            off += pwrite(fd, &data[off..], off as u64)?;
        }
        Ok(())
    })
}

/// Make `dir/name` atomically from what `fill` writes into a fresh temporary file (mode
/// `mode`), fsynced when `sync`, then renamed over `name`; on any error the temporary file is
/// removed and `name` is untouched.
fn fill_renamed(
    dir: BorrowedFd<'_>,
    name: &CStr,
    mode: u32,
    sync: bool,
    fill: impl FnOnce(BorrowedFd<'_>) -> SysResult<()>,
) -> SysResult<()> {
    let tmp = CString::new(format!(
        ".smithfs-tmp.{}.{}",
        std::process::id(),
        next_tmp_serial()
    ))
    .map_err(|_| Refused::BadName)?;
    let fd = open_beneath(
        dir,
        &tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        mode,
    )?;
    let result = (|| {
        fill(fd.as_fd())?;
        if sync {
            fsync(fd.as_fd(), false)?;
        }
        rename(dir, &tmp, dir, name, 0)
    })();
    if result.is_err() {
        let _ = unlink(dir, &tmp, false);
    }
    result
}

fn next_tmp_serial() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    SERIAL.fetch_add(1, Ordering::Relaxed)
}

/// One node of a tree built by [`build_tree`]: a relative path (normal components only) and,
/// for a file, its content.
#[derive(Debug)]
pub enum Node<'a> {
    /// A directory with permission bits.
    Dir(&'a std::path::Path, u32),
    /// A regular file with permission bits and content.
    File(&'a std::path::Path, u32, &'a [u8]),
}

/// Open the directory at relative `path` beneath `dir`, one component at a time, never
/// following a symlink: an `O_PATH | O_DIRECTORY` descriptor.
pub fn open_dir_path(dir: BorrowedFd<'_>, path: &std::path::Path) -> SysResult<OwnedFd> {
    let mut cur: Option<OwnedFd> = None;
    for comp in path.components() {
        let std::path::Component::Normal(name) = comp else {
            return Err(Refused::BadName.into());
        };
        let c = component(name)?;
        let base = cur.as_ref().map_or(dir, |f| f.as_fd());
        cur = Some(open_beneath(base, &c, libc::O_PATH | libc::O_DIRECTORY, 0)?);
    }
    match cur {
        Some(f) => Ok(f),
        None => open_beneath(dir, c".", libc::O_PATH | libc::O_DIRECTORY, 0),
    }
}

/// What [`build_tree`] calls with the temporary name before renaming it into place.
pub type Finish<'a> = dyn FnMut(&CStr) -> SysResult<()> + 'a;

/// Build a directory `name` in `dir` holding `nodes` (parents before children), so that it is
/// never visible half-made: everything is created under a temporary name, fsynced, and renamed
/// into place with `RENAME_NOREPLACE` (docs/SPEC.md §4, §9). `owner` (uid, gid), when given,
/// becomes the owner of every created entry. `mode` is the new directory's own mode. `finish`,
/// when given, is called with the temporary name (in `dir`) once the nodes are in place and
/// before the rename: what it adds (a workspace, docs/SPEC.md §11) is part of the atomic whole.
///
/// Errors: EEXIST when `name` exists; any errno of the underlying calls or of `finish` (the
/// temporary tree is removed again on failure).
pub fn build_tree(
    dir: BorrowedFd<'_>,
    name: &CStr,
    mode: u32,
    nodes: &[Node<'_>],
    owner: Option<(u32, u32)>,
    finish: Option<&mut Finish<'_>>,
) -> SysResult<()> {
    let tmp = CString::new(format!(
        ".smithfs-new.{}.{}",
        std::process::id(),
        next_tmp_serial()
    ))
    .map_err(|_| Refused::BadName)?;
    mkdir(dir, &tmp, mode)?;
    let result = (|| {
        let root = open_beneath(dir, &tmp, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        if let Some((u, g)) = owner {
            chown(root.as_fd(), u, g)?;
        }
        for node in nodes {
            let (path, node_mode) = match node {
                Node::Dir(p, m) => (*p, *m),
                Node::File(p, m, _) => (*p, *m),
            };
            let leaf = path.file_name().ok_or(Refused::BadName)?;
            let leaf = component(leaf)?;
            let parent = open_dir_path(
                root.as_fd(),
                path.parent().unwrap_or(std::path::Path::new("")),
            )?;
            let made = match node {
                Node::Dir(..) => {
                    mkdir(parent.as_fd(), &leaf, node_mode)?;
                    open_beneath(parent.as_fd(), &leaf, libc::O_PATH | libc::O_DIRECTORY, 0)?
                }
                Node::File(_, _, content) => {
                    let f = open_beneath(
                        parent.as_fd(),
                        &leaf,
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                        node_mode,
                    )?;
                    let mut off = 0usize;
                    while off < content.len() {
                        off += pwrite(f.as_fd(), &content[off..], off as u64)?;
                    }
                    fsync(f.as_fd(), true)?;
                    f
                }
            };
            if let Some((u, g)) = owner {
                chown(made.as_fd(), u, g)?;
            }
        }
        if let Some(finish) = finish {
            finish(&tmp)?;
        }
        let rootdir = reopen(root.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
        fsync(rootdir.as_fd(), false)?;
        rename(dir, &tmp, dir, name, libc::RENAME_NOREPLACE)
    })();
    if result.is_err() {
        let _ = remove_tree(dir, &tmp);
    }
    result
}

/// The names in directory `dir`, without `.` and `..`, in directory order.
///
/// # Errors
/// Opening or reading the directory.
pub fn dir_names(dir: BorrowedFd<'_>) -> SysResult<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    let mut stream = DirStream::open(dir)?;
    while let Some(e) = stream.next_entry()? {
        if e.name != b"." && e.name != b".." {
            names.push(e.name);
        }
    }
    Ok(names)
}

/// Remove `name` in `dir` and everything below it, never following a symlink.
pub fn remove_tree(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    let st = stat_at(dir, name)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return unlink(dir, name, false);
    }
    let sub = open_beneath(dir, name, libc::O_PATH | libc::O_DIRECTORY, 0)?;
    for n in dir_names(sub.as_fd())? {
        let c = CString::new(n).map_err(|_| Refused::BadName)?;
        remove_tree(sub.as_fd(), &c)?;
    }
    unlink(dir, name, true)
}

/// Read the whole regular file at relative `path` beneath `dir` (never following a symlink).
pub fn read_file(dir: BorrowedFd<'_>, path: &std::path::Path) -> SysResult<Vec<u8>> {
    read_file_at_most(dir, path, u64::MAX)
}

/// [`read_file`] of a file that may be at most `max` bytes long (a smith's `config.json`: a
/// smith may make it anything). What is not a regular file is `EINVAL` without being read — a
/// FIFO would block the reader until someone writes it, so the open does not wait
/// (`O_NONBLOCK`) — and a file longer than `max` is `EFBIG`, its size taken before anything is
/// read (a sparse file of a terabyte costs its maker no quota), and again if it grew past `max`
/// while it was read.
pub fn read_file_at_most(
    dir: BorrowedFd<'_>,
    path: &std::path::Path,
    max: u64,
) -> SysResult<Vec<u8>> {
    let (f, size) = open_regular(dir, path)?;
    if size > max {
        return Err(Errno::EFBIG);
    }
    let out = pread_up_to(f.as_fd(), max.saturating_add(1))?;
    if out.len() as u64 > max {
        return Err(Errno::EFBIG);
    }
    Ok(out)
}

/// The first `n` bytes (fewer when the file is shorter) of the regular file at relative `path`
/// beneath `dir`, however long it is, with [`read_file_at_most`]'s care: no symlink followed
/// anywhere in `path`, the open never waits (a FIFO), and what is not a regular file is
/// `EINVAL` without being read (a smith's task or result shown by the ui, notes H23).
pub fn read_head(dir: BorrowedFd<'_>, path: &std::path::Path, n: u64) -> SysResult<Vec<u8>> {
    let (f, _) = open_regular(dir, path)?;
    pread_up_to(f.as_fd(), n)
}

/// Open the regular file at relative `path` beneath `dir` for reading, without waiting
/// (`O_NONBLOCK`) and without following a symlink: the file and its size in bytes. `EINVAL`:
/// not a regular file.
fn open_regular(dir: BorrowedFd<'_>, path: &std::path::Path) -> SysResult<(OwnedFd, u64)> {
    let leaf = component(path.file_name().ok_or(Refused::BadName)?)?;
    let parent = open_dir_path(dir, path.parent().unwrap_or(std::path::Path::new("")))?;
    let f = open_beneath(
        parent.as_fd(),
        &leaf,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
        0,
    )?;
    let st = nix::sys::stat::fstat(f.as_raw_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Errno::EINVAL);
    }
    Ok((f, st.st_size as u64))
}

/// Read `f` from its start until its end or `limit` bytes.
fn pread_up_to(f: BorrowedFd<'_>, limit: u64) -> SysResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while (out.len() as u64) < limit {
        let want = (limit - out.len() as u64).min(buf.len() as u64) as usize;
        let n = pread(f, &mut buf[..want], out.len() as u64)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}

/// Maximum size of a `struct file_handle`'s opaque part (`MAX_HANDLE_SZ`).
const MAX_HANDLE_SZ: usize = 128;

/// An opaque kernel file handle (`name_to_handle_at`), enough to reopen an inode later with
/// [`open_by_handle`] without holding a descriptor. Layout: `handle_type` (4 bytes, native
/// endian) followed by the handle bytes.
pub type KernelFileHandle = Box<[u8]>;

#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// The file handle of the held inode `fd`. Errors: EOPNOTSUPP where the filesystem has none.
pub fn file_handle(fd: BorrowedFd<'_>) -> SysResult<KernelFileHandle> {
    let mut raw = RawHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `raw` is a file_handle with room for MAX_HANDLE_SZ bytes; empty path with
    // AT_EMPTY_PATH names `fd` itself.
    cvt(unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            (&mut raw as *mut RawHandle).cast(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    })?;
    let n = (raw.handle_bytes as usize).min(MAX_HANDLE_SZ);
    let mut out = Vec::with_capacity(4 + n);
    out.extend_from_slice(&raw.handle_type.to_ne_bytes());
    out.extend_from_slice(&raw.f_handle[..n]);
    Ok(out.into_boxed_slice())
}

/// Reopen an inode from its [`file_handle`] as an `O_PATH` descriptor, relative to a descriptor
/// `mount` on the same filesystem (a real open descriptor, not `O_PATH`). Needs
/// CAP_DAC_READ_SEARCH. Errors: ESTALE when the inode is gone.
pub fn open_by_handle(mount: BorrowedFd<'_>, handle: &[u8]) -> SysResult<OwnedFd> {
    if handle.len() < 4 || handle.len() - 4 > MAX_HANDLE_SZ {
        return Err(Refused::BadHandle.into());
    }
    let mut raw = RawHandle {
        handle_bytes: (handle.len() - 4) as u32,
        handle_type: i32::from_ne_bytes([handle[0], handle[1], handle[2], handle[3]]),
        f_handle: [0; MAX_HANDLE_SZ],
    };
    raw.f_handle[..handle.len() - 4].copy_from_slice(&handle[4..]);
    // SAFETY: `raw` is a valid file_handle for the duration of the call.
    let fd = cvt(unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&mut raw as *mut RawHandle).cast(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    })?;
    Ok(take_fd(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fd_paths() {
        for fd in [0, 7, 10, 123, 19999, i32::MAX] {
            let p = proc_fd_path(fd);
            // SAFETY: proc_fd_path always NUL-terminates within its buffer.
            let s = unsafe { CStr::from_ptr(p.as_ptr()) };
            assert_eq!(s.to_str(), Ok(format!("/proc/self/fd/{fd}").as_str()));
        }
    }

    #[test]
    fn file_handles_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("f"), b"x").expect("write");
        let root = open_store_root(dir.path()).expect("root");
        let f = lookup(root.as_fd(), c"f").expect("lookup");
        let h = file_handle(f.as_fd()).expect("handle");
        let mount = reopen(root.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY).expect("reopen");
        let again = open_by_handle(mount.as_fd(), &h).expect("open by handle");
        let (a, b) = (
            stat(f.as_fd()).expect("stat"),
            stat(again.as_fd()).expect("stat"),
        );
        assert_eq!((a.st_ino, a.st_dev), (b.st_ino, b.st_dev));
    }

    /// `read_head` and `read_file_at_most` on what a smith may make instead of a regular file:
    /// a FIFO (answered at once, EINVAL, nobody writing it), a symlink as the file or as a
    /// directory on the way (never followed), and a file longer than asked.
    #[test]
    fn careful_reads_refuse_fifos_and_links_and_bound_their_length() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        std::fs::create_dir(p.join("outbox")).expect("mkdir");
        std::fs::write(p.join("outbox/result.md"), b"0123456789").expect("write");
        std::fs::write(p.join("elsewhere.md"), b"secret").expect("write");
        nix::unistd::mkfifo(&p.join("outbox/fifo.md"), nix::sys::stat::Mode::S_IRWXU)
            .expect("mkfifo");
        std::os::unix::fs::symlink(p.join("elsewhere.md"), p.join("outbox/link.md"))
            .expect("symlink");
        std::os::unix::fs::symlink(p.join("outbox"), p.join("linked")).expect("symlink");
        let root = open_store_root(p).expect("root");
        let r = root.as_fd();
        let path = std::path::Path::new;
        assert_eq!(
            read_head(r, path("outbox/result.md"), 4).as_deref(),
            Ok(&b"0123"[..])
        );
        assert_eq!(
            read_head(r, path("outbox/result.md"), 100).as_deref(),
            Ok(&b"0123456789"[..])
        );
        assert_eq!(read_head(r, path("outbox/fifo.md"), 4), Err(Errno::EINVAL));
        assert_eq!(read_head(r, path("outbox/link.md"), 4), Err(Errno::ELOOP));
        assert!(read_head(r, path("linked/result.md"), 4).is_err());
        assert!(read_head(r, path("../elsewhere.md"), 4).is_err());
        assert_eq!(
            read_file_at_most(r, path("outbox/result.md"), 10).as_deref(),
            Ok(&b"0123456789"[..])
        );
        assert_eq!(
            read_file_at_most(r, path("outbox/result.md"), 9),
            Err(Errno::EFBIG)
        );
        assert_eq!(
            read_file_at_most(r, path("outbox/fifo.md"), 9),
            Err(Errno::EINVAL)
        );
    }
}
