//! The journal `.smithfs-state/events.jsonl` (PROTOCOL.md §7): one JSON object a line, append
//! only, written through a held `O_APPEND` descriptor with one `write` per line; and its reader,
//! which ignores a torn last line, plus the replay that start-up uses to rebuild `failed` and
//! `cancelled` states and to find runs that started but never exited (§9).

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::SystemTime;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::fs::backing::{self, SysResult};

/// The journal's file name in the state directory.
pub const JOURNAL_NAME: &CStr = c"events.jsonl";

/// One journal line. `ts`, `event` and `smith` are always present (`smith` may be null); the
/// other fields only when the event needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// RFC 3339 UTC with microseconds.
    pub ts: String,
    /// `run.started`, `task.assigned`, … (PROTOCOL.md §5), or `hook.exited`,
    /// `trigger.dropped`.
    pub event: String,
    /// The smith's full id; null for events of no smith (an operator's denial).
    pub smith: Option<String>,
    /// The run, for `run.*` events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// `task`, `children` or `retry`, for `run.started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake: Option<String>,
    /// The exit status when the process exited normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal number when the process was killed by a signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The denied operation, for `access.denied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// A path relative to the mount root (the task file, the result, the denied path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The errno returned, for `access.denied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    /// The rule that denied, for `access.denied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// A process id: the run's leader, a hook, or the denied caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The run's process group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgid: Option<i32>,
    /// The run leader's start time in clock ticks after boot (`/proc/PID/stat` field 22), to
    /// tell it from a recycled pid at start-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
    /// The run's cgroup, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// What the end-of-run rule decided, for `run.exited`: `done pending waiting rerun retry
    /// failed cancelled interrupted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Failed attempts so far, for a `run.exited` that is retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Whether a run was scheduled (`task.assigned`, `children.settled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled: Option<bool>,
    /// What went wrong, in one sentence (a bad smith config, a spawn error, a hook failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why a run ended, for `run.exited` (PROTOCOL.md §5): `oom` when its memory limit killed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `run.exited` of a smith with a memory limit: how many of its own processes the OOM
    /// killer killed during the run (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
    /// For `hook.exited`: the event that fired the hook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_event: Option<String>,
    /// For `hook.exited`: the hook's argv as configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<Vec<String>>,
    /// For `hook.exited`: it ran over `hook_timeout_secs` and was killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
}

impl Event {
    /// A new event stamped now.
    pub fn new(event: &str, smith: Option<String>) -> Event {
        Event {
            ts: super::time::now(),
            event: event.to_string(),
            smith,
            ..Event::default()
        }
    }

    /// The event as one JSON line, without the newline.
    pub fn to_line(&self) -> String {
        // Serializing plain strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The open journal. Appends are serialised by a leaf mutex held only across one `write`.
#[derive(Debug)]
pub struct Journal {
    fd: Mutex<OwnedFd>,
}

impl Journal {
    /// Open (creating, mode 0600) the journal in the held state directory `state`. If a crash
    /// left a torn last line, a newline is written first so the next line stands alone.
    pub fn open(state: BorrowedFd<'_>) -> SysResult<Journal> {
        let fd = backing::open_file(
            state,
            JOURNAL_NAME,
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            0o600,
        )?;
        let st = backing::stat(fd.as_fd())?;
        if st.st_size > 0 {
            let rd = backing::open_file(state, JOURNAL_NAME, libc::O_RDONLY, 0)?;
            let mut last = [0u8; 1];
            let n = backing::pread(rd.as_fd(), &mut last, (st.st_size - 1) as u64)?;
            if n == 1 && last[0] != b'\n' {
                backing::write(fd.as_fd(), b"\n")?;
            }
        }
        Ok(Journal { fd: Mutex::new(fd) })
    }

    /// Append `ev` as one line with one `write` (retried only for a short write). Returns the
    /// line written (without the newline), for hooks.
    pub fn append(&self, ev: &Event) -> SysResult<String> {
        let line = ev.to_line();
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        let fd = self.fd.lock();
        let mut off = 0;
        while off < buf.len() {
            off += backing::write(fd.as_fd(), &buf[off..])?;
        }
        Ok(line)
    }

    /// Read every complete line of the journal in the held state directory `state` (missing
    /// journal: none).
    pub fn read(state: BorrowedFd<'_>) -> SysResult<Vec<Event>> {
        match backing::read_file(state, Path::new("events.jsonl")) {
            Ok(bytes) => Ok(parse(&bytes)),
            Err(nix::errno::Errno::ENOENT) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

/// Parse journal bytes: one event per line. A last line without its newline (torn by a crash)
/// is ignored, as is any line that is not an event (the torn line's remainder after a restart
/// wrote the separating newline).
pub fn parse(bytes: &[u8]) -> Vec<Event> {
    let complete = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(i) => &bytes[..=i],
        None => return Vec::new(),
    };
    complete
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect()
}

/// A smith's last run, as `status.json` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastRun {
    /// `run-0001` …
    pub run_id: String,
    /// `task`, `children` or `retry`.
    pub wake: String,
    /// When it started (RFC 3339).
    pub started: String,
    /// When it ended; null while live.
    pub ended: Option<String>,
    /// Its exit status, if it exited normally.
    pub exit_code: Option<i32>,
    /// The signal that killed it, if any.
    pub signal: Option<i32>,
}

/// What the journal says about one smith.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Runs started.
    pub runs: u32,
    /// The last run.
    pub last_run: Option<LastRun>,
    /// When the last run started.
    pub last_start: Option<SystemTime>,
    /// `failed` or `cancelled` per the last decisive event, else `None`.
    pub terminal: Option<Terminal>,
    /// The wake reason of its last run if that run was interrupted (`run.interrupted`, by an
    /// unmount or a dead daemon) and nothing ran since: what `--resume` re-queues.
    pub interrupted: Option<String>,
}

/// A state that only the journal remembers (§9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terminal {
    /// Retries exhausted.
    Failed,
    /// Cancelled.
    Cancelled,
}

/// A run recorded as started but never exited: the daemon died under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenRun {
    /// The smith's full id.
    pub smith: String,
    /// Its run id.
    pub run_id: String,
    /// Its wake reason.
    pub wake: String,
    /// The leader's pid.
    pub pid: Option<u32>,
    /// Its process group.
    pub pgid: Option<i32>,
    /// The leader's start time in clock ticks.
    pub start_ticks: Option<u64>,
    /// The smith's cgroup the run was created in (cgroup mode).
    pub cgroup: Option<String>,
}

/// Replay the journal: each smith's history (by full id) and the runs left open.
pub fn replay(events: &[Event]) -> (HashMap<String, History>, Vec<OpenRun>) {
    let mut hist: HashMap<String, History> = HashMap::new();
    let mut open: Vec<OpenRun> = Vec::new();
    for ev in events {
        let Some(smith) = ev.smith.clone() else {
            continue;
        };
        let h = hist.entry(smith.clone()).or_default();
        let closes = |open: &mut Vec<OpenRun>| {
            open.retain(|o| !(o.smith == smith && Some(&o.run_id) == ev.run_id.as_ref()))
        };
        match ev.event.as_str() {
            "run.started" => {
                h.runs += 1;
                h.terminal = None;
                h.interrupted = None;
                h.last_start = super::time::parse(&ev.ts);
                h.last_run = Some(LastRun {
                    run_id: ev.run_id.clone().unwrap_or_default(),
                    wake: ev.wake.clone().unwrap_or_default(),
                    started: ev.ts.clone(),
                    ended: None,
                    exit_code: None,
                    signal: None,
                });
                open.push(OpenRun {
                    smith: smith.clone(),
                    run_id: ev.run_id.clone().unwrap_or_default(),
                    wake: ev.wake.clone().unwrap_or_default(),
                    pid: ev.pid,
                    pgid: ev.pgid,
                    start_ticks: ev.start_ticks,
                    cgroup: ev.cgroup.clone(),
                });
            }
            "task.assigned" if ev.scheduled != Some(false) => h.terminal = None,
            "run.exited" | "run.interrupted" => {
                // An attempt that could not start has no `run.started`; it still consumed the
                // tasks that were there.
                let started = h.last_run.as_ref().map(|l| &l.run_id) == ev.run_id.as_ref();
                if !started && ev.error.is_some() {
                    h.last_start = super::time::parse(&ev.ts);
                }
                if let Some(lr) = h
                    .last_run
                    .as_mut()
                    .filter(|lr| Some(&lr.run_id) == ev.run_id.as_ref())
                {
                    lr.ended = Some(ev.ts.clone());
                    if ev.event == "run.exited" {
                        lr.exit_code = ev.exit_code;
                        lr.signal = ev.signal;
                    }
                }
                match ev.outcome.as_deref() {
                    Some("failed") => h.terminal = Some(Terminal::Failed),
                    Some("cancelled") => h.terminal = Some(Terminal::Cancelled),
                    _ => {}
                }
                if ev.event == "run.interrupted" {
                    let wake = ev
                        .wake
                        .clone()
                        .or_else(|| h.last_run.as_ref().map(|l| l.wake.clone()));
                    h.interrupted = wake.or(Some("task".into()));
                }
                closes(&mut open);
            }
            "run.cancelled" => {
                // A cancel consumes the tasks that were there: only newer ones revive it.
                h.terminal = Some(Terminal::Cancelled);
                h.interrupted = None;
                h.last_start = super::time::parse(&ev.ts).max(h.last_start);
            }
            _ => {}
        }
    }
    (hist, open)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event: &str, smith: &str, run: Option<&str>) -> Event {
        Event {
            ts: "2026-01-01T00:00:00.000000Z".into(),
            event: event.into(),
            smith: Some(smith.into()),
            run_id: run.map(Into::into),
            wake: Some("task".into()),
            ..Event::default()
        }
    }

    #[test]
    fn parse_ignores_a_torn_last_line_and_garbage() {
        let a = ev("run.started", "smith-root", Some("run-0001")).to_line();
        let text = format!("{a}\nnot json\n{a}\n{{\"ts\":\"2026");
        let got = parse(text.as_bytes());
        assert_eq!(got.len(), 2);
        assert_eq!(parse(b"{\"ts\":"), vec![]);
        assert!(!a.contains('\n'));
    }

    #[test]
    fn optional_fields_are_omitted_and_smith_is_null() {
        let line = Event::new("access.denied", None).to_line();
        assert!(line.contains("\"smith\":null"), "{line}");
        assert!(!line.contains("run_id"), "{line}");
    }

    #[test]
    fn replay_rebuilds_terminal_states_and_open_runs() {
        let mut exited = ev("run.exited", "smith-root/smith-001", Some("run-0001"));
        exited.outcome = Some("failed".into());
        exited.exit_code = Some(3);
        let events = vec![
            ev("run.started", "smith-root", Some("run-0001")),
            ev("run.started", "smith-root/smith-001", Some("run-0001")),
            exited,
            ev("run.started", "smith-root/smith-002", Some("run-0001")),
            ev("run.cancelled", "smith-root/smith-002", Some("run-0001")),
        ];
        let (h, open) = replay(&events);
        assert_eq!(h["smith-root"].runs, 1);
        assert_eq!(h["smith-root/smith-001"].terminal, Some(Terminal::Failed));
        assert_eq!(
            h["smith-root/smith-001"]
                .last_run
                .as_ref()
                .and_then(|l| l.exit_code),
            Some(3)
        );
        assert_eq!(
            h["smith-root/smith-002"].terminal,
            Some(Terminal::Cancelled)
        );
        let open: Vec<_> = open.iter().map(|o| o.smith.as_str()).collect();
        assert_eq!(open, vec!["smith-root", "smith-root/smith-002"]);
        // A new task revives a failed smith.
        let mut more = events.clone();
        more.push(ev("task.assigned", "smith-root/smith-001", None));
        assert_eq!(replay(&more).0["smith-root/smith-001"].terminal, None);
    }
}
