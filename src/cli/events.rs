//! `smithfs events [DIR] [-f|--follow] [--json] [--smith ID]`: the journal (docs/SPEC.md §6,
//! §7), one event a line for humans, or the JSON lines as they are. Read from the mount's
//! `.smithfs/events.jsonl`, or from the store (`.smithfs-state/events.jsonl` and its rotated
//! files) when the directory is not mounted.
//!
//! `--follow` re-opens the file for every poll (every [`POLL`]) and reads on from the journal
//! offset where it left off, so a new line shows within a second, none is missed or repeated
//! across a rotation, and a follower never holds the mount busy between polls (O3, O13). It
//! follows across an unmount (then reading the store) until interrupted.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use super::render::format_event;
use super::store;
use super::util::resolve_mount;
use crate::sched::journal;

/// How often `--follow` looks for new lines.
pub const POLL: Duration = Duration::from_millis(200);

/// Arguments of `smithfs events`.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// The mount (default as for `status`).
    pub dir: Option<PathBuf>,
    /// Keep printing new events as they are journaled (each within a second), until
    /// interrupted.
    #[arg(short, long)]
    pub follow: bool,
    /// Print the JSON lines as they are.
    #[arg(long)]
    pub json: bool,
    /// Only the events of this smith and its subtree (full id, short id or unique suffix).
    #[arg(long, value_name = "ID")]
    pub smith: Option<String>,
}

/// Does journal line `v` belong to `smith` or its subtree?
fn of_subtree(v: &serde_json::Value, smith: &str) -> bool {
    v.get("smith")
        .and_then(|s| s.as_str())
        .is_some_and(|s| s == smith || s.strip_prefix(smith).is_some_and(|r| r.starts_with('/')))
}

fn print_line(
    out: &mut impl Write,
    line: &str,
    json: bool,
    smith: Option<&str>,
) -> std::io::Result<()> {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(v) if smith.is_some_and(|s| !of_subtree(&v, s)) => Ok(()),
        Ok(_) if json => writeln!(out, "{line}"),
        Ok(v) => writeln!(out, "{}", format_event(&v)),
        Err(_) => Ok(()), // not an event (a torn line): skipped, as the journal's reader does
    }
}

/// Where the journal of `dir` is read from right now: the mount's virtual file while it is
/// mounted, else the store's journal files. Both are addressed by journal offsets (every byte
/// ever journaled, across rotations; docs/PROTOCOL-NOTES.md O13), so a follower goes on from the
/// same offset after a mount or an unmount.
fn live_path(dir: &Path) -> Option<PathBuf> {
    let live = dir.join(".smithfs/events.jsonl");
    live.exists().then_some(live)
}

/// The journal from journal offset `offset` (0: from the oldest line kept) to its end, holding
/// a file open only for the read. Returns the bytes and the offset after them.
pub(crate) fn read_from(dir: &Path, offset: u64) -> std::io::Result<(Vec<u8>, u64)> {
    match live_path(dir) {
        Some(path) => read_live(&path, offset),
        None => read_store(dir, offset),
    }
}

/// The journal offset after the last byte journaled in `dir` (what [`read_from`] would read up
/// to): the size of the mount's `.smithfs/events.jsonl`, or of the store's journal files from
/// its base (docs/PROTOCOL-NOTES.md O13). 0 when nothing was journaled.
///
/// # Errors
/// The journal cannot be looked at.
pub(crate) fn journal_end(dir: &Path) -> std::io::Result<u64> {
    if let Some(path) = live_path(dir) {
        return match std::fs::metadata(&path) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        };
    }
    let err = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
    let root = crate::backing::open_store_root(dir).map_err(err)?;
    let state = match crate::backing::open_dir_path(
        std::os::fd::AsFd::as_fd(&root),
        Path::new(crate::tree::layout::STATE_DIR),
    ) {
        Ok(s) => s,
        Err(nix::errno::Errno::ENOENT) => return Ok(0),
        Err(e) => return Err(err(e)),
    };
    let state = std::os::fd::AsFd::as_fd(&state);
    let len = match crate::backing::stat_at(state, journal::JOURNAL_NAME) {
        Ok(st) => st.st_size.max(0) as u64,
        Err(nix::errno::Errno::ENOENT) => 0,
        Err(e) => return Err(err(e)),
    };
    Ok(journal::stored_base(state) + len)
}

/// [`read_from`] of the mount's `.smithfs/events.jsonl`, whose size is the journal's end and
/// whose data starts (`SEEK_DATA`) at the oldest offset kept.
fn read_live(path: &Path, offset: u64) -> std::io::Result<(Vec<u8>, u64)> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), offset)),
        Err(e) => return Err(e),
    };
    let start = if offset == 0 {
        use std::os::fd::AsRawFd;
        // SAFETY: lseek on a descriptor we own.
        let s = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
        if s < 0 {
            // ENXIO: nothing journaled yet.
            return Ok((Vec::new(), 0));
        }
        s as u64
    } else {
        offset
    };
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    let n = start + buf.len() as u64;
    Ok((buf, n))
}

/// [`read_from`] of an unmounted store's journal files.
fn read_store(dir: &Path, offset: u64) -> std::io::Result<(Vec<u8>, u64)> {
    let err = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
    let root = crate::backing::open_store_root(dir).map_err(err)?;
    let state = match crate::backing::open_dir_path(
        std::os::fd::AsFd::as_fd(&root),
        Path::new(crate::tree::layout::STATE_DIR),
    ) {
        Ok(s) => s,
        Err(nix::errno::Errno::ENOENT) => return Ok((Vec::new(), offset)),
        Err(e) => return Err(err(e)),
    };
    let state = std::os::fd::AsFd::as_fd(&state);
    let base = journal::stored_base(state);
    let mut out = Vec::new();
    let mut at = offset;
    loop {
        let (start, bytes) = journal::read_range(state, base, at, 1 << 20).map_err(err)?;
        if bytes.is_empty() {
            return Ok((out, at.max(start)));
        }
        at = start + bytes.len() as u64;
        out.extend_from_slice(&bytes);
    }
}

/// Print the complete lines of `pending` (a torn tail waits for its newline).
fn flush_lines(pending: &mut Vec<u8>, args: &EventsArgs, smith: Option<&str>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if let Some(i) = pending.iter().rposition(|b| *b == b'\n') {
        let complete: Vec<u8> = pending.drain(..=i).collect();
        for line in String::from_utf8_lossy(&complete).lines() {
            let line = line.trim_end();
            if !line.is_empty() {
                print_line(&mut out, line, args.json, smith)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// Run `smithfs events`.
pub fn run(args: EventsArgs) -> Result<ExitCode> {
    let dir = resolve_mount(args.dir.as_deref())?;
    let src = store::source(&dir)?;
    let smith = match &args.smith {
        Some(q) => Some(store::resolve_id(&src, q)?),
        None => None,
    };
    let (mut pending, mut offset) = read_from(&dir, 0)
        .with_context(|| format!("cannot read the journal of {}", dir.display()))?;
    flush_lines(&mut pending, &args, smith.as_deref())?;
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        std::thread::sleep(POLL);
        match read_from(&dir, offset) {
            Ok((bytes, n)) => {
                offset = n;
                pending.extend_from_slice(&bytes);
                flush_lines(&mut pending, &args, smith.as_deref())?;
            }
            // A mount going away under the read: try again at the next poll.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ENOENT)) => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot read the journal of {}", dir.display()))
            }
        }
    }
}
