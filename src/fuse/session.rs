//! The FUSE session: mount options, worker threads, `clone_fd`, passthrough, kernel cache
//! invalidation, and the signal thread that stops the daemon (docs/SPEC.md §6, §9). The daemon
//! (`crate::daemon`) composes it; nothing outside `fuse/` names fuser.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

use anyhow::{anyhow, bail, Context, Result};
use fuser::{Session, SessionACL};

use super::dispatch::Dispatcher;
use super::transport::{self, Negotiated, Transport};
use super::uring::{self, Rings};
use super::FuseFs;
use crate::backing::BackingIno;
use crate::fs::{AttrCache, NodeId, SmithFs};
use crate::sched::Invalidate;

/// How the session is set up (from `smithfs mount`'s flags).
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// Let other users (not only the mounting one) use the mount (`--allow-other`).
    pub allow_other: bool,
    /// Ask for FUSE passthrough of regular files (not `--no-passthrough`); granted only to
    /// root (CAP_SYS_ADMIN) by a kernel ≥ 6.9.
    pub passthrough: bool,
    /// How requests reach the daemon (`--transport`).
    pub transport: Transport,
    /// Mount with `default_permissions` (the kernel checks mode bits); off only with
    /// `sandbox.uid_per_smith`, where the rules alone decide (docs/SPEC.md §3).
    pub default_permissions: bool,
}

/// Kernel cache invalidation through the session's notifier: attributes only from the
/// filesystem (safe from a FUSE thread: no inode lock, no waiting), entries and inodes for the
/// scheduler's own writes (from the scheduler's threads, never a FUSE thread: the kernel may
/// wait on us). Made before the filesystem and connected to the session by [`mount`]; until
/// then (and without a mount) it does nothing.
#[derive(Debug, Default)]
pub struct KernelCache {
    notifier: OnceLock<fuser::Notifier>,
    fs: OnceLock<Weak<SmithFs>>,
}

impl std::fmt::Debug for MountedSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountedSession").finish_non_exhaustive()
    }
}

impl KernelCache {
    /// A cache invalidator not yet connected to a session.
    pub fn new() -> Arc<KernelCache> {
        Arc::new(KernelCache::default())
    }

    /// Node `node`'s attributes changed elsewhere (over a remote connection), and its cached
    /// contents when `data`. Not from a FUSE thread of this mount (the kernel may wait on us).
    pub fn node_changed(&self, node: NodeId, data: bool) {
        if let Some(n) = self.notifier.get() {
            let off = if data { 0 } else { -1 };
            if let Err(e) = n.inval_inode(fuser::INodeNo(node.0), off, 0) {
                tracing::debug!("inval_inode: {e}");
            }
        }
    }

    /// The name `name` in directory `parent` changed elsewhere (over a remote connection). Not
    /// from a FUSE thread of this mount.
    pub fn entry_changed(&self, parent: NodeId, name: &std::ffi::OsStr) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(fuser::INodeNo(parent.0), -1, 0);
            if let Err(e) = n.inval_entry(fuser::INodeNo(parent.0), name) {
                tracing::debug!("inval_entry: {e}");
            }
        }
    }

    fn node_id(&self, backing_ino: BackingIno) -> Option<fuser::INodeNo> {
        let fs = self.fs.get()?.upgrade()?;
        Some(fuser::INodeNo(fs.node_id(backing_ino).0))
    }
}

impl AttrCache for KernelCache {
    fn attrs_changed(&self, node: NodeId) {
        if let Some(n) = self.notifier.get() {
            // Attributes only (negative offset): takes no inode lock, safe from a FUSE thread.
            let _ = n.inval_inode(fuser::INodeNo(node.0), -1, 0);
        }
    }
}

impl Invalidate for KernelCache {
    fn entry(&self, parent_backing_ino: BackingIno, name: &std::ffi::OsStr) {
        let (Some(n), Some(parent)) = (self.notifier.get(), self.node_id(parent_backing_ino))
        else {
            return;
        };
        // The directory's own attributes (mtime, nlink) changed too; the kernel invalidates them
        // with the entry only when it holds a dentry for the name.
        let _ = n.inval_inode(parent, -1, 0);
        if let Err(e) = n.inval_entry(parent, name) {
            tracing::debug!("inval_entry: {e}");
        }
    }

    fn inode(&self, backing_ino: BackingIno) {
        let (Some(n), Some(ino)) = (self.notifier.get(), self.node_id(backing_ino)) else {
            return;
        };
        if let Err(e) = n.inval_inode(ino, 0, 0) {
            tracing::debug!("inval_inode: {e}");
        }
    }
}

/// A mounted FUSE session, not yet serving.
pub struct MountedSession {
    session: Session<FuseFs>,
    negotiated: Arc<Negotiated>,
    /// The io_uring queues, when INIT negotiated FUSE over io_uring (already serving).
    rings: Option<Rings>,
    /// The mount point, for the [`Unmounter`].
    dir: PathBuf,
    /// Undoes the mount if the session is dropped before it served.
    guard: MountGuard,
}

/// Detaches a mount whose session never served (the daemon failed between the mount and
/// [`MountedSession::run`]), so that no dead mount is left behind. Disarmed once the session
/// has run: by then the kernel has ended the mount, and unmounting again could hit a newer one.
struct MountGuard {
    dir: PathBuf,
    armed: bool,
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = kernel_unmount(&self.dir, true) {
                tracing::warn!("{e:#}");
            }
        }
    }
}

/// Ends a session from another thread (the signal thread): unmounts its directory.
pub struct Unmounter(PathBuf);

impl Unmounter {
    /// Unmount the session ([`kernel_unmount`], not detached).
    ///
    /// # Errors
    /// The unmount failed (busy, or fusermount3 failed).
    pub fn unmount(&mut self) -> std::io::Result<()> {
        kernel_unmount(&self.0, false).map_err(|e| std::io::Error::other(format!("{e:#}")))
    }
}

/// Mount `fs` at `dir` over itself and connect `kernel` to the session. The mount is live (and
/// requests queue) when this returns; [`MountedSession::run`] serves them.
///
/// # Errors
/// The mount failed (`cannot mount DIR: …`).
pub fn mount(
    fs: Arc<SmithFs>,
    dir: &Path,
    opts: SessionOptions,
    kernel: &KernelCache,
) -> Result<MountedSession> {
    let mut config = fuser::Config::default();
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(worker_threads());
    config.clone_fd = true;
    if opts.transport == Transport::IoUring && transport::enable_uring() != Some(true) {
        bail!(
            "--transport io-uring: FUSE over io_uring is off; turn it on with `echo 1 > {}` (root, machine-wide) or mount with --transport auto",
            transport::ENABLE_URING
        );
    }
    let _ = kernel.fs.set(Arc::downgrade(&fs));
    let negotiated = Arc::new(Negotiated::default());
    // Type `fuse.smithfs` whoever mounts (docs/SPEC.md §6): our own mount, then fuser serves the
    // connection.
    let (dev, via) = super::mount::mount(dir, opts.allow_other, opts.default_permissions)?;
    let guard = MountGuard {
        dir: dir.to_path_buf(),
        armed: true,
    };
    let acl = config.acl;
    let session = Session::from_fd(
        FuseFs::new(fs.clone(), opts.passthrough && is_root())
            .with_transport(opts.transport, negotiated.clone()),
        dev,
        acl,
        config,
    )
    .map_err(|e| anyhow!("cannot mount {}: {e}", dir.display()))?;
    tracing::debug!(?via, "mounted");
    let _ = kernel.notifier.set(session.notifier());
    let rings = negotiated
        .io_uring()
        .then(|| start_rings(&session, fs, &negotiated, opts.allow_other));
    Ok(MountedSession {
        session,
        negotiated,
        rings,
        dir: dir.to_path_buf(),
        guard,
    })
}

/// Register the io_uring queues of a session whose INIT negotiated FUSE over io_uring. The
/// kernel holds every request until all queues are registered, so a failure ends the daemon at
/// once: the connection is aborted and the mount fails closed (ENOTCONN) instead of hanging.
fn start_rings(
    session: &Session<FuseFs>,
    fs: Arc<SmithFs>,
    negotiated: &Negotiated,
    allow_other: bool,
) -> Rings {
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering::Relaxed;
    let fail = |e: &dyn std::fmt::Display| -> ! {
        tracing::error!("cannot serve FUSE over io_uring: {e}");
        eprintln!("smithfs: cannot serve FUSE over io_uring: {e}");
        std::process::exit(1);
    };
    let dev = session
        .as_fd()
        .try_clone_to_owned()
        .unwrap_or_else(|e| fail(&e));
    // fuser's SessionACL::Owner, which /dev/fuse requests get, is the daemon's euid.
    // SAFETY: geteuid has no preconditions.
    let owner = (!allow_other).then(|| unsafe { libc::geteuid() });
    let disp = Arc::new(Dispatcher::new(
        fs,
        negotiated.passthrough.load(Relaxed),
        owner,
        dev,
    ));
    let payload = uring::payload_size(
        negotiated.max_write.load(Relaxed),
        negotiated.max_pages.load(Relaxed),
    );
    let depth = std::env::var("SMITHFS_URING_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|d| (1..=64).contains(d))
        .unwrap_or(uring::DEPTH);
    uring::start(session.as_fd(), disp, payload, depth).unwrap_or_else(|e| fail(&e))
}

impl MountedSession {
    /// What the signal thread ends the session with.
    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter(self.dir.clone())
    }

    /// Serve requests until the filesystem is unmounted.
    ///
    /// # Errors
    /// The session failed (`FUSE session failed: …`).
    pub fn run(self) -> Result<()> {
        let MountedSession {
            session,
            rings,
            mut guard,
            ..
        } = self;
        let served = session.run().context("FUSE session failed");
        guard.armed = false;
        if let Some(r) = rings {
            if !r.join(std::time::Duration::from_secs(5)) {
                tracing::warn!("io_uring queue threads still running after unmount");
            }
        }
        served
    }

    /// The transport serving requests: `io-uring` or `dev-fuse`.
    pub fn transport(&self) -> &'static str {
        self.negotiated.transport_name()
    }

    /// Number of io_uring queues (0 on `/dev/fuse`).
    pub fn queues(&self) -> usize {
        self.rings.as_ref().map_or(0, Rings::queues)
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn worker_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cpus * 2).clamp(4, 16)
}

/// Block SIGTERM/SIGINT/SIGHUP in this thread (and every thread it starts afterwards). Call
/// before any thread exists, so that only the signal thread ever takes them.
///
/// # Errors
/// The mask or a disposition cannot be set.
pub fn block_signals() -> Result<nix::sys::signal::SigSet> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGHUP);
    set.thread_block().context("cannot block signals")?;
    // An inherited SIG_IGN (nohup, some supervisors) would discard these signals before
    // sigwait could take them: restore the default disposition now that they are blocked.
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: SIG_DFL is a valid disposition; the signal is blocked in this thread.
        unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) }
            .context("cannot reset a signal disposition")?;
    }
    Ok(set)
}

/// What the signal thread asks of the daemon (implemented by `crate::daemon`).
pub trait SignalActions: Send {
    /// Stop every live run (journaled `run.interrupted`) and start no new one; returns once
    /// none is live.
    fn stop_runs(&self);
    /// Schedule again after an unmount that failed (the mount stays up).
    fn resume(&self);
    /// Re-read config.json and apply it (SIGHUP; `smithfs reload`); logs and journals the
    /// outcome.
    fn reload(&self);
}

/// Handle the blocked signals `set` for the daemon's whole life (issue 11): SIGTERM and SIGINT
/// stop the runs (`actions.stop_runs`), then unmount `dir`, retrying a busy unmount for 3 s; if
/// it still fails the holders are logged, scheduling resumes (`actions.resume`) and the thread
/// waits for the next signal, which tries again. SIGHUP reloads config.json (`actions.reload`;
/// docs/PROTOCOL-NOTES.md O9, O11, O12).
///
/// # Errors
/// The thread cannot be started.
pub fn spawn_signal_thread(
    dir: PathBuf,
    set: nix::sys::signal::SigSet,
    mut unmounter: Unmounter,
    actions: Box<dyn SignalActions>,
) -> Result<()> {
    std::thread::Builder::new()
        .name("smithfs-signals".into())
        .spawn(move || {
            loop {
                let sig = match set.wait() {
                    Ok(sig) => sig,
                    Err(e) => {
                        tracing::error!("sigwait failed: {e}");
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        continue;
                    }
                };
                if sig == nix::sys::signal::Signal::SIGHUP {
                    tracing::info!("SIGHUP received: reloading config.json");
                    actions.reload();
                    continue;
                }
                tracing::info!(?sig, "signal received: stopping runs and unmounting");
                actions.stop_runs();
                // Unmounted from outside (`umount DIR`; the upkeep's watch raised the signal):
                // the runs are stopped, so the copies of the mount in their namespaces are gone
                // and the session ends by itself (docs/PROTOCOL-NOTES.md H13).
                if crate::sys::mount::mounted_fs_type(&dir).as_deref() != Some(crate::sys::mount::FS_TYPE) {
                    tracing::info!("already unmounted: the session ends with the last run");
                    return;
                }
                let Err(e) = unmounter.unmount() else {
                    return;
                };
                // A process that just left the mount may still be exiting: retry a busy unmount
                // for a moment before reporting it.
                let retried = (0..30).any(|_| {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    kernel_unmount(&dir, false).is_ok()
                });
                if retried {
                    return;
                }
                let held = crate::sys::procfs::mount_holders(&dir, &[std::process::id()]);
                tracing::error!(
                    "unmount failed: {e}; held by: {}; scheduling again; send the signal again to retry",
                    crate::sys::procfs::describe_holders(&held)
                );
                actions.resume();
            }
        })
        .context("cannot start the signal thread")?;
    Ok(())
}

/// Unmount `dir` in the kernel: `umount2` as root (`MNT_DETACH` for a dead mount), else
/// `fusermount3 -u` (`-uz`).
///
/// # Errors
/// One line: busy, not ours, or fusermount3 missing.
pub fn kernel_unmount(dir: &Path, detach: bool) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    if is_root() {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
        let flags = if detach { libc::MNT_DETACH } else { 0 };
        // SAFETY: NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBUSY) {
                bail!(
                    "{} is busy: a process has its working directory or open files in it",
                    dir.display()
                );
            }
            bail!("cannot unmount {}: {e}", dir.display());
        }
        return Ok(());
    }
    let status = std::process::Command::new("fusermount3")
        .arg(if detach { "-uz" } else { "-u" })
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(_) => bail!(
            "{} is busy or not yours: fusermount3 -u failed",
            dir.display()
        ),
        Err(e) => bail!("cannot run fusermount3: {e}"),
    }
}
