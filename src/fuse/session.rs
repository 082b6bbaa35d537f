//! The FUSE session: the mount, INIT ([`super::init`]), the `/dev/fuse` worker threads
//! ([`super::devfuse`]) or the io_uring queues ([`super::uring`]) around the one
//! [`Dispatcher`], passthrough, kernel cache invalidation, and the signal thread that stops the
//! daemon (docs/SPEC.md §6, §9). The daemon (`crate::daemon`) composes it.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

use anyhow::{anyhow, bail, Context, Result};

use super::devfuse::{self, Workers};
use super::dispatch::{Changes, Dispatcher, Origin};
use super::init::{self, Offer, Settled};
use super::transport::{self, Transport};
use super::uring::{self, Rings};
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

/// Kernel cache invalidation, written to the session's `/dev/fuse`: attributes only from the
/// filesystem (safe from a FUSE thread: no inode lock, no waiting), entries and inodes for the
/// scheduler's own writes (from the scheduler's threads, never a FUSE thread: the kernel may
/// wait on us). Made before the filesystem and connected to the session by [`mount`]; until
/// then (and without a mount) it does nothing.
#[derive(Debug, Default)]
pub struct KernelCache {
    dev: OnceLock<Arc<OwnedFd>>,
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

    /// `FUSE_NOTIFY_INVAL_INODE` of `node` (`data`: its cached pages too).
    fn inval_inode(&self, node: NodeId, data: bool) {
        if let Some(dev) = self.dev.get() {
            if let Err(e) = devfuse::notify(dev.as_fd(), &devfuse::inval_inode(node, data)) {
                tracing::debug!("inval_inode: {e}");
            }
        }
    }

    /// `FUSE_NOTIFY_INVAL_ENTRY` of `name` in `parent`, after its attributes (the directory's
    /// mtime and nlink changed too; the kernel invalidates them with the entry only when it
    /// holds a dentry for the name).
    fn inval_entry(&self, parent: NodeId, name: &std::ffi::OsStr) {
        use std::os::unix::ffi::OsStrExt;
        if let Some(dev) = self.dev.get() {
            let _ = devfuse::notify(dev.as_fd(), &devfuse::inval_inode(parent, false));
            if let Err(e) =
                devfuse::notify(dev.as_fd(), &devfuse::inval_entry(parent, name.as_bytes()))
            {
                tracing::debug!("inval_entry: {e}");
            }
        }
    }

    /// Node `node`'s attributes changed elsewhere (over a remote connection), and its cached
    /// contents when `data`. Not from a FUSE thread of this mount (the kernel may wait on us).
    pub fn node_changed(&self, node: NodeId, data: bool) {
        self.inval_inode(node, data);
    }

    /// The name `name` in directory `parent` changed elsewhere (over a remote connection). Not
    /// from a FUSE thread of this mount.
    pub fn entry_changed(&self, parent: NodeId, name: &std::ffi::OsStr) {
        self.inval_entry(parent, name);
    }

    fn node_id(&self, backing_ino: BackingIno) -> Option<NodeId> {
        let fs = self.fs.get()?.upgrade()?;
        Some(fs.node_id(backing_ino))
    }
}

impl AttrCache for KernelCache {
    fn attrs_changed(&self, node: NodeId) {
        // Attributes only (negative offset): takes no inode lock, safe from a FUSE thread.
        if let Some(dev) = self.dev.get() {
            let _ = devfuse::notify(dev.as_fd(), &devfuse::inval_inode(node, false));
        }
    }
}

impl Invalidate for KernelCache {
    fn entry(&self, parent_backing_ino: BackingIno, name: &std::ffi::OsStr) {
        if self.dev.get().is_none() {
            return;
        }
        if let Some(parent) = self.node_id(parent_backing_ino) {
            self.inval_entry(parent, name);
        }
    }

    fn inode(&self, backing_ino: BackingIno) {
        if self.dev.get().is_none() {
            return;
        }
        if let Some(ino) = self.node_id(backing_ino) {
            self.inval_inode(ino, true);
        }
    }
}

/// A mounted FUSE session whose INIT is answered, not yet serving `/dev/fuse`.
pub struct MountedSession {
    /// The connection.
    dev: Arc<OwnedFd>,
    /// The one dispatcher of the `/dev/fuse` threads and the io_uring queues.
    disp: Arc<Dispatcher>,
    /// What INIT settled.
    settled: Settled,
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

/// Mount `fs` at `dir` over itself, answer the kernel's INIT, start the io_uring queues when
/// INIT negotiated them, and connect `kernel` to the session; what a request changes is told to
/// `changes` (the other kernels: every remote connection). The mount is live (and requests
/// queue) when this returns; [`MountedSession::run`] serves them.
///
/// # Errors
/// The mount failed (`cannot mount DIR: …`).
pub fn mount(
    fs: Arc<SmithFs>,
    dir: &Path,
    opts: SessionOptions,
    kernel: &KernelCache,
    changes: Option<Arc<dyn Changes>>,
) -> Result<MountedSession> {
    if opts.transport == Transport::IoUring && transport::enable_uring() != Some(true) {
        bail!(
            "--transport io-uring: FUSE over io_uring is off; turn it on with `echo 1 > {}` (root, machine-wide) or mount with --transport auto",
            transport::ENABLE_URING
        );
    }
    let _ = kernel.fs.set(Arc::downgrade(&fs));
    // Type `fuse.smithfs` whoever mounts (docs/SPEC.md §6): our own mount, INIT and loop.
    let (dev, via) = super::mount::mount(dir, opts.allow_other, opts.default_permissions)?;
    let guard = MountGuard {
        dir: dir.to_path_buf(),
        armed: true,
    };
    let offer = Offer {
        passthrough: opts.passthrough && is_root(),
        io_uring: opts.transport,
        max_write: init::MAX_WRITE,
    };
    let settled = init::answer(dev.as_fd(), &offer).map_err(|e| {
        tracing::error!("{e}");
        anyhow!("cannot mount {}: {e}", dir.display())
    })?;
    tracing::debug!(?via, "mounted");
    tracing::info!(
        flags = format_args!("{:#x}", settled.flags),
        minor = settled.minor,
        passthrough = settled.passthrough(),
        transport = transport_name(&settled),
        "FUSE session initialised"
    );
    let dev = Arc::new(dev);
    let _ = kernel.dev.set(dev.clone());
    // Without --allow-other only the daemon's own uid may make requests (the kernel lets root
    // and, with `allow_other`, everyone reach the mount; libfuse's and fuser's default).
    // SAFETY: geteuid has no preconditions.
    let owner = (!opts.allow_other).then(|| unsafe { libc::geteuid() });
    let mut disp = Dispatcher::new(fs, settled.passthrough(), owner, dev.clone());
    if let Some(c) = changes {
        disp = disp.with_changes(c, Origin::Local);
    }
    let disp = Arc::new(disp);
    let rings = settled
        .io_uring()
        .then(|| start_rings(&dev, &disp, &settled));
    Ok(MountedSession {
        dev,
        disp,
        settled,
        rings,
        dir: dir.to_path_buf(),
        guard,
    })
}

fn transport_name(settled: &Settled) -> &'static str {
    if settled.io_uring() {
        "io-uring"
    } else {
        "dev-fuse"
    }
}

/// Register the io_uring queues of a session whose INIT negotiated FUSE over io_uring. The
/// kernel holds every request until all queues are registered, so a failure ends the daemon at
/// once: the connection is aborted and the mount fails closed (ENOTCONN) instead of hanging.
fn start_rings(dev: &OwnedFd, disp: &Arc<Dispatcher>, settled: &Settled) -> Rings {
    let fail = |e: &dyn std::fmt::Display| -> ! {
        tracing::error!("cannot serve FUSE over io_uring: {e}");
        eprintln!("smithfs: cannot serve FUSE over io_uring: {e}");
        std::process::exit(1);
    };
    let payload = uring::payload_size(settled.max_write, settled.max_pages);
    let depth = std::env::var("SMITHFS_URING_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|d| (1..=64).contains(d))
        .unwrap_or(uring::DEPTH);
    uring::start(dev.as_fd(), disp.clone(), payload, depth).unwrap_or_else(|e| fail(&e))
}

impl MountedSession {
    /// What the signal thread ends the session with.
    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter(self.dir.clone())
    }

    /// Serve requests on `/dev/fuse` (`worker_threads()` threads) until the filesystem is
    /// unmounted.
    ///
    /// # Errors
    /// The session failed (`FUSE session failed: …`).
    pub fn run(self) -> Result<()> {
        let MountedSession {
            dev,
            disp,
            settled,
            rings,
            mut guard,
            ..
        } = self;
        // The largest request: a WRITE of max_write (or max_pages) with its header and argument.
        let max_request =
            (settled.max_write as usize).max(settled.max_pages as usize * 4096) + 4096;
        let workers: Workers =
            devfuse::start(&dev, &disp, worker_threads(), max_request, rings.is_some())
                .context("FUSE session failed")?;
        tracing::debug!(threads = workers.len(), "serving /dev/fuse");
        let served = workers.join().context("FUSE session failed");
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
        transport_name(&self.settled)
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

/// Threads serving `/dev/fuse`: twice the CPUs, 4 to 16.
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
