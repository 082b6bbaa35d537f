//! The other direction of the codec, for the tests only (not compiled into the daemon): requests
//! encoded as the kernel would send them, and replies decoded as the kernel would read them, so
//! that the property tests can check `Request::decode` and `Out` against their inverses.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::*;

impl InHeader {
    /// Encode into 40 bytes (tests and the `/dev/fuse` framing).
    pub fn encode(&self) -> [u8; IN_HEADER_LEN] {
        let mut w = Vec::with_capacity(IN_HEADER_LEN);
        put32(&mut w, self.len);
        put32(&mut w, self.opcode);
        put64(&mut w, self.unique);
        put64(&mut w, self.nodeid);
        put32(&mut w, self.uid);
        put32(&mut w, self.gid);
        put32(&mut w, self.pid);
        w.extend_from_slice(&self.total_extlen.to_ne_bytes());
        w.extend_from_slice(&[0, 0]);
        let mut out = [0u8; IN_HEADER_LEN];
        out.copy_from_slice(&w);
        out
    }
}

impl Request<'_> {
    /// Encode as the kernel would: `(opcode, fixed argument, payload)`. The inverse of
    /// [`Request::decode`]; used by the property tests and by the test harness that feeds
    /// requests to the dispatcher.
    pub fn encode(&self) -> (u32, Vec<u8>, Vec<u8>) {
        use opcode::*;
        let mut a = Vec::new();
        let mut p = Vec::new();
        let op = match self {
            Request::Lookup { name } => {
                put_name(&mut p, name);
                LOOKUP
            }
            Request::Forget { nlookup } => {
                put64(&mut a, *nlookup);
                FORGET
            }
            Request::Getattr { fh } => {
                put32(&mut a, if fh.is_some() { GETATTR_FH } else { 0 });
                put32(&mut a, 0);
                put64(&mut a, fh.unwrap_or(0));
                GETATTR
            }
            Request::Setattr(s) => {
                put32(&mut a, s.valid);
                put32(&mut a, 0);
                put64(&mut a, s.fh);
                put64(&mut a, s.size);
                put64(&mut a, 0);
                put64(&mut a, s.atime);
                put64(&mut a, s.mtime);
                put64(&mut a, 0);
                put32(&mut a, s.atimensec);
                put32(&mut a, s.mtimensec);
                put32(&mut a, 0);
                put32(&mut a, s.mode);
                put32(&mut a, 0);
                put32(&mut a, s.uid);
                put32(&mut a, s.gid);
                put32(&mut a, 0);
                SETATTR
            }
            Request::Readlink => READLINK,
            Request::Symlink { name, target } => {
                put_name(&mut p, name);
                put_name(&mut p, target);
                SYMLINK
            }
            Request::Mknod {
                mode,
                rdev,
                umask,
                name,
            } => {
                put32(&mut a, *mode);
                put32(&mut a, *rdev);
                put32(&mut a, *umask);
                put32(&mut a, 0);
                put_name(&mut p, name);
                MKNOD
            }
            Request::Mkdir { mode, umask, name } => {
                put32(&mut a, *mode);
                put32(&mut a, *umask);
                put_name(&mut p, name);
                MKDIR
            }
            Request::Unlink { name } => {
                put_name(&mut p, name);
                UNLINK
            }
            Request::Rmdir { name } => {
                put_name(&mut p, name);
                RMDIR
            }
            Request::Rename {
                newdir,
                flags,
                name,
                newname,
            } => {
                put64(&mut a, *newdir);
                put_name(&mut p, name);
                put_name(&mut p, newname);
                if *flags == 0 {
                    RENAME
                } else {
                    put32(&mut a, *flags);
                    put32(&mut a, 0);
                    RENAME2
                }
            }
            Request::Link { oldnodeid, newname } => {
                put64(&mut a, *oldnodeid);
                put_name(&mut p, newname);
                LINK
            }
            Request::Open { flags } | Request::Opendir { flags } => {
                put32(&mut a, *flags);
                put32(&mut a, 0);
                if matches!(self, Request::Open { .. }) {
                    OPEN
                } else {
                    OPENDIR
                }
            }
            Request::Read { fh, offset, size }
            | Request::Readdir { fh, offset, size }
            | Request::Readdirplus { fh, offset, size } => {
                put64(&mut a, *fh);
                put64(&mut a, *offset);
                put32(&mut a, *size);
                put32(&mut a, 0);
                put64(&mut a, 0);
                put32(&mut a, 0);
                put32(&mut a, 0);
                match self {
                    Request::Read { .. } => READ,
                    Request::Readdir { .. } => READDIR,
                    _ => READDIRPLUS,
                }
            }
            Request::Write {
                fh,
                offset,
                write_flags,
                data,
            } => {
                put64(&mut a, *fh);
                put64(&mut a, *offset);
                put32(&mut a, data.len() as u32);
                put32(&mut a, *write_flags);
                put64(&mut a, 0);
                put32(&mut a, 0);
                put32(&mut a, 0);
                p.extend_from_slice(data);
                WRITE
            }
            Request::Statfs => STATFS,
            Request::Release { fh, flags } => {
                put64(&mut a, *fh);
                put32(&mut a, *flags);
                put32(&mut a, 0);
                put64(&mut a, 0);
                RELEASE
            }
            Request::Releasedir { fh } => {
                put64(&mut a, *fh);
                put32(&mut a, 0);
                put32(&mut a, 0);
                put64(&mut a, 0);
                RELEASEDIR
            }
            Request::Fsync { fh, datasync } | Request::Fsyncdir { fh, datasync } => {
                put64(&mut a, *fh);
                put32(&mut a, if *datasync { FSYNC_FDATASYNC } else { 0 });
                put32(&mut a, 0);
                if matches!(self, Request::Fsync { .. }) {
                    FSYNC
                } else {
                    FSYNCDIR
                }
            }
            Request::Setxattr { flags, name, value } => {
                put32(&mut a, value.len() as u32);
                put32(&mut a, *flags);
                put_name(&mut p, name);
                p.extend_from_slice(value);
                SETXATTR
            }
            Request::Getxattr { size, name } => {
                put32(&mut a, *size);
                put32(&mut a, 0);
                put_name(&mut p, name);
                GETXATTR
            }
            Request::Listxattr { size } => {
                put32(&mut a, *size);
                put32(&mut a, 0);
                LISTXATTR
            }
            Request::Removexattr { name } => {
                put_name(&mut p, name);
                REMOVEXATTR
            }
            Request::Flush { fh } => {
                put64(&mut a, *fh);
                put32(&mut a, 0);
                put32(&mut a, 0);
                put64(&mut a, 0);
                FLUSH
            }
            Request::Access { mask } => {
                put32(&mut a, *mask);
                put32(&mut a, 0);
                ACCESS
            }
            Request::Create {
                flags,
                mode,
                umask,
                name,
            } => {
                put32(&mut a, *flags);
                put32(&mut a, *mode);
                put32(&mut a, *umask);
                put32(&mut a, 0);
                put_name(&mut p, name);
                CREATE
            }
            Request::Interrupt { unique } => {
                put64(&mut a, *unique);
                INTERRUPT
            }
            Request::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => {
                put64(&mut a, *fh);
                put64(&mut a, *offset);
                put64(&mut a, *length);
                put32(&mut a, *mode);
                put32(&mut a, 0);
                FALLOCATE
            }
            Request::Lseek { fh, offset, whence } => {
                put64(&mut a, *fh);
                put64(&mut a, *offset as u64);
                put32(&mut a, *whence);
                put32(&mut a, 0);
                LSEEK
            }
            Request::CopyFileRange {
                fh_in,
                off_in,
                nodeid_out,
                fh_out,
                off_out,
                len,
            } => {
                for v in [*fh_in, *off_in, *nodeid_out, *fh_out, *off_out, *len, 0] {
                    put64(&mut a, v);
                }
                COPY_FILE_RANGE
            }
            Request::Destroy => DESTROY,
            Request::Other(op) => *op,
        };
        (op, a, p)
    }
}

impl FuseAttr {
    pub(super) fn get(r: &mut Reader<'_>) -> Result<FuseAttr, WireError> {
        let a = FuseAttr {
            ino: r.u64()?,
            size: r.u64()?,
            blocks: r.u64()?,
            atime: r.u64()?,
            mtime: r.u64()?,
            ctime: r.u64()?,
            atimensec: r.u32()?,
            mtimensec: r.u32()?,
            ctimensec: r.u32()?,
            mode: r.u32()?,
            nlink: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            rdev: r.u32()?,
            blksize: r.u32()?,
        };
        r.skip(4)?;
        Ok(a)
    }
}

impl EntryOut {
    /// Decode (tests).
    pub fn decode(b: &[u8]) -> Result<EntryOut, WireError> {
        let mut r = Reader(b);
        Ok(EntryOut {
            nodeid: r.u64()?,
            generation: r.u64()?,
            entry_valid: r.u64()?,
            attr_valid: r.u64()?,
            entry_valid_nsec: r.u32()?,
            attr_valid_nsec: r.u32()?,
            attr: FuseAttr::get(&mut r)?,
        })
    }
}

/// One entry of a READDIR reply, decoded (tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirent {
    /// Inode number.
    pub ino: u64,
    /// Cookie of the next entry.
    pub off: u64,
    /// `DT_*` type.
    pub typ: u32,
    /// Name bytes.
    pub name: Vec<u8>,
}

/// Decode a READDIR reply body (tests).
pub fn decode_dirents(mut b: &[u8]) -> Result<Vec<Dirent>, WireError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let mut r = Reader(b);
        let ino = r.u64()?;
        let off = r.u64()?;
        let namelen = r.u32()? as usize;
        let typ = r.u32()?;
        let name = r.bytes(namelen)?.to_vec();
        out.push(Dirent {
            ino,
            off,
            typ,
            name,
        });
        b = b.get(dirent_size(namelen)..).ok_or(WireError::Short)?;
    }
    Ok(out)
}

fn put32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_ne_bytes());
}

fn put64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_ne_bytes());
}

fn put_name(w: &mut Vec<u8>, name: &OsStr) {
    w.extend_from_slice(name.as_bytes());
    w.push(0);
}
