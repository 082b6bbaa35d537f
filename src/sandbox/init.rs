//! The sandbox's init (docs/SPEC.md §12): PID 1 of a run's pid namespace. It is the smithfs
//! binary, started as `smithfs __sandbox-init PLAN -- ARGV…` by the spawn (a process born with
//! `CLONE_NEWPID`, bound, that `execve`d `/proc/self/exe`) or by `smithfs run`'s keeper (after
//! `unshare(CLONE_NEWPID)`). In this order, bubblewrap's:
//!
//! 1. a mount namespace of its own, a recursive slave of the host's (nothing propagates back), and an
//!    IPC namespace of its own (no SysV IPC shared with the host or another run);
//! 2. every host path of the view captured as a detached copy (`open_tree(OPEN_TREE_CLONE)`):
//!    the [`super::view::Plan`]'s visible paths (read-only, `nosuid`, `nodev`, recursively, with
//!    `mount_setattr`; `writable` ones read-write), `/sys` (read-only), the devices `null zero
//!    full random urandom tty`, and the smithfs mount;
//! 3. a scratch tmpfs of `tmp_size` over the host's `/tmp` (its directories are the run's
//!    `/tmp`, `/var/tmp` and `/dev/shm`; its passwd and group files are bound over the view's),
//!    and in it the view's root, a tmpfs, holding: a private `/dev` (a tmpfs with the devices, a
//!    new `devpts` instance with `ptmx`, the `fd stdin stdout stderr` symlinks), the captured
//!    paths moved into place (`move_mount`), `/proc` of the new pid namespace with `/proc/sys`
//!    and `/proc/sysrq-trigger` read-only, and last the smithfs mount at its own path (over
//!    whatever is there: the backing store never shows through);
//! 4. `pivot_root` into the view, the old root (the host's tree and the scratch) detached; `/`
//!    and `/dev` made read-only; the kernel-enforced layers prepared in the view
//!    ([`crate::sandbox::layers`]: the Landlock ruleset, the seccomp filter) and, for
//!    `sandbox.network: "none"`, a network namespace with its loopback up;
//! 5. the agent forked: its credentials dropped ([`crate::process::sandbox::drop_credentials`]),
//!    its working directory entered, `USER` `LOGNAME` `TMPDIR` set, its Landlock domain entered
//!    and its seccomp filter installed (the last steps), `execve` with `execvp`'s search;
//! 6. the init keeps only `CAP_KILL`, is not dumpable, closes every descriptor, and supervises:
//!    every signal it can catch is forwarded to the agent, orphans are reaped, and it exits
//!    with the agent's status (`128 + N` when a signal `N` killed it; the agent's wait status
//!    itself first on the spawn's status pipe, fd 4, so the daemon reports the signal) — the
//!    kernel then kills whatever is left in the namespace.
//!
//! A plan whose `removed` names layers (a test knob of the daemon's environment,
//! docs/PROTOCOL-NOTES.md SB14) skips them: without `view`, steps 1–4 (the run sees the host's
//! tree, its `/proc`, `/dev` and `/tmp`; it is still PID 2 of its pid namespace, the agents' uid
//! without capabilities); without `landlock` or `seccomp`, that layer of step 5.
//!
//! A failing step writes `(stage, errno)` on the spawn's error pipe (fd 3) and exits 127, so the
//! run never starts and `spawn_error` names the step; under `smithfs run` it is printed instead.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::unistd::{chdir, pivot_root};

use super::view::{Kind, Plan};
use crate::process::sandbox::{self as psb, Stage, REPORT_FD, STATUS_FD};

/// A failed step: the stage and its errno.
type Failure = (Stage, Errno);

/// The scratch tmpfs, over the host's `/tmp` (its `tmp`, `var-tmp` and `shm` directories are
/// the view's `/tmp`, `/var/tmp` and `/dev/shm`).
const SCRATCH: &str = "/tmp";
/// Where the view is built: a tmpfs in the scratch.
const NEW: &str = "/tmp/.view";

/// The devices of the private `/dev`, bound from the host's.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// The init's entry point: `args` are the arguments after [`psb::INIT_ARG`] (`PLAN -- ARGV…`).
/// Never returns.
pub fn main(args: &[OsString]) -> ! {
    // The view is built with the modes it names; the agent gets the mask the init was started
    // with (the mounter's, or the operator's under `smithfs run`; docs/PROTOCOL-NOTES.md H16).
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    // Before the plan says, fd 3 is the error pipe if it is a pipe (under `smithfs run` it is
    // closed).
    let report = is_pipe(REPORT_FD);
    let status_pipe = is_pipe(STATUS_FD);
    let Some((plan_arg, rest)) = args.split_first() else {
        fail(report, Stage::Plan, Errno::EINVAL);
    };
    let plan = match plan_arg.to_str().map(Plan::parse) {
        Some(Ok(p)) => p,
        _ => fail(report, Stage::Plan, Errno::EINVAL),
    };
    let report = plan.report;
    let argv: Vec<OsString> = match rest.split_first() {
        Some((dashdash, argv)) if dashdash == "--" && !argv.is_empty() => argv.to_vec(),
        _ => fail(report, Stage::Plan, Errno::EINVAL),
    };
    if std::process::id() != 1 {
        fail(report, Stage::PidNamespace, Errno::EINVAL);
    }
    // Without the view (a test knob, docs/PROTOCOL-NOTES.md SB14) the run sees the host's tree.
    if !plan.removed.view {
        if let Err((stage, e)) = build(&plan) {
            fail(report, stage, e);
        }
    }
    // The kernel-enforced layers (docs/SPEC.md §12): prepared here, in the view; the network
    // namespace now, while the init has its capabilities; the rest entered by the agent last.
    let layers = match prepare_layers(&plan) {
        Ok(l) => l,
        Err(e) => fail(report, Stage::Landlock, e),
    };
    if let Err((_, e)) = layers.isolate_network() {
        fail(report, Stage::Network, Errno::from_raw(e));
    }
    // Prepared before the fork: the agent's environment and program candidates.
    let env = agent_env(&plan);
    let prog = argv[0].to_string_lossy().into_owned();
    let (candidates, search) = match crate::process::spawn::candidates(&prog, &env) {
        Ok(c) => c,
        Err(e) => fail_exec(report, e.raw_os_error().unwrap_or(libc::ENOENT)),
    };
    // Every signal blocked from here: the agent empties its mask before exec; the init waits
    // for them with sigwaitinfo.
    let all = nix::sys::signal::SigSet::all();
    if all.thread_block().is_err() {
        fail(report, Stage::Fork, Errno::last());
    }
    // SAFETY: this process is single-threaded (a fresh exec); the child runs ordinary code.
    match unsafe { nix::unistd::fork() } {
        Err(e) => fail(report, Stage::Fork, e),
        Ok(nix::unistd::ForkResult::Child) => {
            nix::sys::stat::umask(umask);
            agent(&plan, &layers, &argv, &env, &candidates, search)
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            if let Err(e) = psb::reduce_init(plan.last_cap) {
                // The agent must not run beside an init that kept root's capabilities.
                let _ = nix::sys::signal::kill(child, nix::sys::signal::SIGKILL);
                fail(report, Stage::InitCapabilities, Errno::from_raw(e));
            }
            // Nothing of the init's stays open but the status pipe: the agent's exec then closes
            // the error pipe's last writer.
            // SAFETY: close_range on our own descriptor table.
            unsafe {
                if status_pipe {
                    libc::syscall(libc::SYS_close_range, 0u32, (STATUS_FD - 1) as u32, 0u32);
                    libc::syscall(
                        libc::SYS_close_range,
                        (STATUS_FD + 1) as u32,
                        u32::MAX,
                        0u32,
                    );
                } else {
                    libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
                }
            }
            supervise(child.as_raw(), status_pipe)
        }
    }
}

/// The run's Landlock domain and seccomp filter ([`crate::sandbox::layers`]), for the view the
/// init has just entered: writable beneath the mount, the private scratch directories and the
/// plan's writable paths.
fn prepare_layers(plan: &Plan) -> Result<crate::sandbox::layers::Layers, Errno> {
    let writable: Vec<PathBuf> = plan
        .visible
        .iter()
        .filter(|v| v.writable)
        .map(|v| v.path.clone())
        .collect();
    crate::sandbox::layers::Layers::prepare(plan.layers, plan.removed, &plan.mount, &writable)
        .map_err(|e| {
            eprintln!("smithfs sandbox: {e}");
            Errno::EINVAL
        })
}

/// Whether `fd` is an open pipe.
fn is_pipe(fd: i32) -> bool {
    // SAFETY: fstat into a zeroed stat; an invalid fd fails with EBADF.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO
    }
}

/// Report `(stage, errno)` and exit 127: on the error pipe, or on stderr under `smithfs run`.
fn fail(report: bool, stage: Stage, e: Errno) -> ! {
    say(report, stage.code(), stage.what(), e as i32)
}

/// Report the agent's exec failure as the spawn's own exec step (its errno as is).
fn fail_exec(report: bool, e: i32) -> ! {
    say(report, 5, "exec", e)
}

fn say(report: bool, code: u32, what: &str, e: i32) -> ! {
    if report {
        let (s, n) = (code.to_ne_bytes(), e.to_ne_bytes());
        let msg = [s[0], s[1], s[2], s[3], n[0], n[1], n[2], n[3]];
        // SAFETY: a write of a stack buffer to the error pipe.
        unsafe { libc::write(REPORT_FD, msg.as_ptr().cast(), msg.len()) };
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "smithfs: {what}: {}",
            std::io::Error::from_raw_os_error(e)
        );
    }
    // SAFETY: _exit never returns.
    unsafe {
        libc::_exit(if code == 5 && e == libc::ENOENT {
            127
        } else {
            126
        })
    }
}

/// `path` below `root` (`/a/b` under `/newroot` is `/newroot/a/b`).
fn under(root: &str, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    Path::new(root).join(rel)
}

fn errno_of(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// `mkdir -p` with mode 0755 (root's, in the view's tmpfs).
fn mkdirs(p: &Path, stage: Stage) -> Result<(), Failure> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(p)
        .map_err(|e| (stage, errno_of(e)))
}

/// An empty file at `p` (a mount point for a file bind), its parents made.
fn touch(p: &Path, stage: Stage) -> Result<(), Failure> {
    if let Some(parent) = p.parent() {
        mkdirs(parent, stage)?;
    }
    if std::fs::symlink_metadata(p).is_ok() {
        return Ok(());
    }
    std::fs::File::create(p)
        .map(drop)
        .map_err(|e| (stage, errno_of(e)))
}

fn bind(src: &Path, dst: &Path, recursive: bool, stage: Stage) -> Result<(), Failure> {
    let flags = if recursive {
        MsFlags::MS_BIND | MsFlags::MS_REC
    } else {
        MsFlags::MS_BIND
    };
    mount(Some(src), dst, None::<&str>, flags, None::<&str>).map_err(|e| (stage, e))
}

/// `mount_setattr(path, attrs)`, recursively or not.
fn set_attr(path: &Path, attrs: u64, recursive: bool) -> Result<(), Failure> {
    let c =
        CString::new(path.as_os_str().as_bytes()).map_err(|_| (Stage::ReadOnly, Errno::EINVAL))?;
    let attr = libc::mount_attr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: a NUL-terminated path and a mount_attr of the size passed, both live.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r != 0 {
        return Err((Stage::ReadOnly, Errno::last()));
    }
    Ok(())
}

const RO: u64 = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
const RW: u64 = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;

fn tmpfs(dst: &Path, data: &str, stage: Stage) -> Result<(), Failure> {
    mount(
        Some("tmpfs"),
        dst,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data),
    )
    .map_err(|e| (stage, e))
}

/// `open_tree(path, OPEN_TREE_CLONE)`: a detached copy of the mount at `path` (with the mounts
/// below it when `recursive`), to be moved into the view with [`move_into`].
fn clone_tree(path: &Path, recursive: bool, stage: Stage) -> Result<OwnedFd, Failure> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| (stage, Errno::EINVAL))?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: a NUL-terminated path; the kernel returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err((stage, Errno::last()));
    }
    let fd = i32::try_from(fd).map_err(|_| (stage, Errno::EBADF))?;
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `mount_setattr` on a detached tree (`AT_EMPTY_PATH`).
fn set_attr_fd(fd: &OwnedFd, attrs: u64, recursive: bool, stage: Stage) -> Result<(), Failure> {
    let attr = libc::mount_attr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH;
    if recursive {
        flags |= libc::AT_RECURSIVE;
    }
    // SAFETY: an empty NUL-terminated path, our descriptor and a mount_attr of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r != 0 {
        return Err((stage, Errno::last()));
    }
    Ok(())
}

/// `move_mount` of the detached tree `fd` onto `dst`.
fn move_into(fd: OwnedFd, dst: &Path, stage: Stage) -> Result<(), Failure> {
    let c = CString::new(dst.as_os_str().as_bytes()).map_err(|_| (stage, Errno::EINVAL))?;
    // SAFETY: our descriptor, an empty and a NUL-terminated path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err((stage, Errno::last()));
    }
    Ok(())
}

/// A host path captured before anything is mounted over the host's tree, and where it goes.
struct Captured {
    fd: OwnedFd,
    dst: PathBuf,
    file: bool,
    stage: Stage,
}

/// Build the view (steps 1–4 of the module header). Every host path of the view is captured
/// first as a detached copy (`open_tree`), so the tmpfs mounted over the host's `/tmp` next
/// hides nothing the view needs; one `pivot_root` and one detach end it (each namespace change
/// costs a grace period of RCU on a busy host: docs/PERFORMANCE.md "Run start").
fn build(plan: &Plan) -> Result<(), Failure> {
    use nix::sched::{unshare, CloneFlags};
    let ns = Stage::MountNamespace;
    // With an IPC namespace of its own: the host's SysV shared memory, semaphores and message
    // queues (and every other run's) are out of reach, and what the run makes ends with it
    // (notes XT25).
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWIPC).map_err(|e| (ns, e))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_SLAVE | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| (ns, e))?;

    // The host paths, captured.
    let mut captured = Vec::new();
    for v in &plan.visible {
        if matches!(v.kind, Kind::Symlink(_)) {
            continue;
        }
        let fd = clone_tree(&v.path, true, Stage::Bind)?;
        set_attr_fd(&fd, if v.writable { RW } else { RO }, true, Stage::ReadOnly)?;
        captured.push(Captured {
            fd,
            dst: under(NEW, &v.path),
            file: v.kind == Kind::File,
            stage: Stage::Bind,
        });
    }
    let sys = clone_tree(Path::new("/sys"), true, Stage::Sys)?;
    set_attr_fd(&sys, RO | libc::MOUNT_ATTR_NOEXEC, true, Stage::Sys)?;
    captured.push(Captured {
        fd: sys,
        dst: under(NEW, Path::new("/sys")),
        file: false,
        stage: Stage::Sys,
    });
    for n in DEVICES {
        captured.push(Captured {
            fd: clone_tree(&Path::new("/dev").join(n), false, Stage::Dev)?,
            dst: under(NEW, &Path::new("/dev").join(n)),
            file: true,
            stage: Stage::Dev,
        });
    }
    let the_mount = clone_tree(&plan.mount, false, Stage::Mount)?;
    let host = |name: &str| std::fs::read_to_string(Path::new("/etc").join(name));
    let host_passwd = host("passwd").unwrap_or_default();
    let host_group = host("group").unwrap_or_default();

    // 2. The scratch tmpfs over the host's /tmp (tmp_size: the run's /tmp, /var/tmp, /dev/shm,
    // and its passwd and group files), the view's root in it.
    let t = Stage::Tmp;
    tmpfs(
        Path::new(SCRATCH),
        &format!("mode=0755,size={}", plan.tmp_size.max(4096)),
        t,
    )?;
    let nr = Stage::NewRoot;
    mkdirs(Path::new(NEW), nr)?;
    tmpfs(Path::new(NEW), "mode=0755", nr)?;

    // 3. The private /dev.
    let dev = under(NEW, Path::new("/dev"));
    let d = Stage::Dev;
    mkdirs(&dev, d)?;
    mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(|e| (d, e))?;
    let pts = dev.join("pts");
    mkdirs(&pts, d)?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=620"),
    )
    .map_err(|e| (d, e))?;
    for (name, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(name)).map_err(|e| (d, errno_of(e)))?;
    }
    mkdirs(&dev.join("shm"), d)?;

    // /tmp, /var/tmp, /dev/shm: directories of the scratch tmpfs (first: a visible path under
    // /tmp shows on top).
    for (dir, target) in [
        ("tmp", "/tmp"),
        ("var-tmp", "/var/tmp"),
        ("shm", "/dev/shm"),
    ] {
        let src = Path::new(SCRATCH).join(dir);
        mkdirs(&src, t)?;
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o1777))
            .map_err(|e| (t, errno_of(e)))?;
        let dst = under(NEW, Path::new(target));
        mkdirs(&dst, t)?;
        bind(&src, &dst, false, t)?;
    }

    // The system symlinks, then the captured host paths.
    for v in &plan.visible {
        if let Kind::Symlink(target) = &v.kind {
            let dst = under(NEW, &v.path);
            if let Some(parent) = dst.parent() {
                mkdirs(parent, Stage::Bind)?;
            }
            std::os::unix::fs::symlink(target, &dst).map_err(|e| (Stage::Bind, errno_of(e)))?;
        }
    }
    for c in captured {
        if c.file {
            touch(&c.dst, c.stage)?;
        } else {
            mkdirs(&c.dst, c.stage)?;
        }
        move_into(c.fd, &c.dst, c.stage)?;
    }

    // /proc of the new pid namespace; /proc/sys and /proc/sysrq-trigger read-only.
    let proc_ = under(NEW, Path::new("/proc"));
    mkdirs(&proc_, Stage::Proc)?;
    mount(
        Some("proc"),
        &proc_,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| (Stage::Proc, e))?;
    for p in ["sys", "sysrq-trigger"] {
        let p = proc_.join(p);
        match bind(&p, &p, true, Stage::Proc) {
            Ok(()) => set_attr(&p, RO, true).map_err(|(_, e)| (Stage::Proc, e))?,
            Err((_, Errno::ENOENT)) => {}
            Err(e) => return Err(e),
        }
    }

    // The passwd and group files (on the scratch tmpfs, root's, read-only binds).
    let home = home_in_view(plan);
    let pw = Stage::Passwd;
    for (name, text) in [
        ("passwd", super::view::passwd(plan, &home, &host_passwd)),
        ("group", super::view::group(plan, &host_group)),
    ] {
        let src = Path::new(SCRATCH).join(name);
        std::fs::write(&src, text).map_err(|e| (pw, errno_of(e)))?;
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| (pw, errno_of(e)))?;
        let dst = under(NEW, &Path::new("/etc").join(name));
        if std::fs::symlink_metadata(&dst).is_err() {
            // No /etc in the view: nothing to cover.
            continue;
        }
        bind(&src, &dst, false, pw)?;
        set_attr(&dst, RO, false).map_err(|(_, e)| (pw, e))?;
    }

    // The smithfs mount, at its own path, last.
    let m = Stage::Mount;
    let dst = under(NEW, &plan.mount);
    if std::fs::symlink_metadata(&dst).is_err() {
        mkdirs(&dst, m)?;
    }
    move_into(the_mount, &dst, m)?;

    // 4. Into the view: the old root (the host's tree and the scratch) stacked on the new one
    // and detached.
    let p = Stage::Pivot;
    chdir(NEW).map_err(|e| (p, e))?;
    pivot_root(".", ".").map_err(|e| (p, e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| (p, e))?;
    chdir("/").map_err(|e| (p, e))?;
    set_attr(Path::new("/"), RO, false).map_err(|(_, e)| (p, e))?;
    set_attr(Path::new("/dev"), libc::MOUNT_ATTR_RDONLY, false).map_err(|(_, e)| (p, e))?;
    Ok(())
}

/// The agent's home in the view's passwd: its `HOME` when that is inside the mount (the
/// smith's `home/`), else `/tmp`.
fn home_in_view(plan: &Plan) -> PathBuf {
    inherited_env()
        .remove(OsStr::new("HOME"))
        .map(PathBuf::from)
        .filter(|h| h.starts_with(&plan.mount))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// The run's environment as the init got it: encoded, so that no variable of it acted on the
/// init while it had privileges (`process::spawn::AGENT_ENV_PREFIX`, notes XT21); a variable
/// of the init's that is not encoded is not the run's and is dropped.
fn inherited_env() -> BTreeMap<OsString, OsString> {
    crate::process::spawn::decode_env(std::env::vars_os(), true)
}

/// The agent's environment: the run's (as the daemon built it, [`inherited_env`]) with `USER`,
/// `LOGNAME`, `TMPDIR=/tmp`, and `HOME` when the inherited one is not in the view.
fn agent_env(plan: &Plan) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = inherited_env()
        .into_iter()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    env.insert("USER".into(), plan.user.clone());
    env.insert("LOGNAME".into(), plan.user.clone());
    env.insert("TMPDIR".into(), "/tmp".into());
    let home_ok = env
        .get("HOME")
        .is_some_and(|h| Path::new(h).starts_with(&plan.mount));
    if !home_ok {
        env.insert(
            "HOME".into(),
            home_in_view(plan).to_string_lossy().into_owned(),
        );
    }
    env
}

/// The agent (PID 2): credentials dropped, working directory entered, its program executed.
/// Never returns.
fn agent(
    plan: &Plan,
    layers: &crate::sandbox::layers::Layers,
    argv: &[OsString],
    env: &BTreeMap<String, String>,
    candidates: &[CString],
    search: bool,
) -> ! {
    let report = plan.report;
    if let Err(e) = psb::drop_credentials(plan.uid, plan.gid, plan.last_cap, plan.user_namespace) {
        fail(report, Stage::Credentials, Errno::from_raw(e));
    }
    if let Err(e) = psb::new_session() {
        fail(report, Stage::Session, Errno::from_raw(e));
    }
    let dirs = [plan.cwd.as_deref(), plan.fallback_cwd.as_deref()];
    let mut entered = Err(Errno::ENOENT);
    for d in dirs.into_iter().flatten() {
        entered = chdir(d);
        if entered.is_ok() {
            break;
        }
    }
    if plan.cwd.is_none() && plan.fallback_cwd.is_none() {
        entered = chdir("/");
    }
    if let Err(e) = entered {
        fail(report, Stage::Chdir, e);
    }
    let cargs: Vec<CString> = argv
        .iter()
        .filter_map(|a| CString::new(a.clone().into_vec()).ok())
        .collect();
    let cenv: Vec<CString> = env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let mut argp: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    argp.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = cenv.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());
    let mut sh: Vec<*const libc::c_char> = vec![c"/bin/sh".as_ptr(), std::ptr::null()];
    sh.extend(cargs.iter().skip(1).map(|c| c.as_ptr()));
    sh.push(std::ptr::null());
    // Last before exec: the Landlock domain, then the seccomp filter (docs/SPEC.md §12).
    if let Err((failed, e)) = layers.enter() {
        let stage = match failed {
            crate::sandbox::layers::Failed::Seccomp => Stage::Seccomp,
            _ => Stage::Landlock,
        };
        fail(report, stage, Errno::from_raw(e));
    }
    // SAFETY: (the block) fcntl on our descriptor; the signal mask reset; execve with
    // NULL-terminated arrays of NUL-terminated strings that outlive the calls.
    unsafe {
        if report {
            libc::fcntl(REPORT_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        // The status pipe is the init's (a no-op without one).
        libc::fcntl(STATUS_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let mut eacces = false;
        let mut last = libc::ENOENT;
        for c in candidates {
            libc::execve(c.as_ptr(), argp.as_ptr(), envp.as_ptr());
            last = *libc::__errno_location();
            match last {
                libc::ENOEXEC => {
                    sh[1] = c.as_ptr();
                    libc::execve(c"/bin/sh".as_ptr(), sh.as_ptr(), envp.as_ptr());
                    fail_exec(report, libc::ENOEXEC);
                }
                libc::EACCES if search => eacces = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT
                    if search => {}
                _ => break,
            }
        }
        fail_exec(report, if eacces { libc::EACCES } else { last })
    }
}

/// PID 1's loop: every signal but `SIGCHLD` forwarded to the agent; children reaped; exit with
/// the agent's status once it is gone: its wait status first on [`STATUS_FD`] when
/// `status_pipe` (the spawn then reports a signal as a signal), and `128 + N` as the init's own
/// exit code for a signal `N` (PID 1 cannot die of a signal it sends itself). Never returns.
fn supervise(agent: libc::pid_t, status_pipe: bool) -> ! {
    loop {
        // SAFETY: sigwaitinfo with a full set (every signal is blocked) and a zeroed siginfo.
        let sig = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigwaitinfo(&set, &mut info)
        };
        if sig < 0 {
            continue;
        }
        if sig != libc::SIGCHLD {
            // SAFETY: kill of our own child (a zombie at worst: not yet reaped).
            unsafe { libc::kill(agent, sig) };
            continue;
        }
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes one int.
            let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if r <= 0 {
                break;
            }
            if r == agent {
                if status_pipe {
                    let raw = status.to_ne_bytes();
                    // SAFETY: a write of 4 bytes from a local to our pipe (atomic: < PIPE_BUF).
                    unsafe { libc::write(STATUS_FD, raw.as_ptr().cast(), raw.len()) };
                }
                let code = crate::process::keeper::exit_code(status);
                // SAFETY: _exit never returns; the kernel kills the rest of the namespace.
                unsafe { libc::_exit(i32::from(code)) }
            }
        }
    }
}
