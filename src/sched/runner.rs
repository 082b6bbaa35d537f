//! Starting processes (docs/SPEC.md §5): an agent run or a user hook, in its own session and
//! process group, bound before it executes anything, with only fds 0–2 open.
//!
//! Binding: in cgroup mode the child is created directly in its cgroup (the smith's for a run,
//! the operator's for a hook) by `clone3(CLONE_INTO_CGROUP)` ([`crate::process::spawn`]), so it is bound
//! from its first instruction with no handshake. Otherwise (ancestry mode, or the kernel
//! refused the clone into the cgroup) the child waits between clone and exec until the parent
//! has called [`RunBinder::bind_pid`] (or [`RunBinder::bind_operator_pid`]) and answers. Either
//! way it `chdir`s into its working directory inside the mount only after that, just before
//! exec — so even its first FUSE request comes from a bound process.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::backing::BackingIno;
use crate::process::spawn::{self, Process, Program, Spawn};
use crate::tree::model::SmithIdx;

/// How runs are bound to their smith; implemented by the identity resolver (docs/SPEC.md §2).
/// Every method is called from the scheduler's threads, never from a FUSE thread.
pub trait RunBinder: Send + Sync {
    /// cgroup mode: a descriptor of the cgroup directory that processes bound as `to` are
    /// created in (`clone3(CLONE_INTO_CGROUP)`): `smith`'s cgroup for a run, the operator's for
    /// a hook. `None` in ancestry mode (then [`RunBinder::bind_pid`] binds).
    fn cgroup_dir(&self, to: BindTo) -> Option<OwnedFd>;
    /// Bind `pid` to `smith`: called by the parent while the child waits before exec, when the
    /// child was not created in a cgroup from [`RunBinder::cgroup_dir`] (ancestry mode
    /// registers it; cgroup mode, if `clone3` refused the cgroup, moves it in). An error
    /// aborts the run before it executes anything.
    fn bind_pid(&self, pid: u32, smith: SmithIdx) -> io::Result<()>;
    /// Bind `pid` (a user hook) as the operator (docs/SPEC.md §5: hooks are bound as the
    /// operator), on the same terms as [`RunBinder::bind_pid`]. Default: nothing.
    fn bind_operator_pid(&self, _pid: u32) -> io::Result<()> {
        Ok(())
    }
    /// Whether a process bound as `to` must also be placed by [`RunBinder::place_pid`] before
    /// it executes anything (cgroup limits on cgroup v1, docs/SPEC.md §5). Default: no.
    fn needs_placing(&self, _to: BindTo) -> bool {
        false
    }
    /// Place `pid`, a run of `smith`, in its v1 limit cgroups; called while the child waits
    /// before exec (after [`RunBinder::bind_pid`] if that was called). An error aborts the run.
    fn place_pid(&self, _pid: u32, _smith: SmithIdx) -> io::Result<()> {
        Ok(())
    }
    /// The oom-kill counter of `smith`'s own cgroup (`None`: no memory limit), read at a run's
    /// start and end to tell a run the memory limit killed (docs/SPEC.md §5 `reason: oom`).
    fn oom_kills(&self, _smith: SmithIdx) -> Option<u64> {
        None
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
    fn cgroup_dir(&self, _to: BindTo) -> Option<OwnedFd> {
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

    /// Fill the placeholders of `arg` ([`crate::config::fill_placeholders`]: `{` +
    /// `[A-Za-z0-9_]+` + `}`; any other brace is literal).
    ///
    /// Errors: the first unknown placeholder, as `unknown placeholder {name}`.
    pub fn expand(&self, arg: &str) -> Result<String, String> {
        crate::config::fill_placeholders(arg, |name| self.get(name))
            .map_err(|name| format!("unknown placeholder {{{name}}}"))
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

/// What to start, and whom it is bound to.
pub struct Launch<'a> {
    /// The program, its environment, working directory (entered after binding; `None`: the
    /// daemon's), streams, `RLIMIT_NOFILE` and confinement (runs of a root daemon,
    /// docs/PROTOCOL-NOTES.md H13; `None` for hooks and a non-root daemon).
    pub program: Program<'a>,
    /// Whom to bind the child to.
    pub bind: BindTo,
    /// Start it in the sandbox of this plan (docs/SPEC.md §12; `program.cwd` is entered inside
    /// it, and `program.confine` is not used); `None`: no sandbox (hooks; `sandbox.enabled:
    /// false`).
    pub sandbox: Option<&'a crate::sandbox::view::Plan>,
}

/// A started process.
pub struct Started {
    /// The child (its pid is also its process group and session id).
    pub child: Process,
    /// Its pid.
    pub pid: u32,
    /// Its start time in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start_ticks: Option<u64>,
}

/// The start time of `pid` in clock ticks, from `/proc/PID/stat`.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let bytes = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    crate::sys::procfs::parse_stat(&bytes)
        .ok()
        .map(|s| s.starttime)
}

/// Start `l` bound to `l.bind` through `binder` (see the module header). Returns once the
/// program runs.
///
/// Errors: the spawn error (program not found, a failed step before exec) or the binder's; in
/// every error case the child never executed the program.
pub fn launch(l: Launch<'_>, binder: &dyn RunBinder) -> io::Result<Started> {
    let cgroup = binder.cgroup_dir(l.bind);
    let bind_to = l.bind;
    let mut bind = |pid: u32| match bind_to {
        BindTo::Smith(s) => binder.bind_pid(pid, s),
        BindTo::Operator => binder.bind_operator_pid(pid),
    };
    let mut place = |pid: u32| match bind_to {
        BindTo::Smith(s) => binder.place_pid(pid, s),
        BindTo::Operator => Ok(()),
    };
    let init_args = l.sandbox.map(|plan| {
        let mut plan = plan.clone();
        plan.cwd = l.program.cwd.map(Path::to_path_buf);
        plan.report = true;
        plan.init_args()
    });
    let child = spawn::spawn(Spawn {
        program: l.program,
        cgroup: cgroup.as_ref().map(|c| c.as_fd()),
        sandbox: init_args.as_deref(),
        bind: &mut bind,
        place: binder
            .needs_placing(bind_to)
            .then_some(&mut place as &mut dyn FnMut(u32) -> io::Result<()>),
    })?;
    let pid = child.id();
    Ok(Started {
        start_ticks: start_ticks(pid),
        child,
        pid,
    })
}

/// `conversations/<run-id>/meta.json` (docs/SPEC.md §5).
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
    /// Processes of the smith's own cgroup the OOM killer killed during the run (a memory
    /// limit is set and it killed some; docs/SPEC.md §5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
    /// The Slurm job the run is (docs/SPEC.md §13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// The node the job ran on, once Slurm said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When the job began running on its node (RFC 3339); `start` is its submission: the time
    /// between is queue time, not run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
}

/// The held directories and log of one run.
pub struct RunDir {
    /// `conversations/<run-id>` (`O_PATH`).
    pub dir: OwnedFd,
    /// Its backing inode number.
    pub dir_ino: BackingIno,
    /// `conversations/`'s backing inode number.
    pub conv_ino: BackingIno,
    /// `messages.log`, open for appending.
    pub log: OwnedFd,
    /// Its backing inode number.
    pub log_ino: BackingIno,
}

/// A smith's `conversations/` in the store, made if it was missing.
pub struct Conversations {
    /// The directory (`O_PATH`).
    pub dir: OwnedFd,
    /// The smith dir's backing inode number when `conversations/` was made now — a name that
    /// appeared behind the kernel, which the scheduler announces at once (docs/PROTOCOL-NOTES.md
    /// U13) — else `None`.
    pub made_in: Option<BackingIno>,
}

/// `<rel_dir>/conversations` in the store, made if missing. Errors: the errno of the failing
/// call.
pub fn conversations(
    root: BorrowedFd<'_>,
    rel_dir: &Path,
) -> crate::backing::SysResult<Conversations> {
    use crate::backing;
    let smith = backing::open_dir_path(root, rel_dir)?;
    let smith_ino = BackingIno::of(&backing::stat(smith.as_fd())?);
    let (dir, made) = backing::ensure_dir_made(smith.as_fd(), c"conversations", 0o755)?;
    Ok(Conversations {
        dir,
        made_in: made.then_some(smith_ino),
    })
}

/// Create `<run_id>/messages.log` in `conv` (a smith's `conversations/`, [`conversations`]).
/// Errors: the errno of the failing call (EEXIST if the run dir exists).
pub fn create_run_dir(conv: BorrowedFd<'_>, run_id: &str) -> crate::backing::SysResult<RunDir> {
    use crate::backing;
    let name = backing::component(OsStr::new(run_id))?;
    backing::mkdir(conv, &name, 0o755)?;
    let dir = backing::open_beneath(conv, &name, libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let log = backing::open_file(
        dir.as_fd(),
        c"messages.log",
        libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        0o644,
    )?;
    Ok(RunDir {
        dir_ino: BackingIno::of(&backing::stat(dir.as_fd())?),
        conv_ino: BackingIno::of(&backing::stat(conv)?),
        log_ino: BackingIno::of(&backing::stat(log.as_fd())?),
        dir,
        log,
    })
}

impl Meta {
    /// `meta.json`'s content: pretty JSON with a final newline. The scheduler writes it
    /// atomically (rename), not fsynced — between starting one run and the next, as durable as
    /// the journal (see [`crate::backing::write_replace`]).
    pub fn to_json(&self) -> Vec<u8> {
        let mut text = serde_json::to_vec_pretty(self).unwrap_or_default();
        text.push(b'\n');
        text
    }
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
