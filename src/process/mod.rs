//! Process primitives, kept together because they share one discipline (code that runs between
//! `fork`/`clone3` and `execve` makes async-signal-safe calls only) and one goal: no process of
//! a smith's tree ever escapes it (docs/SPEC.md §2).
//!
//! - [`spawn`]: `clone3(CLONE_INTO_CGROUP)` — a run or hook is born inside its smith's cgroup,
//!   becomes a session leader and a child subreaper, and `execve`s (the scheduler's runs and
//!   hooks use it);
//! - [`confine`]: what a root daemon's runs may not do (their own mount namespace with `/sys`
//!   and `/proc/sys` read-only, a reduced capability set), so root agents cannot leave their
//!   smith;
//! - [`keeper`]: the keeper of `smithfs run` (ancestry mode): a bound subreaper that runs a
//!   command, forwards signals to it and outlives its last descendant;
//! - [`reaper`]: the daemon's reaper of orphans (a subreaper must reap them) that leaves the
//!   processes it started itself to their owners, and its once-a-second upkeep;
//! - [`pidfd`]: safe wrappers of the pidfd system calls (`pidfd_open`, `PIDFD_GET_INFO`, …),
//!   which identity resolution and the spawn use;
//! - [`wait_pidfd`]: wait for a started process's exit without reaping it;
//! - [`become_subreaper`]: `PR_SET_CHILD_SUBREAPER` for the calling process (the daemon, so
//!   orphans of its runs re-parent to it; the keeper).
//!
//! Nothing here knows smiths, the store or the scheduler: callers pass argv, environment,
//! descriptors and a cgroup.

pub mod confine;
pub mod keeper;
pub mod pidfd;
pub mod reaper;
pub mod sandbox;
pub mod spawn;

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::time::Instant;

/// An input the process primitives refuse before any system call (a pid or descriptor out of
/// range, a NUL byte in an argument): `InvalidInput` saying what was wrong. It carries no errno:
/// here only a failed system call does.
/// The calling thread's `errno` (async-signal-safe: one read of its slot).
pub fn errno() -> i32 {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for reading.
    unsafe { *libc::__errno_location() }
}

/// `_LINUX_CAPABILITY_VERSION_3` of `capget`/`capset` (linux/capability.h): two 32-bit words
/// per set.
pub(crate) const CAP_V3: u32 = 0x2008_0522;

/// `capget`/`capset`'s header (`struct __user_cap_header_struct`).
#[repr(C)]
pub(crate) struct CapHeader {
    /// [`CAP_V3`].
    pub version: u32,
    /// 0: the calling thread.
    pub pid: i32,
}

/// One 32-bit word of each capability set (`struct __user_cap_data_struct`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct CapData {
    /// Bits of the effective set.
    pub effective: u32,
    /// Bits of the permitted set.
    pub permitted: u32,
    /// Bits of the inheritable set.
    pub inheritable: u32,
}

pub(crate) fn refused(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_owned())
}

/// Make the calling process a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER, 1)`): orphaned
/// descendants re-parent to it instead of to init, so it can reap them and knows when the
/// last is gone.
///
/// # Errors
/// The `prctl` error (none is expected on Linux ≥ 3.4).
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only; it reads and writes no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `cmd`'s output, as [`std::process::Command::output`], or `None` when it has not ended within `deadline`:
/// with a deadline it runs in a process group of its own, which is then killed whole
/// (`SIGKILL`: what it started too, e.g. the upload-pack of a local `git fetch`) and reaped.
/// Its output is read by two threads, so a full pipe never stalls it. For programs that read
/// files someone else controls (a FIFO there blocks them for ever): the scaffold's git
/// (docs/PROTOCOL-NOTES.md W20), the smith-side git of `diff` and `accept` (H23).
///
/// # Errors
/// `spawn`'s or `wait`'s.
pub fn output_within(
    cmd: &mut std::process::Command,
    deadline: Option<std::time::Duration>,
) -> std::io::Result<Option<std::process::Output>> {
    let Some(deadline) = deadline else {
        return cmd.output().map(Some);
    };
    Ok(output_within_max(cmd, deadline, None)?.map(|(out, _)| out))
}

/// [`output_within`] with a deadline, and at most `max` bytes of stdout kept (`None`: all):
/// once it wrote more, its stdout is closed (its writers get `EPIPE`, and `SIGPIPE` unless they
/// ignore it; the deadline still bounds the rest), the first `max` bytes are its stdout and the
/// flag is true — its exit status then says little. For output someone
/// else controls whose size only they bound (a smith's diff in the ui, notes UI11).
///
/// # Errors
/// `spawn`'s or `wait`'s.
pub fn output_within_max(
    cmd: &mut std::process::Command,
    deadline: std::time::Duration,
    max: Option<usize>,
) -> std::io::Result<Option<(std::process::Output, bool)>> {
    use std::io::Read as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut child = cmd.process_group(0).spawn()?;
    let pid = child.id();
    let cut = std::sync::Arc::new(AtomicBool::new(false));
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>, max: Option<usize>| {
        let cut = std::sync::Arc::clone(&cut);
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let Some(p) = pipe else { return buf };
            match max {
                None => {
                    let mut p = p;
                    let _ = p.read_to_end(&mut buf);
                }
                Some(max) => {
                    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
                    let _ = p.take(limit).read_to_end(&mut buf);
                    if buf.len() > max {
                        buf.truncate(max);
                        cut.store(true, Ordering::SeqCst);
                    }
                    // The read end closes here: more writes fail.
                }
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _), max);
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _), None);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send(());
        status
    });
    let timed_out = rx.recv_timeout(deadline).is_err();
    if timed_out {
        // The group leader is not reaped until `waiter`'s wait returns, so its pid (the group's
        // id) is still ours.
        if let Ok(pgid) = libc::pid_t::try_from(pid) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
    let status = waiter
        .join()
        .map_err(|_| std::io::Error::other("git's waiter panicked"))??;
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let cut = cut.load(Ordering::SeqCst);
    Ok((!timed_out).then_some((
        std::process::Output {
            status,
            stdout,
            stderr,
        },
        cut,
    )))
}

/// Wait until the process of pidfd `fd` exits or `deadline` passes, without reaping it.
/// Returns true if it exited.
pub fn wait_pidfd(fd: BorrowedFd<'_>, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return true;
        }
    }
}
