//! `smithfs retry` and `cancel` return once what they asked for is in effect
//! (docs/PROTOCOL-NOTES.md O49): the `ctl` write only hands the command to the scheduler's queue,
//! so the command then reads until it sees the effect, with a deadline. Without that,
//! `smithfs retry X && smithfs wait --smith X` could see the `failed` that `retry` was meant to
//! end, and exit 1. `retry` reads `.smithfs/status.json` (which the scheduler republishes after
//! every message it handles); `cancel` reads the journal from where it stood before the write
//! ([`CancelWatch`]): a state in the status can be gone before a poll sees it (a parent woken by
//! the cancelled child's settling gives it a new task at once, notes H21), a journal line cannot.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::store::{self, Source};
use crate::sched::view::StatusDoc;

/// How often the status is read while waiting.
const POLL: Duration = Duration::from_millis(20);

/// How long `cancel`, once the journal shows it in effect, waits for the status to show it too
/// (the scheduler publishes the status after the message that journaled it is handled).
const CATCH_UP: Duration = Duration::from_secs(2);

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
        /// The journal offset before the `ctl` write (docs/PROTOCOL-NOTES.md O13), where
        /// [`CancelWatch`] reads from; `None`: the journal could not be looked at, and the
        /// status alone is read ([`Asked::in_effect`]).
        journal_from: Option<u64>,
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
    /// - cancel (the status alone, when the journal cannot be read; else [`CancelWatch`]):
    ///   every smith of the subtree is `cancelled` or `done` (docs/SPEC.md §6: cancel leaves
    ///   done smiths alone), so none has a live run; a smith gone from the status counts as
    ///   settled.
    pub fn in_effect(&self, doc: &StatusDoc) -> bool {
        match self {
            Asked::Retry { full_id, last_run } => match doc.smith(full_id) {
                None => true,
                Some(row) => {
                    !matches!(row.state.as_str(), "failed" | "cancelled")
                        || last_run_id(doc, full_id) != *last_run
                }
            },
            Asked::Cancel { full_id, .. } => doc
                .smiths
                .iter()
                .filter(|row| in_subtree(&row.full_id, full_id))
                .all(|row| matches!(row.state.as_str(), "cancelled" | "done")),
        }
    }

    fn full_id(&self) -> &str {
        match self {
            Asked::Retry { full_id, .. } | Asked::Cancel { full_id, .. } => full_id,
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
    let mut watch = match asked {
        Asked::Cancel {
            full_id,
            journal_from: Some(from),
        } => Some(CancelWatch::new(full_id, *from)),
        _ => None,
    };
    let state_in = |doc: &StatusDoc| {
        doc.smith(asked.full_id())
            .map(|row| row.state.clone())
            .unwrap_or_else(|| "gone".into())
    };
    // When the journal first showed the cancel in effect.
    let mut in_effect_at: Option<Instant> = None;
    loop {
        if let Some(w) = watch.as_mut() {
            let (bytes, next) = super::events::read_from(dir, w.offset)?;
            w.feed(&bytes, next);
            if w.in_effect() && in_effect_at.is_none() {
                in_effect_at = Some(Instant::now());
            }
        }
        let (_, doc) = store::read_status(&src)?;
        let state = state_in(&doc);
        let done = match (&watch, in_effect_at) {
            // The journal's word; the status, published a moment after the journal's lines,
            // is waited for briefly so the state returned (and a command run next) is not the
            // one before the cancel.
            (Some(w), Some(at)) => w.status_caught_up(&doc) || at.elapsed() >= CATCH_UP,
            (Some(_), None) => false,
            (None, _) => asked.in_effect(&doc),
        };
        if done {
            return Ok(state);
        }
        if Instant::now() >= deadline {
            let what = match (asked, &watch) {
                (Asked::Retry { .. }, _) => "to leave failed/cancelled".to_string(),
                (Asked::Cancel { .. }, Some(w)) => w.waiting_for(),
                (Asked::Cancel { .. }, None) => "for its subtree's runs to stop".to_string(),
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

/// What the journal says of a `cancel FULL_ID` since the `ctl` write (docs/PROTOCOL-NOTES.md
/// O49, H21). The scheduler handles a cancel in one step: one `run.cancelled` per smith of the
/// subtree it marks, with the `run_id` of a live run, the named smith's line last; each run it
/// stopped ends with its `run.exited` (TERM, KILL after the grace; docs/SPEC.md §5). The cancel
/// is in effect once the named smith's line is read and every run named before it has its
/// `run.exited` — whatever the status shows by then: a smith of the subtree may already run
/// again on a new task (its parent, woken by its settling, gave it one; notes S11).
#[derive(Debug)]
pub struct CancelWatch {
    full_id: String,
    /// The journal offset read up to (docs/PROTOCOL-NOTES.md O13).
    offset: u64,
    /// A torn last line, completed by the next read.
    pending: Vec<u8>,
    /// The `ts` of the named smith's `run.cancelled`, once read: the scheduler handled the
    /// cancel then.
    handled: Option<String>,
    /// Runs the cancel stopped, `(full id, run id)`.
    stopped: BTreeSet<(String, String)>,
    /// Those whose `run.exited` is not read yet.
    stopping: BTreeSet<(String, String)>,
}

impl CancelWatch {
    /// Watch the cancel of `full_id`, reading the journal from offset `from` (its end before
    /// the `ctl` write).
    pub fn new(full_id: &str, from: u64) -> CancelWatch {
        CancelWatch {
            full_id: full_id.to_string(),
            offset: from,
            pending: Vec::new(),
            handled: None,
            stopped: BTreeSet::new(),
            stopping: BTreeSet::new(),
        }
    }

    /// Take `bytes`, the journal read from [`CancelWatch::offset`] up to offset `next`. Lines
    /// that are not JSON objects (a torn line a crash left) are skipped, as the journal's
    /// reader does; a torn tail waits for its newline.
    pub fn feed(&mut self, bytes: &[u8], next: u64) {
        self.offset = next;
        self.pending.extend_from_slice(bytes);
        let Some(end) = self.pending.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        let complete: Vec<u8> = self.pending.drain(..=end).collect();
        for line in complete.split(|b| *b == b'\n') {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) {
                self.line(&v);
            }
        }
    }

    /// One journal line.
    fn line(&mut self, v: &serde_json::Value) {
        let field = |k: &str| v.get(k).and_then(|x| x.as_str());
        let (Some(event), Some(smith)) = (field("event"), field("smith")) else {
            return;
        };
        if !in_subtree(smith, &self.full_id) {
            return;
        }
        let run = field("run_id").map(|r| (smith.to_string(), r.to_string()));
        match event {
            "run.cancelled" => {
                if let Some(run) = run {
                    self.stopped.insert(run.clone());
                    self.stopping.insert(run);
                }
                if smith == self.full_id {
                    self.handled = Some(field("ts").unwrap_or_default().to_string());
                }
            }
            "run.exited" => {
                if let Some(run) = run {
                    self.stopping.remove(&run);
                }
            }
            _ => {}
        }
    }

    /// Is the cancel handled and has every run it stopped ended?
    pub fn in_effect(&self) -> bool {
        self.handled.is_some() && self.stopping.is_empty()
    }

    /// Does `doc` (a status read after [`CancelWatch::in_effect`] held) show what the journal
    /// did: no run the cancel stopped as its smith's live last run (it ended, or a newer run
    /// is there), and the named smith `cancelled` or in a state entered since the cancel (its
    /// `state_since` not before the `run.cancelled` line's `ts`; a new task revived it)? A smith
    /// gone from the status counts as shown.
    pub fn status_caught_up(&self, doc: &StatusDoc) -> bool {
        let runs_shown = self.stopped.iter().all(|(smith, run)| {
            doc.smith(smith)
                .and_then(|row| row.last_run.as_ref())
                .map_or(true, |lr| lr.run_id != *run || lr.ended.is_some())
        });
        let at = self.handled.as_deref().and_then(crate::time::parse);
        let named_shown = doc.smith(&self.full_id).map_or(true, |row| {
            row.state == "cancelled"
                || (row.state_since.as_deref().and_then(crate::time::parse))
                    .zip(at)
                    .is_some_and(|(since, at)| since >= at)
        });
        runs_shown && named_shown
    }

    /// What is still awaited, for the error past the deadline.
    fn waiting_for(&self) -> String {
        if self.handled.is_none() {
            return "for the scheduler to handle the cancel (no `run.cancelled` journaled)".into();
        }
        let runs: Vec<String> = (self.stopping.iter())
            .map(|(smith, run)| format!("{smith} {run}"))
            .collect();
        format!("for its stopped runs to end ({})", runs.join(", "))
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
            journal_from: None,
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

    fn line(event: &str, smith: &str, run: Option<&str>, ts: &str) -> String {
        let mut v = serde_json::json!({"ts": ts, "event": event, "smith": smith});
        if let Some(r) = run {
            v["run_id"] = r.into();
        }
        format!("{v}\n")
    }

    #[test]
    fn a_cancel_is_in_effect_once_handled_and_its_stopped_runs_ended() {
        let t = "2026-12-05T22:41:12.610392Z";
        let mut w = CancelWatch::new("smith-root/smith-002", 100);
        // The subtree's lines come first, the named smith's last (sched::exec::on_cancel).
        let journal = [
            line("run.exited", "smith-root", Some("run-0001"), t),
            line(
                "run.cancelled",
                "smith-root/smith-002/smith-001",
                Some("run-0003"),
                t,
            ),
            line(
                "run.cancelled",
                "smith-root/smith-0020",
                Some("run-0001"),
                t,
            ),
            line("run.cancelled", "smith-root/smith-002", Some("run-0001"), t),
        ]
        .concat();
        // A line torn across two reads waits for its newline.
        let (a, b) = journal.as_bytes().split_at(journal.len() - 30);
        w.feed(a, 100 + a.len() as u64);
        assert!(
            w.handled.is_none(),
            "the named smith's line is not complete yet"
        );
        w.feed(b, 100 + journal.len() as u64);
        assert_eq!(w.offset, 100 + journal.len() as u64);
        assert!(w.handled.is_some());
        assert!(!w.in_effect(), "two runs still to end");
        w.feed(
            line("run.exited", "smith-root/smith-002", Some("run-0001"), t).as_bytes(),
            0,
        );
        assert!(!w.in_effect(), "the grandchild's run still to end");
        assert!(w
            .waiting_for()
            .contains("smith-root/smith-002/smith-001 run-0003"));
        // Not the subtree's (a sibling whose name starts the same): not waited for.
        assert!(!w.stopping.iter().any(|(s, _)| s == "smith-root/smith-0020"));
        let more = [
            line(
                "run.exited",
                "smith-root/smith-002/smith-001",
                Some("run-0003"),
                t,
            ),
            // Its parent, woken by the settling, gives it a new task: it runs again.
            line("run.started", "smith-root/smith-002", Some("run-0002"), t),
        ]
        .concat();
        w.feed(more.as_bytes(), 0);
        assert!(w.in_effect(), "in effect although the smith runs again");
        let mut idle = CancelWatch::new("smith-root", 0);
        assert!(!idle.in_effect(), "not handled yet");
        idle.feed(b"not json\n", 0);
        idle.feed(line("run.cancelled", "smith-root", None, t).as_bytes(), 0);
        assert!(idle.in_effect(), "nothing was live");
    }

    #[test]
    fn a_cancel_waits_for_the_status_to_show_what_the_journal_did() {
        let t = "2026-12-05T22:41:12.610392Z";
        let mut w = CancelWatch::new("smith-root/smith-002", 0);
        w.feed(
            line("run.cancelled", "smith-root/smith-002", Some("run-0001"), t).as_bytes(),
            0,
        );
        w.feed(
            line("run.exited", "smith-root/smith-002", Some("run-0001"), t).as_bytes(),
            0,
        );
        let with = |state: &str, run: &str, ended: bool, since: &str| {
            let mut r = row("smith-root/smith-002", state, Some(run));
            if let Some(lr) = r.last_run.as_mut() {
                lr.ended = ended.then(|| since.to_string());
            }
            r.state_since = Some(since.to_string());
            doc(vec![r])
        };
        let before = "2026-12-05T22:41:12.535099Z";
        let after = "2026-12-05T22:41:13.653474Z";
        // Published before the run's end: the stopped run still live.
        assert!(!w.status_caught_up(&with("running", "run-0001", false, before)));
        assert!(w.status_caught_up(&with("cancelled", "run-0001", true, after)));
        // Revived by a new task: a newer run, or queued since the cancel.
        assert!(w.status_caught_up(&with("running", "run-0002", false, after)));
        assert!(w.status_caught_up(&with("queued", "run-0001", true, after)));
        // A state entered before the cancel is a status published before it.
        assert!(!w.status_caught_up(&with("done", "run-0001", true, before)));
        assert!(w.status_caught_up(&doc(vec![])), "gone");
    }
}
