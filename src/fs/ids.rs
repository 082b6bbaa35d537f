//! The numbers the filesystem deals in, one type per meaning:
//!
//! - [`NodeId`]: the number the kernel names an inode by (FUSE `nodeid`, the mount's `st_ino`);
//! - [`BackingIno`]: an inode number of the backing store (its `st_ino`; defined by the store
//!   layer, `crate::backing`), from which node ids are made by [`crate::fs::inode::IdMap`];
//! - [`Fh`]: the number of an open file or directory given to the kernel (FUSE `fh`), which
//!   names one of our [`crate::fs::open::OpenFile`] / [`crate::fs::open::OpenDir`] records.
//!
//! A kernel *file handle* (`name_to_handle_at`, to reopen an inode without a descriptor) is yet
//! another thing: [`crate::backing::KernelFileHandle`].

use std::fmt;

/// A FUSE node id: the number the kernel names an inode by in requests, and shows as `st_ino`
/// through the mount. Node ids are backing inode numbers except for the root (see
/// [`crate::fs::inode::IdMap`]) and the virtual control files (`crate::fs::control`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u64);

impl NodeId {
    /// The mount's root (`FUSE_ROOT_ID`, 1).
    pub const ROOT: NodeId = NodeId(1);
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

pub use crate::backing::BackingIno;

/// The number of an open file, directory or control file as the kernel holds it (FUSE `fh`),
/// given out by a [`crate::fs::open::OpenTable`] at open and returned at release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fh(pub u64);

impl fmt::Display for Fh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
