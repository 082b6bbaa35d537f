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
                    if util::mount_state(&dir) == MountState::NotMounted {
                        wait_for_daemon(&dir);
                        return Ok(ExitCode::SUCCESS);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
        let flags = if state == MountState::Dead {
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
        .find_map(|l| l.strip_prefix("daemon_pid: "))
        .and_then(|p| p.trim().parse().ok())
}

/// Wait (up to 10 s) for the daemon that served `dir` to exit, so that a new mount or a reader
/// of the store finds everything settled.
fn wait_for_daemon(dir: &std::path::Path) {
    let pidfile = dir.join(STATE_DIR).join("daemon.pid");
    let Ok(pid) = std::fs::read_to_string(&pidfile) else {
        return;
    };
    let Ok(pid) = pid.trim().parse::<i32>() else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        // SAFETY: signal 0 only checks for existence.
        if unsafe { libc::kill(pid, 0) } != 0 {
            return;
        }
        if !pidfile.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
