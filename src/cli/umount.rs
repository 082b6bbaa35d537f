//! `smithfs umount DIR`: stop the live runs and unmount, then wait for the daemon to finish
//! (PROTOCOL.md §6: "`umount` with live runs stops them the same way").
//!
//! A live mount is asked to go by signalling its daemon (its pid is in `.smithfs/whoami`): the
//! daemon stops its runs — their working directories are inside the mount, so a plain unmount
//! would be refused as busy — and unmounts itself. A dead mount is detached.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;

use super::util::{self, MountState};
use crate::fs::STATE_DIR;
use crate::fuse::session::kernel_unmount;

/// Arguments of `smithfs umount`.
#[derive(Debug, Args)]
pub struct UmountArgs {
    /// The mounted directory.
    pub dir: PathBuf,
}

/// Run `smithfs umount`.
pub fn run(args: UmountArgs) -> Result<ExitCode> {
    let dir = util::absolute(&args.dir)?;
    match util::mount_state(&dir) {
        MountState::NotMounted => bail!("{} is not mounted", dir.display()),
        MountState::Other(t) => bail!("{} is a {t} mount, not smithfs", dir.display()),
        MountState::Dead => {
            kernel_unmount(&dir, true)?;
        }
        MountState::Live => {
            // Nothing inside (no live run holds it): the plain unmount; the daemon then stops.
            // Busy (runs have their working directories inside): the daemon stops its runs
            // first and unmounts itself.
            if let Err(busy) = kernel_unmount(&dir, false) {
                stop_daemon(&dir).map_err(|()| busy)?;
            }
        }
    }
    wait_for_daemon(&dir);
    Ok(ExitCode::SUCCESS)
}

/// Ask the daemon of the live mount `dir` to stop its runs and unmount (SIGTERM), and wait for
/// the mount to go. Err when it is still mounted after the runs' grace time (something else
/// keeps it busy).
fn stop_daemon(dir: &std::path::Path) -> Result<(), ()> {
    let pid = daemon_pid(dir).ok_or(())?;
    // SAFETY: sending SIGTERM to the daemon of this mount.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        return Err(());
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match util::mount_state(dir) {
            MountState::NotMounted => return Ok(()),
            // The daemon died instead: detach what it left.
            MountState::Dead => return kernel_unmount(dir, true).map_err(drop),
            MountState::Live | MountState::Other(_) => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(())
}

/// The pid of the daemon serving the live mount `dir`, from `.smithfs/whoami`.
fn daemon_pid(dir: &std::path::Path) -> Option<i32> {
    let text = std::fs::read_to_string(dir.join(".smithfs/whoami")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("daemon pid: "))
        .and_then(|p| p.trim().parse().ok())
}

/// Wait (up to 10 s) for the daemon that served `dir` to let go of the store: its lock on
/// `.smithfs-state/daemon.lock` is released only when it is done, so a following `mount` or a
/// reader of the store finds everything settled.
fn wait_for_daemon(dir: &std::path::Path) {
    let lock = dir.join(STATE_DIR).join("daemon.lock");
    let _ = crate::daemon::wait_for_lock(&lock, Duration::from_secs(10));
}
