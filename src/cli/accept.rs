//! `smithfs accept [DIR] ID [--branch NAME]` (docs/SPEC.md §6, §11): fetch a smith's branch
//! (`smith/NAME`, its committed work) into the user's repository (`workspace.repo`) as
//! `smith/NAME` or `--branch NAME`, and print `BRANCH COMMIT`.
//!
//! Only a branch ref of PATH changes: never its checked-out branch (git refuses to fetch into it),
//! index or work tree. An existing branch moves only forward: a commit that does not descend from it
//! is refused (exit 1, one line).
//!
//! Two halves, so that no git reads the smith's repository as anyone but the smith (docs/SPEC.md
//! §12 "Programs smithfs runs for others", docs/PROTOCOL-NOTES.md W19): the smith's git, started as
//! the smith in its sandbox ([`as_smith`]), writes the branch as a bundle (`git bundle create -`,
//! the commits PATH lacks) to our pipe; PATH's git, run as PATH's owner, fetches from that bundle
//! file. The bundle is data: git parses it, it runs nothing; and only PATH's git directory is
//! written.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};

use super::diff::{as_smith, git_out, git_script, locate, smith_overrides, Exit2, Located};
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

/// The owner of PATH to run its git as: `Some((uid, gid))` when this process is root and PATH
/// (its directory) belongs to another uid; `None`: run as this process.
fn owner_of(repo: &Path) -> Result<Option<(u32, u32)>> {
    let m = std::fs::metadata(repo).map_err(|e| anyhow!("{}: {e}", repo.display()))?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    Ok((root && m.uid() != 0).then_some((m.uid(), m.gid())))
}

/// A bundle file for PATH's git: created 0600 in the temporary directory, given to PATH's owner,
/// removed on drop.
struct Bundle(PathBuf);

impl Bundle {
    fn write(bytes: &[u8], owner: Option<(u32, u32)>) -> Result<Bundle> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            "smithfs-accept-{}-{nanos}.bundle",
            std::process::id()
        ));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let b = Bundle(path);
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))
                .map_err(|e| anyhow!("{}: {e}", b.0.display()))?;
        }
        f.write_all(bytes)
            .map_err(|e| anyhow!("{}: {e}", b.0.display()))?;
        Ok(b)
    }
}

impl Drop for Bundle {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// At most this many of PATH's branch and tag tips (newest first) are named to the smith's git as
/// commits PATH has, so that the bundle carries only the rest.
const MAX_TIPS: usize = 256;

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
    let owner = owner_of(&repo)?;
    if git_out(&repo, owner, &[], &[], &["check-ref-format", &target_ref]).is_err() {
        usage!("--branch {target}: not a valid branch name");
    }
    // The smith's half, as the smith: its branch's commit and what is left uncommitted.
    let ws_extra = smith_overrides(l).map_err(|e| anyhow!("accept {}: {e}", l.full_id))?;
    let info = format!(
        "{}G rev-parse --verify \"refs/heads/$1^{{commit}}\"\n\
         G diff-index --ignore-submodules=dirty --name-only HEAD -- | wc -l\n\
         G ls-files --others --exclude-standard | wc -l\n",
        git_script(&ws_extra)
    );
    let out = as_smith(l, &info, &[&source])
        .map_err(|e| anyhow!("accept {}: its branch {source}: {e}", l.full_id))?;
    let out = String::from_utf8_lossy(&out);
    let mut lines = out.lines().map(str::trim);
    let commit = lines.next().unwrap_or_default().to_string();
    let count = |s: Option<&str>| s.and_then(|n| n.parse::<usize>().ok()).unwrap_or(0);
    let uncommitted = count(lines.next()) + count(lines.next());
    if commit.len() < 40 || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("accept {}: its branch {source}: no commit", l.full_id);
    }
    // PATH's half, as PATH's owner.
    let repo_extra = git_out(
        &repo,
        owner,
        &[],
        &[],
        &["config", "--list", "--name-only", "--includes"],
    )
    .map_or_else(
        |_| Ok(Vec::new()),
        |names| crate::workspace::git::overrides(&names),
    )
    .map_err(|e| anyhow!("{}: {e}", repo.display()))?;
    let existing = git_out(
        &repo,
        owner,
        &repo_extra,
        &[],
        &["rev-parse", "--verify", "--quiet", &target_ref],
    )
    .ok()
    .map(|s| s.trim().to_string())
    .filter(|s| !s.is_empty());
    // What the bundle need not carry: PATH has the commit itself (then only it, on top of its
    // parents), else PATH's newest tips (those the smith's repository lacks are ignored).
    let has_commit = git_out(
        &repo,
        owner,
        &repo_extra,
        &[],
        &["cat-file", "-e", &format!("{commit}^{{commit}}")],
    )
    .is_ok();
    let negatives: Vec<String> = if has_commit {
        vec![format!("^{commit}^@")]
    } else {
        git_out(
            &repo,
            owner,
            &repo_extra,
            &[],
            &[
                "for-each-ref",
                &format!("--count={MAX_TIPS}"),
                "--sort=-committerdate",
                "--format=%(objectname)",
                "refs/heads",
                "refs/tags",
            ],
        )
        .unwrap_or_default()
        .lines()
        .map(|c| format!("^{}", c.trim()))
        .collect()
    };
    let bundle_script = format!(
        "{}b=$1\nshift\nG bundle create --quiet - --ignore-missing \"refs/heads/$b\" \"$@\"\n",
        git_script(&ws_extra)
    );
    let mut args: Vec<&str> = vec![&source];
    args.extend(negatives.iter().map(String::as_str));
    let bytes = as_smith(l, &bundle_script, &args)
        .map_err(|e| anyhow!("accept {}: bundle of {source}: {e}", l.full_id))?;
    let bundle = Bundle::write(&bytes, owner)?;
    let src = bundle.0.to_string_lossy();
    // The commit read above, by its id, not the bundle's ref: the smith may move its branch
    // between the two reads, and PATH's branch must become the commit `accept` names or stay
    // where it is (notes W23).
    let spec = format!("{commit}:{target_ref}");
    match git_out(
        &repo,
        owner,
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
        owner,
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
    Ok(Accepted {
        branch: target,
        commit,
        uncommitted,
    })
}
