//! The auto-commit at run exit (docs/SPEC.md §11): whatever a run left uncommitted in its smith's
//! `workspace/` (untracked files included, ignored ones not) becomes one commit on the smith's branch,
//! author and committer the full id, message `smithfs: RUN_ID (WAKE)`.
//!
//! Each git step is started like a run — bound as that smith, in its cgroup, working through the
//! mount — from a thread of its own, never a FUSE thread, and its end is posted into the scheduler's
//! queue as [`Msg::Committed`], so the scheduler never waits for git. Git runs isolated
//! (`workspace::git`): nothing the smith configured (hooks, fsmonitor, filter drivers) runs. The
//! outcome is journaled as `workspace.committed` (`commit`) or `workspace.commit_failed` (`error`);
//! a run that changed nothing journals neither.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::journal::{Event, Journal};
use super::runner::{self, BindTo, Launch, RunBinder};
use super::Msg;
use crate::process::spawn::Program;
use crate::process::wait_pidfd;
use crate::tree::model::SmithIdx;
use crate::workspace::{self, git};

/// How long all git steps of one auto-commit may take together before the one running is killed
/// and the commit is reported as failed.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(120);

/// At most this much of a git step's output is kept (the commit id, a config listing).
const MAX_OUTPUT: u64 = 1 << 20;

/// One auto-commit, for [`CommitJob::start`].
pub(crate) struct CommitJob {
    /// The smith.
    pub smith: SmithIdx,
    /// Its full id (author, committer, journal).
    pub full_id: crate::tree::model::FullId,
    /// The run that exited.
    pub run_id: String,
    /// Its wake reason (`task`, `children`, `retry`).
    pub wake: String,
    /// `MOUNT/smiths/…/workspace`: git's working directory, through the mount.
    pub dir: PathBuf,
    /// Binds each git to the smith.
    pub binder: Arc<dyn RunBinder>,
    /// Where the outcome is journaled.
    pub journal: Arc<Journal>,
    /// The scheduler's queue, told when the commit is over.
    pub tx: SyncSender<Msg>,
    /// `RLIMIT_NOFILE` for the children, as for runs.
    pub nofile: (u64, u64),
    /// Confine git as the smith's runs are (docs/PROTOCOL-NOTES.md H13).
    pub confine: Option<crate::process::confine::Confinement>,
    /// The sandbox the git runs in, as the smith's runs do (docs/SPEC.md §12); `None`: none.
    pub sandbox: Option<crate::sandbox::view::Plan>,
}

/// What one git step did: its exit code (None: killed or not reaped) and output.
struct Step {
    code: Option<i32>,
    out: String,
}

impl CommitJob {
    /// Start the commit on a thread of its own. Errors: the thread could not be started (the
    /// caller then goes on as if there were no workspace).
    pub fn start(self) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("smithfs-commit".into())
            .spawn(move || self.run())
            .map(|_| ())
    }

    fn run(self) {
        let deadline = Instant::now() + COMMIT_TIMEOUT;
        let ev = match self.commit(deadline) {
            Ok(None) => None,
            Ok(Some(commit)) => {
                let mut ev = Event::new("workspace.committed", Some(self.full_id.clone()));
                ev.commit = Some(commit);
                Some(ev)
            }
            Err(error) => {
                let mut ev = Event::new("workspace.commit_failed", Some(self.full_id.clone()));
                ev.error = Some(error);
                Some(ev)
            }
        };
        if let Some(mut ev) = ev {
            ev.run_id = Some(self.run_id.clone());
            ev.wake = Some(self.wake.clone());
            ev.path = Some(workspace::AREA.to_string());
            let _ = self.journal.append(&ev);
        }
        let _ = self.tx.send(Msg::Committed {
            smith: self.smith,
            run_id: self.run_id,
        });
    }

    /// The steps: list the config (for the driver overrides), `add -A`, anything staged?, commit,
    /// the new commit's id. `Ok(None)`: nothing to commit.
    fn commit(&self, deadline: Instant) -> Result<Option<String>, String> {
        if !self.dir.join(".git").exists() {
            return Ok(None);
        }
        let names = self.git(
            &[],
            &["config", "--list", "--name-only", "--includes"],
            deadline,
        )?;
        let extra = git::overrides(&names.out)?;
        let ok = |s: Step, what: &str| match s.code {
            Some(0) => Ok(s.out),
            _ => Err(last_line(&s.out, what)),
        };
        ok(
            self.git(&extra, &["add", "--all"], deadline)?,
            "git add --all failed",
        )?;
        let staged = self.git(
            &extra,
            &[
                "diff",
                "--cached",
                "--quiet",
                "--no-ext-diff",
                "--no-textconv",
            ],
            deadline,
        )?;
        match staged.code {
            Some(0) => return Ok(None),
            Some(1) => {}
            _ => return Err(last_line(&staged.out, "git diff --cached failed")),
        }
        let message = format!("smithfs: {} ({})", self.run_id, self.wake);
        ok(
            self.git(
                &extra,
                &[
                    "commit",
                    "--quiet",
                    "--no-verify",
                    "--no-gpg-sign",
                    "-m",
                    &message,
                ],
                deadline,
            )?,
            "git commit failed",
        )?;
        let head = ok(
            self.git(&extra, &["rev-parse", "--verify", "HEAD"], deadline)?,
            "git rev-parse HEAD failed",
        )?;
        Ok(Some(head.trim().to_string()))
    }

    /// One isolated git step, bound as the smith, in [`CommitJob::dir`].
    fn git(&self, extra: &[String], args: &[&str], deadline: Instant) -> Result<Step, String> {
        let mut argv = vec!["git".to_string()];
        argv.extend(git::isolated_args(extra));
        argv.extend(args.iter().map(|a| a.to_string()));
        let mut env: BTreeMap<String, String> = git::ENV_SET
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let email = workspace::email(&self.full_id);
        for k in ["GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"] {
            env.insert(k.into(), self.full_id.to_string());
        }
        for k in ["GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"] {
            env.insert(k.into(), email.clone());
        }
        let (read, write) = pipe().map_err(|e| format!("pipe: {e}"))?;
        let started = runner::launch(
            Launch {
                program: Program {
                    argv: &argv,
                    env: &env,
                    cwd: Some(&self.dir),
                    stdin_piped: false,
                    output: Some(write),
                    nofile: self.nofile,
                    confine: self.confine,
                    user: None,
                },
                bind: BindTo::Smith(self.smith),
                sandbox: self.sandbox.as_ref(),
            },
            &*self.binder,
        )
        .map_err(|e| format!("cannot start git: {e}"))?;
        let mut started = started;
        // The output is read to its end first: git's output here is small, and the read ends when
        // git (and anything holding the pipe) exits or the deadline kills it.
        let reader = std::thread::spawn(move || {
            let mut out = String::new();
            let _ = std::fs::File::from(read)
                .take(MAX_OUTPUT)
                .read_to_string(&mut out);
            out
        });
        let exited = match started.child.pidfd() {
            Some(fd) => wait_pidfd(fd, deadline),
            None => super::hooks::wait_exit(started.pid, deadline),
        };
        if !exited {
            // SAFETY: signalling the step's own process group (it is a session leader).
            unsafe { libc::kill(-(started.pid as i32), libc::SIGKILL) };
        }
        let status = started.child.wait();
        crate::process::reaper::untrack(started.pid);
        let out = reader.join().unwrap_or_default();
        if !exited {
            return Err(format!(
                "git {} did not finish within {}s",
                args.first().copied().unwrap_or(""),
                COMMIT_TIMEOUT.as_secs()
            ));
        }
        let code = status.ok().and_then(|s| s.code());
        Ok(Step { code, out })
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// Git's error in `out`: its first `fatal:`/`error:` line, else the last non-empty line, else
/// `fallback`.
fn last_line(out: &str, fallback: &str) -> String {
    let lines = || out.lines().map(str::trim).filter(|l| !l.is_empty());
    lines()
        .find(|l| l.starts_with("fatal:") || l.starts_with("error:"))
        .or_else(|| lines().next_back())
        .map_or_else(|| fallback.to_string(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::last_line;

    #[test]
    fn last_line_of_git_output() {
        let out = "fatal: Unable to create '/w/.git/index.lock': File exists.\n\nAnother git process seems to be running\n";
        assert_eq!(
            last_line(out, "x"),
            "fatal: Unable to create '/w/.git/index.lock': File exists."
        );
        assert_eq!(last_line("a\nb\n", "x"), "b");
        assert_eq!(last_line("\n \n", "x"), "x");
    }
}
