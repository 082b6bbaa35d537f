//! `smithfs status [DIR] [--json] [--watch]`: the tree of smiths — full ids, state and the time
//! in it, runs, the last run's duration, whether a result is present, and for a failed or
//! cancelled smith its last exit code or signal, `reason` and log — read from
//! `DIR/.smithfs/status.json`, or rebuilt from the store when DIR is not mounted (docs/SPEC.md
//! §6, §7). Coloured on a terminal (unless `NO_COLOR`), plain otherwise.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Result;

use super::render::render_tree;
use super::store;

/// Arguments of `smithfs status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The mount (default: the nearest smithfs mount above the working directory, then
    /// $SMITH_MOUNT, then ./.agent-smith). A directory that is not mounted is read from its
    /// store.
    pub dir: Option<PathBuf>,
    /// Print status.json as it is (docs/SPEC.md §7).
    #[arg(long)]
    pub json: bool,
    /// Redraw every second until interrupted.
    #[arg(long)]
    pub watch: bool,
}

/// Run `smithfs status`.
pub fn run(args: StatusArgs) -> Result<ExitCode> {
    let dir = super::util::resolve_mount(args.dir.as_deref())?;
    let tty = std::io::stdout().is_terminal();
    let color = tty && std::env::var_os("NO_COLOR").is_none();
    loop {
        // A watched mount may go and come back: read wherever it is now.
        let src = store::source(&dir)?;
        let (text, doc) = store::read_status(&src)?;
        let mut out = std::io::stdout().lock();
        if args.watch && tty {
            write!(out, "\x1b[H\x1b[2J")?;
        }
        if args.json {
            write!(out, "{text}")?;
            if !text.ends_with('\n') {
                writeln!(out)?;
            }
        } else {
            write!(out, "{}", render_tree(&doc, SystemTime::now(), color))?;
            if matches!(src, store::Source::Store(_)) {
                writeln!(out, "(not mounted: read from the store)")?;
            }
        }
        out.flush()?;
        drop(out);
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
