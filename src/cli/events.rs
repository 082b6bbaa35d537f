//! `smithfs events [DIR] [--follow] [--json]`: the journal, `DIR/.smithfs/events.jsonl`
//! (PROTOCOL.md §6, §7), one event a line for humans, or the JSON lines as they are.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use super::util::resolve_mount;
use crate::sched::view::format_event;

/// Arguments of `smithfs events`.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// The mount (default as for `status`).
    pub dir: Option<PathBuf>,
    /// Keep printing new events as they are journaled.
    #[arg(short, long)]
    pub follow: bool,
    /// Print the JSON lines as they are.
    #[arg(long)]
    pub json: bool,
}

fn print_line(out: &mut impl Write, line: &str, json: bool) -> std::io::Result<()> {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(v) if json => writeln!(out, "{line}").map(|()| drop(v)),
        Ok(v) => writeln!(out, "{}", format_event(&v)),
        Err(_) => Ok(()), // not an event (a torn line): skipped, as the journal's reader does
    }
}

/// Run `smithfs events`.
pub fn run(args: EventsArgs) -> Result<ExitCode> {
    let dir = resolve_mount(args.dir.as_deref())?;
    let path = super::util::control_file(&dir, "events.jsonl")?;
    let mut file = std::fs::File::open(&path).with_context(|| {
        format!(
            "cannot read {} (is {} a live smithfs mount?)",
            path.display(),
            dir.display()
        )
    })?;
    let mut offset = 0u64;
    let mut pending = String::new();
    loop {
        file.seek(SeekFrom::Start(offset))?;
        let mut chunk = String::new();
        let n = file.read_to_string(&mut chunk)?;
        offset += n as u64;
        pending.push_str(&chunk);
        let mut out = std::io::stdout().lock();
        // Only complete lines; a torn tail waits for its newline.
        while let Some(i) = pending.find('\n') {
            let line: String = pending.drain(..=i).collect();
            let line = line.trim_end();
            if !line.is_empty() {
                print_line(&mut out, line, args.json)?;
            }
        }
        out.flush()?;
        drop(out);
        if !args.follow {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
