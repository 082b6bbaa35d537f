//! The filesystem's one error type and its errno table (STYLE.md habit 3): every errno the
//! daemon chooses itself is a named variant, mapped once in [`FsError::errno`];
//! [`FsError::Backing`] carries only what a system call on the backing store returned.

use nix::errno::Errno;

/// Why a filesystem operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The backing store refused: the system call's errno, echoed unchanged.
    #[error("backing store: {0}")]
    Backing(#[from] Errno),
    /// The access policy refused (docs/SPEC.md §3); the errno is the rule's
    /// (`policy::Rule::errno`) and the reason is recorded for `.smithfs/why`.
    #[error("denied: {0}")]
    Denied(Errno),
    /// The inode or handle number is not known (the kernel raced a forget or release): ESTALE.
    #[error("stale inode or handle")]
    Stale,
    /// A name the mount never shows (`.smithfs-state` at the root, the daemon's temporary
    /// names): ENOENT.
    #[error("no such entry (a name the mount never shows)")]
    Hidden,
    /// A change to `.smithfs/` or a reserved name, refused by `policy::reserved_name` and
    /// recorded: its errno.
    #[error("reserved name: {0}")]
    Reserved(Errno),
    /// A write, fallocate or copy into a handle not opened for writing: EBADF.
    #[error("not open for writing")]
    NotOpenForWriting,
    /// A write to a control file other than `ctl`: EBADF.
    #[error("the control file is not ctl")]
    NotCtl,
    /// An entry of that name already exists: EEXIST.
    #[error("exists")]
    Exists,
    /// A name or `ctl` text the daemon cannot take (a NUL byte, not UTF-8): EINVAL.
    #[error("bad name or text")]
    BadName,
    /// The smith a request names is not registered (a race with its removal): ENOENT.
    #[error("unknown smith")]
    UnknownSmith,
    /// The scaffold of a new child failed (its templates do not render): EIO, logged at error.
    #[error("scaffold failed")]
    Scaffold,
    /// `.smithfs/` has no file of that name: ENOENT.
    #[error("no such control file")]
    NoSuchControlFile,
    /// `.smithfs/` itself opened as a file: EISDIR.
    #[error("the control directory is a directory")]
    ControlIsDir,
    /// Attributes or extended attributes of `.smithfs/` changed: EPERM.
    #[error("control files have fixed attributes")]
    ControlFixed,
    /// `.smithfs/` listed by a process of unknown identity (docs/SPEC.md §7): EACCES.
    #[error("control directory closed to unknown processes")]
    ControlUnknown,
    /// The control files carry no extended attributes: ENODATA.
    #[error("no such extended attribute")]
    NoSuchXattr,
    /// A request from a uid other than the mount's owner, on a mount that lets only its owner
    /// in (what `allow_other` leaves to the daemon; libfuse's default), on every transport: EACCES.
    #[error("only the mount's owner may use it")]
    NotOwner,
    /// A FUSE operation smithfs does not implement: ENOSYS (the kernel then stops sending it).
    #[error("operation not implemented")]
    Unimplemented,
    /// A FUSE request the io_uring codec cannot decode: EIO, logged as a warning.
    #[error("undecodable FUSE request")]
    BadRequest,
    /// The reply does not fit the request's buffer, or its handler panicked: EIO, logged at
    /// error (the daemon's own fault).
    #[error("the reply could not be made")]
    ReplyFailed,
    /// `--transport io-uring` asked for, but the kernel does not offer FUSE over io_uring: the
    /// INIT fails with EPROTONOSUPPORT and the mount with it.
    #[error("the kernel does not offer FUSE over io_uring")]
    NoUring,
    /// `lseek` with `SEEK_DATA`/`SEEK_HOLE` at or past the end of a control file: ENXIO, as
    /// lseek(2) answers for a regular file.
    #[error("seek past the end of the control file")]
    SeekPastEnd,
    /// `lseek` on a control file with a `whence` it does not take: EINVAL, as lseek(2).
    #[error("unknown lseek whence")]
    BadWhence,
    /// A remote connection named a node id it was never given (docs/SPEC.md §13): ESTALE,
    /// decided by the connection before the filesystem sees the request.
    #[error("node id not held by this connection")]
    NodeNotHeld,
    /// OPEN of a FIFO, socket or device node, or a CREATE that found one under its name: ENXIO
    /// (what the kernel answers for a socket, and for a FIFO with no partner opened
    /// `O_NONBLOCK`). A kernel opens those itself and never sends either; the daemon never opens
    /// one, since opening a FIFO blocks until a partner comes (docs/PROTOCOL-NOTES.md R51).
    #[error("a FIFO, socket or device node is never opened by the daemon")]
    SpecialFile,
    /// A truncate (SETATTR with a size) of something that is neither a regular file nor a
    /// directory: EINVAL, as truncate(2) answers.
    #[error("only a regular file is truncated")]
    NotTruncatable,
    /// A remote connection named a file handle it does not hold (another connection's, or one
    /// it released; docs/SPEC.md §13): EBADF.
    #[error("file handle not held by this connection")]
    HandleNotHeld,
    /// A smith set or removed an extended attribute in a namespace that only a process with
    /// capabilities may change (`security.*`, e.g. `security.capability`, and `trusted.*`):
    /// EPERM, what the caller's own kernel answers a process without them. The daemon, root,
    /// would otherwise make it for a caller no kernel stands in front of: a remote node
    /// (docs/PROTOCOL-NOTES.md XT26).
    #[error("extended attribute namespace reserved to the privileged")]
    PrivilegedXattr,
    /// A POSIX ACL set or removed (`system.posix_acl_access`, `_default`): the mount does not
    /// offer ACLs, so a local kernel answers EOPNOTSUPP without asking; a remote node gets the
    /// same answer from the daemon (docs/PROTOCOL-NOTES.md XT26).
    #[error("POSIX ACLs are not supported")]
    AclUnsupported,
}

impl FsError {
    /// The errno to reply with.
    pub fn errno(&self) -> Errno {
        match self {
            FsError::Backing(e) | FsError::Denied(e) | FsError::Reserved(e) => *e,
            FsError::Stale | FsError::NodeNotHeld => Errno::ESTALE,
            FsError::HandleNotHeld => Errno::EBADF,
            FsError::Hidden | FsError::UnknownSmith | FsError::NoSuchControlFile => Errno::ENOENT,
            FsError::NotOpenForWriting | FsError::NotCtl => Errno::EBADF,
            FsError::Exists => Errno::EEXIST,
            FsError::BadName | FsError::BadWhence => Errno::EINVAL,
            FsError::SeekPastEnd | FsError::SpecialFile => Errno::ENXIO,
            FsError::NotTruncatable => Errno::EINVAL,
            FsError::Scaffold => Errno::EIO,
            FsError::ControlIsDir => Errno::EISDIR,
            FsError::ControlFixed | FsError::PrivilegedXattr => Errno::EPERM,
            FsError::ControlUnknown => Errno::EACCES,
            FsError::NoSuchXattr => Errno::ENODATA,
            FsError::NotOwner => Errno::EACCES,
            FsError::Unimplemented => Errno::ENOSYS,
            FsError::BadRequest | FsError::ReplyFailed => Errno::EIO,
            FsError::NoUring => Errno::EPROTONOSUPPORT,
            FsError::AclUnsupported => Errno::EOPNOTSUPP,
        }
    }

    /// [`FsError::errno`] as the raw number FUSE replies carry.
    pub fn raw(&self) -> i32 {
        self.errno() as i32
    }

    /// Log this failure of request `op` at its [`FsError::level`].
    pub fn log(&self, op: &str) {
        let errno = self.errno();
        match self.level() {
            tracing::Level::ERROR => tracing::error!(op, %errno, "{self}"),
            tracing::Level::WARN => tracing::warn!(op, %errno, "{self}"),
            _ => tracing::debug!(op, %errno, "{self}"),
        }
    }

    /// The level the failure is logged at: denials and missing names are ordinary (debug), a
    /// failed scaffold is the daemon's own fault (error).
    pub fn level(&self) -> tracing::Level {
        match self {
            FsError::Scaffold | FsError::ReplyFailed | FsError::NoUring => tracing::Level::ERROR,
            FsError::BadRequest => tracing::Level::WARN,
            FsError::Backing(_)
            | FsError::Denied(_)
            | FsError::Stale
            | FsError::Hidden
            | FsError::Reserved(_)
            | FsError::NotOpenForWriting
            | FsError::NotCtl
            | FsError::Exists
            | FsError::BadName
            | FsError::UnknownSmith
            | FsError::NoSuchControlFile
            | FsError::ControlIsDir
            | FsError::ControlFixed
            | FsError::ControlUnknown
            | FsError::NoSuchXattr
            | FsError::NotOwner
            | FsError::Unimplemented
            | FsError::SeekPastEnd
            | FsError::BadWhence
            | FsError::NodeNotHeld
            | FsError::SpecialFile
            | FsError::NotTruncatable
            | FsError::HandleNotHeld
            | FsError::PrivilegedXattr
            | FsError::AclUnsupported => tracing::Level::DEBUG,
        }
    }
}

/// Result of a filesystem operation.
pub type FsResult<T> = Result<T, FsError>;
