//! The pure scheduling model (docs/SPEC.md §5): per-smith state, the FIFO of pending runs, the
//! `max_concurrent` limit, the end-of-run rule, `children.settled` and cancel. No clocks, no
//! files, no processes: the executor (`sched::exec`) feeds it facts (a trigger, a run's end and
//! whether `outbox/result.md` exists) and acts on what it answers. "What runs next" is
//! [`Queue::next`].
//!
//! Invariants (checked by the tests):
//! - a smith has at most one running run and at most one pending run;
//! - a smith is in the FIFO exactly when it has a pending run;
//! - `running_count` equals the number of smiths with a running run, and [`Queue::start`] never
//!   makes it exceed `max_concurrent`.
//!
//! Long on purpose: almost half of it is the model's table and property tests.

use std::collections::VecDeque;

use crate::tree::model::SmithIdx;

/// The state shown by `status` (docs/SPEC.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Registered, nothing to do.
    Idle,
    /// A run is pending (and none is running).
    Queued,
    /// A run is live.
    Running,
    /// Its last run ended without a result while a child has pending work.
    Waiting,
    /// It has a result and no live run.
    Done,
    /// Its runs failed `retries + 1` times in a row.
    Failed,
    /// Cancelled by `cancel` (itself or an ancestor).
    Cancelled,
}

impl State {
    /// The spelling in `status.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::Queued => "queued",
            State::Running => "running",
            State::Waiting => "waiting",
            State::Done => "done",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    /// Parse the spelling of [`State::as_str`].
    pub fn parse(s: &str) -> Option<State> {
        [
            State::Idle,
            State::Queued,
            State::Running,
            State::Waiting,
            State::Done,
            State::Failed,
            State::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Done, failed and cancelled settle a smith for its parent.
    pub fn is_settled(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }
}

/// Why a run starts: `SMITH_WAKE` (docs/SPEC.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wake {
    /// A task arrived in its inbox.
    Task,
    /// All its children settled.
    Children,
    /// The previous run failed and is retried.
    Retry,
}

impl Wake {
    /// The value of `SMITH_WAKE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Wake::Task => "task",
            Wake::Children => "children",
            Wake::Retry => "retry",
        }
    }

    /// Parse the spelling of [`Wake::as_str`].
    pub fn parse(s: &str) -> Option<Wake> {
        match s {
            "task" => Some(Wake::Task),
            "children" => Some(Wake::Children),
            "retry" => Some(Wake::Retry),
            _ => None,
        }
    }

    /// Which of two coalesced wakes the pending run keeps: a task dominates (an agent woken for
    /// a task reads its inbox and its children's outboxes anyway), then children, then retry.
    fn merge(self, other: Wake) -> Wake {
        let rank = |w: Wake| match w {
            Wake::Task => 2,
            Wake::Children => 1,
            Wake::Retry => 0,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// The state of a smith when it has neither a running nor a pending run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Base {
    /// Nothing happened yet, or nothing to do.
    Idle,
    /// Waiting for children.
    Waiting,
    /// Has a result.
    Done,
    /// Retries exhausted.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl Base {
    fn state(self) -> State {
        match self {
            Base::Idle => State::Idle,
            Base::Waiting => State::Waiting,
            Base::Done => State::Done,
            Base::Failed => State::Failed,
            Base::Cancelled => State::Cancelled,
        }
    }
}

/// How a run ended, as the executor observed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// The process exited or was killed by a signal on its own.
    Exited,
    /// It was stopped because it ran over `timeout_secs`.
    TimedOut,
    /// It was stopped by `cancel`.
    Cancelled,
    /// It was stopped by an unmount (journaled `run.interrupted`; `--resume` re-queues it).
    Interrupted,
    /// It could not be started (bad smith config, spawn error): a failed run.
    NotStarted,
}

/// What the end-of-run rule decided (docs/SPEC.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The result exists: done.
    Done,
    /// A run was already pending (a task arrived during the run): it will run.
    Pending,
    /// A child has pending work: waiting.
    Waiting,
    /// All children settled: run again at once with `SMITH_WAKE=children`.
    Rerun,
    /// Failed attempt number `attempt` (1-based), retried.
    Retry {
        /// How many attempts failed so far.
        attempt: u32,
    },
    /// Failed, retries exhausted.
    Failed,
    /// Cancelled while running.
    Cancelled,
    /// Stopped by an unmount; the state stays as before the run.
    Interrupted,
}

impl Outcome {
    /// The spelling in the journal's `outcome` field of `run.exited`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Pending => "pending",
            Outcome::Waiting => "waiting",
            Outcome::Rerun => "rerun",
            Outcome::Retry { .. } => "retry",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Interrupted => "interrupted",
        }
    }
}

/// Something the executor must journal or act on, produced by a model change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// Every child of `parent` is settled (fired once per settlement).
    ChildrenSettled {
        /// The parent.
        parent: SmithIdx,
        /// A run with `SMITH_WAKE=children` was scheduled for it.
        scheduled: bool,
    },
}

#[derive(Clone, Debug)]
struct Slot {
    parent: Option<SmithIdx>,
    children: Vec<SmithIdx>,
    base: Base,
    running: Option<Wake>,
    pending: Option<Wake>,
    /// Failed attempts since the last task.
    attempts: u32,
    /// `children.settled` was noted for the current settlement of its children.
    settled_noted: bool,
    /// A `children` run was started since its children last became unsettled, so another
    /// run without a result is a failure, not a reason to wake it again (no endless loop).
    children_run_used: bool,
}

impl Slot {
    fn new(parent: Option<SmithIdx>) -> Slot {
        Slot {
            parent,
            children: Vec::new(),
            base: Base::Idle,
            running: None,
            pending: None,
            attempts: 0,
            settled_noted: false,
            children_run_used: false,
        }
    }

    fn state(&self) -> State {
        if self.running.is_some() {
            State::Running
        } else if self.pending.is_some() {
            State::Queued
        } else {
            self.base.state()
        }
    }

    /// Pending work in the sense of §5: queued, running or waiting.
    fn has_pending_work(&self) -> bool {
        self.running.is_some() || self.pending.is_some() || self.base == Base::Waiting
    }
}

/// The scheduling model of one mount.
#[derive(Clone, Debug)]
pub struct Queue {
    slots: Vec<Option<Slot>>,
    fifo: VecDeque<SmithIdx>,
    max_concurrent: usize,
    running_count: usize,
    notes: Vec<Note>,
}

impl Queue {
    /// An empty model allowing `max_concurrent` runs at once (at least 1).
    pub fn new(max_concurrent: usize) -> Queue {
        Queue {
            slots: Vec::new(),
            fifo: VecDeque::new(),
            max_concurrent: max_concurrent.max(1),
            running_count: 0,
            notes: Vec::new(),
        }
    }

    /// Allow `max_concurrent` runs at once from now on (at least 1; a reload of config.json).
    /// Runs beyond a lowered limit go on; nothing new starts until fewer are live.
    pub fn set_max_concurrent(&mut self, max_concurrent: usize) {
        self.max_concurrent = max_concurrent.max(1);
    }

    fn slot(&self, s: SmithIdx) -> Option<&Slot> {
        self.slots.get(s.0 as usize).and_then(Option::as_ref)
    }

    fn slot_mut(&mut self, s: SmithIdx) -> Option<&mut Slot> {
        self.slots.get_mut(s.0 as usize).and_then(Option::as_mut)
    }

    /// Add smith `s` under `parent` (idempotent). A parent must be added before its children.
    pub fn add(&mut self, s: SmithIdx, parent: Option<SmithIdx>) {
        if self.slot(s).is_some() {
            return;
        }
        let i = s.0 as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        self.slots[i] = Some(Slot::new(parent));
        if let Some(p) = parent.and_then(|p| self.slot_mut(p)) {
            p.children.push(s);
            // A new child is unsettled.
            p.settled_noted = false;
            p.children_run_used = false;
        }
    }

    /// Is `s` known?
    pub fn contains(&self, s: SmithIdx) -> bool {
        self.slot(s).is_some()
    }

    /// Every known smith, in index order.
    pub fn smiths(&self) -> Vec<SmithIdx> {
        (0..self.slots.len() as u32)
            .map(SmithIdx)
            .filter(|s| self.contains(*s))
            .collect()
    }

    /// Forget `s` and its subtree (its dir was removed). Returns the removed smiths that had a
    /// running run (the executor keeps finishing those runs; [`Queue::exited`] ignores them).
    pub fn remove(&mut self, s: SmithIdx) -> Vec<SmithIdx> {
        let parent = self.parent(s);
        let mut live = Vec::new();
        for x in self.subtree(s) {
            if let Some(slot) = self.slots.get_mut(x.0 as usize).and_then(Option::take) {
                if slot.running.is_some() {
                    self.running_count -= 1;
                    live.push(x);
                }
            }
            self.fifo.retain(|q| *q != x);
        }
        if let Some(p) = parent.and_then(|p| self.slot_mut(p)) {
            p.children.retain(|c| *c != s);
        }
        if let Some(p) = parent {
            self.settle_or_release(p);
        }
        live
    }

    /// Restore the base state of `s` at start-up (from the files and the journal, §9).
    pub fn set_base(&mut self, s: SmithIdx, base: Base) {
        if let Some(slot) = self.slot_mut(s) {
            slot.base = base;
        }
    }

    /// The parent of `s`.
    pub fn parent(&self, s: SmithIdx) -> Option<SmithIdx> {
        self.slot(s).and_then(|x| x.parent)
    }

    /// The children of `s`, in creation order.
    pub fn children(&self, s: SmithIdx) -> Vec<SmithIdx> {
        self.slot(s).map(|x| x.children.clone()).unwrap_or_default()
    }

    /// `s` and all its descendants, parents first.
    pub fn subtree(&self, s: SmithIdx) -> Vec<SmithIdx> {
        let mut out = vec![s];
        let mut i = 0;
        while i < out.len() {
            out.extend(self.children(out[i]));
            i += 1;
        }
        out
    }

    /// The state `status` shows for `s` (`Idle` for an unknown smith).
    pub fn state(&self, s: SmithIdx) -> State {
        self.slot(s).map_or(State::Idle, Slot::state)
    }

    /// Is a run of `s` live?
    pub fn is_running(&self, s: SmithIdx) -> bool {
        self.slot(s).is_some_and(|x| x.running.is_some())
    }

    /// Is a run of `s` pending?
    pub fn is_pending(&self, s: SmithIdx) -> bool {
        self.slot(s).is_some_and(|x| x.pending.is_some())
    }

    /// The number of live runs.
    pub fn running_count(&self) -> usize {
        self.running_count
    }

    /// The pending runs in FIFO order.
    pub fn fifo(&self) -> Vec<SmithIdx> {
        self.fifo.iter().copied().collect()
    }

    /// Take the notes produced since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// Ask for a run of `s` with reason `wake` (a task arrived, or the executor's rescan found
    /// one). Coalesces: with a run already pending, the pending run keeps the dominant wake
    /// ([`Wake::Task`] over [`Wake::Children`] over [`Wake::Retry`]) and its FIFO place.
    /// A task resets the failure count and revives a done, failed or cancelled smith; its parent
    /// is no longer settled. Returns false for an unknown smith.
    pub fn request(&mut self, s: SmithIdx, wake: Wake) -> bool {
        let Some(slot) = self.slot_mut(s) else {
            return false;
        };
        if wake == Wake::Task {
            slot.attempts = 0;
            if matches!(slot.base, Base::Failed | Base::Cancelled) {
                slot.base = Base::Idle;
            }
        }
        let newly_pending = match slot.pending {
            Some(p) => {
                slot.pending = Some(p.merge(wake));
                false
            }
            None => {
                slot.pending = Some(wake);
                true
            }
        };
        let parent = slot.parent;
        if newly_pending {
            self.fifo.push_back(s);
        }
        self.unsettle(parent);
        true
    }

    /// `smithfs retry` (docs/SPEC.md §6): a failed or cancelled `s` with nothing running or
    /// pending gets a fresh run with [`Wake::Retry`] (its failure count reset, its parent no
    /// longer settled, as a new task does). Returns false (and changes nothing) for an unknown
    /// smith or one in any other state.
    pub fn retry(&mut self, s: SmithIdx) -> bool {
        let Some(slot) = self.slot_mut(s) else {
            return false;
        };
        if !matches!(slot.state(), State::Failed | State::Cancelled) {
            return false;
        }
        slot.attempts = 0;
        slot.base = Base::Idle;
        slot.pending = Some(Wake::Retry);
        let parent = slot.parent;
        self.fifo.push_back(s);
        self.unsettle(parent);
        true
    }

    /// A child of `parent` has work again: `children.settled` may fire again later.
    fn unsettle(&mut self, parent: Option<SmithIdx>) {
        if let Some(p) = parent.and_then(|p| self.slot_mut(p)) {
            p.settled_noted = false;
            p.children_run_used = false;
        }
    }

    /// `outbox/result.md` of `s` completed. With no live run, `s` is done at once and its
    /// parent may settle; with a live run, the end of the run decides (the executor passes
    /// `has_result` to [`Queue::exited`]), so a parent is never woken while the child still
    /// runs.
    pub fn result_published(&mut self, s: SmithIdx) {
        let Some(slot) = self.slot_mut(s) else {
            return;
        };
        if slot.running.is_some() {
            return;
        }
        slot.base = Base::Done;
        slot.attempts = 0;
        let parent = slot.parent;
        if let Some(p) = parent {
            self.settle_or_release(p);
        }
    }

    /// What runs next: the first smith in FIFO order that has no live run, if a run may start.
    ///
    /// Preconditions for a smith to be returned:
    /// - fewer than `max_concurrent` runs are live;
    /// - it has a pending run (it is in the FIFO);
    /// - it has no live run (one running run per smith; a smith whose run is live keeps its FIFO
    ///   place and does not block the smiths behind it).
    pub fn next(&self) -> Option<SmithIdx> {
        if self.running_count >= self.max_concurrent {
            return None;
        }
        self.fifo
            .iter()
            .copied()
            .find(|s| self.slot(*s).is_some_and(|x| x.running.is_none()))
    }

    /// Start the pending run of `s`: it leaves the FIFO and becomes live. Returns its wake, or
    /// `None` (and changes nothing) when `s` is not startable per [`Queue::next`]'s
    /// preconditions.
    pub fn start(&mut self, s: SmithIdx) -> Option<Wake> {
        if self.running_count >= self.max_concurrent {
            return None;
        }
        let slot = self.slot_mut(s)?;
        if slot.running.is_some() {
            return None;
        }
        let wake = slot.pending.take()?;
        slot.running = Some(wake);
        if wake == Wake::Children {
            slot.children_run_used = true;
        }
        self.running_count += 1;
        self.fifo.retain(|q| *q != s);
        Some(wake)
    }

    /// The live run of `s` ended (`has_result`: `outbox/result.md` exists now; `retries`: the
    /// smith's merged `agent.retries`). Applies the end-of-run rule of §5, in order:
    /// 1. cancelled → cancelled; interrupted → the state before the run, nothing scheduled;
    /// 2. a result exists → done;
    /// 3. a run is already pending (a task arrived meanwhile) → it will run;
    /// 4. a child has pending work (queued, running or waiting) → waiting;
    /// 5. it has children, all settled, and no `children` run since they settled → run again at
    ///    once (front of the FIFO) with `SMITH_WAKE=children`;
    /// 6. else the run failed: retried (back of the FIFO, `SMITH_WAKE=retry`) while the failed
    ///    attempts since the last task are at most `retries`, then failed.
    ///
    /// The executor rescans the children's inboxes before calling this, so a task newer than a
    /// child's last run start is already a pending run of that child. Returns `None` when `s`
    /// had no live run.
    pub fn exited(
        &mut self,
        s: SmithIdx,
        end: RunEnd,
        has_result: bool,
        retries: u32,
    ) -> Option<Outcome> {
        let slot = self.slot(s)?;
        slot.running?;
        let children = slot.children.clone();
        let child_pending = children
            .iter()
            .any(|c| self.slot(*c).is_some_and(Slot::has_pending_work));
        let all_settled = !children.is_empty()
            && children
                .iter()
                .all(|c| self.slot(*c).map_or(true, |x| x.state().is_settled()));
        self.running_count -= 1;
        let slot = self.slots.get_mut(s.0 as usize).and_then(Option::as_mut)?;
        slot.running = None;
        let fifo = &mut self.fifo;
        let outcome = if slot.base == Base::Cancelled {
            slot.pending = None;
            Outcome::Cancelled
        } else if end == RunEnd::Cancelled {
            // Revived by a task after the cancel: the pending run stands.
            if slot.pending.is_some() {
                Outcome::Pending
            } else {
                slot.base = Base::Cancelled;
                Outcome::Cancelled
            }
        } else if end == RunEnd::Interrupted {
            Outcome::Interrupted
        } else if has_result {
            slot.base = Base::Done;
            slot.attempts = 0;
            Outcome::Done
        } else if slot.pending.is_some() {
            Outcome::Pending
        } else if child_pending {
            slot.base = Base::Waiting;
            Outcome::Waiting
        } else if all_settled && !slot.children_run_used {
            slot.base = Base::Waiting;
            slot.pending = Some(Wake::Children);
            fifo.push_front(s);
            Outcome::Rerun
        } else {
            slot.attempts += 1;
            if slot.attempts <= retries {
                slot.pending = Some(Wake::Retry);
                fifo.push_back(s);
                Outcome::Retry {
                    attempt: slot.attempts,
                }
            } else {
                slot.base = Base::Failed;
                Outcome::Failed
            }
        };
        if outcome == Outcome::Cancelled {
            self.fifo.retain(|q| *q != s);
        }
        if let Some(p) = self.parent(s) {
            self.settle_or_release(p);
        }
        Some(outcome)
    }

    /// Cancel `s` and its subtree: `s` itself, whatever its state, and every smith of the
    /// subtree that is not done with a quiet subtree (nothing running, pending or waiting in it)
    /// become cancelled and lose their pending runs — so no smith of it is left done above the
    /// runs the cancel stops, to be woken by their settling and start them again
    /// (docs/PROTOCOL-NOTES.md H21). Returns the cancelled smiths, each with whether it has a
    /// live run the executor must stop (its [`Queue::exited`] then answers
    /// [`Outcome::Cancelled`]).
    pub fn cancel(&mut self, s: SmithIdx) -> Vec<(SmithIdx, bool)> {
        let mut out = Vec::new();
        for x in self.subtree(s) {
            let quiet = x != s
                && self
                    .subtree(x)
                    .iter()
                    .all(|y| !self.slot(*y).is_some_and(Slot::has_pending_work));
            let Some(slot) = self.slot_mut(x) else {
                continue;
            };
            if slot.state() == State::Done && quiet {
                continue;
            }
            slot.base = Base::Cancelled;
            slot.pending = None;
            let live = slot.running.is_some();
            self.fifo.retain(|q| *q != x);
            out.push((x, live));
        }
        if let Some(p) = self.parent(s) {
            self.settle_or_release(p);
        }
        out
    }

    /// A child of `p` settled, was removed, or ended its pending work: [`Queue::check_settled`],
    /// then [`Queue::check_released`].
    fn settle_or_release(&mut self, p: SmithIdx) {
        self.check_settled(p);
        self.check_released(p);
    }

    /// A waiting parent `p` (no live or pending run) whose children have no pending work left
    /// but are not all settled — some are idle, never given a task or stopped by an unmount
    /// without `--resume` — would wait for ever: nothing will come from them unless someone
    /// acts. Wake it with `SMITH_WAKE=children`, as if they had settled, at most once per
    /// settlement (`children_run_used`): it aggregates what is there or gives the idle child a
    /// task; ending again without a result and with a child still idle is a failed run (§5).
    /// `children.settled` is not noted for it (docs/PROTOCOL-NOTES.md O14).
    fn check_released(&mut self, p: SmithIdx) {
        let Some(slot) = self.slot(p) else {
            return;
        };
        if slot.base != Base::Waiting
            || slot.running.is_some()
            || slot.pending.is_some()
            || slot.children_run_used
            || slot.children.is_empty()
        {
            return;
        }
        let child = |c: &SmithIdx| self.slot(*c);
        let pending = slot
            .children
            .iter()
            .any(|c| child(c).is_some_and(Slot::has_pending_work));
        let idle = slot
            .children
            .iter()
            .any(|c| child(c).is_some_and(|x| !x.has_pending_work() && !x.state().is_settled()));
        if pending || !idle {
            // Work still to come, or every child settled (check_settled's case).
            return;
        }
        if let Some(slot) = self.slot_mut(p) {
            slot.pending = Some(Wake::Children);
        }
        self.fifo.push_back(p);
    }

    /// If every child of `p` is settled (and `children.settled` was not yet noted for this
    /// settlement), note it and, unless `p` has a live run or is cancelled, schedule a run of
    /// `p` with `SMITH_WAKE=children` (at most one per settlement; a live run meets the same
    /// condition in the end-of-run rule instead).
    pub fn check_settled(&mut self, p: SmithIdx) {
        let Some(slot) = self.slot(p) else {
            return;
        };
        // A cancelled parent's children settling is expected and wakes nothing: not noted.
        if slot.settled_noted || slot.children.is_empty() || slot.base == Base::Cancelled {
            return;
        }
        let all = slot
            .children
            .iter()
            .all(|c| self.slot(*c).map_or(true, |x| x.state().is_settled()));
        if !all {
            return;
        }
        let Some(slot) = self.slots.get_mut(p.0 as usize).and_then(Option::as_mut) else {
            return;
        };
        slot.settled_noted = true;
        let wake =
            slot.running.is_none() && slot.base != Base::Cancelled && !slot.children_run_used;
        let was_pending = slot.pending.is_some();
        if wake {
            slot.pending = Some(
                slot.pending
                    .map_or(Wake::Children, |w| w.merge(Wake::Children)),
            );
            if !was_pending {
                self.fifo.push_back(p);
            }
        }
        self.notes.push(Note::ChildrenSettled {
            parent: p,
            scheduled: wake,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: SmithIdx = SmithIdx(0);
    const A: SmithIdx = SmithIdx(1);
    const B: SmithIdx = SmithIdx(2);
    const A1: SmithIdx = SmithIdx(3);

    /// root R with children A, B; A has child A1.
    fn tree(max: usize) -> Queue {
        let mut q = Queue::new(max);
        q.add(R, None);
        q.add(A, Some(R));
        q.add(B, Some(R));
        q.add(A1, Some(A));
        q
    }

    fn check_invariants(q: &Queue) {
        let running = q.smiths().iter().filter(|s| q.is_running(**s)).count();
        assert_eq!(running, q.running_count());
        assert!(q.running_count() <= q.max_concurrent);
        for s in q.smiths() {
            let in_fifo = q.fifo.iter().filter(|x| **x == s).count();
            assert_eq!(
                in_fifo,
                usize::from(q.is_pending(s)),
                "{s:?} fifo {:?}",
                q.fifo
            );
        }
    }

    /// Start whatever may start, returning (smith, wake) pairs.
    fn start_all(q: &mut Queue) -> Vec<(SmithIdx, Wake)> {
        let mut out = Vec::new();
        while let Some(s) = q.next() {
            let w = q.start(s).expect("next() is startable");
            out.push((s, w));
            check_invariants(q);
        }
        out
    }

    #[test]
    fn task_runs_and_result_makes_done() {
        let mut q = tree(4);
        assert!(q.request(R, Wake::Task));
        assert_eq!(q.state(R), State::Queued);
        assert_eq!(start_all(&mut q), vec![(R, Wake::Task)]);
        assert_eq!(q.state(R), State::Running);
        assert_eq!(q.exited(R, RunEnd::Exited, true, 1), Some(Outcome::Done));
        assert_eq!(q.state(R), State::Done);
        check_invariants(&q);
    }

    #[test]
    fn fifo_and_max_concurrent() {
        let mut q = tree(2);
        for s in [B, A, A1, R] {
            q.request(s, Wake::Task);
        }
        assert_eq!(start_all(&mut q), vec![(B, Wake::Task), (A, Wake::Task)]);
        assert_eq!(q.next(), None, "limit reached");
        assert_eq!(q.start(A1), None, "start refuses beyond the limit");
        q.exited(B, RunEnd::Exited, true, 0);
        assert_eq!(start_all(&mut q), vec![(A1, Wake::Task)]);
        q.exited(A, RunEnd::Exited, true, 0);
        assert_eq!(start_all(&mut q), vec![(R, Wake::Task)]);
    }

    #[test]
    fn coalesces_one_pending_run_per_smith() {
        let mut q = tree(4);
        q.request(A, Wake::Task);
        q.request(A, Wake::Task);
        assert_eq!(q.fifo(), vec![A]);
        assert_eq!(start_all(&mut q), vec![(A, Wake::Task)]);
        // Two tasks during the run: one pending run, and it does not start while A runs.
        q.request(A, Wake::Task);
        q.request(A, Wake::Task);
        assert_eq!(q.fifo(), vec![A]);
        assert_eq!(q.next(), None, "one running run per smith");
        assert_eq!(q.state(A), State::Running);
        assert_eq!(
            q.exited(A, RunEnd::Exited, false, 0),
            Some(Outcome::Pending)
        );
        assert_eq!(start_all(&mut q), vec![(A, Wake::Task)]);
        check_invariants(&q);
    }

    #[test]
    fn a_blocked_head_does_not_block_the_fifo() {
        let mut q = tree(4);
        q.request(A, Wake::Task);
        start_all(&mut q);
        q.request(A, Wake::Task);
        q.request(B, Wake::Task);
        assert_eq!(q.next(), Some(B));
    }

    #[test]
    fn wake_merge_prefers_task() {
        let table = [
            (Wake::Retry, Wake::Task, Wake::Task),
            (Wake::Children, Wake::Task, Wake::Task),
            (Wake::Task, Wake::Children, Wake::Task),
            (Wake::Retry, Wake::Children, Wake::Children),
            (Wake::Children, Wake::Retry, Wake::Children),
        ];
        for (first, second, want) in table {
            let mut q = tree(1);
            q.request(A, first);
            q.request(A, second);
            assert_eq!(q.start(A), Some(want), "{first:?} then {second:?}");
        }
    }

    /// The end-of-run rule, one row per branch of §5.
    #[test]
    fn end_of_run_rule_table() {
        struct Row {
            name: &'static str,
            /// Set up the children of A (A1) before A's run ends.
            child: Option<State>,
            has_result: bool,
            end: RunEnd,
            attempts_before: u32,
            retries: u32,
            want: Outcome,
            want_state: State,
        }
        let rows = [
            Row {
                name: "result → done",
                child: None,
                has_result: true,
                end: RunEnd::Exited,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Done,
                want_state: State::Done,
            },
            Row {
                name: "timed out but result → done",
                child: None,
                has_result: true,
                end: RunEnd::TimedOut,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Done,
                want_state: State::Done,
            },
            Row {
                name: "child queued → waiting",
                child: Some(State::Queued),
                has_result: false,
                end: RunEnd::Exited,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Waiting,
                want_state: State::Waiting,
            },
            Row {
                name: "child running → waiting",
                child: Some(State::Running),
                has_result: false,
                end: RunEnd::Exited,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Waiting,
                want_state: State::Waiting,
            },
            Row {
                name: "child done → rerun with children",
                child: Some(State::Done),
                has_result: false,
                end: RunEnd::Exited,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Rerun,
                want_state: State::Queued,
            },
            Row {
                name: "child failed → rerun",
                child: Some(State::Failed),
                has_result: false,
                end: RunEnd::Exited,
                attempts_before: 0,
                retries: 0,
                want: Outcome::Rerun,
                want_state: State::Queued,
            },
            Row {
                name: "child cancelled → rerun",
                child: Some(State::Cancelled),
                has_result: false,
                end: RunEnd::Exited,
                attempts_before: 0,
                retries: 0,
                want: Outcome::Rerun,
                want_state: State::Queued,
            },
            Row {
                name: "child idle → failed attempt, retried",
                child: Some(State::Idle),
                has_result: false,
                end: RunEnd::Exited,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Retry { attempt: 1 },
                want_state: State::Queued,
            },
            Row {
                name: "no children → retried",
                child: None,
                has_result: false,
                end: RunEnd::Exited,
                attempts_before: 0,
                retries: 2,
                want: Outcome::Retry { attempt: 1 },
                want_state: State::Queued,
            },
            Row {
                name: "no children, retries exhausted → failed",
                child: None,
                has_result: false,
                end: RunEnd::Exited,
                attempts_before: 1,
                retries: 1,
                want: Outcome::Failed,
                want_state: State::Failed,
            },
            Row {
                name: "no retries → failed",
                child: None,
                has_result: false,
                end: RunEnd::Exited,
                attempts_before: 0,
                retries: 0,
                want: Outcome::Failed,
                want_state: State::Failed,
            },
            Row {
                name: "timeout → retried",
                child: None,
                has_result: false,
                end: RunEnd::TimedOut,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Retry { attempt: 1 },
                want_state: State::Queued,
            },
            Row {
                name: "not started (bad config) → retried",
                child: None,
                has_result: false,
                end: RunEnd::NotStarted,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Retry { attempt: 1 },
                want_state: State::Queued,
            },
            Row {
                name: "cancelled",
                child: None,
                has_result: true,
                end: RunEnd::Cancelled,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Cancelled,
                want_state: State::Cancelled,
            },
            Row {
                name: "interrupted keeps the state",
                child: None,
                has_result: false,
                end: RunEnd::Interrupted,
                attempts_before: 0,
                retries: 1,
                want: Outcome::Interrupted,
                want_state: State::Idle,
            },
        ];
        for row in rows {
            let mut q = Queue::new(4);
            q.add(R, None);
            q.add(A, Some(R));
            if let Some(child) = row.child {
                q.add(A1, Some(A));
                match child {
                    State::Idle => {}
                    State::Queued => {
                        q.request(A1, Wake::Task);
                    }
                    State::Running => {
                        q.request(A1, Wake::Task);
                        q.start(A1);
                    }
                    State::Waiting => q.set_base(A1, Base::Waiting),
                    State::Done => q.set_base(A1, Base::Done),
                    State::Failed => q.set_base(A1, Base::Failed),
                    State::Cancelled => q.set_base(A1, Base::Cancelled),
                }
            }
            if let Some(s) = q.slot_mut(A) {
                s.attempts = row.attempts_before;
            }
            q.request(A, Wake::Task);
            if let Some(s) = q.slot_mut(A) {
                s.attempts = row.attempts_before;
            }
            assert_eq!(q.start(A), Some(Wake::Task), "{}", row.name);
            let got = q.exited(A, row.end, row.has_result, row.retries);
            assert_eq!(got, Some(row.want), "{}", row.name);
            assert_eq!(q.state(A), row.want_state, "{}", row.name);
            check_invariants(&q);
            if row.want == Outcome::Rerun {
                assert_eq!(q.fifo().first(), Some(&A), "{}: at once = front", row.name);
                assert_eq!(q.start(A), Some(Wake::Children), "{}", row.name);
            }
            if matches!(row.want, Outcome::Retry { .. }) {
                assert_eq!(q.start(A), Some(Wake::Retry), "{}", row.name);
            }
        }
    }

    #[test]
    fn children_run_without_result_fails_instead_of_looping() {
        let mut q = tree(4);
        q.set_base(A1, Base::Done);
        q.set_base(B, Base::Done);
        q.request(A, Wake::Task);
        q.start(A);
        assert_eq!(q.exited(A, RunEnd::Exited, false, 1), Some(Outcome::Rerun));
        assert_eq!(q.start(A), Some(Wake::Children));
        assert_eq!(
            q.exited(A, RunEnd::Exited, false, 1),
            Some(Outcome::Retry { attempt: 1 })
        );
        assert_eq!(q.start(A), Some(Wake::Retry));
        assert_eq!(q.exited(A, RunEnd::Exited, false, 1), Some(Outcome::Failed));
        // A failed: with B done, the root's children are settled.
        assert_eq!(
            q.take_notes(),
            vec![Note::ChildrenSettled {
                parent: R,
                scheduled: true
            }]
        );
        assert_eq!(q.state(R), State::Queued);
        assert_eq!(q.start(R), Some(Wake::Children));
    }

    #[test]
    fn a_waiting_parent_is_woken_when_only_idle_children_are_left() {
        // R ran and split into A (task) and B (never given one); R waits for A.
        let mut q = Queue::new(4);
        q.add(R, None);
        q.add(A, Some(R));
        q.add(B, Some(R));
        q.request(R, Wake::Task);
        assert_eq!(q.next(), Some(R));
        q.start(R);
        q.request(A, Wake::Task);
        assert_eq!(
            q.exited(R, RunEnd::Exited, false, 0),
            Some(Outcome::Waiting)
        );
        assert_eq!(q.next(), Some(A));
        q.start(A);
        // A fails for good: only idle B is left, so R is woken to act (once).
        assert_eq!(q.exited(A, RunEnd::Exited, false, 0), Some(Outcome::Failed));
        assert_eq!(q.state(R), State::Queued);
        assert!(
            q.take_notes().is_empty(),
            "not children.settled: B is not settled"
        );
        assert_eq!(q.next(), Some(R));
        assert_eq!(q.start(R), Some(Wake::Children));
        // It ends without a result and B still idle: a failed run (retries 0).
        assert_eq!(q.exited(R, RunEnd::Exited, false, 0), Some(Outcome::Failed));
        assert_eq!(q.state(R), State::Failed);
        check_invariants(&q);
    }

    #[test]
    fn settled_children_wake_an_idle_or_waiting_parent_once() {
        let mut q = tree(4);
        q.set_base(R, Base::Waiting);
        q.request(A, Wake::Task);
        q.request(B, Wake::Task);
        start_all(&mut q);
        q.set_base(A1, Base::Done);
        assert_eq!(q.exited(A, RunEnd::Exited, true, 0), Some(Outcome::Done));
        assert!(q.take_notes().is_empty(), "B still runs");
        assert_eq!(q.exited(B, RunEnd::Exited, false, 0), Some(Outcome::Failed));
        assert_eq!(
            q.take_notes(),
            vec![Note::ChildrenSettled {
                parent: R,
                scheduled: true
            }]
        );
        assert_eq!(start_all(&mut q), vec![(R, Wake::Children)]);
        // A second settle check in the same settlement does nothing.
        q.check_settled(R);
        assert!(q.take_notes().is_empty());
        check_invariants(&q);
    }

    #[test]
    fn children_settling_while_parent_runs_wake_it_after_exit() {
        let mut q = tree(4);
        q.request(R, Wake::Task);
        q.start(R);
        q.set_base(A1, Base::Done);
        q.request(A, Wake::Task);
        q.request(B, Wake::Task);
        start_all(&mut q);
        q.exited(A, RunEnd::Exited, true, 0);
        q.exited(B, RunEnd::Exited, true, 0);
        assert_eq!(
            q.take_notes(),
            vec![Note::ChildrenSettled {
                parent: R,
                scheduled: false
            }],
            "the parent is live: noted, not scheduled"
        );
        assert_eq!(q.state(R), State::Running);
        // Parent exits without a result: all children settled → woken, never failed.
        assert_eq!(q.exited(R, RunEnd::Exited, false, 0), Some(Outcome::Rerun));
        assert_eq!(q.start(R), Some(Wake::Children));
    }

    #[test]
    fn result_published_without_live_run_settles_parent() {
        let mut q = tree(4);
        q.set_base(R, Base::Waiting);
        q.set_base(B, Base::Done);
        q.result_published(A);
        assert_eq!(q.state(A), State::Done);
        assert_eq!(
            q.take_notes(),
            vec![Note::ChildrenSettled {
                parent: R,
                scheduled: true
            }],
            "A and B are done: R is settled"
        );
        assert_eq!(q.state(R), State::Queued);
    }

    #[test]
    fn result_published_during_run_waits_for_exit() {
        let mut q = tree(4);
        q.set_base(R, Base::Waiting);
        q.set_base(B, Base::Done);
        q.request(A, Wake::Task);
        q.start(A);
        q.result_published(A);
        assert_eq!(q.state(A), State::Running);
        assert!(q.take_notes().is_empty());
        q.exited(A, RunEnd::Exited, true, 0);
        assert_eq!(q.take_notes().len(), 1);
        assert_eq!(q.state(R), State::Queued);
    }

    #[test]
    fn cancel_subtree() {
        let mut q = tree(4);
        q.set_base(R, Base::Waiting);
        q.request(A, Wake::Task);
        q.request(A1, Wake::Task);
        q.set_base(B, Base::Done);
        assert_eq!(start_all(&mut q), vec![(A, Wake::Task), (A1, Wake::Task)]);
        q.request(A1, Wake::Task);
        let got = q.cancel(A);
        assert_eq!(got, vec![(A, true), (A1, true)]);
        assert_eq!(q.state(A1), State::Running, "live until its run is stopped");
        assert!(!q.is_pending(A1), "the pending run is dropped");
        assert!(q.take_notes().is_empty(), "A is still live: not settled");
        assert_eq!(
            q.exited(A1, RunEnd::Cancelled, false, 1),
            Some(Outcome::Cancelled)
        );
        assert_eq!(
            q.exited(A, RunEnd::Exited, true, 1),
            Some(Outcome::Cancelled)
        );
        assert_eq!(q.state(A), State::Cancelled);
        assert_eq!(
            q.take_notes(),
            vec![Note::ChildrenSettled {
                parent: R,
                scheduled: true
            }],
            "cancelled counts as settled"
        );
        check_invariants(&q);
        // A new task revives a cancelled smith.
        q.request(A1, Wake::Task);
        assert_eq!(q.state(A1), State::Queued);
    }

    #[test]
    fn cancel_keeps_done_smiths_and_never_wakes_a_cancelled_parent() {
        let mut q = tree(4);
        q.set_base(A1, Base::Done);
        q.request(B, Wake::Task);
        let got = q.cancel(R);
        assert_eq!(got, vec![(R, false), (A, false), (B, false)]);
        assert_eq!(q.state(A1), State::Done);
        assert_eq!(q.fifo(), vec![]);
        assert_eq!(q.next(), None);
    }

    /// A done smith above live runs is cancelled with them: their settling must not wake it to
    /// start them again (notes H21). Named, a done smith is cancelled whatever its subtree.
    #[test]
    fn cancel_leaves_no_done_smith_to_be_woken() {
        let mut q = tree(4);
        q.set_base(A, Base::Done);
        q.request(A1, Wake::Task);
        assert_eq!(start_all(&mut q), vec![(A1, Wake::Task)]);
        assert_eq!(q.cancel(A), vec![(A, false), (A1, true)]);
        assert_eq!(
            q.exited(A1, RunEnd::Cancelled, false, 1),
            Some(Outcome::Cancelled)
        );
        assert_eq!(q.state(A), State::Cancelled);
        assert_eq!(q.next(), None, "nothing woke A");
        // From above: the done smith between the named one and the live run is cancelled too.
        let mut q = tree(4);
        q.set_base(A, Base::Done);
        q.set_base(B, Base::Done);
        q.request(A1, Wake::Task);
        assert_eq!(start_all(&mut q), vec![(A1, Wake::Task)]);
        assert_eq!(q.cancel(R), vec![(R, false), (A, false), (A1, true)]);
        assert_eq!(
            q.state(B),
            State::Done,
            "a done smith with a quiet subtree stays done"
        );
        q.exited(A1, RunEnd::Cancelled, false, 1);
        assert_eq!(q.state(A), State::Cancelled);
        assert_eq!(q.next(), None);
        check_invariants(&q);
    }

    #[test]
    fn remove_forgets_a_subtree() {
        let mut q = tree(4);
        q.request(A1, Wake::Task);
        q.start(A1);
        q.set_base(B, Base::Done);
        q.set_base(R, Base::Waiting);
        assert_eq!(q.remove(A), vec![A1]);
        assert_eq!(q.running_count(), 0);
        assert_eq!(q.exited(A1, RunEnd::Exited, true, 0), None);
        assert_eq!(q.children(R), vec![B]);
        assert_eq!(q.state(R), State::Queued, "B alone is settled");
        check_invariants(&q);
    }

    #[test]
    fn unknown_smiths_are_ignored() {
        let mut q = Queue::new(1);
        assert!(!q.request(SmithIdx(9), Wake::Task));
        assert_eq!(q.exited(SmithIdx(9), RunEnd::Exited, false, 0), None);
        assert_eq!(q.cancel(SmithIdx(9)), vec![]);
        assert_eq!(q.state(SmithIdx(9)), State::Idle);
    }

    #[test]
    fn random_operations_keep_invariants() {
        // A small deterministic pseudo-random walk over the operations.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut q = tree(2);
        for _ in 0..5000 {
            let s = SmithIdx(rnd(4) as u32);
            match rnd(6) {
                0 => {
                    q.request(s, Wake::Task);
                }
                1 => {
                    start_all(&mut q);
                }
                2 => {
                    let end =
                        [RunEnd::Exited, RunEnd::TimedOut, RunEnd::NotStarted][rnd(3) as usize];
                    q.exited(s, end, rnd(2) == 0, rnd(3) as u32);
                }
                3 => {
                    if rnd(5) == 0 {
                        q.cancel(s);
                    }
                }
                4 => q.result_published(s),
                _ => {
                    q.take_notes();
                }
            }
            check_invariants(&q);
        }
    }
}
