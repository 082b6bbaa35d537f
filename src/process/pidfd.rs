//! Thin, safe wrappers around the pidfd system calls identity resolution needs (docs/SPEC.md §2):
//! `pidfd_open` (a process or, with [`PIDFD_THREAD`], one thread), the `PIDFD_GET_INFO` ioctl
//! (Linux ≥ 6.13: tgid, ppid and cgroup v2 id of a live task, `ESRCH` once it is gone),
//! `pidfd_send_signal`, and the pidfs inode number, which names one process for the life of the
//! system (never reused, unlike a pid).
//!
//! A pidfd pins the kernel's `struct pid`, not the pid *number*: once the task is reaped the number
//! may be handed to a new process, but the old pidfd keeps answering `ESRCH`. That is what makes a
//! cached pidfd a safe cache key against pid reuse.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `pidfd_open` flag: the pidfd refers to one thread, not to its thread group (Linux ≥ 6.9).
pub const PIDFD_THREAD: u32 = libc::O_EXCL as u32;

/// `struct pidfd_info` as published first (`PIDFD_INFO_SIZE_VER0` = 64 bytes); later kernels
/// extend it and accept the old size.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct RawPidfdInfo {
    mask: u64,
    cgroupid: u64,
    pid: u32,
    tgid: u32,
    ppid: u32,
    ruid: u32,
    rgid: u32,
    euid: u32,
    egid: u32,
    suid: u32,
    sgid: u32,
    fsuid: u32,
    fsgid: u32,
    spare0: u32,
}

const PIDFD_INFO_PID: u64 = 1 << 0;
const PIDFD_INFO_CGROUPID: u64 = 1 << 2;

/// `_IOWR(PIDFS_IOCTL_MAGIC = 0xFF, 11, struct pidfd_info)` with the 64-byte struct.
const PIDFD_GET_INFO: libc::c_ulong =
    (3 << 30) | ((std::mem::size_of::<RawPidfdInfo>() as libc::c_ulong) << 16) | (0xFF << 8) | 11;

/// What `PIDFD_GET_INFO` says about a live task. Pids are in the caller's pid namespace (0 when
/// not visible there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidfdInfo {
    /// The task's pid (a thread id for a thread pidfd).
    pub pid: u32,
    /// Its thread group id (the process id).
    pub tgid: u32,
    /// The parent process's tgid; 0 for pid 1 or a parent outside the caller's pid namespace.
    pub ppid: u32,
    /// The cgroup v2 id of the task's cgroup (the inode number of its directory on a cgroup2
    /// mount); `None` if the kernel did not report one (no cgroup v2).
    pub cgroup_id: Option<u64>,
}

/// `pidfd_open(pid, flags)`: a close-on-exec descriptor for the process `pid` (flags 0: must be a
/// thread-group leader) or the thread `pid` (`PIDFD_THREAD`).
///
/// # Errors
/// `ESRCH` no such process (or it was reaped), `EINVAL` a non-leader without `PIDFD_THREAD`,
/// `InvalidInput` (no errno) a pid of 0 or beyond `pid_t`, `EMFILE`/`ENFILE` out of descriptors, `ENOSYS` before Linux 5.3.
pub fn open(pid: u32, flags: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| super::refused("pid out of range"))?;
    if pid <= 0 {
        return Err(super::refused("pid 0"));
    }
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1; no memory is shared.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| super::refused("descriptor out of range"))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `PIDFD_GET_INFO` on `fd`: one ioctl, no `/proc` access.
///
/// # Errors
/// `ESRCH` once the task has exited and been reaped (a zombie still answers), `ENOTTY`/`EINVAL`
/// on kernels before 6.13, `EBADF` if `fd` is not a pidfd.
pub fn info(fd: BorrowedFd<'_>) -> io::Result<PidfdInfo> {
    let mut raw = RawPidfdInfo {
        mask: PIDFD_INFO_PID | PIDFD_INFO_CGROUPID,
        ..RawPidfdInfo::default()
    };
    // SAFETY: `raw` is a properly sized and aligned `struct pidfd_info` that lives across the call;
    // the ioctl number encodes exactly its size, so the kernel writes no more than that.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            PIDFD_GET_INFO as _,
            &mut raw as *mut RawPidfdInfo,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PidfdInfo {
        pid: raw.pid,
        tgid: raw.tgid,
        ppid: raw.ppid,
        cgroup_id: (raw.mask & PIDFD_INFO_CGROUPID != 0).then_some(raw.cgroupid),
    })
}

/// The pidfs inode number of `fd`: unique per process (per `struct pid`) for the life of the system
/// on 64-bit kernels ≥ 6.9, so two pidfds with the same number name the same process.
///
/// # Errors
/// What `fstat` reports (`EBADF`).
pub fn inode(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is valid for writes of one `struct stat`; fstat fills it on success.
    let rc = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    Ok(st.st_ino)
}

/// `pidfd_send_signal(fd, signal, NULL, 0)`: signal the process `fd` names (never a recycled pid).
///
/// # Errors
/// `ESRCH` if it is gone, `EPERM` without the right to signal it, `EINVAL` for a bad signal.
pub fn send_signal(fd: BorrowedFd<'_>, signal: i32) -> io::Result<()> {
    // SAFETY: four integer/null arguments; the kernel reads no memory when `info` is NULL.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// True once the process (or, for a `PIDFD_THREAD` pidfd, the thread) has exited, zombie or
/// reaped: the pidfd polls readable. One `poll` with no wait.
pub fn has_exited(fd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid `pollfd` that lives across the call; timeout 0 never blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0
}

/// For each pidfd of `fds`, true once its process (or thread) has exited: [`has_exited`] for
/// many at once, one `poll` with no wait per 1024 descriptors. A descriptor `poll` reports as
/// invalid (`POLLNVAL`) counts as exited.
pub fn exited_among(fds: &[BorrowedFd<'_>]) -> Vec<bool> {
    let mut out = Vec::with_capacity(fds.len());
    for chunk in fds.chunks(1024) {
        let mut polls: Vec<libc::pollfd> = chunk
            .iter()
            .map(|fd| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `polls` is a valid array of `polls.len()` (≤ 1024) `pollfd`s that lives across
        // the call; timeout 0 never blocks.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 0) };
        if n < 0 {
            // EINTR/ENOMEM: nothing known, keep everything this time.
            out.resize(out.len() + chunk.len(), false);
            continue;
        }
        out.extend(
            polls
                .iter()
                .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLNVAL) != 0),
        );
    }
    out
}

/// True if `PIDFD_GET_INFO` works here (Linux ≥ 6.13), checked on the calling thread.
pub fn get_info_supported() -> bool {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let Ok(tid) = u32::try_from(tid) else {
        return false;
    };
    open(tid, PIDFD_THREAD)
        .and_then(|fd| {
            use std::os::fd::AsFd;
            info(fd.as_fd())
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn ioctl_number_matches_the_uapi_header() {
        assert_eq!(std::mem::size_of::<RawPidfdInfo>(), 64);
        assert_eq!(PIDFD_GET_INFO, 0xC040_FF0B);
    }

    #[test]
    fn own_thread_info() {
        let pid = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let fd = open(tid, PIDFD_THREAD).expect("pidfd_open own thread");
        let i = info(fd.as_fd()).expect("PIDFD_GET_INFO (needs Linux >= 6.13)");
        assert_eq!(i.pid, tid);
        assert_eq!(i.tgid, pid);
        // SAFETY: getppid has no preconditions.
        assert_eq!(i.ppid, unsafe { libc::getppid() } as u32);
        let leader = open(pid, 0).expect("pidfd_open own process");
        assert_ne!(inode(leader.as_fd()).expect("fstat"), 0);
    }

    #[test]
    fn exit_is_seen_on_zombies_and_reaped_processes() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let fd = open(child.id(), 0).expect("pidfd_open child");
        assert!(!has_exited(fd.as_fd()));
        let _ = child.kill();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !has_exited(fd.as_fd()) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(has_exited(fd.as_fd()), "zombie polls readable");
        let _ = child.wait();
        assert!(has_exited(fd.as_fd()));
        assert!(info(fd.as_fd()).is_err(), "reaped: ESRCH");
    }

    #[test]
    fn exited_among_tells_live_from_dead() {
        let mut live = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let mut dead = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let live_fd = open(live.id(), 0).expect("pidfd_open live");
        let dead_fd = open(dead.id(), 0).expect("pidfd_open dead");
        let _ = dead.wait();
        let got = exited_among(&[live_fd.as_fd(), dead_fd.as_fd(), live_fd.as_fd()]);
        assert_eq!(got, vec![false, true, false]);
        assert!(exited_among(&[]).is_empty());
        let _ = live.kill();
        let _ = live.wait();
        assert_eq!(exited_among(&[live_fd.as_fd()]), vec![true]);
    }

    #[test]
    fn bad_pids_are_errors() {
        assert!(open(0, 0).is_err());
        assert!(open(u32::MAX, 0).is_err());
    }
}
