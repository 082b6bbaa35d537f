//! The executor: the scheduler thread's loop around the pure [`Queue`]. It turns messages into
//! model calls, starts what [`Queue::next`] names, watches deadlines, stops process groups,
//! journals, and makes the daemon's own writes (run dirs, `meta.json`, `results/final.md`).
//!
//! Only this thread touches the model and the live-run table; run leaders are reaped by one
//! waiter thread per run, which posts [`Msg::Exited`] into the same ordered queue.
//!
//! Long on purpose: the one scheduler thread's handling of every message, in the order it applies
//! them.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use super::hooks::Hooks;
use super::journal::{self, Event, Journal, LastRun, OpenRun, Terminal};
use super::output::{self, Pump, Sink, StreamId};
use super::queue::{Base, Note, Outcome, Queue, RunEnd, State, Wake};
use super::runner::{self, BindTo, Launch, Meta, Placeholders, RunBinder, RunDir};
use super::{store_facts, time, Invalidate, Msg, SchedCtx, Shared, Trigger};
use crate::backing::{self, BackingIno};
use crate::config::{AgentConfig, Config, SmithConfig};
use crate::limits::storage::{Home, Storage};
use crate::policy::zone::Area;
use crate::process::confine::Confinement;
use crate::tree::model::{FullId, SmithIdx};
use crate::tree::registry::{Registry, SmithInfo};

/// How long after SIGKILL the executor waits for a stopped group to vanish before it gives up
/// and finalizes the run anyway (a process stuck in uninterruptible sleep).
const KILL_GIVE_UP: Duration = Duration::from_secs(10);

/// How often a stopped run whose leader is reaped is checked for remaining group members.
const GROUP_POLL: Duration = Duration::from_millis(20);

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopReason {
    Timeout,
    Cancel,
    Shutdown,
}

struct Stop {
    reason: StopReason,
    kill_at: Instant,
    killed: bool,
    give_up: Option<Instant>,
}

/// A live run.
struct Live {
    run_id: String,
    pgid: i32,
    deadline: Instant,
    grace: Duration,
    retries: u32,
    stop: Option<Stop>,
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
}

pub(crate) struct Exec {
    root: OwnedFd,
    state: OwnedFd,
    mount: PathBuf,
    config: Config,
    registry: Arc<Registry>,
    binder: Arc<dyn RunBinder>,
    invalidate: Arc<dyn Invalidate>,
    /// The storage limits (the filesystem's): runs' directories and logs are charged to their
    /// smith (docs/SPEC.md §8).
    storage: Arc<Storage>,
    /// Drains runs' and hooks' output into their logs (docs/PROTOCOL-NOTES.md L17).
    pump: Pump,
    nofile: (u64, u64),
    /// How this daemon confines runs when `agent.confine` is on (`None`: it cannot, not being
    /// privileged; docs/PROTOCOL-NOTES.md H13).
    confiner: Option<Confinement>,
    queue: Queue,
    recs: HashMap<SmithIdx, Rec>,
    live: HashMap<SmithIdx, Live>,
    shared: Arc<Shared>,
    journal: Arc<Journal>,
    hooks: Hooks,
    tx: SyncSender<Msg>,
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
    ignored: std::collections::HashSet<String>,
    /// `results/final.md` was written and `fleet.done` is not yet journaled for it.
    final_pending: bool,
    /// Each smith's state as last published and since when (RFC 3339): `state_since` (§7).
    since: std::cell::RefCell<HashMap<SmithIdx, (State, String)>>,
}

fn signal_group(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory involved.
        unsafe { libc::kill(-pgid, sig) };
    }
}

/// Is no process left in group `pgid`?
fn group_gone(pgid: i32) -> bool {
    if pgid <= 1 {
        return true;
    }
    // SAFETY: signal 0 only checks for existence.
    let r = unsafe { libc::kill(-pgid, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

impl Exec {
    pub(crate) fn new(
        ctx: SchedCtx,
        state: OwnedFd,
        shared: Arc<Shared>,
        tx: SyncSender<Msg>,
        ready: SyncSender<()>,
    ) -> std::io::Result<Exec> {
        let log = backing::open_file(
            state.as_fd(),
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
        );
        Ok(Exec {
            queue: Queue::new(ctx.config.scheduler.max_concurrent as usize),
            root: ctx.root,
            state,
            mount: ctx.mount,
            config: ctx.config,
            registry: ctx.registry,
            binder: ctx.binder,
            invalidate: ctx.invalidate,
            storage,
            pump,
            nofile: ctx.original_nofile,
            confiner: Confinement::prepare(),
            recs: HashMap::new(),
            live: HashMap::new(),
            shared,
            journal,
            hooks,
            tx,
            ready: Some(ready),
            shutting_down: false,
            exiting: false,
            pause_ack: None,
            paused_runs: Vec::new(),
            ignored: Default::default(),
            since: Default::default(),
            final_pending: false,
        })
    }

    /// The scheduler thread's body.
    pub(crate) fn run(mut self, rx: Receiver<Msg>, resume: bool) {
        self.startup(resume);
        loop {
            self.dispatch();
            self.fleet_done();
            self.publish();
            if self.shutting_down && self.live.is_empty() {
                if self.exiting {
                    break;
                }
                if let Some(ack) = self.pause_ack.take() {
                    let _ = ack.try_send(());
                }
            }
            let msg = match self.next_wake() {
                Some(d) => rx.recv_timeout(d),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match msg {
                Ok(m) => self.handle(m),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.tick();
            if self
                .shared
                .overflow
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                self.rescan_all();
            }
        }
        self.publish();
    }

    // ----- journal and hooks -------------------------------------------------------------

    fn record(&self, ev: Event) {
        match self.journal.append(&ev) {
            Ok(line) => {
                if self.hooks.wants(&ev.event) {
                    let s = ev
                        .smith
                        .as_deref()
                        .and_then(|f| self.registry.by_full_id(f));
                    self.hooks.fire(&ev, &line, &self.placeholders(s));
                }
            }
            Err(e) => tracing::error!("cannot append to the journal: {e}"),
        }
    }

    fn full_id(&self, s: SmithIdx) -> Option<FullId> {
        self.registry.full_id(s)
    }

    fn ev(&self, event: &str, s: SmithIdx) -> Event {
        Event::new(event, self.full_id(s))
    }

    fn placeholders(&self, s: Option<SmithIdx>) -> Placeholders {
        let mount = self.mount.to_string_lossy().into_owned();
        let Some(info) = s.and_then(|s| self.registry.get(s)) else {
            return Placeholders {
                mount,
                ..Placeholders::default()
            };
        };
        let rel = info.rel_dir();
        let task = store_facts::newest_task(self.root.as_fd(), &rel)
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
        self.mount.join(rel).to_string_lossy().into_owned()
    }

    fn drain_notes(&mut self) {
        for note in self.queue.take_notes() {
            match note {
                Note::ChildrenSettled { parent, scheduled } => {
                    let mut ev = self.ev("children.settled", parent);
                    ev.scheduled = Some(scheduled);
                    self.record(ev);
                }
            }
        }
    }

    // ----- start-up (§6, §9) -------------------------------------------------------------

    fn startup(&mut self, resume: bool) {
        if let Err(e) = crate::fs::rebuild::scan(self.root.as_fd(), &self.registry, &HashMap::new())
        {
            tracing::warn!("cannot scan the smith tree: {e}");
        }
        // The snapshot of rotated-away lines plus every journal file (docs/SPEC.md §7).
        let journal::Replay { hist, open } =
            journal::load(self.state.as_fd()).unwrap_or_else(|e| {
                tracing::error!("cannot read the journal: {e}");
                journal::Replay::default()
            });
        let all = self.registry.all();
        for info in &all {
            self.queue.add(info.idx, info.parent);
        }
        for info in &all {
            let h = hist.get(info.full_id.as_str()).cloned().unwrap_or_default();
            let has_result = store_facts::has_result(self.root.as_fd(), &info.rel_dir());
            let base = if has_result {
                Base::Done
            } else {
                match h.terminal {
                    Some(Terminal::Failed) => Base::Failed,
                    Some(Terminal::Cancelled) => Base::Cancelled,
                    None if h.runs > 0 && !info.children.is_empty() => Base::Waiting,
                    None => Base::Idle,
                }
            };
            self.queue.set_base(info.idx, base);
            self.recs.insert(
                info.idx,
                Rec {
                    runs: h.runs,
                    last_run: h.last_run,
                    last_start: h.last_start,
                    has_result,
                    next_run: h.runs + 1,
                    announced: None,
                },
            );
        }
        // Publish the history now: killing leftovers below may take 2 × kill_grace_secs.
        self.publish();
        if let Some(ready) = self.ready.take() {
            let _ = ready.try_send(());
        }
        let mut interrupted: Vec<(SmithIdx, Wake)> = all
            .iter()
            .filter_map(|i| {
                let w = hist.get(i.full_id.as_str())?.interrupted.as_deref()?;
                Some((i.idx, Wake::parse(w).unwrap_or(Wake::Task)))
            })
            .collect();
        for o in open {
            let s = self.registry.by_full_id(&o.smith);
            self.kill_leftover(s, &o);
            let mut ev = Event::new("run.interrupted", Some(o.smith.clone()));
            ev.run_id = Some(o.run_id.clone());
            ev.pid = o.pid;
            ev.wake = Some(o.wake.clone());
            self.record(ev);
            if let Some(s) = s {
                if let Some(lr) = self
                    .recs
                    .get_mut(&s)
                    .and_then(|r| r.last_run.as_mut())
                    .filter(|lr| lr.run_id == o.run_id)
                {
                    lr.ended = Some(time::now());
                }
                self.mark_meta_interrupted(s, &o.run_id);
                interrupted.push((s, Wake::parse(&o.wake).unwrap_or(Wake::Task)));
            }
        }
        for info in &all {
            self.rescan_task(info.idx);
        }
        if resume {
            for (s, wake) in interrupted {
                if self.result_is_stale(s) {
                    self.queue.request(s, wake);
                }
            }
        }
        for info in all.iter().rev() {
            if matches!(
                self.queue.state(info.idx),
                super::State::Waiting | super::State::Idle
            ) {
                self.queue.check_settled(info.idx);
            }
        }
        self.drain_notes();
        self.update_final();
    }

    /// Kill what is left of a run a dead daemon recorded as started: its cgroup (binder) and
    /// its process group, TERM then KILL after the grace period. The group is signalled only if
    /// the leader is still the same process (same start time) or gone (a pid number is never
    /// reused while a process group of that number exists).
    fn kill_leftover(&self, s: Option<SmithIdx>, o: &OpenRun) {
        let grace = Duration::from_secs(self.config.agent.kill_grace_secs);
        let pgid = o.pgid.or(o.pid.map(|p| p as i32)).unwrap_or(0);
        let same = match (o.pid, runner_ticks(o.pid)) {
            (_, None) => true,
            (Some(_), Some(t)) => Some(t) == o.start_ticks,
            (None, Some(_)) => false,
        };
        let pgid = if same { pgid } else { 0 };
        // A dead daemon's run may have left `setsid` descendants outside its process group but
        // inside its (old) cgroup: kill what that daemon left in its cgroups, if no live daemon
        // claims them (`kill_dead_parent` checks).
        if let Some(parent) = o.cgroup.as_deref().and_then(|c| Path::new(c).parent()) {
            crate::identity::cgroup::kill_dead_parent(parent, grace);
        }
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            if let Some(s) = s {
                self.binder.kill_smith(s, sig);
            }
            signal_group(pgid, sig);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                let cg = s.and_then(|s| self.binder.smith_has_processes(s));
                if group_gone(pgid) && cg != Some(true) {
                    return;
                }
                std::thread::sleep(GROUP_POLL);
            }
        }
    }

    fn mark_meta_interrupted(&self, s: SmithIdx, run_id: &str) {
        let Some(info) = self.registry.get(s) else {
            return;
        };
        let rel = Path::new(&info.rel_dir())
            .join("conversations")
            .join(run_id);
        let Ok(dir) = backing::open_dir_path(self.root.as_fd(), &rel) else {
            return;
        };
        let mut meta: Meta = backing::read_file(dir.as_fd(), Path::new("meta.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        meta.interrupted = true;
        meta.end = Some(time::now());
        if let Ok(st) = backing::stat(dir.as_fd()) {
            self.write_meta(s, dir.as_fd(), BackingIno::of(&st), &meta);
        }
    }

    // ----- the loop ----------------------------------------------------------------------

    fn next_wake(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        for l in self.live.values().filter(|l| !l.committing) {
            match &l.stop {
                None => consider(l.deadline),
                Some(st) => {
                    if !st.killed {
                        consider(st.kill_at);
                    }
                    if l.exit.is_some() || st.killed {
                        consider(now + GROUP_POLL);
                    }
                }
            }
        }
        if self.shared.denials.lock().pending() {
            // A suppressed count is journaled soon after its second ends.
            consider(now + Duration::from_millis(250));
        }
        next.map(|t| t.saturating_duration_since(now))
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Trigger(t) => self.on_trigger(t),
            Msg::Exited {
                smith,
                run_id,
                status,
            } => {
                let Some(l) = self.live.get_mut(&smith).filter(|l| l.run_id == run_id) else {
                    return;
                };
                l.exit = Some(status);
                let stopping = l.stop.is_some();
                if !stopping {
                    self.finalize(smith);
                }
            }
            Msg::Committed { smith, run_id } => {
                if self.live.get(&smith).is_some_and(|l| l.run_id == run_id) {
                    self.finish(smith);
                }
            }
            Msg::Cancel(s) => self.on_cancel(s),
            Msg::Journal(ev) => self.record(*ev),
            Msg::Reload { config, changed } => self.reload(*config, changed),
            Msg::Pause(ack) => {
                self.pause_ack = Some(ack);
                self.stop_all();
            }
            Msg::Resume => self.resume(),
            Msg::Shutdown => {
                self.exiting = true;
                self.stop_all();
            }
        }
    }

    /// Stop every live run as an unmount does and start nothing new.
    fn stop_all(&mut self) {
        self.shutting_down = true;
        let live: Vec<SmithIdx> = self.live.keys().copied().collect();
        for s in live {
            self.begin_stop(s, StopReason::Shutdown);
        }
    }

    /// After a pause whose unmount failed: re-queue what the pause stopped (as `--resume`
    /// would) and schedule again (docs/PROTOCOL-NOTES.md O11).
    fn resume(&mut self) {
        if self.exiting || !self.shutting_down {
            return;
        }
        self.shutting_down = false;
        self.pause_ack = None;
        tracing::info!("the unmount failed: scheduling again");
        for (s, wake) in std::mem::take(&mut self.paused_runs) {
            if self.result_is_stale(s) {
                self.queue.request(s, wake);
            }
        }
        self.rescan_all();
    }

    /// Apply a reloaded `config.json` (docs/SPEC.md §6; validated and diffed by the daemon,
    /// `crate::reload`): agent and scheduler settings for the next runs, hooks for the next
    /// events, the journal's rotation for the next line; then journal `config.reloaded`.
    fn reload(&mut self, config: Config, changed: Vec<String>) {
        self.queue
            .set_max_concurrent(config.scheduler.max_concurrent as usize);
        self.journal.set_limits(config.journal.rotation());
        self.hooks.set(
            config.hooks.clone(),
            Duration::from_secs(config.hook_timeout_secs.max(1)),
        );
        self.config = config;
        let mut ev = Event::new("config.reloaded", None);
        ev.path = Some("config.json".into());
        ev.changed = Some(changed);
        self.record(ev);
        // Tasks that waited for an agent (or for a free slot) may start now.
        self.rescan_all();
    }

    fn tick(&mut self) {
        let done = self
            .shared
            .denials
            .lock()
            .flush(super::denials::now_second());
        for d in done {
            self.record_suppressed(d);
        }
        let now = Instant::now();
        let smiths: Vec<SmithIdx> = self.live.keys().copied().collect();
        for s in smiths {
            let Some(l) = self.live.get_mut(&s) else {
                continue;
            };
            if l.committing {
                // Over: only its auto-commit is running (with a deadline of its own).
                continue;
            }
            match &mut l.stop {
                None => {
                    if now >= l.deadline {
                        self.begin_stop(s, StopReason::Timeout);
                    }
                }
                Some(st) => {
                    if !st.killed && now >= st.kill_at {
                        st.killed = true;
                        st.give_up = Some(now + KILL_GIVE_UP);
                        signal_group(l.pgid, libc::SIGKILL);
                        self.binder.kill_smith(s, libc::SIGKILL);
                    }
                    let give_up = st.give_up.is_some_and(|g| now >= g);
                    let pgid = l.pgid;
                    if l.exit.is_some() {
                        let cg = self.binder.smith_has_processes(s);
                        if (group_gone(pgid) && cg != Some(true)) || give_up {
                            self.finalize(s);
                        }
                    }
                }
            }
        }
    }

    fn begin_stop(&mut self, s: SmithIdx, reason: StopReason) {
        let Some(l) = self.live.get_mut(&s) else {
            return;
        };
        if l.stop.is_some() {
            return;
        }
        signal_group(l.pgid, libc::SIGTERM);
        self.binder.kill_smith(s, libc::SIGTERM);
        l.stop = Some(Stop {
            reason,
            kill_at: Instant::now() + l.grace,
            killed: false,
            give_up: None,
        });
    }

    // ----- triggers ----------------------------------------------------------------------

    /// Make sure `s` (and its ancestors) are in the model, from the registry.
    fn ensure_known(&mut self, s: SmithIdx) -> Option<SmithInfo> {
        let info = self.registry.get(s)?;
        if !self.queue.contains(s) {
            if let Some(p) = info.parent {
                self.ensure_known(p)?;
            }
            self.queue.add(s, info.parent);
            let rec = self.recs.entry(s).or_default();
            rec.next_run = rec.next_run.max(1);
        }
        Some(info)
    }

    fn on_trigger(&mut self, t: Trigger) {
        match t {
            Trigger::TaskAssigned { smith, file } => {
                let Some(info) = self.ensure_known(smith) else {
                    return;
                };
                let rel = info.rel_dir();
                let arrived = store_facts::task_time(self.root.as_fd(), &rel, &file);
                let rec = self.recs.entry(smith).or_default();
                // The rescan found this very write first (at start-up or after a dropped
                // trigger) and journaled it: its trigger is the same assignment.
                if arrived.is_some_and(|t| rec.announced.as_ref() == Some(&(file.clone(), t))) {
                    rec.announced = None;
                    return;
                }
                let last = rec.last_start;
                // A task the current or last run already saw (its rescan got there first)
                // schedules nothing.
                let schedule = match (arrived, last) {
                    (Some(t), Some(l)) => t > l,
                    (Some(_), None) => true,
                    (None, _) => false,
                };
                let mut ev = self.ev("task.assigned", smith);
                ev.path = Some(format!("{rel}/inbox/{file}"));
                ev.scheduled = Some(schedule);
                self.record(ev);
                if schedule {
                    self.queue.request(smith, Wake::Task);
                }
            }
            Trigger::ResultPublished { smith } => {
                let Some(info) = self.ensure_known(smith) else {
                    return;
                };
                let rel = info.rel_dir();
                let mut ev = self.ev("result.published", smith);
                ev.path = Some(format!("{rel}/outbox/result.md"));
                self.record(ev);
                if let Some(r) = self.recs.get_mut(&smith) {
                    r.has_result = true;
                }
                self.queue.result_published(smith);
                self.drain_notes();
                if info.parent.is_none() {
                    self.update_final();
                }
            }
            Trigger::SmithCreated { smith, moved } => {
                let Some(info) = self.ensure_known(smith) else {
                    return;
                };
                let ev = self.ev("smith.created", smith);
                self.record(ev);
                // A moved smith has no history under its new full id: its state comes from its
                // files (done with a result, else idle). The move itself starts no run.
                if moved && store_facts::has_result(self.root.as_fd(), &info.rel_dir()) {
                    self.queue.set_base(smith, Base::Done);
                    if let Some(r) = self.recs.get_mut(&smith) {
                        r.has_result = true;
                    }
                }
            }
            Trigger::SmithRemoved { smith } => {
                // Its runs are over (the operator may remove only an idle subtree); its parent
                // may now have all its remaining children settled.
                for gone in self.queue.remove(smith) {
                    tracing::warn!(smith = gone.0, "a removed smith still had a live run");
                }
                self.drain_notes();
            }
            Trigger::AccessDenied {
                smith,
                pid,
                op,
                path,
                errno,
                rule,
            } => {
                let mut ev = Event::new("access.denied", smith.and_then(|s| self.full_id(s)));
                ev.pid = Some(pid);
                ev.op = Some(op);
                ev.path = Some(path);
                ev.errno = Some(errno);
                ev.rule = Some(rule);
                self.record(ev);
            }
            Trigger::DenialsSuppressed(d) => self.record_suppressed(d),
            Trigger::TaskIgnored {
                smith,
                file,
                reason,
            } => {
                let Some(info) = self.registry.get(smith) else {
                    return;
                };
                let path = format!("{}/inbox/{file}", info.rel_dir());
                // Once per name (docs/SPEC.md §5): rewriting it says nothing new.
                if !self.ignored.insert(path.clone()) {
                    return;
                }
                let mut ev = self.ev("task.ignored", smith);
                ev.path = Some(path);
                ev.reason = Some(format!("the name {reason}"));
                self.record(ev);
            }
            Trigger::Cancel { smith } => self.on_cancel(smith),
            Trigger::Retry { smith } => {
                if self.queue.retry(smith) {
                    tracing::info!(smith = ?self.full_id(smith), "retry requested");
                }
            }
        }
    }

    /// Journal one `access.denied.suppressed` line (docs/SPEC.md §7).
    fn record_suppressed(&self, d: super::denials::Suppressed) {
        let mut ev = Event::new(
            "access.denied.suppressed",
            d.smith.and_then(|s| self.full_id(s)),
        );
        ev.count = Some(d.count);
        self.record(ev);
    }

    fn on_cancel(&mut self, s: SmithIdx) {
        let now = SystemTime::now();
        for (x, live) in self.queue.cancel(s) {
            // The cancel consumes the tasks that are there: a rescan must not revive it.
            self.recs.entry(x).or_default().last_start = Some(now);
            let mut ev = self.ev("run.cancelled", x);
            if live {
                ev.run_id = self.live.get(&x).map(|l| l.run_id.clone());
                self.begin_stop(x, StopReason::Cancel);
            }
            self.record(ev);
        }
        self.drain_notes();
    }

    /// If `s` has no result and its newest task arrived after its last run start, ask for a run
    /// (journaled `task.assigned`): the rescan that makes sure no completion is lost.
    /// Does smith `s` still owe a result: none in its outbox, or one older than its newest task
    /// (an interrupted run of a done smith that was given new work, §6 `--resume`)?
    fn result_is_stale(&self, s: SmithIdx) -> bool {
        let Some(info) = self.registry.get(s) else {
            return false;
        };
        let rel = info.rel_dir();
        match store_facts::result_time(self.root.as_fd(), &rel) {
            None => true,
            Some(r) => {
                store_facts::newest_task(self.root.as_fd(), &rel).is_some_and(|(_, t)| t > r)
            }
        }
    }

    fn rescan_task(&mut self, s: SmithIdx) {
        let Some(info) = self.registry.get(s) else {
            return;
        };
        let rel = info.rel_dir();
        let has_result = store_facts::has_result(self.root.as_fd(), &rel);
        if let Some(r) = self.recs.get_mut(&s) {
            r.has_result = has_result;
        }
        if has_result {
            return;
        }
        let Some((name, arrived)) = store_facts::newest_task(self.root.as_fd(), &rel) else {
            return;
        };
        let last = self.recs.get(&s).and_then(|r| r.last_start);
        if last.is_some_and(|l| arrived <= l) || self.queue.is_pending(s) {
            return;
        }
        if let Some(r) = self.recs.get_mut(&s) {
            let seen = (name.clone(), arrived);
            if r.announced.as_ref() == Some(&seen) {
                return;
            }
            r.announced = Some(seen);
        }
        let mut ev = self.ev("task.assigned", s);
        ev.path = Some(format!("{rel}/inbox/{name}"));
        ev.scheduled = Some(true);
        self.record(ev);
        self.queue.request(s, Wake::Task);
    }

    /// Re-derive everything from the files after dropped triggers.
    fn rescan_all(&mut self) {
        let _ = crate::fs::rebuild::scan(self.root.as_fd(), &self.registry, &HashMap::new());
        let all = self.registry.all();
        for info in &all {
            self.ensure_known(info.idx);
        }
        let known: Vec<SmithIdx> = self.queue.smiths();
        for s in known {
            if !all.iter().any(|i| i.idx == s) {
                self.queue.remove(s);
            }
        }
        for info in &all {
            self.rescan_task(info.idx);
            let done = self.recs.get(&info.idx).is_some_and(|r| r.has_result);
            // A result older than the newest task belongs to an earlier task: it does not make
            // a smith cancelled or failed on the new one done (docs/PROTOCOL-NOTES.md S29).
            if done
                && !self.queue.is_running(info.idx)
                && self.queue.state(info.idx) != super::State::Done
                && !self.result_is_stale(info.idx)
            {
                self.queue.result_published(info.idx);
            }
        }
        self.drain_notes();
        self.update_final();
    }

    fn update_final(&mut self) {
        if !self
            .registry
            .root()
            .and_then(|r| self.recs.get(&r))
            .is_some_and(|r| r.has_result)
        {
            return;
        }
        match store_facts::copy_final(self.root.as_fd()) {
            Ok(Some(copied)) => {
                self.invalidate
                    .entry(copied.results_ino, OsStr::new("final.md"));
                // `results/` made now at the mount root: its name (a lookup before may have left
                // a negative entry, U13) and the root's attributes changed.
                if copied.results_made {
                    if let Ok(st) = backing::stat(self.root.as_fd()) {
                        let root = BackingIno::of(&st);
                        self.invalidate.entry(root, OsStr::new("results"));
                        self.invalidate.inode(root);
                    }
                }
                self.final_pending = true;
            }
            Ok(None) => {}
            Err(e) => tracing::error!("cannot copy the root's result to results/final.md: {e}"),
        }
    }

    /// `results/final.md` was written and no run of the tree is live or queued (now, or once
    /// the last run ended): journal `fleet.done` (smith `smith-root`, docs/SPEC.md §5), which
    /// fires its hooks — once per written `final.md` (O6).
    fn fleet_done(&mut self) {
        if !self.final_pending || !self.live.is_empty() || !self.queue.fifo().is_empty() {
            return;
        }
        self.final_pending = false;
        let Some(root) = self.registry.root() else {
            return;
        };
        let mut ev = self.ev("fleet.done", root);
        ev.path = Some("results/final.md".into());
        self.record(ev);
    }

    // ----- runs --------------------------------------------------------------------------

    fn dispatch(&mut self) {
        if self.shutting_down || self.config.agent.command.is_none() {
            return;
        }
        while let Some(s) = self.queue.next() {
            let Some(wake) = self.queue.start(s) else {
                break;
            };
            self.start_run(s, wake);
        }
    }

    /// The smith's effective agent config: the mount-wide one merged with its own
    /// `config.json`. Errors: a one-line reason naming the file and key.
    fn smith_agent(&self, rel: &str) -> Result<AgentConfig, String> {
        let path = Path::new(rel).join("config.json");
        match backing::read_file(self.root.as_fd(), &path) {
            Err(nix::errno::Errno::ENOENT) => Ok(self.config.agent.clone()),
            Err(e) => Err(format!("cannot read {rel}/config.json: {e}")),
            Ok(bytes) => {
                let text = String::from_utf8(bytes)
                    .map_err(|_| format!("{rel}/config.json: not UTF-8"))?;
                SmithConfig::parse(&text)
                    .map(|c| c.merged(&self.config.agent))
                    .map_err(|e| format!("{rel}/{e}"))
            }
        }
    }

    /// Charge a new run's directory and log to its smith (docs/SPEC.md §8; the daemon's write,
    /// never refused).
    fn charge_run_dir(&self, s: SmithIdx, dir: &RunDir) {
        self.storage.charge_fd(dir.dir.as_fd(), Some(run_home(s)));
        self.storage.charge_fd(dir.log.as_fd(), Some(run_home(s)));
    }

    /// Write `meta.json` of smith `s`'s run `dir` (a new inode each time: the books drop the
    /// one it replaces) and tell the kernel.
    fn write_meta(
        &self,
        s: SmithIdx,
        dir: std::os::fd::BorrowedFd<'_>,
        dir_ino: BackingIno,
        meta: &Meta,
    ) {
        let old = backing::stat_at(dir, c"meta.json")
            .ok()
            .map(|st| BackingIno::of(&st));
        if runner::write_meta(dir, meta).is_ok() {
            self.storage
                .charge_entry(dir, c"meta.json", Some(run_home(s)), old);
            self.invalidate.entry(dir_ino, OsStr::new("meta.json"));
        }
    }

    fn start_run(&mut self, s: SmithIdx, wake: Wake) {
        let Some(info) = self.registry.get(s) else {
            self.queue.remove(s);
            return;
        };
        let rel = info.rel_dir();
        let began = Instant::now();
        let rec = self.recs.entry(s).or_default();
        rec.next_run = rec.next_run.max(1);
        // The attempt consumes the tasks that are there now, even if it cannot start: a
        // rescan must not schedule them again.
        let t0 = SystemTime::now();
        rec.last_start = Some(t0);
        let (run_id, dir) = match self.make_run_dir(s, &rel) {
            Ok(made) => made,
            Err((id, msg)) => {
                return self.fail_start(
                    s,
                    wake,
                    &id,
                    None,
                    ("spawn_error", msg),
                    self.config.agent.retries,
                );
            }
        };
        self.invalidate.entry(dir.conv_ino, OsStr::new(&run_id));
        self.charge_run_dir(s, &dir);
        let agent = match self.smith_agent(&rel) {
            Ok(a) => a,
            Err(msg) => {
                return self.fail_start(
                    s,
                    wake,
                    &run_id,
                    Some(dir),
                    ("bad_config", msg),
                    self.config.agent.retries,
                )
            }
        };
        let ph = self.placeholders(Some(s));
        let argv = match agent
            .command
            .as_deref()
            .ok_or_else(|| "no agent command is configured".to_string())
            .and_then(|c| ph.expand_argv(c))
        {
            Ok(a) => a,
            Err(e) => {
                let msg = format!("{rel}: agent.command: {e}");
                return self.fail_start(
                    s,
                    wake,
                    &run_id,
                    Some(dir),
                    ("bad_config", msg),
                    agent.retries,
                );
            }
        };
        let parent = info
            .parent
            .and_then(|p| self.full_id(p))
            .map(String::from)
            .unwrap_or_default();
        let mut env: BTreeMap<String, String> = agent.env.clone();
        for (k, v) in [
            ("SMITH_ID", info.id.clone()),
            ("SMITH_FULL_ID", info.full_id.to_string()),
            ("SMITH_LEVEL", info.level.to_string()),
            ("SMITH_PARENT", parent),
            ("SMITH_DIR", ph.smith_dir.clone()),
            ("SMITH_TASK_FILE", ph.task_file.clone()),
            ("SMITH_WAKE", wake.as_str().to_string()),
            ("SMITH_MOUNT", ph.mount.clone()),
        ] {
            env.insert(k.to_string(), v);
        }
        // The run's output goes through a pipe the pump drains into messages.log, bounded by
        // the smith's quota and the store's reserve (docs/PROTOCOL-NOTES.md L17).
        let piped = output::pipe().and_then(|(r, w)| {
            let sink = Sink {
                log: dir.log.try_clone()?,
                log_ino: dir.log_ino,
                home: Some(run_home(s)),
                run: Some((info.full_id.clone(), run_id.clone())),
                path: format!("{rel}/conversations/{run_id}/messages.log"),
            };
            Ok((self.pump.add(r, sink)?, w))
        });
        let (stream, output) = match piped {
            Ok(p) => p,
            Err(e) => {
                let msg = format!("cannot make the run's output pipe: {e}");
                return self.fail_start(
                    s,
                    wake,
                    &run_id,
                    Some(dir),
                    ("spawn_error", msg),
                    agent.retries,
                );
            }
        };
        let cwd = PathBuf::from(&ph.smith_dir);
        let oom_base = self.binder.oom_kills(s);
        let spawning = Instant::now();
        let started = runner::launch(
            Launch {
                argv: &argv,
                env: &env,
                cwd: Some(&cwd),
                stdin_piped: false,
                output: Some(output),
                bind: BindTo::Smith(s),
                nofile: self.nofile,
                confine: self.confiner.filter(|_| agent.confine),
            },
            &*self.binder,
        );
        let started = match started {
            Ok(st) => st,
            Err(e) => {
                let msg = format!("cannot start `{}`: {e}", argv[0]);
                return self.fail_start(
                    s,
                    wake,
                    &run_id,
                    Some(dir),
                    ("spawn_error", msg),
                    agent.retries,
                );
            }
        };
        let pid = started.pid;
        tracing::debug!(
            smith = %info.full_id,
            run = %run_id,
            pid,
            in_cgroup = started.child.in_cgroup,
            prepare_us = (spawning - began).as_micros() as u64,
            spawn_us = spawning.elapsed().as_micros() as u64,
            "run started (prepare: run dir, config, placeholders; spawn: clone to exec)"
        );
        let start = time::format(t0);
        let cgroup = self.binder.cgroup_path(s);
        let meta = Meta {
            run_id: run_id.clone(),
            smith: info.full_id.to_string(),
            command: argv,
            wake: wake.as_str().into(),
            pid: Some(pid),
            pgid: Some(pid as i32),
            cgroup: cgroup.clone(),
            start: start.clone(),
            ..Meta::default()
        };
        self.write_meta(s, dir.dir.as_fd(), dir.dir_ino, &meta);
        if let Some(rec) = self.recs.get_mut(&s) {
            rec.runs += 1;
            rec.last_run = Some(LastRun {
                run_id: run_id.clone(),
                wake: wake.as_str().into(),
                started: start,
                ..LastRun::default()
            });
        }
        let mut ev = self.ev("run.started", s);
        ev.run_id = Some(run_id.clone());
        ev.wake = Some(wake.as_str().into());
        ev.pid = Some(pid);
        ev.pgid = Some(pid as i32);
        ev.start_ticks = started.start_ticks;
        ev.cgroup = cgroup;
        self.record(ev);
        let tx = self.tx.clone();
        let mut child = started.child;
        let waiter_run = run_id.clone();
        let spawned = std::thread::Builder::new()
            .name("smithfs-reaper".into())
            .spawn(move || {
                let status = child.wait().map_err(|e| e.to_string());
                crate::process::reaper::untrack(child.id());
                let _ = tx.send(Msg::Exited {
                    smith: s,
                    run_id: waiter_run,
                    status,
                });
            });
        let exit = match spawned {
            Ok(_) => None,
            Err(e) => {
                // Without a reaper the run cannot be followed: stop it and say why.
                signal_group(pid as i32, libc::SIGKILL);
                Some(Err(format!("cannot start a reaper thread: {e}")))
            }
        };
        let failed_reaper = exit.is_some();
        self.live.insert(
            s,
            Live {
                run_id,
                pgid: pid as i32,
                deadline: Instant::now() + Duration::from_secs(agent.timeout_secs),
                grace: Duration::from_secs(agent.kill_grace_secs),
                retries: agent.retries,
                stop: None,
                exit,
                dir,
                meta,
                oom_base,
                committing: false,
                output: Some(stream),
            },
        );
        if failed_reaper {
            self.finalize(s);
        }
    }

    /// Make the directory of `s`'s next run in `<rel>/conversations/`, announcing a re-made
    /// `conversations/` at once (docs/PROTOCOL-NOTES.md U13): the run id and its [`RunDir`], or
    /// the run id and why it could not be made.
    fn make_run_dir(
        &mut self,
        s: SmithIdx,
        rel: &str,
    ) -> Result<(String, RunDir), (String, String)> {
        let next = self.recs.entry(s).or_default().next_run;
        let conv = runner::conversations(self.root.as_fd(), Path::new(rel)).map_err(|e| {
            (
                format!("run-{next:04}"),
                format!("cannot create {rel}/conversations: {e}"),
            )
        })?;
        if let Some(smith_dir) = conv.made_in {
            self.invalidate
                .entry(smith_dir, OsStr::new("conversations"));
        }
        let rec = self.recs.entry(s).or_default();
        loop {
            let id = format!("run-{:04}", rec.next_run);
            match runner::create_run_dir(conv.dir.as_fd(), &id) {
                Ok(d) => {
                    rec.next_run += 1;
                    return Ok((id, d));
                }
                Err(nix::errno::Errno::EEXIST) => rec.next_run += 1,
                Err(e) => {
                    let msg = format!("cannot create {rel}/conversations/{id}: {e}");
                    return Err((id, msg));
                }
            }
        }
    }

    /// A run that could not start: its reason goes to its `messages.log`, its `meta.json` and
    /// the journal (`run.exited` with `error`), and the end-of-run rule treats it as failed.
    fn fail_start(
        &mut self,
        s: SmithIdx,
        wake: Wake,
        run_id: &str,
        dir: Option<RunDir>,
        (reason, error): (&'static str, String),
        retries: u32,
    ) {
        let now = time::now();
        if let Some(d) = &dir {
            let _ = backing::write(d.log.as_fd(), format!("smithfs: {error}\n").as_bytes());
            self.storage.charge_fd(d.log.as_fd(), Some(run_home(s)));
            self.invalidate.inode(d.log_ino);
            let meta = Meta {
                run_id: run_id.to_string(),
                smith: self.full_id(s).map(String::from).unwrap_or_default(),
                wake: wake.as_str().into(),
                start: now.clone(),
                end: Some(now.clone()),
                error: Some(error.clone()),
                ..Meta::default()
            };
            self.write_meta(s, d.dir.as_fd(), d.dir_ino, &meta);
        }
        let rel = self
            .registry
            .get(s)
            .map(|i| i.rel_dir())
            .unwrap_or_default();
        let has_result = store_facts::has_result(self.root.as_fd(), &rel);
        if let Some(r) = self.recs.get_mut(&s) {
            r.last_run = Some(LastRun {
                run_id: run_id.to_string(),
                wake: wake.as_str().into(),
                started: now.clone(),
                ended: Some(now.clone()),
                reason: Some(reason.into()),
                error: Some(error.clone()),
                ..LastRun::default()
            });
        }
        let outcome = self
            .queue
            .exited(s, RunEnd::NotStarted, has_result, retries);
        let mut ev = self.ev("run.exited", s);
        ev.run_id = Some(run_id.to_string());
        ev.wake = Some(wake.as_str().into());
        ev.error = Some(error);
        ev.reason = Some(reason.into());
        set_outcome(&mut ev, outcome);
        self.record(ev);
        self.drain_notes();
    }

    /// A run is over (its leader reaped and, if it was stopped, its group gone): with a project,
    /// commit what it left in its workspace first (off this thread; [`Msg::Committed`] then
    /// calls [`Exec::finish`]), else finish it now. At shutdown nothing is committed: the next
    /// run's commit takes the interrupted run's work along.
    fn finalize(&mut self, s: SmithIdx) {
        if self.config.workspace.enabled() && !self.shutting_down {
            let full_id = self.full_id(s);
            let rel = self.registry.get(s).map(|i| i.rel_dir());
            let Some(l) = self.live.get_mut(&s) else {
                return;
            };
            if l.committing {
                return;
            }
            if let (Some(full_id), Some(rel)) = (full_id, rel) {
                let job = super::commit::CommitJob {
                    smith: s,
                    full_id,
                    run_id: l.run_id.clone(),
                    wake: l.meta.wake.clone(),
                    dir: self.mount.join(rel).join(crate::workspace::AREA),
                    binder: self.binder.clone(),
                    journal: self.journal.clone(),
                    tx: self.tx.clone(),
                    nofile: self.nofile,
                    confine: self.confiner.filter(|_| self.config.agent.confine),
                };
                l.committing = true;
                match job.start() {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::error!("cannot start the auto-commit: {e}");
                        if let Some(l) = self.live.get_mut(&s) {
                            l.committing = false;
                        }
                    }
                }
            }
        }
        self.finish(s);
    }

    /// Finish a run that is over: write the end into `meta.json`, rescan its children's
    /// inboxes, apply the end-of-run rule, journal.
    fn finish(&mut self, s: SmithIdx) {
        let Some(mut l) = self.live.remove(&s) else {
            return;
        };
        // Everything the leader wrote is in the pipe: into the log before the end is told.
        if let Some(id) = l.output.take() {
            self.pump.drain(id);
        }
        let reason = l.stop.as_ref().map(|st| st.reason);
        let (code, signal, error) = match &l.exit {
            Some(Ok(st)) => (st.code(), st.signal(), None),
            Some(Err(e)) => (None, None, Some(e.clone())),
            None => (None, None, None),
        };
        // Killed by its memory limit (docs/SPEC.md §5): the OOM killer killed processes of this
        // smith's own leaf during the run, and the run did not succeed (a run whose build step
        // was killed but that went on and exited 0 is an ordinary exit).
        let oom_kills = l
            .oom_base
            .and_then(|base| Some(self.binder.oom_kills(s)?.saturating_sub(base)))
            .filter(|n| *n > 0);
        let oom = oom_kills.is_some() && reason.is_none() && code != Some(0);
        let end = time::now();
        let why = if oom {
            "oom"
        } else {
            run_reason(reason, signal, error.is_some())
        };
        l.meta.end = Some(end.clone());
        l.meta.oom_kills = oom_kills;
        l.meta.exit_code = code;
        l.meta.signal = signal;
        l.meta.timed_out = reason == Some(StopReason::Timeout);
        l.meta.cancelled = reason == Some(StopReason::Cancel);
        l.meta.interrupted = reason == Some(StopReason::Shutdown);
        l.meta.error = error.clone();
        self.write_meta(s, l.dir.dir.as_fd(), l.dir.dir_ino, &l.meta);
        self.invalidate.inode(l.dir.log_ino);
        let rel = self
            .registry
            .get(s)
            .map(|i| i.rel_dir())
            .unwrap_or_default();
        let result = store_facts::result_file(self.root.as_fd(), &rel);
        let has_result = result == store_facts::ResultFile::Regular;
        // A result.md that is not a regular file (a symlink, a directory) is no result: the
        // run ends as one without a result, and says why (docs/PROTOCOL-NOTES.md S28).
        let error = match (error, result) {
            (None, store_facts::ResultFile::Other(kind)) => Some(format!(
                "outbox/result.md is {kind}, not a regular file, so it is not a result: write the result into outbox/result.md itself"
            )),
            (e, _) => e,
        };
        if let Some(r) = self.recs.get_mut(&s) {
            r.has_result = has_result;
            if let Some(lr) = r.last_run.as_mut().filter(|lr| lr.run_id == l.run_id) {
                lr.ended = Some(end);
                lr.exit_code = code;
                lr.signal = signal;
                lr.reason = Some(why.into());
                lr.error.clone_from(&error);
            }
        }
        for c in self.queue.children(s) {
            self.rescan_task(c);
        }
        let run_end = match reason {
            None => RunEnd::Exited,
            Some(StopReason::Timeout) => RunEnd::TimedOut,
            Some(StopReason::Cancel) => RunEnd::Cancelled,
            Some(StopReason::Shutdown) => RunEnd::Interrupted,
        };
        let outcome = self.queue.exited(s, run_end, has_result, l.retries);
        let mut ev = self.ev("run.exited", s);
        ev.run_id = Some(l.run_id.clone());
        ev.exit_code = code;
        ev.signal = signal;
        ev.error = error;
        ev.oom_kills = oom_kills;
        ev.reason = Some(why.into());
        set_outcome(&mut ev, outcome);
        self.record(ev);
        match reason {
            Some(StopReason::Timeout) => {
                let mut ev = self.ev("run.timed_out", s);
                ev.run_id = Some(l.run_id.clone());
                self.record(ev);
            }
            Some(StopReason::Shutdown) => {
                if !self.exiting {
                    let wake = Wake::parse(&l.meta.wake).unwrap_or(Wake::Task);
                    self.paused_runs.push((s, wake));
                }
                let mut ev = self.ev("run.interrupted", s);
                ev.run_id = Some(l.run_id.clone());
                ev.wake = Some(l.meta.wake.clone());
                self.record(ev);
            }
            Some(StopReason::Cancel) | None => {}
        }
        self.drain_notes();
        if self.registry.root() == Some(s) {
            self.update_final();
        }
    }

    // ----- status ------------------------------------------------------------------------

    fn publish(&self) {
        let smiths: Vec<serde_json::Value> = self
            .registry
            .all()
            .into_iter()
            .filter(|i| self.queue.contains(i.idx))
            .map(|i| {
                let rec = self.recs.get(&i.idx);
                let state = self.queue.state(i.idx);
                let last_run = rec.and_then(|r| r.last_run.clone()).map(|mut lr| {
                    lr.log = Some(format!(
                        "{}/conversations/{}/messages.log",
                        i.rel_dir(),
                        lr.run_id
                    ));
                    lr
                });
                let state_since = {
                    let mut since = self.since.borrow_mut();
                    let entry = since.entry(i.idx).or_insert_with(|| {
                        // First seen (start-up, a new smith): since its last run's end or
                        // start, as the journal says, else now.
                        let t = last_run
                            .as_ref()
                            .and_then(|lr| lr.ended.clone().or(Some(lr.started.clone())))
                            .filter(|_| state != State::Idle || rec.is_some_and(|r| r.runs > 0))
                            .unwrap_or_else(time::now);
                        (state, t)
                    });
                    if entry.0 != state {
                        *entry = (state, time::now());
                    }
                    entry.1.clone()
                };
                json!({
                    "full_id": i.full_id,
                    "parent": i.parent.and_then(|p| self.full_id(p)),
                    "level": i.level,
                    "state": state.as_str(),
                    "state_since": state_since,
                    "runs": rec.map_or(0, |r| r.runs),
                    "has_result": rec.is_some_and(|r| r.has_result),
                    "last_run": last_run,
                })
            })
            .collect();
        let value = json!({
            "smiths": smiths,
            "agent_configured": self.config.agent.command.is_some(),
            "limits": self.config.limits,
        });
        *self.shared.status.lock() = Arc::new(value);
        let live: std::collections::HashSet<SmithIdx> = self.live.keys().copied().collect();
        *self.shared.live.lock() = live;
    }
}

/// `run.exited`'s `reason` (docs/SPEC.md §5) for a run that started: how the daemon stopped it
/// (`timeout`, `cancelled`), else how it ended (`signal`, `exit`). A run interrupted by an
/// unmount was stopped with a signal (O2). `error`: it could not be followed (no reaper).
fn run_reason(stop: Option<StopReason>, signal: Option<i32>, error: bool) -> &'static str {
    match stop {
        Some(StopReason::Timeout) => "timeout",
        Some(StopReason::Cancel) => "cancelled",
        Some(StopReason::Shutdown) => "signal",
        None if error => "spawn_error",
        None if signal.is_some() => "signal",
        None => "exit",
    }
}

fn set_outcome(ev: &mut Event, outcome: Option<Outcome>) {
    if let Some(o) = outcome {
        ev.outcome = Some(o.as_str().into());
        if let Outcome::Retry { attempt } = o {
            ev.attempt = Some(attempt);
        }
    }
}

/// Where a run's directory, `meta.json` and `messages.log` are charged: to its smith
/// (`storage::payer` of `conversations/**`).
fn run_home(s: SmithIdx) -> Home {
    Home {
        payer: s,
        smith: s,
        area: Area::Conversations,
    }
}

fn runner_ticks(pid: Option<u32>) -> Option<u64> {
    pid.and_then(runner::start_ticks)
}
