//! The journal `.smithfs-state/events.jsonl` (docs/SPEC.md §7): one JSON object a line, append
//! only, written through a held `O_APPEND` descriptor with one `write` per line; and its reader,
//! which ignores a torn last line, plus the replay that start-up uses to rebuild `failed` and
//! `cancelled` states and to find runs that started but never exited (§9).
//!
//! Long on purpose: the writer, the reader, the replay and the fold of dropped lines share one
//! line format and one set of invariants (one `write` per line, a torn last line ignored), and
//! their tests exercise them together.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::SystemTime;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::backing::{self, SysResult};
use crate::config::Rotation;
use crate::tree::model::FullId;

/// The journal's file name in the state directory.
pub const JOURNAL_NAME: &CStr = c"events.jsonl";

/// One journal line. `ts`, `event` and `smith` are always present (`smith` may be null); the
/// other fields only when the event needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// RFC 3339 UTC with microseconds.
    pub ts: String,
    /// `run.started`, `task.assigned`, … (docs/SPEC.md §5), or `hook.exited`,
    /// `trigger.dropped`.
    pub event: String,
    /// The smith's full id; null for events of no smith (an operator's denial).
    pub smith: Option<FullId>,
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
    /// `run.started` of a Slurm job (docs/SPEC.md §13): its job id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
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
    /// For `workspace.committed`: the new commit's id (docs/SPEC.md §11).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// For `access.denied.suppressed`: the denials of that identity and second not written in
    /// full (docs/SPEC.md §7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Why, for `task.ignored` (the name rule it breaks) and for `run.exited` (`exit`,
    /// `signal`, `timeout`, `cancelled`, `oom`, `spawn_error` or `bad_config`; docs/SPEC.md §5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `config.reloaded`: the sections of config.json that changed (`agent`, `scheduler`,
    /// `limits`, `hooks`, `journal`; docs/SPEC.md §6, docs/PROTOCOL-NOTES.md O12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<Vec<String>>,
}

impl Event {
    /// A new event stamped now.
    pub fn new(event: &str, smith: Option<FullId>) -> Event {
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

/// The rotated journals keep this name plus `.1` (newest) … `.N` (docs/SPEC.md §7).
const JOURNAL_STR: &str = "events.jsonl";

/// A rotated journal on its way out: renamed here by a rotation, folded into the
/// [`SNAPSHOT_NAME`] snapshot, then removed (a crash in between leaves it for the next start).
const DROP_NAME: &CStr = c"events.jsonl.drop";

/// The state carried forward from the journals that rotation removed (docs/PROTOCOL-NOTES.md
/// H5): what a restart rebuilds survives rotation.
pub const SNAPSHOT_NAME: &CStr = c"journal-state.json";

#[derive(Debug)]
struct Writer {
    fd: OwnedFd,
    /// The current file's size in bytes.
    size: u64,
    /// The journal offset of the current file's first byte: every byte journaled before it,
    /// rotated files and dropped ones alike ([`BASE_NAME`]).
    base: u64,
    limits: Rotation,
}

/// `.smithfs-state/journal-base`: the journal offset (decimal) of the first byte of the current
/// `events.jsonl`. Journal offsets count every byte ever journaled, so they only grow across
/// rotations: the offsets of `.smithfs/events.jsonl` (docs/PROTOCOL-NOTES.md O13). Written
/// before a rotation's renames; missing (a store older than it): the rotated files' sizes.
pub const BASE_NAME: &CStr = c"journal-base";

/// The open journal. Appends are serialised by a leaf mutex held across one `write` (and, at
/// most once per `max_bytes`, a rotation's renames); folding a removed file into the snapshot
/// happens after the lock is released, under a mutex of its own.
#[derive(Debug)]
pub struct Journal {
    state: OwnedFd,
    w: Mutex<Writer>,
    fold: Mutex<()>,
}

impl Journal {
    /// Open (creating, mode 0600) the journal in the held state directory `state`, rotating at
    /// `limits`. If a crash left a torn last line, a newline is written first so the next line
    /// stands alone; a removed file a crash left unfolded is folded now.
    pub fn open(state: BorrowedFd<'_>, limits: Rotation) -> SysResult<Journal> {
        let fd = open_current(state)?;
        let st = backing::stat(fd.as_fd())?;
        let mut size = st.st_size.max(0) as u64;
        if size > 0 {
            let rd = backing::open_file(state, JOURNAL_NAME, libc::O_RDONLY, 0)?;
            let mut last = [0u8; 1];
            let n = backing::pread(rd.as_fd(), &mut last, size - 1)?;
            if n == 1 && last[0] != b'\n' {
                backing::write(fd.as_fd(), b"\n")?;
                size += 1;
            }
        }
        let base = stored_base(state);
        let j = Journal {
            state: backing::dup(state)?,
            w: Mutex::new(Writer {
                fd,
                size,
                base,
                limits,
            }),
            fold: Mutex::new(()),
        };
        j.fold_dropped();
        Ok(j)
    }

    /// The journal offset just past its last line: every byte ever journaled (the size of
    /// `.smithfs/events.jsonl`; docs/PROTOCOL-NOTES.md O13).
    pub fn end(&self) -> u64 {
        let w = self.w.lock();
        w.base + w.size
    }

    /// Up to `len` bytes of the journal from journal offset `offset` on, across the rotated
    /// files, with the journal offset they start at: `offset`, or the oldest byte still kept
    /// when rotation dropped `offset` (nothing at or past [`Journal::end`]). Held against
    /// rotation meanwhile. A complete line that is not a JSON object (a torn line a crash
    /// left) is blanked to spaces, so offsets stay those of the files.
    ///
    /// # Errors
    /// A journal file cannot be read.
    pub fn read_at(&self, offset: u64, len: usize) -> SysResult<(u64, Vec<u8>)> {
        let w = self.w.lock();
        read_range(self.state.as_fd(), w.base, offset, len)
    }

    /// Apply new rotation limits (a reload of config.json); they take effect at the next line.
    pub fn set_limits(&self, limits: Rotation) {
        self.w.lock().limits = limits;
    }

    /// Append `ev` as one line with one `write` (retried only for a short write), rotating first
    /// when the line would take the file over `max_bytes`. Returns the line written (without
    /// the newline), for hooks.
    pub fn append(&self, ev: &Event) -> SysResult<String> {
        let line = ev.to_line();
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        let rotated = {
            let mut w = self.w.lock();
            let mut rotated = false;
            if w.size > 0 && w.size + buf.len() as u64 > w.limits.max_bytes {
                match self.rotate(&mut w) {
                    Ok(()) => rotated = true,
                    Err(e) => tracing::error!("cannot rotate the journal: {e}"),
                }
            }
            let mut off = 0;
            while off < buf.len() {
                off += backing::write(w.fd.as_fd(), &buf[off..])?;
            }
            w.size += buf.len() as u64;
            rotated
        };
        if rotated {
            self.fold_dropped();
        }
        Ok(line)
    }

    /// Rename `events.jsonl.keep` to the drop name, shift `.i` to `.i+1`, the current file to
    /// `.1`, and start a new current file. Renames only: readers see every line in some file.
    fn rotate(&self, w: &mut Writer) -> SysResult<()> {
        let st = self.state.as_fd();
        if backing::stat_at(st, DROP_NAME).is_ok() {
            // A fold that failed before: it must not be overwritten.
            self.fold_dropped_locked();
        }
        // The offsets go on from here, also if a crash stops the renames half way.
        let base = w.base + w.size;
        backing::write_atomic(st, BASE_NAME, base.to_string().as_bytes(), 0o600)?;
        w.base = base;
        let keep = w.limits.keep;
        if keep == 0 {
            backing::rename(st, JOURNAL_NAME, st, DROP_NAME, 0)?;
        } else {
            let last = rotated_name(keep);
            match backing::rename(st, &last, st, DROP_NAME, 0) {
                Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
            for i in (1..keep).rev() {
                match backing::rename(st, &rotated_name(i), st, &rotated_name(i + 1), 0) {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                    Err(e) => return Err(e),
                }
            }
            backing::rename(st, JOURNAL_NAME, st, &rotated_name(1), 0)?;
        }
        w.fd = open_current(st)?;
        w.size = 0;
        Ok(())
    }

    /// Fold the drop file, if any, into the snapshot and remove it.
    fn fold_dropped(&self) {
        let _g = self.fold.lock();
        self.fold_dropped_locked();
    }

    fn fold_dropped_locked(&self) {
        if let Err(e) = fold_drop(self.state.as_fd()) {
            tracing::error!("cannot fold a rotated journal into the state snapshot: {e}");
        }
    }

    /// Every complete line of the journal in the held state directory `state`, across the
    /// rotated files, oldest first (see [`read_all`]).
    pub fn read(state: BorrowedFd<'_>) -> SysResult<Vec<Event>> {
        read_all(state)
    }
}

fn open_current(state: BorrowedFd<'_>) -> SysResult<OwnedFd> {
    backing::open_file(
        state,
        JOURNAL_NAME,
        libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        0o600,
    )
}

/// `events.jsonl.N`.
fn rotated_name(n: u32) -> CString {
    CString::new(format!("{JOURNAL_STR}.{n}")).unwrap_or_default()
}

/// A file's identity for "was this drop file folded already" (inode numbers alone are reused).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct FileId {
    ino: u64,
    size: i64,
    mtime: i64,
    mtime_nsec: i64,
}

impl FileId {
    fn of(st: &libc::stat) -> FileId {
        FileId {
            ino: st.st_ino,
            size: st.st_size,
            mtime: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec,
        }
    }
}

/// `.smithfs-state/journal-state.json`: the replay of every journal line rotation removed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Snapshot {
    /// The replayed state.
    replay: Replay,
    /// The drop file folded last, so that a crash between folding and removing it does not
    /// fold it twice.
    #[serde(default)]
    folded: Option<FileId>,
}

fn load_snapshot(state: BorrowedFd<'_>) -> SysResult<Snapshot> {
    match backing::read_file(state, Path::new("journal-state.json")) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::error!("journal-state.json is not a state snapshot ({e}); ignored");
            Snapshot::default()
        })),
        Err(nix::errno::Errno::ENOENT) => Ok(Snapshot::default()),
        Err(e) => Err(e),
    }
}

/// The drop file's identity, if it exists and is not in the snapshot yet.
fn unfolded_drop(state: BorrowedFd<'_>, snap: &Snapshot) -> Option<FileId> {
    let st = backing::stat_at(state, DROP_NAME).ok()?;
    let id = FileId::of(&st);
    (snap.folded != Some(id)).then_some(id)
}

/// Why a dropped journal file could not be folded into the snapshot; logged.
#[derive(Debug, thiserror::Error)]
enum FoldError {
    /// A system call on the state directory failed.
    #[error("{0}")]
    Backing(#[from] nix::errno::Errno),
    /// The snapshot could not be encoded.
    #[error("cannot encode the state snapshot: {0}")]
    Encode(#[from] serde_json::Error),
}

fn fold_drop(state: BorrowedFd<'_>) -> Result<(), FoldError> {
    if backing::stat_at(state, DROP_NAME).is_err() {
        return Ok(());
    }
    let mut snap = load_snapshot(state)?;
    if let Some(id) = unfolded_drop(state, &snap) {
        let bytes = backing::read_file(state, Path::new("events.jsonl.drop"))?;
        for ev in parse(&bytes) {
            snap.replay.apply(&ev);
        }
        snap.folded = Some(id);
        let text = serde_json::to_vec(&snap)?;
        backing::write_atomic(state, SNAPSHOT_NAME, &text, 0o600)?;
    }
    Ok(backing::unlink(state, DROP_NAME, false)?)
}

/// The journal files in the held state directory `state`, oldest first: an unfolded drop file,
/// `events.jsonl.N` … `.1` (every number present, also beyond `keep`), then `events.jsonl`.
/// The one place that knows the rotation's names: `smithfs events`, `.smithfs/events.jsonl`,
/// the start-up replay and a follower use it (docs/SPEC.md §7).
pub fn files(state: BorrowedFd<'_>) -> SysResult<Vec<CString>> {
    let mut numbered: Vec<u32> = backing::dir_names(state)?
        .iter()
        .filter_map(|n| {
            let rest = n.strip_prefix(format!("{JOURNAL_STR}.").as_bytes())?;
            let digits = std::str::from_utf8(rest).ok()?;
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse().ok())
                .flatten()
        })
        .collect();
    numbered.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = Vec::new();
    if unfolded_drop(state, &load_snapshot(state).unwrap_or_default()).is_some() {
        out.push(DROP_NAME.to_owned());
    }
    out.extend(numbered.into_iter().map(rotated_name));
    out.push(JOURNAL_NAME.to_owned());
    Ok(out)
}

/// The journal offset of the first byte of the current `events.jsonl` in the state directory
/// `state`: [`BASE_NAME`], or without it the sizes of the rotated files before it.
pub fn stored_base(state: BorrowedFd<'_>) -> u64 {
    if let Ok(b) = backing::read_file(state, Path::new(BASE_NAME.to_str().unwrap_or_default())) {
        if let Some(n) = std::str::from_utf8(&b)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return n;
        }
    }
    segments(state, 0)
        .map(|segs| segs.iter().map(|s| s.len).sum::<u64>() - segs.last().map_or(0, |s| s.len))
        .unwrap_or(0)
}

/// One journal file at its place in the journal's offsets.
#[derive(Debug)]
struct Segment {
    name: CString,
    start: u64,
    len: u64,
}

/// The journal files of `state`, oldest first, placed so that the current file starts at
/// journal offset `base` (each earlier file ends where the next starts).
fn segments(state: BorrowedFd<'_>, base: u64) -> SysResult<Vec<Segment>> {
    let mut out: Vec<Segment> = Vec::new();
    let mut start = base;
    for (i, name) in files(state)?.into_iter().rev().enumerate() {
        let len = match backing::stat_at(state, &name) {
            Ok(st) => st.st_size.max(0) as u64,
            Err(nix::errno::Errno::ENOENT) if i > 0 => continue,
            Err(nix::errno::Errno::ENOENT) => 0,
            Err(e) => return Err(e),
        };
        if i > 0 {
            start = start.saturating_sub(len);
        }
        out.push(Segment { name, start, len });
    }
    out.reverse();
    Ok(out)
}

/// [`Journal::read_at`] of the journal in `state` whose current file starts at `base` (from
/// [`stored_base`] when no daemon holds it).
///
/// # Errors
/// A journal file cannot be read.
pub fn read_range(
    state: BorrowedFd<'_>,
    base: u64,
    offset: u64,
    len: usize,
) -> SysResult<(u64, Vec<u8>)> {
    let segs = segments(state, base)?;
    let first = segs.first().map_or(base, |s| s.start);
    let start = offset.max(first);
    let mut out = Vec::new();
    let mut pos = start;
    let mut line_start = true;
    for seg in &segs {
        if seg.start + seg.len <= pos {
            continue;
        }
        if out.len() >= len {
            break;
        }
        let Ok(fd) = backing::open_file(state, &seg.name, libc::O_RDONLY, 0) else {
            continue;
        };
        let mut at = pos - seg.start;
        if out.is_empty() && at > 0 {
            let mut b = [0u8; 1];
            line_start = backing::pread(fd.as_fd(), &mut b, at - 1)? == 1 && b[0] == b'\n';
        }
        let want = (len - out.len()).min((seg.len - at) as usize);
        let mut buf = vec![0u8; want];
        let mut got = 0;
        while got < want {
            let n = backing::pread(fd.as_fd(), &mut buf[got..], at)?;
            if n == 0 {
                break;
            }
            got += n;
            at += n as u64;
        }
        buf.truncate(got);
        pos += got as u64;
        out.extend_from_slice(&buf);
        if got < want {
            break;
        }
    }
    blank_torn_lines(&mut out, line_start);
    Ok((start, out))
}

/// Blank (to spaces, keeping the newline) every complete line of `buf` that is not a JSON
/// object: a torn line a crash left, which readers ignore (docs/SPEC.md §7). The first line is
/// only judged when `line_start` says `buf` begins one; the unterminated tail never is.
fn blank_torn_lines(buf: &mut [u8], line_start: bool) {
    let mut from = 0;
    let mut judge = line_start;
    while let Some(i) = buf[from..].iter().position(|b| *b == b'\n') {
        let end = from + i;
        if judge
            && serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&buf[from..end])
                .is_err()
        {
            buf[from..end].fill(b' ');
        }
        judge = true;
        from = end + 1;
    }
}

/// The complete lines of every journal file, oldest first, as bytes: what
/// `.smithfs/events.jsonl` serves. A torn last line of a file is left out.
pub fn read_all_bytes(state: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
    let mut out = Vec::new();
    for name in files(state)? {
        let path = Path::new(std::ffi::OsStr::from_bytes(name.as_bytes()));
        match backing::read_file(state, path) {
            Ok(bytes) => {
                let end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                out.extend_from_slice(&bytes[..end]);
            }
            // Rotated away between the listing and the read: its lines are in the next file
            // or, when dropped, in the snapshot.
            Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Every complete line of the journal in the held state directory `state`, across the rotated
/// files, oldest first (missing journal: none).
pub fn read_all(state: BorrowedFd<'_>) -> SysResult<Vec<Event>> {
    Ok(parse(&read_all_bytes(state)?))
}

/// What a restart rebuilds (docs/SPEC.md §7, §9): the snapshot of the removed files, with every
/// line still in a journal file replayed on top.
pub fn load(state: BorrowedFd<'_>) -> SysResult<Replay> {
    let mut r = load_snapshot(state)?.replay;
    for ev in read_all(state)? {
        r.apply(&ev);
    }
    Ok(r)
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
    /// Why it ended (`run.exited`'s `reason`, docs/SPEC.md §5); null while live or when the
    /// journal does not say (an interrupted run).
    #[serde(default)]
    pub reason: Option<String>,
    /// Its output, `conversations/RUN_ID/messages.log` relative to the mount root (§7).
    #[serde(default)]
    pub log: Option<String>,
    /// `run.exited`'s `error`, when it has one: why the run could not start, or why what it
    /// left is not a result (docs/PROTOCOL-NOTES.md S28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where it ran (docs/SPEC.md §7, §13): `local`, or `slurm:JOBID@NODE` for a Slurm job
    /// (`slurm:JOBID` until it runs on a node, and when read back from the journal).
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    pub where_: Option<String>,
}

/// What the journal says about one smith.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// When its result was last published (`result.published`): a result file newer than the
    /// start of a run the daemon died under, and not published since, was never completed
    /// (docs/PROTOCOL-NOTES.md S30).
    #[serde(default)]
    pub last_published: Option<SystemTime>,
}

/// A state that only the journal remembers (§9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Terminal {
    /// Retries exhausted.
    Failed,
    /// Cancelled.
    Cancelled,
}

/// A run recorded as started but never exited: the daemon died under it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenRun {
    /// The smith's full id.
    pub smith: FullId,
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
    /// The Slurm job it was (docs/SPEC.md §13): cancelled at start-up like a local leftover.
    #[serde(default)]
    pub job_id: Option<String>,
}

/// The journal replayed: each smith's history (by full id) and the runs left open. Built line by
/// line with [`Replay::apply`], so the lines rotation removes can be folded into a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replay {
    /// Per full id.
    pub hist: HashMap<String, History>,
    /// Runs started and not exited, in start order.
    pub open: Vec<OpenRun>,
}

/// Replay the journal: each smith's history (by full id) and the runs left open.
pub fn replay(events: &[Event]) -> (HashMap<String, History>, Vec<OpenRun>) {
    let mut r = Replay::default();
    for ev in events {
        r.apply(ev);
    }
    (r.hist, r.open)
}

impl Replay {
    /// Take one more journal line into account.
    pub fn apply(&mut self, ev: &Event) {
        let (hist, open) = (&mut self.hist, &mut self.open);
        let Some(smith) = ev.smith.clone() else {
            return;
        };
        let h = hist.entry(smith.to_string()).or_default();
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
                    where_: Some(match &ev.job_id {
                        Some(job) => format!("slurm:{job}"),
                        None => "local".into(),
                    }),
                    ..LastRun::default()
                });
                open.push(OpenRun {
                    smith: smith.clone(),
                    run_id: ev.run_id.clone().unwrap_or_default(),
                    wake: ev.wake.clone().unwrap_or_default(),
                    pid: ev.pid,
                    pgid: ev.pgid,
                    start_ticks: ev.start_ticks,
                    cgroup: ev.cgroup.clone(),
                    job_id: ev.job_id.clone(),
                });
            }
            "task.assigned" if ev.scheduled != Some(false) => h.terminal = None,
            "result.published" | "result.published.suppressed" => {
                h.last_published = super::time::parse(&ev.ts)
            }
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
                        lr.reason = ev.reason.clone();
                        lr.error = ev.error.clone();
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
                closes(open);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event: &str, smith: &str, run: Option<&str>) -> Event {
        Event {
            ts: "2026-01-01T00:00:00.000000Z".into(),
            event: event.into(),
            smith: Some(smith.parse().expect("a full id")),
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
    fn torn_lines_are_blanked_in_place() {
        let cases: &[(&str, bool, &str)] = &[
            ("{\"a\":1}\n", true, "{\"a\":1}\n"),
            (
                "{\"a\":1}\n{\"b\n{\"c\":2}\n",
                true,
                "{\"a\":1}\n   \n{\"c\":2}\n",
            ),
            // A first line not known to start a line, and an unterminated tail: left as they are.
            ("\"a\":1}\n{\"b", false, "\"a\":1}\n{\"b"),
            ("x\n\n[1]\n", true, " \n\n   \n"),
        ];
        for (input, line_start, want) in cases {
            let mut b = input.as_bytes().to_vec();
            blank_torn_lines(&mut b, *line_start);
            assert_eq!(String::from_utf8_lossy(&b), *want, "{input:?}");
        }
    }

    #[test]
    fn journal_offsets_grow_across_rotations_and_reads_resume_anywhere() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = std::fs::File::open(tmp.path()).expect("open");
        let limits = Rotation {
            max_bytes: 4096,
            keep: 1,
        };
        let j = Journal::open(dir.as_fd(), limits).expect("journal");
        let mut all = Vec::new();
        // Read on in small steps while writing, as a follower does.
        let mut at = 0u64;
        let mut seen = Vec::new();
        for i in 0..200u32 {
            let mut e = ev("run.started", "smith-root", Some(&format!("run-{i:04}")));
            e.pid = Some(i);
            let line = j.append(&e).expect("append");
            all.extend_from_slice(line.as_bytes());
            all.push(b'\n');
            loop {
                let (start, bytes) = j.read_at(at, 100).expect("read");
                assert_eq!(start, at, "never behind by more than the kept files");
                if bytes.is_empty() {
                    break;
                }
                at += bytes.len() as u64;
                seen.extend_from_slice(&bytes);
            }
        }
        assert_eq!(j.end(), all.len() as u64, "every byte counted");
        assert_eq!(seen, all, "every line once, in order");
        // From 0: the oldest byte kept; its lines are whole.
        let (start, kept) = j.read_at(0, 1 << 20).expect("read");
        assert!(start > 0 && start + kept.len() as u64 == j.end());
        assert_eq!(&all[start as usize..], &kept[..]);
        // A reopened journal (the next daemon, or the CLI on the store) agrees.
        drop(j);
        assert_eq!(
            read_range(dir.as_fd(), stored_base(dir.as_fd()), start, 1 << 20).expect("read"),
            (start, kept)
        );
        let j = Journal::open(dir.as_fd(), limits).expect("journal");
        assert_eq!(j.end(), all.len() as u64);
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

    #[test]
    fn rotation_keeps_n_files_and_the_snapshot_carries_the_rest() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = std::fs::File::open(tmp.path()).expect("open");
        let limits = Rotation {
            max_bytes: 4096,
            keep: 2,
        };
        let j = Journal::open(dir.as_fd(), limits).expect("journal");
        let mut all = Vec::new();
        for i in 0..400u32 {
            let smith = format!("smith-root/smith-{:03}", i % 7 + 1);
            let run = format!("run-{:04}", i / 7 + 1);
            // smith-003 fails for good in the first rounds, never to run again (it is gone
            // from the journal files, only in the snapshot).
            if i % 7 == 2 && i > 20 {
                continue;
            }
            let mut e = ev("run.started", &smith, Some(&run));
            e.pid = Some(1000 + i);
            all.push(e.clone());
            j.append(&e).expect("append");
            let mut x = ev("run.exited", &smith, Some(&run));
            x.outcome = Some(if i % 7 == 2 { "failed" } else { "done" }.into());
            x.exit_code = Some(1);
            all.push(x.clone());
            j.append(&x).expect("append");
        }
        // One more that stays open.
        let open_run = ev("run.started", "smith-root", Some("run-0001"));
        all.push(open_run.clone());
        j.append(&open_run).expect("append");
        let names: Vec<String> = files(dir.as_fd())
            .expect("files")
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["events.jsonl.2", "events.jsonl.1", "events.jsonl"]);
        for n in &names {
            let len = std::fs::metadata(tmp.path().join(n)).expect("stat").len();
            assert!(len <= 4096, "{n}: {len} bytes");
        }
        assert!(tmp.path().join("journal-state.json").exists());
        assert!(!tmp.path().join("events.jsonl.drop").exists());
        // What a restart rebuilds is what the whole history says.
        let (hist, open) = replay(&all);
        let got = load(dir.as_fd()).expect("load");
        assert_eq!(got.hist, hist);
        assert_eq!(got.open, open);
        assert_eq!(
            got.hist["smith-root/smith-003"].terminal,
            Some(Terminal::Failed)
        );
        assert_eq!(got.hist["smith-root/smith-001"].runs, 58);
        // The readers see only what the files still hold: the newest lines.
        let kept = read_all(dir.as_fd()).expect("read");
        assert!(kept.len() < all.len());
        assert_eq!(kept.last(), all.last());
        // A crash between the fold and the removal of the drop file folds it only once.
        std::fs::copy(
            tmp.path().join("events.jsonl.2"),
            tmp.path().join("events.jsonl.drop"),
        )
        .expect("copy");
        fold_drop(dir.as_fd()).expect("fold");
        let twice = load(dir.as_fd()).expect("load");
        assert_ne!(twice.hist, hist, "a new drop file is folded");
    }
}
