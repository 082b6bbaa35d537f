//! The seam between a run the scheduler prepared and the process that runs it.
//!
//! `start::start_run` decides everything about a run (its directory, config, argv,
//! environment, working directory, output pipe) and hands the result, a [`RunSpec`], to
//! [`start_process`], the one function that makes a process of it; [`follow`] then reports
//! its end into the scheduler's queue. What starts the process is decided here and only here:
//! today the local launcher (a child of this daemon bound to its smith,
//! [`runner::launch`]); the sandbox's steps (docs/SPEC.md §5) are added to what this function
//! asks of the spawn, and another launcher (a cluster's) would be chosen here.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use super::stop::signal_group;
use super::Env;
use crate::process::confine::Confinement;
use crate::process::spawn::Program;
use crate::sched::runner::{self, BindTo, Launch, Started};
use crate::sched::Msg;
use crate::tree::model::SmithIdx;

/// A run ready to start: what the scheduler decided, nothing yet about how it is started.
pub(super) struct RunSpec {
    /// The smith it runs as.
    pub smith: SmithIdx,
    /// argv, placeholders filled; never empty.
    pub argv: Vec<String>,
    /// The environment over the daemon's: `agent.env` plus the `SMITH_*` variables (§5).
    pub env: BTreeMap<String, String>,
    /// The smith dir inside the mount.
    pub cwd: PathBuf,
    /// The write end of the run's output pipe (stdout and stderr), drained by the pump.
    pub output: OwnedFd,
    /// `agent.confine` of the smith's effective config.
    pub confine: bool,
    /// The sandbox's plan (docs/SPEC.md §12), from the mount-wide config; `None`: no sandbox.
    pub sandbox: Option<crate::sandbox::view::Plan>,
}

/// Start `spec`'s process (the local launcher: a child of this daemon, in its own session and
/// process group, bound to its smith before it executes anything; see [`runner::launch`]).
///
/// Errors: one sentence naming the program and why it did not start; it never executed.
pub(super) fn start_process(env: &Env, spec: RunSpec) -> Result<Started, String> {
    let confine: Option<Confinement> = env.confiner.filter(|_| spec.confine);
    runner::launch(
        Launch {
            program: Program {
                argv: &spec.argv,
                env: &spec.env,
                cwd: Some(&spec.cwd),
                stdin_piped: false,
                output: Some(spec.output),
                nofile: env.nofile,
                confine,
                user: None,
            },
            bind: BindTo::Smith(spec.smith),
            sandbox: spec.sandbox.as_ref(),
        },
        &*env.binder,
    )
    .map_err(|e| format!("cannot start `{}`: {e}", spec.argv[0]))
}

/// Reap `started`'s leader on a thread of its own, which posts [`Msg::Exited`] for
/// `(smith, run_id)` into the scheduler's queue.
///
/// Errors: the thread could not be started; the run's process group is then killed (it cannot
/// be followed) and the sentence says why.
pub(super) fn follow(
    env: &Env,
    smith: SmithIdx,
    run_id: &str,
    started: Started,
) -> Result<(), String> {
    let tx = env.tx.clone();
    let mut child = started.child;
    let run_id = run_id.to_string();
    let spawned = std::thread::Builder::new()
        .name("smithfs-reaper".into())
        .spawn(move || {
            let status = child.wait().map_err(|e| e.to_string());
            crate::process::reaper::untrack(child.id());
            let _ = tx.send(Msg::Exited {
                smith,
                run_id,
                status,
            });
        });
    spawned.map(|_| ()).map_err(|e| {
        signal_group(started.pid as i32, libc::SIGKILL);
        format!("cannot start a reaper thread: {e}")
    })
}
