//! What the scheduler shows (docs/SPEC.md §7, §9): `status.json` after every message,
//! `results/final.md` copied from the root's result, and `fleet.done` once the tree is quiet.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::sync::Arc;

use serde_json::json;

use super::Exec;
use crate::backing::{self, BackingIno};
use crate::sched::{time, State};
use crate::tree::model::SmithIdx;

impl Exec {
    /// The root smith has a result: ask the copier thread to bring `results/final.md` up to
    /// date (it copies only when the content changed; notes H20). Never reads the result here.
    pub(super) fn update_final(&mut self) {
        if !self
            .env
            .registry
            .root()
            .and_then(|r| self.st.recs.get(&r))
            .is_some_and(|r| r.has_result)
        {
            return;
        }
        self.env.final_copier.request();
    }

    /// What the copier thread wrote since the last look: announced to the kernel's caches,
    /// and `fleet.done` owed for it.
    pub(super) fn take_final(&mut self) {
        let Some(copied) = self.env.final_copier.take() else {
            return;
        };
        let writes = &self.env.writes;
        writes.made(copied.results_ino, OsStr::new("final.md"), &[], None);
        // `results/` made now at the mount root: its name (a lookup before may have left a
        // negative entry, U13) and the root's attributes changed.
        if copied.results_made {
            if let Ok(st) = backing::stat(self.env.root.as_fd()) {
                let root = BackingIno::of(&st);
                writes.made(root, OsStr::new("results"), &[], None);
                writes.changed(root);
            }
        }
        self.st.final_pending = true;
    }

    /// `results/final.md` was written and no run of the tree is live or queued (now, or once
    /// the last run ended): journal `fleet.done` (smith `smith-root`, docs/SPEC.md §5), which
    /// fires its hooks — once per written `final.md` (O6).
    pub(super) fn fleet_done(&mut self) {
        if !self.st.final_pending || !self.st.live.is_empty() || !self.st.queue.fifo().is_empty() {
            return;
        }
        self.st.final_pending = false;
        let Some(root) = self.env.registry.root() else {
            return;
        };
        let mut ev = self.ev("fleet.done", root);
        ev.path = Some("results/final.md".into());
        self.record(ev);
    }

    /// Publish `status.json` (§7) and the live runs (for `subtree_live`).
    pub(super) fn publish(&mut self) {
        let mut smiths: Vec<serde_json::Value> = Vec::new();
        for i in self.env.registry.all() {
            if !self.st.queue.contains(i.idx) {
                continue;
            }
            let rec = self.st.recs.get(&i.idx);
            let state = self.st.queue.state(i.idx);
            let last_run = rec.and_then(|r| r.last_run.clone()).map(|mut lr| {
                lr.log = Some(format!(
                    "{}/conversations/{}/messages.log",
                    i.rel_dir(),
                    lr.run_id
                ));
                lr
            });
            let entry = self.st.since.entry(i.idx).or_insert_with(|| {
                // First seen (start-up, a new smith): since its last run's end or start, as
                // the journal says, else now.
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
            smiths.push(json!({
                "full_id": i.full_id,
                "parent": i.parent.and_then(|p| self.env.registry.full_id(p)),
                "level": i.level,
                "state": state.as_str(),
                "state_since": entry.1.clone(),
                "runs": rec.map_or(0, |r| r.runs),
                "has_result": rec.is_some_and(|r| r.has_result),
                "last_run": last_run,
            }));
        }
        let value = json!({
            "smiths": smiths,
            "agent_configured": self.st.config.agent.command.is_some(),
            "limits": self.st.config.limits,
        });
        *self.env.shared.status.lock() = Arc::new(value);
        let live: HashSet<SmithIdx> = self.st.live.keys().copied().collect();
        *self.env.shared.live.lock() = live;
    }
}
