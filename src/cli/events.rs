//! `smithfs events [DIR] [-f|--follow] [--json] [--smith ID]`: the journal (PROTOCOL.md §6,
//! §7), one event a line for humans, or the JSON lines as they are. Read from the mount's
//! `.smithfs/events.jsonl`, or from the store (`.smithfs-state/events.jsonl` and its rotated
//! files) when the directory is not mounted.
//!
//! `--follow` re-opens the file for every poll (every [`POLL`]) and reads on from where it left
//! off, so a new line shows within a second and a follower never holds the mount busy between
//! polls (O3). It follows across an unmount (then reading the store) until interrupted.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use super::store::{self, Source};
use super::util::resolve_mount;
use crate::sched::view::format_event;

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

/// Where the journal of `dir` is right now: the mount's virtual file while it is mounted, else
/// the store's current journal file.
fn journal_path(dir: &Path) -> PathBuf {
    let live = dir.join(".smithfs/events.jsonl");
    if live.exists() {
        live
    } else {
        dir.join(crate::fs::STATE_DIR).join("events.jsonl")
    }
}

/// Read `path` from `offset` to its end, holding it open only for the read. A file shorter than
/// `offset` was rotated or replaced: read it from the start. Returns the bytes and the new
/// offset; a missing file reads as nothing.
fn read_from(path: &Path, offset: u64) -> std::io::Result<(Vec<u8>, u64)> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), offset)),
        Err(e) => return Err(e),
    };
    let mut buf = Vec::new();
    f.seek(SeekFrom::Start(offset))?;
    f.read_to_end(&mut buf)?;
    if buf.is_empty() && offset > 0 {
        // Nothing new, or a shorter file (rotated): its size tells. The control file has no
        // size of its own, so only the store's file can say it was rotated.
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len > 0 && len < offset {
            f.seek(SeekFrom::Start(0))?;
            f.read_to_end(&mut buf)?;
            let n = buf.len() as u64;
            return Ok((buf, n));
        }
    }
    let n = offset + buf.len() as u64;
    Ok((buf, n))
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
    let mut pending = Vec::new();
    let mut offset = 0u64;
    match &src {
        Source::Mount(_) => {
            let path = journal_path(&dir);
            let (bytes, n) =
                read_from(&path, 0).with_context(|| format!("cannot read {}", path.display()))?;
            pending = bytes;
            offset = n;
        }
        Source::Store(_) => {
            // Every rotated file first, then the current one (where a follower goes on).
            let files = store::journal_files(&dir);
            for (i, f) in files.iter().enumerate() {
                let (bytes, n) = read_from(f, 0).unwrap_or_default();
                if i + 1 == files.len() {
                    offset = n;
                    pending.extend_from_slice(&bytes);
                } else if let Some(end) = bytes.iter().rposition(|b| *b == b'\n') {
                    pending.extend_from_slice(&bytes[..=end]);
                }
            }
        }
    }
    flush_lines(&mut pending, &args, smith.as_deref())?;
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    let mut path = journal_path(&dir);
    loop {
        std::thread::sleep(POLL);
        let now = journal_path(&dir);
        if now != path {
            // Mounted or unmounted meanwhile: the same journal, seen from the other side.
            path = now;
        }
        match read_from(&path, offset) {
            Ok((bytes, n)) => {
                offset = n;
                pending.extend_from_slice(&bytes);
                flush_lines(&mut pending, &args, smith.as_deref())?;
            }
            // A mount going away under the read: try again at the next poll.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ENOENT)) => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }
}
