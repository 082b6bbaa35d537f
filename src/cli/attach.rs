//! `smithfs attach [--ticket-fd N] [--cwd DIR] -- COMMAND [ARG...]` (docs/SPEC.md §13): the
//! node's side of a remote run. Reads the run's ticket from an inherited descriptor (never
//! argv, never the tree: docs/PROTOCOL-NOTES.md R3), connects to the daemon's listener, mounts
//! the tree at the daemon's mount path in a mount namespace of its own (and a user namespace of
//! its own when it is not root: notes R32) ([`crate::remote::node`]), runs COMMAND there with
//! this process's environment (the launcher sets §5's variables) in the §12 sandbox whose plan
//! the daemon sent (notes R30; [`super::attach_command`]), its stdout the run's stdout and
//! stderr, and exits with COMMAND's status (128 + the signal that killed it). Without a plan, a
//! root `attach` confines COMMAND as a root daemon's local run (notes H13, R56) unless
//! `--unconfined`. A dropped
//! connection makes the mount fail closed (ENOTCONN) under the running command; `attach` says
//! so on stderr.

use std::io::Read;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use super::attach_command;
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
    /// Start a COMMAND without the sandbox unconfined: without this, a root `attach` confines it
    /// as a root daemon confines its local runs (docs/PROTOCOL-NOTES.md H13, R56). The daemon's
    /// launchers pass it exactly when `agent.confine` is false.
    #[arg(long)]
    pub unconfined: bool,
    /// The file mode creation mask COMMAND starts with, octal (the daemon's launchers pass the
    /// mounter's: docs/PROTOCOL-NOTES.md H16, R56); default: the one `attach` inherited.
    #[arg(long, value_name = "MASK", value_parser = parse_umask)]
    pub umask: Option<u32>,
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
    // COMMAND's mask (H16, R56): the daemon's word, or the one attach inherited; a sandboxed
    // COMMAND gets it through the spawn and the sandbox's init.
    let mask = args.umask.map_or_else(
        || {
            // SAFETY: umask has no preconditions (read by setting, then set back).
            unsafe {
                let old = libc::umask(0);
                libc::umask(old);
                old
            }
        },
        |m| m & 0o777,
    );
    // SAFETY: as above.
    unsafe { libc::umask(mask as libc::mode_t) };
    crate::process::spawn::set_run_umask(mask);
    // A launcher's TERM while attach connects and mounts ends nothing (R14); a sandboxed
    // COMMAND's are forwarded from below on.
    let plain_signals = attach_command::StopSignals::ignore();
    let ticket = read_ticket(args.ticket_fd)?;
    // A connection closed before its welcome did not spend the ticket (notes R50): try again.
    let attached = crate::remote::client::attach_retrying(
        &ticket,
        crate::remote::client::RETRY_WITHIN,
        |e, n| {
            if n == 1 {
                eprintln!("smithfs attach: {e}; trying again (for up to 30 s)");
            }
        },
    )?;
    let mount_point = PathBuf::from(&attached.mount_point);
    // The run's sandbox is the daemon's word alone (notes R30): never this process's argv or
    // environment, which whoever submitted the job could have shaped.
    let sandbox = attached
        .sandbox
        .as_deref()
        .map(|text| attach_command::plan_of(text, &mount_point))
        .transpose()?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        node::private_namespace().map_err(|e| anyhow!(e))?;
    } else {
        // Not root: a user namespace of attach's own (notes R32), where it is the run's uid.
        let inside = sandbox.as_ref().map(|p| (p.uid, p.gid));
        node::own_user_namespace(inside).map_err(|e| anyhow!(e))?;
    }
    // Without the sandbox, a root COMMAND is confined as a root daemon's local run is (H13, R56):
    // its own mount namespace with /sys and /proc/sys read-only and Docker's capabilities. Only
    // the daemon's `--unconfined` (agent.confine false) leaves it full root.
    let confine = if sandbox.is_none() && root && !args.unconfined {
        let c = crate::process::confine::Confinement::prepare();
        if c.is_none() {
            bail!("a root attach without CAP_SYS_ADMIN cannot confine COMMAND (agent.confine)");
        }
        c
    } else {
        None
    };
    // Before any thread starts (the forwarder's), so that every thread has them blocked.
    let signals = if sandbox.is_some() {
        attach_command::StopSignals::block()?
    } else {
        plain_signals
    };
    let (dev, init) =
        node::mount(&mount_point, true, attached.max_write).map_err(|e| anyhow!(e))?;
    tracing::debug!(?init, mount = %mount_point.display(), "attached");
    let (output, output_w) = output_pipe()?;
    let forwarder = Forwarder::new(dev, attached.channel, init)
        .and_then(|f| f.with_output(output))
        .map_err(|e| anyhow!(e))?;
    // Close-on-exec: COMMAND holds no descriptor but 0, 1 and 2 (docs/SPEC.md §5, notes S19,
    // R56); the write end in an unsandboxed agent let it stop forwarding or forge its exit report.
    let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;
    let forwarding = std::thread::Builder::new()
        .name("smithfs-forward".into())
        .spawn(move || forwarder.run(stop_r.as_fd(), RELEASE_GRACE))
        .context("cannot start forwarding")?;
    let cwd = args.cwd.unwrap_or_else(|| mount_point.clone());
    // COMMAND's stdout and stderr: the pipe whose other end the forwarder sends (R16).
    let status = attach_command::spawn(
        &args.command,
        &cwd,
        sandbox.as_ref(),
        confine,
        &signals,
        output_w,
    )
    .and_then(attach_command::Running::wait);
    kill_rest_of_group();
    match &status {
        Ok(status) => report_exit(&stop_w, *status),
        // COMMAND never ran (its sandbox or its exec failed): stop forwarding, with no report.
        Err(_) => {
            let _ = nix::unistd::write(&stop_w, b"x");
        }
    }
    let ended = forwarding
        .join()
        .map_err(|_| anyhow!("the forwarding thread panicked"))?;
    let status = status?;
    match ended {
        Ended::Stopped | Ended::Unmounted => {}
        Ended::Dropped(why) => {
            eprintln!(
                "smithfs attach: the connection to the daemon was lost ({why}): the mount failed closed"
            );
        }
    }
    Ok(ExitCode::from(attach_command::exit_code(status)))
}

/// `--umask`'s value: octal, at most 0777.
fn parse_umask(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal mask (000 to 777)"))
}

/// A pipe for COMMAND's stdout and stderr (read end, write end; both close-on-exec: the spawn
/// dups the write end onto 1 and 2): what is written there reaches the daemon as output frames
/// (docs/PROTOCOL-NOTES.md R16), so a job's output needs no file on the node.
fn output_pipe() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("cannot make the output pipe")
}

/// Hand COMMAND's end (`status`) to the forwarding thread on its stop pipe: it sends the exit
/// report last, after the output and the last closes (docs/PROTOCOL-NOTES.md R16).
fn report_exit(stop: &OwnedFd, status: std::process::ExitStatus) {
    let frame = crate::remote::oob::exit(crate::remote::oob::ExitReport::of(status));
    let _ = nix::unistd::write(stop, &frame);
}

/// What COMMAND left behind in this process's group ends with it: SIGKILL to every other member
/// (`attach` leads the group a launcher signals, so it cannot kill the group as a whole, and
/// ignores the stopping signals only). Nothing when `attach` does not lead its group (a shell's
/// pipeline, say): the group is then its caller's, and so are the leftovers.
fn kill_rest_of_group() {
    // SAFETY: getpid and getpgrp have no preconditions.
    let (me, group) = unsafe { (libc::getpid(), libc::getpgrp()) };
    if me != group {
        return;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if crate::sys::procfs::parse_stat(&stat).is_ok_and(|s| s.pgrp == group) {
            // SAFETY: kill has no memory preconditions; a process gone since gives ESRCH.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
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
