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

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use nix::errno::Errno;

use self::backing::CredGuard;
use self::control::{Command, ControlFile};
pub use self::error::{FsError, FsResult};
use self::handle::{DirHandle, FileHandle, HandleTable};
pub use self::inode::BackingRef;
use self::inode::{Inode, InodeTable, Name, Passthrough, Place, ROOT_ID};
pub use self::why::DenialRecord;
use self::why::WhyStore;
use crate::config::{Limits, OperatorMode};
use crate::identity::Identity;
use crate::policy::{
    check_new_child, decide, decide_link, decide_linked_rename, decide_rename,
    decide_smith_dir_move, decide_unseen_names, Area, Ctx, Decision, Denial, Depth, Family, MoveTo,
    NewKind, Op, Removal, SmithDirMove, Zone,
};
use crate::tree::model::SmithIdx;
use crate::tree::registry::Registry;
use crate::tree::scaffold::plan_smith;
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
    /// A project exists (PROTOCOL.md §11): every new smith dir gets a `workspace/`, and
    /// `workspace` is a structure area.
    pub project: bool,
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
            project: false,
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
            project: self.opts.project,
            names: &names,
        };
        f(&ctx)
    }

    /// Apply a decision: Ok, or record the denial (why + journal) and return its errno.
    fn enforce(
        &self,
        caller: &Caller,
        who: Identity,
        decision: Decision,
        op: &str,
        path: impl FnOnce() -> String,
    ) -> FsResult<()> {
        match decision {
            Decision::Allow => Ok(()),
            Decision::Deny(d) => Err(self.denied(caller, who, op, path(), d)),
        }
    }

    fn denied(&self, caller: &Caller, who: Identity, op: &str, path: String, d: Denial) -> FsError {
        self.record_denial(caller, who, op, path, d, true)
    }

    /// Record a denial for `.smithfs/why`; with `journal`, also send it to the journal
    /// (`access.denied`).
    fn record_denial(
        &self,
        caller: &Caller,
        who: Identity,
        op: &str,
        path: String,
        d: Denial,
        journal: bool,
    ) -> FsError {
        let errno = d.errno;
        let rec = DenialRecord {
            who: self.identity_name(who),
            smith: match who {
                Identity::Smith(s) => Some(s),
                Identity::Operator | Identity::Unknown => None,
            },
            pid: caller.pid,
            uid: caller.uid,
            time: crate::cli::init::now_rfc3339(),
            op: op.to_string(),
            path,
            errno: errno as i32,
            rule: d.rule.to_string(),
            why: d.why,
            alternative: d.alternative,
        };
        tracing::debug!(?rec, "denied");
        self.why.record(who, rec.clone());
        if journal {
            self.emit(FsEvent::Denied(Box::new(rec)));
        }
        FsError::Denied(errno)
    }

    /// Take the budget slot of one more open handle of `who`, or refuse the open: EMFILE when
    /// the smith holds `limits.max_open_files_per_smith` handles, ENFILE when the mount's share
    /// of the daemon's descriptors is used up. Every refusal is explained in `.smithfs/why`;
    /// the first of an episode is also journaled (a program retrying in a loop does not flood
    /// the journal).
    fn charge(
        &self,
        caller: &Caller,
        who: Identity,
        op: &str,
        path: impl FnOnce() -> String,
    ) -> FsResult<budget::Slot> {
        let refused = match self.open_limits.charge(who) {
            Ok(slot) => return Ok(slot),
            Err(r) => r,
        };
        let d = match refused.why {
            budget::Refusal::Smith { limit } => Denial {
                errno: Errno::EMFILE,
                rule: "open-files-per-smith",
                why: format!(
                    "{} already holds {limit} open files in this mount, the limit per smith (limits.max_open_files_per_smith): each open file or directory costs the daemon a descriptor, and its descriptors are shared by every smith.",
                    self.identity_name(who)
                ),
                alternative: "close files that are no longer needed (a memory mapping keeps its file open until it is unmapped), or ask the operator to raise limits.max_open_files_per_smith in config.json".into(),
            },
            budget::Refusal::Mount { limit } => Denial {
                errno: Errno::ENFILE,
                rule: "open-files-mount",
                why: format!(
                    "All {limit} open files the mount allows are in use (every smith and the operator together); the daemon keeps its other descriptors for its own work."
                ),
                alternative: "close files that are no longer needed, or run the daemon with a higher RLIMIT_NOFILE (as root it raises its own to fs.nr_open)".into(),
            },
        };
        Err(self.record_denial(caller, who, op, path(), d, refused.first))
    }

    fn identity_name(&self, who: Identity) -> String {
        match who {
            Identity::Smith(s) => self
                .registry
                .full_id(s)
                .unwrap_or_else(|| format!("smith #{}", s.0)),
            Identity::Operator => "operator".into(),
            Identity::Unknown => "unknown".into(),
        }
    }

    /// Decide `op` on `inode` (PROTOCOL.md §3). A file with one link — nearly every inode — is
    /// judged by the zone of its name, at the cost of one `decide`. A file with several names is
    /// judged by the intersection of the rights of every name the daemon has seen; when its link
    /// count says it has names the daemon has not seen (hard links made in the store behind the
    /// mount's back), it fails closed — only the operator and the owner of the zone of the name
    /// it is reached by keep their rights — unless a fresh look at the directories of its known
    /// names finds them all (docs/PROTOCOL-NOTES.md, note 24).
    fn decide_inode(&self, who: Identity, op: Op, inode: &Inode) -> Decision {
        let zone = self.zone(inode);
        let d = self.decide_zone(who, op, &zone);
        let links = inode.links();
        if !d.is_allowed() || inode.is_dir() || links <= 1 {
            return d;
        }
        let others = self.other_zones(inode);
        let d = self.decide_zones(who, op, &others);
        if !d.is_allowed() || others.len() as u64 + 1 >= links {
            return d;
        }
        let closed = self.with_ctx(|ctx| decide_unseen_names(&who, op, &zone, ctx));
        if closed.is_allowed() {
            return d;
        }
        match self.find_names(inode) {
            Some(zones) => self.decide_zones(who, op, &zones),
            None => closed,
        }
    }

    /// Decide `op` on every zone of `zones` (allowed when empty).
    fn decide_zones(&self, who: Identity, op: Op, zones: &[Zone]) -> Decision {
        self.with_ctx(|ctx| {
            zones
                .iter()
                .map(|z| decide(&who, op, z, ctx))
                .find(|d| !d.is_allowed())
                .unwrap_or(Decision::Allow)
        })
    }

    /// The zones of the other names of `inode` the daemon has seen, recomputed from their parent
    /// chains when a directory rename made them stale. Empty for nearly every inode.
    fn other_zones(&self, inode: &Inode) -> Vec<Zone> {
        let epoch = self.zone_epoch.load(Ordering::Acquire);
        let others: Vec<Name> = {
            let p = inode.place.lock();
            if p.others.iter().all(|o| o.epoch == epoch) {
                return p.others.iter().map(|o| o.zone).collect();
            }
            p.others.clone()
        };
        let mut zones = Vec::with_capacity(others.len());
        for o in &others {
            let zone = if o.epoch == epoch {
                o.zone
            } else {
                let zone = self
                    .entry_zone(o.parent, &o.name, inode.id, false)
                    .unwrap_or(o.zone);
                let mut p = inode.place.lock();
                if let Some(known) = p.others.iter_mut().find(|k| k.is(o.parent, &o.name)) {
                    known.zone = zone;
                    known.epoch = epoch;
                }
                zone
            };
            zones.push(zone);
        }
        zones
    }

    /// Look for every name of the non-directory `inode` in the directories of the names the
    /// daemon has seen (a fresh `stat`, and one `readdir` of each directory, at most
    /// [`Self::SCAN_MAX`] entries in all). When as many names as the link count were found they
    /// are recorded and their zones returned; else `None` (some name is elsewhere).
    fn find_names(&self, inode: &Inode) -> Option<Vec<Zone>> {
        let st = backing::stat(inode.fd().ok()?.as_fd()).ok()?;
        inode.note_links(st.st_nlink);
        let mut dirs: Vec<u64> = {
            let p = inode.place.lock();
            std::iter::once(p.parent)
                .chain(p.others.iter().map(|o| o.parent))
                .collect()
        };
        dirs.sort_unstable();
        dirs.dedup();
        let mut found: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut budget = Self::SCAN_MAX;
        for id in dirs {
            let Some(dir) = self.inodes.find(id) else {
                continue;
            };
            let Ok(fd) = dir.fd() else {
                continue;
            };
            let Ok(mut stream) = backing::DirStream::open(fd.as_fd()) else {
                continue;
            };
            while let Ok(Some(ent)) = stream.next_entry() {
                budget = budget.checked_sub(1)?;
                if ent.ino == st.st_ino && ent.name != b"." && ent.name != b".." {
                    found.push((id, ent.name));
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        if (found.len() as u64) < st.st_nlink {
            return None;
        }
        let epoch = self.zone_epoch.load(Ordering::Acquire);
        let mut named = Vec::with_capacity(found.len());
        for (dir, name) in found {
            let zone = self.entry_zone(dir, &name, inode.id, false)?;
            named.push((dir, name, zone));
        }
        let mut p = inode.place.lock();
        if !named.iter().any(|(d, n, _)| p.is(*d, n)) {
            let (d, n, z) = &named[0];
            p.set(*d, n, *z, epoch);
        }
        p.others.clear();
        for (d, n, z) in &named {
            p.add_name(*d, n, *z, epoch);
        }
        Some(named.into_iter().map(|(_, _, z)| z).collect())
    }

    /// Directory entries [`Self::find_names`] reads at most before it gives up (fails closed).
    const SCAN_MAX: usize = 100_000;

    fn decide_zone(&self, who: Identity, op: Op, zone: &Zone) -> Decision {
        self.with_ctx(|ctx| decide(&who, op, zone, ctx))
    }

    /// Check `op` on `inode` for the caller.
    fn check_inode(
        &self,
        caller: &Caller,
        who: Identity,
        op: Op,
        label: &str,
        inode: &Inode,
    ) -> FsResult<()> {
        let d = self.decide_inode(who, op, inode);
        self.enforce(caller, who, d, label, || self.path_of(inode))
    }

    /// The zone of `inode`, recomputed from its parent chain when a directory rename made the
    /// cached one stale.
    pub fn zone(&self, inode: &Inode) -> Zone {
        let epoch = self.zone_epoch.load(Ordering::Acquire);
        let (parent, name, cached) = {
            let p = inode.place.lock();
            if p.epoch == Place::FIXED || p.epoch == epoch {
                return p.zone;
            }
            (p.parent, p.name.clone(), p.zone)
        };
        let zone = self
            .entry_zone(parent, &name, inode.id, inode.is_dir())
            .unwrap_or(cached);
        let mut p = inode.place.lock();
        if p.parent == parent && p.name == name {
            p.zone = zone;
            p.epoch = epoch;
        }
        zone
    }

    /// The zone of the entry `name` (node id `id`, if it exists) in directory `parent`.
    fn entry_zone(&self, parent: u64, name: &[u8], id: u64, is_dir: bool) -> Option<Zone> {
        if is_dir {
            if let Some((idx, par, level)) = self.registry.smith_at(self.inodes.ids.node_id(id)) {
                return Some(Zone::smith_dir(idx, par, level));
            }
        }
        if parent == ROOT_ID && name == control::DIR_NAME.as_bytes() && id == control::DIR_ID {
            return Some(Zone::root().child_zone(OsStr::from_bytes(name)));
        }
        let dir = self.inodes.find(parent)?;
        Some(self.zone(&dir).child_zone(OsStr::from_bytes(name)))
    }

    /// The zone a new entry `name` gets in `dir` (never a registered smith dir).
    fn new_zone(&self, dir: &Inode, name: &OsStr) -> Zone {
        self.zone(dir).child_zone(name)
    }

    /// The zone of the existing entry `name` in `dir` (a registered smith dir is found by its
    /// backing inode number).
    fn existing_zone(
        &self,
        dir: &Inode,
        cname: &CStr,
        name: &OsStr,
    ) -> FsResult<(Zone, libc::stat)> {
        let st = backing::stat_at(dir.fd()?.as_fd(), cname)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if let Some((idx, par, level)) = self.registry.smith_at(st.st_ino) {
                return Ok((Zone::smith_dir(idx, par, level), st));
            }
        }
        Ok((self.new_zone(dir, name), st))
    }

    /// Mount-relative path of `inode`, from its parent chain (for messages only).
    pub fn path_of(&self, inode: &Inode) -> String {
        let mut parts: Vec<Box<[u8]>> = Vec::new();
        let mut cur = inode.id;
        for _ in 0..256 {
            if cur == ROOT_ID {
                break;
            }
            let Some(node) = self.inodes.find(cur) else {
                parts.push(Box::from(&b"?"[..]));
                break;
            };
            let p = node.place.lock();
            parts.push(p.name.clone());
            cur = p.parent;
        }
        parts.reverse();
        let joined: Vec<String> = parts
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        joined.join("/")
    }

    fn child_path(&self, dir: &Inode, name: &OsStr) -> String {
        let base = self.path_of(dir);
        if base.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{base}/{}", name.to_string_lossy())
        }
    }

    fn attr_of(&self, st: libc::stat) -> Attr {
        let mut st = st;
        st.st_ino = self.inodes.ids.node_id(st.st_ino);
        Attr(st)
    }

    /// Names in the store's root that the mount never shows or lets anyone create.
    fn reserved(parent: u64, name: &OsStr) -> bool {
        let n = name.as_bytes();
        (parent == ROOT_ID && (n == STATE_DIR.as_bytes() || n == control::DIR_NAME.as_bytes()))
            || backing::is_daemon_temp(n)
    }

    /// Refuse a change to the control directory `.smithfs/` or to a name the mount never shows
    /// (`.smithfs-state`, the daemon's temporary names), recording the reason like any denial
    /// (PROTOCOL.md §3, §7). `parent`/`name` name the entry the caller tried to change.
    fn refuse_reserved(
        &self,
        caller: &Caller,
        who: Identity,
        op: &str,
        parent: u64,
        name: &OsStr,
        errno: Errno,
    ) -> FsError {
        let path = if control::is_virtual(parent) {
            format!("{}/{}", control::DIR_NAME, name.to_string_lossy())
        } else if parent == ROOT_ID {
            name.to_string_lossy().into_owned()
        } else {
            self.inodes.get(parent).map_or_else(
                |_| name.to_string_lossy().into_owned(),
                |d| self.child_path(&d, name),
            )
        };
        let _ = self.denied(
            caller,
            who,
            op,
            path,
            Denial {
                errno,
                rule: "reserved-name",
                why: format!(
                    "`{}` is the control directory, and the daemon's own names are not part of \
                     the mount: neither can be changed through it.",
                    control::DIR_NAME
                ),
                alternative: "Use another name; write commands to .smithfs/ctl.".into(),
            },
        );
        FsError::Reserved(errno)
    }

    fn name_in(name: &OsStr) -> FsResult<CString> {
        Ok(backing::component(name)?)
    }

    /// Resolve `name` in `parent`, raising its lookup count (FUSE lookup). Allowed to every
    /// identity (PROTOCOL.md §3).
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<(Attr, Cache)> {
        if parent == ROOT_ID && name.as_bytes() == control::DIR_NAME.as_bytes() {
            return Ok((self.control_attr(control::DIR_ID), Cache::Never));
        }
        if parent == control::DIR_ID {
            let f = ControlFile::by_name(name).ok_or(FsError::Backing(Errno::ENOENT))?;
            return Ok((self.control_attr(f.id()), Cache::Never));
        }
        if Self::reserved(parent, name) {
            return Err(FsError::Reserved(Errno::ENOENT));
        }
        let dir = self.inodes.get(parent)?;
        let cname = Self::name_in(name)?;
        self.lookup_in(&dir, &cname)
            .map(|(_, a)| (a, Cache::Normal))
    }

    fn lookup_in(&self, dir: &Inode, cname: &CStr) -> FsResult<(Arc<Inode>, Attr)> {
        let fd = backing::lookup(dir.fd()?.as_fd(), cname)?;
        let st = backing::stat(fd.as_fd())?;
        let inode = self.inodes.remember(fd, &st);
        self.place(&inode, dir, cname.to_bytes(), st.st_nlink);
        Ok((inode, self.attr_of(st)))
    }

    /// The zone `inode` has as `name` in `dir`, and the epoch it is valid in.
    fn zone_for(&self, inode: &Inode, dir: &Inode, name: &[u8]) -> (Zone, u64) {
        let epoch = self.zone_epoch.load(Ordering::Acquire);
        let zone = self
            .entry_zone(dir.id, name, inode.id, inode.is_dir())
            .unwrap_or_else(Zone::root);
        (zone, epoch)
    }

    /// Record that `inode` was reached as `name` in `dir`, with the link count `nlink` just seen.
    /// A directory or a file with one link has exactly this name; a file with several keeps its
    /// other names too.
    fn place(&self, inode: &Inode, dir: &Inode, name: &[u8], nlink: u64) {
        inode.note_links(nlink);
        {
            let p = inode.place.lock();
            if p.epoch != 0 && p.is(dir.id, name) && (nlink > 1 || p.others.is_empty()) {
                return;
            }
        }
        let (zone, epoch) = self.zone_for(inode, dir, name);
        let mut p = inode.place.lock();
        if p.epoch == Place::FIXED {
            return;
        }
        if inode.is_dir() || nlink <= 1 {
            p.set(dir.id, name, zone, epoch);
            p.others.clear();
        } else {
            p.add_name(dir.id, name, zone, epoch);
        }
    }

    /// Drop `n` kernel references to `ino` (FUSE forget).
    pub fn forget(&self, ino: u64, n: u64) {
        if !control::is_virtual(ino) {
            self.inodes.forget(ino, n);
        }
    }

    fn control_attr(&self, id: u64) -> Attr {
        let root = self
            .inodes
            .root()
            .fd()
            .ok()
            .and_then(|f| backing::stat(f.as_fd()).ok());
        // SAFETY: an all-zero stat is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if let Some(r) = root {
            st.st_atime = r.st_atime;
            st.st_mtime = r.st_mtime;
            st.st_ctime = r.st_ctime;
            st.st_uid = r.st_uid;
            st.st_gid = r.st_gid;
            st.st_blksize = r.st_blksize;
        }
        st.st_ino = id;
        match ControlFile::by_id(id) {
            Some(f) => {
                st.st_mode = libc::S_IFREG | f.mode();
                st.st_nlink = 1;
            }
            None => {
                st.st_mode = libc::S_IFDIR | 0o555;
                st.st_nlink = 2;
            }
        }
        Attr(st)
    }

    /// Attributes of `ino`, through the handle `fh` if given (FUSE getattr).
    pub fn getattr(&self, ino: u64, fh: Option<u64>) -> FsResult<Attr> {
        if control::is_virtual(ino) {
            return Ok(self.control_attr(ino));
        }
        if let Some(fh) = fh {
            if let Ok(h) = self.files.get(fh) {
                let st = backing::stat(h.fd.as_fd())?;
                h.inode.note_links(st.st_nlink);
                return Ok(self.attr_of(st));
            }
        }
        let inode = self.inodes.get(ino)?;
        let st = backing::stat(inode.fd()?.as_fd())?;
        inode.note_links(st.st_nlink);
        Ok(self.attr_of(st))
    }

    /// Change attributes (FUSE setattr): mode, owner, size, times, in that order.
    /// Truncation through a handle is judged by the handle's opener; everything else by the
    /// caller (PROTOCOL.md §2).
    pub fn setattr(&self, caller: &Caller, ino: u64, set: &SetAttr) -> FsResult<Attr> {
        if control::is_virtual(ino) {
            // Truncating ctl on open (`echo … > ctl`) is harmless; nothing else changes.
            if ino == ControlFile::Ctl.id()
                && set.mode.is_none()
                && set.uid.is_none()
                && set.gid.is_none()
            {
                return Ok(self.control_attr(ino));
            }
            return Err(FsError::Backing(Errno::EPERM));
        }
        let inode = self.inodes.get(ino)?;
        let handle = set.fh.and_then(|fh| self.files.get(fh).ok());
        let who = self.identify(caller);
        let by_caller = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some();
        if by_caller {
            self.check_inode(caller, who, Op::Write, "setattr", &inode)?;
        }
        if let Some(mode) = set.mode {
            backing::chmod(inode.fd()?.as_fd(), mode & 0o7777)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            backing::chown(
                inode.fd()?.as_fd(),
                set.uid.unwrap_or(u32::MAX),
                set.gid.unwrap_or(u32::MAX),
            )?;
        }
        if let Some(size) = set.size {
            match &handle {
                Some(h) => {
                    if !h.may_write {
                        return Err(FsError::Backing(Errno::EBADF));
                    }
                    backing::ftruncate(h.fd.as_fd(), size)?;
                    h.dirty.store(true, Ordering::Relaxed);
                }
                None => {
                    self.check_inode(caller, who, Op::Write, "truncate", &inode)?;
                    let fd = backing::reopen(inode.fd()?.as_fd(), libc::O_WRONLY)?;
                    backing::ftruncate(fd.as_fd(), size)?;
                }
            }
            if caller.uid != 0 && set.mode.is_none() {
                // The reply carries the new attributes.
                kill_suid_sgid(&inode, caller)?;
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let omit = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            };
            let times = [set.atime.unwrap_or(omit), set.mtime.unwrap_or(omit)];
            backing::utimens(inode.fd()?.as_fd(), &times)?;
        }
        Ok(self.attr_of(backing::stat(inode.fd()?.as_fd())?))
    }

    /// The target of the symlink `ino` (FUSE readlink).
    pub fn readlink(&self, caller: &Caller, ino: u64) -> FsResult<Vec<u8>> {
        let inode = self.inodes.get(ino)?;
        self.check_inode(caller, self.identify(caller), Op::Read, "readlink", &inode)?;
        Ok(backing::readlink(inode.fd()?.as_fd())?)
    }

    /// Check a create of `name` in `parent` and return the directory and the C name.
    fn creating(
        &self,
        caller: &Caller,
        who: Identity,
        parent: u64,
        name: &OsStr,
        kind: NewKind,
        label: &str,
    ) -> FsResult<(Arc<Inode>, CString)> {
        if control::is_virtual(parent) || Self::reserved(parent, name) {
            return Err(self.refuse_reserved(caller, who, label, parent, name, Errno::EPERM));
        }
        let dir = self.inodes.get(parent)?;
        let cname = Self::name_in(name)?;
        let zone = self.new_zone(&dir, name);
        let d = self.decide_zone(who, Op::Create(kind), &zone);
        self.enforce(caller, who, d, label, || self.child_path(&dir, name))?;
        Ok((dir, cname))
    }

    /// Create a node (FUSE mknod): regular file, FIFO, socket or device, owned by the caller.
    pub fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> FsResult<Attr> {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFIFO => NewKind::Fifo,
            libc::S_IFSOCK => NewKind::Socket,
            libc::S_IFCHR | libc::S_IFBLK => NewKind::Device,
            _ => NewKind::File,
        };
        let who = self.identify(caller);
        let (dir, cname) = self.creating(caller, who, parent, name, kind, "mknod")?;
        {
            let _cred = as_caller(caller)?;
            backing::mknod(dir.fd()?.as_fd(), &cname, mode, u64::from(rdev))?;
        }
        self.lookup_in(&dir, &cname).map(|(_, a)| a)
    }

    /// Create a directory owned by the caller (FUSE mkdir). In a smith's `children/` this is
    /// the scaffold (PROTOCOL.md §4).
    pub fn mkdir(&self, caller: &Caller, parent: u64, name: &OsStr, mode: u32) -> FsResult<Attr> {
        let who = self.identify(caller);
        if !control::is_virtual(parent) && !Self::reserved(parent, name) {
            let dir = self.inodes.get(parent)?;
            if let Zone::Smith(z) = self.zone(&dir) {
                if z.area == Area::Children && z.depth == Depth::Top {
                    return self.make_child(caller, who, &dir, z.owner, name);
                }
            }
        }
        let (dir, cname) = self.creating(caller, who, parent, name, NewKind::Dir, "mkdir")?;
        {
            let _cred = as_caller(caller)?;
            backing::mkdir(dir.fd()?.as_fd(), &cname, mode)?;
        }
        self.lookup_in(&dir, &cname).map(|(_, a)| a)
    }

    /// The scaffold: check §4 in order, build the child under a temporary name, rename it into
    /// place, register it — serialised per parent so the limits hold under races.
    fn make_child(
        &self,
        caller: &Caller,
        who: Identity,
        dir: &Arc<Inode>,
        parent: SmithIdx,
        name: &OsStr,
    ) -> FsResult<Attr> {
        let cname = Self::name_in(name)?;
        let family_lock = self.registry.family(parent);
        let _serial = family_lock.lock();
        if backing::stat_at(dir.fd()?.as_fd(), &cname).is_ok() {
            return Err(FsError::Backing(Errno::EEXIST));
        }
        let info = self
            .registry
            .get(parent)
            .ok_or(FsError::Backing(Errno::ENOENT))?;
        let family = Family {
            parent,
            parent_level: info.level,
            highest_used: info.highest_child,
            n_children: info.children.len(),
            subtree_depth: 0,
        };
        let number = match self.with_ctx(|ctx| check_new_child(&who, &family, name, ctx)) {
            Ok(n) => n,
            Err(d) => return Err(self.denied(caller, who, "mkdir", self.child_path(dir, name), d)),
        };
        let id = name.to_string_lossy().into_owned();
        let full_id = format!("{}/{id}", info.full_id);
        let plan = plan_smith(
            &self.opts.templates,
            &id,
            &full_id,
            Some(&info.full_id),
            info.level + 1,
        )
        .map_err(|e| {
            tracing::error!("scaffold of {full_id}: {e}");
            FsError::Backing(Errno::EIO)
        })?;
        let mut plan = plan;
        if self.opts.project {
            plan.entries.extend(
                crate::workspace::plan_workspace(&full_id).ok_or(FsError::Backing(Errno::EIO))?,
            );
        }
        let children = dir.fd()?;
        let mount_point = &self.opts.mount_point;
        let run = crate::workspace::GitRun {
            cwd: children.as_fd(),
            detach: (!mount_point.as_os_str().is_empty()).then_some(mount_point.as_path()),
            creds: Some((caller.uid, caller.gid)),
        };
        let started = std::time::Instant::now();
        let mut finish = |tmp: &CStr| -> backing::SysResult<()> {
            let ws = std::path::Path::new(OsStr::from_bytes(tmp.to_bytes()))
                .join(crate::workspace::AREA);
            let base = crate::workspace::Base::Parent(std::path::Path::new("../workspace"));
            match crate::workspace::populate(&run, &ws, &full_id, base) {
                Ok(commit) => {
                    tracing::info!(smith = %full_id, %commit, ms = started.elapsed().as_millis() as u64, "workspace made");
                    Ok(())
                }
                Err(e) => {
                    tracing::error!(smith = %full_id, "cannot make the workspace: {e}");
                    Err(Errno::EIO)
                }
            }
        };
        scaffold::create_smith_dir(
            children.as_fd(),
            &cname,
            &plan,
            Some((caller.uid, caller.gid)),
            if self.opts.project {
                Some(&mut finish)
            } else {
                None
            },
        )?;
        let st = backing::stat_at(dir.fd()?.as_fd(), &cname)?;
        let idx = self.registry.register(Some(parent), &id, st.st_ino, None);
        self.registry.note_child_number(parent, number);
        if let Err(e) = scan::save_highest(self.state.as_fd(), &self.registry) {
            tracing::error!("cannot remember child numbers: {e}");
        }
        self.identities.register_smith(idx, &full_id);
        tracing::info!(smith = %full_id, "smith created");
        self.emit(FsEvent::SmithCreated {
            smith: idx,
            moved: false,
        });
        self.lookup_in(dir, &cname).map(|(_, a)| a)
    }

    /// Create a symlink owned by the caller (FUSE symlink).
    pub fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
    ) -> FsResult<Attr> {
        let who = self.identify(caller);
        let (dir, cname) = self.creating(caller, who, parent, name, NewKind::Symlink, "symlink")?;
        let ctarget =
            CString::new(target.as_bytes()).map_err(|_| FsError::Backing(Errno::EINVAL))?;
        {
            let _cred = as_caller(caller)?;
            backing::symlink(&ctarget, dir.fd()?.as_fd(), &cname)?;
        }
        self.lookup_in(&dir, &cname).map(|(_, a)| a)
    }

    /// Add the name `newname` in `newparent` for `ino` (FUSE link): only within one zone, else
    /// EXDEV (PROTOCOL.md §3).
    pub fn link(
        &self,
        caller: &Caller,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> FsResult<Attr> {
        let who = self.identify(caller);
        if control::is_virtual(ino)
            || control::is_virtual(newparent)
            || Self::reserved(newparent, newname)
        {
            return Err(self.refuse_reserved(
                caller,
                who,
                "link",
                newparent,
                newname,
                Errno::EPERM,
            ));
        }
        let inode = self.inodes.get(ino)?;
        let dir = self.inodes.get(newparent)?;
        let cname = Self::name_in(newname)?;
        let src = self.zone(&inode);
        let dst = self.new_zone(&dir, newname);
        let others = self.other_zones(&inode);
        // Every zone the file has names in must allow it (the intersection rule).
        let d = self.with_ctx(|ctx| {
            std::iter::once(&src)
                .chain(others.iter())
                .map(|z| decide_link(&who, z, &dst, ctx))
                .find(|d| !d.is_allowed())
                .unwrap_or(Decision::Allow)
        });
        self.enforce(caller, who, d, "link", || self.child_path(&dir, newname))?;
        backing::link(inode.fd()?.as_fd(), dir.fd()?.as_fd(), &cname)?;
        let (linked, attr) = self.lookup_in(&dir, &cname)?;
        self.completed_at(&dir, newname, &linked);
        Ok(attr)
    }

    /// Remove the name `name` from `parent` (FUSE unlink, or rmdir when `is_dir`).
    pub fn remove(&self, caller: &Caller, parent: u64, name: &OsStr, is_dir: bool) -> FsResult<()> {
        if control::is_virtual(parent) {
            let who = self.identify(caller);
            let op = if is_dir { "rmdir" } else { "unlink" };
            return Err(self.refuse_reserved(caller, who, op, parent, name, Errno::EPERM));
        }
        if Self::reserved(parent, name) {
            return Err(FsError::Reserved(Errno::ENOENT));
        }
        let who = self.identify(caller);
        let dir = self.inodes.get(parent)?;
        let cname = Self::name_in(name)?;
        let (zone, st) = self.existing_zone(&dir, &cname, name)?;
        let how = if is_dir {
            Removal::Rmdir
        } else {
            Removal::Unlink
        };
        let op = Op::Delete {
            how,
            subtree_live: self.subtree_live(&zone),
        };
        let d = self.decide_zone(who, op, &zone);
        self.enforce(
            caller,
            who,
            d,
            if is_dir { "rmdir" } else { "unlink" },
            || self.child_path(&dir, name),
        )?;
        backing::unlink(dir.fd()?.as_fd(), &cname, is_dir)?;
        if is_dir {
            self.smith_dir_gone(st.st_ino);
        } else {
            self.unnamed(&st, dir.id, name.as_bytes());
        }
        Ok(())
    }

    /// The directory with backing inode `ino` no longer exists (rmdir, or replaced by a
    /// rename): if it was a smith dir, forget that smith and its subtree, and release what the
    /// identity resolver held for them (their cgroups, PROTOCOL.md §2).
    fn smith_dir_gone(&self, ino: u64) {
        if let Some((idx, _, _)) = self.registry.smith_at(ino) {
            self.smith_gone(idx);
        }
    }

    /// Forget smith `idx` and its subtree, and release what the identity resolver and the open
    /// files' budget held for them.
    fn smith_gone(&self, idx: SmithIdx) {
        let gone = self.registry.unregister(idx);
        if gone.is_empty() {
            return;
        }
        for g in gone {
            self.identities.unregister_smith(g);
            self.open_limits.forget(g);
        }
        self.emit(FsEvent::SmithRemoved { smith: idx });
    }

    /// Rename (FUSE rename; `flags` are `RENAME_NOREPLACE`/`RENAME_EXCHANGE`): delete at the
    /// source and create at the destination (PROTOCOL.md §3). A moved directory carries its
    /// subtree to the new zone.
    pub fn rename(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        if Self::reserved(parent, name) && !control::is_virtual(parent) {
            return Err(FsError::Reserved(Errno::ENOENT));
        }
        let who = self.identify(caller);
        if control::is_virtual(parent) {
            return Err(self.refuse_reserved(caller, who, "rename", parent, name, Errno::EPERM));
        }
        if control::is_virtual(newparent) || Self::reserved(newparent, newname) {
            return Err(self.refuse_reserved(
                caller,
                who,
                "rename",
                newparent,
                newname,
                Errno::EPERM,
            ));
        }
        let from = self.inodes.get(parent)?;
        let to = self.inodes.get(newparent)?;
        let cname = Self::name_in(name)?;
        let cnew = Self::name_in(newname)?;
        if flags & libc::RENAME_WHITEOUT != 0 && who != Identity::Operator {
            // The whiteout left at the source is a character device (0, 0): a device node,
            // which only the operator may create (PROTOCOL.md §3).
            return Err(self.denied(
                caller,
                who,
                "rename",
                self.child_path(&from, name),
                Denial {
                    errno: Errno::EPERM,
                    rule: "rename-whiteout",
                    why: "RENAME_WHITEOUT leaves a device node behind, and only the operator \
                          may create device nodes."
                        .into(),
                    alternative: "Rename without RENAME_WHITEOUT.".into(),
                },
            ));
        }
        let (src_zone, src_st) = self.existing_zone(&from, &cname, name)?;
        let replaced = self.existing_zone(&to, &cnew, newname).ok();
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if src_st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if let Some((moved, _, _)) = self.registry.smith_at(src_st.st_ino) {
                let m = MovedSmith {
                    smith: moved,
                    zone: src_zone,
                    st: src_st,
                };
                let dst = Dest {
                    dir: &to,
                    cname: &cnew,
                    name: newname,
                    replaced: replaced.as_ref(),
                };
                return self.rename_smith_dir(caller, who, &from, name, &cname, &m, &dst, flags);
            }
        }
        let dst_zone = self.new_zone(&to, newname);
        let src_live = self.subtree_live(&src_zone);
        let replaced_live = replaced.as_ref().is_some_and(|(z, _)| self.subtree_live(z));
        let back = self.new_zone(&from, name);
        // A file with other names moves within its zone only (EXDEV, like link). The kernel
        // holds the inode's lock across link(2) and a non-directory's rename(2), so no link
        // through the mount slips in between this stat and the rename.
        let linked =
            |st: &libc::stat| st.st_mode & libc::S_IFMT != libc::S_IFDIR && st.st_nlink > 1;
        let d = self.with_ctx(|ctx| {
            let there = decide_rename(
                &who,
                &src_zone,
                src_live,
                &dst_zone,
                replaced.as_ref().map(|(z, _)| (z, replaced_live)),
                ctx,
            )
            .and(|| match linked(&src_st) {
                true => decide_linked_rename(&who, &src_zone, &dst_zone, ctx),
                false => Decision::Allow,
            });
            match (&replaced, exchange, there.is_allowed()) {
                (Some((rz, rst)), true, true) => decide_rename(
                    &who,
                    rz,
                    replaced_live,
                    &back,
                    Some((&src_zone, src_live)),
                    ctx,
                )
                .and(|| match linked(rst) {
                    true => decide_linked_rename(&who, rz, &back, ctx),
                    false => Decision::Allow,
                }),
                _ => there,
            }
        });
        self.enforce(caller, who, d, "rename", || self.child_path(&from, name))?;
        backing::rename(from.fd()?.as_fd(), &cname, to.fd()?.as_fd(), &cnew, flags)?;
        if src_st.st_mode & libc::S_IFMT == libc::S_IFDIR
            || replaced
                .as_ref()
                .is_some_and(|(_, st)| exchange && st.st_mode & libc::S_IFMT == libc::S_IFDIR)
        {
            self.zone_epoch.fetch_add(1, Ordering::AcqRel);
        }
        if let Some((_, st)) = &replaced {
            if !exchange && st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_ino != src_st.st_ino
            {
                // An (empty) smith dir replaced by a rename is gone like one removed by rmdir.
                self.smith_dir_gone(st.st_ino);
            }
        }
        self.moved(&src_st, (from.id, name.as_bytes()), &to, newname.as_bytes());
        match &replaced {
            Some((_, st)) if exchange => {
                self.moved(st, (to.id, newname.as_bytes()), &from, name.as_bytes());
            }
            Some((_, st)) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                self.unnamed(st, to.id, newname.as_bytes());
            }
            Some(_) | None => {}
        }
        if let Some(moved) = self.inodes.find(self.inodes.ids.node_id(src_st.st_ino)) {
            self.completed_at(&to, newname, &moved);
        } else if src_st.st_mode & libc::S_IFMT == libc::S_IFREG {
            self.completed_name(&to, newname);
        }
        Ok(())
    }

    /// Rename the registered smith dir `m` (`name` in `from`) to `dst` (docs/PROTOCOL-NOTES.md,
    /// note 35): allowed to the operator alone, never for the root, while no run in its subtree
    /// is live (else EBUSY). Directly into a smith's `children/` it is admitted as a mkdir there
    /// would be (PROTOCOL.md §4) and stays a smith dir: the old subtree is unregistered and the
    /// new location registered by scanning it, under new full ids. Anywhere else it becomes
    /// ordinary data of its new zone, its smiths unregistered as by rmdir. Serialised with the
    /// destination smith's mkdirs, so the §4 limits hold under races.
    #[allow(clippy::too_many_arguments)]
    fn rename_smith_dir(
        &self,
        caller: &Caller,
        who: Identity,
        from: &Inode,
        name: &OsStr,
        cname: &CStr,
        m: &MovedSmith,
        dst: &Dest<'_>,
        flags: u32,
    ) -> FsResult<()> {
        let into = match self.zone(dst.dir) {
            Zone::Smith(z) if z.area == Area::Children && z.depth == Depth::Top => Some(z.owner),
            Zone::Smith(_) | Zone::Outside { .. } => None,
        };
        let family_lock = into.map(|p| self.registry.family(p));
        let _serial = family_lock.as_ref().map(|l| l.lock());
        let family = match into {
            Some(p) => {
                let info = self
                    .registry
                    .get(p)
                    .ok_or(FsError::Backing(Errno::ENOENT))?;
                let subtree = self.registry.subtree(m.smith);
                let own_level = subtree.first().map_or(0, |s| s.level);
                let deepest = subtree.iter().map(|s| s.level).max().unwrap_or(own_level);
                let leaving = usize::from(info.children.contains(&m.smith));
                Some(Family {
                    parent: p,
                    parent_level: info.level,
                    highest_used: info.highest_child,
                    n_children: info.children.len().saturating_sub(leaving),
                    subtree_depth: deepest.saturating_sub(own_level),
                })
            }
            None => None,
        };
        let data_zone = self.new_zone(dst.dir, dst.name);
        let replaced = dst.replaced.map(|(z, _)| (z, self.subtree_live(z)));
        let mv = SmithDirMove {
            src: &m.zone,
            src_live: self.subtree_live(&m.zone),
            to: match &family {
                Some(f) => MoveTo::Children(f),
                None => MoveTo::Data(&data_zone),
            },
            name: dst.name,
            replaced,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
        };
        let number = match self.with_ctx(|ctx| decide_smith_dir_move(&who, &mv, ctx)) {
            Ok(n) => n,
            Err(d) => {
                return Err(self.denied(caller, who, "rename", self.child_path(from, name), d))
            }
        };
        let old_full = self.registry.full_id(m.smith).unwrap_or_default();
        // Remembered child numbers move with the subtree, re-keyed by the new full ids.
        let carried: std::collections::HashMap<String, u32> = match &family {
            Some(f) => {
                let new_full = format!(
                    "{}/{}",
                    self.registry.full_id(f.parent).unwrap_or_default(),
                    dst.name.to_string_lossy()
                );
                self.registry
                    .subtree(m.smith)
                    .into_iter()
                    .filter_map(|s| {
                        let rest = s.full_id.strip_prefix(&old_full)?;
                        Some((format!("{new_full}{rest}"), s.highest_child?))
                    })
                    .collect()
            }
            None => std::collections::HashMap::new(),
        };
        backing::rename(
            from.fd()?.as_fd(),
            cname,
            dst.dir.fd()?.as_fd(),
            dst.cname,
            flags,
        )?;
        // The rename is done: from here on nothing fails the request (the kernel must learn the
        // new name), problems are logged.
        if let Some((_, st)) = dst.replaced {
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                self.smith_dir_gone(st.st_ino);
            }
        }
        // By index, not by inode number: a concurrent rescan may already have registered the
        // new location under that inode number.
        self.smith_gone(m.smith);
        let mut registered = Vec::new();
        if let (Some(f), Some(n)) = (&family, number) {
            let scanned = dst.dir.fd().and_then(|fd| {
                scan::scan_moved(fd.as_fd(), dst.cname, f.parent, &self.registry, &carried)
                    .map_err(FsError::Backing)
            });
            match scanned {
                Ok(idx) => registered = self.registry.subtree(idx),
                Err(e) => tracing::error!(
                    "cannot register the smith dir {old_full} moved to {}: {e}",
                    self.child_path(dst.dir, dst.name)
                ),
            }
            self.registry.note_child_number(f.parent, n);
            if let Err(e) = scan::save_highest(self.state.as_fd(), &self.registry) {
                tracing::error!("cannot remember child numbers: {e}");
            }
        }
        // Zones below the moved directory are recomputed from the registry as it is now.
        self.zone_epoch.fetch_add(1, Ordering::AcqRel);
        self.moved(
            &m.st,
            (from.id, name.as_bytes()),
            dst.dir,
            dst.name.as_bytes(),
        );
        for s in &registered {
            self.identities.register_smith(s.idx, &s.full_id);
        }
        match registered.first() {
            Some(top) => tracing::info!(from = %old_full, to = %top.full_id, "smith dir moved"),
            None => tracing::info!(
                from = %old_full,
                to = %self.child_path(dst.dir, dst.name),
                "smith dir moved out of the tree"
            ),
        }
        for s in &registered {
            self.emit(FsEvent::SmithCreated {
                smith: s.idx,
                moved: true,
            });
        }
        Ok(())
    }

    /// Update the place of a renamed inode whose `stat` before the rename was `st` (if the kernel
    /// holds it): the name `from` (directory node id, name) is now `name` in `dir`. A file with
    /// other names keeps them: the rename moved one name, not the inode.
    fn moved(&self, st: &libc::stat, from: (u64, &[u8]), dir: &Inode, name: &[u8]) {
        let Some(inode) = self.inodes.find(self.inodes.ids.node_id(st.st_ino)) else {
            return;
        };
        let (zone, epoch) = self.zone_for(&inode, dir, name);
        let mut p = inode.place.lock();
        if inode.is_dir() || st.st_nlink <= 1 {
            p.set(dir.id, name, zone, epoch);
            p.others.clear();
        } else {
            p.rename_name(from, (dir.id, name), zone, epoch);
        }
    }

    /// The name `name` in directory `dir` of the non-directory whose `stat` before the removal
    /// was `st` is gone (unlink, or replaced by a rename): forget the name and note one link less
    /// (if the kernel holds the inode).
    fn unnamed(&self, st: &libc::stat, dir: u64, name: &[u8]) {
        let Some(inode) = self.inodes.find(self.inodes.ids.node_id(st.st_ino)) else {
            return;
        };
        if inode.is_dir() {
            return;
        }
        inode.note_links(st.st_nlink.saturating_sub(1));
        inode.place.lock().remove_name(dir, name);
    }

    /// If `inode` (a regular file now named `name` in `dir`) is a protocol file, report its
    /// completion (PROTOCOL.md §5).
    fn completed_at(&self, dir: &Inode, name: &OsStr, inode: &Inode) {
        if inode.kind == libc::S_IFREG {
            self.completed_name(dir, name);
        }
    }

    fn completed_name(&self, dir: &Inode, name: &OsStr) {
        if let Some(e) = completion(self.zone(dir), name.as_bytes()) {
            self.emit(e);
        }
    }

    /// Open `ino` with `flags` (FUSE open); returns the handle number and how to cache it.
    pub fn open(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<(u64, Cache)> {
        if let Some(f) = ControlFile::by_id(ino) {
            return self
                .open_control(caller, f, flags)
                .map(|fh| (fh, Cache::Never));
        }
        if control::is_virtual(ino) {
            return Err(FsError::Backing(Errno::EISDIR));
        }
        let inode = self.inodes.get(ino)?;
        let who = self.identify(caller);
        let acc = flags & libc::O_ACCMODE;
        let may_write = acc != libc::O_RDONLY;
        let truncates = flags & libc::O_TRUNC != 0;
        if acc != libc::O_WRONLY {
            self.check_inode(caller, who, Op::Read, "open for reading", &inode)?;
        }
        if may_write || truncates {
            self.check_inode(caller, who, Op::Write, "open for writing", &inode)?;
        }
        let slot = self.charge(caller, who, "open", || self.path_of(&inode))?;
        let fd = backing::reopen(inode.fd()?.as_fd(), flags)?;
        if truncates && caller.uid != 0 && kill_suid_sgid(&inode, caller)? {
            self.attrs_changed(inode.id);
        }
        let fh = self.files.insert(FileHandle {
            fd,
            inode,
            opener: who,
            flags,
            may_write,
            // Opened with write access or O_TRUNC: its release completes the file (§5).
            dirty: std::sync::atomic::AtomicBool::new(may_write || truncates),
            passthrough: std::sync::atomic::AtomicBool::new(false),
            slot,
        });
        Ok((fh, Cache::Normal))
    }

    /// Create and open `name` in `parent` (FUSE create); the new file belongs to the caller.
    pub fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Attr, u64)> {
        let who = self.identify(caller);
        let (dir, cname) = self.creating(caller, who, parent, name, NewKind::File, "create")?;
        let slot = self.charge(caller, who, "create", || self.child_path(&dir, name))?;
        let fd = {
            let _cred = as_caller(caller)?;
            backing::open_beneath(dir.fd()?.as_fd(), &cname, flags | libc::O_CREAT, mode)?
        };
        let (inode, attr) = self.lookup_in(&dir, &cname)?;
        let may_write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let fh = self.files.insert(FileHandle {
            fd,
            inode,
            opener: who,
            flags,
            may_write,
            dirty: std::sync::atomic::AtomicBool::new(true),
            passthrough: std::sync::atomic::AtomicBool::new(false),
            slot,
        });
        Ok((attr, fh))
    }

    /// The passthrough backing for the freshly opened handle `fh` of a regular file: the inode's
    /// shared registration, or a new one made by `register` from an `O_RDWR` descriptor. `None`
    /// when this inode cannot be passed through (its opens then go through the daemon).
    ///
    /// The inode's passthrough lock is held across the reopen and `register` (one ioctl), so
    /// concurrent opens of one file share one registration.
    pub fn passthrough(
        &self,
        fh: u64,
        register: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> std::io::Result<BackingRef>,
    ) -> Option<BackingRef> {
        let h = self.files.get(fh).ok()?;
        if h.inode.kind != libc::S_IFREG {
            return None;
        }
        let mut pt = h.inode.passthrough.lock();
        let backing = match &mut *pt {
            Passthrough::Never => return None,
            Passthrough::Cached { users } => {
                *users += 1;
                h.passthrough.store(true, Ordering::Relaxed);
                return None;
            }
            Passthrough::Active { backing, users } => {
                *users += 1;
                backing.clone()
            }
            Passthrough::Idle if setid(&h.fd) => {
                *pt = Passthrough::Cached { users: 1 };
                h.passthrough.store(true, Ordering::Relaxed);
                return None;
            }
            Passthrough::Idle => {
                let made = h
                    .inode
                    .fd()
                    .map_err(|e| std::io::Error::from(e.errno()))
                    .and_then(|f| {
                        backing::reopen(f.as_fd(), libc::O_RDWR).map_err(std::io::Error::from)
                    })
                    .and_then(|fd| register(fd.as_fd()));
                match made {
                    Ok(backing) => {
                        *pt = Passthrough::Active {
                            backing: backing.clone(),
                            users: 1,
                        };
                        backing
                    }
                    Err(e) => {
                        tracing::debug!(ino = h.inode.id, "no passthrough: {e}");
                        *pt = Passthrough::Never;
                        return None;
                    }
                }
            }
        };
        h.passthrough.store(true, Ordering::Relaxed);
        Some(backing)
    }

    /// Read up to `size` bytes at `offset` through handle `fh` (FUSE read).
    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        if control::is_virtual(ino) {
            let h = self.controls.get(fh)?;
            let start = (offset as usize).min(h.data.len());
            let end = (start + size as usize).min(h.data.len());
            return Ok(h.data[start..end].to_vec());
        }
        let h = self.files.get(fh)?;
        let mut buf = vec![0u8; size as usize];
        let mut done = 0usize;
        while done < buf.len() {
            let n = backing::pread(h.fd.as_fd(), &mut buf[done..], offset + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// Write `data` at `offset` through handle `fh` (FUSE write); `kill_suidgid` is the kernel's
    /// request to clear setuid/setgid (`FUSE_WRITE_KILL_SUIDGID`, with `HANDLE_KILLPRIV_V2`).
    /// A write to `.smithfs/ctl` runs its commands as the writing process (PROTOCOL.md §7).
    pub fn write(
        &self,
        caller: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> FsResult<u32> {
        if control::is_virtual(ino) {
            return self.write_control(caller, fh, data);
        }
        let h = self.files.get(fh)?;
        if !h.may_write {
            return Err(FsError::Backing(Errno::EBADF));
        }
        if kill_suidgid && kill_suid_sgid(&h.inode, caller)? {
            self.attrs_changed(h.inode.id);
        }
        let mut done = 0usize;
        while done < data.len() {
            let n = if h.flags & libc::O_APPEND != 0 {
                backing::write(h.fd.as_fd(), &data[done..])?
            } else {
                backing::pwrite(h.fd.as_fd(), &data[done..], offset + done as u64)?
            };
            if n == 0 {
                break;
            }
            done += n;
        }
        h.dirty.store(true, Ordering::Relaxed);
        Ok(done as u32)
    }

    /// Flush (FUSE flush, at each close of a descriptor): nothing is buffered in the daemon.
    pub fn flush(&self, ino: u64, fh: u64) -> FsResult<()> {
        if control::is_virtual(ino) {
            return Ok(());
        }
        self.files.get(fh).map(drop)
    }

    /// Release the handle `fh` (FUSE release, at the last close). Releasing a handle that wrote
    /// completes the file (PROTOCOL.md §5).
    pub fn release(&self, ino: u64, fh: u64) -> FsResult<()> {
        if control::is_virtual(ino) {
            return self.controls.remove(fh).map(drop).ok_or(FsError::Stale);
        }
        let h = self.files.remove(fh).ok_or(FsError::Stale)?;
        if h.passthrough.load(Ordering::Relaxed) {
            let mut pt = h.inode.passthrough.lock();
            match &mut *pt {
                Passthrough::Active { users, .. } | Passthrough::Cached { users } => {
                    *users -= 1;
                    if *users == 0 {
                        // Dropping the last reference closes the kernel registration.
                        *pt = Passthrough::Idle;
                    }
                }
                Passthrough::Idle | Passthrough::Never => {}
            }
        }
        if h.dirty.load(Ordering::Relaxed) && h.inode.kind == libc::S_IFREG {
            let (parent, name) = {
                let p = h.inode.place.lock();
                (p.parent, p.name.clone())
            };
            if let Some(dir) = self.inodes.find(parent) {
                if let Some(e) = completion(self.zone(&dir), &name) {
                    self.emit(e);
                }
            }
        }
        Ok(())
    }

    /// Flush a file to stable storage (FUSE fsync).
    pub fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> FsResult<()> {
        if control::is_virtual(ino) {
            return Ok(());
        }
        let h = self.files.get(fh)?;
        Ok(backing::fsync(h.fd.as_fd(), datasync)?)
    }

    /// Open the directory `ino` for reading (FUSE opendir).
    pub fn opendir(&self, caller: &Caller, ino: u64) -> FsResult<u64> {
        let who = self.identify(caller);
        if ino == control::DIR_ID {
            if who == Identity::Unknown {
                return Err(FsError::Backing(Errno::EACCES));
            }
            return Ok(0);
        }
        let inode = self.inodes.get(ino)?;
        self.check_inode(caller, who, Op::Read, "list", &inode)?;
        let slot = self.charge(caller, who, "list", || self.path_of(&inode))?;
        let stream = backing::DirStream::open(inode.fd()?.as_fd())?;
        Ok(self.dirs.insert(DirHandle {
            stream: parking_lot::Mutex::new(stream),
            inode,
            opener: who,
            slot,
        }))
    }

    /// List the directory behind handle `fh` from cookie `offset`, feeding entries to `add`
    /// until it returns `true` (buffer full). With `plus`, each entry but `.`/`..` is looked up;
    /// an entry that does not fit is forgotten again. The root also lists `.smithfs`.
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(&DirEntryOut<'_>) -> bool,
    ) -> FsResult<()> {
        if ino == control::DIR_ID {
            let names: Vec<(u64, u32, &str)> = [
                (control::DIR_ID, libc::S_IFDIR, "."),
                (ROOT_ID, libc::S_IFDIR, ".."),
            ]
            .into_iter()
            .chain(
                ControlFile::ALL
                    .iter()
                    .map(|f| (f.id(), libc::S_IFREG, f.name())),
            )
            .collect();
            for (i, (id, kind, name)) in names.into_iter().enumerate().skip(offset as usize) {
                let e = DirEntryOut {
                    ino: id,
                    offset: i as u64 + 1,
                    kind,
                    name: OsStr::new(name),
                    attr: plus.then(|| self.control_attr(id)),
                };
                if add(&e) {
                    break;
                }
            }
            return Ok(());
        }
        let h = self.dirs.get(fh)?;
        let at_root = h.inode.id == ROOT_ID;
        let mut stream = h.stream.lock();
        stream.seek(offset);
        while let Some(ent) = stream.next_entry()? {
            let name = OsStr::from_bytes(&ent.name);
            if Self::reserved(h.inode.id, name) {
                continue;
            }
            let dot = ent.name == b"." || ent.name == b"..";
            let kind = u32::from(ent.kind) << 12;
            let mut out = DirEntryOut {
                ino: self.inodes.ids.node_id(ent.ino),
                offset: ent.next_offset,
                kind,
                name,
                attr: None,
            };
            if plus {
                if dot {
                    // SAFETY: an all-zero stat is a valid value.
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    st.st_ino = ent.ino;
                    st.st_mode = kind;
                    out.attr = Some(Attr(st));
                } else {
                    let cname = CString::new(ent.name.clone())
                        .map_err(|_| FsError::Backing(Errno::EINVAL))?;
                    match self.lookup_in(&h.inode, &cname) {
                        Ok((_, attr)) => {
                            out.ino = attr.0.st_ino;
                            out.attr = Some(attr);
                        }
                        // Removed since it was listed: skip it.
                        Err(_) => continue,
                    }
                }
            }
            if add(&out) {
                if plus && !dot {
                    self.inodes.forget(out.ino, 1);
                }
                return Ok(());
            }
        }
        if at_root {
            // `.smithfs` after the real entries; its cookie is past every telldir value.
            let e = DirEntryOut {
                ino: control::DIR_ID,
                offset: i64::MAX as u64,
                kind: libc::S_IFDIR,
                name: OsStr::new(control::DIR_NAME),
                attr: plus.then(|| self.control_attr(control::DIR_ID)),
            };
            if offset != i64::MAX as u64 {
                add(&e);
            }
        }
        Ok(())
    }

    /// Close the directory handle `fh` (FUSE releasedir).
    pub fn releasedir(&self, ino: u64, fh: u64) -> FsResult<()> {
        if ino == control::DIR_ID {
            return Ok(());
        }
        self.dirs.remove(fh).map(drop).ok_or(FsError::Stale)
    }

    /// Flush a directory (FUSE fsyncdir).
    pub fn fsyncdir(&self, ino: u64, fh: u64, datasync: bool) -> FsResult<()> {
        if ino == control::DIR_ID {
            return Ok(());
        }
        let h = self.dirs.get(fh)?;
        let stream = h.stream.lock();
        Ok(backing::fsync(stream.fd(), datasync)?)
    }

    /// Filesystem statistics of the store (FUSE statfs).
    pub fn statfs(&self, ino: u64) -> FsResult<libc::statvfs> {
        let inode = self.inodes.get(ino).unwrap_or_else(|_| self.inodes.root());
        Ok(backing::statfs(inode.fd()?.as_fd())?)
    }

    /// Set an extended attribute (FUSE setxattr), judged by the caller.
    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        if control::is_virtual(ino) {
            return Err(FsError::Backing(Errno::EPERM));
        }
        let inode = self.inodes.get(ino)?;
        self.check_inode(caller, self.identify(caller), Op::Write, "setxattr", &inode)?;
        let cname = xattr_name(name)?;
        Ok(backing::setxattr(
            inode.fd()?.as_fd(),
            &cname,
            value,
            flags,
        )?)
    }

    /// Get an extended attribute (FUSE getxattr): with `size == 0`, its size.
    pub fn getxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        size: u32,
    ) -> FsResult<XattrReply> {
        if control::is_virtual(ino) {
            return Err(FsError::Backing(Errno::ENODATA));
        }
        let inode = self.inodes.get(ino)?;
        self.check_inode(caller, self.identify(caller), Op::Read, "getxattr", &inode)?;
        let cname = xattr_name(name)?;
        let fd = inode.fd()?;
        xattr_reply(size, |buf| backing::getxattr(fd.as_fd(), &cname, buf))
    }

    /// List extended attribute names (FUSE listxattr).
    pub fn listxattr(&self, caller: &Caller, ino: u64, size: u32) -> FsResult<XattrReply> {
        if control::is_virtual(ino) {
            return Ok(XattrReply::Size(0));
        }
        let inode = self.inodes.get(ino)?;
        self.check_inode(caller, self.identify(caller), Op::Read, "listxattr", &inode)?;
        let fd = inode.fd()?;
        xattr_reply(size, |buf| backing::listxattr(fd.as_fd(), buf))
    }

    /// Remove an extended attribute (FUSE removexattr).
    pub fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<()> {
        if control::is_virtual(ino) {
            return Err(FsError::Backing(Errno::EPERM));
        }
        let inode = self.inodes.get(ino)?;
        self.check_inode(
            caller,
            self.identify(caller),
            Op::Write,
            "removexattr",
            &inode,
        )?;
        let cname = xattr_name(name)?;
        Ok(backing::removexattr(inode.fd()?.as_fd(), &cname)?)
    }

    /// Allocate or punch space through handle `fh` (FUSE fallocate), judged by its opener.
    pub fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        let h = self.files.get(fh)?;
        if !h.may_write {
            return Err(FsError::Backing(Errno::EBADF));
        }
        backing::fallocate(h.fd.as_fd(), mode, offset, length)?;
        h.dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Seek for data or holes through handle `fh` (FUSE lseek).
    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        let h = self.files.get(fh)?;
        Ok(backing::lseek(h.fd.as_fd(), offset, whence)?)
    }

    /// Copy a range between two handles (FUSE copy_file_range), judged by their openers.
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> FsResult<u32> {
        let hin = self.files.get(fh_in)?;
        let hout = self.files.get(fh_out)?;
        if !hout.may_write {
            return Err(FsError::Backing(Errno::EBADF));
        }
        let len = len.min(u64::from(u32::MAX >> 1)) as usize;
        let n =
            backing::copy_file_range(hin.fd.as_fd(), off_in, hout.fd.as_fd(), off_out, len, flags)?;
        hout.dirty.store(true, Ordering::Relaxed);
        Ok(n as u32)
    }

    /// Numbers of held inodes and open handles (files, directories), for status and tests.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.inodes.len(), self.files.len(), self.dirs.len())
    }

    fn open_control(&self, caller: &Caller, f: ControlFile, flags: i32) -> FsResult<u64> {
        let who = self.identify(caller);
        let writing = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let refusal = match () {
            _ if who == Identity::Unknown => Some((
                "unknown-control",
                "A process of unknown identity may not open the control files.",
            )),
            _ if writing && f != ControlFile::Ctl => Some((
                "control-read-only",
                "Only .smithfs/ctl is writable in the control directory.",
            )),
            _ => None,
        };
        if let Some((rule, why)) = refusal {
            let path = format!("{}/{}", control::DIR_NAME, f.name());
            return Err(self.denied(
                caller,
                who,
                if writing {
                    "open for writing"
                } else {
                    "open for reading"
                },
                path,
                Denial {
                    errno: Errno::EACCES,
                    rule,
                    why: why.into(),
                    alternative: "Read whoami, why, status.json and events.jsonl; write commands \
                                  to ctl."
                        .into(),
                },
            ));
        }
        let data = match f {
            ControlFile::Whoami => self.whoami_text(caller, who).into_bytes(),
            ControlFile::Why => match self.why.latest(who, caller.uid) {
                Some(r) => r.render().into_bytes(),
                None => {
                    format!("no denial recorded for {}\n", self.identity_name(who)).into_bytes()
                }
            },
            ControlFile::Status => match self.status.get() {
                Some(s) => s().into_bytes(),
                None => self.plain_status().into_bytes(),
            },
            ControlFile::Events => journal_lines(
                &backing::read_file(self.state.as_fd(), std::path::Path::new("events.jsonl"))
                    .unwrap_or_default(),
            ),
            ControlFile::Ctl => Vec::new(),
        };
        Ok(self.controls.insert(ControlHandle { file: f, data }))
    }

    fn write_control(&self, caller: &Caller, fh: u64, data: &[u8]) -> FsResult<u32> {
        let h = self.controls.get(fh)?;
        if h.file != ControlFile::Ctl {
            return Err(FsError::Backing(Errno::EBADF));
        }
        let who = self.identify(caller);
        let text = std::str::from_utf8(data).map_err(|_| FsError::Backing(Errno::EINVAL))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            self.run_command(caller, who, line)?;
        }
        Ok(data.len() as u32)
    }

    /// Run one `ctl` command as `who` (PROTOCOL.md §7).
    fn run_command(&self, caller: &Caller, who: Identity, line: &str) -> FsResult<()> {
        let path = || format!("{}/{}", control::DIR_NAME, ControlFile::Ctl.name());
        let cmd = match control::parse_command(line) {
            Ok(c) => c,
            Err(msg) => {
                return Err(self.denied(
                    caller,
                    who,
                    "ctl",
                    path(),
                    Denial {
                        errno: Errno::EINVAL,
                        rule: "ctl-syntax",
                        why: format!("{msg}."),
                        alternative: "Write `bind <full-id>` or `cancel <full-id>`, one per line."
                            .into(),
                    },
                ))
            }
        };
        let (verb, full_id) = match &cmd {
            Command::Bind(f) => ("bind", f.clone()),
            Command::Cancel(f) => ("cancel", f.clone()),
        };
        let deny = |d: Denial| self.denied(caller, who, verb, path(), d);
        let Some(smith) = self.registry.by_full_id(&full_id) else {
            return Err(deny(Denial {
                errno: Errno::ENOENT,
                rule: "ctl-no-such-smith",
                why: format!("There is no smith {full_id}."),
                alternative: "Name an existing smith by its full id (see `smithfs status`).".into(),
            }));
        };
        match cmd {
            Command::Bind(_) => {
                if who != Identity::Operator {
                    return Err(deny(Denial {
                        errno: Errno::EACCES,
                        rule: "ctl-bind-operator-only",
                        why: format!(
                            "Only the operator may bind a process; {} may not.",
                            self.identity_name(who)
                        ),
                        alternative: "Smiths start children by writing their inboxes.".into(),
                    }));
                }
                if let Err(e) = self.identities.bind(caller.pid, smith) {
                    return Err(deny(Denial {
                        errno: e.errno,
                        rule: "ctl-bind-failed",
                        why: format!(
                            "Process {} could not be bound to {full_id}: {}.",
                            caller.pid, e.reason
                        ),
                        alternative: "Retry `smithfs run`; if it keeps failing, see \
                                          `smithfs doctor` and the daemon log \
                                          (.smithfs-state/daemon.log)."
                            .into(),
                    }));
                }
                tracing::info!(pid = caller.pid, smith = %full_id, "process bound");
            }
            Command::Cancel(_) => {
                let allowed = match who {
                    Identity::Operator => true,
                    Identity::Smith(s) => self.registry.is_ancestor(s, smith),
                    Identity::Unknown => false,
                };
                if !allowed {
                    return Err(deny(Denial {
                        errno: Errno::EACCES,
                        rule: "ctl-cancel-ancestor-only",
                        why: format!(
                            "{} may not cancel {full_id}: only the operator or an ancestor may.",
                            self.identity_name(who)
                        ),
                        alternative: "Cancel your own descendants only.".into(),
                    }));
                }
                self.emit(FsEvent::Cancel { smith });
            }
        }
        Ok(())
    }

    /// `.smithfs/whoami`: key: value lines (PROTOCOL.md §7).
    fn whoami_text(&self, caller: &Caller, who: Identity) -> String {
        self.with_ctx(|ctx| self.whoami_lines(caller, who, ctx))
    }

    fn whoami_lines(&self, caller: &Caller, who: Identity, ctx: &Ctx<'_>) -> String {
        let mut out = String::new();
        let kind = match who {
            Identity::Smith(_) => "smith",
            Identity::Operator => "operator",
            Identity::Unknown => "unknown",
        };
        out.push_str(&format!("identity: {kind}\n"));
        match who {
            Identity::Smith(s) => {
                if let Some(info) = self.registry.get(s) {
                    let parent = info
                        .parent
                        .and_then(|p| self.registry.full_id(p))
                        .unwrap_or_default();
                    out.push_str(&format!("full id: {}\n", info.full_id));
                    out.push_str(&format!("smith id: {}\n", info.id));
                    out.push_str(&format!("level: {}\n", info.level));
                    out.push_str(&format!("parent: {parent}\n"));
                    out.push_str(&format!(
                        "smith dir: {}\n",
                        self.opts.mount_point.join(info.rel_dir()).display()
                    ));
                    let z = |area| {
                        Zone::Smith(crate::policy::SmithZone {
                            owner: s,
                            owner_parent: info.parent,
                            owner_level: info.level,
                            area,
                            depth: Depth::Inner,
                        })
                    };
                    for (label, area) in [
                        ("smith.md", Area::SmithMd),
                        ("config.json", Area::Config),
                        ("inbox", Area::Inbox),
                        ("private", Area::Private),
                        ("outbox", Area::Outbox),
                        ("conversations", Area::Conversations),
                        ("children", Area::Children),
                    ] {
                        let r = crate::policy::rights(&who, &z(area), ctx);
                        out.push_str(&format!("rights {label}: {r}\n"));
                    }
                    if let Some(p) = info.parent {
                        if let Some(pi) = self.registry.get(p) {
                            let pz = Zone::Smith(crate::policy::SmithZone {
                                owner: p,
                                owner_parent: pi.parent,
                                owner_level: pi.level,
                                area: Area::Outbox,
                                depth: Depth::Inner,
                            });
                            let r = crate::policy::rights(&who, &pz, ctx);
                            out.push_str(&format!("rights parent outbox: {r}\n"));
                        }
                    }
                    out.push_str(&format!(
                        "limits: max_level {}, max_children {}\n",
                        self.opts.limits.max_level, self.opts.limits.max_children
                    ));
                    let (_, mine) = self.open_limits.open_now(Some(s));
                    out.push_str(&format!(
                        "open files: {} (limit {})\n",
                        mine.unwrap_or(0),
                        self.open_limits.per_smith()
                    ));
                }
            }
            Identity::Operator => {
                out.push_str(&format!("operator mode: {}\n", self.opts.operator.as_str()));
            }
            Identity::Unknown => {}
        }
        out.push_str(&format!("identity mode: {}\n", self.identities.mode_name()));
        out.push_str(&format!("pid: {}\nuid: {}\n", caller.pid, caller.uid));
        out.push_str(&format!("mount: {}\n", self.opts.mount_point.display()));
        out.push_str(&format!("daemon pid: {}\n", std::process::id()));
        out
    }

    fn plain_status(&self) -> String {
        self.registry.idle_status(false).to_string() + "\n"
    }
}

/// The journal as served in `.smithfs/events.jsonl`: complete lines that are JSON objects; a
/// torn line left by a crash is dropped (PROTOCOL.md §7).
fn journal_lines(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    for line in raw.split_inclusive(|b| *b == b'\n') {
        if line.ends_with(b"\n")
            && serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(line).is_ok()
        {
            out.extend_from_slice(line);
        }
    }
    out
}

/// The completion event for a regular file named `name` in a directory of zone `dir`
/// (PROTOCOL.md §5): `task-*.md` directly in an inbox, `result.md` directly in an outbox.
pub fn completion(dir: Zone, name: &[u8]) -> Option<FsEvent> {
    let Zone::Smith(z) = dir else {
        return None;
    };
    if z.depth != Depth::Top {
        return None;
    }
    match z.area {
        Area::Inbox if name.starts_with(b"task-") && name.ends_with(b".md") => {
            Some(FsEvent::TaskCompleted {
                smith: z.owner,
                name: String::from_utf8_lossy(name).into_owned(),
            })
        }
        Area::Outbox if name == b"result.md" => Some(FsEvent::ResultCompleted { smith: z.owner }),
        Area::SmithDir
        | Area::SmithMd
        | Area::Config
        | Area::Claude
        | Area::Inbox
        | Area::Private
        | Area::Outbox
        | Area::Conversations
        | Area::Children
        | Area::Other
        | Area::Workspace => None,
    }
}

/// Reply to a getxattr/listxattr: the needed size (when asked with size 0) or the data.
#[derive(Debug)]
pub enum XattrReply {
    /// The value's size in bytes.
    Size(u32),
    /// The value.
    Data(Vec<u8>),
}

fn xattr_reply(
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

fn xattr_name(name: &OsStr) -> FsResult<std::ffi::CString> {
    std::ffi::CString::new(name.as_bytes()).map_err(|_| FsError::Backing(Errno::EINVAL))
}

/// Does the open file carry setuid or setgid (bits a write may have to clear)?
fn setid(fd: &OwnedFd) -> bool {
    backing::stat(fd.as_fd()).is_ok_and(|st| st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0)
}

/// Clear setuid and setgid as a write or truncate by a caller without CAP_FSETID must on Linux
/// (the kernel leaves this to us under `FUSE_HANDLE_KILLPRIV_V2`): setuid always; setgid when
/// group-executable, or when the caller is not in the file's group (`setattr_should_drop_sgid`).
/// Returns whether the mode changed (the kernel's cached attributes are then stale).
fn kill_suid_sgid(inode: &Inode, caller: &Caller) -> FsResult<bool> {
    if inode.kind != libc::S_IFREG {
        return Ok(false);
    }
    let st = backing::stat(inode.fd()?.as_fd())?;
    let before = st.st_mode & 0o7777;
    let mut mode = before & !libc::S_ISUID;
    if mode & libc::S_ISGID != 0 {
        let in_group = caller.gid == st.st_gid || caller_groups(caller.pid).contains(&st.st_gid);
        if mode & libc::S_IXGRP != 0 || !in_group {
            mode &= !libc::S_ISGID;
        }
    }
    if mode != before {
        backing::chmod(inode.fd()?.as_fd(), mode)?;
    }
    Ok(mode != before)
}

/// Switch this thread's filesystem credentials to the caller's for a create.
fn as_caller(caller: &Caller) -> FsResult<CredGuard> {
    if caller.uid == 0 {
        return Ok(CredGuard::switch(0, 0, &[])?);
    }
    let groups = caller_groups(caller.pid);
    Ok(CredGuard::switch(caller.uid, caller.gid, &groups)?)
}

/// Supplementary groups of process `pid` (empty when unknown).
fn caller_groups(pid: u32) -> Vec<u32> {
    if pid == 0 {
        return Vec::new();
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
