//! `smithfs mount DIR`: mount DIR over itself and serve it (PROTOCOL.md §6, §9).
//!
//! Without `-f`, the process forks before any thread exists; the child mounts and serves, and
//! the parent waits on a pipe until the mount is live (exit 0) or has failed (the child's
//! one-line reason, exit 1).

use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use fuser::{MountOption, Session, SessionACL};

use crate::config::Config;

use super::util::{self, MountState};
use crate::fs::{backing, FsOptions, SmithFs, STATE_DIR};
use crate::fs::{BindError, Identities};
use crate::fuse::FuseFs;
use crate::identity::resolve::{IdentityError, Resolver};
use crate::sched::runner::BindTo;
use crate::sched::{Invalidate, RunBinder, SchedCtx, Scheduler};
use crate::tree::model::SmithIdx;

/// Arguments of `smithfs mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// The directory to mount over itself.
    pub dir: PathBuf,
    /// Stay in the foreground: this process is the FUSE server.
    #[arg(short, long)]
    pub foreground: bool,
    /// Read the configuration from this file instead of DIR/config.json.
    #[arg(long, value_name = "F")]
    pub config: Option<PathBuf>,
    /// Operator access mode.
    #[arg(long, value_parser = ["read-write", "read-only"])]
    pub operator: Option<String>,
    /// How smith identity is known.
    #[arg(long, value_parser = ["auto", "cgroup", "ancestry"])]
    pub identity: Option<String>,
    /// Re-queue runs interrupted by a dead daemon.
    #[arg(long)]
    pub resume: bool,
    /// Let other users (not only the mounting one) use the mount.
    #[arg(long)]
    pub allow_other: bool,
    /// Do not use FUSE passthrough for regular files.
    #[arg(long)]
    pub no_passthrough: bool,
    /// Log level (tracing filter syntax); default from RUST_LOG, else "info".
    #[arg(long, value_name = "L")]
    pub log_level: Option<String>,
    /// Clear a dead mount left at DIR by a killed daemon before mounting.
    #[arg(long)]
    pub force: bool,
}

/// Run `smithfs mount`.
pub fn run(args: MountArgs) -> Result<ExitCode> {
    let dir = util::absolute(&args.dir)?;
    preflight(&dir, args.force)?;
    warn_about_users(&dir);
    if args.foreground {
        init_logging(&args, None);
        serve(&dir, &args, None)?;
        return Ok(ExitCode::SUCCESS);
    }
    daemonize(&dir, &args)
}

/// Refuse what cannot be mounted, each with one clear reason.
fn preflight(dir: &Path, force: bool) -> Result<()> {
    match util::mount_state(dir) {
        MountState::NotMounted => {}
        MountState::Live => bail!(
            "{} is already mounted by smithfs; unmount it first with `smithfs umount {}`",
            dir.display(),
            dir.display()
        ),
        MountState::Dead if force => {
            let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
            // SAFETY: NUL-terminated path.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                bail!(
                    "cannot clear the dead mount at {}: {}",
                    dir.display(),
                    std::io::Error::last_os_error()
                );
            }
        }
        MountState::Dead => bail!(
            "{} holds a dead smithfs mount (its daemon is gone); clear it with `smithfs umount {}` or mount with --force",
            dir.display(),
            dir.display()
        ),
        MountState::Other(t) => bail!("{} already has a {t} filesystem mounted on it", dir.display()),
    }
    let meta = std::fs::metadata(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("/dev/fuse does not exist: load the fuse kernel module (modprobe fuse)")
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            // The unprivileged path goes through the setuid fusermount3.
            if which("fusermount3").is_none() {
                bail!("/dev/fuse is not accessible to this user and fusermount3 is not installed (apt-get install fuse3)")
            }
        }
        Err(e) => bail!("/dev/fuse: {e}"),
    }
    Ok(())
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(prog))
            .find(|c| c.is_file())
    })
}

/// Warn about processes whose working directory or open files are inside `dir`: after the
/// mount they still see the backing store, unchecked (PROTOCOL.md §10).
fn warn_about_users(dir: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let me = std::process::id().to_string();
    // An exiting smithfs daemon of this directory still holds store descriptors for a moment:
    // it is not a user to warn about.
    let own_exe = std::fs::read_link("/proc/self/exe").ok();
    let inside = |p: &Path| p == dir || p.starts_with(dir);
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if pid == me || std::fs::read_link(p.path().join("exe")).ok() == own_exe {
            continue;
        }
        let mut hit = std::fs::read_link(p.path().join("cwd"))
            .map(|c| inside(&c))
            .unwrap_or(false);
        if !hit {
            if let Ok(fds) = std::fs::read_dir(p.path().join("fd")) {
                hit = fds
                    .flatten()
                    .filter_map(|f| std::fs::read_link(f.path()).ok())
                    .any(|t| inside(&t));
            }
        }
        if hit {
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            eprintln!(
                "smithfs: warning: process {pid} ({}) has its working directory or open files inside {}; it will keep seeing the backing store, not the mount",
                comm.trim(),
                dir.display()
            );
        }
    }
}

fn init_logging(args: &MountArgs, file: Option<File>) {
    use tracing_subscriber::EnvFilter;
    let filter = match &args.log_level {
        Some(l) => EnvFilter::new(l),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match file {
        Some(f) => builder
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(f))
            .try_init(),
        None => builder.with_writer(std::io::stderr).try_init(),
    };
}

/// Fork: the child serves, the parent reports the outcome of the mount.
fn daemonize(dir: &Path, args: &MountArgs) -> Result<ExitCode> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: no other thread exists yet in this process (fork is called before any is spawned).
    match unsafe { libc::fork() } {
        -1 => bail!("fork: {}", std::io::Error::last_os_error()),
        0 => {
            drop(rd);
            let mut report = File::from(wr);
            // SAFETY: setsid has no preconditions; it detaches from the terminal's session.
            unsafe { libc::setsid() };
            let code = match serve(dir, args, Some(&mut report)) {
                Ok(()) => 0,
                Err(e) => {
                    let _ = writeln!(report, "{e:#}");
                    tracing::error!("{e:#}");
                    1
                }
            };
            std::process::exit(code);
        }
        _child => {
            drop(wr);
            // The daemon keeps its end open while it serves: read one line, not to EOF.
            let mut msg = String::new();
            let _ =
                std::io::BufRead::read_line(&mut std::io::BufReader::new(File::from(rd)), &mut msg);
            let msg = msg.trim();
            if msg == "ready" {
                Ok(ExitCode::SUCCESS)
            } else if msg.is_empty() {
                bail!(
                    "the daemon exited before the mount was live (see {}/{STATE_DIR}/daemon.log)",
                    dir.display()
                )
            } else {
                bail!("{}", msg.trim_start_matches("ready").trim())
            }
        }
    }
}

/// Mount `dir` over itself and serve requests until it is unmounted. `report` (daemon mode)
/// receives "ready" once the mount is live; stdio is then detached.
fn serve(dir: &Path, args: &MountArgs, mut report: Option<&mut File>) -> Result<()> {
    // SAFETY: umask and prctl have no memory-safety preconditions. A zero umask lets created
    // modes be exactly what the caller asked (the kernel already applied the caller's umask);
    // a non-dumpable daemon keeps same-uid processes out of its descriptors (PROTOCOL.md §10).
    unsafe {
        libc::umask(0);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    // Before any thread exists, so that every thread inherits the mask and only the signal
    // thread ever takes SIGTERM/SIGINT/SIGHUP.
    let signals = block_signals()?;
    let nofile = raise_nofile();
    let root =
        backing::open_store_root(dir).map_err(|e| anyhow!("cannot open {}: {e}", dir.display()))?;
    let sched_root =
        backing::open_store_root(dir).map_err(|e| anyhow!("cannot open {}: {e}", dir.display()))?;
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
        let log = backing::open_file(
            state.as_fd(),
            c"daemon.log",
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            0o600,
        )
        .map_err(|e| anyhow!("cannot open the daemon log: {e}"))?;
        init_logging(args, Some(File::from(log)));
    }
    let config = load_config(dir, root.as_fd(), args)?;
    let templates = super::init::load_templates(root.as_fd())?;
    let fds = crate::fs::budget::plan(nofile, config.limits.max_open_files_per_smith);
    if fds.per_smith > fds.handles {
        tracing::warn!(
            per_smith = fds.per_smith,
            handles = fds.handles,
            "limits.max_open_files_per_smith is above the mount's share of descriptors for open files: one smith can use all of it"
        );
    }
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
    journal_clamped(state.as_fd(), &clamped);
    resolver.set_cache_capacity(fds.identity_cache);
    reap_previous_daemon(state.as_fd(), resolver.cgroup_parent());
    let binding = Arc::new(Binding(resolver.clone()));
    {
        // Descriptors track live processes: the resolver drops what it holds for exited ones
        // (and removes emptied cgroups of removed smiths) once a second.
        let weak = Arc::downgrade(&resolver);
        crate::sched::reaper::every_second(move || {
            if let Some(r) = weak.upgrade() {
                r.housekeep();
            }
        });
    }
    // The resolver made the daemon a subreaper: orphans of runs land here and are reaped.
    crate::sched::reaper::start();
    tracing::info!(mode = resolver.mode().as_str(), "identity resolution");
    let fs = Arc::new(
        SmithFs::new(
            root,
            FsOptions {
                mount_point: dir.to_path_buf(),
                operator: config.operator,
                limits: config.limits,
                templates,
                max_fds: std::env::var("SMITHFS_MAX_FDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(fds.inode_cache),
                max_open_per_smith: fds.per_smith,
                max_open_total: fds.handles,
            },
            binding.clone(),
        )
        .map_err(|e| anyhow!("cannot read {}: {e}", dir.display()))?,
    );
    let mut options = vec![
        MountOption::FSName("smithfs".into()),
        MountOption::Subtype("smithfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::RW,
    ];
    if !args.allow_other {
        options.push(MountOption::NoSuid);
    }
    let mut session_config = fuser::Config::default();
    session_config.mount_options = options;
    session_config.acl = if args.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    session_config.n_threads = Some(worker_threads());
    session_config.clone_fd = true;
    let mut session = Session::new(
        FuseFs::new(fs.clone(), !args.no_passthrough && is_root()),
        dir,
        &session_config,
    )
    .map_err(|e| anyhow!("cannot mount {}: {e}", dir.display()))?;
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
        "mounted"
    );
    let sched = Arc::new(
        Scheduler::start(
            SchedCtx {
                root: sched_root,
                mount: dir.to_path_buf(),
                config,
                registry: fs.registry().clone(),
                binder: binding.clone(),
                invalidate: Arc::new(KernelInvalidate {
                    notifier: session.notifier(),
                    fs: fs.clone(),
                }),
                original_nofile: (
                    ORIGINAL_NOFILE.load(std::sync::atomic::Ordering::Relaxed),
                    ORIGINAL_NOFILE_MAX.load(std::sync::atomic::Ordering::Relaxed),
                ),
            },
            args.resume,
        )
        .context("cannot start the scheduler")?,
    );
    {
        let s = sched.clone();
        fs.set_event_sink(Box::new(move |e| s.fs_event(e)));
        let s = sched.clone();
        fs.set_status_source(Box::new(move || s.status_string()));
        let s = sched.clone();
        fs.set_liveness(Box::new(move |i| s.subtree_live(i)));
        // Attributes only (negative offset): takes no inode lock, safe from a FUSE thread.
        let notifier = session.notifier();
        fs.set_attr_invalidator(Box::new(move |node| {
            let _ = notifier.inval_inode(fuser::INodeNo(node), -1, 0);
        }));
    }
    let unmounter = session.unmount_callable();
    spawn_signal_thread(dir.to_path_buf(), signals, unmounter, sched.clone())?;
    if let Some(r) = report.take() {
        r.write_all(b"ready\n")?;
        detach_stdio();
    }
    let served = session.run().context("FUSE session failed");
    sched.shutdown();
    if let Err(e) = resolver.shutdown(false) {
        tracing::warn!("identity clean-up: {e}");
    }
    served?;
    drop(lock);
    let _ = backing::unlink(state.as_fd(), c"daemon.pid", false);
    tracing::info!(dir = %dir.display(), "unmounted");
    Ok(())
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

/// The mount's configuration: `--config F` or `DIR/config.json` (absent: defaults), with
/// `--operator` and `--identity` overriding it. A malformed file is refused with the key's path
/// (PROTOCOL.md §8).
pub fn load_config(
    dir: &Path,
    root: std::os::fd::BorrowedFd<'_>,
    args: &MountArgs,
) -> Result<Config> {
    let text = match &args.config {
        Some(f) => Some(
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        ),
        None => match backing::read_file(root, Path::new("config.json")) {
            Ok(b) => Some(
                String::from_utf8(b)
                    .map_err(|_| anyhow!("{}/config.json is not UTF-8", dir.display()))?,
            ),
            Err(nix::errno::Errno::ENOENT) => None,
            Err(e) => bail!("cannot read {}/config.json: {e}", dir.display()),
        },
    };
    let mut config = match text {
        Some(t) => Config::parse(&t).map_err(|e| anyhow!("{e}"))?,
        None => Config::default(),
    };
    if let Some(op) = &args.operator {
        config.operator = op.parse().map_err(|e| anyhow!("--operator: {e}"))?;
    }
    if let Some(id) = &args.identity {
        config.identity = id.parse().map_err(|e| anyhow!("--identity: {e}"))?;
    }
    Ok(config)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn worker_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cpus * 2).clamp(4, 16)
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
fn journal_clamped(state: BorrowedFd<'_>, clamped: &[&str]) {
    if clamped.is_empty() {
        return;
    }
    let journal = crate::sched::Journal::open(state);
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
/// cgroup for its successor (PROTOCOL.md §6, §9).
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
            let errno = match e {
                IdentityError::NoSuchProcess(_) => nix::errno::Errno::ESRCH,
                IdentityError::UnknownSmith(_) => nix::errno::Errno::ENOENT,
                IdentityError::AlreadyBound { .. } => nix::errno::Errno::EBUSY,
                IdentityError::NoCgroup(_)
                | IdentityError::Limits(_)
                | IdentityError::PidfdUnsupported(_)
                | IdentityError::Conflict { .. }
                | IdentityError::BadFullId(_)
                | IdentityError::Io { .. } => nix::errno::Errno::EIO,
            };
            BindError {
                errno,
                reason: e.to_string(),
            }
        })
    }

    fn register_smith(&self, smith: SmithIdx, full_id: &str) {
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
        self.0
            .bind(pid, smith)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    fn bind_operator_pid(&self, pid: u32) -> std::io::Result<()> {
        self.0
            .bind_operator(pid)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    fn needs_placing(&self, to: BindTo) -> bool {
        matches!(to, BindTo::Smith(_)) && self.0.needs_placing()
    }

    fn place_pid(&self, pid: u32, smith: SmithIdx) -> std::io::Result<()> {
        self.0
            .place(pid, smith)
            .map_err(|e| std::io::Error::other(e.to_string()))
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

/// Kernel cache invalidation for the daemon's own writes, sent from the scheduler's thread
/// (never from a FUSE thread: the kernel may wait on us).
struct KernelInvalidate {
    notifier: fuser::Notifier,
    fs: Arc<SmithFs>,
}

impl Invalidate for KernelInvalidate {
    fn entry(&self, parent_backing_ino: u64, name: &std::ffi::OsStr) {
        let parent = fuser::INodeNo(self.fs.node_id(parent_backing_ino));
        if let Err(e) = self.notifier.inval_entry(parent, name) {
            tracing::debug!("inval_entry: {e}");
        }
    }

    fn inode(&self, backing_ino: u64) {
        let ino = fuser::INodeNo(self.fs.node_id(backing_ino));
        if let Err(e) = self.notifier.inval_inode(ino, 0, 0) {
            tracing::debug!("inval_inode: {e}");
        }
    }
}

/// Block SIGTERM/SIGINT/SIGHUP in this thread (and every thread it starts afterwards).
fn block_signals() -> Result<nix::sys::signal::SigSet> {
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

/// Wait for one of the blocked signals; when one arrives, stop the runs (journaled
/// `run.interrupted`), then unmount cleanly.
fn spawn_signal_thread(
    dir: PathBuf,
    set: nix::sys::signal::SigSet,
    mut unmounter: fuser::SessionUnmounter,
    sched: Arc<Scheduler>,
) -> Result<()> {
    std::thread::Builder::new()
        .name("smithfs-signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                tracing::info!(?sig, "signal received: stopping runs and unmounting");
                sched.shutdown();
                if let Err(e) = unmounter.unmount() {
                    // A process that just left the mount may still be exiting: retry a busy
                    // unmount for a moment before giving up.
                    let retried = (0..30).any(|_| {
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        super::umount::kernel_unmount(&dir, false).is_ok()
                    });
                    if !retried {
                        tracing::error!("unmount failed: {e}");
                    }
                }
            }
        })
        .context("cannot start the signal thread")?;
    Ok(())
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
