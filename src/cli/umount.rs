//! `smithfs umount DIR`: stop the live runs and unmount, then wait for the daemon to finish
//! (PROTOCOL.md §6: "`umount` with live runs stops them the same way").
//!
//! A live mount is asked to go by signalling its daemon (its pid is in `.smithfs/whoami`): the
//! daemon stops its runs — their working directories are inside the mount, so a plain unmount
//! would be refused as busy — and unmounts itself. A dead mount is detached.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;

use super::util::{self, MountState};
use crate::fs::STATE_DIR;

/// Arguments of `smithfs umount`.
#[derive(Debug, Args)]
pub struct UmountArgs {
    /// The mounted directory.
    pub dir: PathBuf,
}

/// Run `smithfs umount`.
pub fn run(args: UmountArgs) -> Result<ExitCode> {
    let dir = util::absolute(&args.dir)?;
    let state = util::mount_state(&dir);
    match state {
        MountState::NotMounted => bail!("{} is not mounted", dir.display()),
        MountState::Other(t) => bail!("{} is a {t} mount, not smithfs", dir.display()),
        MountState::Live | MountState::Dead => {}
    }
    if state == MountState::Live {
        if let Some(pid) = daemon_pid(&dir) {
            // SAFETY: sending SIGTERM to the daemon of this mount.
            if unsafe { libc::kill(pid, libc::SIGTERM) } == 0 {
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline {
                    match util::mount_state(&dir) {
                        MountState::NotMounted => {
                            wait_for_daemon(&dir);
                            return Ok(ExitCode::SUCCESS);
                        }
                        // The daemon died instead: detach below.
                        MountState::Dead => break,
                        MountState::Live | MountState::Other(_) => {}
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
        let flags = if util::mount_state(&dir) == MountState::Dead {
            libc::MNT_DETACH
        } else {
            0
        };
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
    } else {
        let status = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&dir)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(_) => bail!("fusermount3 -u {} failed", dir.display()),
            Err(e) => bail!("cannot run fusermount3: {e}"),
        }
    }
    wait_for_daemon(&dir);
    Ok(ExitCode::SUCCESS)
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
    let _ = crate::cli::mount::wait_for_lock(&lock, Duration::from_secs(10));
}
