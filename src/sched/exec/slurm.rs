//! `launcher.kind` `slurm` (docs/SPEC.md §13, docs/PROTOCOL-NOTES.md R17–R22): every run is a
//! Slurm job whose batch script runs `smithfs attach` on its node.
//!
//! - **Submit**: `sbatch --parsable` with the job name `smithfs:FULL_ID:RUN_ID`, `--time` from the
//!   run's time limit, `launcher.slurm`'s partition, account and extra arguments, Slurm's own
//!   output files `/dev/null`, `--export=ALL` with the run's environment set on `sbatch`'s own
//!   process (encoded under `SMITHFS_AGENT_ENV_` names: notes XT21), and the batch script on `sbatch`'s stdin ([`batch_script`]): the run's ticket
//!   reaches `attach` on descriptor 3 through a quoted here-document of the script's body, never
//!   argv, the environment or the tree.
//! - **Follow**: one poller thread for the mount's jobs runs `squeue -h -t all -u UID -o
//!   %i|%T|%N` about twice a second, parsed strictly ([`parse_squeue`]); a job's first running
//!   state posts [`Msg::JobRunning`] (its node; the scheduler starts the run's clock then), its
//!   end posts [`Msg::Exited`] with Slurm's verdict ([`verdict`]).
//! - **Stop**: TERM to the job's processes (`scancel --signal=TERM --full`) where a local run's
//!   group gets TERM, `scancel` where it gets KILL.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::launch::{listener_key, remote_ticket, Launcher, RunSpec, Submitted};
use super::Env;
use crate::config::SlurmConfig;
use crate::sched::{Msg, RemoteRuns, Verdict};
use crate::tree::model::SmithIdx;

/// How often the poller asks Slurm about the mount's jobs.
const POLL: Duration = Duration::from_millis(500);
/// How long a Slurm command may take before it is killed and counted as failed.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a submitted job may be missing from `squeue` before it counts as gone (slurmctld
/// lists a job as soon as `sbatch` returns; this covers a slow controller).
const UNSEEN_GRACE: Duration = Duration::from_secs(20);
/// The here-document's end marker in the batch script (never a ticket's line).
const TICKET_EOF: &str = "SMITHFS_TICKET_EOF";

/// A job's state class, from Slurm's long state name (`squeue %T`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JobState {
    /// Not running yet (queued, its node booting, requeued).
    Waiting,
    /// On its node (running, completing, suspended, signalled).
    Running,
    /// Over: the batch script ended (COMPLETED, FAILED); the node's report says how.
    Finished,
    /// Cancelled (`scancel`, by us or by someone else).
    Cancelled,
    /// Its time limit ended it.
    TimedOut,
    /// Its memory limit ended it.
    OutOfMemory,
    /// Slurm ended it itself: node failure, preemption, boot failure, deadline, revoked, held.
    Lost,
}

impl JobState {
    /// The class of Slurm state `name`; `None`: a state smithfs does not know.
    pub(super) fn parse(name: &str) -> Option<JobState> {
        Some(match name {
            "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD" => {
                JobState::Waiting
            }
            "RUNNING" | "COMPLETING" | "SUSPENDED" | "STOPPED" | "SIGNALING" | "RESIZING"
            | "STAGE_OUT" => JobState::Running,
            "COMPLETED" | "FAILED" => JobState::Finished,
            "CANCELLED" => JobState::Cancelled,
            "TIMEOUT" => JobState::TimedOut,
            "OUT_OF_MEMORY" => JobState::OutOfMemory,
            "NODE_FAIL" | "PREEMPTED" | "BOOT_FAIL" | "DEADLINE" | "REVOKED" | "SPECIAL_EXIT" => {
                JobState::Lost
            }
            _ => return None,
        })
    }
}

/// One line of `squeue -h -o %i|%T|%N`: (job id, state name, node list; empty while pending).
///
/// # Errors
/// The output is not three `|`-separated fields with a numeric job id on every line.
pub(super) fn parse_squeue(out: &str) -> Result<Vec<(String, String, String)>, String> {
    let mut jobs = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.trim().split('|').collect();
        let [id, state, nodes] = f[..] else {
            return Err(format!("squeue printed {line:?}, not ID|STATE|NODES"));
        };
        // Array jobs (`123_4`) and heterogeneous jobs (`123+0`) are not ours: skipped.
        if id.contains(['_', '+']) {
            continue;
        }
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("squeue printed a job id {id:?}"));
        }
        if state.is_empty() || !state.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
            return Err(format!("squeue printed a job state {state:?}"));
        }
        jobs.push((id.to_string(), state.to_string(), nodes.to_string()));
    }
    Ok(jobs)
}

/// `sbatch --parsable`'s answer: `JOBID` or `JOBID;CLUSTER`.
///
/// # Errors
/// Anything else.
pub(super) fn parse_job_id(out: &str) -> Result<String, String> {
    let first = out.trim().split(';').next().unwrap_or_default();
    if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) || out.trim().contains('\n') {
        return Err(format!(
            "sbatch --parsable printed {:?}, not a job id",
            out.trim()
        ));
    }
    Ok(first.to_string())
}

/// `word` single-quoted for sh: `'…'`, each `'` as `'\''`.
pub(super) fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The batch script of a run: its ticket on descriptor 3 through a quoted here-document (never
/// argv, never the environment), then `exec BINARY attach --ticket-fd 3 --cwd DIR OPTIONS… --
/// COMMAND…` (`OPTIONS`: [`super::launch::attach_options`], notes R56), every word
/// single-quoted.
///
/// # Errors
/// The ticket is not one line of text (it would end the here-document early).
pub(super) fn batch_script(
    binary: &str,
    ticket: &str,
    cwd: &str,
    options: &[String],
    argv: &[String],
) -> Result<String, String> {
    let ticket = ticket.trim_end_matches('\n');
    if ticket.contains('\n') || ticket.contains(TICKET_EOF) {
        return Err("the run's ticket is not one line".into());
    }
    let mut words = vec![
        sh_quote(binary),
        "attach".into(),
        "--ticket-fd".into(),
        "3".into(),
        "--cwd".into(),
        sh_quote(cwd),
    ];
    words.extend(options.iter().map(|o| sh_quote(o)));
    words.push("--".into());
    words.extend(argv.iter().map(|a| sh_quote(a)));
    Ok(format!(
        "#!/bin/sh\n# smithfs run (docs/SPEC.md §13): the ticket goes to attach on descriptor 3.\nexec 3<<'{TICKET_EOF}'\n{ticket}\n{TICKET_EOF}\nexec {}\n",
        words.join(" ")
    ))
}

/// How a job that ended is reported (docs/SPEC.md §13): Slurm's verdict wins over the node's
/// report. `state`: the job's last class (`None`: Slurm no longer lists it); `report`: the
/// node's exit report; `stopped`: the scheduler stopped the run itself (its own record then
/// says why, whatever Slurm says).
pub(super) fn verdict(
    state: Option<JobState>,
    last_name: &str,
    report: Option<ExitStatus>,
    stopped: bool,
) -> (Result<ExitStatus, String>, Option<Verdict>) {
    let lost = |error: String| {
        (
            Err(error.clone()),
            Some(Verdict {
                reason: "lost",
                error,
            }),
        )
    };
    match (state, report) {
        (Some(JobState::TimedOut), _) => {
            let error = "Slurm ended the job at its time limit (TIMEOUT)".to_string();
            (
                Err(error.clone()),
                Some(Verdict {
                    reason: "timeout",
                    error,
                }),
            )
        }
        (Some(JobState::OutOfMemory), _) => {
            let error = "Slurm ended the job at its memory limit (OUT_OF_MEMORY)".to_string();
            (
                Err(error.clone()),
                Some(Verdict {
                    reason: "oom",
                    error,
                }),
            )
        }
        (Some(JobState::Cancelled), Some(r)) if stopped => (Ok(r), None),
        (Some(JobState::Cancelled), None) if stopped => (Err("the job was cancelled".into()), None),
        (Some(JobState::Cancelled), _) => lost(
            "the job was cancelled outside smithfs (an scancel by someone else, or Slurm)".into(),
        ),
        (Some(JobState::Lost), _) => lost(format!("Slurm ended the job: {last_name}")),
        (Some(JobState::Finished) | None, Some(r)) => (Ok(r), None),
        (Some(JobState::Finished), None) if stopped => (
            Err("the job ended without its run's exit report".into()),
            None,
        ),
        (Some(JobState::Finished), None) => lost(format!(
            "the job ended ({last_name}) without its run's exit report"
        )),
        (None, None) => {
            lost("Slurm no longer lists the job and its node sent no exit report".into())
        }
        (Some(JobState::Waiting | JobState::Running), _) => {
            lost(format!("the job is still {last_name}"))
        }
    }
}

/// A Slurm client command's end: (exit status, stdout, stderr).
type ClientOut = (ExitStatus, String, String);

/// Run Slurm client `program` with `args`, `env` over the daemon's and `stdin`, killed after
/// [`CLIENT_TIMEOUT`].
///
/// # Errors
/// One sentence: it could not start (absent from PATH), or it timed out.
fn client(
    program: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    stdin: Option<&str>,
) -> Result<ClientOut, String> {
    let mut child = Command::new(program)
        .args(args)
        .envs(env)
        .current_dir("/")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("cannot run `{program}`: {e} (is Slurm's client installed on PATH?)")
        })?;
    if let (Some(text), Some(mut w)) = (stdin, child.stdin.take()) {
        let _ = w.write_all(text.as_bytes());
    }
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let reader = std::thread::spawn(move || {
        let mut e = String::new();
        if let Some(err) = err.as_mut() {
            let _ = err.read_to_string(&mut e);
        }
        e
    });
    let mut o = String::new();
    if let Some(out) = out.as_mut() {
        let _ = out.take(16 << 20).read_to_string(&mut o);
    }
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`{program}` did not answer within {CLIENT_TIMEOUT:?}"
                ));
            }
        }
    };
    let e = reader.join().unwrap_or_default();
    Ok((status, o, e))
}

/// One followed job.
struct Watch {
    smith: SmithIdx,
    run_id: String,
    /// When it was submitted (for [`UNSEEN_GRACE`]).
    since: Instant,
    /// Its last state class and name, once `squeue` listed it.
    state: Option<(JobState, String)>,
    /// [`Msg::JobRunning`] was posted.
    running: bool,
    /// The scheduler stopped it (cancel, timeout, unmount).
    stopped: bool,
}

/// The jobs a mount follows, and where their news go.
struct Jobs {
    watch: Mutex<HashMap<String, Watch>>,
    tx: Mutex<Option<SyncSender<Msg>>>,
    poller: Mutex<bool>,
}

/// `launcher.kind` `slurm`.
pub(super) struct Slurm {
    remote: Arc<dyn RemoteRuns>,
    cfg: SlurmConfig,
    jobs: Arc<Jobs>,
}

impl Slurm {
    /// The launcher over the listener's tickets `remote`, with `launcher.slurm`'s settings.
    pub(super) fn new(remote: Arc<dyn RemoteRuns>, cfg: SlurmConfig) -> Slurm {
        Slurm {
            remote,
            cfg,
            jobs: Arc::new(Jobs {
                watch: Mutex::new(HashMap::new()),
                tx: Mutex::new(None),
                poller: Mutex::new(false),
            }),
        }
    }

    /// `sbatch`'s arguments for `spec` (the script comes on stdin).
    fn sbatch_args(&self, spec: &RunSpec, full_id: &str) -> Vec<String> {
        let minutes = spec.time_limit.as_secs().div_ceil(60).max(1);
        let mut a: Vec<String> = vec![
            "--parsable".into(),
            format!("--job-name=smithfs:{full_id}:{}", spec.run_id),
            format!("--time={minutes}"),
            "--output=/dev/null".into(),
            "--error=/dev/null".into(),
            "--export=ALL".into(),
            "--chdir=/".into(),
        ];
        if let Some(p) = &self.cfg.partition {
            a.push(format!("--partition={p}"));
        }
        if let Some(acc) = &self.cfg.account {
            a.push(format!("--account={acc}"));
        }
        a.extend(self.cfg.extra_args.iter().cloned());
        a
    }

    /// The smithfs binary the nodes run: `launcher.slurm.binary`, else the daemon's own.
    fn binary(&self) -> Result<PathBuf, String> {
        match &self.cfg.binary {
            Some(b) => Ok(b.clone()),
            // The binary named for the sandbox's init (`/proc/self/exe` of the daemon), resolved
            // here: a batch script runs elsewhere.
            None => {
                let named = crate::process::sandbox::init_program().ok_or(
                    "the smithfs binary is not named: set launcher.slurm.binary".to_string(),
                )?;
                let named = PathBuf::from(named.to_string_lossy().into_owned());
                std::fs::canonicalize(&named).map_err(|e| {
                    format!("cannot resolve the smithfs binary {}: {e}", named.display())
                })
            }
        }
    }

    /// Start the poller thread once.
    fn ensure_poller(&self) -> Result<(), String> {
        let mut started = self.jobs.poller.lock();
        if *started {
            return Ok(());
        }
        let jobs = self.jobs.clone();
        let remote = self.remote.clone();
        std::thread::Builder::new()
            .name("smithfs-slurm".into())
            .spawn(move || poll_loop(&jobs, &remote))
            .map_err(|e| format!("cannot start the Slurm poller: {e}"))?;
        *started = true;
        Ok(())
    }
}

impl Launcher for Slurm {
    fn submit(&self, env: &Env, spec: RunSpec) -> Result<Submitted, String> {
        let binary = self.binary()?;
        let key = listener_key(spec.smith, &spec.run_id);
        let full_id = env
            .registry
            .full_id(spec.smith)
            .map(String::from)
            .unwrap_or_default();
        let ticket = remote_ticket(&*self.remote, &key, &spec)?;
        let fail = |why: String| {
            self.remote.revoke(&key);
            why
        };
        let script = batch_script(
            &binary.to_string_lossy(),
            &ticket,
            &spec.cwd.to_string_lossy(),
            &super::launch::attach_options(&spec),
            &spec.argv,
        )
        .map_err(fail)?;
        let args = self.sbatch_args(&spec, &full_id);
        // sbatch, the batch shell and `attach` are root: the run's environment (which a parent
        // may have written in its child's config.json) travels encoded, inert for the loader,
        // and only COMMAND gets it back by its names (notes XT21).
        let encoded = crate::process::spawn::encoded_names(&spec.env);
        let (status, out, err) = client("sbatch", &args, &encoded, Some(&script)).map_err(fail)?;
        if !status.success() {
            return Err(fail(format!(
                "sbatch failed ({status}): {}",
                err.trim().lines().last().unwrap_or("no message")
            )));
        }
        let job = parse_job_id(&out).map_err(fail)?;
        *self.jobs.tx.lock() = Some(env.tx.clone());
        self.jobs.watch.lock().insert(
            job.clone(),
            Watch {
                smith: spec.smith,
                run_id: spec.run_id.clone(),
                since: Instant::now(),
                state: None,
                running: false,
                stopped: false,
            },
        );
        if let Err(e) = self.ensure_poller() {
            self.jobs.watch.lock().remove(&job);
            let _ = client(
                "scancel",
                std::slice::from_ref(&job),
                &BTreeMap::new(),
                None,
            );
            return Err(fail(e));
        }
        Ok(Submitted::Job(job))
    }

    fn stop_job(&self, job: &str, kill: bool) {
        if let Some(w) = self.jobs.watch.lock().get_mut(job) {
            w.stopped = true;
        }
        let args: Vec<String> = if kill {
            vec![job.to_string()]
        } else {
            vec!["--signal=TERM".into(), "--full".into(), job.to_string()]
        };
        // Off the scheduler's thread: scancel waits for the controller.
        let job = job.to_string();
        let _ = std::thread::Builder::new()
            .name("smithfs-scancel".into())
            .spawn(
                move || match client("scancel", &args, &BTreeMap::new(), None) {
                    Ok((st, _, _)) if st.success() => {}
                    Ok((st, _, err)) => {
                        tracing::warn!(job, "scancel failed ({st}): {}", err.trim())
                    }
                    Err(e) => tracing::warn!(job, "{e}"),
                },
            );
    }
}

/// The poller: every [`POLL`], one `squeue` for every followed job; news into the scheduler's
/// queue. Ends with the process (a mount without jobs costs one idle wake-up per poll). An ended
/// job is finished on a thread of its own ([`finish_ended`]): its revoke may linger up to a few
/// seconds for the node's connection, which must hold up neither the other jobs' ends nor the
/// next poll (docs/PROTOCOL-NOTES.md R61).
fn poll_loop(jobs: &Jobs, remote: &Arc<dyn RemoteRuns>) {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let args: Vec<String> = ["-h", "-t", "all", "-u", &uid.to_string(), "-o", "%i|%T|%N"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut failing = false;
    loop {
        std::thread::sleep(POLL);
        if jobs.watch.lock().is_empty() {
            continue;
        }
        let listed = client("squeue", &args, &BTreeMap::new(), None).and_then(|(st, out, err)| {
            if st.success() {
                parse_squeue(&out)
            } else {
                Err(format!("squeue failed ({st}): {}", err.trim()))
            }
        });
        let listed = match listed {
            Ok(l) => {
                failing = false;
                l
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("cannot poll Slurm (runs stay live until it answers): {e}");
                }
                failing = true;
                continue;
            }
        };
        let Some(tx) = jobs.tx.lock().clone() else {
            continue;
        };
        let by_id: HashMap<&str, (&str, &str)> = listed
            .iter()
            .map(|(i, s, n)| (i.as_str(), (s.as_str(), n.as_str())))
            .collect();
        let mut ended = Vec::new();
        for (job, w) in jobs.watch.lock().iter_mut() {
            match by_id.get(job.as_str()) {
                Some((name, nodes)) => {
                    let Some(class) = JobState::parse(name) else {
                        w.state = Some((JobState::Lost, (*name).to_string()));
                        ended.push((job.clone(), Some(*name)));
                        continue;
                    };
                    // A job seen only after it ended ran too: its node is known either way.
                    if class != JobState::Waiting && !w.running && !nodes.is_empty() {
                        w.running = true;
                        let _ = tx.send(Msg::JobRunning {
                            smith: w.smith,
                            run_id: w.run_id.clone(),
                            node: (*nodes).to_string(),
                        });
                    }
                    w.state = Some((class, (*name).to_string()));
                    if !matches!(class, JobState::Waiting | JobState::Running) {
                        ended.push((job.clone(), None));
                    }
                }
                None if w.state.is_some() || w.since.elapsed() > UNSEEN_GRACE => {
                    w.state = None;
                    ended.push((job.clone(), None));
                }
                None => {}
            }
        }
        let ended = ended
            .into_iter()
            .filter_map(|(job, unknown)| {
                let w = jobs.watch.lock().remove(&job)?;
                Some((job, w, unknown.map(str::to_string)))
            })
            .collect();
        end_jobs(ended, remote, &tx);
    }
}

/// Finish each ended job (job id, its watch, the state Slurm named that smithfs does not know)
/// on a thread of its own ([`finish_ended`]), without waiting for any: one whose node keeps its
/// connection open lingers in its revoke, not the poller (notes R61). Inline when no thread can
/// be started.
fn end_jobs(
    ended: Vec<(String, Watch, Option<String>)>,
    remote: &Arc<dyn RemoteRuns>,
    tx: &SyncSender<Msg>,
) {
    for one in ended {
        let (on_remote, on_tx) = (remote.clone(), tx.clone());
        // Given to the thread through a cell: a spawn that fails drops its closure, and the job
        // must still end.
        let cell = Arc::new(Mutex::new(Some(one)));
        let on_thread = cell.clone();
        let spawned = std::thread::Builder::new()
            .name("smithfs-slurm-end".into())
            .spawn(move || {
                if let Some((job, w, unknown)) = on_thread.lock().take() {
                    finish_ended(&*on_remote, &on_tx, job, w, unknown.as_deref());
                }
            });
        if spawned.is_err() {
            if let Some((job, w, unknown)) = cell.lock().take() {
                finish_ended(&**remote, tx, job, w, unknown.as_deref());
            }
        }
    }
}

/// Finish ended job `job` of watch `w`: revoke its run's ticket (which waits for the node's
/// connection to end, a few seconds at most), cancel a job in a state Slurm named as `unknown`,
/// and post its [`Msg::Exited`] with the verdict.
fn finish_ended(
    remote: &dyn RemoteRuns,
    tx: &SyncSender<Msg>,
    job: String,
    w: Watch,
    unknown: Option<&str>,
) {
    let report = remote.revoke(&listener_key(w.smith, &w.run_id));
    let (status, verdict) = match unknown {
        Some(name) => {
            let _ = client(
                "scancel",
                std::slice::from_ref(&job),
                &BTreeMap::new(),
                None,
            );
            let error = format!(
                        "Slurm reported the job in state {name:?}, which smithfs does not know: it was cancelled"
                    );
            (
                Err(error.clone()),
                Some(Verdict {
                    reason: "lost",
                    error,
                }),
            )
        }
        None => {
            let (class, name) = w
                .state
                .clone()
                .map_or((None, String::new()), |(c, n)| (Some(c), n));
            verdict(class, &name, report, w.stopped)
        }
    };
    let _ = tx.send(Msg::Exited {
        smith: w.smith,
        run_id: w.run_id,
        status,
        verdict,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// Finding 05 of the hostile review (notes R61): a run whose node keeps its connection open
    /// lingers in its revoke (here: until the test lets it go); ending it beside another job
    /// returns at once, and the other job's `Exited` comes without waiting for it.
    #[test]
    fn a_lingering_revoke_holds_up_neither_the_poller_nor_other_jobs() {
        struct Lingering(Mutex<std::sync::mpsc::Receiver<()>>);
        impl RemoteRuns for Lingering {
            fn ticket(
                &self,
                _: &str,
                _: SmithIdx,
                _: Option<&crate::sandbox::view::Plan>,
                _: Option<std::os::fd::OwnedFd>,
            ) -> Result<String, String> {
                Err("no tickets here".into())
            }
            fn revoke(&self, run_id: &str) -> Option<std::process::ExitStatus> {
                if run_id.contains("hostile") {
                    let _ = self.0.lock().recv_timeout(Duration::from_secs(60));
                }
                None
            }
            fn attached(&self, _: &str) -> bool {
                true
            }
        }
        let (let_go, held) = std::sync::mpsc::channel();
        let remote: Arc<dyn RemoteRuns> = Arc::new(Lingering(Mutex::new(held)));
        let (tx, rx) = std::sync::mpsc::sync_channel(8);
        let watch = |smith: u32, run_id: &str| Watch {
            smith: SmithIdx(smith),
            run_id: run_id.into(),
            since: Instant::now(),
            state: Some((JobState::Finished, "COMPLETED".into())),
            running: true,
            stopped: false,
        };
        let started = Instant::now();
        end_jobs(
            vec![
                ("1".into(), watch(1, "run-hostile"), None),
                ("2".into(), watch(2, "run-victim"), None),
            ],
            &remote,
            &tx,
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the poller waited for a revoke: {:?}",
            started.elapsed()
        );
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Msg::Exited { run_id, .. }) => assert_eq!(run_id, "run-victim"),
            Ok(_) => panic!("not an Exited"),
            Err(e) => panic!("the other job's end waited for the lingering one: {e}"),
        }
        let_go.send(()).expect("let go");
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Msg::Exited { run_id, .. }) => assert_eq!(run_id, "run-hostile"),
            _ => panic!("the lingering job never ended"),
        }
    }

    #[test]
    fn squeue_output_is_parsed_strictly() {
        let got = parse_squeue("12|RUNNING|n1\n13|PENDING|\n14_2|RUNNING|n2\n").unwrap();
        assert_eq!(
            got,
            [
                ("12".into(), "RUNNING".into(), "n1".into()),
                ("13".into(), "PENDING".into(), String::new())
            ]
        );
        for bad in [
            "12 RUNNING n1",
            "x|RUNNING|n1",
            "12|running|n1",
            "12|RUNNING",
        ] {
            assert!(parse_squeue(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_squeue("").unwrap(), []);
    }

    #[test]
    fn sbatch_answers_are_parsed_strictly() {
        assert_eq!(parse_job_id("42\n").unwrap(), "42");
        assert_eq!(parse_job_id("42;cluster\n").unwrap(), "42");
        for bad in ["", "Submitted batch job 42", "42\n43", "4x"] {
            assert!(parse_job_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn states_are_classed_and_an_unknown_one_is_none() {
        assert_eq!(JobState::parse("PENDING"), Some(JobState::Waiting));
        assert_eq!(JobState::parse("COMPLETING"), Some(JobState::Running));
        assert_eq!(JobState::parse("FAILED"), Some(JobState::Finished));
        assert_eq!(JobState::parse("NODE_FAIL"), Some(JobState::Lost));
        assert_eq!(JobState::parse("PREEMPTED"), Some(JobState::Lost));
        assert_eq!(JobState::parse("TIMEOUT"), Some(JobState::TimedOut));
        assert_eq!(JobState::parse("WIBBLE"), None);
    }

    #[test]
    fn slurms_verdict_wins_over_the_report() {
        let ok = Some(ExitStatus::from_raw(0));
        let reason = |v: &Option<Verdict>| v.as_ref().map(|v| v.reason);
        // The report decides a job that ended by itself.
        let (st, v) = verdict(Some(JobState::Finished), "COMPLETED", ok, false);
        assert!(st.is_ok() && v.is_none());
        // Without it the run is lost; Slurm's own ends are lost or timeout whatever the report.
        assert_eq!(
            reason(&verdict(Some(JobState::Finished), "FAILED", None, false).1),
            Some("lost")
        );
        assert_eq!(
            reason(&verdict(Some(JobState::Cancelled), "CANCELLED", ok, false).1),
            Some("lost")
        );
        assert_eq!(
            reason(&verdict(Some(JobState::Lost), "NODE_FAIL", ok, false).1),
            Some("lost")
        );
        assert_eq!(
            reason(&verdict(Some(JobState::TimedOut), "TIMEOUT", ok, true).1),
            Some("timeout")
        );
        assert_eq!(reason(&verdict(None, "", None, false).1), Some("lost"));
        // A cancel of ours is ours: the scheduler's record says why.
        assert_eq!(
            reason(&verdict(Some(JobState::Cancelled), "CANCELLED", None, true).1),
            None
        );
    }

    #[test]
    fn the_batch_script_quotes_every_word_and_hands_the_ticket_on_fd_3() {
        let argv = vec![
            "sh".to_string(),
            "-c".into(),
            "echo 'hi' $HOME; rm -rf /".into(),
        ];
        let s = batch_script(
            "/usr/bin/smithfs",
            "smithfs-ticket-1 a b c d\n",
            "/m/x y",
            &[],
            &argv,
        )
        .unwrap();
        assert!(s.contains(
            "exec 3<<'SMITHFS_TICKET_EOF'\nsmithfs-ticket-1 a b c d\nSMITHFS_TICKET_EOF\n"
        ));
        assert!(s.ends_with(
            "exec '/usr/bin/smithfs' attach --ticket-fd 3 --cwd '/m/x y' -- 'sh' '-c' 'echo '\\''hi'\\'' $HOME; rm -rf /'\n"
        ));
        // The daemon's options, before `--` (notes R56).
        let opts = ["--umask".to_string(), "027".into(), "--unconfined".into()];
        let with = batch_script("b", "t", "/", &opts, &argv).unwrap();
        assert!(with
            .contains(" attach --ticket-fd 3 --cwd '/' '--umask' '027' '--unconfined' -- 'sh' "));
        // The shell reads back exactly the words given.
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "set -- {}; printf '%s\\n' \"$@\"",
                argv.iter()
                    .map(|a| sh_quote(a))
                    .collect::<Vec<_>>()
                    .join(" ")
            ))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{}\n", argv.join("\n"))
        );
        assert!(batch_script("b", "two\nlines", "/", &[], &argv).is_err());
    }
}
