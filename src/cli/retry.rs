//! `smithfs retry [DIR] ID`: run a failed or cancelled smith again on its newest task, with
//! `SMITH_WAKE=retry` (docs/SPEC.md §6), by writing `retry FULL_ID` to `DIR/.smithfs/ctl`. Its
//! failure count starts again; once it settles its parent is woken with `SMITH_WAKE=children`
//! and aggregates again, as after a new task (O5). It returns once the status shows the smith
//! out of `failed`/`cancelled` (queued, running, or a newer run already), so a `wait` right after
//! it waits for the retried run (O49).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;

use super::ids::usage;
use super::settle::{self, Asked};
use super::store;

/// Arguments of `smithfs retry`.
#[derive(Debug, clap::Args)]
pub struct RetryArgs {
    /// `[DIR] ID`: the mount (default as for `status`) and the failed or cancelled smith — a
    /// full id, a short id only one smith has, or a unique suffix.
    #[arg(num_args = 1..=2, required = true, value_name = "[DIR] ID")]
    pub args: Vec<String>,
}

/// Run `smithfs retry`. Exit 0 once the retry is in effect (the smith queued or running, or a
/// newer run started); 2 for an unknown or ambiguous smith or one that is not failed or
/// cancelled; 1 if the scheduler did not act on it in time.
pub fn run(args: RetryArgs) -> Result<ExitCode> {
    let (dir, id) = super::cancel::dir_and_id(&args.args, "retry")?;
    let (dir, full) = super::util::mount_and_id(dir.as_deref(), &id)?;
    println!("{}", request(&dir, &full)?);
    Ok(ExitCode::SUCCESS)
}

/// Ask the live mount `dir` to run the smith `full` (a full id) again and wait until that is
/// in effect: refused unless it is failed or cancelled, then `retry FULL_ID` written to `ctl`.
/// What `smithfs retry` and the ui's Retry do (one code path); returns the line to show,
/// `retrying ID (was STATE, now STATE)`.
///
/// # Errors
/// Not failed or cancelled ([`super::ids::UsageError`]), the `ctl` write refused, or the retry
/// not in effect in time (one line).
pub(crate) fn request(dir: &Path, full: &str) -> Result<String> {
    let (_, doc) = store::read_status(&store::Source::Mount(dir.to_path_buf()))?;
    let state = doc.smith(full).map(|s| s.state.clone()).unwrap_or_default();
    if state != "failed" && state != "cancelled" {
        usage!("{full} is {state}: only a failed or cancelled smith can be retried");
    }
    let asked = Asked::retry(&doc, full);
    super::util::ctl(dir, &format!("retry {full}"), "retry", full)?;
    let now = settle::wait_until(dir, &asked, settle::retry_patience())?;
    Ok(format!("retrying {full} (was {state}, now {now})"))
}
