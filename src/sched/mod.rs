//! The scheduler (docs/SPEC.md §5–§9): turns triggers from the filesystem into runs of agents.
//!
//! Shape (STYLE.md habits 7, 8): [`Scheduler`] is a handle; [`Scheduler::trigger`] never blocks
//! (a bounded channel and `try_send`; a full channel is journaled and the state re-derived from
//! the files). One scheduler thread owns the pure model ([`queue::Queue`]) and handles
//! triggers, run exits and cancels in one ordered queue; the executor around it (`exec/`, one
//! handler file per kind of operation) starts runs ([`runner`]), journals ([`journal`]), fires
//! user hooks ([`hooks`]) and makes the daemon's own writes (`exec::writes`: the write, its
//! charge on the quota books and the [`Invalidate`] call, in one step).
//!
//! The daemon (`crate::daemon`) opens the queue ([`SchedulerPort::open`]) before the
//! filesystem, which sends its triggers through it and reads `status.json` and run liveness from
//! it; once the FUSE session is mounted (runs work in the mount) it starts the scheduler thread
//! on that queue ([`Scheduler::start_on`]).

mod commit;
pub mod denials;
mod exec;
pub mod hooks;
pub mod journal;
pub mod output;
pub mod queue;
pub mod runner;
pub mod store_facts;
pub mod view;

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::backing::{self, BackingIno};
use crate::config::Config;
use crate::tree::model::SmithIdx;
use crate::tree::registry::Registry;

pub use self::journal::{Event, Journal};
pub use self::queue::{State, Wake};
pub use self::runner::{NoBinder, RunBinder};
pub use crate::time;
pub use crate::trigger::Trigger;

/// How many messages the scheduler's queue holds before `trigger` starts dropping (and a
/// rescan re-derives what was dropped).
pub const QUEUE_CAPACITY: usize = 4096;

/// How long [`Scheduler::start`] waits for the first status publication (the journal read and
/// replayed) before the mount goes live anyway.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Kernel cache invalidation after the daemon's own writes, implemented by the FUSE layer with
/// notifications written to `/dev/fuse` (called from the scheduler's threads, never from a FUSE thread). Inode
/// numbers are backing-store inode numbers.
pub trait Invalidate: Send + Sync {
    /// The name `name` in the directory with backing inode `parent_backing_ino` was created or
    /// replaced.
    fn entry(&self, parent_backing_ino: BackingIno, name: &OsStr);
    /// The content or attributes of the inode `backing_ino` changed.
    fn inode(&self, backing_ino: BackingIno);
}

/// The daemon's remote mount as the launchers see it (docs/SPEC.md §13): tickets for runs
/// that reach the tree through the listener, implemented by the daemon over
/// `remote::listener::Listener`.
pub trait RemoteRuns: Send + Sync {
    /// A new secret for run `run_id` of `smith`, and its ticket's one line of text. `sandbox`
    /// is the run's §12 plan (its working directory set), which the connection's welcome
    /// carries to `smithfs attach` and whose uid and gid its requests are judged with
    /// (docs/PROTOCOL-NOTES.md R30, R31); `None`: the mount runs agents without the sandbox.
    /// What the run's node sends as output goes to `output` (the write end of the run's output
    /// pipe; `None`: discarded; docs/PROTOCOL-NOTES.md R16).
    ///
    /// # Errors
    /// One sentence (the random source failed, the plan too long for a welcome).
    fn ticket(
        &self,
        run_id: &str,
        smith: SmithIdx,
        sandbox: Option<&crate::sandbox::view::Plan>,
        output: Option<OwnedFd>,
    ) -> Result<String, String>;
    /// Run `run_id` is over: its secret is refused from now on, and its connection cut once it
    /// ended by itself or a few seconds passed (docs/PROTOCOL-NOTES.md R16). Returns the node's
    /// exit report as the wait status it stands for, if the node sent one.
    fn revoke(&self, run_id: &str) -> Option<std::process::ExitStatus>;
    /// Whether a node has connected with run `run_id`'s ticket (it may have left since).
    fn attached(&self, run_id: &str) -> bool;
}

/// An [`Invalidate`] that does nothing (tests, no mount).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoInvalidate;

impl Invalidate for NoInvalidate {
    fn entry(&self, _parent_backing_ino: BackingIno, _name: &OsStr) {}
    fn inode(&self, _backing_ino: BackingIno) {}
}

/// Everything the scheduler needs from the daemon.
pub struct SchedCtx {
    /// The backing store's root, an `O_PATH` directory descriptor (a `try_clone` of the fs's).
    pub root: OwnedFd,
    /// The mount point (runs' working directories and `SMITH_DIR` are inside it).
    pub mount: PathBuf,
    /// The mount-wide configuration.
    pub config: Config,
    /// The smith registry shared with the fs.
    pub registry: Arc<Registry>,
    /// Binds runs to smiths (the identity resolver; [`NoBinder`] without one).
    pub binder: Arc<dyn RunBinder>,
    /// Kernel cache invalidation ([`NoInvalidate`] without a mount).
    pub invalidate: Arc<dyn Invalidate>,
    /// The `RLIMIT_NOFILE` (soft, hard) the daemon started with, restored for runs; 0 leaves
    /// that one as inherited.
    pub original_nofile: (u64, u64),
    /// The storage limits the runs' output is held to (the filesystem's, shared); `None`:
    /// only the store's reserve, computed by the scheduler (no mount).
    pub storage: Option<Arc<crate::limits::storage::Storage>>,
    /// The agents' user when the sandbox is on (docs/SPEC.md §12): whom runs execute as and
    /// where their `home/` is; `None`: the sandbox is off.
    pub agents: Option<Arc<crate::sandbox::AgentUser>>,
    /// `agent.secrets_file`'s variables, read at mount: given to every run, masked in its
    /// `messages.log` (docs/SPEC.md §12); empty without one.
    pub secrets: Arc<crate::sandbox::Secrets>,
    /// Whom hooks run as (docs/SPEC.md §12: the user who mounted); `None`: the daemon's user.
    pub hook_user: Option<hooks::HookUser>,
    /// The listener's tickets when `launcher.kind` is not `local` (docs/SPEC.md §13); `None`:
    /// every run is local whatever the kind says.
    pub remote: Option<Arc<dyn RemoteRuns>>,
}

/// Messages of the scheduler's one ordered queue.
pub(crate) enum Msg {
    Trigger(Trigger),
    Exited {
        smith: SmithIdx,
        run_id: String,
        status: Result<std::process::ExitStatus, String>,
        /// Slurm's word when it decides the run's end (docs/SPEC.md §13); `None`: the status.
        verdict: Option<Verdict>,
    },
    /// A Slurm job began running on `node` (docs/SPEC.md §13): the run's clock starts now.
    JobRunning {
        smith: SmithIdx,
        run_id: String,
        node: String,
    },
    /// The auto-commit after a run's exit is over (docs/SPEC.md §11; `commit.rs`).
    Committed {
        smith: SmithIdx,
        run_id: String,
    },
    Cancel(SmithIdx),
    /// The copier thread wrote `results/final.md` (a wake-up: what it wrote is taken from the
    /// copier; notes H20).
    FinalCopied,
    /// Journal an event found off the scheduler thread (with its hooks): `run.output_dropped`
    /// from the output pump.
    Journal(Box<Event>),
    /// Apply a reloaded `config.json` (`smithfs reload`, SIGHUP; docs/SPEC.md §6): the sections
    /// that changed are journaled as `config.reloaded`.
    Reload {
        config: Box<Config>,
        changed: Vec<String>,
    },
    /// Stop every live run as an unmount does and start nothing new until [`Msg::Resume`];
    /// told on the sender once no run is live (the daemon's unmount, docs/PROTOCOL-NOTES.md O11).
    Pause(SyncSender<()>),
    /// Schedule again after a [`Msg::Pause`] whose unmount failed: the paused runs are
    /// re-queued.
    Resume,
    Shutdown,
}

/// How a cluster job ended when its scheduler, not its run, decided (docs/SPEC.md §13):
/// `run.exited`'s `reason` (`lost`, `timeout`, `oom`) and its `error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub reason: &'static str,
    pub error: String,
}

/// State shared between the handle and the scheduler thread.
pub(crate) struct Shared {
    /// The current `status.json` value, replaced after every handled message. Leaf lock, held
    /// only to clone or replace the `Arc`.
    status: Mutex<Arc<serde_json::Value>>,
    /// A trigger was dropped since the last rescan.
    overflow: AtomicBool,
    journal: Arc<Journal>,
    /// The `access.denied` rate limit (docs/SPEC.md §7), applied before the bounded queue,
    /// which a denial storm would otherwise fill.
    denials: Mutex<denials::DenialLimiter>,
    /// The same rate limit for `task.ignored`, per inbox (notes H22).
    ignored: Mutex<denials::DenialLimiter>,
    /// Smiths with a live run. Leaf lock; written by the scheduler thread when a run starts or
    /// ends.
    live: Mutex<std::collections::HashSet<SmithIdx>>,
    /// The smith registry, known once the scheduler starts (for ancestry in `subtree_live`).
    registry: OnceLock<Arc<Registry>>,
    /// The scheduler thread has started: `status.json` is the scheduler's.
    started: AtomicBool,
}

/// The scheduler's queue, made before the filesystem (which holds it as its
/// [`crate::fs::Scheduling`]) and before the scheduler thread that drains it
/// ([`Scheduler::start_on`]). Every call is cheap and never blocks.
pub struct SchedulerPort {
    tx: SyncSender<Msg>,
    rx: Mutex<Option<Receiver<Msg>>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SchedulerPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerPort").finish_non_exhaustive()
    }
}

impl SchedulerPort {
    /// Open the queue and the journal in the state directory `state` (`.smithfs-state/`),
    /// rotating at `rotation` (config.json `journal`).
    ///
    /// # Errors
    /// The journal cannot be opened.
    pub fn open(
        state: std::os::fd::BorrowedFd<'_>,
        rotation: crate::config::Rotation,
    ) -> std::io::Result<Arc<SchedulerPort>> {
        let journal = Arc::new(Journal::open(state, rotation)?);
        let shared = Arc::new(Shared {
            status: Mutex::new(Arc::new(serde_json::Value::Null)),
            overflow: AtomicBool::new(false),
            journal,
            denials: Mutex::new(denials::DenialLimiter::default()),
            ignored: Mutex::new(denials::DenialLimiter::default()),
            live: Mutex::new(Default::default()),
            registry: OnceLock::new(),
            started: AtomicBool::new(false),
        });
        let (tx, rx) = sync_channel(QUEUE_CAPACITY);
        Ok(Arc::new(SchedulerPort {
            tx,
            rx: Mutex::new(Some(rx)),
            shared,
        }))
    }

    /// Hand a trigger to the scheduler. Never blocks: if the queue is full the trigger is
    /// dropped, `trigger.dropped` is journaled (once until the next rescan) and the scheduler
    /// re-derives the state from the files. A `cancel` that cannot be queued also makes the
    /// scheduler rescan.
    pub fn trigger(&self, t: Trigger) {
        if let Trigger::Cancel { smith } = t {
            if self.tx.try_send(Msg::Cancel(smith)).is_err() {
                self.shared.overflow.store(true, Ordering::SeqCst);
            }
            return;
        }
        if let Trigger::AccessDenied { smith, .. } = &t {
            let (admit, done) = self
                .shared
                .denials
                .lock()
                .admit(*smith, denials::now_second());
            if let Some(done) = done {
                self.send(Trigger::DenialsSuppressed(done));
            }
            if !admit {
                return;
            }
        }
        if let Trigger::TaskIgnored { smith, .. } = &t {
            let (admit, done) = self
                .shared
                .ignored
                .lock()
                .admit(Some(*smith), denials::now_second());
            if let Some(done) = done {
                self.send(Trigger::IgnoredSuppressed(done));
            }
            if !admit {
                return;
            }
        }
        self.send(t);
    }

    fn send(&self, t: Trigger) {
        match self.tx.try_send(Msg::Trigger(t)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                if !self.shared.overflow.swap(true, Ordering::SeqCst) {
                    let mut ev = Event::new("trigger.dropped", None);
                    ev.error = Some("the scheduler's queue is full; rescanning".into());
                    let _ = self.shared.journal.append(&ev);
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// The mount's journal (for the daemon's own lines, e.g. a refused reload).
    pub fn journal(&self) -> &Arc<Journal> {
        &self.shared.journal
    }

    /// Is a run of `s` or of one of its descendants live? Answered from a snapshot the
    /// scheduler thread keeps, without waiting on it.
    pub fn subtree_live(&self, s: SmithIdx) -> bool {
        let Some(registry) = self.shared.registry.get() else {
            return false;
        };
        // Copy out first: the registry's lock is never taken under ours.
        let live: Vec<SmithIdx> = self.shared.live.lock().iter().copied().collect();
        live.iter().any(|x| *x == s || registry.is_ancestor(s, *x))
    }
}

impl crate::fs::Scheduling for SchedulerPort {
    fn trigger(&self, t: Trigger) {
        SchedulerPort::trigger(self, t);
    }

    fn status_json(&self) -> Option<String> {
        if !self.shared.started.load(Ordering::SeqCst) {
            return None;
        }
        let mut v =
            serde_json::to_vec_pretty(&*self.shared.status.lock().clone()).unwrap_or_default();
        v.push(b'\n');
        Some(String::from_utf8(v).unwrap_or_default())
    }

    fn subtree_live(&self, smith: SmithIdx) -> bool {
        SchedulerPort::subtree_live(self, smith)
    }

    fn journal_end(&self) -> Option<u64> {
        Some(self.shared.journal.end())
    }

    fn journal_read(
        &self,
        offset: u64,
        len: usize,
    ) -> Option<Result<(u64, Vec<u8>), nix::errno::Errno>> {
        Some(self.shared.journal.read_at(offset, len))
    }
}

impl SchedulerPort {
    /// Hand a reloaded configuration to the scheduler (`smithfs reload`, SIGHUP; docs/SPEC.md
    /// §6); `changed` names the sections that differ (`agent`, `hooks` …), journaled with
    /// `config.reloaded` once applied. Never blocks.
    ///
    /// # Errors
    /// The scheduler's queue is full or the scheduler has stopped (one sentence).
    pub fn reload(&self, config: Config, changed: Vec<String>) -> Result<(), String> {
        self.tx
            .try_send(Msg::Reload {
                config: Box::new(config),
                changed,
            })
            .map_err(|e| match e {
                TrySendError::Full(_) => "the scheduler is busy; try again".to_string(),
                TrySendError::Disconnected(_) => "the scheduler has stopped".to_string(),
            })
    }
}

/// Why [`Scheduler::cancel`] refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CancelError {
    /// No registered smith has that full id.
    #[error("no smith {0}")]
    UnknownSmith(String),
    /// The scheduler's queue is full; try again.
    #[error("the scheduler is busy; try again")]
    Busy,
    /// The scheduler has stopped.
    #[error("the scheduler has stopped")]
    Stopped,
}

/// The handle of a running scheduler. Cheap calls, safe from any thread.
pub struct Scheduler {
    port: Arc<SchedulerPort>,
    tx: SyncSender<Msg>,
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// Start the scheduler thread: it scans the tree and rebuilds each smith's state (§9),
    /// kills what is left of runs a dead daemon recorded as started but not exited (journal
    /// `run.interrupted`), schedules every smith whose newest task is newer than its last run
    /// start and that has no result, with `resume` also re-queues the interrupted runs, then
    /// handles messages until [`Scheduler::shutdown`].
    ///
    /// Errors: the state directory or the journal cannot be opened.
    pub fn start(ctx: SchedCtx, resume: bool) -> std::io::Result<Scheduler> {
        let name = std::ffi::CString::new(crate::tree::layout::STATE_DIR)?;
        let state = backing::ensure_dir(ctx.root.as_fd(), &name, 0o700)?;
        let port = SchedulerPort::open(state.as_fd(), ctx.config.journal.rotation())?;
        Scheduler::start_on(port, ctx, resume)
    }

    /// [`Scheduler::start`] on a queue made earlier ([`SchedulerPort::open`]), which the filesystem
    /// already sends to.
    ///
    /// Errors: the state directory cannot be opened, or the queue already has a scheduler.
    pub fn start_on(
        port: Arc<SchedulerPort>,
        ctx: SchedCtx,
        resume: bool,
    ) -> std::io::Result<Scheduler> {
        let name = std::ffi::CString::new(crate::tree::layout::STATE_DIR)?;
        let state = backing::ensure_dir(ctx.root.as_fd(), &name, 0o700)?;
        let rx = port
            .rx
            .lock()
            .take()
            .ok_or_else(|| std::io::Error::other("the scheduler's queue is already drained"))?;
        let shared = port.shared.clone();
        // Until the scheduler thread's first publication (the journal's history, before it
        // kills a dead daemon's leftovers), which `start` waits for.
        *shared.status.lock() =
            Arc::new(ctx.registry.idle_status(ctx.config.agent.command.is_some()));
        let _ = shared.registry.set(ctx.registry.clone());
        shared.started.store(true, Ordering::SeqCst);
        let tx = port.tx.clone();
        let registry = ctx.registry.clone();
        let (ready_tx, ready_rx) = sync_channel(1);
        let exec = exec::Exec::new(ctx, state, shared.clone(), tx.clone(), ready_tx)?;
        let thread = std::thread::Builder::new()
            .name("smithfs-sched".into())
            .spawn(move || exec.run(rx, resume))?;
        // `status.json` shows the journal's history as soon as the mount is up (§7, §9): the
        // thread publishes it right after reading the journal, before killing leftovers.
        if ready_rx.recv_timeout(READY_TIMEOUT).is_err() {
            tracing::warn!("the scheduler has not published its first status yet");
        }
        Ok(Scheduler {
            port,
            tx,
            shared,
            registry,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Hand a trigger to the scheduler. Never blocks: if the queue is full the trigger is
    /// dropped, `trigger.dropped` is journaled (once until the next rescan) and the scheduler
    /// re-derives the state from the files.
    pub fn trigger(&self, t: Trigger) {
        self.port.trigger(t);
    }

    /// Cancel `full_id` and its subtree: their runs are stopped (TERM, KILL after
    /// `kill_grace_secs`) and they are marked cancelled (`run.cancelled`). Never blocks; the
    /// cancel happens on the scheduler thread.
    pub fn cancel(&self, full_id: &str) -> Result<(), CancelError> {
        let s = self
            .registry
            .by_full_id(full_id)
            .ok_or_else(|| CancelError::UnknownSmith(full_id.to_string()))?;
        self.tx.try_send(Msg::Cancel(s)).map_err(|e| match e {
            TrySendError::Full(_) => CancelError::Busy,
            TrySendError::Disconnected(_) => CancelError::Stopped,
        })
    }

    /// Cancel smith `s` and its subtree (see [`Scheduler::cancel`]).
    pub fn cancel_smith(&self, s: SmithIdx) -> Result<(), CancelError> {
        self.tx.try_send(Msg::Cancel(s)).map_err(|e| match e {
            TrySendError::Full(_) => CancelError::Busy,
            TrySendError::Disconnected(_) => CancelError::Stopped,
        })
    }

    /// Is a run of `s` or of one of its descendants live? Answered from a snapshot the
    /// scheduler thread keeps, without waiting on it.
    pub fn subtree_live(&self, s: SmithIdx) -> bool {
        self.port.subtree_live(s)
    }

    /// The current `status.json` content as a string (for `SmithFs`'s status source).
    pub fn status_string(&self) -> String {
        String::from_utf8(self.status_json()).unwrap_or_default()
    }

    /// The current `status.json` value (docs/SPEC.md §7).
    pub fn status(&self) -> Arc<serde_json::Value> {
        self.shared.status.lock().clone()
    }

    /// The current `status.json` content, pretty-printed with a final newline.
    pub fn status_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(&*self.status()).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Stop every live run the way an unmount does (TERM, KILL after `kill_grace_secs`,
    /// journaled `run.interrupted`) and start nothing new, until [`Scheduler::resume`] or
    /// [`Scheduler::shutdown`]; returns once no run is live (or after `patience`). The journal,
    /// hooks and `status.json` go on meanwhile (docs/PROTOCOL-NOTES.md O11).
    pub fn pause(&self, patience: std::time::Duration) {
        let (ack_tx, ack_rx) = sync_channel(1);
        if self.tx.send(Msg::Pause(ack_tx)).is_ok() {
            let _ = ack_rx.recv_timeout(patience);
        }
    }

    /// Schedule again after [`Scheduler::pause`] (an unmount that failed): what the pause
    /// stopped is re-queued, tasks that arrived meanwhile run.
    pub fn resume(&self) {
        let _ = self.tx.send(Msg::Resume);
    }

    /// Stop every live run the way a dead daemon's leftovers are stopped (TERM, KILL after
    /// `kill_grace_secs`, journaled `run.interrupted`, re-queued by a later `--resume`) and end
    /// the scheduler thread. Blocks until done; idempotent.
    pub fn shutdown(&self) {
        let Some(thread) = self.thread.lock().take() else {
            return;
        };
        let _ = self.tx.send(Msg::Shutdown);
        let _ = thread.join();
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shutdown();
    }
}
