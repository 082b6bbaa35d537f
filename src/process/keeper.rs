//! The *keeper* of ancestry mode (docs/SPEC.md §2): a bound process that is a child subreaper, runs
//! a command, reaps every descendant (orphans re-parent to it), and returns the command's status only
//! once its last descendant is gone, so that no process of a smith's tree ever re-parents outside
//! it. `smithfs run` uses it after binding itself.
//!
//! Signals (docs/SPEC.md §2, issue 10): the keeper must outlive its command's last descendant, so
//! it survives every signal that can be caught. The terminal's job-control and interrupt signals
//! (SIGINT, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU) and SIGPIPE are ignored (a terminal sends the
//! former to the command's process group, which includes the command); SIGCHLD, SIGCONT,
//! SIGWINCH and SIGURG keep their default (ignore); every other catchable signal — SIGTERM,
//! SIGHUP, SIGUSR1, SIGUSR2, SIGALRM, the real-time signals … — is forwarded to the command. A
//! fault signal the kernel raises (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS with a
//! positive `si_code`) is not forwarded but kills the keeper as usual: that is a bug, not a
//! signal someone sent. SIGKILL (and SIGSTOP) cannot be caught: the one documented limit.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

/// The CMD pid the keeper forwards signals to (0: none yet, or CMD was reaped).
static CHILD: AtomicI32 = AtomicI32::new(0);

/// Signals the kernel raises for a fault of the receiving thread.
const FAULTS: [libc::c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// Signals the keeper ignores: sent to the whole foreground group by a terminal (the command
/// gets its own copy), or SIGPIPE (a write to a closed pipe then fails with EPIPE instead).
const IGNORED: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGPIPE,
];

/// Signals left at their default disposition: SIGKILL and SIGSTOP cannot be caught; SIGCHLD,
/// SIGCONT, SIGWINCH and SIGURG are ignored by default (SIGCHLD's default keeps `waitpid` simple).
const DEFAULT: [libc::c_int; 6] = [
    libc::SIGKILL,
    libc::SIGSTOP,
    libc::SIGCHLD,
    libc::SIGCONT,
    libc::SIGWINCH,
    libc::SIGURG,
];

/// What the keeper does with signal `sig` (1 ..= SIGRTMAX).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Left as it is (uncatchable, or ignored by default).
    Default,
    /// Ignored.
    Ignore,
    /// Forwarded to the command.
    Forward,
}

/// The keeper's disposition of `sig` (see the module docs).
pub fn disposition(sig: libc::c_int) -> Disposition {
    if DEFAULT.contains(&sig) {
        Disposition::Default
    } else if IGNORED.contains(&sig) {
        Disposition::Ignore
    } else if (32..libc::SIGRTMIN()).contains(&sig) {
        // glibc's own real-time signals (thread cancellation): not ours to touch.
        Disposition::Default
    } else {
        Disposition::Forward
    }
}

extern "C" fn forward(signal: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    let code = if info.is_null() {
        0
    } else {
        // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
        unsafe { (*info).si_code }
    };
    if code > 0 && FAULTS.contains(&signal) {
        // A real fault: take the default action when the faulting instruction runs again.
        // SAFETY: sigaction is async-signal-safe; a zeroed action with SIG_DFL is valid.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &dfl, std::ptr::null_mut());
        }
        return;
    }
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; `pid` is our unreaped child (a zombie at worst).
        unsafe { libc::kill(pid, signal) };
    }
}

/// The keeper: becomes a child subreaper, forks and execs `argv`, reaps every descendant, and
/// returns CMD's exit code (or 128 + signal; 127 not found, 126 not executable) once no descendant
/// is left. Signal dispositions it changes are restored before it returns.
///
/// Must be called from a process whose other threads (if any) never fork; the child only calls
/// `sigaction`, `dup2`, `prctl`, `execve` and `_exit`.
///
/// # Errors
/// An empty `argv`, an argument with a NUL byte, `prctl` or `fork` failures.
pub fn keep(argv: &[OsString]) -> std::io::Result<u8> {
    keep_with(argv, &[], false)
}

/// [`keep`], with `moves` (`(from, to)` descriptor pairs) `dup2`ed in CMD's process before it
/// executes: `smithfs run` gives the command its pty that way (the keeper keeps its own stdio).
/// Every `from` must be above 2 and no `from` a `to`. With `die_with_keeper`, CMD gets
/// `PR_SET_PDEATHSIG` = `SIGKILL` before it executes: the sandbox's init (PID 1 of its pid
/// namespace, so the whole run) dies with a keeper killed by `SIGKILL`, as the scheduler's runs
/// die with their daemon.
///
/// # Errors
/// As [`keep`].
pub fn keep_with(
    argv: &[OsString],
    moves: &[(i32, i32)],
    die_with_keeper: bool,
) -> std::io::Result<u8> {
    let prog = argv
        .first()
        .ok_or_else(|| std::io::Error::other("no command given"))?;
    // `argv[0]` resolved through `$PATH` before any fork: nothing allocates after it.
    let Some(path) = crate::sys::path::find_program(prog) else {
        eprintln!(
            "smithfs: cannot execute {}: command not found",
            Path::new(prog).display()
        );
        return Ok(127);
    };
    let nul = |_| super::refused("a NUL byte in the command");
    let cpath = CString::new(path.into_os_string().into_vec()).map_err(nul)?;
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(nul)?;
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // The sandbox's init gets its run's environment encoded, as from every spawn (it is root
    // until it drops; notes XT21).
    let to_init = argv.get(1).is_some_and(|a| a == super::sandbox::INIT_ARG);
    let env: Vec<(OsString, OsString)> = if to_init {
        super::spawn::encode_env(std::env::vars_os())
            .into_iter()
            .collect()
    } else {
        std::env::vars_os().collect()
    };
    let envs: Vec<CString> = env
        .into_iter()
        .filter_map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            CString::new(kv).ok()
        })
        .collect();
    let mut envp: Vec<*const libc::c_char> = envs.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());
    let fail_prefix = format!("smithfs: cannot execute {}: ", Path::new(prog).display());

    super::become_subreaper()?;
    let saved = Dispositions::install()?;
    // SAFETY: the child runs only async-signal-safe calls (sigaction, dup2, prctl, execve, write, _exit) on
    // memory prepared above.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        saved.restore();
        return Err(e);
    }
    if pid == 0 {
        saved.restore();
        // SAFETY: async-signal-safe calls only; pointers are valid NUL-terminated arrays.
        unsafe {
            for (from, to) in moves {
                if libc::dup2(*from, *to) < 0 {
                    libc::_exit(126);
                }
            }
            if die_with_keeper && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) < 0 {
                libc::_exit(126);
            }
            libc::execve(cpath.as_ptr(), ptrs.as_ptr(), envp.as_ptr());
            let errno = *libc::__errno_location();
            let reason: &[u8] = match errno {
                libc::ENOENT => b"no such file\n",
                libc::EACCES => b"permission denied\n",
                libc::ENOEXEC => b"not an executable format\n",
                _ => b"exec failed\n",
            };
            libc::write(2, fail_prefix.as_ptr().cast(), fail_prefix.len());
            libc::write(2, reason.as_ptr().cast(), reason.len());
            libc::_exit(if errno == libc::ENOENT { 127 } else { 126 });
        }
    }
    CHILD.store(pid, Ordering::Relaxed);
    let mut code: u8 = 0;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int to `status`.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                _ => break, // ECHILD: no descendant left
            }
        }
        if r == pid {
            code = exit_code(status);
            CHILD.store(0, Ordering::Relaxed);
        }
    }
    saved.restore();
    Ok(code)
}

/// The shell convention for a wait status: the exit code, or 128 + the terminating signal.
pub fn exit_code(status: libc::c_int) -> u8 {
    if libc::WIFEXITED(status) {
        u8::try_from(libc::WEXITSTATUS(status)).unwrap_or(1)
    } else if libc::WIFSIGNALED(status) {
        u8::try_from(128 + libc::WTERMSIG(status)).unwrap_or(255)
    } else {
        1
    }
}

/// The keeper's signal dispositions, with the previous ones to restore.
struct Dispositions {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

impl Dispositions {
    fn install() -> std::io::Result<Dispositions> {
        let mut d = Dispositions { old: Vec::new() };
        let forward_handler = forward
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t;
        for sig in 1..=libc::SIGRTMAX() {
            let (handler, flags) = match disposition(sig) {
                Disposition::Default => continue,
                Disposition::Ignore => (libc::SIG_IGN, libc::SA_RESTART),
                Disposition::Forward => (forward_handler, libc::SA_RESTART | libc::SA_SIGINFO),
            };
            // SAFETY: zeroed sigaction is a valid empty action; sigaction reads `new` and writes
            // `old`, both live across the call.
            unsafe {
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = handler;
                new.sa_flags = flags;
                libc::sigemptyset(&mut new.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &new, &mut old) != 0 {
                    let e = std::io::Error::last_os_error();
                    d.restore();
                    return Err(e);
                }
                d.old.push((sig, old));
            }
        }
        Ok(d)
    }

    /// Puts the previous dispositions back (async-signal-safe: only `sigaction`).
    fn restore(&self) {
        for (sig, old) in &self.old {
            // SAFETY: `old` is the action sigaction returned for `sig`.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        // Encoded as the kernel does: exit code << 8; a signal in the low 7 bits.
        assert_eq!(exit_code(0), 0);
        assert_eq!(exit_code(3 << 8), 3);
        assert_eq!(exit_code(255 << 8), 255);
        assert_eq!(exit_code(libc::SIGTERM), 143);
        assert_eq!(exit_code(libc::SIGKILL), 137);
    }

    #[test]
    fn every_catchable_signal_is_handled() {
        let table = [
            (libc::SIGHUP, Disposition::Forward),
            (libc::SIGTERM, Disposition::Forward),
            (libc::SIGUSR1, Disposition::Forward),
            (libc::SIGUSR2, Disposition::Forward),
            (libc::SIGALRM, Disposition::Forward),
            (libc::SIGSEGV, Disposition::Forward),
            (libc::SIGRTMIN(), Disposition::Forward),
            (libc::SIGRTMAX(), Disposition::Forward),
            (libc::SIGPIPE, Disposition::Ignore),
            (libc::SIGINT, Disposition::Ignore),
            (libc::SIGTSTP, Disposition::Ignore),
            (libc::SIGKILL, Disposition::Default),
            (libc::SIGCHLD, Disposition::Default),
        ];
        for (sig, want) in table {
            assert_eq!(disposition(sig), want, "signal {sig}");
        }
        // Every signal whose default action terminates or stops is handled.
        for sig in 1..=libc::SIGRTMAX() {
            if disposition(sig) == Disposition::Default {
                assert!(
                    [
                        libc::SIGKILL,
                        libc::SIGSTOP,
                        libc::SIGCHLD,
                        libc::SIGCONT,
                        libc::SIGWINCH
                    ]
                    .contains(&sig)
                        || sig == libc::SIGURG
                        || (32..libc::SIGRTMIN()).contains(&sig),
                    "signal {sig} left at its default"
                );
            }
        }
    }
}
