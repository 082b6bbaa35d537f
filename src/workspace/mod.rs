//! Workspaces (docs/SPEC.md §11): the user's project as `project.git/` at the mount root and, in every
//! smith dir, `workspace/` — a git work tree with a repository of its own whose objects borrow from
//! `project.git` through a relative `objects/info/alternates`, on the branch `smith/NAME`.
//!
//! The names and the skeleton of a workspace's `.git` are pure ([`branch`], [`email`],
//! [`plan_workspace`]); [`populate`] fills a skeleton with git (the base commit's objects, the index and
//! the work tree) through a [`GitRun`], which runs git isolated ([`git`]) in a directory given by a held
//! descriptor, optionally in a private mount namespace where the FUSE mount is detached, so that the
//! daemon's git never goes through its own mount (STYLE.md habit 4).

pub mod git;
pub mod project;
pub mod sandbox;

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::tree::scaffold_plan::{smith_dir_rel, PlanEntry, DIR_MODE, FILE_MODE};

/// The area's name in a smith dir (docs/SPEC.md §1).
pub const AREA: &str = "workspace";
/// The shared bare repository at the mount root (docs/SPEC.md §1, §11).
pub const PROJECT_GIT: &str = "project.git";

/// The branch of `full_id`'s workspace: `smith/` and the full id with `/` written as `.`
/// (`smith-root/smith-001` → `smith/smith-root.smith-001`; docs/SPEC.md §11). Pure.
pub fn branch(full_id: &str) -> String {
    format!("smith/{}", full_id.replace('/', "."))
}

/// The `user.email` of `full_id`'s workspace: `smith-root.smith-001@smithfs.invalid` (a reserved
/// domain: it names the smith and reaches nobody). Pure.
pub fn email(full_id: &str) -> String {
    format!("{}@smithfs.invalid", full_id.replace('/', "."))
}

/// The path `full_id`'s `workspace/.git/objects/info/alternates` holds: `project.git/objects` relative
/// to that objects directory (git reads relative alternates relative to it), so it is right both in the
/// backing store and through the mount. `None` for a malformed full id. Pure.
pub fn alternates(full_id: &str) -> Option<String> {
    let depth = smith_dir_rel(full_id)?.components().count() + 3;
    Some(format!("{}{PROJECT_GIT}/objects", "../".repeat(depth)))
}

/// The skeleton of `full_id`'s workspace for a scaffold plan (paths relative to the smith dir):
/// `workspace/`, `workspace/.git/` with `HEAD` on [`branch`], a `config` with `user.name` = the full
/// id and `user.email` = [`email`], the object and ref directories and the [`alternates`] file.
/// [`populate`] then adds the base commit, `smithfs.base`, the index and the work tree. `None` for a
/// malformed full id. Pure.
pub fn plan_workspace(full_id: &str) -> Option<Vec<PlanEntry>> {
    let alt = alternates(full_id)?;
    let root = Path::new(AREA);
    let git = root.join(".git");
    let dirs = [
        root.to_path_buf(),
        git.clone(),
        git.join("info"),
        git.join("objects"),
        git.join("objects/info"),
        git.join("objects/pack"),
        git.join("refs"),
        git.join("refs/heads"),
        git.join("refs/tags"),
    ];
    let mut v: Vec<PlanEntry> = dirs
        .into_iter()
        .map(|path| PlanEntry::Dir {
            path,
            mode: DIR_MODE,
        })
        .collect();
    let config = format!(
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\
         \tlogallrefupdates = true\n[user]\n\tname = {full_id}\n\temail = {}\n",
        email(full_id)
    );
    let file = |p: &str, content: String| PlanEntry::File {
        path: git.join(p),
        mode: FILE_MODE,
        content: content.into_bytes(),
    };
    v.push(file(
        "HEAD",
        format!("ref: refs/heads/{}\n", branch(full_id)),
    ));
    v.push(file("config", config));
    v.push(file("objects/info/alternates", format!("{alt}\n")));
    Some(v)
}

/// A failed git command: what ran and the last line git wrote on stderr.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("git {command}: {message}")]
pub struct GitError {
    /// The subcommand and its arguments, e.g. `fetch …`.
    pub command: String,
    /// Git's last stderr line, or how it could not be run.
    pub message: String,
}

/// Where and how [`GitRun::run`] runs git.
#[derive(Clone, Copy, Debug)]
pub struct GitRun<'a> {
    /// The directory git runs in (entered with `fchdir`, so it may be a backing-store directory the
    /// mount hides); relative paths given to git are relative to it.
    pub cwd: BorrowedFd<'a>,
    /// Run in a private mount namespace with this mount point detached (the daemon's scaffold: the
    /// paths git makes absolute then name the backing store, never the FUSE mount).
    pub detach: Option<&'a Path>,
    /// Switch to this (uid, gid) before exec (the files git makes belong to the caller).
    pub creds: Option<(u32, u32)>,
    /// Enter this Landlock domain last before exec (a child's workspace: git reads only what the
    /// parent may read, docs/PROTOCOL-NOTES.md W16).
    pub sandbox: Option<&'a sandbox::Sandbox>,
    /// Kill git (its whole process group: the upload-pack of a local fetch too) and fail when it
    /// has not ended after this long. The scaffold's git runs inside a FUSE mkdir, holding the
    /// kernel's lock of the parent's `children/`, on a repository the parent controls (a FIFO
    /// in it would block git forever): [`scaffold_git_deadline`] (notes W20). `None`: no limit
    /// (`init`, the operator's own repository).
    pub deadline: Option<Duration>,
}

/// How long the scaffold's git may take to make a child's workspace ([`GitRun::deadline`]):
/// 120 s, or `SMITHFS_SCAFFOLD_GIT_DEADLINE` seconds (1–3600) from the daemon's environment
/// (a test knob: the tests of the deadline do not wait two minutes).
pub fn scaffold_git_deadline() -> Duration {
    static SECS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    Duration::from_secs(*SECS.get_or_init(|| {
        std::env::var("SMITHFS_SCAFFOLD_GIT_DEADLINE")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|s| (1..=3600).contains(s))
            .unwrap_or(120)
    }))
}

impl GitRun<'_> {
    /// Run `git <isolation> <extra -c> ARGS` (see [`git::isolate`]) and return its stdout.
    ///
    /// Errors: the command could not start, or it exited non-zero ([`GitError`] with git's last
    /// stderr line).
    pub fn run<S: AsRef<OsStr>>(&self, extra: &[String], args: &[S]) -> Result<String, GitError> {
        let command = args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let fail = |message: String| GitError {
            command: command.clone(),
            message,
        };
        // The scaffold's git (a child's uid reading its parent's repository in the Landlock
        // domain of W16) and `init`'s (the operator on a store not mounted yet): the two uses
        // git::TRUST_ANY_OWNER documents.
        let mut cmd = git::isolate(Command::new("git"), extra);
        cmd.arg("-c").arg(git::TRUST_ANY_OWNER);
        cmd.args(args)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let fd = self.cwd.as_raw_fd();
        let detach = match self.detach {
            Some(p) => {
                Some(CString::new(p.as_os_str().as_bytes()).map_err(|e| fail(e.to_string()))?)
            }
            None => None,
        };
        let creds = self.creds;
        let sandbox = self.sandbox.map(sandbox::Sandbox::raw_fd);
        // SAFETY: the closure runs in the forked child before exec and makes only raw syscalls
        // (unshare, mount, umount2, fchdir, setgroups, setgid, setuid, prctl, landlock_restrict_self) on values prepared before the
        // fork; it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || {
                // First: unshare carries the working directory over into the new namespace's
                // copy of its mount (a descriptor entered later would stay in the old one, where
                // no path reaches it).
                if libc::fchdir(fd) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(mp) = &detach {
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let root = c"/";
                    if libc::mount(
                        std::ptr::null(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::umount2(mp.as_ptr(), libc::MNT_DETACH) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // Files git makes get 0644/0755, whatever the daemon's own umask.
                libc::umask(0o022);
                if let Some((uid, gid)) = creds {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(gid) != 0
                        || libc::setuid(uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // Last: a Landlock domain forbids the mount calls above.
                if let Some(fd) = sandbox {
                    sandbox::restrict_self(fd)?;
                }
                Ok(())
            })
        };
        let out = crate::process::output_within(&mut cmd, self.deadline)
            .map_err(|e| fail(format!("cannot run git: {e}")))?;
        let Some(out) = out else {
            return Err(fail(format!(
                "killed after {} s (a repository that blocks git: a FIFO or a device where git \
                 reads?)",
                self.deadline.map_or(0, |d| d.as_secs())
            )));
        };
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let line = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("failed")
                .trim()
                .to_string();
            return Err(fail(match out.status.code() {
                Some(_) => line,
                None => format!("{line} ({})", out.status),
            }));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The [`git::overrides`] for the repository `git_dir` (relative to [`GitRun::cwd`]).
    pub fn overrides_for(&self, git_dir: &Path) -> Result<Vec<String>, GitError> {
        let mut a = OsString::from("--git-dir=");
        a.push(git_dir);
        let names = self
            .run::<&OsStr>(
                &[],
                &[
                    &a,
                    OsStr::new("config"),
                    OsStr::new("--list"),
                    OsStr::new("--name-only"),
                    OsStr::new("--includes"),
                ],
            )
            .or_else(|e| {
                // An empty config lists nothing and exits 0; a missing one is no danger either.
                if e.message.contains("unable to read config") {
                    Ok(String::new())
                } else {
                    Err(e)
                }
            })?;
        git::overrides(&names).map_err(|message| GitError {
            command: "config --list --name-only --includes".into(),
            message,
        })
    }
}

/// The `-c` setting of the checkout that writes a workspace's files: git's parallel checkout, one
/// worker per CPU (`0`), used from git's default threshold of 100 files (docs/PROTOCOL-NOTES.md W12).
pub const PARALLEL_CHECKOUT: &str = "checkout.workers=0";

/// The scaffold's `git fetch` runs its upload-pack (a shell command line, as git runs a local
/// transport's) with [`git::TRUST_ANY_OWNER`] of its own: the fetch's `-c` settings do not reach it.
const UPLOAD_PACK: &str = "--upload-pack=git -c 'safe.directory=*' upload-pack";

/// What a new workspace starts from (docs/SPEC.md §11).
#[derive(Clone, Copy, Debug)]
pub enum Base<'a> {
    /// The root's: this commit of `project.git` (REV resolved by `init`).
    Commit(&'a str),
    /// A child's: the `HEAD` commit of the parent's workspace in this directory (relative to the
    /// [`GitRun`]'s cwd), whatever its work tree holds; its objects that `project.git` lacks are
    /// fetched into the new repository.
    Parent(&'a Path),
}

/// Fill the skeleton [`plan_workspace`] laid at `ws` (relative to `run.cwd`) for `full_id`: the base
/// commit on [`branch`], `smithfs.base`, the index and the work tree. Returns the base commit.
///
/// Errors: a git step failed (the base is unreadable, the parent's workspace has no `HEAD` commit …).
pub fn populate(
    run: &GitRun<'_>,
    ws: &Path,
    full_id: &str,
    base: Base<'_>,
) -> Result<String, GitError> {
    let git_dir = ws.join(".git");
    let mut gd = OsString::from("--git-dir=");
    gd.push(&git_dir);
    let mut wt = OsString::from("--work-tree=");
    wt.push(ws);
    let branch_ref = format!("refs/heads/{}", branch(full_id));
    let os = |s: &str| OsString::from(s);
    let none: &[String] = &[];
    let commit = match base {
        Base::Commit(c) => {
            run.run(
                none,
                &[gd.clone(), os("update-ref"), os(&branch_ref), os(c)],
            )?;
            c.to_string()
        }
        Base::Parent(parent) => {
            let src = parent.join(".git").into_os_string();
            run.run(
                none,
                &[
                    gd.clone(),
                    os("fetch"),
                    os("--quiet"),
                    os("--no-tags"),
                    os("--no-write-fetch-head"),
                    os("--update-head-ok"),
                    os("--no-recurse-submodules"),
                    // The upload-pack half reads the parent's repository, of another uid: git
                    // clears `-c` settings (GIT_CONFIG_PARAMETERS) for a local transport's
                    // upload-pack, so TRUST_ANY_OWNER goes on its own command line, or it
                    // refuses the "dubious ownership" and the fetch fails with "expected flush
                    // after ref listing" (docs/PROTOCOL-NOTES.md W19).
                    os(UPLOAD_PACK),
                    src,
                    os(&format!("+HEAD:{branch_ref}")),
                ],
            )?;
            run.run(
                none,
                &[
                    gd.clone(),
                    os("rev-parse"),
                    os("--verify"),
                    os("HEAD^{commit}"),
                ],
            )?
            .trim()
            .to_string()
        }
    };
    run.run(
        none,
        &[gd.clone(), os("config"), os("smithfs.base"), os(&commit)],
    )?;
    // Writing the files is nearly all of a big workspace's cost (one create, write, close and
    // stat each); git's parallel checkout spreads it over one worker per CPU from 100 files up
    // (docs/PROTOCOL-NOTES.md W12: ~2x faster for 10 000 files on a loaded 2-core machine).
    run.run(
        &[PARALLEL_CHECKOUT.to_string()],
        &[gd, wt, os("read-tree"), os("--reset"), os("-u"), os("HEAD")],
    )?;
    Ok(commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for (id, br, mail, alt) in [
            (
                "smith-root",
                "smith/smith-root",
                "smith-root@smithfs.invalid",
                "../../../../../project.git/objects",
            ),
            (
                "smith-root/smith-001",
                "smith/smith-root.smith-001",
                "smith-root.smith-001@smithfs.invalid",
                "../../../../../../../project.git/objects",
            ),
        ] {
            assert_eq!(branch(id), br);
            assert_eq!(email(id), mail);
            assert_eq!(alternates(id).as_deref(), Some(alt));
        }
        assert_eq!(alternates("nope"), None);
    }

    #[test]
    fn skeleton_parents_first() {
        let plan = plan_workspace("smith-root/smith-002").unwrap();
        let mut seen: Vec<&Path> = Vec::new();
        for e in &plan {
            let p = e.path();
            if let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
                assert!(seen.contains(&parent), "{p:?} before its parent");
            }
            seen.push(p);
        }
        let head = plan
            .iter()
            .find(|e| e.path() == Path::new("workspace/.git/HEAD"))
            .unwrap();
        match head {
            PlanEntry::File { content, .. } => assert_eq!(
                content.as_slice(),
                b"ref: refs/heads/smith/smith-root.smith-002\n"
            ),
            PlanEntry::Dir { .. } => panic!("HEAD is a file"),
        }
    }
}
