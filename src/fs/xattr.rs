//! Extended attributes: set, get, list, remove.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use super::error::{FsError, FsResult};
use super::ids::NodeId;
use super::{backing, control, Caller, SmithFs};
use crate::identity::Identity;
use crate::policy::Op;

impl SmithFs {
    /// Set an extended attribute (FUSE setxattr), judged by the caller. Charged like a write
    /// (docs/SPEC.md §8, docs/PROTOCOL-NOTES.md L18): admitted on the value's length rounded up
    /// to a block (a value may take one), settled on the inode's `st_blocks` after.
    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: NodeId,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        if control::is_virtual(ino) {
            return Err(FsError::ControlFixed);
        }
        let inode = self.inodes.get(ino)?;
        let who = self.identify(caller);
        self.check_inode(caller, who, Op::Write, "setxattr", &inode)?;
        let cname = xattr_name(name)?;
        refuse_privileged(who, name)?;
        let zone = self.zone(&inode);
        let adds = (value.len() as u64).saturating_add(4095) & !4095;
        self.admit_storage(caller, who, &zone, adds, 0, "setxattr", || {
            self.path_of(&inode)
        })?;
        let fd = inode.fd()?;
        let done = backing::setxattr(fd.as_fd(), &cname, value, flags);
        self.settle_fd(fd.as_fd());
        Ok(done?)
    }

    /// Get an extended attribute (FUSE getxattr): with `size == 0`, its size.
    pub fn getxattr(
        &self,
        caller: &Caller,
        ino: NodeId,
        name: &OsStr,
        size: u32,
    ) -> FsResult<XattrReply> {
        if control::is_virtual(ino) {
            return Err(FsError::NoSuchXattr);
        }
        let inode = self.inodes.get(ino)?;
        self.check_inode(caller, self.identify(caller), Op::Read, "getxattr", &inode)?;
        let cname = xattr_name(name)?;
        let fd = inode.fd()?;
        xattr_reply(size, |buf| backing::getxattr(fd.as_fd(), &cname, buf))
    }

    /// List extended attribute names (FUSE listxattr).
    pub fn listxattr(&self, caller: &Caller, ino: NodeId, size: u32) -> FsResult<XattrReply> {
        if control::is_virtual(ino) {
            return Ok(XattrReply::Size(0));
        }
        let inode = self.inodes.get(ino)?;
        self.check_inode(caller, self.identify(caller), Op::Read, "listxattr", &inode)?;
        let fd = inode.fd()?;
        xattr_reply(size, |buf| backing::listxattr(fd.as_fd(), buf))
    }

    /// Remove an extended attribute (FUSE removexattr).
    pub fn removexattr(&self, caller: &Caller, ino: NodeId, name: &OsStr) -> FsResult<()> {
        if control::is_virtual(ino) {
            return Err(FsError::ControlFixed);
        }
        let inode = self.inodes.get(ino)?;
        let who = self.identify(caller);
        self.check_inode(caller, who, Op::Write, "removexattr", &inode)?;
        let cname = xattr_name(name)?;
        refuse_privileged(who, name)?;
        let fd = inode.fd()?;
        let done = backing::removexattr(fd.as_fd(), &cname);
        self.settle_fd(fd.as_fd());
        Ok(done?)
    }
}

/// Namespaces of extended attributes that only a process with capabilities may change
/// (`xattr_permission` and the capability checks of the kernel).
const PRIVILEGED_XATTRS: [&[u8]; 2] = [b"security.", b"trusted."];

/// POSIX ACLs: the mount does not offer them (no `FUSE_POSIX_ACL`), so a local kernel answers
/// EOPNOTSUPP itself and never sends them.
const ACL_XATTRS: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

/// Refuse a change of `name` that no local kernel would send for `who` (docs/PROTOCOL-NOTES.md
/// XT26): [`FsError::PrivilegedXattr`] when a smith changes it in a [`PRIVILEGED_XATTRS`]
/// namespace (the operator's kernel judges the operator), [`FsError::AclUnsupported`] for an
/// ACL ([`ACL_XATTRS`]), from anyone.
fn refuse_privileged(who: Identity, name: &OsStr) -> FsResult<()> {
    if ACL_XATTRS.contains(&name.as_bytes()) {
        return Err(FsError::AclUnsupported);
    }
    let privileged = PRIVILEGED_XATTRS
        .iter()
        .any(|ns| name.as_bytes().starts_with(ns));
    if privileged && who != Identity::Operator {
        return Err(FsError::PrivilegedXattr);
    }
    Ok(())
}

/// Reply to a getxattr/listxattr: the needed size (when asked with size 0) or the data.
#[derive(Debug)]
pub enum XattrReply {
    /// The value's size in bytes.
    Size(u32),
    /// The value.
    Data(Vec<u8>),
}

pub(super) fn xattr_reply(
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

pub(super) fn xattr_name(name: &OsStr) -> FsResult<std::ffi::CString> {
    std::ffi::CString::new(name.as_bytes()).map_err(|_| FsError::BadName)
}
