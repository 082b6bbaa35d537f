//! `smithfs accept [DIR] ID [--branch NAME]` (docs/SPEC.md §6, §11): fetch a smith's branch
//! (`smith/NAME`, its committed work) into the user's repository (`workspace.repo`) as
//! `smith/NAME` or `--branch NAME`, and print `BRANCH COMMIT`.
//!
//! Only a branch ref of PATH changes: never its checked-out branch (git refuses to fetch into it),
//! index or work tree. An existing branch moves only forward: a commit that does not descend from it
//! is refused (exit 1, one line).

use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};

use super::diff::{git_out, locate, overrides, Exit2, Located};
use super::ids::usage;
use crate::workspace;

/// Arguments of `smithfs accept`.
#[derive(Debug, clap::Args)]
pub struct AcceptArgs {
    /// `[DIR] ID`: the mount (default as for `status`) and the smith, e.g. `smith-root`.
    #[arg(num_args = 1..=2, required = true, value_name = "[DIR] ID")]
    pub args: Vec<String>,
    /// The branch to create or move forward in the repository (default `smith/NAME`, NAME the
    /// full id with `/` as `.`).
    #[arg(long, value_name = "NAME")]
    pub branch: Option<String>,
}

/// What `accept` did: the branch of the repository and the commit it now names, and how many
/// uncommitted changes of the workspace did not travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Accepted {
    /// The branch made or moved forward in the repository.
    pub branch: String,
    /// The commit it names now.
    pub commit: String,
    /// Changed and untracked files of the workspace left out (only commits travel).
    pub uncommitted: usize,
}

/// Run `smithfs accept`.
pub fn run(args: AcceptArgs) -> Result<ExitCode> {
    let l = match locate(&args.args, "accept")? {
        Ok(l) => l,
        Err(Exit2(msg)) => {
            eprintln!("smithfs: {msg}");
            return Ok(ExitCode::from(2));
        }
    };
    let a = accept(&l, args.branch.as_deref())?;
    println!("{} {}", a.branch, a.commit);
    // Only commits travel: say so when the work tree holds more (the auto-commit at the end of
    // the smith's next run would take it; docs/PROTOCOL-NOTES.md W17).
    if a.uncommitted > 0 {
        eprintln!(
            "smithfs: {} uncommitted change(s) in {}'s workspace not included (see `smithfs diff {}`)",
            a.uncommitted, l.full_id, l.full_id
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Fetch the smith's branch into the repository as `branch` (default `smith/NAME`), moving an
/// existing branch only forward. What `smithfs accept` and the ui's accept do (one code path).
///
/// # Errors
/// No project; a branch name git refuses ([`super::ids::UsageError`]); the smith has no
/// branch; the fetch refused (not a fast-forward, the branch checked out) — each one line.
pub(crate) fn accept(l: &Located, branch: Option<&str>) -> Result<Accepted> {
    let Some(repo) = l.config.workspace.repo.clone() else {
        bail!("{} has no project", l.dir.display());
    };
    let source = workspace::branch(&l.full_id);
    let target = branch.map_or_else(|| source.clone(), str::to_owned);
    let target_ref = format!("refs/heads/{target}");
    if git_out(&repo, &[], &[], &["check-ref-format", &target_ref]).is_err() {
        usage!("--branch {target}: not a valid branch name");
    }
    let ws_extra = overrides(&l.ws);
    let commit = git_out(
        &l.ws,
        &ws_extra,
        &[],
        &[
            "rev-parse",
            "--verify",
            &format!("refs/heads/{source}^{{commit}}"),
        ],
    )
    .map_err(|e| anyhow!("accept {}: its branch {source}: {e}", l.full_id))?;
    let commit = commit.trim().to_string();
    let repo_extra = overrides(&repo);
    let existing = git_out(
        &repo,
        &repo_extra,
        &[],
        &["rev-parse", "--verify", "--quiet", &target_ref],
    )
    .ok()
    .map(|s| s.trim().to_string())
    .filter(|s| !s.is_empty());
    let src = l.ws.join(".git");
    let src = src.to_string_lossy();
    let spec = format!("refs/heads/{source}:{target_ref}");
    match git_out(
        &repo,
        &repo_extra,
        &[],
        &[
            "fetch",
            "--no-progress",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-recurse-submodules",
            &src,
            &spec,
        ],
    ) {
        Ok(_) => {}
        Err(e)
            if existing.is_some() && (e.contains("rejected") || e.contains("non-fast-forward")) =>
        {
            bail!(
                "refused: {target} in {} is at {} and {commit} ({}'s work) does not descend from it; pick another --branch",
                repo.display(),
                existing.as_deref().unwrap_or(""),
                l.full_id
            )
        }
        Err(e) => bail!("cannot fetch {source} into {}: {e}", repo.display()),
    }
    let now = git_out(
        &repo,
        &repo_extra,
        &[],
        &["rev-parse", "--verify", &target_ref],
    )
    .map_err(|e| anyhow!("{target} in {}: {e}", repo.display()))?;
    if now.trim() != commit {
        bail!(
            "refused: {target} in {} did not move to {commit} (is it checked out?)",
            repo.display()
        );
    }
    let changed = git_out(
        &l.ws,
        &ws_extra,
        &[],
        &["diff-index", "--name-only", "HEAD", "--"],
    )
    .map_or(0, |o| o.lines().count());
    let untracked = git_out(
        &l.ws,
        &ws_extra,
        &[],
        &["ls-files", "--others", "--exclude-standard"],
    )
    .map_or(0, |o| o.lines().count());
    Ok(Accepted {
        branch: target,
        commit,
        uncommitted: changed + untracked,
    })
}
