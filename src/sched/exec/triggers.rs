//! The filesystem's triggers (docs/SPEC.md §5, §7): a task assigned, a result published, a
//! smith created or removed, access denials, an ignored inbox name, `cancel`, `retry`; and a
//! reloaded configuration (§6). Each is journaled and handed to the model.

use std::os::fd::AsFd;
use std::time::{Duration, SystemTime};

use super::stop::StopReason;
use super::Exec;
use crate::config::Config;
use crate::sched::journal::Event;
use crate::sched::queue::{Base, Wake};
use crate::sched::{denials, store_facts, Trigger};
use crate::tree::model::SmithIdx;
use crate::tree::registry::SmithInfo;

/// How many ignored inbox paths the scheduler remembers as journaled (notes H22).
const MAX_IGNORED_REMEMBERED: usize = 4096;

impl Exec {
    /// Make sure `s` (and its ancestors) are in the model, from the registry.
    pub(super) fn ensure_known(&mut self, s: SmithIdx) -> Option<SmithInfo> {
        let info = self.env.registry.get(s)?;
        if !self.st.queue.contains(s) {
            if let Some(p) = info.parent {
                self.ensure_known(p)?;
            }
            self.st.queue.add(s, info.parent);
            let rec = self.st.recs.entry(s).or_default();
            rec.next_run = rec.next_run.max(1);
        }
        Some(info)
    }

    pub(super) fn on_trigger(&mut self, t: Trigger) {
        match t {
            Trigger::TaskAssigned { smith, file } => {
                let Some(info) = self.ensure_known(smith) else {
                    return;
                };
                let rel = info.rel_dir();
                let arrived = store_facts::task_time(self.env.root.as_fd(), &rel, &file);
                let rec = self.st.recs.entry(smith).or_default();
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
                // A rewrite of the task that already made the pending run says nothing new
                // (notes H22): one valid task rewritten in a loop is not a line per write.
                let pending = self.st.queue.is_pending(smith);
                if schedule && pending && rec.pending_task.as_deref() == Some(file.as_str()) {
                    return;
                }
                if schedule {
                    rec.pending_task = Some(file.clone());
                }
                let mut ev = self.ev("task.assigned", smith);
                ev.path = Some(format!("{rel}/inbox/{file}"));
                ev.scheduled = Some(schedule);
                self.record(ev);
                if schedule {
                    self.st.queue.request(smith, Wake::Task);
                }
            }
            Trigger::ResultPublished { smith } => {
                let Some(info) = self.ensure_known(smith) else {
                    return;
                };
                let rel = info.rel_dir();
                // Journaled (and its hooks fired) within the rate limit (notes H24); what it
                // means for the run and its parent holds for every publish.
                let (admit, done) = self.st.published.admit(Some(smith), denials::now_second());
                if let Some(d) = done {
                    self.record_published_suppressed(d);
                }
                if admit {
                    let mut ev = self.ev("result.published", smith);
                    ev.path = Some(format!("{rel}/outbox/result.md"));
                    self.record(ev);
                }
                // A Slurm job's result is the root's final one only once Slurm's verdict on the
                // job is in (finish copies it then; a lost job's is set aside, notes R43).
                let mut job_live = false;
                if let Some(l) = self.st.live.get_mut(&smith) {
                    l.published = true;
                    job_live = l.job.is_some();
                }
                if let Some(r) = self.st.recs.get_mut(&smith) {
                    r.has_result = true;
                }
                self.st.queue.result_published(smith);
                self.drain_notes();
                if info.parent.is_none() && !job_live {
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
                if moved && store_facts::has_result(self.env.root.as_fd(), &info.rel_dir()) {
                    self.st.queue.set_base(smith, Base::Done);
                    if let Some(r) = self.st.recs.get_mut(&smith) {
                        r.has_result = true;
                    }
                }
            }
            Trigger::SmithRemoved { smith } => {
                // Its runs are over (the operator may remove only an idle subtree); its parent
                // may now have all its remaining children settled.
                for gone in self.st.queue.remove(smith) {
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
            Trigger::IgnoredSuppressed(d) => self.record_ignored_suppressed(d),
            Trigger::TaskIgnored {
                smith,
                file,
                reason,
            } => {
                let Some(info) = self.env.registry.get(smith) else {
                    return;
                };
                let path = format!("{}/inbox/{file}", info.rel_dir());
                // Once per name (docs/SPEC.md §5): rewriting it says nothing new. The names
                // remembered are bounded (notes H22): past the bound they are forgotten, and a
                // name may be journaled again (within the rate limit).
                if self.st.ignored.len() >= MAX_IGNORED_REMEMBERED {
                    self.st.ignored.clear();
                }
                if !self.st.ignored.insert(path.clone()) {
                    return;
                }
                let mut ev = self.ev("task.ignored", smith);
                ev.path = Some(path);
                ev.reason = Some(format!("the name {reason}"));
                self.record(ev);
            }
            Trigger::Cancel { smith } => self.on_cancel(smith),
            Trigger::Retry { smith } => {
                if self.st.queue.retry(smith) {
                    tracing::info!(smith = ?self.full_id(smith), "retry requested");
                }
            }
        }
    }

    /// Journal one `task.ignored` line for the names of one inbox beyond the rate limit in one
    /// second: `count`, no `path` (docs/SPEC.md §5, notes H22).
    pub(super) fn record_ignored_suppressed(&self, d: denials::Suppressed) {
        let mut ev = Event::new("task.ignored", d.smith.and_then(|s| self.full_id(s)));
        ev.count = Some(d.count);
        ev.reason = Some(format!(
            "more names ignored that second than the {} journaled",
            denials::FULL_PER_SECOND
        ));
        self.record(ev);
    }

    /// Journal one `result.published.suppressed` line: the publishes of one smith in one second
    /// beyond the [`super::PUBLISHED_PER_SECOND`] journaled, with `count` (notes H24).
    pub(super) fn record_published_suppressed(&self, d: denials::Suppressed) {
        let mut ev = Event::new(
            "result.published.suppressed",
            d.smith.and_then(|s| self.full_id(s)),
        );
        ev.count = Some(d.count);
        if let Some(rel) = d.smith.map(|s| self.rel_dir(s)) {
            ev.path = Some(format!("{rel}/outbox/result.md"));
        }
        self.record(ev);
    }

    /// Journal one `access.denied.suppressed` line (docs/SPEC.md §7).
    pub(super) fn record_suppressed(&self, d: denials::Suppressed) {
        let mut ev = Event::new(
            "access.denied.suppressed",
            d.smith.and_then(|s| self.full_id(s)),
        );
        ev.count = Some(d.count);
        self.record(ev);
    }

    /// `cancel` of `s` (docs/SPEC.md §6): its subtree marked cancelled, their live runs TERMed
    /// (KILL after the grace), one `run.cancelled` per smith marked, with the run id of a live
    /// run. The named smith's line is journaled last: `smithfs cancel` takes it as the word that
    /// the cancel was handled, the runs to wait for being those of the lines before it
    /// (docs/PROTOCOL-NOTES.md O49, H21).
    pub(super) fn on_cancel(&mut self, s: SmithIdx) {
        let now = SystemTime::now();
        self.ensure_known(s);
        let mut marked = self.st.queue.cancel(s);
        if let Some(i) = marked.iter().position(|(x, _)| *x == s) {
            let named = marked.remove(i);
            marked.push(named);
        }
        for (x, live) in marked {
            // The cancel consumes the tasks that are there: a rescan must not revive it.
            self.st.recs.entry(x).or_default().last_start = Some(now);
            let mut ev = self.ev("run.cancelled", x);
            if live {
                ev.run_id = self.st.live.get(&x).map(|l| l.run_id.clone());
                self.begin_stop(x, StopReason::Cancel);
            }
            self.record(ev);
        }
        self.drain_notes();
    }

    /// Apply a reloaded `config.json` (docs/SPEC.md §6; validated and diffed by the daemon,
    /// `crate::reload`): agent and scheduler settings for the next runs, hooks for the next
    /// events, the journal's rotation for the next line; then journal `config.reloaded`.
    pub(super) fn reload(&mut self, config: Config, changed: Vec<String>) {
        self.st
            .queue
            .set_max_concurrent(config.scheduler.max_concurrent as usize);
        self.env.journal.set_limits(config.journal.rotation());
        self.st.hooks.set(
            config.hooks.clone(),
            Duration::from_secs(config.hook_timeout_secs.max(1)),
        );
        self.st.config = config;
        let mut ev = Event::new("config.reloaded", None);
        ev.path = Some("config.json".into());
        ev.changed = Some(changed);
        self.record(ev);
        // Tasks that waited for an agent (or for a free slot) may start now.
        self.rescan_all();
    }
}
