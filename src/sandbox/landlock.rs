//! The Landlock domain of every run (docs/SPEC.md §12 "Kernel-enforced layers on top").
//!
//! A second wall, independent of the run's view (mount namespace, read-only binds) and of its
//! uid: whatever those leave open, the domain allows a run to
//!
//! - *write* (create, remove, rename, truncate, write, `ioctl` on devices) only beneath its
//!   writable set: the smithfs mount, the private `/tmp`, `/var/tmp` and `/dev/shm`, the paths of
//!   `sandbox.writable` (directories: every right but making device nodes; `REFER`, so renames
//!   and links within each work), and the device files of the private `/dev` (`null zero full
//!   random urandom tty ptmx` and `pts/`: read, write, truncate, `ioctl`);
//! - *read and execute* everywhere else (the view decides what is there to read);
//! - with ABI 6 and later, neither signal nor connect to an abstract unix socket of a process
//!   outside its domain (`LANDLOCK_SCOPE_SIGNAL`, `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`): the
//!   daemon, the operator's session, another run, a host service;
//! - ptrace, `process_vm_readv`/`writev`, `pidfd_getfd` and `/proc/PID/{mem,fd,environ}` of a
//!   process outside its domain are refused by Landlock itself, at every ABI (ptrace scoping).
//!
//! Landlock ABI 1 cannot allow a rename between directories at all (`REFER` came with ABI 2),
//! which would break atomic renames between a smith's areas: below ABI 2 no domain is made and
//! [`Support::missing`] says so.
//!
//! [`Domain::prepare`] builds the ruleset (it allocates, opens the paths by name in the caller's
//! mount namespace and needs them to exist); [`Domain::restrict_self`] enters it with raw system
//! calls between fork and exec. The `landlock` crate builds the ruleset; entering it is one
//! system call on the ruleset's descriptor, made here so that it stays async-signal-safe.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::process::errno;

use landlock::{
    path_beneath_rules, Access, AccessFs, BitFlags, Ruleset, RulesetAttr, RulesetCreatedAttr,
    Scope, ABI,
};

/// What this kernel's Landlock gives the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Support {
    /// The Landlock ABI version (0: no Landlock: not built in, or not in the LSM list).
    pub abi: i32,
}

impl Support {
    /// The kernel's Landlock (one `landlock_create_ruleset` version query).
    pub fn host() -> Support {
        // SAFETY: the version query takes no pointer (NULL, size 0) and returns an int.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                1u32, // LANDLOCK_CREATE_RULESET_VERSION
            )
        };
        Support {
            abi: i32::try_from(v.max(0)).unwrap_or(0),
        }
    }

    /// Whether runs get a domain that confines writes (ABI 2 and later: see the module header).
    pub fn writes(self) -> bool {
        self.abi >= 2
    }

    /// Whether signals and abstract unix sockets are scoped to the domain (ABI 6 and later).
    pub fn scope(self) -> bool {
        self.abi >= 6
    }

    /// What a run lacks on this kernel, one phrase each (empty: nothing), for `doctor` and the
    /// mount's log.
    pub fn missing(self) -> Vec<&'static str> {
        let mut m = Vec::new();
        match self.abi {
            0 => m.push("no Landlock: writes outside the writable set, signals to and abstract sockets of other processes are stopped by the run's view, uid and pid namespace only"),
            1 => m.push("Landlock ABI 1 cannot allow renames between directories: no domain (writes outside the writable set are stopped by the run's view and uid only)"),
            _ => {}
        }
        if (2..3).contains(&self.abi) {
            m.push("Landlock below ABI 3: truncating a file outside the writable set is not refused by Landlock");
        }
        if (2..5).contains(&self.abi) {
            m.push("Landlock below ABI 5: device ioctls are not refused by Landlock");
        }
        if (1..6).contains(&self.abi) {
            m.push("Landlock below ABI 6: signals and abstract unix sockets are not scoped (the pid namespace stops signals; nothing stops abstract sockets of the host's network namespace unless sandbox.network is \"none\")");
        }
        m
    }
}

/// The device files of the private `/dev` a run may write and `ioctl` (docs/SPEC.md §12).
pub const DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// The terminals among this process's stdin, stdout and stderr, as `/proc/self/fd/N` (opening
/// one follows the link to the terminal itself). Under `smithfs run` from a terminal they are the
/// run's own pty, made outside the view in the host's `/dev/pts`: a rule on exactly that file lets
/// the command reopen its terminal (`/dev/stdin`, `/proc/self/fd/0`) as it could without the
/// sandbox, and nothing else of the host's `/dev/pts`. The scheduler's runs have none (pipes).
fn own_terminals() -> Vec<PathBuf> {
    (0..3)
        // SAFETY: isatty on a descriptor number; a closed one is simply not a terminal.
        .filter(|fd| unsafe { libc::isatty(*fd) } == 1)
        .map(|fd| PathBuf::from(format!("/proc/self/fd/{fd}")))
        .collect()
}

/// The private scratch directories of every run.
pub const SCRATCH: [&str; 3] = ["/tmp", "/var/tmp", "/dev/shm"];

/// Why a domain could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel's Landlock is below ABI 2 (see the module header).
    #[error("Landlock ABI {0} cannot confine writes and keep renames (ABI 2 needed)")]
    Unsupported(i32),
    /// The `landlock` crate refused a step.
    #[error("Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    /// The kernel gave no ruleset descriptor.
    #[error("Landlock ruleset: no descriptor")]
    NoDescriptor,
}

/// A prepared domain: a ruleset descriptor, entered by [`Domain::restrict_self`].
#[derive(Debug)]
pub struct Domain {
    ruleset: OwnedFd,
    /// The ABI the ruleset was made for.
    pub abi: i32,
}

/// The writable set of a run: the smithfs mount `mount`, [`SCRATCH`], `writable` (from
/// `sandbox.writable`) and [`DEVICES`]. Paths that do not exist are left out by
/// [`Domain::prepare`] (and so stay unwritable).
pub fn writable_set(mount: &Path, writable: &[PathBuf]) -> Vec<PathBuf> {
    let mut v = vec![mount.to_path_buf()];
    v.extend(SCRATCH.iter().map(PathBuf::from));
    v.extend(writable.iter().cloned());
    v
}

impl Domain {
    /// The domain whose writable directories are `dirs` (see [`writable_set`]) and whose
    /// devices are [`DEVICES`], on this kernel's ABI, with scoping where the ABI has it.
    ///
    /// # Errors
    /// The ABI is below 2 ([`Error::Unsupported`]), or the kernel refused the ruleset or a rule.
    pub fn prepare(dirs: &[PathBuf]) -> Result<Domain, Error> {
        let support = Support::host();
        if !support.writes() {
            return Err(Error::Unsupported(support.abi));
        }
        let abi = ABI::from(support.abi);
        let all = AccessFs::from_all(abi);
        let dir_rights = all & !(AccessFs::MakeChar | AccessFs::MakeBlock);
        let device_rights: BitFlags<AccessFs> = AccessFs::from_file(abi) & !AccessFs::Execute;
        let mut ruleset = Ruleset::default().handle_access(all)?;
        if support.scope() {
            ruleset = ruleset.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
        }
        let created = ruleset
            .create()?
            .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))?
            .add_rules(path_beneath_rules(dirs, dir_rights))?
            .add_rules(path_beneath_rules(DEVICES, device_rights))?
            .add_rules(path_beneath_rules(own_terminals(), device_rights))?;
        let fd: Option<OwnedFd> = created.into();
        Ok(Domain {
            ruleset: fd.ok_or(Error::NoDescriptor)?,
            abi: support.abi,
        })
    }

    /// Enter the domain: `prctl(PR_SET_NO_NEW_PRIVS)`, then `landlock_restrict_self`. Raw system
    /// calls only (async-signal-safe): for the child between fork and exec, after the view's
    /// mounts (a domain forbids mounting) and before the seccomp filter.
    ///
    /// # Errors
    /// The errno of the call that failed.
    pub fn restrict_self(&self) -> Result<(), i32> {
        // SAFETY: raw system calls on integers.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(errno());
            }
            if libc::syscall(
                libc::SYS_landlock_restrict_self,
                self.ruleset.as_raw_fd(),
                0u32,
            ) != 0
            {
                return Err(errno());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    fn c(p: &Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).expect("no NUL")
    }

    /// Run `probe` in a forked child inside `domain`; the exit code is the probe's result.
    fn under(domain: &Domain, probe: &dyn Fn() -> i32) -> i32 {
        // SAFETY: fork; the child makes raw system calls on memory prepared before the fork and
        // `_exit`s.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                let code = match domain.restrict_self() {
                    Ok(()) => probe(),
                    Err(_) => 200,
                };
                libc::_exit(code);
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            assert!(libc::WIFEXITED(status), "child status {status:#x}");
            libc::WEXITSTATUS(status)
        }
    }

    /// `open(path, O_WRONLY|O_CREAT)`'s errno (0: it opened).
    fn create(path: &CString) -> i32 {
        // SAFETY: a NUL-terminated path; the descriptor is closed at once.
        unsafe {
            let fd = libc::open(
                path.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                0o666,
            );
            if fd < 0 {
                return errno();
            }
            libc::close(fd);
            0
        }
    }

    #[test]
    fn support_names_what_is_missing() {
        assert!(!Support { abi: 0 }.writes());
        assert!(!Support { abi: 1 }.writes());
        assert!(Support { abi: 2 }.writes());
        assert!(!Support { abi: 5 }.scope());
        assert!(Support { abi: 6 }.scope());
        assert!(Support { abi: 7 }.missing().is_empty());
        assert_eq!(Support { abi: 0 }.missing().len(), 1);
        assert!(Support { abi: 5 }.missing()[0].contains("ABI 6"));
        assert_eq!(Support { abi: 2 }.missing().len(), 3);
    }

    #[test]
    fn writes_only_beneath_the_writable_set_reads_everywhere() {
        if !Support::host().writes() {
            eprintln!("no Landlock ABI 2 here: not tried");
            return;
        }
        let inside = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        // World-writable: mode bits allow what Landlock refuses.
        std::fs::set_permissions(
            outside.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .expect("chmod");
        std::fs::write(outside.path().join("readable"), "r").expect("write");
        std::fs::create_dir(inside.path().join("a")).expect("mkdir");
        std::fs::create_dir(inside.path().join("b")).expect("mkdir");
        std::fs::write(inside.path().join("a/f"), "x").expect("write");
        let domain = Domain::prepare(&[inside.path().to_path_buf()]).expect("domain");
        let new_inside = c(&inside.path().join("new"));
        let new_outside = c(&outside.path().join("new"));
        let readable = c(&outside.path().join("readable"));
        let from = c(&inside.path().join("a/f"));
        let to = c(&inside.path().join("b/f"));
        let code = under(&domain, &|| {
            if create(&new_inside) != 0 {
                return 1;
            }
            if create(&new_outside) != libc::EACCES {
                return 2;
            }
            // SAFETY: NUL-terminated paths.
            unsafe {
                let fd = libc::open(readable.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return 3;
                }
                libc::close(fd);
                // A rename between two directories of the writable set (REFER).
                if libc::rename(from.as_ptr(), to.as_ptr()) != 0 {
                    return 4;
                }
                // /dev/null stays writable.
                let fd = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return 5;
                }
                libc::close(fd);
            }
            0
        });
        assert_eq!(code, 0);
        assert!(!outside.path().join("new").exists());
        assert!(inside.path().join("b/f").exists());
    }

    #[test]
    fn signals_and_abstract_sockets_of_other_domains_are_scoped() {
        if !Support::host().scope() {
            eprintln!("no Landlock ABI 6 here: not tried");
            return;
        }
        // An abstract socket this (unconfined) process listens on.
        let name = format!("smithfs-landlock-test-{}", std::process::id());
        // SAFETY: a socket, bound to an abstract address built in a zeroed sockaddr_un.
        let (listener, addr, len) = unsafe {
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(s >= 0);
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (i, b) in name.bytes().enumerate() {
                addr.sun_path[i + 1] = b as libc::c_char;
            }
            let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as u32;
            assert_eq!(
                libc::bind(s, &addr as *const _ as *const libc::sockaddr, len),
                0
            );
            assert_eq!(libc::listen(s, 4), 0);
            (s, addr, len)
        };
        let parent = std::process::id() as libc::pid_t;
        let domain = Domain::prepare(&[]).expect("domain");
        let code = under(&domain, &|| {
            // SAFETY: raw calls on a sockaddr prepared before the fork.
            unsafe {
                let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                if libc::connect(s, &addr as *const _ as *const libc::sockaddr, len) == 0 {
                    return 1;
                }
                if errno() != libc::EPERM {
                    return 2;
                }
                if libc::kill(parent, 0) == 0 || errno() != libc::EPERM {
                    return 3;
                }
                // Its own process: allowed.
                if libc::kill(libc::getpid(), 0) != 0 {
                    return 4;
                }
            }
            0
        });
        // SAFETY: our own descriptor.
        unsafe { libc::close(listener) };
        assert_eq!(code, 0);
    }
}
