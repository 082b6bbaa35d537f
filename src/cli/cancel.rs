//! `smithfs cancel [DIR] ID`: stop a smith's run and its subtree's, marking them cancelled, by
//! writing `cancel FULL_ID` to `DIR/.smithfs/ctl` (docs/SPEC.md §6, §7). The mount checks the
//! writer's authority (the operator, or an ancestor smith). It returns once the journal shows
//! the cancel handled and every run it stopped ended (O49, H21).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;

use super::ids::usage;
use super::settle::{self, Asked};

/// Arguments of `smithfs cancel`.
#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    /// `[DIR] ID`: the mount (default as for `status`) and the smith to cancel — a full id
    /// (`smith-root/smith-001`), a short id only one smith has, or a unique suffix.
    #[arg(num_args = 1..=2, required = true, value_name = "[DIR] ID")]
    pub args: Vec<String>,
}

/// Split `[DIR] ID` positionals.
///
/// # Errors
/// Not one or two words ([`super::ids::UsageError`]).
pub fn dir_and_id(args: &[String], verb: &str) -> Result<(Option<PathBuf>, String)> {
    match args {
        [id] => Ok((None, id.clone())),
        [dir, id] => Ok((Some(PathBuf::from(dir)), id.clone())),
        _ => usage!("usage: smithfs {verb} [DIR] ID"),
    }
}

/// Run `smithfs cancel`. Exit 0 once the cancel is in effect; 2 for an unknown or ambiguous
/// smith; 1 if it is refused or its runs did not stop in time.
pub fn run(args: CancelArgs) -> Result<ExitCode> {
    let (dir, id) = dir_and_id(&args.args, "cancel")?;
    let (dir, full) = super::util::mount_and_id(dir.as_deref(), &id)?;
    println!("{}", request(&dir, &full)?);
    Ok(ExitCode::SUCCESS)
}

/// Ask the live mount `dir` to cancel the smith `full` (a full id) and its subtree, and wait
/// until that is in effect: `cancel FULL_ID` written to `ctl`, then the journal read from its
/// end before the write until the cancel is handled and every run it stopped has ended
/// ([`settle::CancelWatch`]). What `smithfs cancel` and the ui's Cancel do (one code path);
/// returns the line to show, `cancelled ID`, plus `(now STATE: …)` when the smith, given a new
/// task since (by its parent, woken by the settling) or retried, already shows another state.
///
/// # Errors
/// The `ctl` write refused (an unknown smith is a [`super::ids::UsageError`]), or the cancel
/// not in effect in time (one line).
pub(crate) fn request(dir: &Path, full: &str) -> Result<String> {
    // Where the journal stands before the write: the cancel's lines come after it.
    let journal_from = super::events::journal_end(dir).ok();
    super::util::ctl(dir, &format!("cancel {full}"), "cancel", full)?;
    let asked = Asked::Cancel {
        full_id: full.to_string(),
        journal_from,
    };
    let state = settle::wait_until(dir, &asked, settle::cancel_patience(dir))?;
    Ok(match state.as_str() {
        "cancelled" | "done" | "gone" => format!("cancelled {full}"),
        now => format!("cancelled {full} (now {now}: given a new task or retried since)"),
    })
}
