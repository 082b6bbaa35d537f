//! The process side of a run's sandbox (docs/SPEC.md §12): the steps of its pid-1 init, named
//! for `spawn_error`, and the credential drop, made with raw system calls only.
//!
//! A sandboxed process is started by [`super::spawn`] in a pid namespace of its own
//! (`CLONE_NEWPID`): it is that namespace's PID 1, and after binding it `execve`s the smithfs
//! binary ([`init_program`]) as the sandbox's init (`crate::sandbox::init`), with the write end
//! of the spawn's error pipe on fd 3. The init builds the run's view, forks the agent, which
//! drops its credentials ([`drop_credentials`]) and `execve`s the program; a failing step writes
//! `(step, errno)` on fd 3, with `step` = [`Stage::code`], exactly as the spawn's own steps do,
//! so [`super::spawn::spawn`] returns the error naming the step and nothing was executed.

use super::{errno, CapData, CapHeader, CAP_V3};

/// The fd on which a sandbox's init finds the spawn's error pipe (absent for `smithfs run`).
pub const REPORT_FD: i32 = 3;

/// The fd on which a sandbox's init finds the status pipe of the spawn (absent for `smithfs
/// run`): the init writes the agent's wait status there (4 bytes, native order) just before it
/// exits, so a run killed by signal N is reported as killed by N, not by the init's `128 + N`.
pub const STATUS_FD: i32 = 4;

/// The argument that makes the smithfs binary the sandbox's init (`smithfs __sandbox-init PLAN
/// -- ARGV…`); never typed by a user.
pub const INIT_ARG: &str = "__sandbox-init";

/// The program a sandboxed spawn executes as the run's init, once named.
static INIT_PROGRAM: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

/// Name `path` as the program sandboxed spawns execute as the run's init (`PATH INIT_ARG PLAN
/// -- ARGV…`): the smithfs binary. The binary names itself (`/proc/self/exe`) in
/// [`crate::cli::run()`]; any other program using the library (a test harness) must name the
/// smithfs binary before it spawns a sandboxed run, or the spawn is refused — executing
/// `/proc/self/exe` from a test harness would run the harness's own tests as the init, and
/// those spawn runs again. The first call wins; false if `path` has a NUL or a program was
/// already named.
pub fn set_init_program(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    match std::ffi::CString::new(path.as_os_str().as_bytes()) {
        Ok(c) => INIT_PROGRAM.set(c).is_ok(),
        Err(_) => false,
    }
}

/// The program named by [`set_init_program`], if any.
pub fn init_program() -> Option<&'static std::ffi::CStr> {
    INIT_PROGRAM.get().map(std::ffi::CString::as_c_str)
}

/// The stage codes start here on the error pipe (below are [`super::spawn`]'s own steps).
const BASE: u32 = 100;

/// `CAP_KILL`: the one capability the init keeps (it forwards signals to the agent, another uid).
pub const CAP_KILL: u32 = 5;

/// A step of the sandbox's setup that can fail (docs/SPEC.md §12: a failed step stops the run
/// before it executes anything, and `spawn_error` names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Stage {
    /// Reading the plan of the view (a malformed argument).
    Plan = 0,
    /// The init is not PID 1 of a pid namespace of its own.
    PidNamespace = 1,
    /// `unshare(CLONE_NEWNS)` and making the namespace a recursive slave.
    MountNamespace = 2,
    /// The tmpfs the new root is built on, and the first `pivot_root`.
    NewRoot = 3,
    /// Bind-mounting a system directory, an agent program, a `readable` or `writable` path.
    Bind = 4,
    /// Making a bound path read-only (`mount_setattr`).
    ReadOnly = 5,
    /// The private `/dev` (tmpfs, device binds, a new `devpts`).
    Dev = 6,
    /// `/proc` of the run's pid namespace, `/proc/sys` read-only.
    Proc = 7,
    /// `/sys` read-only.
    Sys = 8,
    /// The private `/tmp`, `/var/tmp`, `/dev/shm`.
    Tmp = 9,
    /// The passwd and group files of the view.
    Passwd = 10,
    /// The smithfs mount at its own path.
    Mount = 11,
    /// The final `pivot_root` into the view and detaching the host's tree.
    Pivot = 12,
    /// Forking the agent.
    Fork = 13,
    /// Dropping the agent's credentials: groups, gid, uid, capabilities, `no_new_privs`.
    Credentials = 14,
    /// Entering the working directory (or the smith dir).
    Chdir = 15,
    /// The init's own capabilities (all but `CAP_KILL` dropped).
    InitCapabilities = 16,
    /// The network namespace of `sandbox.network: "none"` and its loopback.
    Network = 17,
    /// Preparing or entering the run's Landlock domain.
    Landlock = 18,
    /// Installing the run's seccomp filter.
    Seccomp = 19,
    /// The agent's session: a new session (its terminal, if any, as its controlling one) and a
    /// session keyring of its own.
    Session = 20,
}

/// Every stage, in code order.
pub const STAGES: [Stage; 21] = [
    Stage::Plan,
    Stage::PidNamespace,
    Stage::MountNamespace,
    Stage::NewRoot,
    Stage::Bind,
    Stage::ReadOnly,
    Stage::Dev,
    Stage::Proc,
    Stage::Sys,
    Stage::Tmp,
    Stage::Passwd,
    Stage::Mount,
    Stage::Pivot,
    Stage::Fork,
    Stage::Credentials,
    Stage::Chdir,
    Stage::InitCapabilities,
    Stage::Network,
    Stage::Landlock,
    Stage::Seccomp,
    Stage::Session,
];

impl Stage {
    /// Its code on the error pipe.
    pub fn code(self) -> u32 {
        BASE + self as u32
    }

    /// The stage of an error-pipe code, if it is one.
    pub fn from_code(code: u32) -> Option<Stage> {
        let i = usize::try_from(code.checked_sub(BASE)?).ok()?;
        STAGES.get(i).copied()
    }

    /// What it does, for `spawn_error` ("building the sandbox: mounting the private /dev").
    pub fn what(self) -> &'static str {
        match self {
            Stage::Plan => "building the sandbox: reading its plan",
            Stage::PidNamespace => "building the sandbox: its pid namespace",
            Stage::MountNamespace => "building the sandbox: its mount namespace",
            Stage::NewRoot => "building the sandbox: its new root",
            Stage::Bind => "building the sandbox: bind-mounting a path of the view",
            Stage::ReadOnly => "building the sandbox: making the view read-only",
            Stage::Dev => "building the sandbox: the private /dev",
            Stage::Proc => "building the sandbox: /proc of its pid namespace",
            Stage::Sys => "building the sandbox: /sys read-only",
            Stage::Tmp => "building the sandbox: the private /tmp",
            Stage::Passwd => "building the sandbox: its passwd and group files",
            Stage::Mount => "building the sandbox: the smithfs mount in the view",
            Stage::Pivot => "building the sandbox: pivot_root into the view",
            Stage::Fork => "building the sandbox: forking the agent",
            Stage::Credentials => "building the sandbox: dropping the agent's credentials",
            Stage::Chdir => "entering the working directory",
            Stage::InitCapabilities => "building the sandbox: the init's capabilities",
            Stage::Network => "building the sandbox: its network namespace",
            Stage::Landlock => "building the sandbox: its Landlock domain",
            Stage::Seccomp => "building the sandbox: its seccomp filter",
            Stage::Session => "building the sandbox: its session and session keyring",
        }
    }
}

/// `KEYCTL_JOIN_SESSION_KEYRING` (keyctl(2)).
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;

/// Make the calling process (the agent, before exec) the leader of a new session and give it a
/// session keyring of its own (docs/SPEC.md §12): the first of stdin, stdout, stderr that is a
/// terminal becomes its controlling terminal (under `smithfs run` a pty of the run's own; the
/// scheduler's runs have none), and the keyring it inherited (the daemon's or the operator's,
/// whose keys a possessor may use whatever their owner) is replaced by a new anonymous one,
/// owned by whoever calls this — so it comes after the credential drop. A kernel without keys
/// (`ENOSYS`) has no keyring to leak and is not an error.
///
/// # Errors
/// The errno of `setsid`, `TIOCSCTTY` or `keyctl`.
pub fn new_session() -> Result<(), i32> {
    // SAFETY: setsid, isatty and ioctl on our own descriptors; keyctl with a null name.
    unsafe {
        if libc::setsid() < 0 {
            return Err(errno());
        }
        if let Some(fd) = (0..3).find(|fd| libc::isatty(*fd) == 1) {
            if libc::ioctl(fd, libc::TIOCSCTTY, 0) != 0 {
                return Err(errno());
            }
        }
        let r = libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        );
        if r < 0 && errno() != libc::ENOSYS {
            return Err(errno());
        }
    }
    Ok(())
}

/// Drop every capability but those of `keep` (a bit mask of capability numbers) from the
/// bounding set, numbers `0..=last_cap` (an unknown number's `EINVAL` is skipped), and clear the
/// ambient set. Needs `CAP_SETPCAP`, so it comes before any uid change.
fn drop_bounding(keep: u64, last_cap: u32) -> Result<(), i32> {
    for cap in 0..=last_cap.min(63) {
        if keep & (1u64 << cap) != 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) } != 0 {
            let e = errno();
            if e != libc::EINVAL {
                return Err(e);
            }
        }
    }
    // SAFETY: as above.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } != 0
    {
        let e = errno();
        if e != libc::EINVAL {
            return Err(e);
        }
    }
    Ok(())
}

/// Set the permitted, effective and inheritable sets to `keep` (a mask) and nothing else.
fn set_caps(keep: u64) -> Result<(), i32> {
    let header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    for (i, d) in data.iter_mut().enumerate() {
        let word = (keep >> (32 * i)) as u32;
        *d = CapData {
            effective: word,
            permitted: word,
            inheritable: 0,
        };
    }
    // SAFETY: capset with pointers to locals of the kernel's layout.
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// `PR_SET_NO_NEW_PRIVS`: no exec gains privileges (setuid and file capabilities do nothing).
fn no_new_privs() -> Result<(), i32> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// The agent's credential drop (docs/SPEC.md §12 "Users"), in this order: every capability out
/// of the bounding set (`PR_CAPBSET_DROP`, needs `CAP_SETPCAP`, so first) and the ambient set
/// cleared; `setgroups` to none; `setresgid(gid)`; `setresuid(uid)` (which empties the permitted
/// and effective sets of a process that is no longer root); the inheritable set emptied;
/// `PR_SET_NO_NEW_PRIVS`. Raw system calls only (async-signal-safe). `uid` and `gid` are never 0
/// (the caller checks).
///
/// In a user namespace of its own ([`UserNs`], `in_user_namespace`) `setgroups` is denied: the
/// supplementary groups stay those the daemon had (its own), and the uid and gid are already
/// the daemon's, so the permitted and effective sets are emptied by the explicit `capset`.
///
/// # Errors
/// The errno of the first failing call; the process must then not exec.
pub fn drop_credentials(
    uid: u32,
    gid: u32,
    last_cap: u32,
    in_user_namespace: bool,
) -> Result<(), i32> {
    // 0 is root; -1 means "unchanged" to setres[ug]id: both would leave the run root.
    if uid == 0 || gid == 0 || uid == u32::MAX || gid == u32::MAX {
        return Err(libc::EINVAL);
    }
    drop_bounding(0, last_cap)?;
    // SAFETY: setgroups with a count of 0 reads no memory; setres[ug]id take integers.
    unsafe {
        if !in_user_namespace && libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(errno());
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(errno());
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(errno());
        }
    }
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: getresuid writes three integers to locals.
    if unsafe { libc::getresuid(&mut r, &mut e, &mut s) } != 0 || [r, e, s] != [uid; 3] {
        return Err(libc::EPERM);
    }
    set_caps(0)?;
    no_new_privs()?;
    // A process whose uid changed is not dumpable until its next exec; after the exec it is
    // dumpable for its own uid only (and a pid namespace hides every other process).
    Ok(())
}

/// The init's own reduction: it stays uid 0 (so runs, another uid, can neither signal nor trace
/// it; in a [`UserNs`] it is the runs' uid, and being not dumpable, in no Landlock domain and the
/// pid namespace's init keep them off it) but keeps only `CAP_KILL` (to forward signals to the agent) in every set, gets
/// `no_new_privs` and is not dumpable (no `/proc/1/{mem,environ,fd}` for anyone but root).
///
/// # Errors
/// The errno of the first failing call.
pub fn reduce_init(last_cap: u32) -> Result<(), i32> {
    let keep = 1u64 << CAP_KILL;
    drop_bounding(keep, last_cap)?;
    set_caps(keep)?;
    no_new_privs()?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// Whether a run's sandbox is built in a user namespace of its own (docs/SPEC.md §12 "Without
/// root"): the process starting it is not root, so the namespaces, mounts and the credential
/// drop need the capabilities a new user namespace gives its first process.
pub fn needs_user_namespace() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() != 0 }
}

/// The user namespace of a run started by a process that is not root (docs/SPEC.md §12
/// "Without root"): its uid and gid map to themselves (never to 0, so no program in the run sees
/// itself as root), `setgroups` is denied (the kernel's condition for an unprivileged gid map),
/// and the capabilities the namespace gives are made ambient so that they survive the `execve`
/// of the sandbox's init (a uid other than 0 loses them at exec otherwise). The init drops them
/// again: the agent with [`drop_credentials`], itself with [`reduce_init`].
///
/// Built before the clone (the maps formatted), entered by the child of a clone with
/// `CLONE_NEWUSER` (or after `unshare(CLONE_NEWUSER)`) with raw system calls only.
#[derive(Clone, Debug)]
pub struct UserNs {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    last_cap: u32,
}

impl UserNs {
    /// The namespace of a run of this process: its effective uid and gid mapped to themselves.
    /// Allocates: call it before any fork.
    pub fn of_this_process() -> UserNs {
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        UserNs {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            last_cap: last_cap(),
        }
    }

    /// In the new user namespace's first process, before it executes anything: made dumpable,
    /// `setgroups` denied, the uid and gid maps written, every capability of the permitted set made
    /// inheritable and ambient. Async-signal-safe (prctl, open, write, close, capget, capset).
    ///
    /// # Errors
    /// The errno of the first failing call; the process must then not exec.
    pub fn enter(&self) -> Result<(), i32> {
        // The daemon is not dumpable (docs/SPEC.md §10), which makes `/proc/self`'s files
        // root's: this process may only write its maps while dumpable. It is a fresh child in
        // namespaces of its own, and the exec that follows makes it dumpable anyway (until the
        // init's `reduce_init`).
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) } != 0 {
            return Err(errno());
        }
        write_proc(c"/proc/self/setgroups", b"deny")?;
        write_proc(c"/proc/self/uid_map", &self.uid_map)?;
        write_proc(c"/proc/self/gid_map", &self.gid_map)?;
        let header = CapHeader {
            version: CAP_V3,
            pid: 0,
        };
        let mut data = [CapData::default(); 2];
        // SAFETY: capget/capset with pointers to locals of the kernel's layout.
        unsafe {
            if libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) != 0 {
                return Err(errno());
            }
            for d in &mut data {
                d.inheritable = d.permitted;
            }
            if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
                return Err(errno());
            }
        }
        for cap in 0..=self.last_cap.min(63) {
            // SAFETY: prctl with integer arguments only.
            let r = unsafe {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_RAISE,
                    libc::c_ulong::from(cap),
                    0,
                    0,
                )
            };
            if r != 0 && errno() != libc::EINVAL {
                return Err(errno());
            }
        }
        Ok(())
    }
}

/// Write `text` to the `/proc` file `path` in one `write`. Async-signal-safe.
fn write_proc(path: &std::ffi::CStr, text: &[u8]) -> Result<(), i32> {
    // SAFETY: a NUL-terminated path; a write of a live buffer of its length; our descriptor.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(errno());
        }
        let n = libc::write(fd, text.as_ptr().cast(), text.len());
        let e = errno();
        libc::close(fd);
        if usize::try_from(n).ok() != Some(text.len()) {
            return Err(if n < 0 { e } else { libc::EIO });
        }
    }
    Ok(())
}

/// The highest capability number the kernel knows (`/proc/sys/kernel/cap_last_cap`; 40 when it
/// cannot be read). Allocates: call it before any fork.
pub fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(40)
        .min(63)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_codes_round_trip_and_say_what() {
        for (i, s) in STAGES.iter().enumerate() {
            assert_eq!(*s as usize, i);
            assert_eq!(Stage::from_code(s.code()), Some(*s));
            assert!(!s.what().is_empty());
        }
        assert_eq!(Stage::from_code(5), None);
        assert_eq!(Stage::from_code(BASE + STAGES.len() as u32), None);
    }

    #[test]
    fn root_is_never_the_target() {
        for userns in [false, true] {
            assert_eq!(drop_credentials(0, 1000, 40, userns), Err(libc::EINVAL));
            assert_eq!(drop_credentials(1000, 0, 40, userns), Err(libc::EINVAL));
            assert_eq!(
                drop_credentials(u32::MAX, 1000, 40, userns),
                Err(libc::EINVAL)
            );
            assert_eq!(
                drop_credentials(1000, u32::MAX, 40, userns),
                Err(libc::EINVAL)
            );
        }
    }
}
