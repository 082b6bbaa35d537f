//! `smithfs umount DIR`: stop the live runs and unmount, then wait for the daemon to finish
//! (docs/SPEC.md §6: "`umount` with live runs stops them the same way").
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
use super::whoami;
use crate::fuse::session::kernel_unmount;
use crate::sys::procfs;
use crate::tree::layout::STATE_DIR;

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
            refuse_smith(&dir)?;
            // The daemon stops its runs first and unmounts itself: a plain unmount would
            // succeed while runs live on in their own mount namespaces, each with a copy of
            // the mount (docs/PROTOCOL-NOTES.md H13). Without a daemon pid, the plain unmount.
            let daemon = daemon_pid(&dir);
            let stopped = match daemon {
                Some(_) => stop_daemon(&dir),
                None => kernel_unmount(&dir, false).map_err(drop),
            };
            if stopped.is_err() {
                let daemon = daemon.map_or(0, |p| p as u32);
                // The daemon's own runs are being stopped (TERM, KILL after the grace): they
                // are not what the operator must deal with, so only the others are named.
                let mut held = procfs::mount_holders(&dir, &[daemon, std::process::id()]);
                let all = held.len();
                held.retain(|h| !descends_from(h.pid, daemon));
                if held.is_empty() && all > 0 {
                    bail!(
                        "cannot unmount {}: busy; only its own runs hold it, and they are still stopping (agent.kill_grace_secs); try again",
                        dir.display()
                    );
                }
                bail!(
                    "cannot unmount {}: busy; held by {}",
                    dir.display(),
                    procfs::describe_holders(&held)
                );
            }
        }
    }
    wait_for_daemon(&dir);
    Ok(ExitCode::SUCCESS)
}

/// Refuse a caller the mount resolves as a smith: unmounting stops every run, which is the
/// operator's to decide, like `smithfs run` (docs/SPEC.md §6; docs/PROTOCOL-NOTES.md O47). A smith
/// running as the daemon's uid can still signal the daemon itself (§10): this stops the agent that
/// "cleans up" with `smithfs umount`, not an attacker.
fn refuse_smith(dir: &std::path::Path) -> Result<()> {
    let whoami = std::fs::read_to_string(dir.join(".smithfs/whoami")).unwrap_or_default();
    if whoami::lookup(&whoami, "identity").as_deref() == Some("smith") {
        let full_id = whoami::lookup(&whoami, "full id").unwrap_or_else(|| "a smith".into());
        bail!(
            "umount refused: this process is {full_id}; only the operator unmounts {}",
            dir.display()
        );
    }
    Ok(())
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
    let began = Instant::now();
    let deadline = began + Duration::from_secs(20);
    while Instant::now() < deadline {
        // Once the daemon has had time to stop its runs and retry (3 s), a mount held only by
        // processes that are not the daemon's will not go: say so now, not after 20 s.
        if began.elapsed() > Duration::from_secs(4) {
            let held = procfs::mount_holders(dir, &[pid as u32, std::process::id()]);
            if !held.is_empty() && held.iter().all(|h| !descends_from(h.pid, pid as u32)) {
                return Err(());
            }
        }
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

/// Is `pid` a descendant of `ancestor` (by the parent pids in `/proc/PID/stat`)?
fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        let Some(ppid) = std::fs::read(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|b| procfs::parse_stat(&b).ok())
            .map(|st| st.ppid.max(0) as u32)
        else {
            return false;
        };
        if ppid == ancestor {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        pid = ppid;
    }
    false
}

/// The pid of the daemon serving the live mount `dir`, from `.smithfs/whoami`.
fn daemon_pid(dir: &std::path::Path) -> Option<i32> {
    let text = std::fs::read_to_string(dir.join(".smithfs/whoami")).ok()?;
    whoami::lookup(&text, "daemon pid")?.parse().ok()
}

/// Wait (up to 10 s) for the daemon that served `dir` to let go of the store: its lock on
/// `.smithfs-state/daemon.lock` is released only when it is done, so a following `mount` or a
/// reader of the store finds everything settled.
fn wait_for_daemon(dir: &std::path::Path) {
    let lock = dir.join(STATE_DIR).join("daemon.lock");
    let _ = crate::daemon::wait_for_lock(&lock, Duration::from_secs(10));
}
