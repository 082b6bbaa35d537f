//! The sandbox every run of a smith starts in (docs/SPEC.md §12).
//!
//! - `user.rs`: the agents' user — the unprivileged uid and gid runs execute as, resolved once
//!   at mount (`sandbox.uid`, `SUDO_UID`, or one smithfs allocates and records), the per-smith
//!   uids of `sandbox.uid_per_smith`, and the passwd/group entries of a run's view.
//! - `view.rs`: the plan of a run's view, computed where the run is started (the daemon,
//!   `smithfs run`) from the mount-wide config: which host paths are visible, which writable,
//!   the uid and gid;
//! - `init.rs`: the pid-1 init that builds the view from the plan (mount namespace, tmpfs root,
//!   binds, private `/dev`, `/proc`, `/tmp`, `pivot_root`), forks the agent with its credentials
//!   dropped ([`crate::process::sandbox`]), forwards signals to it and exits with its status.
//! - `layers.rs`: the kernel-enforced layers together: what the host offers (`doctor`, the
//!   mount's `sandbox.require` check) and one run's prepared network namespace, Landlock domain
//!   and seccomp filter.
//! - `network.rs`: `sandbox.network: "none"`, a network namespace with loopback only.
//! - `landlock.rs`: the Landlock domain of every run (writes only beneath its writable set,
//!   signals and abstract unix sockets scoped), prepared before the fork, entered in the child.
//! - `seccomp.rs`: the seccomp filter of every run (a classic BPF program built before the fork,
//!   installed as the last step before `execve`).
//! - `tree.rs`: `home/` seeded from `templates/home/` (at scaffold and, for trees made before,
//!   at mount) and the ownership of smith dirs by the agents' user.
//! - `env.rs`: `HOME`, `XDG_*`, the CLIs' variables, `TMPDIR`, `USER` of a run.
//! - `secrets.rs`: `agent.secrets_file`, read at mount, and the masker of `messages.log`.
//!
//! [`crate::process::spawn`] starts the init between clone and exec; `smithfs run --smith`
//! through its keeper. Hooks never run in it (they are the operator's programs).
//!
//! May import `backing`, `config`, `process` and `tree::model` (types only).

pub mod env;
pub mod init;
pub mod landlock;
pub mod layers;
pub mod network;
pub mod seccomp;
pub mod secrets;
pub mod tree;
pub mod user;
pub mod view;

pub use secrets::Secrets;
pub use user::{AgentUser, HostFiles, UserError, UserSource};

use crate::config::{SandboxConfig, SandboxUid};

/// The uid "nobody": the agents' uid when neither `sandbox.uid` nor `SUDO_UID` names one.
pub const NOBODY: u32 = 65534;

/// Whether runs of a mount with `cfg` start in the sandbox: `sandbox.enabled` (docs/SPEC.md §12,
/// on by default; `smithfs init --no-sandbox` writes it false).
pub fn applies(cfg: &SandboxConfig) -> bool {
    cfg.enabled
}

/// The agents' uid and gid (docs/SPEC.md §12 "Users") until the daemon hands the view the
/// [`AgentUser`] it resolved at mount: this process's own when it is not root (as
/// [`AgentUser::resolve`] decides), else `sandbox.uid` (gid: the same number), else
/// `SUDO_UID`/`SUDO_GID` of this process (the daemon inherits them from `sudo smithfs mount`),
/// else [`NOBODY`]. Never 0 (`sandbox.uid: 0` is refused by the config; a `SUDO_UID` of 0 counts
/// as unset). The one place the view asks.
pub fn agents_ids(cfg: &SandboxConfig) -> (u32, u32) {
    if crate::process::sandbox::needs_user_namespace() {
        // A process that is not root runs agents as itself (docs/SPEC.md §12 "Without root").
        // SAFETY: geteuid/getegid have no preconditions.
        return unsafe { (libc::geteuid(), libc::getegid()) };
    }
    let env = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|n| *n != 0)
    };
    match cfg.uid {
        SandboxUid::Uid(n) if n != 0 => (n, n),
        _ => match env("SUDO_UID") {
            Some(uid) => (uid, env("SUDO_GID").unwrap_or(uid)),
            None => (NOBODY, NOBODY),
        },
    }
}

/// What this host gives the sandbox (docs/SPEC.md §12: `doctor` says it, `mount` refuses a
/// sandbox it cannot build): `Ok` with a sentence (the namespaces and the agents' uid), or the
/// one-line reason it cannot be built — the kernel refuses a mount or pid namespace to root, or
/// (a process that is not root, §12 "Without root") a user namespace, or a `/proc` of a new pid
/// namespace inside it.
///
/// # Errors
/// The reason, one line.
pub fn probe(cfg: &SandboxConfig) -> Result<String, String> {
    let userns = crate::process::sandbox::needs_user_namespace();
    let ns = userns.then(crate::process::sandbox::UserNs::of_this_process);
    // SAFETY: fork; the child makes raw system calls only (unshare, open, write, capget, capset,
    // prctl, mount, fork, waitpid, _exit), async-signal-safe.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: as above.
        unsafe { libc::_exit(probe_child(ns.as_ref())) }
    }
    let code = wait_code(pid)?;
    if code != 0 {
        let err = std::io::Error::from_raw_os_error(code & 0x7f);
        return Err(match (userns, code & 0x80) {
            (false, _) => format!("the kernel refuses a mount and pid namespace: {err}"),
            (true, 0) => format!(
                "the daemon is not root and the kernel refuses it a user namespace ({err}): \
                 allow unprivileged user namespaces (sysctl user.max_user_namespaces, \
                 kernel.unprivileged_userns_clone, kernel.apparmor_restrict_unprivileged_userns) \
                 or mount as root"
            ),
            (true, _) => format!(
                "the daemon is not root and the kernel refuses /proc of a pid namespace in its \
                 user namespace ({err}; a /proc partly covered, as in some containers?): mount \
                 as root"
            ),
        });
    }
    let (uid, gid) = agents_ids(cfg);
    let sudo = std::env::var("SUDO_UID")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_some_and(|n| n != 0);
    Ok(if userns {
        format!(
            "a user namespace per run (uid {uid} and gid {gid} mapped to themselves), mount and pid namespaces in it; runs as uid {uid}, no capability"
        )
    } else if cfg.uid == SandboxUid::Auto && !sudo {
        // What `AgentUser::resolve` does at mount: a uid of its own for each tree.
        format!(
            "mount and pid namespaces; runs as a uid allocated for each tree at its first mount (from {}, recorded in {}; set sandbox.uid to choose one), no capability",
            user::AUTO_FIRST,
            user::HOST_REGISTRY
        )
    } else {
        format!("mount and pid namespaces; runs as uid {uid}, gid {gid}, no capability")
    })
}

/// The probe's child: the namespaces a run gets (with `ns`, a user namespace first, and its
/// maps), then, as PID 1 of the new pid namespace, a `/proc` of it mounted (in its own mount
/// namespace: the host sees nothing). Returns 0, or the errno (below 128), plus 128 when the
/// namespaces were made and `/proc` was refused. Raw system calls only.
fn probe_child(ns: Option<&crate::process::sandbox::UserNs>) -> i32 {
    let errno = crate::process::errno;
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID;
    if ns.is_some() {
        flags |= libc::CLONE_NEWUSER;
    }
    // SAFETY: unshare takes integers.
    if unsafe { libc::unshare(flags) } != 0 {
        return errno().clamp(1, 127);
    }
    if let Some(ns) = ns {
        if let Err(e) = ns.enter() {
            return e.clamp(1, 127);
        }
    }
    // SAFETY: fork of this single-threaded child; the grandchild makes raw calls only.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return errno().clamp(1, 127);
    }
    if pid == 0 {
        // SAFETY: mount with NUL-terminated literals; _exit never returns.
        unsafe {
            let slave = libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_SLAVE | libc::MS_REC,
                std::ptr::null(),
            );
            let r = if slave == 0 {
                libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                )
            } else {
                slave
            };
            libc::_exit(if r == 0 { 0 } else { errno().clamp(1, 127) })
        }
    }
    let mut status = 0;
    // SAFETY: waitpid on our own child into a local.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        if errno() != libc::EINTR {
            return libc::ECHILD;
        }
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        0
    } else if libc::WIFEXITED(status) {
        128 | libc::WEXITSTATUS(status)
    } else {
        128 | libc::EIO
    }
}

/// Wait for the probe's child `pid`: its exit code (`EIO` when a signal ended it).
fn wait_code(pid: libc::pid_t) -> Result<i32, String> {
    let mut status = 0;
    // SAFETY: waitpid on our own child into a local.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err("waitpid failed".into());
        }
    }
    Ok(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        libc::EIO
    })
}
