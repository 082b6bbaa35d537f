//! A run that is over (docs/SPEC.md §5, §11): its workspace auto-committed (off this thread),
//! then its end written into `meta.json` and the journal, and the end-of-run rule applied.

use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;

use super::stop::StopReason;
use super::Exec;
use crate::sched::journal::Event;
use crate::sched::queue::{Outcome, RunEnd, Wake};
use crate::sched::{commit, store_facts, time};
use crate::tree::model::SmithIdx;

impl Exec {
    /// A run is over (its leader reaped and, if it was stopped, its group gone): with a project,
    /// commit what it left in its workspace first (off this thread; [`Msg::Committed`] then
    /// calls [`Exec::finish`]), else finish it now. At shutdown nothing is committed: the next
    /// run's commit takes the interrupted run's work along.
    pub(super) fn finalize(&mut self, s: SmithIdx) {
        if self.st.config.workspace.enabled() && !self.st.shutting_down {
            let full_id = self.full_id(s);
            let rel = self.env.registry.get(s).map(|i| i.rel_dir());
            let Some(l) = self.st.live.get_mut(&s) else {
                return;
            };
            if l.committing {
                return;
            }
            if let (Some(full_id), Some(rel)) = (full_id, rel) {
                // The auto-commit runs as the smith (docs/SPEC.md §12); a per-smith uid that
                // cannot be given out leaves the plan's shared one (logged).
                let sandbox = crate::sandbox::applies(&self.st.config.sandbox).then(|| {
                    let p = crate::sandbox::view::Plan::for_mount(&self.st.config, &self.env.mount);
                    match self.env.as_agent(p.clone(), &full_id) {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::error!(smith = %full_id, "sandbox: {e}");
                            p
                        }
                    }
                });
                let job = commit::CommitJob {
                    smith: s,
                    full_id,
                    run_id: l.run_id.clone(),
                    wake: l.meta.wake.clone(),
                    dir: self.env.mount.join(rel).join(crate::workspace::AREA),
                    binder: self.env.binder.clone(),
                    journal: self.env.journal.clone(),
                    tx: self.env.tx.clone(),
                    nofile: self.env.nofile,
                    confine: self.env.confiner.filter(|_| self.st.config.agent.confine),
                    sandbox,
                };
                l.committing = true;
                match job.start() {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::error!("cannot start the auto-commit: {e}");
                        if let Some(l) = self.st.live.get_mut(&s) {
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
    pub(super) fn finish(&mut self, s: SmithIdx) {
        let Some(mut l) = self.st.live.remove(&s) else {
            return;
        };
        // Everything the leader wrote is in the pipe: into the log before the end is told.
        if let Some(id) = l.output.take() {
            self.env.pump.drain(id);
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
            .and_then(|base| Some(self.env.binder.oom_kills(s)?.saturating_sub(base)))
            .filter(|n| *n > 0);
        let oom = oom_kills.is_some() && reason.is_none() && code != Some(0);
        let end = time::now();
        // Slurm's word on a job that it, not the run, ended (docs/SPEC.md §13); the
        // scheduler's own stop (cancel, timeout, unmount) still says why first.
        let verdict = l.verdict.take().filter(|_| reason.is_none());
        let why = match &verdict {
            Some(v) => v.reason,
            None if oom => "oom",
            None => run_reason(reason, signal, error.is_some()),
        };
        let slurm_timeout = verdict.as_ref().is_some_and(|v| v.reason == "timeout");
        l.meta.end = Some(end.clone());
        l.meta.oom_kills = oom_kills;
        l.meta.exit_code = code;
        l.meta.signal = signal;
        l.meta.timed_out = reason == Some(StopReason::Timeout) || slurm_timeout;
        l.meta.cancelled = reason == Some(StopReason::Cancel);
        l.meta.interrupted = reason == Some(StopReason::Shutdown);
        l.meta.error = error.clone();
        self.env
            .writes
            .meta(s, l.dir.dir.as_fd(), l.dir.dir_ino, &l.meta);
        self.env.writes.changed(l.dir.log_ino);
        let rel = self.rel_dir(s);
        let mut result = store_facts::result_file(self.env.root.as_fd(), &rel);
        // A lost run (Slurm's verdict: its job ended without the node's report, or Slurm ended
        // it, notes R43) did not finish: an `outbox/result.md` it changed is no result, whether
        // its writer was still holding it (the connection dropped, nothing completed) or was
        // killed and so closed it. Set aside in the run's directory, so that neither the parent
        // nor the retry takes it for one.
        let mut error = error;
        if why == "lost"
            && result == store_facts::ResultFile::Regular
            && store_facts::result_time(self.env.root.as_fd(), &rel) != l.result_before
        {
            let name = c"result.md.unpublished";
            match self.env.writes.set_aside_result(
                self.env.root.as_fd(),
                &rel,
                s,
                l.dir.dir.as_fd(),
                l.dir.dir_ino,
                name,
            ) {
                Ok(()) => {
                    result = store_facts::ResultFile::Absent;
                    let note = format!(
                        "the outbox/result.md this run changed is no result ({}): moved to conversations/{}/result.md.unpublished",
                        if l.published {
                            "its writer closed it as the job was being killed"
                        } else {
                            "still open when the job was lost, never completed"
                        },
                        l.run_id
                    );
                    error = Some(match error {
                        Some(e) => format!("{e}; {note}"),
                        None => note,
                    });
                }
                Err(e) => {
                    tracing::error!(run = %l.run_id, "cannot set a lost run's half-written result aside: {e}")
                }
            }
        }
        let has_result = result == store_facts::ResultFile::Regular;
        // A result.md that is not a regular file (a symlink, a directory) is no result: the
        // run ends as one without a result, and says why (docs/PROTOCOL-NOTES.md S28).
        let error = match (error, result) {
            (None, store_facts::ResultFile::Other(kind)) => Some(format!(
                "outbox/result.md is {kind}, not a regular file, so it is not a result: write the result into outbox/result.md itself"
            )),
            (e, _) => e,
        };
        if let Some(r) = self.st.recs.get_mut(&s) {
            r.has_result = has_result;
            if let Some(lr) = r.last_run.as_mut().filter(|lr| lr.run_id == l.run_id) {
                lr.ended = Some(end);
                lr.exit_code = code;
                lr.signal = signal;
                lr.reason = Some(why.into());
                lr.error.clone_from(&error);
            }
        }
        for c in self.st.queue.children(s) {
            self.rescan_task(c);
        }
        let run_end = match reason {
            None if slurm_timeout => RunEnd::TimedOut,
            None => RunEnd::Exited,
            Some(StopReason::Timeout) => RunEnd::TimedOut,
            Some(StopReason::Cancel) => RunEnd::Cancelled,
            Some(StopReason::Shutdown) => RunEnd::Interrupted,
        };
        let outcome = self.st.queue.exited(s, run_end, has_result, l.retries);
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
            None if slurm_timeout => {
                let mut ev = self.ev("run.timed_out", s);
                ev.run_id = Some(l.run_id.clone());
                self.record(ev);
            }
            Some(StopReason::Timeout) => {
                let mut ev = self.ev("run.timed_out", s);
                ev.run_id = Some(l.run_id.clone());
                self.record(ev);
            }
            Some(StopReason::Shutdown) => {
                if !self.st.exiting {
                    let wake = Wake::parse(&l.meta.wake).unwrap_or(Wake::Task);
                    self.st.paused_runs.push((s, wake));
                }
                let mut ev = self.ev("run.interrupted", s);
                ev.run_id = Some(l.run_id.clone());
                ev.wake = Some(l.meta.wake.clone());
                self.record(ev);
            }
            Some(StopReason::Cancel) | None => {}
        }
        self.drain_notes();
        if self.env.registry.root() == Some(s) {
            self.update_final();
        }
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

pub(super) fn set_outcome(ev: &mut Event, outcome: Option<Outcome>) {
    if let Some(o) = outcome {
        ev.outcome = Some(o.as_str().into());
        if let Outcome::Retry { attempt } = o {
            ev.attempt = Some(attempt);
        }
    }
}
