//! The launcher seam (docs/SPEC.md §13): between a run the scheduler prepared and whatever
//! runs it.
//!
//! `start::start_run` decides everything about a run (its directory, config, argv,
//! environment, working directory, output pipe) and hands the result, a [`RunSpec`], to the
//! mount's [`Launcher`] (`launcher.kind`): [`Launcher::submit`] starts it and gives back the
//! local process the scheduler follows; [`follow`] reports that process's end (the run's exit
//! report) into the scheduler's queue and tells the launcher ([`Launcher::ended`]). Cancel and
//! timeout signal that process's group (`stop.rs`). Two kinds exist:
//! - `local` ([`start_process`]): the run is a child of this daemon bound to its smith
//!   ([`runner::launch`]), in the §12 sandbox when it applies;
//! - `loopback` ([`Loopback`]): the run's process is a local `smithfs attach` that reaches the
//!   tree through the listener with the run's ticket (on its stdin) and runs the agent command
//!   under its own mount, in the §12 sandbox whose plan the daemon sends it over the connection
//!   (docs/PROTOCOL-NOTES.md R10–R12, R30).
//!
//! A cluster's kind (Slurm) has no local process to follow: it needs the seam to grow cancel
//! and poll of its own (not built).

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
    /// The run's id (`conversations/RUN_ID`).
    pub run_id: String,
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
    /// `agent.timeout_secs` and `agent.kill_grace_secs` of the smith's effective config: a
    /// cluster job's own time limit.
    pub time_limit: std::time::Duration,
}

/// What a launcher started: a local process the scheduler follows, or a cluster job the
/// launcher follows itself.
pub(super) enum Submitted {
    /// A local process (`local`, `loopback`).
    Process(Started),
    /// A Slurm job, by id (`slurm`).
    Job(String),
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

/// Where runs start: one per mount, chosen by `launcher.kind`.
pub(super) trait Launcher: Send + Sync {
    /// Start `spec`; what is returned is the local process the scheduler follows, signals to
    /// cancel or time out, and takes the exit status of; or a job the launcher follows itself,
    /// posting [`Msg::JobRunning`] and [`Msg::Exited`].
    ///
    /// Errors: one sentence naming the program and why it did not start.
    fn submit(&self, env: &Env, spec: RunSpec) -> Result<Submitted, String>;

    /// Stop job `job` ([`Submitted::Job`]): `kill` false where a local run's group gets TERM,
    /// true where it gets KILL.
    fn stop_job(&self, _job: &str, _kill: bool) {}

    /// Run `run_id` of `smith` ended, or cannot be followed (after [`Launcher::submit`]
    /// succeeded). Returns the run's own exit report when the launcher has one that says more
    /// than the followed process's status (a remote run's COMMAND, docs/PROTOCOL-NOTES.md R16).
    fn ended(&self, _smith: SmithIdx, _run_id: &str) -> Option<std::process::ExitStatus> {
        None
    }
}

/// The launcher for `launcher`'s kind: `loopback` and `slurm` need `remote` (the daemon's
/// listener; the daemon always has one for those kinds; without it runs are local).
pub(super) fn for_kind(
    launcher: &crate::config::LauncherConfig,
    remote: Option<std::sync::Arc<dyn crate::sched::RemoteRuns>>,
) -> std::sync::Arc<dyn Launcher> {
    use crate::config::LauncherKind;
    match (launcher.kind, remote) {
        (LauncherKind::Loopback, Some(remote)) => std::sync::Arc::new(Loopback { remote }),
        (LauncherKind::Slurm, Some(remote)) => {
            std::sync::Arc::new(super::slurm::Slurm::new(remote, launcher.slurm.clone()))
        }
        _ => std::sync::Arc::new(Local),
    }
}

/// The listener's name of run `run_id` of `smith`: run ids are per smith (`run-0001` in every
/// smith), a smith's index is never reused while the mount lives (docs/PROTOCOL-NOTES.md R13).
/// The options of `smithfs attach` before `--` that carry the daemon's word on how COMMAND
/// starts (docs/PROTOCOL-NOTES.md R56): `--umask` the mounter's mask (H16: a run's umask is the
/// mounter's, on any host) and, when `agent.confine` is false, `--unconfined`.
pub(super) fn attach_options(spec: &RunSpec) -> Vec<String> {
    let mut o = vec![
        "--umask".to_string(),
        format!("{:03o}", crate::process::spawn::run_umask()),
    ];
    if !spec.confine {
        o.push("--unconfined".into());
    }
    o
}

pub(super) fn listener_key(smith: SmithIdx, run_id: &str) -> String {
    format!("{}/{run_id}", smith.0)
}

/// `launcher.kind` `local`.
struct Local;

impl Launcher for Local {
    fn submit(&self, env: &Env, spec: RunSpec) -> Result<Submitted, String> {
        start_process(env, spec).map(Submitted::Process)
    }
}

/// The ticket of `spec`'s run under the listener's `key`, for a launcher whose runs reach the
/// tree through the listener: minted with the run's sandbox plan (its working directory the
/// smith dir, reporting its exit; `attach` gets it in the welcome, R30) and the run's output
/// pipe, which what COMMAND prints reaches over the connection (R16).
///
/// Errors: the output pipe could not be shared, or the listener refused to mint.
pub(super) fn remote_ticket(
    remote: &dyn crate::sched::RemoteRuns,
    key: &str,
    spec: &RunSpec,
) -> Result<String, String> {
    let plan = spec.sandbox.as_ref().map(|p| {
        let mut p = p.clone();
        p.cwd = Some(spec.cwd.clone());
        p.report = true;
        p
    });
    let output = spec
        .output
        .try_clone()
        .map_err(|e| format!("cannot share the run's output pipe: {e}"))?;
    remote.ticket(key, spec.smith, plan.as_ref(), Some(output))
}

/// `launcher.kind` `loopback` (docs/PROTOCOL-NOTES.md R10, R12): every run is `smithfs attach
/// --ticket-fd 0 --cwd SMITH_DIR -- COMMAND…` on this host, bound to its smith, its ticket
/// written to its stdin, its stdout and stderr the run's output pipe. `attach` mounts in a
/// namespace of its own, so it starts outside the §12 sandbox; COMMAND starts in it, from the
/// plan the run's ticket is minted with (the listener sends it in the welcome: R30), never
/// from anything in `attach`'s argv or environment.
struct Loopback {
    remote: std::sync::Arc<dyn crate::sched::RemoteRuns>,
}

impl Launcher for Loopback {
    fn submit(&self, env: &Env, spec: RunSpec) -> Result<Submitted, String> {
        // The smithfs binary, as named for the sandbox's init: never this process's own
        // executable assumed (a test harness would run its own tests; notes XT17).
        let binary = crate::process::sandbox::init_program()
            .ok_or("the smithfs binary is not named: `smithfs attach` cannot be started")?
            .to_string_lossy()
            .into_owned();
        let key = listener_key(spec.smith, &spec.run_id);
        // COMMAND's output comes over the connection (R16); attach's own messages to its stdout
        // and stderr, the same pipe.
        let ticket = remote_ticket(&*self.remote, &key, &spec)?;
        let mut argv: Vec<String> = vec![
            binary,
            "attach".into(),
            "--ticket-fd".into(),
            "0".into(),
            "--cwd".into(),
            spec.cwd.to_string_lossy().into_owned(),
        ];
        argv.extend(attach_options(&spec));
        argv.push("--".into());
        argv.extend(spec.argv.iter().cloned());
        // `attach` is root outside the sandbox: the run's environment (which a parent may have
        // written in its child's config.json) reaches it encoded, inert for the loader, and
        // only COMMAND gets it back by its names (notes XT21).
        let encoded = crate::process::spawn::encoded_names(&spec.env);
        let started = runner::launch(
            Launch {
                program: Program {
                    argv: &argv,
                    env: &encoded,
                    cwd: None,
                    stdin_piped: true,
                    output: Some(spec.output),
                    nofile: env.nofile,
                    confine: None,
                    user: None,
                },
                bind: BindTo::Smith(spec.smith),
                sandbox: None,
            },
            &*env.binder,
        )
        .map_err(|e| {
            self.remote.revoke(&key);
            format!("cannot start `smithfs attach` for `{}`: {e}", spec.argv[0])
        });
        let mut started = started?;
        let sent = started.child.stdin.take().map(|mut w| {
            use std::io::Write;
            w.write_all(ticket.as_bytes())
        });
        if !matches!(sent, Some(Ok(()))) {
            signal_group(started.pid as i32, libc::SIGKILL);
            let _ = started.child.wait();
            self.remote.revoke(&key);
            return Err("cannot hand `smithfs attach` its ticket".into());
        }
        Ok(Submitted::Process(started))
    }

    fn ended(&self, smith: SmithIdx, run_id: &str) -> Option<std::process::ExitStatus> {
        self.remote.revoke(&listener_key(smith, run_id))
    }
}

/// Reap `started`'s leader on a thread of its own, which posts [`Msg::Exited`] for
/// `(smith, run_id)` into the scheduler's queue, after telling the launcher.
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
    let launcher = env.launcher.clone();
    let mut child = started.child;
    let run = run_id.to_string();
    let spawned = std::thread::Builder::new()
        .name("smithfs-reaper".into())
        .spawn(move || {
            let status = child.wait().map_err(|e| e.to_string());
            crate::process::reaper::untrack(child.id());
            // A remote run's own report says how COMMAND ended (a signal, not 128 + N).
            let status = match launcher.ended(smith, &run) {
                Some(reported) if status.is_ok() => Ok(reported),
                _ => status,
            };
            let _ = tx.send(Msg::Exited {
                smith,
                run_id: run,
                status,
                verdict: None,
            });
        });
    spawned.map(|_| ()).map_err(|e| {
        signal_group(started.pid as i32, libc::SIGKILL);
        env.launcher.ended(smith, run_id);
        format!("cannot start a reaper thread: {e}")
    })
}
