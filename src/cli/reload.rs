//! `smithfs reload [DIR]`: re-read DIR/config.json and apply it without a remount (docs/SPEC.md
//! §6), by writing `reload` to `DIR/.smithfs/ctl`. The daemon validates the file as `mount`
//! does and refuses it whole — bad, or a key that needs a remount changed — with one line naming
//! the key, which `.smithfs/why` holds for the CLI to print (exit 1); the daemon then keeps its
//! configuration. SIGHUP to the daemon does the same (docs/PROTOCOL-NOTES.md O12).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::util;

/// Arguments of `smithfs reload`.
#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    /// The mount (default: the nearest smithfs mount above the working directory, then
    /// $SMITH_MOUNT, then ./.agent-smith).
    pub dir: Option<PathBuf>,
}

/// Run `smithfs reload`: exit 0 once applied (printing the sections that changed), 1 when the
/// daemon refused the file (its one-line reason) or the mount is not live.
pub fn run(args: ReloadArgs) -> Result<ExitCode> {
    let dir = util::find_mount(args.dir.as_deref())?;
    let events = util::control_file(&dir, "events.jsonl")?;
    let from = std::fs::metadata(&events).map_or(0, |m| m.len());
    let ctl = util::control_file(&dir, "ctl")?;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open(&ctl)
        .and_then(|mut f| f.write_all(b"reload\n"));
    if let Err(e) = written {
        match crate::policy::CtlAnswer::of(&e) {
            crate::policy::CtlAnswer::NotAllowed => bail!(
                "not allowed to reload {}: only the operator may (see {}/.smithfs/why)",
                dir.display(),
                dir.display()
            ),
            crate::policy::CtlAnswer::Refused => bail!(
                "{} (not reloaded: the daemon keeps its current configuration)",
                refusal(&dir).unwrap_or_else(|| e.to_string())
            ),
            _ => bail!("cannot reload {}: {e}", dir.display()),
        }
    }
    match applied(&events, from) {
        Some(changed) if changed.is_empty() => {
            println!("reloaded {}/config.json: nothing changed", dir.display())
        }
        Some(changed) => println!(
            "reloaded {}/config.json: {} changed",
            dir.display(),
            changed.join(", ")
        ),
        None => println!("reloaded {}/config.json", dir.display()),
    }
    Ok(ExitCode::SUCCESS)
}

/// The daemon's reason for the refused reload: the first sentence of `.smithfs/why` without
/// its alternative.
fn refusal(dir: &Path) -> Option<String> {
    let why = std::fs::read_to_string(dir.join(".smithfs/why")).ok()?;
    let first = why.lines().next()?.trim();
    let alternative = why
        .lines()
        .find_map(|l| l.strip_prefix("alternative: "))
        .unwrap_or_default();
    Some(
        first
            .strip_suffix(alternative)
            .unwrap_or(first)
            .trim()
            .to_string(),
    )
}

/// The `changed` sections of the `config.reloaded` line the scheduler journals once it applied
/// the reload, read from offset `from` of the journal on (waiting up to 2 s for it).
fn applied(events: &Path, from: u64) -> Option<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(events) {
            let _ = f.seek(SeekFrom::Start(from));
            let _ = f.read_to_string(&mut text);
        }
        let found = text.lines().rev().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["event"] == "config.reloaded").then(|| {
                v["changed"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default()
            })
        });
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
