//! Pure views of the scheduler's files for the front ends (docs/SPEC.md §6, §7): the
//! `status.json` document and `wait`'s verdict. How the CLI draws them is `cli::render`'s.

use serde::{Deserialize, Serialize};

use super::journal::LastRun;
use super::queue::State;

/// `status.json` (docs/SPEC.md §7).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusDoc {
    /// Every smith, parents before children.
    pub smiths: Vec<SmithRow>,
    /// Whether `agent.command` is configured (without it tasks wait).
    pub agent_configured: bool,
    /// The `limits` in force (docs/SPEC.md §8; a reload changes them, §6). Absent in a
    /// `status.json` of an older daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::config::Limits>,
}

/// One smith in `status.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmithRow {
    /// Full id.
    pub full_id: String,
    /// The parent's full id; null for the root.
    pub parent: Option<String>,
    /// Level (root 0).
    pub level: u8,
    /// `idle queued running waiting done failed cancelled`.
    pub state: String,
    /// When the smith entered its current state (RFC 3339; docs/SPEC.md §7).
    #[serde(default)]
    pub state_since: Option<String>,
    /// Runs started.
    pub runs: u32,
    /// `outbox/result.md` exists.
    pub has_result: bool,
    /// The last run, if any.
    pub last_run: Option<LastRun>,
}

impl StatusDoc {
    /// The smith `full_id`.
    pub fn smith(&self, full_id: &str) -> Option<&SmithRow> {
        self.smiths.iter().find(|s| s.full_id == full_id)
    }

    /// The children of `full_id`, in order.
    pub fn children<'a>(&'a self, full_id: &'a str) -> impl Iterator<Item = &'a SmithRow> + 'a {
        self.smiths
            .iter()
            .filter(move |s| s.parent.as_deref() == Some(full_id))
    }
}

/// `1h02m`, `3m05s`, `12s`.
pub fn human_duration(secs: u64) -> String {
    match secs {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// What `wait` waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitTarget {
    /// `results/final.md` (the root done).
    Final,
    /// One smith settled.
    Smith(String),
    /// Every child of this smith settled.
    Children(String),
}

/// `wait`'s answer once its target is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Done (exit 0).
    Done,
    /// Failed or cancelled (exit 1).
    Failed,
}

fn settled(row: &SmithRow) -> Option<Verdict> {
    match State::parse(&row.state) {
        Some(State::Done) => Some(Verdict::Done),
        Some(State::Failed | State::Cancelled) => Some(Verdict::Failed),
        _ => None,
    }
}

/// Has `target` settled? `final_exists`: `results/final.md` exists. `None`: keep waiting.
pub fn wait_verdict(doc: &StatusDoc, target: &WaitTarget, final_exists: bool) -> Option<Verdict> {
    match target {
        WaitTarget::Final => {
            let root = doc.smiths.iter().find(|s| s.parent.is_none())?;
            match settled(root) {
                Some(Verdict::Done) if final_exists => Some(Verdict::Done),
                Some(Verdict::Failed) => Some(Verdict::Failed),
                _ => None,
            }
        }
        WaitTarget::Smith(id) => doc.smith(id).and_then(settled),
        WaitTarget::Children(id) => {
            let kids: Vec<&SmithRow> = doc.children(id).collect();
            if kids.is_empty() {
                return None;
            }
            let mut verdict = Verdict::Done;
            for k in kids {
                match settled(k)? {
                    Verdict::Failed => verdict = Verdict::Failed,
                    Verdict::Done => {}
                }
            }
            Some(verdict)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A smith row in `state` whose last run took 1m05s (fixtures, also for `cli::render`).
    pub(crate) fn row(full: &str, parent: Option<&str>, state: &str) -> SmithRow {
        SmithRow {
            full_id: full.into(),
            parent: parent.map(Into::into),
            level: full.matches('/').count() as u8,
            state: state.into(),
            runs: 1,
            has_result: state == "done",
            last_run: Some(LastRun {
                run_id: "run-0001".into(),
                wake: "task".into(),
                started: "2026-01-01T00:00:00.000000Z".into(),
                ended: Some("2026-01-01T00:01:05.000000Z".into()),
                exit_code: Some(if state == "failed" { 3 } else { 0 }),
                reason: Some("exit".into()),
                log: Some("smiths/x/conversations/run-0001/messages.log".into()),
                ..LastRun::default()
            }),
            state_since: Some("2026-01-01T00:01:05.000000Z".into()),
        }
    }

    /// A root and two children in `states` (fixtures, also for `cli::render`).
    pub(crate) fn doc(states: [&str; 3]) -> StatusDoc {
        StatusDoc {
            smiths: vec![
                row("smith-root", None, states[0]),
                row("smith-root/smith-001", Some("smith-root"), states[1]),
                row("smith-root/smith-002", Some("smith-root"), states[2]),
            ],
            agent_configured: true,
            limits: None,
        }
    }

    #[test]
    fn wait_verdicts() {
        use Verdict::*;
        use WaitTarget::*;
        let c = || Children("smith-root".into());
        let s1 = || Smith("smith-root/smith-001".into());
        let table: Vec<([&str; 3], WaitTarget, bool, Option<Verdict>)> = vec![
            (["done", "done", "done"], Final, true, Some(Done)),
            (["done", "done", "done"], Final, false, None),
            (["running", "done", "done"], Final, false, None),
            (["failed", "done", "done"], Final, false, Some(Failed)),
            (["cancelled", "done", "done"], Final, false, Some(Failed)),
            (["waiting", "done", "running"], c(), false, None),
            (["waiting", "done", "done"], c(), false, Some(Done)),
            (["waiting", "done", "cancelled"], c(), false, Some(Failed)),
            (["waiting", "queued", "done"], s1(), false, None),
            (["waiting", "done", "failed"], s1(), false, Some(Done)),
            (["waiting", "failed", "done"], s1(), false, Some(Failed)),
            (
                ["waiting", "done", "done"],
                Smith("nope".into()),
                false,
                None,
            ),
            (
                ["waiting", "done", "done"],
                Children("smith-root/smith-001".into()),
                false,
                None,
            ),
        ];
        for (states, target, fin, want) in table {
            assert_eq!(
                wait_verdict(&doc(states), &target, fin),
                want,
                "{states:?} {target:?}"
            );
        }
    }

    #[test]
    fn durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(65), "1m05s");
        assert_eq!(human_duration(3720), "1h02m");
    }
}
