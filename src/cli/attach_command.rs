//! How `smithfs attach` starts its COMMAND (docs/SPEC.md §13 "On the node", docs/PROTOCOL-NOTES.md
//! R11, R14, R30): in the §12 sandbox whose plan the daemon sent in the welcome, through the
//! same spawn as a local run ([`crate::process::spawn`] with the sandbox's init, one sandbox
//! implementation), or — only when the daemon sent no plan, its mount running agents without
//! the sandbox — as a plain child of `attach`, confined as a root daemon's local run when
//! `attach` is root (docs/PROTOCOL-NOTES.md H13, R56).
//!
//! The stopping signals (TERM, INT, HUP) a launcher sends `attach`'s process group must reach
//! COMMAND while `attach` stays to forward the closes after it (R14). A plain COMMAND is in
//! `attach`'s group and gets them itself (`attach` ignores them). A sandboxed COMMAND is in a
//! session of its own (the spawn's `setsid`), under the sandbox's init: `attach` blocks those
//! signals before it starts any thread ([`StopSignals::block`]), takes them on a thread of its
//! own and sends each to the init, which forwards it to the agent.

use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use parking_lot::Mutex;

use crate::sandbox::view::Plan;

/// The signals a launcher stops a run with: `attach` ignores or forwards them, COMMAND gets
/// them.
pub const STOPPING: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// The run's sandbox, as the daemon made it, fitted to this host.
///
/// # Errors
/// A plan that does not parse, or whose uid or gid is root (the daemon never makes one).
pub fn plan_of(text: &str, mount: &Path) -> Result<Plan> {
    let mut plan = Plan::parse(text).map_err(|e| anyhow!("the daemon's sandbox plan: {e}"))?;
    if plan.uid == 0 || plan.gid == 0 {
        anyhow::bail!("the daemon's sandbox plan runs the agent as root: refused");
    }
    for line in plan.fit_to_this_host(mount) {
        eprintln!("smithfs attach: sandbox: {line}");
    }
    Ok(plan)
}

/// Where a stopping signal goes: the sandbox's init once it runs (a signal that came before is
/// kept and sent then); nowhere once it was reaped.
#[derive(Debug, Default)]
pub struct Target {
    pid: Option<libc::pid_t>,
    pending: Vec<libc::c_int>,
    reaped: bool,
}

/// `attach`'s stopping signals, handled for a COMMAND in the sandbox or a plain one.
#[derive(Debug)]
pub struct StopSignals {
    target: Option<Arc<Mutex<Target>>>,
}

impl StopSignals {
    /// For a plain COMMAND: `attach` ignores the stopping signals (COMMAND, in its process
    /// group, gets them with their default dispositions back: [`spawn`]).
    pub fn ignore() -> StopSignals {
        for sig in STOPPING {
            // SAFETY: setting a signal disposition; no handler runs.
            unsafe { libc::signal(sig, libc::SIG_IGN) };
        }
        StopSignals { target: None }
    }

    /// For a sandboxed COMMAND: the stopping signals blocked in this thread — call it before
    /// any other thread starts, so that every thread has them blocked — with their default
    /// dispositions (the sandbox's processes inherit dispositions; its spawn empties the mask),
    /// and a thread that takes each and sends it to the sandbox's init.
    ///
    /// # Errors
    /// The mask could not be set or the thread not started.
    pub fn block() -> Result<StopSignals> {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        for sig in STOPPING {
            set.add(Signal::try_from(sig).context("a stopping signal")?);
            // SAFETY: setting a signal disposition; no handler runs.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
        set.thread_block()
            .context("blocking the stopping signals")?;
        let target = Arc::new(Mutex::new(Target::default()));
        let t = target.clone();
        std::thread::Builder::new()
            .name("smithfs-signals".into())
            .spawn(move || loop {
                let Ok(sig) = set.wait() else { continue };
                let sig = sig as libc::c_int;
                let mut t = t.lock();
                match t.pid {
                    // SAFETY: kill of our unreaped child (the init): its pid is not recycled.
                    Some(pid) if !t.reaped => unsafe {
                        libc::kill(pid, sig);
                    },
                    Some(_) => {}
                    None => t.pending.push(sig),
                }
            })
            .context("cannot start the signal thread")?;
        Ok(StopSignals {
            target: Some(target),
        })
    }
}

/// COMMAND, started.
#[derive(Debug)]
pub enum Running {
    /// A plain child of `attach` (no sandbox).
    Plain(std::process::Child),
    /// The sandbox's init, PID 1 of the run's pid namespace.
    Sandboxed(crate::process::spawn::Process, Arc<Mutex<Target>>),
}

impl Running {
    /// Wait for COMMAND to end: its status (a sandboxed agent's own, as the init reports it:
    /// killed by signal N stays killed by N).
    ///
    /// # Errors
    /// The wait failed.
    pub fn wait(self) -> Result<ExitStatus> {
        match self {
            Running::Plain(mut c) => c.wait().context("waiting for the command"),
            Running::Sandboxed(mut p, target) => {
                let status = p.wait().context("waiting for the command's sandbox");
                crate::process::reaper::untrack(p.id());
                target.lock().reaped = true;
                status
            }
        }
    }
}

/// Start `command` in `cwd` with `attach`'s environment: in `sandbox` (`plan_of`'s plan; its
/// own working directory wins over `cwd`, a directory the view does not show falls back to
/// `cwd`) or plainly — under `confine` when given (applied after the fork, before the working
/// directory is entered: docs/PROTOCOL-NOTES.md R56) — with `output` (the pipe `attach` sends to
/// the daemon, docs/PROTOCOL-NOTES.md R16) as its stdout and stderr. stdin is `/dev/null`.
///
/// # Errors
/// COMMAND did not start: for the sandbox, the step that failed (nothing was executed).
pub fn spawn(
    command: &[String],
    cwd: &Path,
    sandbox: Option<&Plan>,
    confine: Option<crate::process::confine::Confinement>,
    signals: &StopSignals,
    output: OwnedFd,
) -> Result<Running> {
    let Some(plan) = sandbox else {
        let mut c = std::process::Command::new(&command[0]);
        let stderr = output.try_clone().context("duplicating the output pipe")?;
        // The run's environment came encoded (notes XT21): COMMAND gets it by its names.
        c.env_clear().envs(crate::process::spawn::decode_env(
            std::env::vars_os(),
            false,
        ));
        c.args(&command[1..])
            .stdin(std::process::Stdio::null())
            .stdout(output)
            .stderr(stderr);
        // Confined, COMMAND enters its directory once in its own mount namespace (a directory
        // entered before would keep the mounts of attach's, /sys writable among them).
        let dir = std::ffi::CString::new(cwd.as_os_str().as_encoded_bytes())
            .context("the working directory holds a NUL byte")?;
        if confine.is_none() {
            c.current_dir(cwd);
        }
        // SAFETY: `signal`, the confinement's raw system calls (async-signal-safe, no
        // allocation: process::confine) and `chdir` of a string made before the fork; COMMAND
        // gets the default dispositions back.
        unsafe {
            c.pre_exec(move || {
                for sig in STOPPING {
                    libc::signal(sig, libc::SIG_DFL);
                }
                if let Some(conf) = confine {
                    conf.apply()
                        .map_err(|(_, e)| std::io::Error::from_raw_os_error(e))?;
                    if libc::chdir(dir.as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = c
            .spawn()
            .with_context(|| format!("cannot start `{}` in {}", command[0], cwd.display()))?;
        return Ok(Running::Plain(child));
    };
    let target = signals
        .target
        .clone()
        .ok_or_else(|| anyhow!("the stopping signals are not forwarded to a sandbox"))?;
    let mut plan = plan.clone();
    plan.fallback_cwd = Some(cwd.to_path_buf());
    if plan.cwd.is_none() {
        plan.cwd = Some(cwd.to_path_buf());
    }
    let init_args = plan.init_args();
    let env = std::collections::BTreeMap::new();
    let mut bind = |_pid: u32| Ok(());
    let process = crate::process::spawn::spawn(crate::process::spawn::Spawn {
        program: crate::process::spawn::Program {
            argv: command,
            env: &env,
            cwd: None,
            stdin_piped: false,
            output: Some(output),
            nofile: (0, 0),
            confine: None,
            user: None,
        },
        cgroup: None,
        bind: &mut bind,
        place: None,
        sandbox: Some(&init_args),
    })
    .map_err(|e| anyhow!("cannot start `{}` in the sandbox: {e}", command[0]))?;
    let pid = libc::pid_t::try_from(process.id()).context("pid out of range")?;
    let mut t = target.lock();
    t.pid = Some(pid);
    for sig in std::mem::take(&mut t.pending) {
        // SAFETY: kill of our unreaped child.
        unsafe { libc::kill(pid, sig) };
    }
    drop(t);
    Ok(Running::Sandboxed(process, target))
}

/// `status` as `attach`'s exit code: COMMAND's, or 128 + the signal that ended it.
pub fn exit_code(status: ExitStatus) -> u8 {
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    code.clamp(0, 255) as u8
}
