//! Start-up (docs/SPEC.md §6, §9) and the rescans: the tree and the journal read back into the
//! model, what a dead daemon left running killed and journaled `run.interrupted`, and every
//! smith's requests re-derived from its files — at start, and after a dropped trigger.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::Path;

use super::{Exec, Rec};
use crate::backing::{self, BackingIno};
use crate::sched::journal::{self, Event, Terminal};
use crate::sched::queue::{Base, Wake};
use crate::sched::runner::Meta;
use crate::sched::{store_facts, time};
use crate::tree::model::SmithIdx;

impl Exec {
    /// Rebuild each smith's state from the tree and the journal, kill a dead daemon's
    /// leftovers, request what the files say is owed (with `resume`, the interrupted runs too).
    pub(super) fn startup(&mut self, resume: bool) {
        if let Err(e) =
            crate::fs::rebuild::scan(self.env.root.as_fd(), &self.env.registry, &HashMap::new())
        {
            tracing::warn!("cannot scan the smith tree: {e}");
        }
        // The snapshot of rotated-away lines plus every journal file (docs/SPEC.md §7).
        let journal::Replay { hist, open } = journal::load(self.env.state_dir.as_fd())
            .unwrap_or_else(|e| {
                tracing::error!("cannot read the journal: {e}");
                journal::Replay::default()
            });
        let all = self.env.registry.all();
        for info in &all {
            self.st.queue.add(info.idx, info.parent);
        }
        // Results written during a run the daemon died under, and never published: the writer's
        // close never reached a live daemon, so they are not results (notes S30).
        let half_written: Vec<SmithIdx> = all
            .iter()
            .filter(|info| {
                let Some(h) = hist.get(info.full_id.as_str()) else {
                    return false;
                };
                let died_under = open.iter().any(|o| o.smith == info.full_id);
                let Some(started) = h.last_start.filter(|_| died_under) else {
                    return false;
                };
                let written = store_facts::result_time(self.env.root.as_fd(), &info.rel_dir());
                written.is_some_and(|w| w >= started)
                    && !h.last_published.is_some_and(|p| p >= started)
            })
            .map(|info| info.idx)
            .collect();
        for info in &all {
            let mut h = hist.get(info.full_id.as_str()).cloned().unwrap_or_default();
            // A Slurm job's node is not journaled: the journal gives `slurm:JOBID`, the run's
            // `meta.json` the node it ran on (notes R22).
            if let Some(lr) = h.last_run.as_mut() {
                self.regain_node(&info.rel_dir(), lr);
            }
            let has_result = store_facts::has_result(self.env.root.as_fd(), &info.rel_dir())
                && !half_written.contains(&info.idx);
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
            self.st.queue.set_base(info.idx, base);
            self.st.recs.insert(
                info.idx,
                Rec {
                    runs: h.runs,
                    last_run: h.last_run,
                    last_start: h.last_start,
                    has_result,
                    next_run: h.runs + 1,
                    announced: None,
                    pending_task: None,
                },
            );
        }
        // Publish the history now: killing leftovers below may take 2 × kill_grace_secs.
        self.publish();
        if let Some(ready) = self.st.ready.take() {
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
            let s = self.env.registry.by_full_id(&o.smith);
            self.kill_leftover(s, &o);
            let mut ev = Event::new("run.interrupted", Some(o.smith.clone()));
            ev.run_id = Some(o.run_id.clone());
            ev.pid = o.pid;
            ev.wake = Some(o.wake.clone());
            self.record(ev);
            if let Some(s) = s {
                if let Some(lr) = self
                    .st
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
                if half_written.contains(&s) || self.result_is_stale(s) {
                    self.st.queue.request(s, wake);
                }
            }
        }
        for info in all.iter().rev() {
            if matches!(
                self.st.queue.state(info.idx),
                crate::sched::State::Waiting | crate::sched::State::Idle
            ) {
                self.st.queue.check_settled(info.idx);
            }
        }
        self.drain_notes();
        self.update_final();
    }

    /// `lr`'s `where` `slurm:JOBID` completed to `slurm:JOBID@NODE` from the `node` its run's
    /// `meta.json` (in the smith dir `rel`) recorded when the job ran; left as it is when the
    /// run is not a job, the node is known already, or `meta.json` names none.
    fn regain_node(&self, rel: &str, lr: &mut crate::sched::journal::LastRun) {
        let Some(job) = lr
            .where_
            .as_deref()
            .and_then(|w| w.strip_prefix("slurm:"))
            .filter(|j| !j.contains('@'))
        else {
            return;
        };
        let path = Path::new(rel)
            .join("conversations")
            .join(&lr.run_id)
            .join("meta.json");
        let node = backing::read_file_at_most(self.env.root.as_fd(), &path, 1 << 20)
            .ok()
            .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
            .and_then(|m| m.node)
            .filter(|n| !n.is_empty());
        if let Some(node) = node {
            lr.where_ = Some(format!("slurm:{job}@{node}"));
        }
    }

    pub(super) fn mark_meta_interrupted(&self, s: SmithIdx, run_id: &str) {
        let Some(info) = self.env.registry.get(s) else {
            return;
        };
        let rel = Path::new(&info.rel_dir())
            .join("conversations")
            .join(run_id);
        let Ok(dir) = backing::open_dir_path(self.env.root.as_fd(), &rel) else {
            return;
        };
        let mut meta: Meta = backing::read_file(dir.as_fd(), Path::new("meta.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        meta.interrupted = true;
        meta.end = Some(time::now());
        if let Ok(st) = backing::stat(dir.as_fd()) {
            self.env
                .writes
                .meta(s, dir.as_fd(), BackingIno::of(&st), &meta);
        }
    }

    /// Does smith `s` still owe a result: none in its outbox, or one older than its newest task
    /// (an interrupted run of a done smith that was given new work, §6 `--resume`)?
    pub(super) fn result_is_stale(&self, s: SmithIdx) -> bool {
        let Some(info) = self.env.registry.get(s) else {
            return false;
        };
        let rel = info.rel_dir();
        match store_facts::result_time(self.env.root.as_fd(), &rel) {
            None => true,
            Some(r) => {
                store_facts::newest_task(self.env.root.as_fd(), &rel).is_some_and(|(_, t)| t > r)
            }
        }
    }

    /// If `s` has no result and its newest task arrived after its last run start, ask for a run
    /// (journaled `task.assigned`): the rescan that makes sure no completion is lost.
    pub(super) fn rescan_task(&mut self, s: SmithIdx) {
        let Some(info) = self.env.registry.get(s) else {
            return;
        };
        let rel = info.rel_dir();
        let has_result = store_facts::has_result(self.env.root.as_fd(), &rel);
        if let Some(r) = self.st.recs.get_mut(&s) {
            r.has_result = has_result;
        }
        if has_result {
            return;
        }
        let Some((name, arrived)) = store_facts::newest_task(self.env.root.as_fd(), &rel) else {
            return;
        };
        let last = self.st.recs.get(&s).and_then(|r| r.last_start);
        if last.is_some_and(|l| arrived <= l) || self.st.queue.is_pending(s) {
            return;
        }
        if let Some(r) = self.st.recs.get_mut(&s) {
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
        self.st.queue.request(s, Wake::Task);
    }

    /// Re-derive everything from the files after dropped triggers.
    pub(super) fn rescan_all(&mut self) {
        let _ =
            crate::fs::rebuild::scan(self.env.root.as_fd(), &self.env.registry, &HashMap::new());
        let all = self.env.registry.all();
        for info in &all {
            self.ensure_known(info.idx);
        }
        let known: Vec<SmithIdx> = self.st.queue.smiths();
        for s in known {
            if !all.iter().any(|i| i.idx == s) {
                self.st.queue.remove(s);
            }
        }
        for info in &all {
            self.rescan_task(info.idx);
            let done = self.st.recs.get(&info.idx).is_some_and(|r| r.has_result);
            // A result older than the newest task belongs to an earlier task: it does not make
            // a smith cancelled or failed on the new one done (docs/PROTOCOL-NOTES.md S29).
            if done
                && !self.st.queue.is_running(info.idx)
                && self.st.queue.state(info.idx) != crate::sched::State::Done
                && !self.result_is_stale(info.idx)
            {
                self.st.queue.result_published(info.idx);
            }
        }
        self.drain_notes();
        self.update_final();
    }
}
