//! Stopping runs (docs/SPEC.md §5, §6): a run over its deadline, a cancelled one, every run at
//! an unmount (pause) or shutdown, and what a dead daemon left running. TERM to the process
//! group and the smith's cgroup, KILL after the grace period; a stopped run is finished once
//! its leader is reaped and its group is gone.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Exec;
use crate::sched::journal::OpenRun;
use crate::sched::runner;
use crate::tree::model::SmithIdx;

/// How long after SIGKILL the executor waits for a stopped group to vanish before it gives up
/// and finalizes the run anyway (a process stuck in uninterruptible sleep).
const KILL_GIVE_UP: Duration = Duration::from_secs(10);

/// How often a stopped run whose leader is reaped is checked for remaining group members.
pub(super) const GROUP_POLL: Duration = Duration::from_millis(20);

/// Why the daemon stopped a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StopReason {
    /// It ran over `agent.timeout_secs`.
    Timeout,
    /// `cancel` (its smith or an ancestor).
    Cancel,
    /// An unmount (pause) or the daemon's shutdown.
    Shutdown,
}

/// A stop under way.
pub(super) struct Stop {
    pub(super) reason: StopReason,
    /// When KILL follows the TERM.
    kill_at: Instant,
    killed: bool,
    /// After KILL: when to finish the run even if its group is not gone.
    give_up: Option<Instant>,
}

/// Send `sig` to process group `pgid` (nothing for 0 or 1).
pub(super) fn signal_group(pgid: i32, sig: i32) {
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
    /// How long until the next deadline (a run's timeout, a KILL, a group to poll, a
    /// suppressed-denials count to journal); `None`: no deadline.
    pub(super) fn next_wake(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        for l in self.st.live.values().filter(|l| !l.committing) {
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
        if self.env.shared.denials.lock().pending()
            || self.env.shared.ignored.lock().pending()
            || self.st.published.pending()
        {
            // A suppressed count is journaled soon after its second ends.
            consider(now + Duration::from_millis(250));
        }
        next.map(|t| t.saturating_duration_since(now))
    }

    /// The deadlines that passed: suppressed denials journaled, timed-out runs stopped, KILL
    /// after the grace period, stopped runs whose group is gone finished.
    pub(super) fn tick(&mut self) {
        let done = (self.env.shared.denials.lock()).flush(crate::sched::denials::now_second());
        for d in done {
            self.record_suppressed(d);
        }
        let done = (self.env.shared.ignored.lock()).flush(crate::sched::denials::now_second());
        for d in done {
            self.record_ignored_suppressed(d);
        }
        let done = self.st.published.flush(crate::sched::denials::now_second());
        for d in done {
            self.record_published_suppressed(d);
        }
        let now = Instant::now();
        let smiths: Vec<SmithIdx> = self.st.live.keys().copied().collect();
        for s in smiths {
            let Some(l) = self.st.live.get_mut(&s) else {
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
                        self.env.binder.kill_smith(s, libc::SIGKILL);
                        if let Some(job) = &l.job {
                            self.env.launcher.stop_job(job, true);
                        }
                    }
                    let give_up = st.give_up.is_some_and(|g| now >= g);
                    let pgid = l.pgid;
                    if l.exit.is_some() {
                        let cg = self.env.binder.smith_has_processes(s);
                        if (group_gone(pgid) && cg != Some(true)) || give_up {
                            self.finalize(s);
                        }
                    }
                }
            }
        }
    }

    /// The leader of `smith`'s run `run_id` was reaped: a run the daemon did not stop is over;
    /// a stopped one waits for its group to go ([`Exec::tick`]).
    pub(super) fn on_exited(
        &mut self,
        smith: SmithIdx,
        run_id: &str,
        status: Result<std::process::ExitStatus, String>,
        verdict: Option<crate::sched::Verdict>,
    ) {
        let Some(l) = self.st.live.get_mut(&smith).filter(|l| l.run_id == run_id) else {
            return;
        };
        l.exit = Some(status);
        l.verdict = verdict;
        if l.stop.is_none() {
            self.finalize(smith);
        }
    }

    /// `smith`'s run `run_id`, a Slurm job, began running on `node` (docs/SPEC.md §13): its
    /// clock starts now (queue time is not run time), and `meta.json` and `status` say where.
    pub(super) fn on_job_running(&mut self, smith: SmithIdx, run_id: &str, node: String) {
        let Some(l) = self.st.live.get_mut(&smith).filter(|l| l.run_id == run_id) else {
            return;
        };
        if l.stop.is_none() {
            l.deadline = Instant::now() + l.timeout;
        }
        let job = l.job.clone().unwrap_or_default();
        l.meta.node = Some(node.clone());
        l.meta.running = Some(crate::sched::time::now());
        self.env
            .writes
            .meta(smith, l.dir.dir.as_fd(), l.dir.dir_ino, &l.meta);
        if let Some(lr) = self
            .st
            .recs
            .get_mut(&smith)
            .and_then(|r| r.last_run.as_mut())
            .filter(|lr| lr.run_id == run_id)
        {
            lr.where_ = Some(format!("slurm:{job}@{node}"));
        }
    }

    /// TERM `s`'s run (its process group and cgroup); KILL follows after its grace period.
    pub(super) fn begin_stop(&mut self, s: SmithIdx, reason: StopReason) {
        let Some(l) = self.st.live.get_mut(&s) else {
            return;
        };
        if l.stop.is_some() {
            return;
        }
        signal_group(l.pgid, libc::SIGTERM);
        self.env.binder.kill_smith(s, libc::SIGTERM);
        if let Some(job) = &l.job {
            self.env.launcher.stop_job(job, false);
        }
        l.stop = Some(Stop {
            reason,
            kill_at: Instant::now() + l.grace,
            killed: false,
            give_up: None,
        });
    }

    /// Stop every live run as an unmount does and start nothing new.
    pub(super) fn stop_all(&mut self) {
        self.st.shutting_down = true;
        let live: Vec<SmithIdx> = self.st.live.keys().copied().collect();
        for s in live {
            self.begin_stop(s, StopReason::Shutdown);
        }
    }

    /// After a pause whose unmount failed: re-queue what the pause stopped (as `--resume`
    /// would) and schedule again (docs/PROTOCOL-NOTES.md O11).
    pub(super) fn resume(&mut self) {
        if self.st.exiting || !self.st.shutting_down {
            return;
        }
        self.st.shutting_down = false;
        self.st.pause_ack = None;
        tracing::info!("the unmount failed: scheduling again");
        for (s, wake) in std::mem::take(&mut self.st.paused_runs) {
            if self.result_is_stale(s) {
                self.st.queue.request(s, wake);
            }
        }
        self.rescan_all();
    }

    /// Kill what is left of a run a dead daemon recorded as started: its cgroup (binder) and
    /// its process group, TERM then KILL after the grace period. The group is signalled only if
    /// the leader is still the same process (same start time) or gone (a pid number is never
    /// reused while a process group of that number exists).
    pub(super) fn kill_leftover(&self, s: Option<SmithIdx>, o: &OpenRun) {
        // A Slurm job a dead daemon left (docs/SPEC.md §13): cancelled, and re-queued by
        // `--resume` as a local leftover is (docs/PROTOCOL-NOTES.md R21).
        if let Some(job) = &o.job_id {
            self.env.launcher.stop_job(job, true);
            return;
        }
        let grace = Duration::from_secs(self.st.config.agent.kill_grace_secs);
        let pgid = o.pgid.or(o.pid.map(|p| p as i32)).unwrap_or(0);
        let same = match (o.pid, o.pid.and_then(runner::start_ticks)) {
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
        let binder = &self.env.binder;
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            if let Some(s) = s {
                binder.kill_smith(s, sig);
            }
            signal_group(pgid, sig);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                let cg = s.and_then(|s| binder.smith_has_processes(s));
                if group_gone(pgid) && cg != Some(true) {
                    return;
                }
                std::thread::sleep(GROUP_POLL);
            }
        }
    }
}
