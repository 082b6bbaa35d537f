//! `smithfs retry` and `cancel` return once what they asked for is in effect
//! (docs/PROTOCOL-NOTES.md O49): the `ctl` write only hands the command to the scheduler's queue,
//! so the command then reads `.smithfs/status.json` (which the scheduler republishes after every
//! message it handles) until the status shows it, with a deadline. Without that,
//! `smithfs retry X && smithfs wait --smith X` could see the `failed` that `retry` was meant to
//! end, and exit 1.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::store::{self, Source};
use crate::sched::view::StatusDoc;

/// How often the status is read while waiting.
const POLL: Duration = Duration::from_millis(20);

/// How long the scheduler may take to handle a command it has queued (its queue is handled in
/// order; a busy moment — a start-up killing a dead daemon's leftovers — can take seconds).
const HANDLE_PATIENCE: Duration = Duration::from_secs(30);

/// After SIGKILL, how long the scheduler waits for a stopped group before it finishes the run
/// anyway (`sched::exec::stop`'s give-up).
const KILL_GIVE_UP: Duration = Duration::from_secs(10);

/// A `ctl` command whose effect the status shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    /// `retry FULL_ID`, asked when its last run was `last_run` (run id; `None`: it never ran).
    Retry {
        /// The smith.
        full_id: String,
        /// Its `last_run.run_id` before the retry.
        last_run: Option<String>,
    },
    /// `cancel FULL_ID`.
    Cancel {
        /// The smith whose subtree is cancelled.
        full_id: String,
    },
}

impl Asked {
    /// A retry of `full_id`, taking its last run from `doc` (the status read before the
    /// `ctl` write).
    pub fn retry(doc: &StatusDoc, full_id: &str) -> Asked {
        Asked::Retry {
            full_id: full_id.to_string(),
            last_run: last_run_id(doc, full_id),
        }
    }

    /// Does `doc` show the command in effect?
    ///
    /// - retry: the smith left `failed`/`cancelled` (it is `queued` or `running`, or already
    ///   further), or a run newer than the one before the retry started (the retried run may
    ///   have ended — even failed again — between two reads);
    /// - cancel: every smith of the subtree is `cancelled` or `done` (docs/SPEC.md §6: cancel
    ///   leaves done smiths alone), so none has a live run; a smith gone from the status counts
    ///   as settled.
    pub fn in_effect(&self, doc: &StatusDoc) -> bool {
        match self {
            Asked::Retry { full_id, last_run } => match doc.smith(full_id) {
                None => true,
                Some(row) => {
                    !matches!(row.state.as_str(), "failed" | "cancelled")
                        || last_run_id(doc, full_id) != *last_run
                }
            },
            Asked::Cancel { full_id } => doc
                .smiths
                .iter()
                .filter(|row| in_subtree(&row.full_id, full_id))
                .all(|row| matches!(row.state.as_str(), "cancelled" | "done")),
        }
    }

    fn full_id(&self) -> &str {
        match self {
            Asked::Retry { full_id, .. } | Asked::Cancel { full_id } => full_id,
        }
    }
}

/// Is `x` the smith `of` or one of its descendants (full ids are paths)?
fn in_subtree(x: &str, of: &str) -> bool {
    x == of || x.strip_prefix(of).is_some_and(|rest| rest.starts_with('/'))
}

fn last_run_id(doc: &StatusDoc, full_id: &str) -> Option<String> {
    doc.smith(full_id)
        .and_then(|row| row.last_run.as_ref())
        .map(|lr| lr.run_id.clone())
}

/// How long `cancel` may wait for the subtree's runs to go: the scheduler's own time, the
/// mount's `agent.kill_grace_secs` (TERM to KILL) and the give-up after KILL. A smith whose own
/// `config.json` sets a longer grace may outlast it (then the command says so).
pub fn cancel_patience(dir: &Path) -> Duration {
    let grace = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| crate::config::Config::parse(&t).ok())
        .map_or(5, |c| c.agent.kill_grace_secs);
    HANDLE_PATIENCE + Duration::from_secs(grace) + KILL_GIVE_UP
}

/// How long `retry` may wait for the scheduler to handle it.
pub fn retry_patience() -> Duration {
    HANDLE_PATIENCE
}

/// Read the mount's status until `asked` is in effect; returns the smith's state then.
///
/// # Errors
/// The status cannot be read, or `patience` passed first (one line naming the smith, its
/// state and what it was waiting for).
pub fn wait_until(dir: &Path, asked: &Asked, patience: Duration) -> Result<String> {
    let src = Source::Mount(dir.to_path_buf());
    let deadline = Instant::now() + patience;
    loop {
        let (_, doc) = store::read_status(&src)?;
        let state = doc
            .smith(asked.full_id())
            .map(|row| row.state.clone())
            .unwrap_or_else(|| "gone".into());
        if asked.in_effect(&doc) {
            return Ok(state);
        }
        if Instant::now() >= deadline {
            let what = match asked {
                Asked::Retry { .. } => "to leave failed/cancelled",
                Asked::Cancel { .. } => "for its subtree's runs to stop",
            };
            bail!(
                "{} is still {state} after {} s waiting {what} (see `smithfs status {}`)",
                asked.full_id(),
                patience.as_secs(),
                dir.display()
            );
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::journal::LastRun;
    use crate::sched::view::SmithRow;

    fn row(full_id: &str, state: &str, run: Option<&str>) -> SmithRow {
        SmithRow {
            full_id: full_id.into(),
            state: state.into(),
            last_run: run.map(|r| LastRun {
                run_id: r.into(),
                ..LastRun::default()
            }),
            ..SmithRow::default()
        }
    }

    fn doc(rows: Vec<SmithRow>) -> StatusDoc {
        StatusDoc {
            smiths: rows,
            agent_configured: true,
            limits: None,
        }
    }

    #[test]
    fn retry_is_in_effect_once_the_smith_left_failed_or_ran_again() {
        let before = doc(vec![row(
            "smith-root/smith-001",
            "failed",
            Some("run-0002"),
        )]);
        let asked = Asked::retry(&before, "smith-root/smith-001");
        let table = [
            ("failed", Some("run-0002"), false),
            ("cancelled", Some("run-0002"), false),
            ("queued", Some("run-0002"), true),
            ("running", Some("run-0003"), true),
            // The retried run ended between two reads, failing again: a newer run.
            ("failed", Some("run-0003"), true),
            ("done", Some("run-0003"), true),
        ];
        for (state, run, want) in table {
            let now = doc(vec![row("smith-root/smith-001", state, run)]);
            assert_eq!(asked.in_effect(&now), want, "{state} {run:?}");
        }
        // A cancelled smith that never ran: its first run is newer than none.
        let never = doc(vec![row("smith-root/smith-001", "cancelled", None)]);
        let asked = Asked::retry(&never, "smith-root/smith-001");
        assert!(!asked.in_effect(&never));
        let ran = doc(vec![row(
            "smith-root/smith-001",
            "failed",
            Some("run-0001"),
        )]);
        assert!(asked.in_effect(&ran));
    }

    #[test]
    fn cancel_is_in_effect_once_the_whole_subtree_is_cancelled_or_done() {
        let asked = Asked::Cancel {
            full_id: "smith-root/smith-001".into(),
        };
        let stopping = doc(vec![
            row("smith-root", "waiting", None),
            row("smith-root/smith-001", "cancelled", None),
            row("smith-root/smith-001/smith-001", "running", None),
            row("smith-root/smith-0010", "running", None),
        ]);
        assert!(!asked.in_effect(&stopping), "a descendant still runs");
        let stopped = doc(vec![
            row("smith-root", "waiting", None),
            row("smith-root/smith-001", "cancelled", None),
            row("smith-root/smith-001/smith-001", "done", None),
            // Not in the subtree (a sibling whose name starts the same).
            row("smith-root/smith-0010", "running", None),
        ]);
        assert!(asked.in_effect(&stopped));
    }
}
