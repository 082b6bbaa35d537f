//! `SmithFs`: the filesystem operations as plain functions over the backing store, returning
//! `FsResult<…>`. The FUSE glue (`crate::fuse`) translates requests into these calls, so every
//! operation can be exercised without a kernel.
//!
//! Every operation that reaches the daemon is judged once per object it touches by a
//! `policy::decide*` function (through `zones.rs`, docs/SPEC.md §3) and only enforced here;
//! requests that carry a file handle are judged by the handle's recorded opener (docs/SPEC.md
//! §2). One file per job: `zones` (zones, hard-link names), `deny` (denial records, open-file
//! budgets), `ctl` (control files and commands), `creds` (caller credentials), and one per
//! family of operations: `entries`, `create`, `remove`, `rename`, `io`, `dir`, `xattr`.

/// The store layer, re-exported under its former path.
pub use crate::backing;
pub mod budget;
pub mod control;
pub mod error;
pub mod ids;
pub mod inode;
pub mod open;
pub mod rebuild;
pub mod scaffold_write;
mod why;

mod completion;
mod create;
mod creds;
mod ctl;
mod deny;
mod dir;
mod entries;
mod io;
mod quota;
mod remove;
mod rename;
mod xattr;
mod zones;

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use nix::errno::Errno;

pub use self::completion::completion;
use self::control::ControlFile;
pub use self::error::{FsError, FsResult};
pub use self::ids::{BackingIno, Fh, NodeId};
pub use self::inode::BackingRef;
use self::inode::{Inode, InodeTable};
use self::open::{OpenDir, OpenFile, OpenTable};
pub use self::why::DenialRecord;
use self::why::WhyStore;
pub use self::xattr::XattrReply;
use crate::config::OperatorMode;
use crate::identity::resolve::IdentityError;
use crate::identity::Identity;
use crate::policy::{Ctx, Zone};
use crate::tree::layout::STATE_DIR;
use crate::tree::model::{FullId, SmithIdx};
use crate::tree::registry::Registry;
use crate::tree::template::Templates;
use crate::trigger::Trigger;

/// How long the kernel may keep an entry and its attributes (docs/PROTOCOL-NOTES.md C4, U4):
/// long for store inodes, whose every change either comes through the kernel's own requests or is
/// invalidated by the daemon; zero where neither holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// Backing-store entries: cached for the mount's long TTL; out-of-band changes are
    /// invalidated through [`AttrCache`] and `sched::Invalidate`.
    Normal,
    /// Store inodes that change without any FUSE request and without a notification:
    /// `conversations/` (a run's `messages.log` grows through the descriptor the daemon handed
    /// it). TTL zero, but cached (not direct) I/O.
    Volatile,
    /// The mount root: 1 s, so that a `stat` of the mount point reaches the daemon within a second
    /// and reports a dead daemon (ENOTCONN) — how `mount`, `umount` and `doctor` tell a dead
    /// mount (docs/SPEC.md §9); a second, not zero, so that path walks from the root (whose
    /// permission check needs its attributes) do not each cost a GETATTR.
    Brief,
    /// `.smithfs/`: never cache, direct I/O (content and rights depend on the caller).
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
    /// The smith the transport vouches for: a remote connection proved with its run's secret
    /// that it is this smith's run (docs/SPEC.md §13), so it is judged as this smith and no pid
    /// is looked up. `None` for the local mount (the pid decides, §2).
    pub as_smith: Option<SmithIdx>,
}

/// Attributes of an inode as the mount shows them: the backing `stat` with `st_ino` replaced by
/// the node id.
#[derive(Clone, Copy)]
pub struct Attr(pub libc::stat);

impl Attr {
    /// The answer for a missing name: node id 0 and nothing else (a FUSE negative entry).
    pub fn missing() -> Attr {
        // SAFETY: an all-zero stat is a valid value.
        Attr(unsafe { std::mem::zeroed() })
    }

    /// The node id the mount shows (`st_ino`).
    pub fn node(&self) -> NodeId {
        NodeId(self.0.st_ino)
    }
}

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
    pub fh: Option<Fh>,
}

/// One entry produced by readdir.
#[derive(Debug)]
pub struct DirEntryOut<'a> {
    /// Node id (or the backing inode number for `.` and `..`, which the kernel does not count).
    pub ino: NodeId,
    /// Cookie to resume after this entry.
    pub offset: u64,
    /// `S_IFMT` bits of the entry's type.
    pub kind: u32,
    /// Entry name.
    pub name: &'a OsStr,
    /// For readdirplus: the looked-up attributes (the lookup count was raised by one).
    pub attr: Option<Attr>,
}

/// What the filesystem needs from the scheduler: the queue its triggers go to (never
/// blocking, STYLE.md habit 7), `.smithfs/status.json`, and whether runs are live. Implemented
/// by [`crate::sched::SchedulerPort`], made before the filesystem (`crate::daemon`).
pub trait Scheduling: Send + Sync {
    /// Queue `t` for the scheduler without waiting.
    fn trigger(&self, t: Trigger);
    /// The current `status.json` (pretty, newline-terminated); `None` until the scheduler
    /// runs (the registry's idle status is served then).
    fn status_json(&self) -> Option<String>;
    /// Is a run of `smith` or of one of its descendants live?
    fn subtree_live(&self, smith: SmithIdx) -> bool;
    /// The journal's end in journal offsets (every byte ever journaled): the size of
    /// `.smithfs/events.jsonl`. `None`: no live journal (no scheduler: the file is then empty;
    /// docs/PROTOCOL-NOTES.md O13).
    fn journal_end(&self) -> Option<u64> {
        None
    }
    /// Up to `len` journal bytes from journal offset `offset` on and the offset they start at
    /// (later than `offset` when rotation dropped it); `None`: no live journal.
    fn journal_read(
        &self,
        _offset: u64,
        _len: usize,
    ) -> Option<Result<(u64, Vec<u8>), nix::errno::Errno>> {
        None
    }
}

/// Re-reads config.json and applies it without a remount (`.smithfs/ctl` `reload`, docs/SPEC.md
/// §6). Implemented by the daemon (`crate::reload::Reloader`).
pub trait Reloading: Send + Sync {
    /// Reload; returns the sections that changed (`agent`, `hooks` …).
    ///
    /// # Errors
    /// One line naming the key, as `mount` words it; the daemon keeps its configuration.
    fn reload(&self) -> Result<Vec<String>, String>;
}

/// Tells the kernel that a node's cached attributes are stale (implemented by the FUSE
/// session). Must only invalidate attributes: it is called from FUSE threads.
pub trait AttrCache: Send + Sync {
    /// The attributes of node id `node` changed.
    fn attrs_changed(&self, node: NodeId);
}

/// No scheduler and no kernel (a filesystem without a mount, as in tests): triggers are
/// dropped, no run is live.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoDaemon;

impl Scheduling for NoDaemon {
    fn trigger(&self, _t: Trigger) {}
    fn status_json(&self) -> Option<String> {
        None
    }
    fn subtree_live(&self, _smith: SmithIdx) -> bool {
        false
    }
}

impl AttrCache for NoDaemon {
    fn attrs_changed(&self, _node: NodeId) {}
}

impl Reloading for NoDaemon {
    fn reload(&self) -> Result<Vec<String>, String> {
        Err("no daemon serves this filesystem: nothing to reload".into())
    }
}

/// The rest of the daemon as the filesystem sees it, given at construction.
#[derive(Clone)]
pub struct Ports {
    /// The scheduler's queue and view.
    pub sched: Arc<dyn Scheduling>,
    /// Kernel attribute-cache invalidation.
    pub kernel: Arc<dyn AttrCache>,
    /// `ctl` `reload`: config.json applied without a remount.
    pub reload: Arc<dyn Reloading>,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            sched: Arc::new(NoDaemon),
            kernel: Arc::new(NoDaemon),
            reload: Arc::new(NoDaemon),
        }
    }
}

/// Who resolves identities and binds processes (docs/SPEC.md §2); implemented by the identity
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
    fn register_smith(&self, smith: SmithIdx, full_id: &FullId);
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

impl From<&IdentityError> for BindError {
    /// The errno of `e` ([`IdentityError::errno`], the identity errors' table) and its text.
    fn from(e: &IdentityError) -> BindError {
        BindError {
            errno: e.errno(),
            reason: e.to_string(),
        }
    }
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
        Err(BindError::from(&IdentityError::NoBinding))
    }
    fn register_smith(&self, _smith: SmithIdx, _full_id: &FullId) {}
    fn mode_name(&self) -> &'static str {
        "none"
    }
}

/// Options fixed for the life of a mount.
#[derive(Clone, Debug)]
pub struct FsOptions {
    /// Operator mode (docs/SPEC.md §3).
    pub operator: OperatorMode,
    /// The limits in force (docs/SPEC.md §4, §8), shared with the reloader, which changes them
    /// without a remount (§6): the scaffold's, the open handles per smith, the storage quotas.
    pub limits: Arc<crate::limits::live::LiveLimits>,
    /// Templates for the scaffold.
    pub templates: Templates,
    /// The mount point as users see it (for `whoami`).
    pub mount_point: std::path::PathBuf,
    /// Cached `O_PATH` descriptors to keep at most (beyond it they are reopened by handle).
    pub max_fds: usize,
    /// Open handles everybody together may hold, the operator included (ENFILE beyond).
    pub max_open_total: usize,
    /// A project exists (docs/SPEC.md §11): every new smith dir gets a `workspace/`, and
    /// `workspace` is a structure area.
    pub project: bool,
    /// The agents' user when the sandbox is on (docs/SPEC.md §12): the Operator is then only uid
    /// 0, the daemon's uid or this user's (§2), and the scaffold makes smith dirs theirs.
    /// `None`: the sandbox is off (every uid may be the Operator; the scaffold's entries are the
    /// caller's).
    pub agents: Option<Arc<crate::sandbox::AgentUser>>,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            operator: OperatorMode::ReadWrite,
            // No practical limit on open handles: the daemon sets them from its descriptor plan.
            limits: Arc::default(),
            templates: Templates::builtin(),
            mount_point: std::path::PathBuf::new(),
            max_fds: 4096,
            max_open_total: 1 << 20,
            project: false,
            agents: None,
        }
    }
}

/// An open control file: its content snapshot (taken at open, for the opener) or, for `ctl`,
/// the commands written so far.
#[derive(Debug)]
struct OpenControl {
    file: ControlFile,
    data: Vec<u8>,
    /// `events.jsonl` served live: the journal offset of this handle's offset 0, fixed by its
    /// first read (`u64::MAX` until then; docs/PROTOCOL-NOTES.md O13).
    origin: std::sync::atomic::AtomicU64,
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

/// The filesystem: the inode table, the handle tables, the smith registry and the access check.
pub struct SmithFs {
    inodes: InodeTable,
    files: OpenTable<OpenFile>,
    dirs: OpenTable<OpenDir>,
    controls: OpenTable<OpenControl>,
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
    ports: Ports,
    /// The storage limits (docs/SPEC.md §8): the books (kept when a storage quota is
    /// configured), the reserve and the cached free space; shared with the scheduler's output
    /// pump.
    storage: Arc<crate::limits::storage::Storage>,
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
    fn full_id(&self, smith: SmithIdx) -> Option<FullId> {
        self.0.full_id(smith)
    }
}

impl SmithFs {
    /// A filesystem over the backing store whose root is the `O_PATH` descriptor `root`; its
    /// smith registry is rebuilt by scanning (docs/SPEC.md §9). Connected to no scheduler and
    /// no kernel ([`Ports::default`]).
    pub fn new(
        root: OwnedFd,
        opts: FsOptions,
        identities: Arc<dyn Identities>,
    ) -> FsResult<SmithFs> {
        SmithFs::with_ports(root, opts, identities, Ports::default())
    }

    /// [`SmithFs::new`] connected to the scheduler and the kernel through `ports`.
    pub fn with_ports(
        root: OwnedFd,
        opts: FsOptions,
        identities: Arc<dyn Identities>,
        ports: Ports,
    ) -> FsResult<SmithFs> {
        let state_name = CString::new(STATE_DIR).map_err(|_| FsError::BadName)?;
        let state = backing::ensure_dir(root.as_fd(), &state_name, 0o700)?;
        let registry = Arc::new(Registry::new());
        let highest = rebuild::load_highest(state.as_fd());
        rebuild::scan(root.as_fd(), &registry, &highest)?;
        let removed = rebuild::remove_crash_leftovers(root.as_fd(), &registry);
        if removed > 0 {
            tracing::info!(removed, "removed the temporary names a crash left");
        }
        for s in registry.all() {
            identities.register_smith(s.idx, &s.full_id);
        }
        let storage = Arc::new(
            crate::limits::storage::Storage::new(root.as_fd(), opts.limits.clone())
                .map_err(FsError::from)?,
        );
        let fs = SmithFs {
            inodes: InodeTable::new(root, opts.max_fds)?,
            files: OpenTable::default(),
            dirs: OpenTable::default(),
            controls: OpenTable::default(),
            registry,
            identities,
            open_limits: budget::OpenLimits::with_live(opts.limits.clone(), opts.max_open_total),
            why: WhyStore::default(),
            zone_epoch: AtomicU64::new(1),
            state,
            opts,
            ports,
            storage,
        };
        // With a quota in force, the books are built now, by one scan (docs/SPEC.md §8).
        let _ = fs.books();
        Ok(fs)
    }

    /// The storage limits (docs/SPEC.md §8), for the scheduler's output pump.
    pub fn storage(&self) -> &Arc<crate::limits::storage::Storage> {
        &self.storage
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
    pub fn node_id(&self, backing_ino: BackingIno) -> NodeId {
        self.inodes.ids.node_id(backing_ino)
    }

    fn attrs_changed(&self, node: NodeId) {
        self.ports.kernel.attrs_changed(node);
    }

    /// Is a run of the owner of `zone`, or of one of its descendants, live?
    fn subtree_live(&self, zone: &Zone) -> bool {
        zone.owner()
            .is_some_and(|owner| self.ports.sched.subtree_live(owner))
    }

    fn emit(&self, t: Trigger) {
        self.ports.sched.trigger(t);
    }

    /// Whether the store's mode bits take part in creates through the mount: not with
    /// `sandbox.uid_per_smith`, where the mount has no `default_permissions` and the rules of
    /// docs/SPEC.md §3 alone decide between smiths ([`creds::as_caller`]).
    pub(super) fn modes_decide(&self) -> bool {
        !self
            .opts
            .agents
            .as_ref()
            .is_some_and(|a| a.per_smith_range().is_some())
    }

    /// The identity a request is judged by (docs/SPEC.md §2). With the sandbox on, an Operator
    /// by its process is the Operator only as uid 0, the daemon's uid or the agents' user; any
    /// other uid is Unknown (docs/SPEC.md §2, §12).
    pub fn identify(&self, caller: &Caller) -> Identity {
        if let Some(smith) = caller.as_smith {
            return Identity::Smith(smith);
        }
        let who = self.identities.resolve(caller.pid);
        match (&who, &self.opts.agents) {
            (Identity::Operator, Some(agents))
                // SAFETY: geteuid has no preconditions (reached only by other uids).
                if caller.uid != 0
                    && caller.uid != agents.uid()
                    && caller.uid != unsafe { libc::geteuid() } =>
            {
                Identity::Unknown
            }
            _ => who,
        }
    }

    /// Run `f` with the policy context of this mount (docs/SPEC.md §3: operator mode, root smith,
    /// limits, and full ids for the sentences of a denial).
    fn with_ctx<R>(&self, f: impl FnOnce(&Ctx<'_>) -> R) -> R {
        let names = RegistryNames(&self.registry);
        let ctx = Ctx {
            operator: self.opts.operator,
            root: self.registry.root(),
            limits: self.opts.limits.limits(),
            project: self.opts.project,
            names: &names,
        };
        f(&ctx)
    }

    /// Numbers of held inodes and open handles (files, directories), for status and tests.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.inodes.len(), self.files.len(), self.dirs.len())
    }
}
