//! Starting processes (PROTOCOL.md §5): an agent run or a user hook, in its own session and
//! process group, bound before it executes anything, with only fds 0–2 open.
//!
//! The child is bound by a pre-exec handshake: between fork and exec it (1) calls `setsid`,
//! (2) restores the daemon's original `RLIMIT_NOFILE`, (3) writes `0` to its smith's
//! `cgroup.procs` if the binder gave one, (4) sends its pid over a pipe and blocks until the
//! parent has called [`RunBinder::bind_pid`] and answers, (5) marks every fd ≥ 3 close-on-exec,
//! (6) only then `chdir`s into the smith dir inside the mount — so even its first FUSE request
//! comes from a bound process (`Command::current_dir` would chdir before `pre_exec`). `std`'s
//! `spawn` blocks until the child has exec'd, so the parent side of the handshake runs on a
//! helper thread.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde::Serialize;

use crate::tree::model::SmithIdx;

/// How runs are bound to their smith; implemented by the identity resolver (PROTOCOL.md §2).
/// Every method is called from the scheduler's threads, never from a FUSE thread.
pub trait RunBinder: Send + Sync {
    /// cgroup mode: `cgroup.procs` of `smith`'s cgroup, opened for writing, so the child can
    /// write `0` into it between fork and exec. `None` in ancestry mode.
    fn cgroup_procs_fd(&self, smith: SmithIdx) -> Option<OwnedFd>;
    /// Register `pid` as bound to `smith` (ancestry mode). Called by the parent while the child
    /// waits in the pre-exec handshake; an error aborts the run before it executes anything.
    fn bind_pid(&self, pid: u32, smith: SmithIdx) -> io::Result<()>;
    /// Register `pid` (a user hook) as the operator (PROTOCOL.md §5: hooks are bound as the
    /// operator). Default: nothing.
    fn bind_operator_pid(&self, _pid: u32) -> io::Result<()> {
        Ok(())
    }
    /// Send `sig` to every process of `smith`'s cgroup (cgroup mode; a no-op in ancestry mode,
    /// where the scheduler signals the process group).
    fn kill_smith(&self, smith: SmithIdx, sig: i32);
    /// `smith`'s cgroup path, for `meta.json` and the journal.
    fn cgroup_path(&self, _smith: SmithIdx) -> Option<String> {
        None
    }
    /// Whether `smith`'s cgroup still has processes (`None`: no cgroup; the process group is
    /// checked instead).
    fn smith_has_processes(&self, _smith: SmithIdx) -> Option<bool> {
        None
    }
}

/// A binder that binds nothing: for tests and for mounts without identity resolution. With it
/// a run is only as contained as its process group: a descendant that calls `setsid` leaves
/// the group and survives a timeout or cancel (the cgroup binder has no such hole).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoBinder;

impl RunBinder for NoBinder {
    fn cgroup_procs_fd(&self, _smith: SmithIdx) -> Option<OwnedFd> {
        None
    }
    fn bind_pid(&self, _pid: u32, _smith: SmithIdx) -> io::Result<()> {
        Ok(())
    }
    fn kill_smith(&self, _smith: SmithIdx, _sig: i32) {}
}

/// Values of the placeholders `{mount} {smith_dir} {task_file} {smith_id} {full_id} {level}`.
#[derive(Clone, Debug, Default)]
pub struct Placeholders {
    /// The mount point.
    pub mount: String,
    /// The smith dir inside the mount (empty for an event of no smith).
    pub smith_dir: String,
    /// The newest `task-*.md`, absolute inside the mount (empty if none).
    pub task_file: String,
    /// The short id.
    pub smith_id: String,
    /// The full id.
    pub full_id: String,
    /// The level.
    pub level: String,
}

impl Placeholders {
    fn get(&self, name: &str) -> Option<&str> {
        Some(match name {
            "mount" => &self.mount,
            "smith_dir" => &self.smith_dir,
            "task_file" => &self.task_file,
            "smith_id" => &self.smith_id,
            "full_id" => &self.full_id,
            "level" => &self.level,
            _ => return None,
        })
    }

    /// Fill the placeholders of `arg`. A placeholder is `{` + `[A-Za-z0-9_]+` + `}` (as in
    /// `config::unknown_placeholder`); any other brace is literal.
    ///
    /// Errors: the first unknown placeholder, as `unknown placeholder {name}`.
    pub fn expand(&self, arg: &str) -> Result<String, String> {
        let mut out = String::with_capacity(arg.len());
        let mut rest = arg;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if len > 0 && after[len..].starts_with('}') {
                let name = &after[..len];
                match self.get(name) {
                    Some(v) => out.push_str(v),
                    None => return Err(format!("unknown placeholder {{{name}}}")),
                }
                rest = &after[len + 1..];
            } else {
                out.push('{');
                rest = after;
            }
        }
        out.push_str(rest);
        Ok(out)
    }

    /// Fill every argument of `argv`.
    pub fn expand_argv(&self, argv: &[String]) -> Result<Vec<String>, String> {
        argv.iter().map(|a| self.expand(a)).collect()
    }
}

/// Whom a started process is bound to.
#[derive(Clone, Copy, Debug)]
pub enum BindTo {
    /// A smith's run.
    Smith(SmithIdx),
    /// The operator (a user hook).
    Operator,
}

/// What to start.
pub struct Launch<'a> {
    /// argv, placeholders filled; never empty.
    pub argv: &'a [String],
    /// Extra environment, applied over the daemon's, in order.
    pub env: &'a BTreeMap<String, String>,
    /// Working directory, entered after binding; `None`: the daemon's.
    pub cwd: Option<&'a Path>,
    /// stdin: `None` = /dev/null, else piped.
    pub stdin_piped: bool,
    /// stdout and stderr (a duplicate goes to stderr); `None` = /dev/null.
    pub output: Option<OwnedFd>,
    /// Whom to bind the child to.
    pub bind: BindTo,
    /// `RLIMIT_NOFILE` to restore in the child, (soft, hard): the limits the daemon started with
    /// before it raised its own; a 0 leaves that one as inherited.
    pub nofile: (u64, u64),
}

/// A started process.
pub struct Started {
    /// The child (its pid is also its process group and session id).
    pub child: Child,
    /// Its pid.
    pub pid: u32,
    /// Its start time in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start_ticks: Option<u64>,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn read_full(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: `buf[got..]` is valid writable memory of the given length.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
            )
        };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
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

/// The start time of `pid` in clock ticks, from `/proc/PID/stat`.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let bytes = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    crate::identity::procfs::parse_stat(&bytes)
        .ok()
        .map(|s| s.starttime)
}

/// Start `l` bound to `l.bind` through `binder` (see the module header for the order of
/// steps). Errors: the spawn error (program not found, a failed pre-exec step) or the
/// binder's; in every error case the child never executed the program.
pub fn launch(l: Launch<'_>, binder: &dyn RunBinder) -> io::Result<Started> {
    let (program, args) = l
        .argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args).envs(l.env);
    cmd.stdin(if l.stdin_piped {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    match l.output {
        Some(fd) => {
            let err = fd.try_clone()?;
            cmd.stdout(Stdio::from(fd)).stderr(Stdio::from(err));
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    let cwd: Option<CString> = match l.cwd {
        Some(p) => Some(
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in cwd"))?,
        ),
        None => None,
    };
    let cgroup_fd: Option<OwnedFd> = match l.bind {
        BindTo::Smith(s) => binder.cgroup_procs_fd(s),
        BindTo::Operator => None,
    };
    let (pid_rd, pid_wr) = pipe()?;
    let (go_rd, go_wr) = pipe()?;
    let raw_cg: RawFd = cgroup_fd.as_ref().map_or(-1, |f| f.as_raw_fd());
    let (raw_pid_rd, raw_pid_wr) = (pid_rd.as_raw_fd(), pid_wr.as_raw_fd());
    let (raw_go_rd, raw_go_wr) = (go_rd.as_raw_fd(), go_wr.as_raw_fd());
    let nofile = l.nofile;
    // SAFETY: the closure only makes async-signal-safe syscalls (setsid, get/setrlimit, write,
    // close, getpid, read, close_range, chdir) on values captured by copy or owned by the
    // closure; it allocates nothing (io::Error from an OS code does not allocate).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            // The run leader adopts its own orphans (the flag survives exec): a double-forked
            // descendant re-parents to a bound process, not to the daemon, so in ancestry mode
            // it stays the smith while the run lives (PROTOCOL.md §2).
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
            let (soft, hard) = nofile;
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
            if raw_cg >= 0 && libc::write(raw_cg, b"0".as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
            // Our copies of the parent's ends: closed, so a dead parent means EOF, not a hang.
            libc::close(raw_pid_rd);
            libc::close(raw_go_wr);
            let pid = libc::getpid().to_ne_bytes();
            if libc::write(raw_pid_wr, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                return Err(io::Error::last_os_error());
            }
            libc::close(raw_pid_wr);
            let mut b = 0u8;
            loop {
                let n = libc::read(raw_go_rd, (&mut b as *mut u8).cast(), 1);
                if n == 1 {
                    break;
                }
                if n == 0 {
                    // The parent did not bind us: never execute anything.
                    return Err(io::Error::from_raw_os_error(libc::EPERM));
                }
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            libc::close(raw_go_rd);
            // Only fds 0–2 survive exec, whatever the daemon's other descriptors are.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if let Some(c) = &cwd {
                if libc::chdir(c.as_ptr()) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let bind = l.bind;
    std::thread::scope(|sc| {
        let spawner = sc.spawn(move || {
            let r = cmd.spawn();
            // The child has its copies (or never forked): ours go, so the reader sees EOF.
            drop(pid_wr);
            drop(go_rd);
            drop(cgroup_fd);
            r
        });
        let mut buf = [0u8; 4];
        let bound = match read_full(pid_rd.as_fd(), &mut buf) {
            Ok(4) => {
                let pid = i32::from_ne_bytes(buf) as u32;
                let r = match bind {
                    BindTo::Smith(s) => binder.bind_pid(pid, s),
                    BindTo::Operator => binder.bind_operator_pid(pid),
                };
                if r.is_ok() {
                    // SAFETY: writing one byte from a valid buffer to a pipe we own.
                    unsafe { libc::write(go_wr.as_raw_fd(), b"g".as_ptr().cast(), 1) };
                }
                r
            }
            Ok(_) => Ok(()), // spawn failed before the handshake; its error is reported below
            Err(e) => Err(e),
        };
        drop(go_wr);
        let spawned = spawner
            .join()
            .map_err(|_| io::Error::other("the spawning thread panicked"))?;
        match (spawned, bound) {
            (Ok(child), Ok(())) => {
                let pid = child.id();
                super::reaper::track(pid);
                Ok(Started {
                    start_ticks: start_ticks(pid),
                    child,
                    pid,
                })
            }
            (Ok(mut child), Err(e)) => {
                // Unreachable in practice: without the go byte the child fails in pre_exec,
                // so spawn reports an error. Reap defensively.
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
            (Err(e), Err(b)) => Err(io::Error::new(e.kind(), format!("{e} (binding: {b})"))),
            (Err(e), Ok(())) => Err(e),
        }
    })
}

/// `conversations/<run-id>/meta.json` (PROTOCOL.md §5).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Meta {
    /// The run id.
    pub run_id: String,
    /// The smith's full id.
    pub smith: String,
    /// argv, placeholders filled (empty if the command could not be built).
    pub command: Vec<String>,
    /// `task`, `children` or `retry`.
    pub wake: String,
    /// The leader's pid (also its process group and session).
    pub pid: Option<u32>,
    /// Its process group.
    pub pgid: Option<i32>,
    /// Its cgroup, if any.
    pub cgroup: Option<String>,
    /// Start, RFC 3339 with microseconds.
    pub start: String,
    /// End; null while live.
    pub end: Option<String>,
    /// Exit status, if it exited normally.
    pub exit_code: Option<i32>,
    /// The signal that killed it, if any.
    pub signal: Option<i32>,
    /// Stopped for running over `timeout_secs`.
    pub timed_out: bool,
    /// Stopped by `cancel`.
    pub cancelled: bool,
    /// Stopped by an unmount or found left over by a dead daemon.
    pub interrupted: bool,
    /// Why it could not start, if it did not.
    pub error: Option<String>,
}

/// The held directories and log of one run.
pub struct RunDir {
    /// `conversations/<run-id>` (`O_PATH`).
    pub dir: OwnedFd,
    /// Its backing inode number.
    pub dir_ino: u64,
    /// `conversations/`'s backing inode number.
    pub conv_ino: u64,
    /// `messages.log`, open for appending.
    pub log: OwnedFd,
    /// Its backing inode number.
    pub log_ino: u64,
}

/// Create `<rel_dir>/conversations/<run_id>/messages.log` in the store (`conversations/` too
/// if missing). Errors: the errno of the failing call (EEXIST if the run dir exists).
pub fn create_run_dir(
    root: BorrowedFd<'_>,
    rel_dir: &Path,
    run_id: &str,
) -> crate::fs::backing::SysResult<RunDir> {
    use crate::fs::backing;
    let smith = backing::open_dir_path(root, rel_dir)?;
    let conv = backing::ensure_dir(smith.as_fd(), c"conversations", 0o755)?;
    let name = backing::component(OsStr::new(run_id))?;
    backing::mkdir(conv.as_fd(), &name, 0o755)?;
    let dir = backing::open_beneath(conv.as_fd(), &name, libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let log = backing::open_file(
        dir.as_fd(),
        c"messages.log",
        libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        0o644,
    )?;
    Ok(RunDir {
        dir_ino: backing::stat(dir.as_fd())?.st_ino,
        conv_ino: backing::stat(conv.as_fd())?.st_ino,
        log_ino: backing::stat(log.as_fd())?.st_ino,
        dir,
        log,
    })
}

/// Write `meta` atomically as `meta.json` in the held run dir.
pub fn write_meta(dir: BorrowedFd<'_>, meta: &Meta) -> crate::fs::backing::SysResult<()> {
    let mut text = serde_json::to_vec_pretty(meta).unwrap_or_default();
    text.push(b'\n');
    crate::fs::backing::write_atomic(dir, c"meta.json", &text, 0o644)
}

/// The absolute path of `rel` inside the mount.
pub fn in_mount(mount: &Path, rel: &str) -> PathBuf {
    mount.join(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_placeholders() {
        let p = Placeholders {
            mount: "/m".into(),
            smith_dir: "/m/smiths/smith-root".into(),
            task_file: "/m/t.md".into(),
            smith_id: "smith-root".into(),
            full_id: "smith-root".into(),
            level: "0".into(),
        };
        let table = [
            ("{mount}/agents/a.sh", Ok("/m/agents/a.sh")),
            ("{smith_id}:{level}", Ok("smith-root:0")),
            ("f() { :; }", Ok("f() { :; }")),
            ("{}{ x}{task_file}", Ok("{}{ x}/m/t.md")),
            ("{{full_id}}", Ok("{smith-root}")),
            ("{nope}", Err("unknown placeholder {nope}")),
            ("tail {", Ok("tail {")),
        ];
        for (arg, want) in table {
            assert_eq!(
                p.expand(arg),
                want.map(String::from).map_err(String::from),
                "{arg}"
            );
        }
    }
}
