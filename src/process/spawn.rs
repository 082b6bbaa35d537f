//! Creating the processes the daemon starts (agent runs, user hooks) with `clone3(2)`, so that
//! a run is born inside its smith's cgroup (`CLONE_INTO_CGROUP`, docs/SPEC.md §2) instead of
//! being moved there between fork and exec: a write to `cgroup.procs` takes the cgroup
//! threadgroup rwsem for writing, which waits for an RCU grace period (~15 ms here) and stalls
//! every fork and exit on the machine meanwhile. Creating the child in the cgroup takes only
//! the read side.
//!
//! [`spawn`] prepares everything the child needs (argv, envp, the `$PATH` candidates, the
//! descriptors) before cloning, so that between `clone3` and `execve` the child only makes
//! async-signal-safe system calls on memory it already has: no allocation, no lock, no
//! panic. It is a fork-style clone (no `CLONE_VM`, no new stack): the child runs on a
//! copy-on-write copy of the calling thread, like after `fork(2)`. Because the raw syscall
//! bypasses glibc's `fork` bookkeeping, the child must not call anything that relies on
//! glibc's per-thread state (`raise`, `abort`, locks, `malloc`): the code after the clone
//! is written against that rule.
//!
//! The child, in this order: `setsid`; `PR_SET_CHILD_SUBREAPER`; restores the soft
//! `RLIMIT_NOFILE`; `dup2`s its stdio onto 0–2; if it could not be created in its cgroup
//! (ancestry mode, or `clone3` into the cgroup was refused), waits until the parent has bound
//! it ([`Spawn::bind`]) and never executes anything if the parent does not say so; confines
//! itself ([`Program::confine`]) and takes its user ([`Program::user`]); marks every
//! descriptor ≥ 3 close-on-exec; `chdir`s; resets `SIGPIPE` and the signal mask; `execve`s,
//! searching `$PATH` like `execvp(3)` (with its `/bin/sh` fallback for `ENOEXEC`). Its first
//! instruction writes a marker byte on a close-on-exec pipe, a failing step then writes
//! `(step, errno)` and `_exit`s; the parent reads that pipe until exec closes it, so [`spawn`]
//! returns only once the program runs, or with the error — and knows a child that died
//! before its first instruction (see [`spawn`] on `cgroup.kill`).
//!
//! The working directory is entered by path, in the child, after binding: not by `fchdir` to a
//! descriptor the daemon holds. The daemon's held descriptors are of the backing store (a run
//! whose working directory were one would work in the store, unjudged), and a descriptor
//! opened through the mount would make the daemon a client of its own mount and pin it.
//!
//! Long on purpose: the clone3 spawn and its child-side setup must stay together (async-signal-safe
//! code), plus their tests.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use super::{errno, pidfd};

/// The mask [`run_umask`] gives until [`set_run_umask`] is called: the usual login default.
const DEFAULT_RUN_UMASK: u32 = 0o022;

static RUN_UMASK: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(DEFAULT_RUN_UMASK);

/// Set the file mode creation mask every process [`spawn`] starts gets (runs, hooks, and the
/// sandbox's init, which passes it on to the agent): the daemon calls it with the mask it
/// inherited from `smithfs mount` before clearing its own (docs/PROTOCOL-NOTES.md H16).
pub fn set_run_umask(mask: u32) {
    RUN_UMASK.store(mask & 0o777, std::sync::atomic::Ordering::Relaxed);
}

/// The file mode creation mask a started process gets ([`set_run_umask`]; 022 by default).
pub fn run_umask() -> libc::mode_t {
    RUN_UMASK.load(std::sync::atomic::Ordering::Relaxed) as libc::mode_t
}

/// The byte the child writes on the error pipe as its first instruction: a child that dies
/// without it never ran (killed at birth).
const ALIVE: u8 = 0xA5;

/// `CLONE_INTO_CGROUP` (Linux ≥ 5.7), not in the `libc` crate.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` of `clone3(2)` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`, 88 bytes).
#[repr(C, align(8))]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// What a process runs, with what environment, where, and where its standard streams go: the
/// part of a start that [`Spawn`] and the scheduler's `sched::runner::Launch` share.
pub struct Program<'a> {
    /// argv; `argv[0]` is searched in `$PATH` when it has no `/`. Never empty.
    pub argv: &'a [String],
    /// Environment overrides, applied over the daemon's environment.
    pub env: &'a BTreeMap<String, String>,
    /// Working directory, entered after binding and just before exec; `None`: the daemon's.
    pub cwd: Option<&'a Path>,
    /// stdin: a pipe whose write end is returned in [`Process::stdin`]; else `/dev/null`.
    pub stdin_piped: bool,
    /// stdout and stderr (the same descriptor for both); `None`: `/dev/null`.
    pub output: Option<OwnedFd>,
    /// `RLIMIT_NOFILE` to restore in the child, (soft, hard); a 0 leaves that one as inherited
    /// (the hard limit can only be lowered).
    pub nofile: (u64, u64),
    /// Confine the child after binding, before exec ([`super::confine`], PROTOCOL-NOTES H13):
    /// its own mount namespace with `/sys` and `/proc/sys` read-only, and a reduced capability
    /// set. `None`: it runs with the daemon's capabilities and mounts. A failure stops the
    /// child before exec and is [`spawn`]'s error.
    pub confine: Option<super::confine::Confinement>,
    /// Run as this user: its groups, gid and uid set after binding and confining, before exec
    /// (a root daemon only; the kernel then clears every capability). `None`: the daemon's.
    /// Not used with [`Spawn::sandbox`], whose init drops to the agents' user itself. A failure
    /// (uid or gid `u32::MAX`, or a refused call) stops the child before exec and is [`spawn`]'s
    /// error.
    pub user: Option<&'a User>,
}

/// The credentials a process takes in [`Program::user`]: hooks run as the user who mounted
/// (docs/SPEC.md §12, "Programs smithfs runs for others").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// Its uid (real, effective, saved and filesystem).
    pub uid: u32,
    /// Its gid (likewise).
    pub gid: u32,
    /// Its supplementary groups (may be empty).
    pub groups: Vec<u32>,
}

/// What a started process is to run and where, and how it is bound.
pub struct Spawn<'a> {
    /// The program, its environment and streams.
    pub program: Program<'a>,
    /// A cgroup v2 directory to create the child in (`CLONE_INTO_CGROUP`); `None`: the
    /// daemon's own cgroup.
    pub cgroup: Option<BorrowedFd<'a>>,
    /// Bind the child before it executes anything. Called with its pid (from the spawning
    /// thread, while the child waits) unless the child was created in `cgroup`; an error stops
    /// the child before exec and is [`spawn`]'s error.
    pub bind: &'a mut dyn FnMut(u32) -> io::Result<()>,
    /// Called with its pid before it executes anything, however it was bound (after `bind` if
    /// that was called): the v1 limit cgroups of a hybrid host (docs/SPEC.md §5), which have no
    /// `CLONE_INTO_CGROUP`. `None`: the child is not held for it. An error stops the child
    /// before exec and is [`spawn`]'s error.
    pub place: Option<&'a mut dyn FnMut(u32) -> io::Result<()>>,
    /// Start the program in a sandbox (docs/SPEC.md §12, [`super::sandbox`]): the child is born
    /// PID 1 of a pid namespace of its own and, after binding, `execve`s the smithfs binary as the
    /// sandbox's init with these arguments (the plan `crate::sandbox` built, which names the
    /// working directory: [`Program::cwd`] and [`Program::confine`] are then not used), `--` and
    /// `argv`. [`spawn`] returns once the agent's program runs, or with the step that failed.
    /// `None`: no sandbox.
    pub sandbox: Option<&'a [String]>,
}

/// A started process: the leader of its own session and process group. Dropping it neither
/// kills nor reaps it.
#[derive(Debug)]
pub struct Process {
    pid: u32,
    pidfd: Option<OwnedFd>,
    /// The read end of a sandboxed process's status pipe: its init writes the agent's wait
    /// status there before it exits ([`super::sandbox::STATUS_FD`]).
    status: Option<OwnedFd>,
    /// The write end of its stdin, when [`Program::stdin_piped`].
    pub stdin: Option<File>,
    /// Whether it was created directly in [`Spawn::cgroup`] (else it was bound by
    /// [`Spawn::bind`]).
    pub in_cgroup: bool,
}

impl Process {
    /// Its pid (also its process group and session id).
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// A pidfd of it (`None` only on the `fork` fallback when `pidfd_open` failed).
    pub fn pidfd(&self) -> Option<BorrowedFd<'_>> {
        self.pidfd.as_ref().map(|f| f.as_fd())
    }

    /// Wait for it to exit and reap it. Must be called at most once, by its one owner.
    ///
    /// # Errors
    /// `waitpid`'s error (`ECHILD` if it was already reaped).
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        let pid =
            libc::pid_t::try_from(self.pid).map_err(|_| super::refused("pid out of range"))?;
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own unreaped child; `status` is a valid out-pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            if r == pid {
                // A sandbox's init reports the agent's own status (a signal stays a signal);
                // without a report (it died before writing) its own status stands.
                let agent = self.status.take().and_then(|fd| {
                    let mut buf = [0u8; 4];
                    matches!(read_full(fd.as_fd(), &mut buf), Ok(4))
                        .then(|| i32::from_ne_bytes(buf))
                });
                return Ok(ExitStatus::from_raw(agent.unwrap_or(status)));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Send SIGKILL to it (not to its group).
    pub fn kill(&self) {
        match &self.pidfd {
            Some(fd) => {
                let _ = pidfd::send_signal(fd.as_fd(), libc::SIGKILL);
            }
            None => {
                if let Ok(pid) = libc::pid_t::try_from(self.pid) {
                    // SAFETY: our unreaped child: its pid cannot have been recycled.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
    }
}

/// The errnos the spawn reports itself, each standing in for the answer of the call it
/// replaces (docs/ARCHITECTURE.md, "Errnos"): an empty program name is what execvp(3) answers
/// ENOENT for ...
const NO_PROGRAM: i32 = libc::ENOENT;
/// ... and a child whose parent closed the go pipe without binding it never executes: EPERM,
/// reported as the bind step's failure.
const NOT_BOUND: i32 = libc::EPERM;

/// The steps after the clone that can fail, as reported over the error pipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Step {
    Setsid = 1,
    Stdio = 2,
    Bind = 3,
    Chdir = 4,
    Exec = 5,
    Confine = 6,
    Sandbox = 7,
    User = 8,
}

impl Step {
    fn from_u32(v: u32) -> Option<Step> {
        Some(match v {
            1 => Step::Setsid,
            2 => Step::Stdio,
            3 => Step::Bind,
            4 => Step::Chdir,
            5 => Step::Exec,
            6 => Step::Confine,
            7 => Step::Sandbox,
            8 => Step::User,
            _ => return None,
        })
    }

    fn what(self) -> &'static str {
        match self {
            Step::Setsid => "setsid",
            Step::Stdio => "redirecting stdio",
            Step::Bind => "binding",
            Step::Chdir => "entering the working directory",
            Step::Exec => "exec",
            Step::Confine => "confining it (mount namespace, read-only /sys, capabilities)",
            Step::Sandbox => "starting the sandbox's init",
            Step::User => "switching to its user (setgroups, setresgid, setresuid)",
        }
    }
}

/// Everything the child reads after the clone: raw descriptors and pointers into memory the
/// parent prepared (the child has its own copy). Built on the spawning thread's stack.
struct ChildPlan<'a> {
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    /// The read end of the go pipe (the parent's answer after binding), or -1: no handshake.
    go: RawFd,
    /// The parent's ends, closed in the child so that a dead parent means EOF.
    go_parent: RawFd,
    err_parent: RawFd,
    /// The write end of the error pipe (close-on-exec).
    err: RawFd,
    /// The write end of the status pipe of a sandboxed child (close-on-exec), or -1.
    status: RawFd,
    nofile: (u64, u64),
    /// The file mode creation mask the program starts with ([`run_umask`]).
    umask: libc::mode_t,
    confine: Option<super::confine::Confinement>,
    /// [`Program::user`]: (uid, gid, groups).
    user: Option<(libc::uid_t, libc::gid_t, &'a [libc::gid_t])>,
    /// The sandbox's init argv (NULL-terminated), or null: no sandbox.
    init_argv: *const *const libc::c_char,
    /// The sandbox's init program ([`super::sandbox::init_program`]), or null: no sandbox.
    init_program: *const libc::c_char,
    /// The sandbox's user namespace (a spawning process that is not root), entered before the
    /// init's exec.
    userns: Option<&'a super::sandbox::UserNs>,
    cwd: *const libc::c_char,
    /// execve candidates, in order (one unless `$PATH` is searched).
    candidates: &'a [*const libc::c_char],
    /// Search semantics of execvp: skip candidates that do not exist.
    search: bool,
    argv: *const *const libc::c_char,
    /// `["/bin/sh", <candidate>, argv[1..]…, NULL]`: slot 1 is filled in the child.
    sh_argv: &'a mut [*const libc::c_char],
    envp: *const *const libc::c_char,
}

/// The child's side, from the clone to exec. Never returns.
///
/// # Safety
/// Only in the child of a fork-style clone, with `p` built by [`spawn`]: every pointer is valid
/// in the child's copy of the address space.
unsafe fn child(p: &mut ChildPlan<'_>) -> ! {
    let err = p.err;
    // SAFETY: (the whole block) plain system calls on descriptors and pointers prepared by
    // the parent, valid in our copy of its memory; nothing allocates, locks or unwinds.
    unsafe {
        libc::write(err, [ALIVE].as_ptr().cast(), 1);
        libc::close(p.err_parent);
        libc::close(p.go_parent);
        if libc::setsid() < 0 {
            fail(err, Step::Setsid, errno());
        }
        // The run leader adopts its own orphans (the flag survives exec): a double-forked
        // descendant re-parents to a bound process, not to the daemon, so in ancestry mode it
        // stays the smith while the run lives (docs/SPEC.md §2).
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        // The daemon serves with umask 0 (the kernel already applied each caller's own); what it
        // starts gets the mask of whoever mounted (docs/PROTOCOL-NOTES.md H16).
        libc::umask(p.umask);
        let (soft, hard) = p.nofile;
        if soft != 0 || hard != 0 {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                if hard != 0 {
                    lim.rlim_max = hard.min(lim.rlim_max);
                }
                if soft != 0 {
                    lim.rlim_cur = soft;
                }
                lim.rlim_cur = lim.rlim_cur.min(lim.rlim_max);
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
        // Sources are ≥ 3 (see `above_stdio`), so dup2 never clobbers one before it is used and
        // always clears close-on-exec on the target.
        for (src, dst) in [(p.stdin, 0), (p.stdout, 1), (p.stderr, 2)] {
            if libc::dup2(src, dst) < 0 {
                fail(err, Step::Stdio, errno());
            }
        }
        if p.go >= 0 {
            let mut b = 0u8;
            loop {
                let n = libc::read(p.go, (&mut b as *mut u8).cast(), 1);
                if n == 1 {
                    break;
                }
                if n == 0 {
                    // The parent did not bind us: never execute anything.
                    fail(err, Step::Bind, NOT_BOUND);
                }
                let e = errno();
                if e != libc::EINTR {
                    fail(err, Step::Bind, e);
                }
            }
            libc::close(p.go);
        }
        if !p.init_argv.is_null() {
            exec_init(p);
        }
        if let Some(c) = p.confine {
            if let Err((_, e)) = c.apply() {
                fail(err, Step::Confine, e);
            }
        }
        // Groups and gid first, while we may still change them; the uid last (from root to
        // another uid the kernel empties every capability set). Raw system calls: glibc's
        // wrappers would signal the daemon's other threads, listed in its copied state, and take
        // its stack-cache lock (see the module's rule). -1 would mean "unchanged": refused.
        if let Some((uid, gid, groups)) = p.user {
            if uid == libc::uid_t::MAX || gid == libc::gid_t::MAX {
                fail(err, Step::User, libc::EINVAL);
            }
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                fail(err, Step::User, errno());
            }
        }
        // Only fds 0–2 survive exec, whatever the daemon's other descriptors are (the error
        // pipe is already close-on-exec: exec closing it tells the parent we are running).
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        if !p.cwd.is_null() && libc::chdir(p.cwd) < 0 {
            fail(err, Step::Chdir, errno());
        }
        // The daemon ignores SIGPIPE (Rust's runtime) and blocked every signal around the
        // clone: the program starts with the default disposition and an empty mask.
        reset_signals();
        // execvp's search: skip what does not exist, remember EACCES, run a script without
        // `#!` with /bin/sh.
        let mut eacces = false;
        let mut last = libc::ENOENT;
        for &c in p.candidates.iter() {
            libc::execve(c, p.argv, p.envp);
            last = errno();
            match last {
                libc::ENOEXEC => {
                    if let Some(slot) = p.sh_argv.get_mut(1) {
                        *slot = c;
                    }
                    libc::execve(c"/bin/sh".as_ptr(), p.sh_argv.as_ptr(), p.envp);
                    fail(err, Step::Exec, libc::ENOEXEC);
                }
                libc::EACCES if p.search => eacces = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT
                    if p.search => {}
                _ => break,
            }
        }
        fail(err, Step::Exec, if eacces { libc::EACCES } else { last })
    }
}

/// The child's side when it is sandboxed: the error pipe onto [`super::sandbox::REPORT_FD`]
/// (without close-on-exec: the init reports on it, the agent's exec closes it), the status pipe
/// onto [`super::sandbox::STATUS_FD`] (the init's alone: the agent never has it), every other
/// descriptor above 2 close-on-exec, the default signal state, and `execve` of the smithfs
/// binary as the init. Never returns.
///
/// # Safety
/// As [`child`].
unsafe fn exec_init(p: &mut ChildPlan<'_>) -> ! {
    let err = p.err;
    let report = super::sandbox::REPORT_FD;
    let status = super::sandbox::STATUS_FD;
    // SAFETY: (the whole block) system calls on descriptors and pointers prepared by the parent.
    unsafe {
        // Both pipes first above the two slots (either may sit in the other's), then into them;
        // dup2 leaves the copies without close-on-exec.
        let err_high = libc::fcntl(err, libc::F_DUPFD_CLOEXEC, status + 1);
        let status_high = libc::fcntl(p.status, libc::F_DUPFD_CLOEXEC, status + 1);
        if err_high < 0
            || status_high < 0
            || libc::dup2(err_high, report) < 0
            || libc::dup2(status_high, status) < 0
        {
            fail(err, Step::Sandbox, errno());
        }
        if let Some(ns) = p.userns {
            if let Err(e) = ns.enter() {
                fail(err, Step::Sandbox, e);
            }
        }
        // A run does not outlive the daemon that started it: its mount fails closed without the
        // daemon, and a remount would kill it anyway (docs/SPEC.md §6). The init is PID 1 of
        // the run's pid namespace, so the kernel takes the rest of the run with it. Set after
        // the user namespace is entered (a credential change clears it); the parent is the
        // scheduler's thread, which lives until the runs are stopped.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) < 0 {
            fail(err, Step::Sandbox, errno());
        }
        libc::syscall(
            libc::SYS_close_range,
            (status + 1) as u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        reset_signals();
        libc::execve(p.init_program, p.init_argv, p.envp);
        fail(err, Step::Sandbox, errno())
    }
}

/// The default disposition of SIGPIPE and an empty signal mask (the daemon ignores SIGPIPE and
/// blocked every signal around the clone). Async-signal-safe.
fn reset_signals() {
    // SAFETY: zeroed sigaction / sigset_t are valid; the calls get pointers to locals.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGPIPE, &dfl, std::ptr::null_mut());
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
}

/// In the child: report `(step, errno)` on the error pipe `err` and exit without running
/// atexit handlers (async-signal-safe: `write`, `_exit`).
fn fail(err: RawFd, step: Step, e: i32) -> ! {
    let (s, e) = ((step as u32).to_ne_bytes(), e.to_ne_bytes());
    let msg = [s[0], s[1], s[2], s[3], e[0], e[1], e[2], e[3]];
    // SAFETY: write of a stack buffer to a pipe we own; _exit never returns.
    unsafe {
        libc::write(err, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// `fd` itself if it is ≥ 3, else a close-on-exec duplicate ≥ 3 (a daemon started with a
/// closed stdio gets new descriptors in 0–2, which the child's `dup2`s would clobber).
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() >= 3 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new one or -1.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

fn dev_null(flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated literal path.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    above_stdio(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn cstring(bytes: impl Into<Vec<u8>>, what: &str) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a NUL byte in the {what}"),
        )
    })
}

/// The environment of the child: the daemon's, then `env` over it, as `K=V` strings.
fn environment(env: &BTreeMap<String, String>, sandboxed: bool) -> io::Result<Vec<CString>> {
    let mut all: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    for (k, v) in env {
        all.insert(k.into(), v.into());
    }
    if sandboxed {
        all = encode_env(all);
    }
    all.into_iter()
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            cstring(kv, "environment")
        })
        .collect()
}

/// The prefix under which a run's environment travels while the processes that carry it still
/// hold privileges: the sandbox's init (root, in the host's mount namespace until it builds the
/// view) and `smithfs attach` (root on its node). `K=V` travels as `SMITHFS_AGENT_ENV_K=V`, so
/// nothing that reads a privileged process's environment — the dynamic loader's `LD_PRELOAD`,
/// `LD_AUDIT`, `LD_LIBRARY_PATH`, `LD_DEBUG_OUTPUT`, glibc's `GLIBC_TUNABLES`, `GCONV_PATH` —
/// ever sees a variable a smith's `config.json` named (a parent writes its child's, docs/SPEC.md
/// §3). Only the agent, executed after the credentials were dropped, gets them back by their
/// names ([`decode_env`]; docs/PROTOCOL-NOTES.md XT21).
pub const AGENT_ENV_PREFIX: &str = "SMITHFS_AGENT_ENV_";

/// `env` with every name put under [`AGENT_ENV_PREFIX`]; a name already under it is kept as it
/// is and wins over the plain name it encodes (`attach`'s environment: the run's, encoded by the
/// launcher, over what the node or the daemon set).
pub fn encode_env<K, V>(env: impl IntoIterator<Item = (K, V)>) -> BTreeMap<OsString, OsString>
where
    K: Into<OsString>,
    V: Into<OsString>,
{
    let mut out = BTreeMap::new();
    let mut encoded = Vec::new();
    for (k, v) in env {
        let k: OsString = k.into();
        if k.as_bytes().starts_with(AGENT_ENV_PREFIX.as_bytes()) {
            encoded.push((k, v.into()));
        } else {
            let mut name = OsString::from(AGENT_ENV_PREFIX);
            name.push(k);
            out.insert(name, v.into());
        }
    }
    // What was encoded already is the run's own and wins over a plain name it shares.
    out.extend(encoded);
    out
}

/// `env` (a run's `agent.env` and §5 variables, as the scheduler prepared them) with every name
/// under [`AGENT_ENV_PREFIX`]: what a launcher hands a privileged process that passes the run's
/// environment on (`attach`, `sbatch`), so that only COMMAND gets it back by its names.
pub fn encoded_names(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    env.iter()
        .map(|(k, v)| (format!("{AGENT_ENV_PREFIX}{k}"), v.clone()))
        .collect()
}

/// The run's environment out of an encoded one ([`encode_env`]): the names under
/// [`AGENT_ENV_PREFIX`] without it; a name not under it is dropped when `only_encoded`, else
/// kept (an encoded name wins over a plain one of the same name).
pub fn decode_env<K, V>(
    env: impl IntoIterator<Item = (K, V)>,
    only_encoded: bool,
) -> BTreeMap<OsString, OsString>
where
    K: Into<OsString>,
    V: Into<OsString>,
{
    let mut plain = BTreeMap::new();
    let mut decoded = BTreeMap::new();
    for (k, v) in env {
        let k: OsString = k.into();
        match k.as_bytes().strip_prefix(AGENT_ENV_PREFIX.as_bytes()) {
            Some(name) if !name.is_empty() => {
                decoded.insert(OsStr::from_bytes(name).to_os_string(), v.into());
            }
            Some(_) => {}
            None if !only_encoded => {
                plain.insert(k, v.into());
            }
            None => {}
        }
    }
    plain.extend(decoded);
    plain
}

/// The paths execvp would try for `program`: itself if it has a `/`, else each `$PATH` entry
/// joined with it (an empty entry is the working directory), `$PATH` taken from the child's
/// environment (glibc's default `/bin:/usr/bin` if unset). Returns the candidates and whether
/// it is a search.
pub fn candidates(
    program: &str,
    env: &BTreeMap<String, String>,
) -> io::Result<(Vec<CString>, bool)> {
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(NO_PROGRAM));
    }
    if program.contains('/') {
        return Ok((vec![cstring(program, "command")?], false));
    }
    let path: OsString = match env.get("PATH") {
        Some(p) => p.into(),
        None => std::env::var_os("PATH").unwrap_or_else(|| crate::sys::path::DEFAULT_PATH.into()),
    };
    let mut out = Vec::new();
    for dir in path.as_bytes().split(|b| *b == b':') {
        let mut c = if dir.is_empty() {
            b".".to_vec()
        } else {
            dir.to_vec()
        };
        c.push(b'/');
        c.extend_from_slice(program.as_bytes());
        out.push(cstring(c, "command")?);
    }
    Ok((out, true))
}

/// Raw `clone3` with fork semantics. Returns the child's pid (0 in the child) and, in the
/// parent, the pidfd.
///
/// # Safety
/// As `fork(2)` in a multi-threaded process: the child may only make async-signal-safe calls
/// until exec or `_exit`, and must not rely on glibc's per-thread state.
unsafe fn clone3(
    cgroup: Option<RawFd>,
    new_pid_ns: bool,
    new_user_ns: bool,
) -> io::Result<(libc::pid_t, Option<OwnedFd>)> {
    let mut pidfd: libc::c_int = -1;
    let mut ns = if new_pid_ns {
        libc::CLONE_NEWPID as u64
    } else {
        0
    };
    if new_user_ns {
        // Made first by the kernel: it owns the pid namespace (docs/SPEC.md §12 "Without root").
        ns |= libc::CLONE_NEWUSER as u64;
    }
    let mut args = CloneArgs {
        flags: libc::CLONE_PIDFD as u64 | ns,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    if let Some(cg) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = u64::try_from(cg).map_err(|_| super::refused("descriptor out of range"))?;
    }
    // SAFETY: `args` is a valid clone_args of the size passed; no CLONE_VM, no stack: the
    // child continues here on a copy of this thread (the caller's contract).
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of_mut!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let pid = libc::pid_t::try_from(r).map_err(|_| super::refused("pid out of range"))?;
    if pid == 0 {
        return Ok((0, None));
    }
    // SAFETY: the kernel stored a new pidfd owned by nobody else.
    let fd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Ok((pid, fd))
}

/// Blocks every signal in the calling thread until dropped (the child inherits the full mask
/// and empties it just before exec, so no daemon signal handler runs in it).
struct BlockSignals(libc::sigset_t);

impl BlockSignals {
    fn new() -> BlockSignals {
        // SAFETY: sigset_t is plain data; sigfillset/pthread_sigmask get valid pointers.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            BlockSignals(old)
        }
    }
}

impl Drop for BlockSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Read until `buf` is full or EOF; returns the bytes read.
fn read_full(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        // SAFETY: `rest` is valid writable memory of the given length.
        let n = unsafe { libc::read(fd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len()) };
        match n {
            0 => break,
            n if n > 0 => got += n.unsigned_abs(),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(got)
}

/// What the child needs from the parent, prepared once for every attempt.
struct Prepared<'a> {
    candidates: Vec<*const libc::c_char>,
    search: bool,
    argv: Vec<*const libc::c_char>,
    sh_argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: *const libc::c_char,
    stdin: BorrowedFd<'a>,
    out: BorrowedFd<'a>,
    nofile: (u64, u64),
    confine: Option<super::confine::Confinement>,
    /// [`Program::user`].
    user: Option<&'a User>,
    /// The sandbox's init argv, NULL-terminated; empty: no sandbox.
    init_argv: Vec<*const libc::c_char>,
    /// The sandbox's init program; null: no sandbox.
    init_program: *const libc::c_char,
    /// The sandbox's user namespace: this process is not root (docs/SPEC.md §12 "Without root").
    userns: Option<super::sandbox::UserNs>,
}

/// How one clone ended.
enum Attempt {
    /// The program runs.
    Running(Process),
    /// The child was killed before its first instruction (and has been reaped).
    KilledAtBirth,
}

/// Start `s` (see the module header). Returns once the program runs.
///
/// A child created in its cgroup that is killed before its first instruction is created again
/// outside it and bound by [`Spawn::bind`]: Linux (6.18 here) compares the `cgroup.kill`
/// sequence number of the *parent's* cgroup with the destination's in `cgroup_post_fork`, so
/// `CLONE_INTO_CGROUP` into a cgroup that was ever killed through `cgroup.kill` SIGKILLs every
/// child at birth. (The daemon therefore never writes `cgroup.kill` to a cgroup it still
/// creates runs in; this is the safety net.)
///
/// # Errors
/// A NUL byte in an argument, the environment or the directory (`InvalidInput`); `clone3`'s
/// or `fork`'s error; [`Spawn::bind`]'s error; the first failing step in the child (`exec`'s
/// errno as is, e.g. `NotFound`; other steps name themselves). In every error case the child
/// never executed the program and has been reaped.
pub fn spawn(s: Spawn<'_>) -> io::Result<Process> {
    let (program, _) = s
        .program
        .argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    // Everything the child touches, prepared now.
    let (cands, search) = candidates(program, s.program.env)?;
    let args: Vec<CString> = s
        .program
        .argv
        .iter()
        .map(|a| cstring(a.as_bytes(), "arguments"))
        .collect::<io::Result<_>>()?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut sh_argv: Vec<*const libc::c_char> = vec![c"/bin/sh".as_ptr(), std::ptr::null()];
    sh_argv.extend(args.iter().skip(1).map(|a| a.as_ptr()));
    sh_argv.push(std::ptr::null());
    // A sandboxed run's environment reaches its init encoded (it is root until it drops).
    let envs = environment(s.program.env, s.sandbox.is_some())?;
    let mut envp: Vec<*const libc::c_char> = envs.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // The sandbox's init: `smithfs __sandbox-init PLAN… -- argv…`.
    let init_args: Vec<CString> = match s.sandbox {
        Some(plan) => ["smithfs", super::sandbox::INIT_ARG]
            .into_iter()
            .chain(plan.iter().map(String::as_str))
            .chain(std::iter::once("--"))
            .chain(s.program.argv.iter().map(String::as_str))
            .map(|a| cstring(a.as_bytes(), "arguments"))
            .collect::<io::Result<_>>()?,
        None => Vec::new(),
    };
    let mut init_argv: Vec<*const libc::c_char> = init_args.iter().map(|a| a.as_ptr()).collect();
    let mut init_program = std::ptr::null();
    if !init_argv.is_empty() {
        init_argv.push(std::ptr::null());
        init_program = super::sandbox::init_program()
            .ok_or_else(|| {
                io::Error::other(
                    "this process has not named the smithfs binary as the sandbox's init \
                     (process::sandbox::set_init_program)",
                )
            })?
            .as_ptr();
    }
    let cwd = s
        .program
        .cwd
        .map(|p| cstring(OsStr::as_bytes(p.as_os_str()), "working directory"))
        .transpose()?;
    let (stdin_child, stdin_parent) = if s.program.stdin_piped {
        let (r, w) = pipe()?;
        (r, Some(w))
    } else {
        (dev_null(libc::O_RDONLY)?, None)
    };
    let out = match s.program.output {
        Some(fd) => above_stdio(fd)?,
        None => dev_null(libc::O_WRONLY)?,
    };
    let mut prep = Prepared {
        candidates: cands.iter().map(|c| c.as_ptr()).collect(),
        search,
        argv,
        sh_argv,
        envp,
        cwd: cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        stdin: stdin_child.as_fd(),
        out: out.as_fd(),
        nofile: s.program.nofile,
        confine: s.program.confine,
        user: s.program.user,
        userns: (!init_argv.is_empty() && super::sandbox::needs_user_namespace())
            .then(super::sandbox::UserNs::of_this_process),
        init_argv,
        init_program,
    };
    let mut cgroup = s.cgroup;
    let mut place = s.place;
    loop {
        let placing: Option<&mut dyn FnMut(u32) -> io::Result<()>> = match &mut place {
            Some(p) => Some(&mut **p),
            None => None,
        };
        match attempt(&mut prep, cgroup, &mut *s.bind, placing)? {
            Attempt::Running(mut p) => {
                p.stdin = stdin_parent.map(File::from);
                return Ok(p);
            }
            Attempt::KilledAtBirth if cgroup.is_some() => {
                tracing::warn!(
                    "a process created in its cgroup was killed before its first instruction \
                     (the cgroup was killed through cgroup.kill before); creating it outside \
                     and binding it instead"
                );
                cgroup = None;
            }
            Attempt::KilledAtBirth => {
                return Err(io::Error::other(
                    "the new process was killed before its first instruction",
                ))
            }
        }
    }
}

/// One clone of `prep`: into `cgroup` if given and the kernel accepts it, else a child that
/// waits for `bind`. Returns once the program runs, or the child is reaped.
fn attempt(
    prep: &mut Prepared<'_>,
    cgroup: Option<BorrowedFd<'_>>,
    bind: &mut dyn FnMut(u32) -> io::Result<()>,
    place: Option<&mut dyn FnMut(u32) -> io::Result<()>>,
) -> io::Result<Attempt> {
    let (err_rd, err_wr) = pipe()?;
    let (go_rd, go_wr) = pipe()?;
    let sandboxed = !prep.init_argv.is_empty();
    let (status_rd, status_wr) = if sandboxed {
        let (r, w) = pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let mut plan = ChildPlan {
        stdin: prep.stdin.as_raw_fd(),
        stdout: prep.out.as_raw_fd(),
        stderr: prep.out.as_raw_fd(),
        go: -1,
        go_parent: go_wr.as_raw_fd(),
        err_parent: err_rd.as_raw_fd(),
        err: err_wr.as_raw_fd(),
        status: status_wr.as_ref().map_or(-1, |w| w.as_raw_fd()),
        nofile: prep.nofile,
        umask: run_umask(),
        confine: prep.confine,
        user: prep.user.map(|u| (u.uid, u.gid, u.groups.as_slice())),
        init_argv: if prep.init_argv.is_empty() {
            std::ptr::null()
        } else {
            prep.init_argv.as_ptr()
        },
        init_program: prep.init_program,
        userns: prep.userns.as_ref(),
        cwd: prep.cwd,
        candidates: &prep.candidates,
        search: prep.search,
        argv: prep.argv.as_ptr(),
        sh_argv: &mut prep.sh_argv,
        envp: prep.envp.as_ptr(),
    };

    // Into the cgroup if we can; else (no cgroup, or clone3 refused it: not delegated to us,
    // a seccomp filter, an old kernel) a plain child that waits to be bound.
    let mut in_cgroup = cgroup.is_some();
    let userns = prep.userns.is_some();
    let cloned = {
        let _mask = BlockSignals::new();
        let mut clone = || -> io::Result<(libc::pid_t, Option<OwnedFd>)> {
            if let Some(cg) = cgroup {
                // Held before exec only if it must be placed.
                plan.go = if place.is_some() {
                    go_rd.as_raw_fd()
                } else {
                    -1
                };
                // SAFETY: the child branch below only runs `child`, which keeps the contract.
                match unsafe { clone3(Some(cg.as_raw_fd()), sandboxed, userns) } {
                    Ok(r) => return Ok(r),
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM)) => {
                        return Err(e)
                    }
                    Err(e) => {
                        tracing::debug!("clone3 into the cgroup refused ({e}); binding after");
                        in_cgroup = false;
                    }
                }
            }
            plan.go = go_rd.as_raw_fd();
            // SAFETY: as above.
            match unsafe { clone3(None, sandboxed, userns) } {
                // A pid namespace needs clone3 here: never a run without its sandbox.
                Err(e) if sandboxed => Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{}: clone3: {e}",
                        super::sandbox::Stage::PidNamespace.what()
                    ),
                )),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                    // SAFETY: as above: the child only runs `child`.
                    let pid = unsafe { libc::fork() };
                    if pid < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok((pid, None))
                }
                other => other,
            }
        };
        let r = clone();
        if let Ok((0, _)) = r {
            // SAFETY: we are the child of a fork-style clone and `plan` was built above.
            unsafe { child(&mut plan) }
        }
        r
    }?;
    let (pid, pidfd) = cloned;
    let pid_u = pid.unsigned_abs();
    super::reaper::track(pid_u);
    // The child has its copies: ours of its ends go, so its death means EOF here.
    drop(err_wr);
    drop(go_rd);
    drop(status_wr);
    let mut process = Process {
        pid: pid_u,
        status: status_rd,
        // Our unreaped child: its pid cannot be recycled before the pidfd names it.
        pidfd: pidfd.or_else(|| pidfd::open(pid_u, 0).ok()),
        stdin: None,
        in_cgroup,
    };
    let bound = if in_cgroup { Ok(()) } else { bind(pid_u) };
    let bound = match place {
        Some(place) => bound.and_then(|()| place(pid_u)),
        None => bound,
    };
    if bound.is_ok() {
        // (A child that does not wait for it never reads it: harmless.)
        // SAFETY: writing one byte from a valid buffer to a pipe we own.
        unsafe { libc::write(go_wr.as_raw_fd(), b"g".as_ptr().cast(), 1) };
    }
    drop(go_wr);
    // The child's first instruction writes ALIVE; exec closes the pipe; a failing step writes
    // its (step, errno) after ALIVE.
    let mut msg = [0u8; 9];
    let got = read_full(err_rd.as_fd(), &mut msg);
    let failed = match (&bound, got) {
        (Ok(()), Ok(1)) if msg[0] == ALIVE => None,
        (Err(e), _) => Some(io::Error::new(e.kind(), e.to_string())),
        (Ok(()), Ok(0)) => {
            let _ = process.wait();
            super::reaper::untrack(pid_u);
            return Ok(Attempt::KilledAtBirth);
        }
        (Ok(()), Ok(9)) => {
            let step = u32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
            let errno = i32::from_ne_bytes([msg[5], msg[6], msg[7], msg[8]]);
            let os = io::Error::from_raw_os_error(errno);
            Some(
                match (Step::from_u32(step), super::sandbox::Stage::from_code(step)) {
                    (Some(Step::Exec), _) | (None, None) => os,
                    (Some(st), _) => io::Error::new(os.kind(), format!("{}: {os}", st.what())),
                    (None, Some(st)) => io::Error::new(os.kind(), format!("{}: {os}", st.what())),
                },
            )
        }
        (Ok(()), Ok(_)) => Some(io::Error::other("the new process died before exec")),
        (Ok(()), Err(e)) => Some(e),
    };
    match failed {
        None => Ok(Attempt::Running(process)),
        Some(e) => {
            process.kill();
            let _ = process.wait();
            super::reaper::untrack(pid_u);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// The run's environment travels encoded and comes back by its names (notes XT21).
    #[test]
    fn a_runs_environment_is_inert_until_decoded() {
        let p = AGENT_ENV_PREFIX;
        let pairs = |v: &[(&str, &str)]| -> Vec<(OsString, OsString)> {
            v.iter().map(|(k, v)| (k.into(), v.into())).collect()
        };
        type Env<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Env<'_>, Env<'_>)] = &[
            (&[], &[]),
            (
                &[("LD_PRELOAD", "/x.so")],
                &[(&format!("{p}LD_PRELOAD"), "/x.so")],
            ),
            // Encoded already: kept, and it wins over the plain name it encodes.
            (
                &[("PATH", "/daemon"), (&format!("{p}PATH"), "/run")],
                &[(&format!("{p}PATH"), "/run")],
            ),
            (
                &[(&format!("{p}TERM"), "run"), ("TERM", "daemon")],
                &[(&format!("{p}TERM"), "run")],
            ),
        ];
        for (input, want) in cases {
            let got = encode_env(pairs(input));
            let want: BTreeMap<OsString, OsString> = pairs(want).into_iter().collect();
            assert_eq!(got, want, "{input:?}");
            for k in got.keys() {
                assert!(
                    !k.as_bytes().starts_with(b"LD_"),
                    "{k:?} reaches the loader"
                );
            }
        }
        let run: BTreeMap<String, String> = [("LD_AUDIT".to_string(), "/a.so".to_string())].into();
        let handed: Vec<(String, String)> = encoded_names(&run).into_iter().collect();
        assert_eq!(handed, [(format!("{p}LD_AUDIT"), "/a.so".to_string())]);
        // Decoded: only the encoded names (the init), or the encoded over the plain (attach).
        let env = pairs(&[
            (&format!("{p}LD_PRELOAD"), "/x.so"),
            (&format!("{p}HOME"), "/run/home"),
            ("HOME", "/root"),
            ("SLURM_JOB_ID", "7"),
            (p, "a name of nothing"),
        ]);
        let only: Vec<(OsString, OsString)> = decode_env(env.clone(), true).into_iter().collect();
        assert_eq!(
            only,
            pairs(&[("HOME", "/run/home"), ("LD_PRELOAD", "/x.so")])
        );
        let all: Vec<(OsString, OsString)> = decode_env(env, false).into_iter().collect();
        assert_eq!(
            all,
            pairs(&[
                ("HOME", "/run/home"),
                ("LD_PRELOAD", "/x.so"),
                ("SLURM_JOB_ID", "7")
            ])
        );
    }

    fn no_bind() -> impl FnMut(u32) -> io::Result<()> {
        |_| Ok(())
    }

    /// A `Spawn` of `argv` with these tests' defaults: the daemon's working directory, stdin
    /// and output on `/dev/null`, no cgroup, inherited limits, not placed. Override fields with
    /// struct update syntax.
    fn plain<'a>(
        argv: &'a [String],
        env: &'a BTreeMap<String, String>,
        bind: &'a mut dyn FnMut(u32) -> io::Result<()>,
    ) -> Spawn<'a> {
        Spawn {
            program: Program {
                argv,
                env,
                cwd: None,
                stdin_piped: false,
                output: None,
                nofile: (0, 0),
                confine: None,
                user: None,
            },
            cgroup: None,
            bind,
            place: None,
            sandbox: None,
        }
    }

    /// `s` changed by `f`: a test's fields over [`plain`]'s defaults, in one expression (so the
    /// temporaries `plain` borrows live as long as the `spawn` call).
    fn tweak<'a>(mut s: Spawn<'a>, f: impl FnOnce(&mut Spawn<'a>)) -> Spawn<'a> {
        f(&mut s);
        s
    }

    fn start(
        args: &[&str],
        env: &BTreeMap<String, String>,
        cwd: Option<&Path>,
        output: Option<OwnedFd>,
        bind: &mut dyn FnMut(u32) -> io::Result<()>,
    ) -> io::Result<Process> {
        let args = argv(args);
        let mut s = plain(&args, env, bind);
        s.program.cwd = cwd;
        s.program.output = output;
        spawn(s)
    }

    /// Wait for `p` with a deadline (kill it past the deadline) and return its status.
    fn finish(mut p: Process) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(20);
        if let Some(fd) = p.pidfd() {
            if !super::super::wait_pidfd(fd, deadline) {
                p.kill();
            }
        }
        let st = p.wait().expect("wait");
        super::super::reaper::untrack(p.id());
        st
    }

    fn status_field(pid: u32, key: &str) -> String {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    }

    #[test]
    fn candidates_follow_execvp() {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/a::/b".to_string());
        let (c, search) = candidates("prog", &env).expect("candidates");
        let c: Vec<&[u8]> = c.iter().map(|c| c.as_bytes()).collect();
        assert_eq!(c, [&b"/a/prog"[..], b"./prog", b"/b/prog"]);
        assert!(search);
        let (c, search) = candidates("./x/prog", &env).expect("candidates");
        assert_eq!(c[0].as_bytes(), b"./x/prog");
        assert!(!search);
        assert!(candidates("", &env).is_err());
        assert!(candidates("a\0b", &BTreeMap::new()).is_err());
    }

    #[test]
    fn clone_args_has_the_kernel_size() {
        assert_eq!(std::mem::size_of::<CloneArgs>(), 88);
    }

    /// [`Program::user`] (hooks as the user who mounted, docs/SPEC.md §12): a root parent's
    /// child runs as that uid, gid and groups in every slot, with no capability; a uid of
    /// `u32::MAX` ("unchanged" to the kernel) is the spawn's error, never a root child.
    #[test]
    fn the_child_takes_its_user() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to switch users");
            return;
        }
        let args = argv(&["sleep", "30"]);
        let env = BTreeMap::new();
        let user = User {
            uid: 65534,
            gid: 65533,
            groups: vec![65532, 65533],
        };
        let mut bind = no_bind();
        let p = spawn(tweak(plain(&args, &env, &mut bind), |s| {
            s.program.user = Some(&user);
        }))
        .expect("spawn as 65534");
        let pid = p.id();
        let seen = [
            status_field(pid, "Uid:"),
            status_field(pid, "Gid:"),
            status_field(pid, "Groups:"),
            status_field(pid, "CapPrm:"),
            status_field(pid, "CapEff:"),
        ];
        p.kill();
        finish(p);
        assert_eq!(
            seen,
            [
                "65534\t65534\t65534\t65534",
                "65533\t65533\t65533\t65533",
                "65532 65533",
                "0000000000000000",
                "0000000000000000",
            ]
        );
        let unchanged = User {
            uid: u32::MAX,
            gid: 65533,
            groups: Vec::new(),
        };
        let mut bind = no_bind();
        let err = match spawn(tweak(plain(&args, &env, &mut bind), |s| {
            s.program.user = Some(&unchanged);
        })) {
            Ok(p) => {
                p.kill();
                finish(p);
                panic!("a uid of u32::MAX started a child");
            }
            Err(e) => e,
        };
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("switching to its user"), "{err}");
    }

    /// Session and group leader, the working directory, the environment, only fds 0–2, an
    /// empty signal mask and SIGPIPE at its default, the subreaper flag: checked on a live
    /// `sleep` from outside.
    #[test]
    fn the_child_starts_clean() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut env = BTreeMap::new();
        env.insert("SPAWN_TEST".to_string(), "v=1".to_string());
        let p = start(
            &["sleep", "30"],
            &env,
            Some(dir.path()),
            None,
            &mut no_bind(),
        )
        .expect("spawn sleep");
        let pid = p.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let fields: Vec<&str> = stat.rsplit_once(") ").expect("stat").1.split(' ').collect();
        assert_eq!(fields[2], pid.to_string(), "process group");
        assert_eq!(fields[3], pid.to_string(), "session");
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd");
        assert_eq!(cwd, dir.path().canonicalize().expect("canonical"));
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
        assert!(environ.split(|b| *b == 0).any(|kv| kv == b"SPAWN_TEST=v=1"));
        assert!(environ
            .split(|b| *b == 0)
            .any(|kv| kv.starts_with(b"PATH=")));
        // Right after exec the program's dynamic loader holds the libraries it maps open (as
        // fd 3, briefly): poll until it settles rather than read once (flaky under load).
        let fds_of = || {
            let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .expect("fds")
                .map(|e| e.expect("fd").file_name().to_string_lossy().into_owned())
                .collect();
            fds.sort();
            fds
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut fds = fds_of();
        while fds != ["0", "1", "2"] && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            fds = fds_of();
        }
        assert_eq!(fds, ["0", "1", "2"]);
        assert_eq!(status_field(pid, "SigBlk:"), "0000000000000000");
        let ign = u64::from_str_radix(&status_field(pid, "SigIgn:"), 16).expect("SigIgn");
        assert_eq!(ign & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE not ignored");
        assert_eq!(
            std::fs::read_link(format!("/proc/{pid}/fd/0")).expect("stdin"),
            Path::new("/dev/null")
        );
        p.kill();
        assert_eq!(finish(p).signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn output_stdin_and_exit_status() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = File::create(dir.path().join("log")).expect("log");
        let mut p = spawn(tweak(
            plain(
                &argv(&["sh", "-c", "cat; echo err >&2; exit 7"]),
                &BTreeMap::new(),
                &mut no_bind(),
            ),
            |s| {
                s.program.stdin_piped = true;
                s.program.output = Some(OwnedFd::from(log));
            },
        ))
        .expect("spawn sh");
        let mut stdin = p.stdin.take().expect("stdin pipe");
        stdin.write_all(b"in\n").expect("write stdin");
        drop(stdin);
        assert_eq!(finish(p).code(), Some(7));
        let log = std::fs::read_to_string(dir.path().join("log")).expect("read log");
        assert_eq!(log, "in\nerr\n");
    }

    #[test]
    fn exec_errors_are_reported_and_nothing_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = BTreeMap::new();
        let e = start(&["/nonexistent/prog"], &env, None, None, &mut no_bind())
            .expect_err("no such program");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = start(
            &["smithfs-no-such-command"],
            &env,
            None,
            None,
            &mut no_bind(),
        )
        .expect_err("not in PATH");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "x").expect("write");
        let e = start(
            &[plain.to_str().expect("utf-8")],
            &env,
            None,
            None,
            &mut no_bind(),
        )
        .expect_err("not executable");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let e = start(
            &["true"],
            &env,
            Some(&dir.path().join("missing")),
            None,
            &mut no_bind(),
        )
        .expect_err("no such directory");
        assert!(e.to_string().contains("working directory"), "{e}");
        let e = start(&["echo", "a\0b"], &env, None, None, &mut no_bind()).expect_err("NUL");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    /// A script without `#!` runs with /bin/sh (execvp's fallback), found through `$PATH`.
    #[test]
    fn scripts_without_a_shebang_run_with_sh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("myscript");
        std::fs::write(&script, "echo \"ran $1\" > out\n").expect("write");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut env = BTreeMap::new();
        env.insert(
            "PATH".to_string(),
            format!("/nonexistent:{}", dir.path().display()),
        );
        let p = start(
            &["myscript", "arg"],
            &env,
            Some(dir.path()),
            None,
            &mut no_bind(),
        )
        .expect("spawn script");
        assert_eq!(finish(p).code(), Some(0));
        let out = std::fs::read_to_string(dir.path().join("out")).expect("out");
        assert_eq!(out, "ran arg\n");
    }

    /// Without a cgroup the child waits for `bind` before it executes anything, and a failing
    /// `bind` means the program never runs.
    #[test]
    fn the_child_waits_for_bind_and_a_failed_bind_runs_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = std::fs::read_link("/proc/self/exe").expect("exe");
        let mut seen = None;
        let mut check = |pid: u32| {
            // Still our copy, not yet `sleep`.
            seen = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            Ok(())
        };
        let p =
            start(&["sleep", "30"], &BTreeMap::new(), None, None, &mut check).expect("spawn sleep");
        assert_eq!(seen.as_deref(), Some(me.as_path()));
        assert!(!p.in_cgroup);
        p.kill();
        finish(p);

        let marker = dir.path().join("marker");
        let mut refuse = |_pid: u32| Err(io::Error::other("refused for the test"));
        let e = start(
            &["touch", marker.to_str().expect("utf-8")],
            &BTreeMap::new(),
            None,
            None,
            &mut refuse,
        )
        .expect_err("bind refused");
        assert!(e.to_string().contains("refused for the test"), "{e}");
        assert!(!marker.exists(), "the program never ran");
    }

    /// A cgroup v2 directory for a test under the cgroup2 mount's root (a leaf, so processes
    /// may live in it), or `None` where this is not allowed.
    fn test_cgroup() -> Option<(PathBuf, File)> {
        let info = std::fs::read("/proc/self/mountinfo").ok()?;
        let mnt = crate::sys::procfs::parse_mountinfo(&info)
            .ok()?
            .into_iter()
            .find(|m| m.fs_type == "cgroup2")?
            .mount_point;
        let dir = mnt.join(format!(
            "smithfs-spawn-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir(&dir).ok()?;
        let f = File::open(&dir).ok()?;
        Some((dir, f))
    }

    /// `CLONE_INTO_CGROUP`: the child is in the cgroup from its first instruction and `bind` is
    /// never called; a descriptor that is not a cgroup falls back to `bind`.
    #[test]
    fn the_child_is_born_in_its_cgroup_or_bound_after() {
        let Some((cg, cg_fd)) = test_cgroup() else {
            eprintln!("skipped: cannot create a cgroup here");
            return;
        };
        let mut binds = 0;
        let mut count = |_pid: u32| {
            binds += 1;
            Ok(())
        };
        let p = spawn(tweak(
            plain(&argv(&["sleep", "30"]), &BTreeMap::new(), &mut count),
            |s| {
                s.cgroup = Some(cg_fd.as_fd());
            },
        ));
        let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
        let p = p.expect("spawn into the cgroup");
        assert!(p.in_cgroup);
        assert!(procs.lines().any(|l| l == p.id().to_string()), "{procs}");
        p.kill();
        finish(p);
        assert_eq!(binds, 0);

        let not_a_cgroup = tempfile::tempdir().expect("tempdir");
        let fd = File::open(not_a_cgroup.path()).expect("open");
        let mut count = |_pid: u32| {
            binds += 1;
            Ok(())
        };
        let p = spawn(tweak(
            plain(&argv(&["true"]), &BTreeMap::new(), &mut count),
            |s| {
                s.cgroup = Some(fd.as_fd());
            },
        ))
        .expect("fallback spawn");
        assert!(!p.in_cgroup);
        assert_eq!(finish(p).code(), Some(0));
        assert_eq!(binds, 1);
        let _ = std::fs::remove_dir(&cg);
    }

    /// `place` holds a child born in its cgroup before exec (hybrid hosts' v1 limit cgroups),
    /// and a failing `place` means the program never runs.
    #[test]
    fn place_runs_before_exec_even_in_a_cgroup() {
        let Some((cg, cg_fd)) = test_cgroup() else {
            eprintln!("skipped: cannot create a cgroup here");
            return;
        };
        let me = std::fs::read_link("/proc/self/exe").expect("exe");
        let mut seen = None;
        let mut place = |pid: u32| {
            seen = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            Ok(())
        };
        let p = spawn(tweak(
            plain(&argv(&["sleep", "30"]), &BTreeMap::new(), &mut no_bind()),
            |s| {
                s.cgroup = Some(cg_fd.as_fd());
                s.place = Some(&mut place);
                s.program.confine = None;
            },
        ))
        .expect("spawn");
        assert!(p.in_cgroup);
        assert_eq!(seen.as_deref(), Some(me.as_path()), "placed before exec");
        p.kill();
        finish(p);

        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("marker");
        let mut refuse = |_pid: u32| Err(io::Error::other("no room for the test"));
        let e = spawn(tweak(
            plain(
                &argv(&["touch", marker.to_str().expect("utf-8")]),
                &BTreeMap::new(),
                &mut no_bind(),
            ),
            |s| {
                s.cgroup = Some(cg_fd.as_fd());
                s.place = Some(&mut refuse);
                s.program.confine = None;
            },
        ))
        .expect_err("place refused");
        assert!(e.to_string().contains("no room for the test"), "{e}");
        assert!(!marker.exists(), "the program never ran");
        let _ = std::fs::remove_dir(&cg);
    }

    /// After a `cgroup.kill`, Linux kills `CLONE_INTO_CGROUP` children at birth: the child is
    /// created again outside and bound, and the program runs (on a kernel without that
    /// behaviour it is simply created in the cgroup).
    #[test]
    fn a_killed_cgroup_still_gets_its_runs() {
        let Some((cg, cg_fd)) = test_cgroup() else {
            eprintln!("skipped: cannot create a cgroup here");
            return;
        };
        std::fs::write(cg.join("cgroup.kill"), "1").expect("cgroup.kill");
        let mut binds = 0;
        let mut count = |_pid: u32| {
            binds += 1;
            Ok(())
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let p = spawn(tweak(
            plain(
                &argv(&["sh", "-c", "cat /proc/self/cgroup > out"]),
                &BTreeMap::new(),
                &mut count,
            ),
            |s| {
                s.program.cwd = Some(dir.path());
                s.cgroup = Some(cg_fd.as_fd());
            },
        ))
        .expect("spawn into a killed cgroup");
        let in_cgroup = p.in_cgroup;
        assert_eq!(finish(p).code(), Some(0));
        assert_eq!(
            binds,
            usize::from(!in_cgroup),
            "bound only when not created in it"
        );
        let out = std::fs::read_to_string(dir.path().join("out")).expect("out");
        let name = cg.file_name().expect("name").to_string_lossy().into_owned();
        assert_eq!(out.contains(&name), in_cgroup, "{out}");
        eprintln!(
            "CLONE_INTO_CGROUP into a killed cgroup: child killed at birth: {}",
            !in_cgroup
        );
        let _ = std::fs::remove_dir(&cg);
    }
}
