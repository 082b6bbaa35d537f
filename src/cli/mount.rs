//! `smithfs mount DIR`: mount DIR over itself and serve it (docs/SPEC.md §6, §9).
//!
//! Without `-f`, the process forks before any thread exists; the child mounts and serves, and
//! the parent waits on a pipe until the mount is live (exit 0) or has failed (the child's
//! one-line reason, exit 1). The daemon itself is composed in `crate::daemon`.

use std::fs::File;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};
use clap::Args;

use super::util::{self, MountState};
use crate::config::{IdentityMode, OperatorMode};
use crate::daemon::DaemonOptions;
use crate::fuse::session::SessionOptions;
use crate::fuse::transport::Transport;
use crate::tree::layout::STATE_DIR;

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
    #[arg(long, value_enum)]
    pub operator: Option<OperatorMode>,
    /// How smith identity is known.
    #[arg(long, value_enum)]
    pub identity: Option<IdentityMode>,
    /// Re-queue runs interrupted by a dead daemon.
    #[arg(long)]
    pub resume: bool,
    /// Let other users (not only the mounting one) use the mount.
    #[arg(long)]
    pub allow_other: bool,
    /// Do not use FUSE passthrough for regular files.
    #[arg(long)]
    pub no_passthrough: bool,
    /// How FUSE requests reach the daemon: io_uring when the kernel offers it (auto: while
    /// /sys/module/fuse/parameters/enable_uring is on), io-uring (or fail), or dev-fuse
    /// [default: auto].
    #[arg(long, value_enum)]
    pub transport: Option<Transport>,
    /// Log level (tracing filter syntax); default from RUST_LOG, else "info".
    #[arg(long, value_name = "L")]
    pub log_level: Option<String>,
    /// Clear a dead mount left at DIR by a killed daemon before mounting.
    #[arg(long)]
    pub force: bool,
    /// Mount options as fstab writes them, comma-separated, repeatable: allow_other,
    /// identity=, operator=, transport=, resume, no_passthrough; defaults, nofail, noauto,
    /// _netdev, x-systemd.* are ignored; anything else is refused.
    #[arg(short = 'o', value_name = "OPT[,OPT…]", action = clap::ArgAction::Append)]
    pub options: Vec<String>,
}

impl MountArgs {
    /// Fold `-o` into the flags (docs/SPEC.md §6, docs/PROTOCOL-NOTES.md O40): a boolean option
    /// sets its flag; a valued one fills its flag, or must agree with it.
    ///
    /// # Errors
    /// A usage error (exit 2): an option refused by name, or a flag and an option that disagree.
    pub fn apply_options(&mut self) -> Result<()> {
        use super::mount_opts::{merge, parse};
        let o = parse(&self.options)?;
        self.allow_other |= o.allow_other;
        self.resume |= o.resume;
        self.no_passthrough |= o.no_passthrough;
        self.identity = merge("identity", self.identity, o.identity)?;
        self.operator = merge("operator", self.operator, o.operator)?;
        self.transport = merge("transport", self.transport, o.transport)?;
        self.options.clear();
        Ok(())
    }

    /// What the daemon is asked to do.
    fn daemon_options(&self) -> DaemonOptions {
        DaemonOptions {
            config: self.config.clone(),
            operator: self.operator,
            identity: self.identity,
            resume: self.resume,
            session: SessionOptions {
                allow_other: self.allow_other,
                passthrough: !self.no_passthrough,
                transport: self.transport.unwrap_or_default(),
                default_permissions: true,
            },
            log_level: self.log_level.clone(),
        }
    }
}

/// Run `smithfs mount`.
pub fn run(mut args: MountArgs) -> Result<ExitCode> {
    args.apply_options()?;
    let dir = util::absolute(&args.dir)?;
    preflight(&dir, args.force)?;
    warn_about_users(&dir);
    warn_about_ancestors(&dir);
    if args.foreground {
        crate::daemon::init_logging(args.log_level.as_deref(), None);
        crate::daemon::serve(&dir, &args.daemon_options(), None)?;
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
    // docs/SPEC.md §6: only a directory `init` made (it has the root smith's dir).
    if !dir
        .join("smiths")
        .join(crate::tree::scaffold_plan::ROOT_ID)
        .is_dir()
    {
        bail!(
            "{} was not made by `smithfs init` (no smiths/smith-root/): run `smithfs init {}` first",
            dir.display(),
            dir.display()
        );
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
            if crate::fuse::mount::fusermount().is_none() {
                bail!("/dev/fuse is not accessible to this user and fusermount3 is not installed (apt-get install fuse3)")
            }
        }
        Err(e) => bail!("/dev/fuse: {e}"),
    }
    Ok(())
}

/// Warn when a tree with workspaces lies below a directory other users cannot search (a 0700
/// `/root`, a 0750 home, a `mktemp -d`): with the sandbox, the scaffold's git runs as the
/// smiths' uids on the store, and git's ownership check walks the repository's path from `/`,
/// so every child's workspace would fail with EIO (docs/PROTOCOL-NOTES.md W19).
fn warn_about_ancestors(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !dir.join(crate::workspace::PROJECT_GIT).exists() {
        return;
    }
    let sandboxed = std::fs::read(dir.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .map_or(true, |c| c["sandbox"]["enabled"].as_bool() != Some(false));
    if !sandboxed {
        return;
    }
    if let Some((a, mode)) = dir.ancestors().skip(1).find_map(|a| {
        let mode = std::fs::metadata(a).ok()?.permissions().mode() & 0o7777;
        (mode & 0o001 == 0).then(|| (a.to_path_buf(), mode))
    }) {
        eprintln!(
            "smithfs: warning: {} (mode {mode:04o}) is not searchable by other users: the smiths' git cannot reach {}'s repository there, and every child's workspace will fail (EIO); `chmod o+x {}` or keep the tree elsewhere",
            a.display(),
            dir.display(),
            a.display()
        );
    }
}

/// Warn about processes whose working directory or open files are inside `dir`: after the
/// mount they still see the backing store, unchecked (docs/SPEC.md §10).
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
            let code = match crate::daemon::serve(dir, &args.daemon_options(), Some(&mut report)) {
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
