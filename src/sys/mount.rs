//! The mount table as smithfs reads it (`/proc/self/mountinfo`): what is mounted at a
//! directory, and the filesystem type a smithfs mount has.

use std::path::Path;

use super::procfs::{self, MountInfo};

/// The filesystem type every smithfs mount has in `/proc/self/mountinfo` (`findmnt -t`): the
/// one spelling of `fuse.smithfs`.
pub const FS_TYPE: &str = "fuse.smithfs";

/// A smithfs mount's source (`fsname`) and FUSE subtype: [`FS_TYPE`] is `fuse.` + it.
pub const FS_NAME: &str = "smithfs";

/// The mounts of this process (`/proc/self/mountinfo`); empty if it cannot be read or parsed.
pub fn mounts() -> Vec<MountInfo> {
    std::fs::read("/proc/self/mountinfo")
        .ok()
        .and_then(|b| procfs::parse_mountinfo(&b).ok())
        .unwrap_or_default()
}

/// The filesystem type mounted at exactly `dir` (the topmost mount there), if any:
/// [`FS_TYPE`] for a smithfs mount ([`MountInfo::is_smithfs`]), else the type mountinfo gives.
pub fn mounted_fs_type(dir: &Path) -> Option<String> {
    mounts()
        .into_iter()
        .rev()
        .find(|m| m.mount_point == dir)
        .map(|m| {
            if m.is_smithfs() {
                FS_TYPE.to_owned()
            } else {
                m.fs_type
            }
        })
}
