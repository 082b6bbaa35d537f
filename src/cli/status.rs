//! `smithfs status [DIR] [--json] [--watch]`: the tree of smiths with state, runs, the last
//! run's duration and whether a result is present, read from `DIR/.smithfs/status.json`
//! (PROTOCOL.md §6, §7). Coloured on a terminal, plain otherwise.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

use crate::sched::view::{render_tree, StatusDoc};

/// Arguments of `smithfs status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The mount (default: the nearest smithfs mount above the working directory, then
    /// $SMITH_MOUNT, then ./.agent-smith).
    pub dir: Option<PathBuf>,
    /// Print status.json as it is.
    #[arg(long)]
    pub json: bool,
    /// Redraw every second until interrupted.
    #[arg(long)]
    pub watch: bool,
}

/// Read and parse `DIR/.smithfs/status.json`. Errors name the file and suggest the cause.
pub fn read_status(dir: &Path) -> Result<(String, StatusDoc)> {
    let path = super::util::control_file(dir, "status.json")?;
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {} (is {} a live smithfs mount?)",
            path.display(),
            dir.display()
        )
    })?;
    let doc = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a status document", path.display()))?;
    Ok((text, doc))
}

/// Run `smithfs status`.
pub fn run(args: StatusArgs) -> Result<ExitCode> {
    let dir = super::util::resolve_mount(args.dir.as_deref())?;
    let tty = std::io::stdout().is_terminal();
    let color = tty && std::env::var_os("NO_COLOR").is_none();
    loop {
        let (text, doc) = read_status(&dir)?;
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
        }
        out.flush()?;
        drop(out);
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
