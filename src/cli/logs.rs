//! `smithfs logs [DIR] ID [--run RUN_ID] [--follow]`: a run's `messages.log` (its stdout and
//! stderr, docs/SPEC.md §5) — the latest run's by default — and `smithfs logs [DIR] --daemon
//! [--follow]`: the daemon's own log (docs/SPEC.md §6). Both work on a mount and on a directory
//! that is not mounted (read from the store).
//!
//! `--follow` prints new lines within a second (the file is re-opened every [`POLL`], so a
//! follower never keeps the mount busy) and, for a run, ends once that run has ended (its
//! `meta.json` has an `end`) and the last bytes are printed — unless it follows the latest run
//! and the smith runs again at once (a retry): then it goes on with that run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use super::events::POLL;
use super::ids::usage;
use super::store;
use super::util::resolve_mount;

/// Arguments of `smithfs logs`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  smithfs logs smith-001            the latest run of the one smith-001\n  \
                        smithfs logs DIR smith-root --run run-0002\n  \
                        smithfs logs smith-root/smith-002 --follow\n  smithfs logs --daemon --follow"
)]
pub struct LogsArgs {
    /// `[DIR] ID`: the mount or store (default as for `status`) and the smith — a full id, a
    /// short id only one smith has, or a unique suffix. With `--daemon`: just `[DIR]`.
    #[arg(num_args = 0..=2, value_name = "[DIR] ID")]
    pub args: Vec<String>,
    /// That run (`run-0002`, or `2`) instead of the latest.
    #[arg(long, value_name = "RUN_ID")]
    pub run: Option<String>,
    /// Keep printing new lines; for a run, until it ends.
    #[arg(short, long)]
    pub follow: bool,
    /// The daemon's own log instead of a run's.
    #[arg(long, conflicts_with = "run")]
    pub daemon: bool,
}

/// `run-0002` for `2`, `0002` or `run-0002`.
fn run_id(q: &str) -> Result<String> {
    let digits = q.trim().strip_prefix("run-").unwrap_or(q.trim());
    match digits.parse::<u32>() {
        Ok(n) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(format!("run-{n:04}"))
        }
        _ => usage!("`{q}` is not a run id (run-0001, or 1)"),
    }
}

/// The runs of a smith dir, in order (`conversations/run-*`).
fn runs(smith_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(smith_dir.join("conversations"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| n.starts_with("run-"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Has the run whose directory is `run_dir` ended (its `meta.json` has an `end`)?
fn run_ended(run_dir: &Path) -> bool {
    std::fs::read_to_string(run_dir.join("meta.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v.get("end").is_some_and(|e| !e.is_null()))
}

/// Print `path` from `offset` on, opening it only for the read; the new offset.
fn print_from(path: &Path, offset: u64, last: bool) -> Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && offset > 0 => return Ok(offset),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN)) => return Ok(offset),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    f.seek(SeekFrom::Start(offset))?;
    // In pieces, never the whole log in memory: a run that printed gigabytes (its output is
    // bounded only by its smith's storage, notes L17) made `logs` allocate all of it (notes
    // O52). A piece ends before a torn UTF-8 sequence, which the next piece begins with, so
    // that a C1 control or a bidi character split between two pieces is still shown as text.
    let mut at = offset;
    let mut buf = vec![0u8; LOG_PIECE];
    let mut held = 0;
    loop {
        let n = f.read(&mut buf[held..])?;
        if n == 0 {
            break;
        }
        let filled = held + n;
        let whole = whole_utf8_prefix(&buf[..filled]);
        super::util::print_untrusted(&buf[..whole])?;
        at += whole as u64;
        buf.copy_within(whole..filled, 0);
        held = filled - whole;
    }
    // A torn sequence at the very end waits for the next read (`--follow` reads on from
    // `at`), unless no read comes after this one: then it is printed as it is.
    if last && held > 0 {
        super::util::print_untrusted(&buf[..held])?;
        at += held as u64;
    }
    Ok(at)
}

/// How much of `logs`' output is read and printed at a time.
const LOG_PIECE: usize = 1 << 20;

/// The length of `buf` without a UTF-8 sequence torn at its end (at most 3 bytes held back;
/// bytes that are not UTF-8 at all are not held). Pure.
fn whole_utf8_prefix(buf: &[u8]) -> usize {
    let len = buf.len();
    for back in 1..=3.min(len) {
        let b = buf[len - back];
        if b & 0xc0 == 0x80 {
            continue; // a continuation byte: look further back for its lead
        }
        let need = match b {
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => return len,
        };
        return if need > back { len - back } else { len };
    }
    len
}

/// The daemon log of `src`: the mount's `.smithfs/daemon.log`, or the store's.
fn daemon_log(dir: &Path) -> PathBuf {
    let live = dir.join(".smithfs/daemon.log");
    if dir.join(".smithfs").is_dir() {
        live
    } else {
        dir.join(crate::tree::layout::STATE_DIR).join("daemon.log")
    }
}

/// Run `smithfs logs`.
pub fn run(args: LogsArgs) -> Result<ExitCode> {
    let (dir, id) = match (args.daemon, args.args.as_slice()) {
        (true, []) => (None, None),
        (true, [d]) => (Some(PathBuf::from(d)), None),
        (false, [id]) => (None, Some(id.clone())),
        (false, [d, id]) => (Some(PathBuf::from(d)), Some(id.clone())),
        (true, _) => usage!("usage: smithfs logs [DIR] --daemon [--follow]"),
        (false, _) => usage!("usage: smithfs logs [DIR] ID [--run RUN_ID] [--follow]"),
    };
    let dir = resolve_mount(dir.as_deref())?;
    let src = store::source(&dir)?;
    let Some(id) = id else {
        let path = daemon_log(&dir);
        if !path.exists() {
            bail!(
                "{}: no daemon log (a foreground mount, `mount -f`, logs to its stderr)",
                path.display()
            );
        }
        let mut offset = print_from(&path, 0, !args.follow)?;
        if args.follow {
            loop {
                std::thread::sleep(POLL);
                offset = print_from(&daemon_log(&dir), offset, false)?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    };
    let full = store::resolve_id(&src, &id)?;
    let smith_dir = dir.join(store::rel_dir(&full));
    let run = match &args.run {
        Some(r) => {
            let r = run_id(r)?;
            if !smith_dir.join("conversations").join(&r).is_dir() {
                let have = runs(&smith_dir);
                usage!(
                    "{full} has no run {r}; its runs: {}",
                    if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join(", ")
                    }
                );
            }
            r
        }
        None => {
            let latest = store::read_status(&src)
                .ok()
                .and_then(|(_, d)| d.smith(&full).and_then(|s| s.last_run.clone()))
                .map(|lr| lr.run_id)
                .filter(|r| smith_dir.join("conversations").join(r).is_dir());
            match latest.or_else(|| runs(&smith_dir).pop()) {
                Some(r) => r,
                None => bail!("{full} has not run yet: no log"),
            }
        }
    };
    let mut run = run;
    loop {
        let run_dir = smith_dir.join("conversations").join(&run);
        let log = run_dir.join("messages.log");
        let mut offset = print_from(&log, 0, !args.follow)?;
        if !args.follow {
            break;
        }
        loop {
            // Ended first, then the last read: nothing written before the end is missed.
            let ended = run_ended(&run_dir);
            offset = print_from(&log, offset, ended)?;
            if ended {
                break;
            }
            std::thread::sleep(POLL);
        }
        // Following the latest run: go on with the next one when the smith is run again at
        // once (an automatic retry), as `pueue follow` does (docs/PROTOCOL-NOTES.md O48).
        if args.run.is_some() {
            break;
        }
        match next_run(&src, &full, &run) {
            Some(next) => {
                eprintln!("smithfs: {full}: {run} ended; following {next}");
                run = next;
            }
            None => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The run of `full` that follows `ended` (by run number), when there is one or the
/// smith is queued or running again (an automatic retry, a new task): waits while it is
/// queued, and up to 5 s for the status to catch up with the end of `ended`; `None` when the
/// smith settled without a newer run (done, failed, cancelled, waiting, idle) or the status
/// cannot be read.
fn next_run(src: &store::Source, full: &str, ended: &str) -> Option<String> {
    let catch_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (_, doc) = store::read_status(src).ok()?;
        let s = doc.smith(full)?;
        let last = s.last_run.as_ref().map(|lr| lr.run_id.clone());
        // A newer run, live or (a quick one) already over.
        let number = |r: &str| r.strip_prefix("run-").and_then(|n| n.parse::<u64>().ok());
        if last.as_deref().is_some_and(|r| number(r) > number(ended)) {
            return last;
        }
        match s.state.as_str() {
            "queued" => {}
            "running" if std::time::Instant::now() < catch_up => {}
            _ => return None,
        }
        std::thread::sleep(POLL.min(std::time::Duration::from_millis(100)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids() {
        assert_eq!(run_id("run-0002").ok().as_deref(), Some("run-0002"));
        assert_eq!(run_id("2").ok().as_deref(), Some("run-0002"));
        assert_eq!(run_id("0012").ok().as_deref(), Some("run-0012"));
        assert!(run_id("run-").is_err());
        assert!(run_id("x").is_err());
        assert!(run_id("-1").is_err());
    }

    /// A piece of the log never ends inside a UTF-8 sequence (notes O52): a C1 control or a
    /// bidi character torn between two pieces would reach the terminal unfiltered.
    #[test]
    fn pieces_end_on_whole_characters() {
        let csi = "\u{9b}".as_bytes(); // c2 9b
        let rlo = "\u{202e}".as_bytes(); // e2 80 ae
        let emoji = "\u{1f600}".as_bytes(); // 4 bytes
        for (buf, want) in [
            (b"abc".to_vec(), 3),
            ([b"ab".as_slice(), &csi[..1]].concat(), 2),
            ([b"ab".as_slice(), csi].concat(), 4),
            ([b"a".as_slice(), &rlo[..2]].concat(), 1),
            ([b"a".as_slice(), &rlo[..1]].concat(), 1),
            ([b"a".as_slice(), rlo].concat(), 4),
            ([b"a".as_slice(), &emoji[..3]].concat(), 1),
            ([b"a".as_slice(), emoji].concat(), 5),
            (b"a\xff".to_vec(), 2),
            (b"\x80\x80\x80\x80".to_vec(), 4),
            (Vec::new(), 0),
        ] {
            assert_eq!(whole_utf8_prefix(&buf), want, "{buf:x?}");
        }
    }
}
