//! `smithfs wait [DIR] [--children | --smith ID | --final] [--timeout SECS]`: block until the
//! target is settled (docs/SPEC.md §6). Exit 0 done, 1 failed or cancelled, 2 an unknown or
//! ambiguous smith, 124 timeout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::store::{self, read_status};
use super::util::resolve_mount;
use crate::sched::view::{wait_verdict, Verdict, WaitTarget};

/// Arguments of `smithfs wait`.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("target").args(["children", "smith", "final_"]))]
pub struct WaitArgs {
    /// The mount (default as for `status`).
    pub dir: Option<PathBuf>,
    /// Wait for every child of $SMITH_FULL_ID (of the root when unset) to settle.
    #[arg(long)]
    pub children: bool,
    /// Wait for this smith to settle (full id, short id or unique suffix).
    #[arg(long, value_name = "ID")]
    pub smith: Option<String>,
    /// Wait for results/final.md (the default).
    #[arg(long = "final", id = "final_")]
    pub final_: bool,
    /// Give up after this many seconds (exit 124).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
}

/// Exit code for a timeout, as timeout(1) uses.
pub const EXIT_TIMEOUT: u8 = 124;

/// Run `smithfs wait`.
pub fn run(args: WaitArgs) -> Result<ExitCode> {
    let dir = resolve_mount(args.dir.as_deref())?;
    let src = store::source(&dir)?;
    let target = if args.children {
        let of = std::env::var("SMITH_FULL_ID")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| crate::tree::scaffold_plan::ROOT_ID.to_string());
        WaitTarget::Children(store::resolve_id(&src, &of)?)
    } else if let Some(s) = args.smith {
        WaitTarget::Smith(store::resolve_id(&src, &s)?)
    } else {
        WaitTarget::Final
    };
    let deadline = match args.timeout {
        Some(t) if t.is_finite() && t >= 0.0 => Some(Instant::now() + Duration::from_secs_f64(t)),
        Some(t) => bail!("--timeout: {t} is not a number of seconds"),
        None => None,
    };
    // The first read must work: a missing mount is an error, not something to wait for.
    read_status(&src)?;
    loop {
        let src = store::source(&dir).unwrap_or_else(|_| src.clone());
        if let Ok((_, doc)) = read_status(&src) {
            if let WaitTarget::Smith(id) = &target {
                if doc.smith(id).is_none() && !doc.smiths.is_empty() {
                    bail!("smith {id} is gone from {}", dir.display());
                }
            }
            let final_exists = dir.join("results/final.md").exists();
            match wait_verdict(&doc, &target, final_exists) {
                Some(Verdict::Done) => return Ok(ExitCode::SUCCESS),
                Some(Verdict::Failed) => return Ok(ExitCode::from(1)),
                None => {}
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(ExitCode::from(EXIT_TIMEOUT));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
