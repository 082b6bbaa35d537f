//! `init --repo PATH [--rev REV]` (docs/SPEC.md §6, §11): check the user's repository, make
//! `project.git` with `git clone --bare --local`, and keep DIR out of PATH's status through its
//! `.git/info/exclude`. Runs in the CLI on a directory that is not mounted, with plain paths.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::git;

/// A checked `--repo`: what `init` needs to make the project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// PATH, absolute.
    pub repo: PathBuf,
    /// REV as given.
    pub rev: String,
    /// The commit REV names: the root's base.
    pub commit: String,
    /// PATH's work tree, if it has one.
    pub top: Option<PathBuf>,
    /// PATH's common git directory (where `info/exclude` lives).
    pub git_dir: PathBuf,
    /// With REV `HEAD`: PATH has uncommitted changes (not included; `init` warns).
    pub dirty: bool,
}

fn git_in(dir: &Path, args: &[&str]) -> Result<String, String> {
    // PATH is the operator's project, read by the operator's `init` (often root over a user's
    // repository): git::TRUST_ANY_OWNER's first use.
    let mut cmd = git::isolate(Command::new("git"), &[git::TRUST_ANY_OWNER]);
    cmd.arg("-C").arg(dir).args(args);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("failed")
            .trim()
            .to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

/// Check PATH and REV for `init DIR` (all absolute): PATH is a git repository outside DIR and REV
/// names a commit of it. Creates nothing.
///
/// Errors (one line each, docs/SPEC.md §11): PATH is not a git repository; PATH lies inside DIR;
/// REV is unknown.
pub fn check(repo: &Path, rev: &str, dir: &Path) -> Result<Checked, String> {
    if !repo.is_dir() {
        return Err(format!("--repo {}: not a directory", repo.display()));
    }
    let repo = repo
        .canonicalize()
        .map_err(|e| format!("--repo {}: {e}", repo.display()))?;
    let git_dir = git_in(
        &repo,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .map_err(|_| format!("--repo {}: not a git repository", repo.display()))?;
    let dir_real = canonical_or_self(dir);
    if repo.starts_with(&dir_real) {
        return Err(format!(
            "--repo {}: the repository must lie outside {}",
            repo.display(),
            dir.display()
        ));
    }
    let top = git_in(&repo, &["rev-parse", "--show-toplevel"])
        .ok()
        .filter(|t| !t.is_empty())
        .map(PathBuf::from);
    let commit = git_in(
        &repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
    )
    .ok()
    .filter(|c| !c.is_empty())
    .ok_or_else(|| {
        format!(
            "--rev {rev}: unknown revision in {} (no such commit)",
            repo.display()
        )
    })?;
    let dirty = match (&top, rev) {
        (Some(top), "HEAD") => {
            let mut args = vec![
                "status",
                "--porcelain",
                "--untracked-files=normal",
                "--",
                ".",
            ];
            let exclude;
            if let Ok(rel) = dir_real.strip_prefix(top) {
                exclude = format!(":(exclude){}", rel.display());
                args.push(&exclude);
            }
            git_in(top, &args).map(|s| !s.is_empty()).unwrap_or(false)
        }
        _ => false,
    };
    Ok(Checked {
        repo,
        rev: rev.to_string(),
        commit,
        top,
        git_dir: PathBuf::from(git_dir),
        dirty,
    })
}

/// `dir` with symlinks resolved as far as it exists (DIR may not exist yet).
fn canonical_or_self(dir: &Path) -> PathBuf {
    if let Ok(c) = dir.canonicalize() {
        return c;
    }
    match (dir.parent(), dir.file_name()) {
        (Some(p), Some(n)) => canonical_or_self(p).join(n),
        _ => dir.to_path_buf(),
    }
}

/// Make `DIR/project.git`: `git clone --bare --local` of PATH (every branch and tag; objects
/// hardlinked where the filesystem allows), then make sure the base commit is in it (REV may be a
/// remote-tracking ref, which a bare clone does not copy: it is fetched as `refs/smithfs/base`).
///
/// Errors: git's last line.
pub fn make_project_git(c: &Checked, dir: &Path) -> Result<(), String> {
    let dest = dir.join(super::PROJECT_GIT);
    let mut cmd = git::isolate(Command::new("git"), &[git::TRUST_ANY_OWNER]);
    let out = cmd
        .args(["clone", "--bare", "--local", "--quiet"])
        .arg(&c.repo)
        .arg(&dest)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "git clone --bare --local {}: {}",
            c.repo.display(),
            err.lines().last().unwrap_or("failed")
        ));
    }
    let has = git_in(
        &dest,
        &["cat-file", "-e", &format!("{}^{{commit}}", c.commit)],
    )
    .is_ok();
    if !has {
        let spec = format!("+{}:refs/smithfs/base", c.rev);
        let src = c.repo.to_string_lossy().into_owned();
        git_in(&dest, &["fetch", "--quiet", "--no-tags", &src, &spec])
            .map_err(|e| format!("cannot copy --rev {} into project.git: {e}", c.rev))?;
    }
    Ok(())
}

/// Add DIR to PATH's `info/exclude` when DIR lies inside PATH's work tree (once; docs/SPEC.md §11).
/// Returns whether a line was added.
///
/// Errors: the exclude file cannot be read or written.
pub fn exclude(c: &Checked, dir: &Path) -> Result<bool, String> {
    let Some(top) = &c.top else {
        return Ok(false);
    };
    let dir_real = canonical_or_self(dir);
    let Ok(rel) = dir_real.strip_prefix(top) else {
        return Ok(false);
    };
    if rel.as_os_str().is_empty() {
        return Ok(false);
    }
    let line = format!("/{}/", rel.display());
    let info = c.git_dir.join("info");
    let file = info.join("exclude");
    let old = std::fs::read_to_string(&file).unwrap_or_default();
    if old.lines().any(|l| l.trim() == line) {
        return Ok(false);
    }
    std::fs::create_dir_all(&info).map_err(|e| format!("{}: {e}", info.display()))?;
    let mut text = old;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# smithfs init\n");
    text.push_str(&line);
    text.push('\n');
    std::fs::write(&file, text).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(true)
}
