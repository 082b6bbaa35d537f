//! The composition root: the whole daemon wired in one place (docs/SPEC.md §6, §9).
//!
//! [`serve`] opens the store once, builds the identity resolver, the scheduler's queue (one
//! channel, made before the filesystem), the kernel cache invalidator, the filesystem, then
//! mounts the FUSE session, starts the scheduler on the queue and serves until unmounted. Every
//! connection is given at construction; nothing is installed afterwards. `cli/mount.rs` keeps
//! argument parsing, preflight and daemonizing.

use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::backing;
use crate::fs::{BindError, FsOptions, Identities, Ports, SmithFs};
use crate::fuse::dispatch::Origin;
use crate::fuse::session::{self, KernelCache, SessionOptions};
use crate::identity::resolve::Resolver;
use crate::sched::runner::BindTo;
use crate::sched::{RunBinder, SchedCtx, Scheduler, SchedulerPort};
use crate::tree::layout::STATE_DIR;
use crate::tree::model::{FullId, SmithIdx};
use crate::tree::template::Templates;

/// What `smithfs mount` asks of the daemon.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// Read the configuration from this file instead of DIR/config.json (`--config`).
    pub config: Option<PathBuf>,
    /// `--operator`, overriding the configuration.
    pub operator: Option<crate::config::OperatorMode>,
    /// `--identity`, overriding the configuration.
    pub identity: Option<crate::config::IdentityMode>,
    /// Re-queue runs interrupted by a dead daemon (`--resume`).
    pub resume: bool,
    /// How the FUSE session is set up.
    pub session: SessionOptions,
    /// Log level (tracing filter syntax); default from RUST_LOG, else "info".
    pub log_level: Option<String>,
}

impl DaemonOptions {
    /// Where the configuration comes from and what overrides it: read at mount and again by
    /// every reload ([`crate::reload::load_config`]).
    pub fn config_source(&self) -> crate::reload::ConfigSource {
        crate::reload::ConfigSource {
            config: self.config.clone(),
            operator: self.operator,
            identity: self.identity,
        }
    }
}

/// The daemon's log, `.smithfs-state/daemon.log`, bounded (docs/PROTOCOL-NOTES.md H25): once it
/// holds [`DaemonLog::CAP`] bytes it becomes `daemon.log.1` (replacing the one before) and a new
/// `daemon.log` starts, so that the log never takes more than twice that of the store's disk,
/// whatever is logged.
#[derive(Debug)]
pub struct DaemonLog {
    state: OwnedFd,
    file: File,
    /// Bytes in `file`.
    size: u64,
    /// [`DaemonLog::CAP`] (smaller in tests).
    cap: u64,
}

impl DaemonLog {
    /// Largest `daemon.log`, bytes.
    pub const CAP: u64 = 16 << 20;
    const NAME: &'static CStr = c"daemon.log";
    const OLD: &'static CStr = c"daemon.log.1";

    /// Open (or create) `daemon.log` in the state directory `state`, appending.
    ///
    /// # Errors
    /// The directory or the file cannot be opened.
    pub fn open(state: &OwnedFd) -> std::io::Result<DaemonLog> {
        let state = state.try_clone()?;
        let file = Self::open_in(&state)?;
        let size = file.metadata()?.len();
        Ok(DaemonLog {
            state,
            file,
            size,
            cap: Self::CAP,
        })
    }

    fn open_in(state: &OwnedFd) -> std::io::Result<File> {
        backing::open_file(
            state.as_fd(),
            Self::NAME,
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            0o600,
        )
        .map(File::from)
        .map_err(std::io::Error::from)
    }

    /// Move the full log aside and start a new one; on failure the old file is written on.
    fn rotate(&mut self) {
        let moved = backing::rename(
            self.state.as_fd(),
            Self::NAME,
            self.state.as_fd(),
            Self::OLD,
            0,
        );
        if moved.is_ok() {
            if let Ok(f) = Self::open_in(&self.state) {
                self.file = f;
                self.size = 0;
            }
        }
    }
}

impl Write for DaemonLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.size > 0 && self.size.saturating_add(buf.len() as u64) > self.cap {
            self.rotate();
        }
        let n = self.file.write(buf)?;
        self.size = self.size.saturating_add(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Log to `file` (the daemon's log) or to stderr, at `level` (tracing filter syntax; default
/// from RUST_LOG, else "info").
pub fn init_logging(level: Option<&str>, file: Option<DaemonLog>) {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(l) => EnvFilter::new(l),
        // Nothing a caller can repeat at will logs above debug (a request we do not serve is
        // answered ENOSYS silently, notes H15).
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match file {
        Some(f) => builder
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(f))
            .try_init(),
        // Colour only on a terminal: a pipe or a file gets plain text.
        None => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .try_init(),
    };
}

/// Mount `dir` over itself and serve requests until it is unmounted. `report` (daemon mode)
/// receives "ready" once the mount is live; stdio is then detached.
///
/// # Errors
/// One line naming what could not be set up (the store, the lock, the configuration, the
/// identity resolver, the mount, the scheduler) or that the session failed.
pub fn serve(dir: &Path, opts: &DaemonOptions, mut report: Option<&mut File>) -> Result<()> {
    // SAFETY: umask and prctl have no memory-safety preconditions. A zero umask lets created
    // modes be exactly what the caller asked (the kernel already applied the caller's umask);
    // what the daemon starts gets the mask it inherited back (notes H16); a non-dumpable daemon
    // keeps same-uid processes out of its descriptors (docs/SPEC.md §10).
    let inherited = unsafe {
        let inherited = libc::umask(0);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        inherited
    };
    crate::process::spawn::set_run_umask(inherited);
    // Before any thread exists, so that every thread inherits the mask and only the signal
    // thread ever takes SIGTERM/SIGINT/SIGHUP.
    let signals = session::block_signals()?;
    let nofile = raise_nofile();
    // The store, opened once; the scheduler gets a duplicate of the descriptor.
    let root =
        backing::open_store_root(dir).map_err(|e| anyhow!("cannot open {}: {e}", dir.display()))?;
    let sched_root = root
        .try_clone()
        .map_err(|e| anyhow!("cannot open {}: {e}", dir.display()))?;
    // Never keep a working directory inside the mount point: it would see the backing store.
    std::env::set_current_dir("/").context("cannot chdir to /")?;
    let state_name = std::ffi::CString::new(STATE_DIR)?;
    let state = backing::ensure_dir(root.as_fd(), &state_name, 0o700)
        .map_err(|e| anyhow!("cannot create {}/{STATE_DIR}: {e}", dir.display()))?;
    // One daemon per directory: a second `mount` racing this one fails here, before mounting.
    let lock = backing::open_file(
        state.as_fd(),
        c"daemon.lock",
        libc::O_RDWR | libc::O_CREAT,
        0o600,
    )
    .map_err(|e| anyhow!("cannot open the daemon lock: {e}"))?;
    // A daemon that was just unmounted may still be finishing: give it a moment.
    if !try_lock(&lock, Duration::from_secs(10)) {
        bail!(
            "another smithfs daemon is serving {}; unmount it first with `smithfs umount {}`",
            dir.display(),
            dir.display()
        );
    }
    if report.is_some() {
        let log =
            DaemonLog::open(&state).map_err(|e| anyhow!("cannot open the daemon log: {e}"))?;
        init_logging(opts.log_level.as_deref(), Some(log));
    }
    let config = crate::reload::load_config(dir, root.as_fd(), &opts.config_source())?;
    if crate::sandbox::applies(&config.sandbox) {
        // docs/SPEC.md §12: a sandbox this host cannot build is refused in one line.
        crate::sandbox::probe(&config.sandbox).map_err(|why| {
            anyhow!(
                "cannot build the runs' sandbox: {why} (\"sandbox\": {{\"enabled\": false}} in config.json mounts without it)"
            )
        })?;
    }
    // The sandbox's kernel-enforced layers this host lacks (docs/SPEC.md §12): logged, or the
    // mount refused when `sandbox.require` names one (also while the sandbox is not applied at
    // all: nothing `require` names would be there).
    if crate::sandbox::applies(&config.sandbox) {
        let offered = crate::sandbox::layers::protections();
        for missing in crate::sandbox::layers::check_mount(&config.sandbox, &offered)
            .map_err(|e| anyhow!(e))?
        {
            tracing::warn!("{missing}");
        }
        // A test knob (docs/PROTOCOL-NOTES.md SB14): layers removed from every run, read from
        // the operator's environment here only, and loud.
        let removed = crate::sandbox::layers::Removed::from_env().map_err(|e| anyhow!(e))?;
        if !removed.is_none() {
            tracing::warn!(
                "sandbox: runs start WITHOUT their {} ({} is set: a test build of the sandbox, not a sandbox to trust)",
                removed.names(),
                crate::sandbox::layers::WITHOUT_VAR
            );
        }
        crate::sandbox::layers::Removed::set_for_this_daemon(removed);
    } else if !config.sandbox.require.is_empty() {
        bail!(
            "sandbox.require names protections, but sandbox.enabled is false: runs would start without any of them"
        );
    }
    // The agents' user (docs/SPEC.md §12), once, before anything is mounted — when runs start
    // in the sandbox (`sandbox::applies`: with the run side, so that the tree is the agents'
    // exactly when runs are; docs/PROTOCOL-NOTES.md XT0).
    let agents = if crate::sandbox::applies(&config.sandbox) {
        let user = crate::sandbox::AgentUser::resolve(
            &config.sandbox,
            dir,
            state.as_fd(),
            &crate::sandbox::HostFiles::system(),
            crate::sandbox::user::Invoker::current(),
        )
        .map_err(|e| anyhow!("{e}"))?;
        tracing::info!(
            uid = user.uid(),
            gid = user.gid(),
            name = user.name(),
            source = %user.source(),
            per_smith = ?user.per_smith_range(),
            "sandbox: the agents' user"
        );
        Some(Arc::new(user))
    } else {
        None
    };
    prepare_tree(&root, state.as_fd(), agents.as_deref())?;
    let hook_user = agents
        .as_ref()
        .and_then(|_| hook_user(crate::sandbox::user::Invoker::current()));
    if let (Some(u), Some(a)) = (&hook_user, &agents) {
        tracing::info!(
            uid = u.creds.uid,
            gid = u.creds.gid,
            "hooks run as the user who mounted"
        );
        if u.creds.uid != a.uid() {
            // docs/SPEC.md §12: the Operator is only uid 0, the daemon's and the agents' user.
            tracing::warn!(
                uid = u.creds.uid,
                agents_uid = a.uid(),
                "the user who mounted is not the agents' user: through the mount its hooks are \
                 Unknown (lookup and stat only; docs/PROTOCOL-NOTES.md XT20)"
            );
        }
    }
    // agent.secrets_file, checked and read once (docs/SPEC.md §12, "Secrets").
    let secrets = Arc::new(match &config.agent.secrets_file {
        Some(path) => {
            let me = crate::sandbox::user::Invoker::current();
            let operators: Vec<u32> = [Some(0), Some(me.euid), me.sudo_uid]
                .into_iter()
                .flatten()
                .collect();
            let s =
                crate::sandbox::Secrets::load(path, dir, &operators).map_err(|e| anyhow!("{e}"))?;
            tracing::info!(keys = ?s, "agent.secrets_file read");
            s
        }
        None => crate::sandbox::Secrets::default(),
    });
    // With the sandbox, runs are another uid than a root daemon: the mount is `allow_other`,
    // and with a uid per smith the rules alone decide, not mode bits (docs/SPEC.md §3, §12).
    let mut session_opts = opts.session;
    if let Some(a) = &agents {
        // A daemon that is not root runs agents as itself: no other user needs the mount.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            session_opts.allow_other = true;
        }
        session_opts.default_permissions = a.per_smith_range().is_none();
    }
    let templates = load_templates(root.as_fd())?;
    let fds = crate::fs::budget::plan(nofile, config.limits.max_open_files_per_smith);
    if fds.per_smith > fds.handles {
        tracing::warn!(
            per_smith = fds.per_smith,
            handles = fds.handles,
            "limits.max_open_files_per_smith is above the mount's share of descriptors for open files: one smith can use all of it"
        );
    }
    // Identity.
    let (limits, clamped) =
        crate::limits::CgroupPlan::new(config.limits.per_smith, config.limits.per_subtree);
    let resolver = Arc::new(
        Resolver::with_limits(config.identity, std::process::id(), &limits).map_err(
            |e| match e {
                crate::identity::IdentityError::Limits(e) => anyhow!("{e}"),
                e => anyhow!("cannot set up identity resolution: {e}"),
            },
        )?,
    );
    journal_clamped(state.as_fd(), config.journal.rotation(), &clamped);
    resolver.set_cache_capacity(fds.identity_cache);
    reap_previous_daemon(state.as_fd(), resolver.cgroup_parent());
    let binding = Arc::new(Binding(resolver.clone()));
    {
        // Descriptors track live processes: the resolver drops what it holds for exited ones
        // (and removes emptied cgroups of removed smiths) once a second.
        let weak = Arc::downgrade(&resolver);
        crate::process::reaper::every_second(move || {
            if let Some(r) = weak.upgrade() {
                r.housekeep();
            }
        });
    }
    // The resolver made the daemon a subreaper: orphans of runs land here and are reaped.
    crate::process::reaper::start();
    tracing::info!(mode = resolver.mode().as_str(), "identity resolution");
    // The scheduler's queue and the kernel cache, before the filesystem that feeds them.
    let port = SchedulerPort::open(state.as_fd(), config.journal.rotation())
        .context("cannot start the scheduler")?;
    let kernel = KernelCache::new();
    // Every kernel caching the tree: this mount's and, with a remote launcher, the nodes'.
    let kernels = Arc::new(Kernels::new(kernel.clone()));
    // The limits in force, shared by the filesystem and the reloader (docs/SPEC.md §6, §8).
    let live = Arc::new(crate::limits::live::LiveLimits::new(
        crate::limits::live::Snapshot::new(config.limits, fds.per_smith),
    ));
    // `smithfs reload` and SIGHUP (docs/SPEC.md §6): config.json applied without a remount.
    let reloader = Arc::new(crate::reload::Reloader::new(
        dir.to_path_buf(),
        opts.config_source(),
        root.try_clone()
            .map_err(|e| anyhow!("cannot open {}: {e}", dir.display()))?,
        config.clone(),
        port.clone(),
        crate::reload::LimitPorts {
            live: live.clone(),
            resolver: resolver.clone(),
            nofile,
        },
    ));
    let grace = Duration::from_secs(config.agent.kill_grace_secs);
    let fs = Arc::new(
        SmithFs::with_ports(
            root,
            FsOptions {
                mount_point: dir.to_path_buf(),
                operator: config.operator,
                limits: live,
                templates,
                max_fds: std::env::var("SMITHFS_MAX_FDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(fds.inode_cache),
                max_open_total: fds.handles,
                project: config.workspace.enabled(),
                agents: agents.clone(),
            },
            binding.clone(),
            Ports {
                sched: port.clone(),
                kernel: kernels.clone(),
                reload: reloader.clone(),
            },
        )
        .map_err(|e| anyhow!("cannot read {}: {e}", dir.display()))?,
    );
    // Passthrough writes never reach the daemon: the storage books catch up once a second.
    let weak_fs = Arc::downgrade(&fs);
    crate::process::reaper::every_second(move || {
        if let Some(fs) = weak_fs.upgrade() {
            fs.settle_passthrough_writers();
        }
    });
    // Changes made through this mount are pushed to every remote connection (notes R9, R40).
    let changes: Arc<dyn crate::fuse::dispatch::Changes> = kernels.clone();
    let mut mounted = session::mount(fs.clone(), dir, session_opts, &kernel, Some(changes))?;
    // The remote mount's listener (docs/SPEC.md §13), stopped when this returns (at unmount).
    let mut listener = start_listener(
        &config.launcher,
        &fs,
        dir,
        agents.as_deref(),
        state.as_fd(),
        &kernels,
    )?;
    let pid = std::process::id().to_string();
    let _ = backing::write_atomic(state.as_fd(), c"daemon.pid", pid.as_bytes(), 0o644);
    tracing::info!(
        dir = %dir.display(),
        pid,
        nofile,
        open_files_per_smith = fds.per_smith,
        open_files = fds.handles,
        inode_cache = fds.inode_cache,
        identity_cache = fds.identity_cache,
        reserve = fds.reserve,
        transport = mounted.transport(),
        queues = mounted.queues(),
        "mounted"
    );
    // Runs work in the mount: the scheduler starts once it is live.
    let sched = Arc::new(
        Scheduler::start_on(
            port,
            SchedCtx {
                root: sched_root,
                mount: dir.to_path_buf(),
                config,
                registry: fs.registry().clone(),
                binder: binding.clone(),
                invalidate: kernels.clone(),
                original_nofile: (
                    ORIGINAL_NOFILE.load(std::sync::atomic::Ordering::Relaxed),
                    ORIGINAL_NOFILE_MAX.load(std::sync::atomic::Ordering::Relaxed),
                ),
                storage: Some(fs.storage().clone()),
                agents,
                secrets,
                hook_user,
                remote: listener.as_ref().map(|l| {
                    Arc::new(Tickets(Arc::downgrade(l))) as Arc<dyn crate::sched::RemoteRuns>
                }),
            },
            opts.resume,
        )
        .context("cannot start the scheduler")?,
    );
    session::spawn_signal_thread(
        dir.to_path_buf(),
        signals,
        mounted.unmounter(),
        Box::new(Signals {
            sched: sched.clone(),
            reloader,
            // TERM, KILL after the grace, and the give-up after KILL (sched::exec).
            patience: grace * 2 + Duration::from_secs(15),
        }),
    )?;
    watch_for_outside_unmount(dir);
    if let Some(r) = report.take() {
        r.write_all(b"ready\n")?;
        detach_stdio();
    }
    let served = mounted.run();
    sched.shutdown();
    if listener.take().is_some() {
        let _ = backing::unlink(state.as_fd(), LISTENER_FILE, false);
    }
    if let Err(e) = resolver.shutdown(false) {
        tracing::warn!("identity clean-up: {e}");
    }
    served?;
    drop(lock);
    let _ = backing::unlink(state.as_fd(), c"daemon.pid", false);
    tracing::info!(dir = %dir.display(), "unmounted");
    Ok(())
}

/// Before the scan: smith dirs made before `home/` existed get it, and with the sandbox a tree
/// not yet brought over to the agents' user is (once: `.smithfs-state/agents-owned` names the
/// user it was given to; docs/SPEC.md §12 "Ownership").
fn prepare_tree(
    root: &OwnedFd,
    state: BorrowedFd<'_>,
    agents: Option<&crate::sandbox::AgentUser>,
) -> Result<()> {
    use crate::sandbox::tree::OWNED_MARK;
    let key = agents.map(|a| match a.per_smith_range() {
        Some((first, _)) => format!("per-smith {first}\n"),
        None => format!("{}\n", a.uid()),
    });
    let mark = backing::read_file(state, Path::new(OWNED_MARK)).unwrap_or_default();
    let rechown = key
        .as_ref()
        .is_some_and(|k| k.as_bytes() != mark.as_slice());
    let path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(root)
    ));
    let from = crate::sandbox::tree::From::mark(&String::from_utf8_lossy(&mark));
    let done = crate::sandbox::tree::prepare(&path, agents, rechown.then_some(&from))
        .map_err(|e| anyhow!("sandbox: cannot prepare the tree: {e}"))?;
    if let (true, Some(k)) = (rechown, key) {
        let name = std::ffi::CString::new(OWNED_MARK)?;
        backing::write_atomic(state, &name, k.as_bytes(), 0o644)
            .map_err(|e| anyhow!("cannot write {STATE_DIR}/{OWNED_MARK}: {e}"))?;
    }
    if done.homes_added > 0 || done.homes_seeded > 0 || done.chowned > 0 {
        tracing::info!(
            homes_added = done.homes_added,
            homes_seeded = done.homes_seeded,
            chowned = done.chowned,
            "tree prepared for the sandbox (home/ added to smith dirs made before it, empty ones seeded from templates/home/, root-owned entries given to the agents' user)"
        );
    }
    Ok(())
}

/// Stop the runs when `dir` is unmounted from outside (`umount DIR` by the operator): runs live
/// in mount namespaces of their own (docs/PROTOCOL-NOTES.md H13) whose copies of the mount keep
/// the session alive, so the daemon would otherwise go on serving them out of sight. Checked
/// once a second by the upkeep (one read of `/proc/self/mountinfo`); raises SIGTERM once, which
/// the signal thread handles as `smithfs umount` (runs stopped, the session then ends).
fn watch_for_outside_unmount(dir: &Path) {
    let dir = dir.to_path_buf();
    let raised = std::sync::atomic::AtomicBool::new(false);
    crate::process::reaper::every_second(move || {
        if raised.load(std::sync::atomic::Ordering::Relaxed)
            || crate::sys::mount::mounted_fs_type(&dir).as_deref()
                == Some(crate::sys::mount::FS_TYPE)
        {
            return;
        }
        raised.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(dir = %dir.display(), "unmounted from outside: stopping the runs");
        // SAFETY: kill(2) of this process with a signal its signal thread waits for.
        unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    });
}

/// Take `flock(LOCK_EX)` on `fd`, retrying until `patience` runs out.
fn try_lock(fd: &OwnedFd, patience: Duration) -> bool {
    let deadline = std::time::Instant::now() + patience;
    loop {
        // SAFETY: flock on a descriptor we own.
        let got = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(fd),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } == 0;
        if got || std::time::Instant::now() >= deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Wait until no daemon holds the lock file `path` (or `patience` runs out); true when free.
/// Used by `umount` to return only once the daemon is done with the store.
pub fn wait_for_lock(path: &Path, patience: Duration) -> bool {
    match std::fs::OpenOptions::new().read(true).open(path) {
        Ok(f) => try_lock(&OwnedFd::from(f), patience),
        Err(_) => true,
    }
}

fn get_nofile() -> Option<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer for one `struct rlimit`.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim)
}

fn set_nofile(lim: &libc::rlimit) -> bool {
    // SAFETY: `lim` is a valid `struct rlimit` for the duration of the call.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, lim) == 0 }
}

/// Raise `RLIMIT_NOFILE` as far as allowed: soft and hard to `fs.nr_open` (the kernel's
/// ceiling; needs `CAP_SYS_RESOURCE`, normally root), else the soft limit to the hard one. Every
/// open handle, cached inode and cached caller costs a descriptor (see [`crate::fs::budget`]).
/// The limits it started with are kept for the runs it starts. Returns the soft limit now.
fn raise_nofile() -> u64 {
    let Some(start) = get_nofile() else {
        return 1024;
    };
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let mut raised = false;
    if let Some(n) = nr_open.filter(|n| *n > start.rlim_max) {
        raised = set_nofile(&libc::rlimit {
            rlim_cur: n,
            rlim_max: n,
        });
    }
    if !raised && start.rlim_cur < start.rlim_max {
        raised = set_nofile(&libc::rlimit {
            rlim_cur: start.rlim_max,
            rlim_max: start.rlim_max,
        });
    }
    if raised {
        ORIGINAL_NOFILE.store(start.rlim_cur, std::sync::atomic::Ordering::Relaxed);
        ORIGINAL_NOFILE_MAX.store(start.rlim_max, std::sync::atomic::Ordering::Relaxed);
    }
    get_nofile().map_or(start.rlim_cur, |l| l.rlim_cur)
}

/// Journal `limits.clamped` for each `limits.per_smith` key above its `limits.per_subtree`
/// (docs/PROTOCOL-NOTES.md, L3): a smith's own processes are part of its subtree, so the leaf
/// gets the subtree's value.
fn journal_clamped(state: BorrowedFd<'_>, rotation: crate::config::Rotation, clamped: &[&str]) {
    if clamped.is_empty() {
        return;
    }
    let journal = crate::sched::Journal::open(state, rotation);
    for key in clamped {
        let msg = format!(
            "limits.per_smith.{key} is above limits.per_subtree.{key}: clamped to it (a smith's own processes are part of its subtree)"
        );
        tracing::warn!("{msg}");
        if let Ok(j) = &journal {
            let mut ev = crate::sched::Event::new("limits.clamped", None);
            ev.path = Some("config.json".into());
            ev.rule = Some(format!("limits.per_smith.{key}"));
            ev.error = Some(msg);
            let _ = j.append(&ev);
        }
    }
}

/// The file in `.smithfs-state/` naming the parent cgroup of the daemon serving the directory.
const DAEMON_CGROUP: &CStr = c"daemon.cgroup";

/// Kill what a killed predecessor left in its cgroups (its runs, also one it started but had
/// not journaled yet: the journal alone cannot name it), then record this daemon's parent
/// cgroup for its successor (docs/SPEC.md §6, §9).
fn reap_previous_daemon(state: BorrowedFd<'_>, own: Option<&Path>) {
    if let Ok(prev) =
        backing::read_file(state, Path::new(DAEMON_CGROUP.to_str().unwrap_or_default()))
    {
        let prev = PathBuf::from(OsStr::from_bytes(prev.trim_ascii()));
        if own != Some(prev.as_path()) {
            let killed = crate::identity::cgroup::kill_dead_parent(&prev, Duration::from_secs(5));
            if killed > 0 {
                tracing::warn!(cgroup = %prev.display(), killed, "killed the runs a dead daemon left");
            }
        }
    }
    let text = own
        .map(|p| p.as_os_str().as_bytes().to_vec())
        .unwrap_or_default();
    let _ = backing::write_atomic(state, DAEMON_CGROUP, &text, 0o644);
}

/// The soft `RLIMIT_NOFILE` the daemon started with, restored for the runs it starts (0: it
/// was not changed).
pub static ORIGINAL_NOFILE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The hard `RLIMIT_NOFILE` the daemon started with, restored for the runs it starts (0: it
/// was not changed).
pub static ORIGINAL_NOFILE_MAX: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The identity resolver as the filesystem's identity source and the scheduler's run binder.
struct Binding(Arc<Resolver>);

impl Identities for Binding {
    fn resolve(&self, pid: u32) -> crate::identity::Identity {
        self.0.resolve(pid)
    }

    fn bind(&self, pid: u32, smith: SmithIdx) -> Result<(), BindError> {
        self.0.bind(pid, smith).map_err(|e| {
            tracing::warn!("bind of {pid}: {e}");
            BindError::from(&e)
        })
    }

    fn register_smith(&self, smith: SmithIdx, full_id: &FullId) {
        if let Err(e) = self.0.register_smith(smith, full_id) {
            tracing::error!("cannot register {full_id}: {e}");
        }
    }

    fn unregister_smith(&self, smith: SmithIdx) {
        self.0.unregister_smith(smith);
    }

    fn mode_name(&self) -> &'static str {
        self.0.mode().as_str()
    }
}

impl RunBinder for Binding {
    fn cgroup_dir(&self, to: BindTo) -> Option<OwnedFd> {
        match to {
            BindTo::Smith(smith) => self.0.smith_cgroup(smith)?.dir.try_clone().ok(),
            BindTo::Operator => self.0.operator_cgroup_fd()?.try_clone_to_owned().ok(),
        }
    }

    fn bind_pid(&self, pid: u32, smith: SmithIdx) -> std::io::Result<()> {
        self.0.bind(pid, smith).map_err(std::io::Error::other)
    }

    fn bind_operator_pid(&self, pid: u32) -> std::io::Result<()> {
        self.0.bind_operator(pid).map_err(std::io::Error::other)
    }

    fn needs_placing(&self, to: BindTo) -> bool {
        matches!(to, BindTo::Smith(_)) && self.0.needs_placing()
    }

    fn place_pid(&self, pid: u32, smith: SmithIdx) -> std::io::Result<()> {
        self.0.place(pid, smith).map_err(std::io::Error::other)
    }

    fn oom_kills(&self, smith: SmithIdx) -> Option<u64> {
        self.0.oom_kills(smith)
    }

    fn kill_smith(&self, smith: SmithIdx, sig: i32) {
        if let Err(e) = self.0.kill_smith(smith, sig) {
            tracing::warn!("kill of smith #{}: {e}", smith.0);
        }
    }

    fn cgroup_path(&self, smith: SmithIdx) -> Option<String> {
        self.0
            .smith_cgroup_path(smith)
            .map(|p| p.display().to_string())
    }

    fn smith_has_processes(&self, smith: SmithIdx) -> Option<bool> {
        self.0
            .smith_cgroup_path(smith)
            .map(|_| !self.0.live_pids(smith).is_empty())
    }
}

/// What the signal thread does to the daemon (docs/SPEC.md §6; docs/PROTOCOL-NOTES.md O9, O11,
/// O12).
struct Signals {
    sched: Arc<Scheduler>,
    reloader: Arc<crate::reload::Reloader>,
    /// How long stopping the runs may take.
    patience: Duration,
}

impl session::SignalActions for Signals {
    fn stop_runs(&self) {
        self.sched.pause(self.patience);
    }

    fn resume(&self) {
        self.sched.resume();
    }

    fn reload(&self) {
        // Logged and journaled by the reloader either way.
        let _ = self.reloader.reload();
    }
}

/// Point stdin/stdout/stderr at /dev/null once the daemon no longer reports to a terminal.
fn detach_stdio() {
    let devnull = OsStr::new("/dev/null");
    if let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(devnull)
    {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto the standard descriptors with a valid source descriptor.
        unsafe {
            libc::dup2(f.as_raw_fd(), 0);
            libc::dup2(f.as_raw_fd(), 1);
            libc::dup2(f.as_raw_fd(), 2);
        }
    }
}

/// The templates, with `DIR/templates/` overrides (docs/SPEC.md §1).
///
/// # Errors
/// An override that does not render (its placeholder errors, one line).
pub fn load_templates(root: BorrowedFd<'_>) -> Result<Templates> {
    let read = |name: &str| {
        backing::read_file(root, &Path::new("templates").join(name))
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
    };
    Templates::with_overrides(read).map_err(|e| anyhow!("{e}"))
}

/// The kernels that cache the tree (docs/SPEC.md §13): the daemon's own mount and, once the
/// listener runs, every remote connection. What the filesystem and the scheduler change is told
/// to all of them; what a request changes, through this mount or over a connection, its
/// dispatcher tells here, and every kernel but the one it came from is told
/// ([`crate::fuse::dispatch::Changes`], the one sink of every framing).
struct Kernels {
    local: Arc<KernelCache>,
    peers: std::sync::OnceLock<Arc<crate::remote::listener::Peers>>,
    fs: std::sync::OnceLock<std::sync::Weak<SmithFs>>,
}

impl Kernels {
    fn new(local: Arc<KernelCache>) -> Kernels {
        Kernels {
            local,
            peers: std::sync::OnceLock::new(),
            fs: std::sync::OnceLock::new(),
        }
    }

    fn push(&self, change: &crate::remote::conn::Change) {
        if let Some(p) = self.peers.get() {
            p.broadcast(None, change);
        }
    }

    fn node_of(&self, backing_ino: backing::BackingIno) -> Option<crate::fs::NodeId> {
        Some(self.fs.get()?.upgrade()?.node_id(backing_ino))
    }
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels").finish_non_exhaustive()
    }
}

/// Requests through the daemon's own mount or over a remote connection: what they changed is
/// told to this mount's kernel (unless it came from it) and queued for every connection but the
/// one it came from (never written on the serving thread: `Peers::broadcast` only queues).
impl crate::fuse::dispatch::Changes for Kernels {
    /// Lock-free, on every request: for this mount's, whether a listener runs (without one no
    /// other kernel ever caches the tree); whether a connection is served is read after the
    /// request, in `Peers::broadcast` (an atomic count: see the ordering there), so a
    /// connection counted while the request was served is told too.
    fn listening(&self, from: Origin) -> bool {
        match from {
            Origin::Local => self.peers.get().is_some(),
            // This mount's kernel is always told.
            Origin::Remote(_) => true,
        }
    }

    fn changed(&self, from: Origin, change: &crate::remote::conn::Change) {
        if from != Origin::Local {
            match change {
                crate::remote::conn::Change::Node { node, data } => {
                    self.local.node_changed(*node, *data)
                }
                crate::remote::conn::Change::Entry { parent, name } => {
                    self.local.entry_changed(*parent, OsStr::from_bytes(name))
                }
            }
        }
        if let Some(p) = self.peers.get() {
            crate::fuse::dispatch::Changes::changed(&**p, from, change);
        }
    }
}

impl crate::fs::AttrCache for Kernels {
    fn attrs_changed(&self, node: crate::fs::NodeId) {
        self.local.attrs_changed(node);
        self.push(&crate::remote::conn::Change::Node { node, data: false });
    }
}

impl crate::sched::Invalidate for Kernels {
    fn entry(&self, parent_backing_ino: backing::BackingIno, name: &OsStr) {
        self.local.entry(parent_backing_ino, name);
        if self.peers.get().is_some() {
            if let Some(parent) = self.node_of(parent_backing_ino) {
                self.push(&crate::remote::conn::Change::Node {
                    node: parent,
                    data: false,
                });
                self.push(&crate::remote::conn::Change::Entry {
                    parent,
                    name: name.as_bytes().to_vec(),
                });
            }
        }
    }

    fn inode(&self, backing_ino: backing::BackingIno) {
        self.local.inode(backing_ino);
        if self.peers.get().is_some() {
            if let Some(node) = self.node_of(backing_ino) {
                self.push(&crate::remote::conn::Change::Node { node, data: true });
            }
        }
    }
}

/// The file in `.smithfs-state/` where a running listener is described for `doctor`: its
/// address (as tickets name it) and its certificate's SHA-256, one line.
pub const LISTENER_FILE: &CStr = c"listener";

/// Start the remote mount's listener when `launcher` needs one (docs/SPEC.md §13): a new
/// certificate kept 0600 in `.smithfs-state/`, remote requests judged with the uid a local run
/// would have, changes pushed through `kernels`.
///
/// # Errors
/// The certificate could not be made or stored, or the address does not bind.
fn start_listener(
    launcher: &crate::config::LauncherConfig,
    fs: &Arc<SmithFs>,
    dir: &Path,
    agents: Option<&crate::sandbox::AgentUser>,
    state: BorrowedFd<'_>,
    kernels: &Arc<Kernels>,
) -> Result<Option<Arc<crate::remote::listener::Listener>>> {
    use crate::remote::{keys, listener, tls};
    let Some(listen) = launcher.listen_addr() else {
        return Ok(None);
    };
    let identity = tls::Identity::generate().map_err(|e| anyhow!("launcher: {e}"))?;
    identity
        .store(state)
        .map_err(|e| anyhow!("launcher: {e}"))?;
    // SAFETY: geteuid and getegid have no preconditions.
    let (me_uid, me_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (run_uid, run_gid) = agents.map_or((me_uid, me_gid), |a| (a.uid(), a.gid()));
    let _ = kernels.fs.set(Arc::downgrade(fs));
    let changes: Arc<dyn crate::fuse::dispatch::Changes> = kernels.clone();
    let l = listener::Listener::start(
        fs.clone(),
        listener::ListenerOptions {
            listen,
            advertise: launcher.advertise.clone(),
            mount_point: dir.to_path_buf(),
            run_uid,
            run_gid,
        },
        &identity,
        Some(changes),
    )
    .map_err(|e| anyhow!("{e}"))?;
    let _ = kernels.peers.set(l.peers().clone());
    let advertised = launcher
        .advertise
        .clone()
        .unwrap_or_else(|| l.addr().to_string());
    let line = format!("{advertised} {}\n", keys::hex(&identity.pin()));
    backing::write_replace(state, LISTENER_FILE, line.as_bytes(), 0o644)
        .map_err(|e| anyhow!("cannot write .smithfs-state/listener: {e}"))?;
    tracing::info!(kind = launcher.kind.as_str(), addr = %l.addr(), advertised, "remote mount listener");
    Ok(Some(Arc::new(l)))
}

/// The listener's tickets for the scheduler's launchers (docs/SPEC.md §13). Weak: the listener
/// stops at unmount whoever still holds this.
struct Tickets(std::sync::Weak<crate::remote::listener::Listener>);

impl crate::sched::RemoteRuns for Tickets {
    fn ticket(
        &self,
        run_id: &str,
        smith: SmithIdx,
        sandbox: Option<&crate::sandbox::view::Plan>,
        output: Option<OwnedFd>,
    ) -> Result<String, String> {
        let l = self.0.upgrade().ok_or("the listener has stopped")?;
        let grant = crate::remote::keys::Grant {
            ids: sandbox.map(|p| (p.uid, p.gid)),
            sandbox: sandbox
                .map(|p| serde_json::to_string(p).map_err(|e| e.to_string()))
                .transpose()?,
        };
        Ok(l.ticket_with(run_id, smith, grant, output)?.to_text())
    }

    fn revoke(&self, run_id: &str) -> Option<std::process::ExitStatus> {
        let l = self.0.upgrade()?;
        let report = l.keys().revoke(run_id, REVOKE_LINGER);
        report.map(crate::remote::oob::ExitReport::status)
    }

    fn attached(&self, run_id: &str) -> bool {
        self.0.upgrade().is_some_and(|l| l.keys().claimed(run_id))
    }
}

/// How long a run's revoke waits for its node's connection to end by itself (the node sends
/// its last output and its exit report, then closes) before it cuts it.
const REVOKE_LINGER: Duration = Duration::from_secs(5);

/// Whom hooks run as with the sandbox on (docs/SPEC.md §12, "Programs smithfs runs for others";
/// docs/PROTOCOL-NOTES.md XT20): the user who mounted with sudo (`SUDO_UID`, a root daemon
/// only) — gid `SUDO_GID`, else the account's, else the uid's number; the account's
/// supplementary groups (none without an account); `HOME`, `USER` and `LOGNAME` from the account.
/// `None` (the daemon's own user, root or not): no `SUDO_UID`, or a daemon that is not root,
/// which runs everything as itself.
fn hook_user(who: crate::sandbox::user::Invoker) -> Option<crate::sched::hooks::HookUser> {
    use nix::unistd::{Gid, Uid, User};
    let uid = who.sudo_uid.filter(|_| who.euid == 0)?;
    let account = User::from_uid(Uid::from_raw(uid)).ok().flatten();
    let gid = who
        .sudo_gid
        .or_else(|| account.as_ref().map(|a| a.gid.as_raw()))
        .unwrap_or(uid);
    let mut groups: Vec<u32> = account
        .as_ref()
        .and_then(|a| {
            let name = std::ffi::CString::new(a.name.as_bytes()).ok()?;
            nix::unistd::getgrouplist(&name, Gid::from_raw(gid)).ok()
        })
        .unwrap_or_default()
        .into_iter()
        .map(Gid::as_raw)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    let env = account
        .map(|a| {
            [
                ("HOME", a.dir.to_string_lossy().into_owned()),
                ("USER", a.name.clone()),
                ("LOGNAME", a.name),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
        })
        .unwrap_or_default();
    Some(crate::sched::hooks::HookUser {
        creds: crate::process::spawn::User { uid, gid, groups },
        env,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_log_moves_aside_when_full_and_never_holds_more_than_twice_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let state = OwnedFd::from(File::open(dir.path()).unwrap());
        let mut log = DaemonLog::open(&state).unwrap();
        log.cap = 1000;
        // The log's writer gets one event's line per write (tracing's formatter).
        let mut line = vec![b'x'; 99];
        line.push(b'\n');
        for _ in 0..35 {
            log.write_all(&line).unwrap();
        }
        let size = |n: &str| std::fs::metadata(dir.path().join(n)).map_or(0, |m| m.len());
        // 3 500 bytes: two full files moved aside (the second replacing the first), 1 500 left.
        assert!(size("daemon.log") <= 1000, "{}", size("daemon.log"));
        assert!(size("daemon.log.1") <= 1000 && size("daemon.log.1") > 0);
        assert_eq!(size("daemon.log") % 100, 0, "lines are not split");
        // A reopened log knows its size.
        let again = DaemonLog::open(&state).unwrap();
        assert_eq!(again.size, size("daemon.log"));
    }
}
