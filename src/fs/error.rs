//! The filesystem's one error type and its errno table (STYLE.md habit 3).

use nix::errno::Errno;

/// Why a filesystem operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The backing store refused: its errno is echoed unchanged.
    #[error("backing store: {0}")]
    Backing(#[from] Errno),
    /// The access policy refused (PROTOCOL.md §3); the reason is recorded for `.smithfs/why`.
    #[error("denied: {0}")]
    Denied(Errno),
    /// The inode or handle number is not known (the kernel raced a forget or release).
    #[error("stale inode or handle")]
    Stale,
    /// A name the mount never shows (`.smithfs-state` at the root) or a reserved one.
    #[error("reserved name")]
    Reserved(Errno),
}

impl FsError {
    /// The errno to reply with.
    pub fn errno(&self) -> Errno {
        match self {
            FsError::Backing(e) => *e,
            FsError::Denied(e) => *e,
            FsError::Stale => Errno::ESTALE,
            FsError::Reserved(e) => *e,
        }
    }
}

/// Result of a filesystem operation.
pub type FsResult<T> = Result<T, FsError>;
