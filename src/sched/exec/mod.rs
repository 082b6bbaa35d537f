//! The executor: the scheduler thread's loop around the pure [`Queue`]. It turns messages into
//! model calls, starts what [`Queue::next`] names, watches deadlines, stops process groups,
//! journals, and makes the daemon's own writes (run dirs, `meta.json`, `results/final.md`).
//!
//! Only this thread touches the model and the live-run table; run leaders are reaped by one
//! waiter thread per run, which posts [`Msg::Exited`] into the same ordered queue.
//!
//! Shape (as pueue's daemon: one handler file per kind of operation, a loop of named steps):
//! [`Exec`] is [`Env`], what never changes after start (the store, the ports, the channels),
//! plus [`State`], what the loop changes (the model, the live runs, the settings a reload
//! replaces). The handlers:
//! - `startup`: the tree and the journal read back at start (§6, §9), leftovers killed, the
//!   rescans that re-derive requests from the files;
//! - `triggers`: the filesystem's triggers, cancel, retry, reload;
//! - `start`: a run start, the one place that prepares a run ([`launch::RunSpec`]) and hands
//!   it to the mount's [`launch::Launcher`] (`launcher.kind`);
//! - `stop`: deadlines, TERM then KILL, pause and resume;
//! - `finish`: a run that is over (auto-commit, `meta.json`, the end-of-run rule);
//! - `publish`: `status.json`, `results/final.md`, `fleet.done`;
//! - `writes`: the daemon's own writes into the store, each charged and announced in one call.

mod final_copy;
mod finish;
mod launch;
mod publish;
mod slurm;
mod start;
mod startup;
mod stop;
mod triggers;
mod writes;

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::hooks::Hooks;
use super::journal::{Event, Journal, LastRun};
use super::output::{Pump, StreamId};
use super::queue::{Note, Queue, Wake};
use super::runner::{Meta, Placeholders, RunBinder, RunDir};
use super::{store_facts, Msg, SchedCtx, Shared};
use crate::backing;
use crate::config::Config;
use crate::limits::storage::Storage;
use crate::process::confine::Confinement;
use crate::tree::model::{FullId, SmithIdx};
use crate::tree::registry::Registry;

use self::writes::Writes;

/// What the journal and the files say about a smith, kept between runs.
#[derive(Debug, Default)]
struct Rec {
    runs: u32,
    last_run: Option<LastRun>,
    last_start: Option<SystemTime>,
    has_result: bool,
    next_run: u32,
    /// The task file (name, modification time) the rescan last journaled as `task.assigned`,
    /// until its trigger arrives: the rescan and the trigger of one write are one assignment.
    announced: Option<(String, SystemTime)>,
    /// The task file last journaled as `task.assigned` with a run scheduled: while that run is
    /// pending, a rewrite of the same file is not journaled again (notes H22).
    pending_task: Option<String>,
}

/// A live run.
struct Live {
    run_id: String,
    /// Its process group; 0 for a cluster job (no local process).
    pgid: i32,
    /// Its Slurm job (docs/SPEC.md §13).
    job: Option<String>,
    /// The run's time limit (its deadline is set from it once a job runs).
    timeout: Duration,
    /// Slurm's word on its end (docs/SPEC.md §13).
    verdict: Option<crate::sched::Verdict>,
    deadline: Instant,
    grace: Duration,
    retries: u32,
    stop: Option<stop::Stop>,
    exit: Option<Result<std::process::ExitStatus, String>>,
    dir: RunDir,
    meta: Meta,
    /// The smith's oom-kill counter when the run started (a memory limit is set).
    oom_base: Option<u64>,
    /// The auto-commit of its workspace is under way (docs/SPEC.md §11); the run is finished
    /// when it reports.
    committing: bool,
    /// Its stdout and stderr in the output pump.
    output: Option<StreamId>,
    /// Its smith's result was published (`result.published`) while it was live.
    published: bool,
    /// When `outbox/result.md` last changed as the run started (`None`: there was none): what
    /// a `lost` run changed since is no result (docs/PROTOCOL-NOTES.md R43).
    result_before: Option<std::time::SystemTime>,
}

/// What never changes after the scheduler thread starts: the store, the mount, the ports to
/// the rest of the daemon and the channels.
struct Env {
    /// The backing store's root (`O_PATH`).
    root: OwnedFd,
    /// `.smithfs-state/` (`O_PATH`): the journal's directory.
    state_dir: OwnedFd,
    mount: PathBuf,
    registry: Arc<Registry>,
    binder: Arc<dyn RunBinder>,
    /// The daemon's own writes: into the store, onto the quota books (docs/SPEC.md §8), to the
    /// kernel's caches.
    writes: Writes,
    /// Drains runs' and hooks' output into their logs (docs/PROTOCOL-NOTES.md L17).
    pump: Pump,
    nofile: (u64, u64),
    /// How this daemon confines runs when `agent.confine` is on (`None`: it cannot, not being
    /// privileged; docs/PROTOCOL-NOTES.md H13).
    confiner: Option<Confinement>,
    /// The agents' user when the sandbox is on (docs/SPEC.md §12): whom runs execute as.
    agents: Option<Arc<crate::sandbox::AgentUser>>,
    /// `agent.secrets_file`'s variables, read at mount (docs/SPEC.md §12).
    secrets: Arc<crate::sandbox::Secrets>,
    /// Where runs start (docs/SPEC.md §13): `launcher.kind`'s launcher.
    launcher: Arc<dyn launch::Launcher>,
    shared: Arc<Shared>,
    journal: Arc<Journal>,
    /// The scheduler's own queue (reapers and commits post into it).
    tx: SyncSender<Msg>,
    /// Copies the root's result to `results/final.md` off this thread (notes H20).
    final_copier: final_copy::FinalCopier,
}

impl Env {
    /// `plan` with the uid, gid and user name of `smith`'s runs from the agents' user the
    /// daemon resolved at mount (docs/SPEC.md §12), when it did. Errors: a per-smith uid could
    /// not be given out.
    fn as_agent(
        &self,
        mut plan: crate::sandbox::view::Plan,
        smith: &crate::tree::model::FullId,
    ) -> Result<crate::sandbox::view::Plan, crate::sandbox::UserError> {
        if let Some(a) = &self.agents {
            let (uid, gid) = a.uid_of(smith)?;
            plan.uid = uid;
            plan.gid = gid;
            plan.user = a.name_of(smith).to_owned();
        }
        Ok(plan)
    }
}

/// What the loop changes: the model, the runs, the settings a reload replaces.
struct State {
    /// The mount-wide configuration (replaced by a reload).
    config: Config,
    /// The user hooks (replaced by a reload).
    hooks: Hooks,
    queue: Queue,
    recs: HashMap<SmithIdx, Rec>,
    live: HashMap<SmithIdx, Live>,
    /// Told once the first status (the journal's history) is published; taken then.
    ready: Option<SyncSender<()>>,
    /// No run may start: the daemon is unmounting ([`Msg::Pause`] or [`Msg::Shutdown`]).
    shutting_down: bool,
    /// End the thread once no run is live ([`Msg::Shutdown`]).
    exiting: bool,
    /// Told once no run is live after a [`Msg::Pause`].
    pause_ack: Option<SyncSender<()>>,
    /// Runs a [`Msg::Pause`] stopped, re-queued by [`Msg::Resume`].
    paused_runs: Vec<(SmithIdx, Wake)>,
    /// Inbox paths journaled as `task.ignored` (each once per daemon).
    ignored: HashSet<String>,
    /// The rate limit of `result.published`, per smith (notes H24).
    published: super::denials::DenialLimiter,
    /// `results/final.md` was written and `fleet.done` is not yet journaled for it.
    final_pending: bool,
    /// Each smith's state as last published and since when (RFC 3339): `state_since` (§7).
    since: HashMap<SmithIdx, (super::State, String)>,
}

/// `result.published` lines a second per smith journaled in full (and so hooks fired); the rest
/// of that second are one `result.published.suppressed` line with `count` (notes H24).
pub(crate) const PUBLISHED_PER_SECOND: u32 = 5;

/// The scheduler thread: its environment and its state.
pub(crate) struct Exec {
    env: Env,
    st: State,
}

impl Exec {
    pub(crate) fn new(
        ctx: SchedCtx,
        state_dir: OwnedFd,
        shared: Arc<Shared>,
        tx: SyncSender<Msg>,
        ready: SyncSender<()>,
    ) -> std::io::Result<Exec> {
        let log = backing::open_file(
            state_dir.as_fd(),
            c"hooks.log",
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            0o600,
        )
        .ok();
        let journal = shared.journal.clone();
        let storage = match ctx.storage.clone() {
            Some(s) => s,
            None => Arc::new(Storage::new(ctx.root.as_fd(), Arc::default())?),
        };
        let pump = Pump::start(
            storage.clone(),
            ctx.invalidate.clone(),
            journal.clone(),
            Some(tx.clone()),
        )?;
        let hooks = Hooks::new(
            ctx.config.hooks.clone(),
            Duration::from_secs(ctx.config.hook_timeout_secs.max(1)),
            ctx.binder.clone(),
            journal.clone(),
            log,
            pump.clone(),
            ctx.hook_user.clone(),
        );
        let final_copier = final_copy::FinalCopier::start(ctx.root.try_clone()?, tx.clone())?;
        Ok(Exec {
            env: Env {
                root: ctx.root,
                state_dir,
                mount: ctx.mount,
                registry: ctx.registry,
                binder: ctx.binder,
                writes: Writes::new(storage, ctx.invalidate),
                pump,
                nofile: ctx.original_nofile,
                confiner: Confinement::prepare(),
                agents: ctx.agents,
                secrets: ctx.secrets,
                launcher: launch::for_kind(&ctx.config.launcher, ctx.remote),
                shared,
                journal,
                tx,
                final_copier,
            },
            st: State {
                queue: Queue::new(ctx.config.scheduler.max_concurrent as usize),
                config: ctx.config,
                hooks,
                recs: HashMap::new(),
                live: HashMap::new(),
                ready: Some(ready),
                shutting_down: false,
                exiting: false,
                pause_ack: None,
                paused_runs: Vec::new(),
                ignored: HashSet::new(),
                published: super::denials::DenialLimiter::allowing(PUBLISHED_PER_SECOND),
                final_pending: false,
                since: HashMap::new(),
            },
        })
    }

    /// The scheduler thread's body: start up, then one round per message (or deadline).
    pub(crate) fn run(mut self, rx: Receiver<Msg>, resume: bool) {
        self.startup(resume);
        loop {
            self.dispatch();
            self.take_final();
            self.fleet_done();
            self.publish();
            if self.stopped_all() {
                break;
            }
            match self.wait(&rx) {
                Ok(msg) => self.handle(msg),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.tick();
            self.rescan_after_overflow();
        }
        self.env.final_copier.finish();
        self.take_final();
        self.fleet_done();
        self.publish();
    }

    /// No run is live while shutting down: the end of the thread ([`Msg::Shutdown`]: true), or
    /// the pause's answer ([`Msg::Pause`]).
    fn stopped_all(&mut self) -> bool {
        if !self.st.shutting_down || !self.st.live.is_empty() {
            return false;
        }
        if self.st.exiting {
            return true;
        }
        if let Some(ack) = self.st.pause_ack.take() {
            let _ = ack.try_send(());
        }
        false
    }

    /// The next message, or a timeout at the next deadline.
    fn wait(&self, rx: &Receiver<Msg>) -> Result<Msg, RecvTimeoutError> {
        match self.next_wake() {
            Some(d) => rx.recv_timeout(d),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        }
    }

    /// A trigger was dropped (the queue was full): re-derive everything from the files.
    fn rescan_after_overflow(&mut self) {
        if self.env.shared.overflow.swap(false, Ordering::SeqCst) {
            self.rescan_all();
        }
    }

    /// Hand one message to its handler.
    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Trigger(t) => self.on_trigger(t),
            Msg::Exited {
                smith,
                run_id,
                status,
                verdict,
            } => self.on_exited(smith, &run_id, status, verdict),
            Msg::JobRunning {
                smith,
                run_id,
                node,
            } => self.on_job_running(smith, &run_id, node),
            Msg::Committed { smith, run_id } => {
                if self.st.live.get(&smith).is_some_and(|l| l.run_id == run_id) {
                    self.finish(smith);
                }
            }
            Msg::Cancel(s) => self.on_cancel(s),
            // Taken at the top of the loop.
            Msg::FinalCopied => {}
            Msg::Journal(ev) => self.record(*ev),
            Msg::Reload { config, changed } => self.reload(*config, changed),
            Msg::Pause(ack) => {
                self.st.pause_ack = Some(ack);
                self.stop_all();
            }
            Msg::Resume => self.resume(),
            Msg::Shutdown => {
                self.st.exiting = true;
                self.stop_all();
            }
        }
    }

    // ----- journal and hooks -------------------------------------------------------------

    /// Journal `ev` and fire its hooks.
    fn record(&self, ev: Event) {
        match self.env.journal.append(&ev) {
            Ok(line) => {
                if self.st.hooks.wants(&ev.event) {
                    let s = ev
                        .smith
                        .as_deref()
                        .and_then(|f| self.env.registry.by_full_id(f));
                    self.st.hooks.fire(&ev, &line, &self.placeholders(s));
                }
            }
            Err(e) => tracing::error!("cannot append to the journal: {e}"),
        }
    }

    fn full_id(&self, s: SmithIdx) -> Option<FullId> {
        self.env.registry.full_id(s)
    }

    fn ev(&self, event: &str, s: SmithIdx) -> Event {
        Event::new(event, self.full_id(s))
    }

    /// The smith dir of `s` relative to the store's root (empty: no such smith).
    fn rel_dir(&self, s: SmithIdx) -> String {
        self.env
            .registry
            .get(s)
            .map(|i| i.rel_dir())
            .unwrap_or_default()
    }

    fn placeholders(&self, s: Option<SmithIdx>) -> Placeholders {
        let mount = self.env.mount.to_string_lossy().into_owned();
        let Some(info) = s.and_then(|s| self.env.registry.get(s)) else {
            return Placeholders {
                mount,
                ..Placeholders::default()
            };
        };
        let rel = info.rel_dir();
        let task = store_facts::newest_task(self.env.root.as_fd(), &rel)
            .map(|(n, _)| self.in_mount(&format!("{rel}/inbox/{n}")))
            .unwrap_or_default();
        Placeholders {
            smith_dir: self.in_mount(&rel),
            task_file: task,
            smith_id: info.id.clone(),
            full_id: info.full_id.to_string(),
            level: info.level.to_string(),
            mount,
        }
    }

    fn in_mount(&self, rel: &str) -> String {
        self.env.mount.join(rel).to_string_lossy().into_owned()
    }

    /// Journal what the model noted (`children.settled`).
    fn drain_notes(&mut self) {
        for note in self.st.queue.take_notes() {
            match note {
                Note::ChildrenSettled { parent, scheduled } => {
                    let mut ev = self.ev("children.settled", parent);
                    ev.scheduled = Some(scheduled);
                    self.record(ev);
                }
            }
        }
    }
}
