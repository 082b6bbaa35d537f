//! `smithfs diff [DIR] ID [--stat]` (docs/SPEC.md §6, §11): a smith's changes from its base commit
//! (`git config smithfs.base`) to its work tree, committed and not, untracked files included.
//!
//! Read-only on the workspace: the untracked files are marked intent-to-add in a temporary index
//! outside it, so nothing is written there. Git runs isolated (`workspace::git`): nothing the smith
//! configured runs.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{anyhow, bail, Result};

use super::util::resolve_mount;
use crate::config::Config;
use crate::tree::scaffold_plan::smith_dir_rel;
use crate::workspace::{self, git};

/// Arguments of `smithfs diff`.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// `[DIR] ID`: the mount (default as for `status`) and the smith, e.g. `smith-root/smith-001`.
    #[arg(num_args = 1..=2, required = true, value_name = "[DIR] ID")]
    pub args: Vec<String>,
    /// Only the changed files and their line counts (`git diff --stat`).
    #[arg(long)]
    pub stat: bool,
}

/// A smith's workspace found from `[DIR] ID`.
pub(crate) struct Located {
    /// The mount (or store) directory.
    pub dir: PathBuf,
    /// The full id.
    pub full_id: String,
    /// `DIR/smiths/…/workspace`.
    pub ws: PathBuf,
    /// The mount's configuration (its `workspace.repo` is set).
    pub config: Config,
}

/// Error with an exit code: 2 for usage errors and unknown smiths (docs/SPEC.md §6).
pub(crate) struct Exit2(pub String);

/// Find the workspace of `[DIR] ID` (`cmd` names the subcommand in messages).
pub(crate) fn locate(args: &[String], cmd: &str) -> Result<Result<Located, Exit2>> {
    let (dir, id) = match args {
        [id] => (None, id.as_str()),
        [dir, id] => (Some(PathBuf::from(dir)), id.as_str()),
        _ => return Ok(Err(Exit2(format!("usage: smithfs {cmd} [DIR] ID")))),
    };
    let dir = resolve_mount(dir.as_deref())?;
    locate_in(&dir, id)
}

/// Find the workspace of smith `id` in the mount (or store) `dir`: what `diff`, `accept` and
/// the ui read.
pub(crate) fn locate_in(dir: &Path, id: &str) -> Result<Result<Located, Exit2>> {
    let dir = dir.to_path_buf();
    let text = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| anyhow!("cannot read {}/config.json: {e}", dir.display()))?;
    let config = Config::parse(&text).map_err(|e| anyhow!("{e}"))?;
    if !config.workspace.enabled() {
        bail!(
            "{} has no project (make one with `smithfs init DIR --repo PATH`)",
            dir.display()
        );
    }
    // A full id, a short id only one smith has or a unique suffix (docs/SPEC.md §6); ambiguous
    // and unknown ids are usage errors (exit 2, the candidates listed).
    let src = super::store::source(&dir)?;
    let id = super::store::resolve_id(&src, id)?;
    let Some(rel) = smith_dir_rel(&id) else {
        return Ok(Err(Exit2(format!("no smith {id}"))));
    };
    if !dir.join(&rel).is_dir() {
        return Ok(Err(Exit2(format!("no smith {id} in {}", dir.display()))));
    }
    let ws = dir.join(&rel).join(workspace::AREA);
    if !ws.join(".git").exists() {
        bail!("{id} has no workspace ({} is missing)", ws.display());
    }
    Ok(Ok(Located {
        dir,
        full_id: id,
        ws,
        config,
    }))
}

/// Run isolated git with `extra` overrides and `env` in `cwd`; stdout, or git's last line.
pub(crate) fn git_out(
    cwd: &Path,
    extra: &[String],
    env: &[(&str, &Path)],
    args: &[&str],
) -> Result<String, String> {
    let mut cmd = git::isolate(Command::new("git"), extra);
    cmd.arg("-C").arg(cwd).args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let line = lines
            .iter()
            .find(|l| l.starts_with("fatal:") || l.starts_with("error:"))
            .or(lines.last())
            .copied()
            .unwrap_or("failed");
        return Err(line.to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The driver overrides for the repository at `ws` (see `workspace::git::overrides`).
pub(crate) fn overrides(ws: &Path) -> Vec<String> {
    git_out(
        ws,
        &[],
        &[],
        &["config", "--list", "--name-only", "--includes"],
    )
    .map(|names| git::overrides(&names))
    .unwrap_or_default()
}

/// A temporary file path that is removed on drop.
struct TempPath(PathBuf);

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Run `smithfs diff`.
pub fn run(args: DiffArgs) -> Result<ExitCode> {
    let l = match locate(&args.args, "diff")? {
        Ok(l) => l,
        Err(Exit2(msg)) => {
            eprintln!("smithfs: {msg}");
            return Ok(ExitCode::from(2));
        }
    };
    print!("{}", diff(&l, args.stat)?);
    Ok(ExitCode::SUCCESS)
}

/// The smith's changes from its base commit to its work tree, committed and not, untracked
/// files included, as `git diff` prints them (`stat`: `git diff --stat`). What `smithfs diff`
/// and the ui show (one code path).
///
/// # Errors
/// The workspace has no `smithfs.base`, or a git step failed (one line naming it).
pub(crate) fn diff(l: &Located, stat: bool) -> Result<String> {
    let extra = overrides(&l.ws);
    let fail = |what: &str, e: String| anyhow!("diff {}: {what}: {e}", l.full_id);
    let base = git_out(&l.ws, &extra, &[], &["config", "smithfs.base"])
        .map_err(|e| fail("no smithfs.base", e))?;
    let base = base.trim().to_string();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let index = TempPath(
        std::env::temp_dir().join(format!("smithfs-diff-{}-{nanos}.index", std::process::id())),
    );
    let env = [("GIT_INDEX_FILE", index.0.as_path())];
    git_out(&l.ws, &extra, &env, &["read-tree", "HEAD"]).map_err(|e| fail("read-tree", e))?;
    let untracked = git_out(
        &l.ws,
        &extra,
        &env,
        &["ls-files", "-z", "--others", "--exclude-standard"],
    )
    .map_err(|e| fail("ls-files", e))?;
    let files: Vec<&str> = untracked.split('\0').filter(|f| !f.is_empty()).collect();
    for chunk in files.chunks(500) {
        let mut a = vec!["add", "--intent-to-add", "--"];
        a.extend(chunk.iter().copied());
        git_out(&l.ws, &extra, &env, &a).map_err(|e| fail("add --intent-to-add", e))?;
    }
    let mut a = vec!["diff", "--no-ext-diff", "--no-textconv", "--no-color"];
    if stat {
        a.push("--stat");
    }
    a.push(&base);
    git_out(&l.ws, &extra, &env, &a).map_err(|e| fail("git diff", e))
}
