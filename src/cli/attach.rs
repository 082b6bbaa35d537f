//! `smithfs attach [--ticket-fd N] [--cwd DIR] -- COMMAND [ARG...]` (docs/SPEC.md §13): the
//! node's side of a remote run. Reads the run's ticket from an inherited descriptor (never
//! argv, never the tree: docs/PROTOCOL-NOTES.md R3), connects to the daemon's listener, mounts
//! the tree at the daemon's mount path in a mount namespace of its own
//! ([`crate::remote::node`]), runs COMMAND there with this process's environment (the
//! launcher sets §5's variables) and its stdout and stderr, and exits with COMMAND's status
//! (128 + the signal that killed it). A dropped connection makes the mount fail closed
//! (ENOTCONN) under the running command; `attach` says so on stderr and exits 1 unless the
//! command already ended. Root only for now (docs/PROTOCOL-NOTES.md R11).

use std::io::Read;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::remote::keys::Ticket;
use crate::remote::node::{self, Ended, Forwarder};

/// Time the run's processes have, once COMMAND ended, for the kernel to release their files
/// (each RELEASE reaches the daemon, so what they wrote completes as locally).
const RELEASE_GRACE: Duration = Duration::from_secs(10);

/// Arguments of `smithfs attach`.
#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// The inherited descriptor the run's ticket is read from (one line).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub ticket_fd: RawFd,
    /// Where COMMAND starts (beneath the mount; default: the mount point).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// The run's command.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Run `smithfs attach`.
///
/// # Errors
/// No ticket on the descriptor, the daemon unreachable or refusing, the mount failed, or
/// COMMAND did not start.
pub fn run(args: AttachArgs) -> Result<ExitCode> {
    // A write to a connection the daemon cut is an error to report, not a death (the
    // command's own SIGPIPE disposition is reset to the default by the spawn).
    // SAFETY: setting a signal disposition; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let ticket = read_ticket(args.ticket_fd)?;
    let attached = crate::remote::client::attach(&ticket)?;
    let mount_point = PathBuf::from(&attached.mount_point);
    node::private_namespace().map_err(|e| anyhow!(e))?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let (dev, init) =
        node::mount(&mount_point, root, attached.max_write).map_err(|e| anyhow!(e))?;
    tracing::debug!(?init, mount = %mount_point.display(), "attached");
    let forwarder = Forwarder::new(dev, attached.channel, init).map_err(|e| anyhow!(e))?;
    let (stop_r, stop_w) = nix::unistd::pipe().context("pipe")?;
    let forwarding = std::thread::Builder::new()
        .name("smithfs-forward".into())
        .spawn(move || forwarder.run(stop_r.as_fd(), RELEASE_GRACE))
        .context("cannot start forwarding")?;
    let cwd = args.cwd.unwrap_or_else(|| mount_point.clone());
    let mut child = std::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .current_dir(&cwd)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start `{}` in {}", args.command[0], cwd.display()))?;
    let pgid = child.id() as i32;
    let status = child.wait().context("waiting for the command")?;
    // What the command left behind in its group ends with it.
    // SAFETY: kill has no memory preconditions; a group that is gone gives ESRCH.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = nix::unistd::write(&stop_w, b"x");
    let ended = forwarding
        .join()
        .map_err(|_| anyhow!("the forwarding thread panicked"))?;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    match ended {
        Ended::Stopped | Ended::Unmounted => {}
        Ended::Dropped(why) => {
            eprintln!(
                "smithfs attach: the connection to the daemon was lost ({why}): the mount failed closed"
            );
        }
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The ticket on descriptor `fd`, which is closed after.
fn read_ticket(fd: RawFd) -> Result<Ticket> {
    if fd < 0 || nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_err() {
        bail!(
            "no ticket: descriptor {fd} is not open (the launcher passes the run's ticket on it)"
        );
    }
    // SAFETY: `fd` is open (checked above) and nothing else in this process owns it: it was
    // inherited for this purpose.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut text = String::new();
    std::fs::File::from(owned)
        .take(4096)
        .read_to_string(&mut text)
        .with_context(|| format!("reading the ticket from descriptor {fd}"))?;
    Ticket::parse(&text).map_err(|e| anyhow!("descriptor {fd}: {e}"))
}
