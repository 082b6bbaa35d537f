//! The daemon's identity engine (docs/SPEC.md §2): FUSE request thread id → [`Identity`], binding of
//! processes to smiths, and the per-smith cgroups of cgroup mode.
//!
//! **cgroup mode.** Each registered smith has a cgroup under `smithfs-<daemon pid>` (layout in
//! [`super::cgroup`]); a caller in a smith's cgroup is that smith. Anyone else is resolved by the
//! ancestry walk below, which then only looks for the daemon (its unbound descendants are Unknown).
//!
//! **ancestry mode.** Bound processes are recorded by their pidfd and pidfs inode number; a caller
//! is the smith of the first bound process among its thread group and its ancestors, Unknown if the
//! daemon comes first, Operator if pid 1 or an invisible parent does.
//!
//! **Cache.** tid → (a pidfd of that thread, the identity found, the cgroup id seen, a generation).
//! A hit costs one `PIDFD_GET_INFO` ioctl: `ESRCH` means the thread is gone, so a recycled tid
//! never inherits an entry. In cgroup mode the ioctl also returns the caller's current cgroup, so a
//! move between cgroups is seen at once. In ancestry mode every [`Resolver::bind`] starts a new
//! generation: entries of older generations are re-resolved, except Smith entries, which are final
//! (a live process that was a smith stays that smith: only the operator can be bound). The cache is
//! capped (each entry holds one descriptor); dead entries go first, then the least recently used.
//!
//! **Descriptors track live processes.** Entries of exited threads (their pidfd polls readable)
//! are dropped by [`Resolver::housekeep`], which the daemon calls once a second, and on an
//! insertion that finds the cache grown to twice its size after the previous sweep (at least
//! [`SWEEP_MIN`] entries): one `poll` per 1024 entries, never on the lookup path.
//!
//! **Removed smiths.** [`Resolver::unregister_smith`] forgets a smith whose dir was removed; in
//! cgroup mode its cgroup is removed at once if it is empty, else kept ("retired": its processes
//! stay that smith, its descriptor stays open) and removed by `housekeep` once it has emptied.
//!
//! Lock order: `smiths` → `retired` → `by_cgroup` → `bound` → `cache`; none is held across a
//! blocking call.
//!
//! Long on purpose: the resolver's cache, both identity modes and binding share one lock order,
//! kept in one file.

use rustc_hash::FxHashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use super::ancestry::{self, ProcNode};
use super::cgroup;
use super::Identity;
use crate::config::IdentityMode;
use crate::process::pidfd::{self, PidfdInfo, PIDFD_THREAD};
use crate::sys::cgroup::{self as sys_cgroup, Cgroup, OPERATOR_CGROUP};
use crate::sys::procfs;
use crate::tree::model::SmithIdx;

/// Default cap of the resolution cache, in entries (each holds one descriptor). Lowered to a
/// quarter of the soft `RLIMIT_NOFILE` when that is smaller.
pub const DEFAULT_CACHE_CAPACITY: usize = 4096;

/// How long [`Resolver::shutdown`] waits for a killed cgroup to empty.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// How long [`Resolver::kill_smith`] waits for a cgroup to freeze before signalling it.
const FREEZE_WAIT: Duration = Duration::from_millis(200);

/// An insertion sweeps dead cache entries when the cache has at least this many entries and
/// twice as many as after the previous sweep.
pub const SWEEP_MIN: usize = 64;

/// The identity mechanism in force (docs/SPEC.md §2), after `auto` was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effective {
    /// One cgroup per smith.
    Cgroup,
    /// Process ancestry with bound keepers.
    Ancestry,
}

impl Effective {
    /// `cgroup` or `ancestry`, as `.smithfs/whoami` prints it (`identity mode: …`, §7).
    pub fn as_str(self) -> &'static str {
        match self {
            Effective::Cgroup => "cgroup",
            Effective::Ancestry => "ancestry",
        }
    }
}

/// What the identity engine can fail with. Display is one line.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// `--identity cgroup` but no cgroup can be created (no cgroup2 mount, no permission, …).
    #[error("cgroup identity is not available: {0}")]
    NoCgroup(String),
    /// Configured cgroup limits cannot be enforced (docs/SPEC.md §5): one line naming what is
    /// missing (a controller, delegation, or cgroup identity itself).
    #[error("{0}")]
    Limits(String),
    /// The kernel lacks `PIDFD_GET_INFO` (Linux ≥ 6.13 is needed).
    #[error("this kernel lacks PIDFD_GET_INFO (Linux 6.13 or later is needed): {0}")]
    PidfdUnsupported(#[source] io::Error),
    /// The process to bind (or the daemon) does not exist.
    #[error("no such process {0}")]
    NoSuchProcess(u32),
    /// A smith index that [`Resolver::register_smith`] was never given.
    #[error("smith #{} is not registered", .0 .0)]
    UnknownSmith(SmithIdx),
    /// The index or full id is already registered for another smith.
    #[error("smith #{} or {full_id} is already registered differently", .idx.0)]
    Conflict {
        /// The index asked for.
        idx: SmithIdx,
        /// The full id asked for.
        full_id: String,
    },
    /// Not `smith-root(/smith-NNN)*`.
    #[error("not a full smith id: {0:?} (expected smith-root, smith-root/smith-001, …)")]
    BadFullId(String),
    /// The process is already another smith (binding would change a smith's identity).
    #[error("process {pid} already belongs to smith #{}", .smith.0)]
    AlreadyBound {
        /// The process.
        pid: u32,
        /// Its smith.
        smith: SmithIdx,
    },
    /// This mount binds no processes (a filesystem made without an identity resolver, as in
    /// tests): ENOSYS.
    #[error("this mount binds no processes")]
    NoBinding,
    /// A system call failed; `what` says which step.
    #[error("{what}: {source}")]
    Io {
        /// The step, e.g. `moving 123 into /sys/fs/cgroup/…/smith-root`.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl IdentityError {
    /// The errno a `ctl bind` that failed with this error returns (docs/SPEC.md §2): ESRCH for
    /// a gone process, ENOENT for an unregistered smith, EBUSY for a process that is another
    /// smith already, EIO for what the resolver itself could not do.
    pub fn errno(&self) -> nix::errno::Errno {
        use nix::errno::Errno;
        match self {
            IdentityError::NoSuchProcess(_) => Errno::ESRCH,
            IdentityError::UnknownSmith(_) => Errno::ENOENT,
            IdentityError::AlreadyBound { .. } => Errno::EBUSY,
            IdentityError::NoBinding => Errno::ENOSYS,
            IdentityError::NoCgroup(_)
            | IdentityError::Limits(_)
            | IdentityError::PidfdUnsupported(_)
            | IdentityError::Conflict { .. }
            | IdentityError::BadFullId(_)
            | IdentityError::Io { .. } => Errno::EIO,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> IdentityError {
    let what = what.into();
    move |source| IdentityError::Io { what, source }
}

/// A registered smith.
struct SmithEntry {
    full_id: String,
    /// Its `self/` leaf cgroup (cgroup mode): its identity.
    cgroup: Option<Arc<Cgroup>>,
}

/// The cgroup of a smith that was unregistered while processes were still in it: kept (and its
/// id still maps to the smith) until it is empty and removed.
struct Retired {
    idx: SmithIdx,
    full_id: String,
    /// The `self/` leaf.
    cgroup: Arc<Cgroup>,
    /// The leaf was removed (its node waits for its children's to go).
    leaf_gone: bool,
}

// A full id is never registered twice in one daemon's life (child numbers only grow, docs/SPEC.md
// §4), so a retired cgroup's name is never wanted again before it is removed.

/// A process bound in ancestry mode, keyed by its pidfs inode number.
struct Bound {
    pid: u32,
    fd: OwnedFd,
    identity: Identity,
}

/// One cached resolution.
struct CacheEntry {
    /// `PIDFD_THREAD` pidfd of the thread: dead → `ESRCH`.
    fd: OwnedFd,
    /// pidfs inode of the thread (equals its process's for a thread-group leader).
    ino: u64,
    tgid: u32,
    identity: Identity,
    cgroup_id: Option<u64>,
    generation: u64,
    last_used: AtomicU64,
}

/// Cache entries by thread id, taken out of the cache (a snapshot or a set to evict).
type Entries = Vec<(u32, Arc<CacheEntry>)>;

/// The cgroups of cgroup mode that are not a smith's.
struct CgroupState {
    parent: Cgroup,
    /// `parent`'s cgroup v2 path as `/proc/PID/cgroup` shows it to the daemon
    /// (`/…/smithfs-PID`): a process in a cgroup below it that is no smith's leaf is Unknown,
    /// never Operator (docs/PROTOCOL-NOTES.md H13). `None` if it could not be read.
    tree: Option<PathBuf>,
    operator: Arc<Cgroup>,
    /// The cgroup limits in force (docs/SPEC.md §5), if any were ever configured (a reload
    /// replaces the tree, [`Resolver::set_limits`]). A leaf: cloned out, never held across a
    /// syscall.
    limits: parking_lot::RwLock<Option<Arc<crate::limits::cgroup::LimitTree>>>,
}

/// The identity engine: thread-safe (`Send + Sync`), one per mount (docs/SPEC.md §2).
pub struct Resolver {
    mode: Effective,
    daemon_pid: u32,
    daemon_ino: u64,
    _daemon_fd: OwnedFd,
    cgroups: Option<CgroupState>,
    smiths: RwLock<FxHashMap<SmithIdx, SmithEntry>>,
    /// cgroup id → identity (cgroup mode: the smiths' cgroups and the operator's).
    by_cgroup: RwLock<FxHashMap<u64, Identity>>,
    /// Cgroups of unregistered smiths that still held processes (cgroup mode).
    retired: Mutex<Vec<Retired>>,
    /// pidfs inode → bound process (ancestry mode).
    bound: RwLock<FxHashMap<u64, Arc<Bound>>>,
    cache: RwLock<FxHashMap<u32, Arc<CacheEntry>>>,
    capacity: AtomicUsize,
    /// An insertion that finds at least this many entries sweeps the dead ones first.
    sweep_at: AtomicUsize,
    generation: AtomicU64,
    tick: AtomicU64,
    shut_down: AtomicBool,
    shutdown_lock: Mutex<()>,
    /// Serialises [`Resolver::register_smith`] in cgroup mode (nodes are made top-down).
    register_lock: Mutex<()>,
}

/// A live process during a walk: its pidfd pins it, so its pid cannot be recycled under us
/// unnoticed.
struct LiveNode {
    pid: u32,
    ppid: u32,
    ino: u64,
    fd: OwnedFd,
}

impl ProcNode for LiveNode {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn ppid(&self) -> u32 {
        self.ppid
    }
}

/// The process `pid` (a thread-group leader), pinned.
fn live_process(pid: u32) -> io::Result<LiveNode> {
    let fd = pidfd::open(pid, 0)?;
    let info = pidfd::info(fd.as_fd())?;
    Ok(LiveNode {
        pid,
        ppid: info.ppid,
        ino: pidfd::inode(fd.as_fd())?,
        fd,
    })
}

/// Why a process of the ancestry walk could not be pinned; the walk then gives
/// `Identity::Unknown`. Only [`PinError::Sys`] carries an errno: the one a pidfd call returned.
#[derive(Debug, thiserror::Error)]
enum PinError {
    /// A pidfd call failed (ESRCH: the process is gone).
    #[error("{0}")]
    Sys(io::Error),
    /// The process was re-parented each time its parent was pinned.
    #[error("re-parented while its parent was pinned")]
    Reparented,
    /// The thread left the thread group it was pinned in (an exec by another thread).
    #[error("left its thread group while pinned")]
    LeftGroup,
}

impl From<io::Error> for PinError {
    fn from(e: io::Error) -> PinError {
        PinError::Sys(e)
    }
}

/// The parent of `child`, checked: after pinning the parent, `child` must still have it as its
/// parent (else it was re-parented and the pid may be another process; retry a few times).
fn live_parent(child: &LiveNode) -> Result<LiveNode, PinError> {
    let mut ppid = child.ppid;
    for _ in 0..8 {
        if ppid == 0 {
            break;
        }
        if let Ok(parent) = live_process(ppid) {
            let now = pidfd::info(child.fd.as_fd())?.ppid;
            if now == ppid {
                return Ok(parent);
            }
            ppid = now;
        } else {
            ppid = pidfd::info(child.fd.as_fd())?.ppid;
        }
    }
    Err(PinError::Reparented)
}

/// The thread group of the thread pinned by `thread`, pinned, checked against the thread still
/// living in it.
fn live_thread_group(thread: BorrowedFd<'_>, info: &PidfdInfo) -> Result<LiveNode, PinError> {
    let node = live_process(info.tgid)?;
    if pidfd::info(thread)?.tgid != info.tgid {
        return Err(PinError::LeftGroup);
    }
    Ok(node)
}

/// The cgroup v2 directory of process `pid` (pure parsing of `/proc` text).
/// The cgroup v2 path of the task `tid` (`0::` line of `/proc/TID/cgroup`), as the daemon's
/// cgroup namespace shows it; `None` if unreadable, absent or deleted.
fn v2_path_of(tid: u32) -> Option<PathBuf> {
    let bytes = std::fs::read(format!("/proc/{tid}/cgroup")).ok()?;
    let own = procfs::parse_cgroup(&bytes).ok()?;
    if own.v2_deleted {
        return None;
    }
    own.v2
}

fn cgroup_dir_of(pid: u32) -> Result<PathBuf, String> {
    let mounts =
        std::fs::read("/proc/self/mountinfo").map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let mounts = procfs::parse_mountinfo(&mounts).map_err(|e| e.to_string())?;
    let own = std::fs::read(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("/proc/{pid}/cgroup: {e}"))?;
    let own = procfs::parse_cgroup(&own).map_err(|e| e.to_string())?;
    sys_cgroup::own_cgroup_dir(&mounts, &own)
        .ok_or_else(|| "no cgroup2 mount holds the daemon's cgroup".to_string())
}

/// Remove the empty `smithfs-*` cgroups (and their empty smith cgroups) that daemons killed
/// before they could clean up left under `base`: only those no live daemon claims
/// ([`sys_cgroup::claimed`]; never judged by the pid in the name, which another pid namespace may
/// not see), not created in the last [`STALE_MIN_AGE`] (a starting daemon claims its parent
/// right after creating it), and only what `rmdir` accepts (a cgroup with processes stays).
fn remove_stale_parents(base: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        if !sys_cgroup::is_parent_name(&e.file_name()) {
            continue;
        }
        let old_enough = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_MIN_AGE);
        if !old_enough || sys_cgroup::claimed(&e.path()) {
            continue;
        }
        sys_cgroup::remove_tree(&e.path());
        if !e.path().exists() {
            tracing::info!(cgroup = %e.path().display(), "removed a stale cgroup of a dead daemon");
        }
    }
}

/// How old an unclaimed `smithfs-*` cgroup must be before start-up cleanup removes it.
const STALE_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// [`Cgroup::move_in`], tried up to three times (after 2 ms and 20 ms) unless the process is gone
/// (`ESRCH`) or the cgroup is (`ENOENT`): a migration may fail transiently on a busy machine.
fn move_in_retrying(cg: &Cgroup, pid: u32) -> io::Result<()> {
    let mut pauses = [2, 20].into_iter();
    loop {
        match cg.move_in(pid) {
            Ok(()) => return Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ESRCH | libc::ENOENT)) => {
                return Err(e)
            }
            Err(e) => match pauses.next() {
                Some(ms) => {
                    tracing::warn!("moving {pid} into {}: {e}; retrying", cg.path.display());
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                }
                None => return Err(e),
            },
        }
    }
}

/// Creates `smithfs-<pid>` and its `operator` cgroup under the daemon's cgroup, and checks that
/// processes can be moved in and killed there.
fn create_cgroups(daemon_pid: u32) -> Result<CgroupState, String> {
    let base = cgroup_dir_of(daemon_pid)?;
    remove_stale_parents(&base);
    // `smithfs-<pid>`, or `smithfs-<pid>-<n>` when a daemon in another pid namespace has the
    // same pid (or a dead one's parent could not be removed yet).
    let mut n = 1;
    let (path, parent) = loop {
        let name = match n {
            1 => format!("smithfs-{daemon_pid}"),
            _ => format!("smithfs-{daemon_pid}-{n}"),
        };
        let path = base.join(name);
        match Cgroup::create(&path) {
            Ok(parent) => break (path, parent),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 16 => n += 1,
            Err(e) => return Err(format!("mkdir {}: {e}", path.display())),
        }
    };
    if let Err(e) = parent.claim() {
        let _ = parent.remove();
        return Err(format!("flock {}: {e}", path.display()));
    }
    let check = || -> Result<Arc<Cgroup>, String> {
        for f in ["cgroup.procs", "cgroup.kill", "cgroup.freeze"] {
            let p = path.join(f);
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| format!("{}: bad path", p.display()))?;
            // SAFETY: `c` is a NUL-terminated path that outlives the call.
            if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
                return Err(format!("{}: {}", p.display(), io::Error::last_os_error()));
            }
        }
        let op = path.join(OPERATOR_CGROUP);
        Cgroup::create(&op)
            .map(Arc::new)
            .map_err(|e| format!("mkdir {}: {e}", op.display()))
    };
    match check() {
        Ok(operator) => Ok(CgroupState {
            tree: v2_path_of(daemon_pid).and_then(|own| Some(own.join(path.file_name()?))),
            parent,
            operator,
            limits: RwLock::new(None),
        }),
        Err(e) => {
            let _ = parent.remove();
            Err(e)
        }
    }
}

fn cache_capacity_default() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer for one `struct rlimit`.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    let quarter = if ok {
        usize::try_from(lim.rlim_cur / 4).unwrap_or(usize::MAX)
    } else {
        256
    };
    DEFAULT_CACHE_CAPACITY.min(quarter).max(16)
}

impl Resolver {
    /// Starts the identity engine of the daemon `daemon_pid` (normally `std::process::id()`).
    ///
    /// `auto` is cgroup mode when a cgroup `smithfs-<daemon_pid>` can be created (with
    /// `cgroup.procs`, `cgroup.kill` and `cgroup.freeze` writable) under the daemon's own cgroup on
    /// the cgroup2 mount found in `/proc/self/mountinfo`, else ancestry mode. In both modes the
    /// calling process becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`): orphans of runs re-parent
    /// to it and must be reaped by it.
    ///
    /// # Errors
    /// [`IdentityError::PidfdUnsupported`] before Linux 6.13, [`IdentityError::NoSuchProcess`] if
    /// `daemon_pid` does not exist, [`IdentityError::NoCgroup`] for `cgroup` when no cgroup can be
    /// made, [`IdentityError::Io`] if `prctl` fails.
    pub fn new(mode: IdentityMode, daemon_pid: u32) -> Result<Resolver, IdentityError> {
        Resolver::with_limits(mode, daemon_pid, &crate::limits::CgroupPlan::default())
    }

    /// [`Resolver::new`] with cgroup limits (docs/SPEC.md §5): every smith's node carries
    /// `plan.per_subtree`, its `self/` leaf `plan.per_smith`, on the backend the host has
    /// ([`crate::limits::cgroup`]).
    ///
    /// # Errors
    /// As [`Resolver::new`], and [`IdentityError::Limits`] when `plan` is not empty but cannot be
    /// enforced: ancestry mode (chosen, or `auto` without cgroups), a missing controller, or a
    /// cgroup that cannot delegate.
    pub fn with_limits(
        mode: IdentityMode,
        daemon_pid: u32,
        plan: &crate::limits::CgroupPlan,
    ) -> Result<Resolver, IdentityError> {
        // SAFETY: gettid has no preconditions.
        let me = u32::try_from(unsafe { libc::gettid() }).unwrap_or(0);
        pidfd::open(me, PIDFD_THREAD)
            .and_then(|fd| pidfd::info(fd.as_fd()))
            .map_err(IdentityError::PidfdUnsupported)?;
        let daemon =
            live_process(daemon_pid).map_err(|_| IdentityError::NoSuchProcess(daemon_pid))?;
        crate::process::become_subreaper().map_err(|source| IdentityError::Io {
            what: "prctl(PR_SET_CHILD_SUBREAPER)".into(),
            source,
        })?;
        let key = plan.first_key();
        let mut cgroups = match (mode, &key) {
            (IdentityMode::Ancestry, Some(key)) => {
                return Err(IdentityError::Limits(format!(
                    "{key} needs cgroup identity, but identity is ancestry (drop the limits or mount with --identity cgroup)"
                )))
            }
            (IdentityMode::Ancestry, None) => None,
            (IdentityMode::Cgroup, _) => {
                Some(create_cgroups(daemon_pid).map_err(IdentityError::NoCgroup)?)
            }
            (IdentityMode::Auto, key) => match create_cgroups(daemon_pid) {
                Ok(c) => Some(c),
                Err(e) => {
                    if let Some(key) = key {
                        return Err(IdentityError::Limits(format!(
                            "{key} needs cgroup identity, which is not available here: {e}"
                        )));
                    }
                    tracing::info!("cgroup identity unavailable, using ancestry: {e}");
                    None
                }
            },
        };
        if let (Some(c), false) = (&mut cgroups, plan.is_empty()) {
            let avail = crate::limits::cgroup::detect_here();
            match crate::limits::cgroup::LimitTree::setup(*plan, &c.parent.path, &avail) {
                Ok(t) => {
                    tracing::info!(backend = %t.describe(), "cgroup limits");
                    *c.limits.get_mut() = Some(Arc::new(t));
                }
                Err(e) => {
                    let _ = c.operator.remove();
                    let _ = c.parent.remove();
                    return Err(IdentityError::Limits(e));
                }
            }
        }
        let mut by_cgroup = FxHashMap::default();
        if let Some(c) = &cgroups {
            by_cgroup.insert(c.operator.id, Identity::Operator);
        }
        Ok(Resolver {
            mode: if cgroups.is_some() {
                Effective::Cgroup
            } else {
                Effective::Ancestry
            },
            daemon_pid,
            daemon_ino: daemon.ino,
            _daemon_fd: daemon.fd,
            cgroups,
            smiths: RwLock::new(FxHashMap::default()),
            retired: Mutex::new(Vec::new()),
            by_cgroup: RwLock::new(by_cgroup),
            bound: RwLock::new(FxHashMap::default()),
            cache: RwLock::new(FxHashMap::default()),
            capacity: AtomicUsize::new(cache_capacity_default()),
            sweep_at: AtomicUsize::new(SWEEP_MIN),
            generation: AtomicU64::new(0),
            tick: AtomicU64::new(0),
            shut_down: AtomicBool::new(false),
            shutdown_lock: Mutex::new(()),
            register_lock: Mutex::new(()),
        })
    }

    /// The mechanism in force.
    pub fn mode(&self) -> Effective {
        self.mode
    }

    /// The daemon pid this resolver was started for.
    pub fn daemon_pid(&self) -> u32 {
        self.daemon_pid
    }

    /// The parent cgroup directory `…/smithfs-<daemon pid>` (cgroup mode), for messages and `meta.json`.
    pub fn cgroup_parent(&self) -> Option<&std::path::Path> {
        self.cgroups.as_ref().map(|c| c.parent.path.as_path())
    }

    /// Sets the cache cap (entries, at least 1); a full cache evicts on the next insertion.
    pub fn set_cache_capacity(&self, entries: usize) {
        self.capacity.store(entries.max(1), Ordering::Relaxed);
    }

    /// Number of cached resolutions (for tests and statistics).
    pub fn cache_len(&self) -> usize {
        self.cache.read().len()
    }

    /// Drops every cached resolution (the next `resolve` of each thread is a miss).
    pub fn clear_cache(&self) {
        self.cache.write().clear();
    }

    /// Registers smith `idx` with its full id (`smith-root(/smith-NNN)*`, docs/SPEC.md §1); in
    /// cgroup mode creates its node `<parent>/<full id>` (and missing ancestors' nodes) with the
    /// subtree limits, and its leaf `<node>/self` with the per-smith limits: the leaf is its
    /// identity. Registering the same pair again is a no-op.
    ///
    /// # Errors
    /// [`IdentityError::BadFullId`], [`IdentityError::Conflict`] (index or id registered
    /// differently), [`IdentityError::Io`] if the cgroup cannot be made.
    pub fn register_smith(&self, idx: SmithIdx, full_id: &str) -> Result<(), IdentityError> {
        let rel = cgroup::smith_node_rel(full_id)
            .ok_or_else(|| IdentityError::BadFullId(full_id.into()))?;
        let _serial = self.register_lock.lock();
        let conflict = || IdentityError::Conflict {
            idx,
            full_id: full_id.into(),
        };
        {
            let smiths = self.smiths.read();
            if let Some(e) = smiths.get(&idx) {
                return if e.full_id == full_id {
                    Ok(())
                } else {
                    Err(conflict())
                };
            }
            if smiths.values().any(|e| e.full_id == full_id) {
                return Err(conflict());
            }
        }
        let cg = match &self.cgroups {
            Some(c) => {
                let limits = c.limits.read().clone();
                Some(Arc::new(Self::create_smith_cgroups(
                    c,
                    limits.as_deref(),
                    &rel,
                )?))
            }
            None => None,
        };
        let mut smiths = self.smiths.write();
        if smiths.contains_key(&idx) || smiths.values().any(|e| e.full_id == full_id) {
            // A concurrent registration won; ours is a duplicate.
            if let Some(cg) = &cg {
                let _ = cg.remove();
            }
            return match smiths.get(&idx) {
                Some(e) if e.full_id == full_id => Ok(()),
                _ => Err(conflict()),
            };
        }
        if let Some(cg) = &cg {
            self.by_cgroup.write().insert(cg.id, Identity::Smith(idx));
        }
        smiths.insert(
            idx,
            SmithEntry {
                full_id: full_id.into(),
                cgroup: cg,
            },
        );
        Ok(())
    }

    /// Creates the node of `rel` (and its missing ancestors, top-down, each with the subtree
    /// limits) and its `self/` leaf with the per-smith limits; returns the leaf.
    fn create_smith_cgroups(
        c: &CgroupState,
        limits: Option<&crate::limits::cgroup::LimitTree>,
        rel: &std::path::Path,
    ) -> Result<Cgroup, IdentityError> {
        let limit_err = IdentityError::Limits;
        let mut prefix = PathBuf::new();
        for part in rel.components() {
            prefix.push(part);
            let node = c.parent.path.join(&prefix);
            match std::fs::create_dir(&node) {
                Ok(()) => {
                    if let Some(l) = limits {
                        l.node_created(&node, &prefix).map_err(limit_err)?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(format!("mkdir {}", node.display()))(e)),
            }
        }
        let path = c.parent.path.join(rel).join(sys_cgroup::SELF_CGROUP);
        let leaf = match Cgroup::create(&path) {
            Ok(l) => l,
            // Left by a smith of that id that was removed while its processes lived.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Cgroup::open_existing(&path).map_err(io_err(format!("open {}", path.display())))?
            }
            Err(e) => return Err(io_err(format!("mkdir {}", path.display()))(e)),
        };
        if let Some(l) = limits {
            l.leaf_created(&leaf.path, rel).map_err(limit_err)?;
        }
        Ok(leaf)
    }

    /// The cgroup limits in force (cgroup mode with limits configured).
    pub fn limits(&self) -> Option<Arc<crate::limits::cgroup::LimitTree>> {
        self.cgroups.as_ref()?.limits.read().clone()
    }

    /// Puts the cgroup limits `plan` in force without a remount (`smithfs reload`, docs/SPEC.md
    /// §6): the controllers it needs are set up if the tree lacks them, and the limits are
    /// written into the cgroups of every registered smith ([`LimitTree::reapply`]); smiths
    /// registered later get them when their cgroups are made. Serialised with registrations.
    /// If a write fails, the limits in force before are written back and the tree kept.
    ///
    /// [`LimitTree::reapply`]: crate::limits::cgroup::LimitTree::reapply
    ///
    /// # Errors
    /// One line, as `mount` words it: limits in ancestry mode, a controller the host lacks or
    /// cannot delegate, or the write that failed.
    pub fn set_limits(&self, plan: &crate::limits::CgroupPlan) -> Result<(), String> {
        let Some(c) = &self.cgroups else {
            return match plan.first_key() {
                Some(key) => Err(format!(
                    "{key} needs cgroup identity, but identity is ancestry (drop the limits or mount with --identity cgroup)"
                )),
                None => Ok(()),
            };
        };
        let _serial = self.register_lock.lock();
        let old = c.limits.read().clone();
        if old.is_none() && plan.is_empty() {
            return Ok(());
        }
        let avail = crate::limits::cgroup::detect_here();
        let tree = match &old {
            Some(t) => t.widened(*plan, &c.parent.path, &avail)?,
            None => crate::limits::cgroup::LimitTree::setup(*plan, &c.parent.path, &avail)?,
        };
        let smiths = self.smith_cgroups();
        if let Err(e) = tree.reapply(&smiths) {
            let back = match &old {
                Some(o) => tree.widened(*o.plan(), &c.parent.path, &avail),
                None => tree.widened(Default::default(), &c.parent.path, &avail),
            };
            if let Ok(back) = back {
                if let Err(e) = back.reapply(&smiths) {
                    tracing::warn!("cannot restore the cgroup limits in force: {e}");
                }
                *c.limits.write() = Some(Arc::new(back));
            }
            return Err(format!("the new cgroup limits cannot be applied: {e}"));
        }
        tracing::info!(backend = %tree.describe(), "cgroup limits reloaded");
        *c.limits.write() = Some(Arc::new(tree));
        Ok(())
    }

    /// Every registered smith's cgroup as (full id, `self/` leaf), parents before children.
    fn smith_cgroups(&self) -> Vec<(PathBuf, PathBuf)> {
        let mut v: Vec<(PathBuf, PathBuf)> = self
            .smiths
            .read()
            .values()
            .filter_map(|e| Some((PathBuf::from(&e.full_id), e.cgroup.as_ref()?.path.clone())))
            .collect();
        v.sort_by_key(|(rel, _)| (rel.components().count(), rel.clone()));
        v
    }

    /// Places the thread group of `pid` into smith `idx`'s v1 limit cgroups (hybrid hosts,
    /// docs/SPEC.md §5): called before the process executes anything. A no-op without v1 limits.
    ///
    /// # Errors
    /// [`IdentityError::UnknownSmith`], or the `cgroup.procs` write that failed.
    pub fn place(&self, pid: u32, idx: SmithIdx) -> Result<(), IdentityError> {
        let Some(l) = self.limits().filter(|l| l.needs_placing()) else {
            return Ok(());
        };
        let full_id = self.full_id(idx).ok_or(IdentityError::UnknownSmith(idx))?;
        l.place(std::path::Path::new(&full_id), pid)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ESRCH) => IdentityError::NoSuchProcess(pid),
                _ => IdentityError::Io {
                    what: format!("placing {pid} in the limit cgroups of {full_id}"),
                    source: e,
                },
            })
    }

    /// True when runs must be [`Resolver::place`]d before exec (some limit is on cgroup v1).
    pub fn needs_placing(&self) -> bool {
        self.limits().is_some_and(|l| l.needs_placing())
    }

    /// The oom-kill counter of smith `idx`'s leaf (docs/SPEC.md §5 `reason: oom`): how many of
    /// its own processes the OOM killer has killed since its leaf was made. `None` without a
    /// memory limit.
    pub fn oom_kills(&self, idx: SmithIdx) -> Option<u64> {
        let l = self.limits()?;
        let (leaf, full_id) = {
            let smiths = self.smiths.read();
            let e = smiths.get(&idx)?;
            (e.cgroup.as_ref()?.path.clone(), e.full_id.clone())
        };
        l.oom_kills(&leaf, std::path::Path::new(&full_id))
    }

    /// The full id registered for `idx`.
    pub fn full_id(&self, idx: SmithIdx) -> Option<String> {
        self.smiths.read().get(&idx).map(|e| e.full_id.clone())
    }

    /// Forgets smith `idx`, whose smith dir was removed (a no-op if it is not registered). In
    /// cgroup mode its cgroup is removed and its descriptor closed; a cgroup that still holds
    /// processes is kept until it is empty (see [`Resolver::housekeep`]) and its processes stay
    /// that smith meanwhile — never the operator. Call it for every smith of a removed subtree.
    pub fn unregister_smith(&self, idx: SmithIdx) {
        let Some(entry) = self.smiths.write().remove(&idx) else {
            return;
        };
        if let Some(cgroup) = entry.cgroup {
            self.retired.lock().push(Retired {
                idx,
                full_id: entry.full_id,
                cgroup,
                leaf_gone: false,
            });
            self.remove_retired();
        }
    }

    /// Removes the retired cgroups that are empty now, deepest first (a leaf, then its node once
    /// its children's nodes are gone; one `rmdir` each, no lock held across it); returns how
    /// many are left.
    fn remove_retired(&self) -> usize {
        let mut candidates: Vec<(Arc<Cgroup>, String, bool)> = self
            .retired
            .lock()
            .iter()
            .map(|r| (Arc::clone(&r.cgroup), r.full_id.clone(), r.leaf_gone))
            .collect();
        candidates.sort_by_key(|(_, id, _)| std::cmp::Reverse(id.matches('/').count()));
        for (cg, full_id, leaf_gone) in candidates {
            if !leaf_gone {
                match cg.remove() {
                    Ok(()) => {
                        let mut retired = self.retired.lock();
                        if let Some(r) = retired.iter_mut().find(|r| Arc::ptr_eq(&r.cgroup, &cg)) {
                            r.leaf_gone = true;
                            let (id, idx) = (r.cgroup.id, r.idx);
                            drop(retired);
                            let mut by_cgroup = self.by_cgroup.write();
                            if by_cgroup.get(&id) == Some(&Identity::Smith(idx)) {
                                by_cgroup.remove(&id);
                            }
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
                    Err(e) => {
                        tracing::warn!("removing {}: {e}", cg.path.display());
                        continue;
                    }
                }
            }
            if let Some(l) = self.limits() {
                l.removed(std::path::Path::new(&full_id));
            }
            let node = cg.path.parent().map(std::path::Path::to_path_buf);
            let node_gone = match node.as_deref().map(std::fs::remove_dir) {
                None | Some(Ok(())) => true,
                Some(Err(e)) => e.kind() == io::ErrorKind::NotFound,
            };
            if node_gone {
                let mut retired = self.retired.lock();
                if let Some(i) = retired.iter().position(|r| Arc::ptr_eq(&r.cgroup, &cg)) {
                    let r = retired.swap_remove(i);
                    tracing::debug!(smith = %r.full_id, "cgroup of a removed smith removed");
                }
            }
        }
        self.retired.lock().len()
    }

    /// Periodic upkeep, off the request path (the daemon calls it about once a second): drops
    /// cached resolutions and bound processes whose process has exited, closing their pidfds,
    /// and removes the cgroups of removed smiths that have emptied since.
    pub fn housekeep(&self) {
        if self.shut_down.load(Ordering::Acquire) {
            return;
        }
        self.sweep_dead();
        self.sweep_bound();
        if !self.retired.lock().is_empty() {
            self.remove_retired();
        }
    }

    /// Number of retired cgroups (of removed smiths) still waiting to empty (for tests).
    pub fn retired_len(&self) -> usize {
        self.retired.lock().len()
    }

    /// The identity of the thread `tid` of a FUSE request (docs/SPEC.md §2); the hot path.
    ///
    /// pid 0 and vanished threads are Unknown; so is any failure to read the process table (fail
    /// closed: Unknown may only look up and stat). A cache hit costs one ioctl.
    pub fn resolve(&self, tid: u32) -> Identity {
        if tid == 0 {
            return Identity::Unknown;
        }
        let now = self.tick.fetch_add(1, Ordering::Relaxed);
        let cached = self.cache.read().get(&tid).cloned();
        let reuse = match cached {
            Some(entry) => match pidfd::info(entry.fd.as_fd()) {
                Ok(info) => {
                    if let Some(id) = self.hit(&entry, &info) {
                        entry.last_used.store(now, Ordering::Relaxed);
                        return id;
                    }
                    Some((entry, info))
                }
                Err(_) => {
                    self.evict_entry(tid, &entry);
                    None
                }
            },
            None => None,
        };
        let (fd, info) = match reuse {
            Some((entry, info)) => {
                // Stale generation or a changed cgroup: resolve again with a fresh pidfd.
                self.evict_entry(tid, &entry);
                match pidfd::open(tid, PIDFD_THREAD) {
                    Ok(fd) => (fd, info),
                    Err(_) => return Identity::Unknown,
                }
            }
            None => {
                let Ok(fd) = pidfd::open(tid, PIDFD_THREAD) else {
                    return Identity::Unknown;
                };
                let Ok(info) = pidfd::info(fd.as_fd()) else {
                    return Identity::Unknown;
                };
                (fd, info)
            }
        };
        let generation = self.generation.load(Ordering::Acquire);
        let identity = self.resolve_fresh(fd.as_fd(), &info);
        if let Ok(ino) = pidfd::inode(fd.as_fd()) {
            self.insert(
                tid,
                CacheEntry {
                    fd,
                    ino,
                    tgid: info.tgid,
                    identity,
                    cgroup_id: info.cgroup_id,
                    generation,
                    last_used: AtomicU64::new(now),
                },
            );
        }
        identity
    }

    /// The answer of a live cache entry, or `None` if it must be resolved again.
    fn hit(&self, entry: &CacheEntry, info: &PidfdInfo) -> Option<Identity> {
        match self.mode {
            Effective::Cgroup => {
                if let Some(id) = info
                    .cgroup_id
                    .and_then(|c| self.by_cgroup.read().get(&c).copied())
                {
                    return Some(id);
                }
                (info.cgroup_id == entry.cgroup_id && !matches!(entry.identity, Identity::Smith(_)))
                    .then_some(entry.identity)
            }
            Effective::Ancestry => self.entry_valid(entry).then_some(entry.identity),
        }
    }

    fn entry_valid(&self, entry: &CacheEntry) -> bool {
        matches!(entry.identity, Identity::Smith(_))
            || entry.generation == self.generation.load(Ordering::Acquire)
    }

    /// Resolves without the cache for the live thread pinned by `thread`.
    fn resolve_fresh(&self, thread: BorrowedFd<'_>, info: &PidfdInfo) -> Identity {
        if self.mode == Effective::Cgroup {
            if let Some(id) = info
                .cgroup_id
                .and_then(|c| self.by_cgroup.read().get(&c).copied())
            {
                return id;
            }
            // A cgroup inside our tree that is no smith's leaf (made below a leaf through a
            // cgroup namespace of its own, or a retired smith's): Unknown, so that nothing
            // there is judged by ancestry as the Operator (docs/PROTOCOL-NOTES.md H13).
            if let Some(tree) = self.cgroups.as_ref().and_then(|c| c.tree.as_ref()) {
                match v2_path_of(info.pid) {
                    Some(p) if !p.starts_with(tree) => {}
                    _ => return Identity::Unknown,
                }
            }
        }
        let Ok(start) = live_thread_group(thread, info) else {
            return Identity::Unknown;
        };
        self.walk(start)
    }

    /// The ancestry walk from a pinned process.
    fn walk(&self, start: LiveNode) -> Identity {
        let classify = |n: &LiveNode| self.classify(n);
        ancestry::walk(start, live_parent, classify).unwrap_or(Identity::Unknown)
    }

    fn classify(&self, n: &LiveNode) -> Option<Identity> {
        if n.ino == self.daemon_ino {
            return Some(Identity::Unknown);
        }
        if self.mode == Effective::Ancestry {
            if let Some(b) = self.bound.read().get(&n.ino) {
                return Some(b.identity);
            }
            let cache = self.cache.read();
            if let Some(e) = cache.get(&n.pid) {
                if e.ino == n.ino && self.entry_valid(e) {
                    return Some(e.identity);
                }
            }
        }
        None
    }

    fn evict_entry(&self, tid: u32, entry: &Arc<CacheEntry>) {
        let mut cache = self.cache.write();
        if cache.get(&tid).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            cache.remove(&tid);
        }
    }

    fn insert(&self, tid: u32, entry: CacheEntry) {
        let cap = self.capacity.load(Ordering::Relaxed);
        let len = self.cache.read().len();
        if len >= cap {
            self.make_room(cap);
        } else if len >= self.sweep_at.load(Ordering::Relaxed) {
            self.sweep_dead();
        }
        self.cache.write().insert(tid, Arc::new(entry));
    }

    /// The cache split into entries whose thread is alive and entries whose thread has exited
    /// (a snapshot; no lock is held while polling).
    fn partition_cache(&self) -> (Entries, Entries) {
        let snapshot: Entries = self
            .cache
            .read()
            .iter()
            .map(|(k, v)| (*k, Arc::clone(v)))
            .collect();
        let fds: Vec<BorrowedFd<'_>> = snapshot.iter().map(|(_, e)| e.fd.as_fd()).collect();
        let exited = pidfd::exited_among(&fds);
        drop(fds);
        let mut live = Vec::with_capacity(snapshot.len());
        let mut dead = Vec::new();
        for ((tid, e), gone) in snapshot.into_iter().zip(exited) {
            if gone {
                dead.push((tid, e));
            } else {
                live.push((tid, e));
            }
        }
        (live, dead)
    }

    /// Removes `victims` from the cache (unless an entry was replaced meanwhile), closing
    /// their pidfds once no resolution still uses them; then re-arms the amortised sweep.
    fn evict_all(&self, victims: Entries) {
        let left = {
            let mut cache = self.cache.write();
            for (tid, e) in &victims {
                if cache.get(tid).is_some_and(|c| Arc::ptr_eq(c, e)) {
                    cache.remove(tid);
                }
            }
            cache.len()
        };
        drop(victims);
        self.sweep_at
            .store(left.saturating_mul(2).max(SWEEP_MIN), Ordering::Relaxed);
    }

    /// Drops the cache entries of exited threads.
    fn sweep_dead(&self) {
        let (_, dead) = self.partition_cache();
        self.evict_all(dead);
    }

    /// Drops bound processes (ancestry mode) that have exited: nothing can descend from them
    /// any more.
    fn sweep_bound(&self) {
        let snapshot: Vec<(u64, Arc<Bound>)> = self
            .bound
            .read()
            .iter()
            .map(|(k, v)| (*k, Arc::clone(v)))
            .collect();
        if snapshot.is_empty() {
            return;
        }
        let fds: Vec<BorrowedFd<'_>> = snapshot.iter().map(|(_, b)| b.fd.as_fd()).collect();
        let exited = pidfd::exited_among(&fds);
        drop(fds);
        let mut bound = self.bound.write();
        for ((ino, b), gone) in snapshot.iter().zip(exited) {
            if gone && bound.get(ino).is_some_and(|c| Arc::ptr_eq(c, b)) {
                bound.remove(ino);
            }
        }
    }

    /// Evicts dead entries, then (if still at least `cap`) the least recently used half, Smith
    /// entries last.
    fn make_room(&self, cap: usize) {
        let (mut live, mut dead) = self.partition_cache();
        if live.len() >= cap {
            live.sort_by_key(|(_, e)| {
                (
                    matches!(e.identity, Identity::Smith(_)),
                    e.last_used.load(Ordering::Relaxed),
                )
            });
            let drop_n = live.len() - cap / 2;
            dead.extend(live.drain(..drop_n));
        }
        self.evict_all(dead);
    }

    /// Forgets cached resolutions of the thread group `tgid` and starts a new generation.
    fn invalidate(&self, tgid: u32) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.cache.write().retain(|_, e| e.tgid != tgid);
    }

    /// Binds the process of `pid` (a tid is enough: its whole thread group) to smith `idx`
    /// (docs/SPEC.md §2, §7 `bind`): cgroup mode moves it into the smith's cgroup; ancestry mode
    /// records it by pidfd. Its descendants from then on are that smith. Authority (operator only)
    /// is the caller's check.
    ///
    /// # Errors
    /// [`IdentityError::UnknownSmith`], [`IdentityError::NoSuchProcess`],
    /// [`IdentityError::AlreadyBound`] if it is another smith's already, [`IdentityError::Io`] if
    /// the cgroup move fails.
    pub fn bind(&self, pid: u32, idx: SmithIdx) -> Result<(), IdentityError> {
        let cgroup = {
            let smiths = self.smiths.read();
            let e = smiths.get(&idx).ok_or(IdentityError::UnknownSmith(idx))?;
            e.cgroup.clone()
        };
        self.bind_as(pid, Identity::Smith(idx), cgroup)?;
        self.place(pid, idx)
    }

    /// Binds the process of `pid` as the operator: user hooks, which the daemon starts but which
    /// act for the operator (docs/SPEC.md §5). cgroup mode moves it into the `operator` cgroup.
    ///
    /// # Errors
    /// As [`Resolver::bind`].
    pub fn bind_operator(&self, pid: u32) -> Result<(), IdentityError> {
        let cgroup = self.cgroups.as_ref().map(|c| Arc::clone(&c.operator));
        self.bind_as(pid, Identity::Operator, cgroup)
    }

    fn bind_as(
        &self,
        pid: u32,
        identity: Identity,
        cgroup: Option<Arc<Cgroup>>,
    ) -> Result<(), IdentityError> {
        let gone = |_| IdentityError::NoSuchProcess(pid);
        let thread = pidfd::open(pid, PIDFD_THREAD).map_err(gone)?;
        let info = pidfd::info(thread.as_fd()).map_err(gone)?;
        let process = live_thread_group(thread.as_fd(), &info)
            .map_err(|_| IdentityError::NoSuchProcess(pid))?;
        match self.walk_uncached(&process) {
            Identity::Smith(smith) if Identity::Smith(smith) != identity => {
                return Err(IdentityError::AlreadyBound { pid, smith });
            }
            _ => {}
        }
        match cgroup {
            Some(cg) if self.mode == Effective::Cgroup => {
                move_in_retrying(&cg, process.pid).map_err(|e| match e.raw_os_error() {
                    Some(libc::ESRCH) => IdentityError::NoSuchProcess(pid),
                    _ => IdentityError::Io {
                        what: format!("moving {} into {}", process.pid, cg.path.display()),
                        source: e,
                    },
                })?;
            }
            _ => {
                self.sweep_bound();
                self.bound.write().insert(
                    process.ino,
                    Arc::new(Bound {
                        pid: process.pid,
                        fd: process.fd,
                        identity,
                    }),
                );
            }
        }
        self.invalidate(info.tgid);
        Ok(())
    }

    /// The identity of a pinned process without consulting the cache (binding decisions).
    fn walk_uncached(&self, process: &LiveNode) -> Identity {
        if self.mode == Effective::Cgroup {
            if let Ok(info) = pidfd::info(process.fd.as_fd()) {
                if let Some(id) = info
                    .cgroup_id
                    .and_then(|c| self.by_cgroup.read().get(&c).copied())
                {
                    return id;
                }
            }
            return Identity::Operator;
        }
        let classify = |n: &LiveNode| {
            if n.ino == self.daemon_ino {
                return Some(Identity::Unknown);
            }
            self.bound.read().get(&n.ino).map(|b| b.identity)
        };
        let Ok(start) = live_process(process.pid) else {
            return Identity::Unknown;
        };
        ancestry::walk(start, live_parent, classify).unwrap_or(Identity::Unknown)
    }

    /// Smith `idx`'s cgroup (cgroup mode; `None` in ancestry mode or for a smith that is not
    /// registered): its `O_DIRECTORY` descriptor serves `clone3(CLONE_INTO_CGROUP)` and opening
    /// its `cgroup.procs`. Held through the `Arc`, it stays open even if the smith is
    /// unregistered meanwhile (the directory may then be gone: writes into it fail).
    pub fn smith_cgroup(&self, idx: SmithIdx) -> Option<Arc<Cgroup>> {
        self.smiths.read().get(&idx)?.cgroup.clone()
    }

    /// The `O_DIRECTORY` descriptor of the `operator` cgroup, where user hooks run (cgroup mode;
    /// `None` in ancestry mode), for `clone3(CLONE_INTO_CGROUP)`.
    pub fn operator_cgroup_fd(&self) -> Option<BorrowedFd<'_>> {
        self.cgroups.as_ref().map(|c| c.operator.dir.as_fd())
    }

    /// The cgroup directory path of smith `idx` (cgroup mode), for `meta.json` and messages.
    pub fn smith_cgroup_path(&self, idx: SmithIdx) -> Option<PathBuf> {
        let smiths = self.smiths.read();
        Some(smiths.get(&idx)?.cgroup.as_ref()?.path.clone())
    }

    /// The live processes of smith `idx`, pids in the daemon's namespace, unsorted. cgroup mode:
    /// `cgroup.procs`. Ancestry mode: every process in `/proc` that resolves to the smith (the
    /// bound ones and their descendants; zombies excluded) — a scan, not for the hot path.
    ///
    /// Empty for an unregistered smith or on a read error.
    pub fn live_pids(&self, idx: SmithIdx) -> Vec<u32> {
        self.live_processes(idx)
            .into_iter()
            .map(|(pid, _)| pid)
            .collect()
    }

    /// Live processes of `idx` with a pidfd each (ancestry mode), or without (cgroup mode).
    fn live_processes(&self, idx: SmithIdx) -> Vec<(u32, Option<OwnedFd>)> {
        let cgroup = {
            let smiths = self.smiths.read();
            let Some(e) = smiths.get(&idx) else {
                return Vec::new();
            };
            e.cgroup.clone()
        };
        if let Some(cg) = cgroup {
            return cg
                .procs()
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p, None))
                .collect();
        }
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let want = Identity::Smith(idx);
        dir.filter_map(|d| d.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| {
                let node = live_process(pid).ok()?;
                if node.ino == self.daemon_ino || pidfd::has_exited(node.fd.as_fd()) {
                    return None;
                }
                let fd = node.fd.try_clone().ok()?;
                (self.walk(node) == want).then_some((pid, Some(fd)))
            })
            .collect()
    }

    /// Sends `signal` to every process of smith `idx` (docs/SPEC.md §5 timeouts, §6 cancel).
    /// cgroup mode: to every process of the frozen cgroup (a frozen process cannot fork, and a
    /// fork in flight is frozen at birth, so nothing escapes once the freeze completes; SIGKILL
    /// kills frozen processes). Not through `cgroup.kill`: Linux (6.18) then SIGKILLs at birth
    /// every later `clone3(CLONE_INTO_CGROUP)` child of that cgroup (its `cgroup_post_fork`
    /// compares the parent cgroup's kill sequence number with the destination's), and the
    /// smith's next runs are created there. Ancestry mode: the process group of each bound process
    /// that leads its own group (runs do), and every process that resolves to the smith, through
    /// its pidfd (never a recycled pid).
    ///
    /// # Errors
    /// [`IdentityError::UnknownSmith`], [`IdentityError::Io`] for a cgroup file that cannot be
    /// written. Processes that are already gone are not errors.
    pub fn kill_smith(&self, idx: SmithIdx, signal: i32) -> Result<(), IdentityError> {
        let cgroup = {
            let smiths = self.smiths.read();
            smiths
                .get(&idx)
                .ok_or(IdentityError::UnknownSmith(idx))?
                .cgroup
                .clone()
        };
        if let Some(cg) = cgroup {
            return cg
                .signal_all(signal, FREEZE_WAIT)
                .map_err(io_err(format!("signalling {}", cg.path.display())));
        }
        {
            let bound = self.bound.read();
            for b in bound
                .values()
                .filter(|b| b.identity == Identity::Smith(idx))
            {
                let Ok(pid) = libc::pid_t::try_from(b.pid) else {
                    continue;
                };
                // SAFETY: getpgid takes an integer. The pidfd `b.fd` pins the process, and it is
                // checked alive right after, so `pid` is not a recycled number.
                let pgid = unsafe { libc::getpgid(pid) };
                if pgid == pid && pidfd::info(b.fd.as_fd()).is_ok() {
                    // SAFETY: kill with integers; the group is led by the live bound process.
                    unsafe { libc::kill(-pgid, signal) };
                }
                let _ = pidfd::send_signal(b.fd.as_fd(), signal);
            }
        }
        for (_, fd) in self.live_processes(idx) {
            if let Some(fd) = fd {
                let _ = pidfd::send_signal(fd.as_fd(), signal);
            }
        }
        Ok(())
    }

    /// Removes what the resolver created: every smith cgroup, the `operator` cgroup and the parent
    /// (cgroup mode), and forgets bound processes. With `kill`, the processes of every smith are
    /// SIGKILLed first (waiting up to 2 s per cgroup); without, a cgroup that still has processes
    /// is left in place and reported. Idempotent; also run (without `kill`) on drop.
    ///
    /// # Errors
    /// [`IdentityError::Io`] naming the first cgroup that could not be removed.
    pub fn shutdown(&self, kill: bool) -> Result<(), IdentityError> {
        let _guard = self.shutdown_lock.lock();
        if self.shut_down.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut first_err = None;
        let mut note = |what: String, e: io::Error| {
            tracing::warn!("{what}: {e}");
            if first_err.is_none() {
                first_err = Some(IdentityError::Io { what, source: e });
            }
        };
        let mut smith_cgroups: Vec<(Arc<Cgroup>, usize)> = self
            .smiths
            .read()
            .values()
            .filter_map(|e| Some((e.cgroup.clone()?, e.full_id.matches('/').count())))
            .collect();
        smith_cgroups.extend(
            self.retired
                .lock()
                .iter()
                .map(|r| (Arc::clone(&r.cgroup), r.full_id.matches('/').count())),
        );
        // Deepest first: a node can only go once its children's nodes have.
        smith_cgroups.sort_by_key(|(_, depth)| std::cmp::Reverse(*depth));
        if let Some(state) = &self.cgroups {
            for (cg, is_smith) in smith_cgroups
                .iter()
                .map(|(c, _)| (c, true))
                .chain(std::iter::once((&state.operator, false)))
            {
                if kill && cg.populated().unwrap_or(false) {
                    if let Err(e) = cg.kill_all() {
                        note(format!("killing {}", cg.path.display()), e);
                    }
                    cg.wait_empty(KILL_WAIT);
                }
                if let Err(e) = cg.remove() {
                    note(format!("removing {}", cg.path.display()), e);
                    continue;
                }
                if is_smith {
                    if let Some(node) = cg.path.parent() {
                        match std::fs::remove_dir(node) {
                            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                                note(format!("removing {}", node.display()), e);
                            }
                            _ => {}
                        }
                    }
                }
            }
            // Nodes of ancestors that were never registered themselves.
            sys_cgroup::remove_tree(&state.parent.path);
            if let Some(l) = state.limits.read().as_ref() {
                l.shutdown();
            }
            if let Err(e) = state.parent.remove() {
                note(format!("removing {}", state.parent.path.display()), e);
            }
        } else if kill {
            let idxs: Vec<SmithIdx> = self.smiths.read().keys().copied().collect();
            for idx in idxs {
                let _ = self.kill_smith(idx, libc::SIGKILL);
            }
        }
        self.bound.write().clear();
        self.cache.write().clear();
        self.retired.lock().clear();
        self.shut_down.store(true, Ordering::Release);
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown(false) {
            tracing::warn!("identity shutdown: {e}");
        }
    }
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("mode", &self.mode)
            .field("daemon_pid", &self.daemon_pid)
            .field("cgroup_parent", &self.cgroup_parent())
            .field("smiths", &self.smiths.read().len())
            .field("cached", &self.cache_len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn resolver_is_send_and_sync() {
        assert_send_sync::<Resolver>();
    }

    #[test]
    fn effective_names() {
        assert_eq!(Effective::Cgroup.as_str(), "cgroup");
        assert_eq!(Effective::Ancestry.as_str(), "ancestry");
    }
}
