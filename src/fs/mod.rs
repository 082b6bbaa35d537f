//! `SmithFs`: the filesystem operations as plain functions over the backing store, returning
//! `FsResult<…>`. The FUSE glue (`crate::fuse`) translates requests into these calls, so every
//! operation can be exercised without a kernel.
//!
//! Every operation that reaches the daemon calls [`SmithFs::check`] exactly once per object it
//! touches (PROTOCOL.md §3); requests that carry a file handle are judged by the handle's
//! recorded opener (PROTOCOL.md §2).

pub mod backing;
pub mod budget;
pub mod control;
pub mod error;
pub mod handle;
pub mod inode;
pub mod scaffold;
pub mod scan;
mod why;

mod completion;
mod create;
mod creds;
mod ctl;
mod deny;
mod dir;
mod entries;
mod io;
mod remove;
mod rename;
mod xattr;
mod zones;

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use nix::errno::Errno;

pub use self::completion::completion;
use self::control::ControlFile;
pub use self::error::{FsError, FsResult};
use self::handle::{DirHandle, FileHandle, HandleTable};
pub use self::inode::BackingRef;
use self::inode::{Inode, InodeTable};
pub use self::why::DenialRecord;
use self::why::WhyStore;
pub use self::xattr::XattrReply;
use crate::config::{Limits, OperatorMode};
use crate::identity::Identity;
use crate::policy::{Ctx, Zone};
use crate::tree::model::SmithIdx;
use crate::tree::registry::Registry;
use crate::tree::template::Templates;

/// The name of smithfs's own state directory in the store's root, never visible through the
/// mount (PROTOCOL.md §1).
pub const STATE_DIR: &str = ".smithfs-state";

/// Entry and attribute time-to-live the kernel gets for an entry: zero for the virtual control
/// files, whose content and rights depend on the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// Backing-store entries: cache for the mount's TTL.
    Normal,
    /// `.smithfs/`: never cache, direct I/O.
    Never,
}

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

/// What the filesystem tells the rest of the daemon (the scheduler and the journal). Sent
/// without waiting: the sink must not block (STYLE.md habit 7).
#[derive(Clone, Debug)]
pub enum FsEvent {
    /// A `task-*.md` directly in a smith's inbox was completed (PROTOCOL.md §5).
    TaskCompleted {
        /// The inbox's owner.
        smith: SmithIdx,
        /// The file's name.
        name: String,
    },
    /// A smith's `outbox/result.md` was completed.
    ResultCompleted {
        /// The outbox's owner.
        smith: SmithIdx,
    },
    /// A child dir was scaffolded, or a smith dir moved into a `children/` was registered (once
    /// for each smith of the moved subtree, parents first).
    SmithCreated {
        /// The new smith.
        smith: SmithIdx,
        /// It was moved into place by the operator (its files are not new: the scheduler derives
        /// its state from them, as at mount), not scaffolded.
        moved: bool,
    },
    /// A smith dir was removed (rmdir, replaced) or moved out of every `children/` by the
    /// operator; it and its subtree are unregistered.
    SmithRemoved {
        /// The top of the removed subtree.
        smith: SmithIdx,
    },
    /// An operation was denied.
    Denied(Box<DenialRecord>),
    /// `cancel <full-id>` was written to `ctl` by an authorised identity.
    Cancel {
        /// The smith to cancel (with its subtree).
        smith: SmithIdx,
    },
}

/// Who resolves identities and binds processes (PROTOCOL.md §2); implemented by the identity
/// resolver. Must be cheap on a cache hit: it is on every request's path.
pub trait Identities: Send + Sync {
    /// The identity of the thread `pid` (0: Unknown).
    fn resolve(&self, pid: u32) -> Identity;
    /// Bind the process of thread `pid` to `smith` (`ctl bind`).
    ///
    /// # Errors
    /// A [`BindError`]: the errno for the `ctl` write and the reason, which `.smithfs/why` shows.
    fn bind(&self, pid: u32, smith: SmithIdx) -> Result<(), BindError>;
    /// A smith was registered (cgroup mode makes its cgroup).
    fn register_smith(&self, smith: SmithIdx, full_id: &str);
    /// A smith's dir was removed: release what was kept for it (cgroup mode removes its
    /// cgroup once it is empty). Nothing by default.
    fn unregister_smith(&self, _smith: SmithIdx) {}
    /// `cgroup` or `ancestry`, for `whoami`.
    fn mode_name(&self) -> &'static str;
}

/// Why [`Identities::bind`] failed: the errno the `ctl` write returns and a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindError {
    /// The errno, e.g. ESRCH (the process is gone) or EBUSY (it is another smith already).
    pub errno: Errno,
    /// What failed, e.g. `moving 123 into /sys/fs/cgroup/…: No such device`.
    pub reason: String,
}

/// No binding: every process with a pid is the operator, pid 0 is Unknown.
#[derive(Debug, Default)]
pub struct NoBinding;

impl Identities for NoBinding {
    fn resolve(&self, pid: u32) -> Identity {
        if pid == 0 {
            Identity::Unknown
        } else {
            Identity::Operator
        }
    }
    fn bind(&self, _pid: u32, _smith: SmithIdx) -> Result<(), BindError> {
        Err(BindError {
            errno: Errno::ENOSYS,
            reason: "this mount binds no processes".into(),
        })
    }
    fn register_smith(&self, _smith: SmithIdx, _full_id: &str) {}
    fn mode_name(&self) -> &'static str {
        "none"
    }
}

/// Options fixed for the life of a mount.
#[derive(Clone, Debug)]
pub struct FsOptions {
    /// Operator mode (PROTOCOL.md §3).
    pub operator: OperatorMode,
    /// Scaffold limits (PROTOCOL.md §4).
    pub limits: Limits,
    /// Templates for the scaffold.
    pub templates: Templates,
    /// The mount point as users see it (for `whoami`).
    pub mount_point: std::path::PathBuf,
    /// Cached `O_PATH` descriptors to keep at most (beyond it they are reopened by handle).
    pub max_fds: usize,
    /// Open file and directory handles one smith may hold (`limits.max_open_files_per_smith`;
    /// EMFILE beyond).
    pub max_open_per_smith: usize,
    /// Open handles everybody together may hold, the operator included (ENFILE beyond).
    pub max_open_total: usize,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            operator: OperatorMode::ReadWrite,
            limits: Limits::default(),
            templates: Templates::builtin(),
            mount_point: std::path::PathBuf::new(),
            max_fds: 4096,
            // No practical limit: the daemon sets both from its descriptor plan.
            max_open_per_smith: 1 << 20,
            max_open_total: 1 << 20,
        }
    }
}

/// An open control file: its content snapshot (taken at open, for the opener) or, for `ctl`,
/// the commands written so far.
#[derive(Debug)]
struct ControlHandle {
    file: ControlFile,
    data: Vec<u8>,
}

/// The registered smith dir a rename moves.
struct MovedSmith {
    smith: SmithIdx,
    /// Its zone ([`Zone::smith_dir`]).
    zone: Zone,
    /// Its `stat` before the rename.
    st: libc::stat,
}

/// The destination of a rename: the directory, the new name, and the entry it replaces (its
/// zone and `stat`), if any.
struct Dest<'a> {
    dir: &'a Inode,
    cname: &'a CStr,
    name: &'a OsStr,
    replaced: Option<&'a (Zone, libc::stat)>,
}

/// Produces `.smithfs/status.json` (the scheduler's view); set once by the daemon.
pub type StatusFn = Box<dyn Fn() -> String + Send + Sync>;
/// Receives [`FsEvent`]s; set once by the daemon.
pub type EventFn = Box<dyn Fn(FsEvent) + Send + Sync>;
/// Invalidates the kernel's cached attributes of a node id; set once by the daemon.
pub type AttrFn = Box<dyn Fn(u64) + Send + Sync>;
/// Tells whether a run of a smith or of one of its descendants is live; set once by the daemon.
pub type LiveFn = Box<dyn Fn(SmithIdx) -> bool + Send + Sync>;

/// The filesystem: the inode table, the handle tables, the smith registry and the access check.
pub struct SmithFs {
    inodes: InodeTable,
    files: HandleTable<FileHandle>,
    dirs: HandleTable<DirHandle>,
    controls: HandleTable<ControlHandle>,
    registry: Arc<Registry>,
    identities: Arc<dyn Identities>,
    /// The limits on open handles (per smith and mount-wide).
    open_limits: budget::OpenLimits,
    why: WhyStore,
    /// Bumped by every directory rename: cached zones older than it are recomputed from the
    /// parent chain (a renamed directory carries its subtree to its new zone).
    zone_epoch: AtomicU64,
    state: OwnedFd,
    opts: FsOptions,
    events: OnceLock<EventFn>,
    status: OnceLock<StatusFn>,
    live: OnceLock<LiveFn>,
    inval_attr: OnceLock<AttrFn>,
}

impl std::fmt::Debug for SmithFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmithFs")
            .field("inodes", &self.inodes.len())
            .field("opts", &self.opts)
            .finish()
    }
}

/// Names of smiths for policy sentences.
struct RegistryNames<'a>(&'a Registry);

impl crate::policy::Names for RegistryNames<'_> {
    fn full_id(&self, smith: SmithIdx) -> Option<String> {
        self.0.full_id(smith)
    }
}

impl SmithFs {
    /// A filesystem over the backing store whose root is the `O_PATH` descriptor `root`; its
    /// smith registry is rebuilt by scanning (PROTOCOL.md §9).
    pub fn new(
        root: OwnedFd,
        opts: FsOptions,
        identities: Arc<dyn Identities>,
    ) -> FsResult<SmithFs> {
        let state_name = CString::new(STATE_DIR).map_err(|_| FsError::Backing(Errno::EINVAL))?;
        let state = backing::ensure_dir(root.as_fd(), &state_name, 0o700)?;
        let registry = Arc::new(Registry::new());
        let highest = scan::load_highest(state.as_fd());
        scan::scan(root.as_fd(), &registry, &highest)?;
        let removed = scan::remove_crash_leftovers(root.as_fd(), &registry);
        if removed > 0 {
            tracing::info!(removed, "removed the temporary names a crash left");
        }
        for s in registry.all() {
            identities.register_smith(s.idx, &s.full_id);
        }
        Ok(SmithFs {
            inodes: InodeTable::new(root, opts.max_fds)?,
            files: HandleTable::default(),
            dirs: HandleTable::default(),
            controls: HandleTable::default(),
            registry,
            identities,
            open_limits: budget::OpenLimits::new(opts.max_open_per_smith, opts.max_open_total),
            why: WhyStore::default(),
            zone_epoch: AtomicU64::new(1),
            state,
            opts,
            events: OnceLock::new(),
            status: OnceLock::new(),
            live: OnceLock::new(),
            inval_attr: OnceLock::new(),
        })
    }

    /// The smith registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The state directory `.smithfs-state/` (an `O_PATH` descriptor).
    pub fn state_dir(&self) -> std::os::fd::BorrowedFd<'_> {
        self.state.as_fd()
    }

    /// The store's root (an `O_PATH` descriptor).
    pub fn store_root(&self) -> Arc<Inode> {
        self.inodes.root()
    }

    /// Node id of backing inode number `ino` (for kernel cache invalidation).
    pub fn node_id(&self, backing_ino: u64) -> u64 {
        self.inodes.ids.node_id(backing_ino)
    }

    /// Route events to `sink` (once).
    pub fn set_event_sink(&self, sink: EventFn) {
        let _ = self.events.set(sink);
    }

    /// Serve `.smithfs/status.json` from `f` (once).
    pub fn set_status_source(&self, f: StatusFn) {
        let _ = self.status.set(f);
    }

    /// Tell the kernel through `f` that an inode's cached attributes are stale (once). `f` gets
    /// a node id and must only invalidate attributes (no page cache, no waiting on the inode).
    pub fn set_attr_invalidator(&self, f: AttrFn) {
        let _ = self.inval_attr.set(f);
    }

    fn attrs_changed(&self, node: u64) {
        if let Some(f) = self.inval_attr.get() {
            f(node);
        }
    }

    /// Answer "is a run live in this smith's subtree?" with `f` (once).
    pub fn set_liveness(&self, f: LiveFn) {
        let _ = self.live.set(f);
    }

    /// Is a run of the owner of `zone`, or of one of its descendants, live?
    fn subtree_live(&self, zone: &Zone) -> bool {
        match (zone.owner(), self.live.get()) {
            (Some(owner), Some(live)) => live(owner),
            _ => false,
        }
    }

    fn emit(&self, e: FsEvent) {
        if let Some(sink) = self.events.get() {
            sink(e);
        }
    }

    /// The identity a request is judged by (PROTOCOL.md §2).
    pub fn identify(&self, caller: &Caller) -> Identity {
        self.identities.resolve(caller.pid)
    }

    /// Run `f` with the policy context of this mount (PROTOCOL.md §3: operator mode, root smith,
    /// limits, and full ids for the sentences of a denial).
    fn with_ctx<R>(&self, f: impl FnOnce(&Ctx<'_>) -> R) -> R {
        let names = RegistryNames(&self.registry);
        let ctx = Ctx {
            operator: self.opts.operator,
            root: self.registry.root(),
            limits: self.opts.limits,
            names: &names,
        };
        f(&ctx)
    }

    /// Numbers of held inodes and open handles (files, directories), for status and tests.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.inodes.len(), self.files.len(), self.dirs.len())
    }
}
