//! The FUSE wire codec: request decoding and reply encoding for every operation smithfs serves,
//! independent of the transport (`include/uapi/linux/fuse.h`, protocol 7.40 as `super::init` negotiates
//! it at INIT).
//!
//! A request is an `fuse_in_header`, the operation's fixed argument struct (`arg`) and its
//! variable part (`payload`: names, write data). On `/dev/fuse` the three are contiguous; over
//! io_uring the kernel puts the header and `arg` in the entry's 288-byte header buffer and the
//! payload in the entry's payload buffer ([`split_dev_fuse`] cuts a `/dev/fuse` read the same
//! way, so one decoder serves both). A reply is an `fuse_out_header` followed by the operation's
//! out arguments; [`Out`] writes the arguments into whatever buffer the transport owns.
//!
//! Integers are in native byte order, as the kernel writes them. Decoding never panics on short
//! or malformed input: it returns [`WireError`].
//!
//! Long on purpose: one decoder and one encoder for every opcode, kept side by side with the
//! layouts they mirror, plus their round-trip tests; split by opcode family, each half would
//! repeat the header and argument plumbing.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// Size of `struct fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;
/// Size of `struct fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;
/// Size of `struct fuse_attr`.
pub const ATTR_LEN: usize = 88;
/// Size of `struct fuse_entry_out`.
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
/// Size of `struct fuse_attr_out`.
pub const ATTR_OUT_LEN: usize = 16 + ATTR_LEN;
/// Size of `struct fuse_open_out`.
pub const OPEN_OUT_LEN: usize = 16;
/// Size of `struct fuse_dirent` before its name.
pub const DIRENT_LEN: usize = 24;

/// FUSE opcodes smithfs decodes (`enum fuse_opcode`).
#[allow(missing_docs)]
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
}

/// `fuse_setattr_in.valid` bits (`FATTR_*`).
#[allow(missing_docs)]
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

/// `fuse_open_out.open_flags` bits (`FOPEN_*`).
#[allow(missing_docs)]
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PASSTHROUGH: u32 = 1 << 7;
}

/// `FUSE_GETATTR_FH`: `fuse_getattr_in.fh` is valid.
pub const GETATTR_FH: u32 = 1 << 0;
/// `FUSE_WRITE_KILL_SUIDGID` in `fuse_write_in.write_flags`.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `FUSE_FSYNC_FDATASYNC` in `fuse_fsync_in.fsync_flags`.
pub const FSYNC_FDATASYNC: u32 = 1 << 0;

/// Why a request could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer ends before the struct or name it must hold.
    #[error("FUSE request truncated")]
    Short,
    /// A name is not NUL-terminated within its buffer.
    #[error("FUSE request name not NUL-terminated")]
    Unterminated,
}

/// `struct fuse_in_header`: who asks what of which node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InHeader {
    /// Total request length on `/dev/fuse` (header included).
    pub len: u32,
    /// `enum fuse_opcode`.
    pub opcode: u32,
    /// Request id, echoed by the reply.
    pub unique: u64,
    /// Node the request is about.
    pub nodeid: u64,
    /// Caller's fsuid.
    pub uid: u32,
    /// Caller's fsgid.
    pub gid: u32,
    /// Caller's thread id in the daemon's pid namespace (0 for kernel-originated requests).
    pub pid: u32,
    /// Length of request extensions after the arguments, in 8-byte units.
    pub total_extlen: u16,
}

impl InHeader {
    /// Decode the first [`IN_HEADER_LEN`] bytes of `b`.
    pub fn decode(b: &[u8]) -> Result<InHeader, WireError> {
        let mut r = Reader(b);
        Ok(InHeader {
            len: r.u32()?,
            opcode: r.u32()?,
            unique: r.u64()?,
            nodeid: r.u64()?,
            uid: r.u32()?,
            gid: r.u32()?,
            pid: r.u32()?,
            total_extlen: r.u16()?,
        })
    }
}

/// Size of the fixed argument struct of `opcode` (`fuse_*_in`), the part the kernel places in
/// `fuse_uring_req_header.op_in`; 0 for operations whose arguments are names only.
pub fn arg_len(opcode: u32) -> usize {
    use opcode::*;
    match opcode {
        FORGET => 8,
        GETATTR => 16,
        SETATTR => 88,
        MKNOD => 16,
        MKDIR => 8,
        RENAME => 8,
        LINK => 8,
        OPEN | OPENDIR => 8,
        READ | READDIR | READDIRPLUS => 40,
        WRITE => 40,
        RELEASE | RELEASEDIR => 24,
        FSYNC | FSYNCDIR => 16,
        // FUSE_SETXATTR_EXT is not negotiated: the compat 8-byte struct.
        SETXATTR => 8,
        GETXATTR | LISTXATTR => 8,
        FLUSH => 24,
        ACCESS => 8,
        CREATE => 16,
        INTERRUPT => 8,
        BATCH_FORGET => 8,
        FALLOCATE => 32,
        RENAME2 => 16,
        LSEEK => 24,
        COPY_FILE_RANGE => 56,
        _ => 0,
    }
}

/// Smallest read buffer the kernel accepts on `/dev/fuse` (`FUSE_MIN_READ_BUFFER`).
pub const MIN_READ_BUFFER: usize = 8192;

/// The (node id, lookups) pairs of a BATCH_FORGET: `fuse_batch_forget_in` (count, padding) as
/// its fixed argument, then `count` × `fuse_forget_one` (node id, lookups) in the payload.
///
/// # Errors
/// [`WireError::Short`]: the argument or the entries are cut short.
pub fn batch_forgets<'a>(
    arg: &[u8],
    payload: &'a [u8],
) -> Result<impl Iterator<Item = (u64, u64)> + 'a, WireError> {
    let count = Reader(arg).u32()? as usize;
    if payload.len() < count.saturating_mul(16) {
        return Err(WireError::Short);
    }
    Ok(payload.chunks_exact(16).take(count).map(|one| {
        let mut r = Reader(one);
        (r.u64().unwrap_or(0), r.u64().unwrap_or(0))
    }))
}

/// Cut a whole `/dev/fuse` request into header, fixed argument and payload, as io_uring
/// delivers them.
pub fn split_dev_fuse(buf: &[u8]) -> Result<(InHeader, &[u8], &[u8]), WireError> {
    let h = InHeader::decode(buf)?;
    let end = (h.len as usize).min(buf.len());
    let body = buf.get(IN_HEADER_LEN..end).ok_or(WireError::Short)?;
    let n = arg_len(h.opcode).min(body.len());
    Ok((h, &body[..n], &body[n..]))
}

/// The `fuse_setattr_in` fields smithfs uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetattrIn {
    /// `FATTR_*` bits saying which fields are set.
    pub valid: u32,
    /// File handle (with `FATTR_FH`).
    pub fh: u64,
    /// New size.
    pub size: u64,
    /// New access time, seconds.
    pub atime: u64,
    /// New modification time, seconds.
    pub mtime: u64,
    /// New access time, nanoseconds.
    pub atimensec: u32,
    /// New modification time, nanoseconds.
    pub mtimensec: u32,
    /// New mode.
    pub mode: u32,
    /// New owner.
    pub uid: u32,
    /// New group.
    pub gid: u32,
}

/// A decoded request body: one variant per operation smithfs serves. Names borrow from the
/// transport's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Request<'a> {
    Lookup {
        name: &'a OsStr,
    },
    Forget {
        nlookup: u64,
    },
    Getattr {
        fh: Option<u64>,
    },
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    Mknod {
        mode: u32,
        rdev: u32,
        umask: u32,
        name: &'a OsStr,
    },
    Mkdir {
        mode: u32,
        umask: u32,
        name: &'a OsStr,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    /// RENAME (flags 0) and RENAME2.
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a OsStr,
        newname: &'a OsStr,
    },
    Link {
        oldnodeid: u64,
        newname: &'a OsStr,
    },
    Open {
        flags: u32,
    },
    Opendir {
        flags: u32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Readdirplus {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        write_flags: u32,
        data: &'a [u8],
    },
    Statfs,
    Release {
        fh: u64,
        flags: u32,
    },
    Releasedir {
        fh: u64,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Fsyncdir {
        fh: u64,
        datasync: bool,
    },
    Setxattr {
        flags: u32,
        name: &'a OsStr,
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a OsStr,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Flush {
        fh: u64,
    },
    Access {
        mask: u32,
    },
    Create {
        flags: u32,
        mode: u32,
        umask: u32,
        name: &'a OsStr,
    },
    Interrupt {
        unique: u64,
    },
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        fh: u64,
        offset: i64,
        whence: u32,
    },
    CopyFileRange {
        fh_in: u64,
        off_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    },
    Destroy,
    /// An opcode smithfs does not serve (answered ENOSYS).
    Other(u32),
}

impl<'a> Request<'a> {
    /// Decode the body of a request with `opcode` from its fixed argument `arg` and `payload`.
    pub fn decode(opcode: u32, arg: &'a [u8], payload: &'a [u8]) -> Result<Request<'a>, WireError> {
        use opcode::*;
        let mut a = Reader(arg);
        let mut p = Reader(payload);
        Ok(match opcode {
            LOOKUP => Request::Lookup { name: p.name()? },
            FORGET => Request::Forget { nlookup: a.u64()? },
            GETATTR => {
                let flags = a.u32()?;
                a.skip(4)?;
                let fh = a.u64()?;
                Request::Getattr {
                    fh: (flags & GETATTR_FH != 0).then_some(fh),
                }
            }
            SETATTR => {
                let valid = a.u32()?;
                a.skip(4)?;
                let fh = a.u64()?;
                let size = a.u64()?;
                a.skip(8)?; // lock_owner
                let atime = a.u64()?;
                let mtime = a.u64()?;
                a.skip(8)?; // ctime
                let atimensec = a.u32()?;
                let mtimensec = a.u32()?;
                a.skip(4)?; // ctimensec
                let mode = a.u32()?;
                a.skip(4)?;
                let uid = a.u32()?;
                let gid = a.u32()?;
                Request::Setattr(SetattrIn {
                    valid,
                    fh,
                    size,
                    atime,
                    mtime,
                    atimensec,
                    mtimensec,
                    mode,
                    uid,
                    gid,
                })
            }
            READLINK => Request::Readlink,
            SYMLINK => Request::Symlink {
                name: p.name()?,
                target: p.name()?,
            },
            MKNOD => {
                let mode = a.u32()?;
                let rdev = a.u32()?;
                let umask = a.u32()?;
                Request::Mknod {
                    mode,
                    rdev,
                    umask,
                    name: p.name()?,
                }
            }
            MKDIR => {
                let mode = a.u32()?;
                let umask = a.u32()?;
                Request::Mkdir {
                    mode,
                    umask,
                    name: p.name()?,
                }
            }
            UNLINK => Request::Unlink { name: p.name()? },
            RMDIR => Request::Rmdir { name: p.name()? },
            RENAME | RENAME2 => {
                let newdir = a.u64()?;
                let flags = if opcode == RENAME2 { a.u32()? } else { 0 };
                Request::Rename {
                    newdir,
                    flags,
                    name: p.name()?,
                    newname: p.name()?,
                }
            }
            LINK => Request::Link {
                oldnodeid: a.u64()?,
                newname: p.name()?,
            },
            OPEN => Request::Open { flags: a.u32()? },
            OPENDIR => Request::Opendir { flags: a.u32()? },
            READ | READDIR | READDIRPLUS => {
                let fh = a.u64()?;
                let offset = a.u64()?;
                let size = a.u32()?;
                match opcode {
                    READ => Request::Read { fh, offset, size },
                    READDIR => Request::Readdir { fh, offset, size },
                    _ => Request::Readdirplus { fh, offset, size },
                }
            }
            WRITE => {
                let fh = a.u64()?;
                let offset = a.u64()?;
                let size = a.u32()? as usize;
                let write_flags = a.u32()?;
                Request::Write {
                    fh,
                    offset,
                    write_flags,
                    data: p.bytes(size)?,
                }
            }
            STATFS => Request::Statfs,
            RELEASE | RELEASEDIR => {
                let fh = a.u64()?;
                let flags = a.u32()?;
                if opcode == RELEASE {
                    Request::Release { fh, flags }
                } else {
                    Request::Releasedir { fh }
                }
            }
            FSYNC | FSYNCDIR => {
                let fh = a.u64()?;
                let datasync = a.u32()? & FSYNC_FDATASYNC != 0;
                if opcode == FSYNC {
                    Request::Fsync { fh, datasync }
                } else {
                    Request::Fsyncdir { fh, datasync }
                }
            }
            SETXATTR => {
                let size = a.u32()? as usize;
                let flags = a.u32()?;
                let name = p.name()?;
                Request::Setxattr {
                    flags,
                    name,
                    value: p.bytes(size)?,
                }
            }
            GETXATTR => Request::Getxattr {
                size: a.u32()?,
                name: p.name()?,
            },
            LISTXATTR => Request::Listxattr { size: a.u32()? },
            REMOVEXATTR => Request::Removexattr { name: p.name()? },
            FLUSH => Request::Flush { fh: a.u64()? },
            ACCESS => Request::Access { mask: a.u32()? },
            CREATE => {
                let flags = a.u32()?;
                let mode = a.u32()?;
                let umask = a.u32()?;
                Request::Create {
                    flags,
                    mode,
                    umask,
                    name: p.name()?,
                }
            }
            INTERRUPT => Request::Interrupt { unique: a.u64()? },
            FALLOCATE => Request::Fallocate {
                fh: a.u64()?,
                offset: a.u64()?,
                length: a.u64()?,
                mode: a.u32()?,
            },
            LSEEK => Request::Lseek {
                fh: a.u64()?,
                offset: a.u64()? as i64,
                whence: a.u32()?,
            },
            COPY_FILE_RANGE => Request::CopyFileRange {
                fh_in: a.u64()?,
                off_in: a.u64()?,
                nodeid_out: a.u64()?,
                fh_out: a.u64()?,
                off_out: a.u64()?,
                len: a.u64()?,
            },
            DESTROY => Request::Destroy,
            other => Request::Other(other),
        })
    }
}

/// `struct fuse_attr`, as smithfs fills it from a backing `stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct FuseAttr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    /// Full `st_mode`: type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl FuseAttr {
    /// The mount's attributes from a `stat` whose `st_ino` is already the node id.
    pub fn from_stat(st: &libc::stat) -> FuseAttr {
        FuseAttr {
            ino: st.st_ino,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: st.st_atime as u64,
            mtime: st.st_mtime as u64,
            ctime: st.st_ctime as u64,
            atimensec: st.st_atime_nsec as u32,
            mtimensec: st.st_mtime_nsec as u32,
            ctimensec: st.st_ctime_nsec as u32,
            mode: st.st_mode,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
        }
    }

    fn put(&self, w: &mut Out<'_>) {
        for v in [
            self.ino,
            self.size,
            self.blocks,
            self.atime,
            self.mtime,
            self.ctime,
        ] {
            w.u64(v);
        }
        for v in [
            self.atimensec,
            self.mtimensec,
            self.ctimensec,
            self.mode,
            self.nlink,
            self.uid,
            self.gid,
            self.rdev,
            self.blksize,
            0,
        ] {
            w.u32(v);
        }
    }
}

/// `struct fuse_entry_out`: a node id and its attributes, each with a validity in the kernel's
/// cache (seconds + nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: FuseAttr,
}

/// A reply body under construction in a transport-owned buffer. Writes past the end are
/// dropped and flagged ([`Out::overflowed`]); callers size their buffers from the request
/// (`size` of READ/READDIR, at most the negotiated max_pages × 4 KiB).
#[derive(Debug)]
pub struct Out<'b> {
    buf: &'b mut [u8],
    len: usize,
    overflow: bool,
}

impl<'b> Out<'b> {
    /// An empty reply body over `buf`.
    pub fn new(buf: &'b mut [u8]) -> Out<'b> {
        Out {
            buf,
            len: 0,
            overflow: false,
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A write did not fit.
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Forget everything written (an error reply has no body).
    pub fn clear(&mut self) {
        self.len = 0;
        self.overflow = false;
    }

    /// The body written so far.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Room left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.len
    }

    /// Append raw bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        match self.buf.get_mut(self.len..self.len + b.len()) {
            Some(dst) => {
                dst.copy_from_slice(b);
                self.len += b.len();
            }
            None => self.overflow = true,
        }
    }

    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_ne_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_ne_bytes());
    }

    /// `fuse_entry_out`.
    pub fn entry(&mut self, e: &EntryOut) {
        self.u64(e.nodeid);
        self.u64(e.generation);
        self.u64(e.entry_valid);
        self.u64(e.attr_valid);
        self.u32(e.entry_valid_nsec);
        self.u32(e.attr_valid_nsec);
        e.attr.put(self);
    }

    /// `fuse_attr_out` with a validity of `valid` seconds + `nsec`.
    pub fn attr(&mut self, valid: u64, nsec: u32, a: &FuseAttr) {
        self.u64(valid);
        self.u32(nsec);
        self.u32(0);
        a.put(self);
    }

    /// `fuse_open_out`.
    pub fn open(&mut self, fh: u64, open_flags: u32, backing_id: u32) {
        self.u64(fh);
        self.u32(open_flags);
        self.u32(backing_id);
    }

    /// `fuse_write_out` (WRITE, COPY_FILE_RANGE).
    pub fn write(&mut self, size: u32) {
        self.u32(size);
        self.u32(0);
    }

    /// `fuse_getxattr_out` (the size probe of GETXATTR/LISTXATTR).
    pub fn xattr_size(&mut self, size: u32) {
        self.u32(size);
        self.u32(0);
    }

    /// `fuse_lseek_out`.
    pub fn lseek(&mut self, offset: i64) {
        self.u64(offset as u64);
    }

    /// `fuse_statfs_out` from a `statvfs`.
    pub fn statfs(&mut self, s: &libc::statvfs) {
        for v in [s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree] {
            self.u64(v);
        }
        self.u32(s.f_bsize as u32);
        self.u32(s.f_namemax as u32);
        self.u32(s.f_frsize as u32);
        for _ in 0..7 {
            self.u32(0);
        }
    }

    /// Append one `fuse_dirent` (padded to 8 bytes) unless it would not fit in `limit` bytes of
    /// body; returns `true` when the reply is full (the entry was not added), as readdir expects.
    pub fn dirent(&mut self, limit: usize, ino: u64, off: u64, kind: u32, name: &[u8]) -> bool {
        let need = dirent_size(name.len());
        if self.len + need > limit.min(self.buf.len()) {
            return true;
        }
        self.put_dirent(ino, off, kind, name);
        false
    }

    /// Append one `fuse_direntplus` (entry + dirent) unless it would not fit; `true` when full.
    pub fn direntplus(&mut self, limit: usize, e: &EntryOut, off: u64, name: &[u8]) -> bool {
        let need = ENTRY_OUT_LEN + dirent_size(name.len());
        if self.len + need > limit.min(self.buf.len()) {
            return true;
        }
        self.entry(e);
        self.put_dirent(e.nodeid, off, e.attr.mode, name);
        false
    }

    fn put_dirent(&mut self, ino: u64, off: u64, mode: u32, name: &[u8]) {
        self.u64(ino);
        self.u64(off);
        self.u32(name.len() as u32);
        self.u32((mode & libc::S_IFMT) >> 12);
        self.bytes(name);
        let pad = dirent_size(name.len()) - DIRENT_LEN - name.len();
        self.bytes(&[0u8; 8][..pad]);
    }
}

/// Size of a `fuse_dirent` with a name of `namelen` bytes, padded to 8.
pub fn dirent_size(namelen: usize) -> usize {
    (DIRENT_LEN + namelen + 7) & !7
}

/// Encode a `fuse_out_header` for `unique` with `error` (0 or a negative errno) and a body of
/// `body_len` bytes.
pub fn out_header(unique: u64, error: i32, body_len: usize) -> [u8; OUT_HEADER_LEN] {
    let mut h = [0u8; OUT_HEADER_LEN];
    h[0..4].copy_from_slice(&((OUT_HEADER_LEN + body_len) as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// A cursor over request bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Short);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn skip(&mut self, n: usize) -> Result<(), WireError> {
        self.bytes(n).map(|_| ())
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        let b = self.bytes(2)?;
        Ok(u16::from_ne_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.bytes(4)?;
        Ok(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_ne_bytes(a))
    }

    /// A NUL-terminated name (the NUL is consumed, not returned).
    fn name(&mut self) -> Result<&'a OsStr, WireError> {
        let end = self
            .0
            .iter()
            .position(|&c| c == 0)
            .ok_or(WireError::Unterminated)?;
        let name = &self.0[..end];
        self.0 = &self.0[end + 1..];
        Ok(OsStr::from_bytes(name))
    }
}

#[cfg(test)]
pub mod testing;

#[cfg(test)]
mod tests {
    use super::testing::{decode_dirents, Dirent};
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(1u8..=255, 1..40)
    }

    fn os(v: &[u8]) -> &OsStr {
        OsStr::from_bytes(v)
    }

    /// Requests with owned names, turned into borrowed [`Request`]s by `with`.
    #[derive(Debug, Clone)]
    struct Owned {
        kind: u8,
        n: [u64; 6],
        a: Vec<u8>,
        b: Vec<u8>,
        flag: bool,
    }

    fn owned() -> impl Strategy<Value = Owned> {
        (
            0u8..36,
            proptest::array::uniform6(any::<u64>()),
            name(),
            name(),
            any::<bool>(),
        )
            .prop_map(|(kind, n, a, b, flag)| Owned {
                kind,
                n,
                a,
                b,
                flag,
            })
    }

    fn with(o: &Owned) -> Request<'_> {
        let [x, y, z, u, v, w] = o.n;
        let (a, b) = (os(&o.a), os(&o.b));
        let s = |v: u64| v as u32;
        match o.kind {
            0 => Request::Lookup { name: a },
            1 => Request::Forget { nlookup: x },
            2 => Request::Getattr {
                fh: o.flag.then_some(x),
            },
            3 => Request::Setattr(SetattrIn {
                valid: s(x),
                fh: y,
                size: z,
                atime: u,
                mtime: v,
                atimensec: s(w),
                mtimensec: s(x >> 32),
                mode: s(y >> 32),
                uid: s(z >> 32),
                gid: s(u >> 32),
            }),
            4 => Request::Readlink,
            5 => Request::Symlink { name: a, target: b },
            6 => Request::Mknod {
                mode: s(x),
                rdev: s(y),
                umask: s(z),
                name: a,
            },
            7 => Request::Mkdir {
                mode: s(x),
                umask: s(y),
                name: a,
            },
            8 => Request::Unlink { name: a },
            9 => Request::Rmdir { name: a },
            10 => Request::Rename {
                newdir: x,
                flags: if o.flag { s(y) } else { 0 },
                name: a,
                newname: b,
            },
            11 => Request::Link {
                oldnodeid: x,
                newname: b,
            },
            12 => Request::Open { flags: s(x) },
            13 => Request::Opendir { flags: s(x) },
            14 => Request::Read {
                fh: x,
                offset: y,
                size: s(z),
            },
            15 => Request::Readdir {
                fh: x,
                offset: y,
                size: s(z),
            },
            16 => Request::Readdirplus {
                fh: x,
                offset: y,
                size: s(z),
            },
            17 => Request::Write {
                fh: x,
                offset: y,
                write_flags: s(z),
                data: &o.b,
            },
            18 => Request::Statfs,
            19 => Request::Release { fh: x, flags: s(y) },
            20 => Request::Releasedir { fh: x },
            21 => Request::Fsync {
                fh: x,
                datasync: o.flag,
            },
            22 => Request::Fsyncdir {
                fh: x,
                datasync: o.flag,
            },
            23 => Request::Setxattr {
                flags: s(x),
                name: a,
                value: &o.b,
            },
            24 => Request::Getxattr {
                size: s(x),
                name: a,
            },
            25 => Request::Listxattr { size: s(x) },
            26 => Request::Removexattr { name: a },
            27 => Request::Flush { fh: x },
            28 => Request::Access { mask: s(x) },
            29 => Request::Create {
                flags: s(x),
                mode: s(y),
                umask: s(z),
                name: a,
            },
            30 => Request::Interrupt { unique: x },
            31 => Request::Fallocate {
                fh: x,
                offset: y,
                length: z,
                mode: s(u),
            },
            32 => Request::Lseek {
                fh: x,
                offset: y as i64,
                whence: s(z),
            },
            33 => Request::CopyFileRange {
                fh_in: x,
                off_in: y,
                nodeid_out: z,
                fh_out: u,
                off_out: v,
                len: w,
            },
            34 => Request::Destroy,
            _ => Request::Other(1000 + s(x) % 1000),
        }
    }

    proptest! {
        /// decode(encode(r)) == r, with the io_uring split (fixed argument apart from the
        /// payload) and with the contiguous /dev/fuse framing.
        #[test]
        fn request_round_trip(o in owned(), unique in any::<u64>(), nodeid in any::<u64>(),
                              pid in any::<u32>()) {
            let r = with(&o);
            let (op, arg, payload) = r.encode();
            prop_assert_eq!(arg.len(), arg_len(op), "fixed argument size of opcode {}", op);
            prop_assert_eq!(&Request::decode(op, &arg, &payload).unwrap(), &r);
            let h = InHeader {
                len: (IN_HEADER_LEN + arg.len() + payload.len()) as u32,
                opcode: op,
                unique,
                nodeid,
                uid: 1,
                gid: 2,
                pid,
                total_extlen: 0,
            };
            let mut buf = h.encode().to_vec();
            buf.extend_from_slice(&arg);
            buf.extend_from_slice(&payload);
            let (h2, a2, p2) = split_dev_fuse(&buf).unwrap();
            prop_assert_eq!(h2, h);
            prop_assert_eq!(&Request::decode(op, a2, p2).unwrap(), &r);
        }

        /// Truncated input is an error, never a panic.
        #[test]
        fn truncated_requests_fail_cleanly(o in owned(), cut in any::<prop::sample::Index>()) {
            let (op, arg, payload) = with(&o).encode();
            let mut all = arg.clone();
            all.extend_from_slice(&payload);
            let at = cut.index(all.len().max(1));
            let (a, p) = if at < arg.len() { (&all[..at], &[][..]) } else { (&arg[..], &payload[..at - arg.len()]) };
            let _ = Request::decode(op, a, p);
        }

        /// Garbage never panics the decoder.
        #[test]
        fn garbage_never_panics(op in 0u32..60, a in proptest::collection::vec(any::<u8>(), 0..100),
                                p in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = Request::decode(op, &a, &p);
            let _ = split_dev_fuse(&a);
        }

        /// entry_out encodes to its ABI size and decodes back.
        #[test]
        fn entry_round_trip(n in proptest::array::uniform8(any::<u64>()), m in proptest::array::uniform8(any::<u32>())) {
            let e = EntryOut {
                nodeid: n[0], generation: n[1], entry_valid: n[2], attr_valid: n[3],
                entry_valid_nsec: m[0], attr_valid_nsec: m[1],
                attr: FuseAttr {
                    ino: n[4], size: n[5], blocks: n[6], atime: n[7], mtime: n[0] ^ 1, ctime: n[1] ^ 1,
                    atimensec: m[2], mtimensec: m[3], ctimensec: m[4], mode: m[5], nlink: m[6],
                    uid: m[7], gid: m[0] ^ 1, rdev: m[1] ^ 1, blksize: m[2] ^ 1,
                },
            };
            let mut buf = [0u8; 256];
            let mut out = Out::new(&mut buf);
            out.entry(&e);
            prop_assert_eq!(out.len(), ENTRY_OUT_LEN);
            prop_assert_eq!(EntryOut::decode(out.as_slice()).unwrap(), e);
        }

        /// Directory entries are 8-byte aligned, stop at the limit, and decode back.
        #[test]
        fn dirents_round_trip(names in proptest::collection::vec(name(), 0..30), limit in 0usize..2048) {
            let mut buf = vec![0u8; 4096];
            let mut out = Out::new(&mut buf);
            let mut added = Vec::new();
            for (i, n) in names.iter().enumerate() {
                if out.dirent(limit, i as u64 + 7, i as u64 + 1, libc::S_IFREG, n) {
                    break;
                }
                added.push(Dirent { ino: i as u64 + 7, off: i as u64 + 1, typ: libc::DT_REG as u32, name: n.clone() });
            }
            prop_assert!(out.len() <= limit);
            prop_assert_eq!(out.len() % 8, 0);
            prop_assert_eq!(decode_dirents(out.as_slice()).unwrap(), added);
        }
    }

    #[test]
    fn fixed_sizes_match_the_abi() {
        let mut buf = [0u8; 256];
        let mut out = Out::new(&mut buf);
        out.attr(1, 2, &FuseAttr::default());
        assert_eq!(out.len(), ATTR_OUT_LEN);
        out.clear();
        out.open(1, 2, 3);
        assert_eq!(out.len(), OPEN_OUT_LEN);
        out.clear();
        // SAFETY: an all-zero statvfs is a valid value.
        let s: libc::statvfs = unsafe { std::mem::zeroed() };
        out.statfs(&s);
        assert_eq!(out.len(), 80, "fuse_statfs_out");
        assert_eq!(out_header(9, -2, 8)[0..4], 24u32.to_ne_bytes());
    }

    #[test]
    fn overflow_is_flagged_not_written() {
        let mut buf = [0u8; 10];
        let mut out = Out::new(&mut buf);
        out.open(1, 2, 3);
        assert!(out.overflowed());
        assert!(out.len() <= 10);
    }
}
