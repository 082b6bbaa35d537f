//! Open files and directories: our per-open state, named to the kernel by an [`Fh`] number. An
//! open file records who opened it and with what rights, so that requests carrying its number
//! are judged by the opener, never by the request's pid (docs/SPEC.md §2; the kernel sends some
//! with pid 0).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use super::backing::{self, DirStream};
use super::budget::Slot;
use super::error::{FsError, FsResult};
use super::ids::Fh;
use super::inode::Inode;
use crate::identity::Identity;

/// The backing file of a new handle, and whether it can also be the passthrough backing
/// shared by every open of its inode: opened `O_RDWR` with none of [`backing::IO_FLAGS`] (an
/// `O_APPEND` backing would make every passed-through write append). The flags it was opened
/// with may grant the daemon more than the caller asked for; the handle keeps the caller's.
#[derive(Debug)]
pub struct HandleFd {
    /// The open backing file.
    pub fd: OwnedFd,
    /// See the type's docs.
    pub shareable: bool,
}

impl HandleFd {
    /// `fd`, opened with the `open(2)` flags `flags`.
    pub fn opened(fd: OwnedFd, flags: i32) -> HandleFd {
        HandleFd {
            fd,
            shareable: flags & libc::O_ACCMODE == libc::O_RDWR && flags & backing::IO_FLAGS == 0,
        }
    }
}

/// An open regular file.
#[derive(Debug)]
pub struct OpenFile {
    /// The open backing file.
    pub fd: OwnedFd,
    /// Its own file can be the inode's passthrough backing ([`HandleFd`]).
    pub shareable: bool,
    /// The inode it was opened on.
    pub inode: Arc<Inode>,
    /// Who opened it.
    pub opener: Identity,
    /// The opener's thread id and uid, for the `why` its release may leave (a refused task
    /// name, docs/SPEC.md §5).
    pub opener_pid: u32,
    /// See `opener_pid`.
    pub opener_uid: u32,
    /// The `open(2)` flags it was opened with.
    pub flags: i32,
    /// May the opener write through it (decided at open).
    pub may_write: bool,
    /// Set once anything was written through it, or it was opened with `O_TRUNC`/`O_CREAT`:
    /// its release completes the file (docs/SPEC.md §5).
    pub dirty: AtomicBool,
    /// Counted as a user of its inode's passthrough state (released with the handle).
    pub passthrough: AtomicBool,
    /// Its share of the descriptor budget, counted against its opener (given back with the
    /// handle, when its descriptor is closed).
    pub slot: Slot,
}

impl OpenFile {
    /// The open file `file` of `inode`, opened by `caller` (identified as `opener`) with `flags`;
    /// writable when `flags` ask for write access; `dirty` when its release completes the file
    /// already (opened for writing, with `O_TRUNC`, or created, docs/SPEC.md §5).
    pub fn new(
        file: HandleFd,
        inode: Arc<Inode>,
        opener: Identity,
        caller: &super::Caller,
        flags: i32,
        dirty: bool,
        slot: Slot,
    ) -> OpenFile {
        OpenFile {
            fd: file.fd,
            shareable: file.shareable,
            inode,
            opener,
            opener_pid: caller.pid,
            opener_uid: caller.uid,
            flags,
            may_write: flags & libc::O_ACCMODE != libc::O_RDONLY,
            dirty: AtomicBool::new(dirty),
            passthrough: AtomicBool::new(false),
            slot,
        }
    }

    /// The opener as a caller, for the `why` of a refusal of a request judged by the handle.
    pub fn opener_caller(&self) -> super::Caller {
        super::Caller {
            pid: self.opener_pid,
            uid: self.opener_uid,
            gid: u32::MAX,
            as_smith: match self.opener {
                Identity::Smith(s) => Some(s),
                Identity::Operator | Identity::Unknown => None,
            },
        }
    }
}

/// An open directory.
pub struct OpenDir {
    /// The directory stream, positioned by readdir offsets: opened at the first readdir or
    /// fsyncdir, as most opens need none (a listing the kernel keeps, `FOPEN_CACHE_DIR`, is read
    /// once; `git status` opens every directory of the tree and lists none of them again).
    stream: Mutex<Option<DirStream>>,
    /// The directory's inode.
    pub inode: Arc<Inode>,
    /// Who opened it.
    pub opener: Identity,
    /// Its share of the descriptor budget, counted against its opener.
    pub slot: Slot,
}

impl OpenDir {
    /// A handle on the directory `inode`, opened by `opener`, with budget share `slot`; no
    /// descriptor is opened yet.
    pub fn new(inode: Arc<Inode>, opener: Identity, slot: Slot) -> OpenDir {
        OpenDir {
            stream: Mutex::new(None),
            inode,
            opener,
            slot,
        }
    }

    /// Run `f` on the handle's stream, opening it first if this is its first use (the
    /// directory as it is now: a directory removed since the opendir reads as empty). Errors:
    /// the reopen's, or `f`'s. The handle's lock is held meanwhile (one reader at a time).
    pub fn with_stream<R>(&self, f: impl FnOnce(&mut DirStream) -> FsResult<R>) -> FsResult<R> {
        let mut slot = self.stream.lock();
        let stream = match &mut *slot {
            Some(s) => s,
            None => slot.insert(DirStream::open(self.inode.fd()?.as_fd())?),
        };
        f(stream)
    }
}

impl std::fmt::Debug for OpenDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenDir")
            .field("inode", &self.inode.id)
            .field("opener", &self.opener)
            .finish()
    }
}

/// A table of open files (or directories, or control files), keyed by the [`Fh`] given to the
/// kernel.
/// Lock order: a leaf lock, never held across a syscall or a reply.
#[derive(Debug)]
pub struct OpenTable<H> {
    next: AtomicU64,
    map: RwLock<FxHashMap<Fh, Arc<H>>>,
}

impl<H> Default for OpenTable<H> {
    fn default() -> Self {
        OpenTable {
            next: AtomicU64::new(1),
            map: RwLock::new(FxHashMap::default()),
        }
    }
}

impl<H> OpenTable<H> {
    /// Store `h` and return its number.
    pub fn insert(&self, h: H) -> Fh {
        let fh = Fh(self.next.fetch_add(1, Ordering::Relaxed));
        self.map.write().insert(fh, Arc::new(h));
        fh
    }

    /// The handle numbered `fh`, or `Stale`.
    pub fn get(&self, fh: Fh) -> FsResult<Arc<H>> {
        self.map.read().get(&fh).cloned().ok_or(FsError::Stale)
    }

    /// Remove and return the handle numbered `fh`.
    pub fn remove(&self, fh: Fh) -> Option<Arc<H>> {
        self.map.write().remove(&fh)
    }

    /// Every open handle now (cloned out: the lock is not held by the caller's work).
    pub fn all(&self) -> Vec<Arc<H>> {
        self.map.read().values().cloned().collect()
    }

    /// Number of open handles.
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// True when no handle is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
