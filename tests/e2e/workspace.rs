//! Workspaces (docs/SPEC.md §11) on real mounts, in both identity modes: `init --repo` and its bad
//! input, `project.git`, every smith's `workspace/` (branch, `user.name`, `smithfs.base`, alternates,
//! a child's base = its parent's `HEAD` commit, mid-rebase too), the rights of §3, a parent's pull,
//! the auto-commit at run exit (`workspace.committed` / `workspace.commit_failed` with a stale index
//! lock), `diff`, `accept` (checked-out and diverged branches refused), a hostile smith config that
//! must run nothing, submodules, and a 10 000-file repository (figures printed).

use crate::common;

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{poll_until, run, smithfs, MountOpts, Run, TestMount, SMITHFS};

const ROOT_WS: &str = "smiths/smith-root/workspace";
const CHILD: &str = "smiths/smith-root/children/smith-001";
const CHILD_WS: &str = "smiths/smith-root/children/smith-001/workspace";

/// `git ARGS` in `dir` (plain git, as a user would run it: as the owner of `dir`, who with the
/// sandbox is the agents' user, docs/SPEC.md §12 "Ownership"); panics on failure; stdout trimmed.
#[track_caller]
fn git(dir: &Path, args: &[&str]) -> String {
    let r = run(as_owner(
        dir,
        Command::new("git").arg("-C").arg(dir).args(args),
    ));
    assert!(r.ok(), "git {args:?} in {}: {}", dir.display(), r.stderr);
    r.stdout.trim().to_string()
}

/// `cmd` as the owner of `dir` (uid and gid; no supplementary groups), with no global git
/// configuration (root's home is not the owner's).
fn as_owner<'a>(dir: &Path, cmd: &'a mut Command) -> &'a mut Command {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let m = std::fs::metadata(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    cmd.uid(m.uid())
        .gid(m.gid())
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", "/")
}

/// A repository with a few files and two commits; returns its HEAD.
fn make_repo(dir: &Path) -> String {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let sh = |s: &str| {
        let r = run(Command::new("bash").arg("-ec").arg(s).current_dir(dir));
        assert!(r.ok(), "{s}: {}", r.stderr);
    };
    sh("git init -q -b main . && git config user.name u && git config user.email u@example.com \
        && echo one > a.txt && echo 'fn main() {}' > src/main.rs && git add -A && git commit -qm one \
        && echo two >> a.txt && git commit -qam two && git tag v2");
    git(dir, &["rev-parse", "HEAD"])
}

/// Identity mode of a mount (docs/SPEC.md §2).
#[derive(Debug, Clone, Copy)]
enum Mode {
    Cgroup,
    Ancestry,
}

impl Mode {
    /// Mount options: `--allow-other` and this identity mode.
    fn opts(self) -> MountOpts {
        MountOpts {
            allow_other: true,
            foreground: false,
            extra: vec![
                "--identity",
                match self {
                    Mode::Cgroup => "cgroup",
                    Mode::Ancestry => "ancestry",
                },
            ],
            env: Vec::new(),
            unsandboxed: false,
        }
    }
}

struct Ws {
    m: TestMount,
    repo: PathBuf,
    base: String,
}

impl Ws {
    fn new(mode: Mode) -> Ws {
        Ws::with_env(mode, Vec::new())
    }

    /// [`Ws::new`] with `env` in the daemon's environment.
    fn with_env(mode: Mode, env: Vec<(&'static str, &'static str)>) -> Ws {
        let mut base = String::new();
        let mut repo = PathBuf::new();
        let m = TestMount::with_init(MountOpts { env, ..mode.opts() }, |tmp| {
            repo = tmp.join("repo");
            base = make_repo(&repo);
            vec![OsString::from("--repo"), repo.clone().into_os_string()]
        });
        Ws { m, repo, base }
    }

    fn abs(&self, rel: &str) -> PathBuf {
        self.m.path().join(rel)
    }

    /// `bash -c SCRIPT` bound to `who` with `smithfs run`, in `cwd` (mount-relative).
    fn as_smith(&self, who: &str, cwd: &str, script: &str) -> Run {
        run(Command::new(SMITHFS)
            .args(["run", "--mount"])
            .arg(self.m.path())
            .args(["--smith", who, "--", "bash", "-c", script])
            .current_dir(self.abs(cwd)))
    }

    #[track_caller]
    fn as_smith_ok(&self, who: &str, cwd: &str, script: &str) -> String {
        let r = self.as_smith(who, cwd, script);
        assert!(r.ok(), "as {who}: {script}: {}{}", r.stdout, r.stderr);
        r.stdout
    }

    /// Set the agent command and remount (config is read at mount).
    fn set_agent(&mut self, script: &str) {
        let p = self.m.path().join("config.json");
        let mut c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        c["agent"] = serde_json::json!({ "command": ["bash", "-c", script], "retries": 0 });
        std::fs::write(&p, serde_json::to_string_pretty(&c).unwrap()).unwrap();
        self.m.remount();
    }

    /// Journal lines (parsed) of `event`.
    fn events(&self, event: &str) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.abs(".smithfs/events.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["event"] == event)
            .collect()
    }

    fn wait_event(&self, event: &str, n: usize) -> Vec<serde_json::Value> {
        poll_until(Duration::from_secs(30), event, || {
            self.events(event).len() >= n
        });
        self.events(event)
    }
}

/// `smithfs accept DIR ID [--branch BRANCH]`.
fn accept(dir: impl AsRef<OsStr>, id: &str, branch: Option<&str>) -> Run {
    let mut args: Vec<&OsStr> = vec![OsStr::new("accept"), dir.as_ref(), OsStr::new(id)];
    if let Some(b) = branch {
        args.extend([OsStr::new("--branch"), OsStr::new(b)]);
    }
    smithfs(args)
}

macro_rules! both_modes {
    ($name:ident, |$mode:ident| $body:block) => {
        mod $name {
            use super::*;
            fn scenario($mode: Mode) $body
            #[test]
            fn cgroup() {
                scenario(Mode::Cgroup)
            }
            #[test]
            fn ancestry() {
                scenario(Mode::Ancestry)
            }
        }
    };
}

both_modes!(layout_and_child_base, |mode| {
    let w = Ws::new(mode);
    // project.git: a bare copy with every branch and tag.
    let project = w.abs("project.git");
    assert_eq!(
        git(&project, &["rev-parse", "--is-bare-repository"]),
        "true"
    );
    assert_eq!(git(&project, &["rev-parse", "refs/heads/main"]), w.base);
    assert_eq!(git(&project, &["rev-parse", "v2^{commit}"]), w.base);
    // The root's workspace, at REV on smith/smith-root.
    let root = w.abs(ROOT_WS);
    assert_eq!(
        git(&root, &["symbolic-ref", "HEAD"]),
        "refs/heads/smith/smith-root"
    );
    assert_eq!(git(&root, &["rev-parse", "HEAD"]), w.base);
    assert_eq!(git(&root, &["config", "user.name"]), "smith-root");
    assert!(!git(&root, &["config", "user.email"]).is_empty());
    assert_eq!(git(&root, &["config", "smithfs.base"]), w.base);
    let alt = std::fs::read_to_string(root.join(".git/objects/info/alternates")).unwrap();
    assert_eq!(alt.trim(), "../../../../../project.git/objects");
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
    // The root commits, leaves an uncommitted change, and makes a child.
    w.as_smith_ok(
        "smith-root",
        ROOT_WS,
        "echo new > new.txt && git add new.txt && git commit -qm 'root work' && echo dirty >> a.txt",
    );
    let root_head = git(&root, &["rev-parse", "HEAD"]);
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root",
        "mkdir children/smith-001",
    );
    let child = w.abs(CHILD_WS);
    assert_eq!(
        git(&child, &["symbolic-ref", "HEAD"]),
        "refs/heads/smith/smith-root.smith-001"
    );
    assert_eq!(git(&child, &["rev-parse", "HEAD"]), root_head);
    assert_eq!(git(&child, &["config", "smithfs.base"]), root_head);
    assert_eq!(
        git(&child, &["config", "user.name"]),
        "smith-root/smith-001"
    );
    // The parent's HEAD commit, not its work tree; its new objects are the child's own.
    assert_eq!(
        std::fs::read_to_string(child.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(
        std::fs::read_to_string(child.join("new.txt")).unwrap(),
        "new\n"
    );
    let alt = std::fs::read_to_string(child.join(".git/objects/info/alternates")).unwrap();
    assert_eq!(alt.trim(), "../../../../../../../project.git/objects");
    let copied = run(as_owner(
        &child,
        Command::new("git")
            .arg("--git-dir")
            .arg(child.join(".git"))
            .args(["cat-file", "-e", &root_head])
            .env("GIT_ALTERNATE_OBJECT_DIRECTORIES", ""),
    ));
    assert!(copied.ok(), "the child's repository has its base commit");
    assert_eq!(git(&child, &["status", "--porcelain"]), "");
    // A grandchild starts at the child's HEAD.
    w.as_smith_ok(
        "smith-root/smith-001",
        CHILD_WS,
        "echo c > c.txt && git add c.txt && git commit -qm child",
    );
    let child_head = git(&child, &["rev-parse", "HEAD"]);
    std::fs::create_dir(w.abs(&format!("{CHILD}/children/smith-001"))).unwrap();
    let grand = w.abs(&format!("{CHILD}/children/smith-001/workspace"));
    assert_eq!(git(&grand, &["rev-parse", "HEAD"]), child_head);
    assert_eq!(
        git(&grand, &["symbolic-ref", "--short", "HEAD"]),
        "smith/smith-root.smith-001.smith-001"
    );
});

both_modes!(rights_and_parent_pull, |mode| {
    let w = Ws::new(mode);
    std::fs::create_dir(w.abs(CHILD)).unwrap();
    std::fs::create_dir(w.abs("smiths/smith-root/children/smith-002")).unwrap();
    // The child writes the parent's workspace: EACCES, and why says so.
    let r = w.as_smith(
        "smith-root/smith-001",
        CHILD,
        "echo x > ../../workspace/a.txt",
    );
    assert!(
        !r.ok() && r.stderr.contains("Permission denied"),
        "{}",
        r.stderr
    );
    let why = std::fs::read_to_string(w.abs(".smithfs/why")).unwrap_or_default();
    let why_child = w.as_smith_ok("smith-root/smith-001", "", "cat .smithfs/why");
    assert!(why_child.contains("workspace"), "{why_child}\n{why}");
    // A sibling may not even read it; the parent reads, but may not write.
    let r = w.as_smith(
        "smith-root/smith-002",
        "smiths/smith-root/children/smith-002",
        "cat ../smith-001/workspace/a.txt",
    );
    assert!(!r.ok(), "a sibling read another's workspace");
    assert_eq!(
        w.as_smith_ok(
            "smith-root",
            "smiths/smith-root",
            "cat children/smith-001/workspace/a.txt"
        ),
        "one\ntwo\n"
    );
    let r = w.as_smith(
        "smith-root",
        "smiths/smith-root",
        "echo x >> children/smith-001/workspace/a.txt",
    );
    assert!(!r.ok(), "the parent wrote its child's workspace");
    // Nobody but the operator writes project.git; the workspace itself is structure.
    let r = w.as_smith("smith-root", "", "touch project.git/x");
    assert!(
        !r.ok() && r.stderr.contains("Permission denied"),
        "{}",
        r.stderr
    );
    // No why to read: with the sandbox the kernel's mode check (`default_permissions`;
    // project.git is the operator's, 0755) refuses the run's uid before smithfs is asked.
    let r = w.as_smith("smith-root", "smiths/smith-root", "mv workspace ws2");
    assert!(!r.ok(), "a smith renamed its workspace");
    // The child commits; the parent merges its branch with plain git.
    w.as_smith_ok(
        "smith-root/smith-001",
        CHILD_WS,
        "echo child > child.txt && git add child.txt && git commit -qm 'child work'",
    );
    let child_head = git(&w.abs(CHILD_WS), &["rev-parse", "HEAD"]);
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root",
        "git -C workspace pull -q --no-rebase --no-edit ../children/smith-001/workspace smith/smith-root.smith-001",
    );
    assert_eq!(git(&w.abs(ROOT_WS), &["rev-parse", "HEAD"]), child_head);
    // Every git command of an agent works in its own workspace through the mount.
    w.as_smith_ok(
        "smith-root",
        ROOT_WS,
        "git branch topic && git stash list && echo s >> a.txt && git stash -q && git stash pop -q \
         && git checkout -q topic && git checkout -q smith/smith-root && git gc -q && git status --short",
    );
});

both_modes!(auto_commit_and_stale_lock, |mode| {
    let mut w = Ws::new(mode);
    w.set_agent(
        "cd workspace && if [ -e ../private/lock ]; then touch .git/index.lock; fi; \
         echo \"$SMITH_WAKE\" > wake.txt && echo junk > junk.log && echo '*.log' > .gitignore \
         && echo more >> a.txt; cd .. && echo done > outbox/result.md",
    );
    std::fs::write(w.abs("smiths/smith-root/inbox/task-1.md"), "# one\n").unwrap();
    let ev = w.wait_event("workspace.committed", 1);
    let ws = w.abs(ROOT_WS);
    let head = git(&ws, &["rev-parse", "HEAD"]);
    assert_eq!(ev[0]["commit"], head.as_str());
    assert_eq!(ev[0]["smith"], "smith-root");
    let run_id = ev[0]["run_id"].as_str().unwrap().to_string();
    assert_eq!(
        git(&ws, &["log", "-1", "--format=%an|%cn|%s"]),
        format!("smith-root|smith-root|smithfs: {run_id} (task)")
    );
    let files = git(&ws, &["show", "--name-only", "--format=", "HEAD"]);
    assert_eq!(
        files, ".gitignore\na.txt\nwake.txt",
        "untracked in, ignored out"
    );
    // The run.exited of that run comes after the commit.
    let exited = w.wait_event("run.exited", 1);
    assert_eq!(exited[0]["run_id"], run_id.as_str());
    // A run that leaves an index lock behind: commit_failed with the error, the scheduler goes on.
    std::fs::write(w.abs("smiths/smith-root/private/lock"), "").unwrap();
    std::fs::remove_file(w.abs("smiths/smith-root/outbox/result.md")).unwrap();
    std::fs::write(w.abs("smiths/smith-root/inbox/task-2.md"), "# two\n").unwrap();
    let failed = w.wait_event("workspace.commit_failed", 1);
    let err = failed[0]["error"].as_str().unwrap_or("");
    assert!(err.contains("index.lock"), "{err}");
    w.wait_event("run.exited", 2);
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), head, "nothing committed");
    // The next run commits again once the lock is gone.
    std::fs::remove_file(ws.join(".git/index.lock")).unwrap();
    std::fs::remove_file(w.abs("smiths/smith-root/private/lock")).unwrap();
    std::fs::remove_file(w.abs("smiths/smith-root/outbox/result.md")).unwrap();
    std::fs::write(w.abs("smiths/smith-root/inbox/task-3.md"), "# three\n").unwrap();
    w.wait_event("workspace.committed", 2);
    assert_ne!(git(&ws, &["rev-parse", "HEAD"]), head);
});

both_modes!(hostile_config_runs_nothing, |mode| {
    let mut w = Ws::new(mode);
    let marks = w.m.scratch().join("marks");
    std::fs::create_dir(&marks).unwrap();
    std::fs::set_permissions(&marks, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let m = marks.display().to_string();
    std::fs::create_dir(w.abs(CHILD)).unwrap();
    // The child configures everything git could run, then changes files.
    w.as_smith_ok(
        "smith-root/smith-001",
        CHILD_WS,
        &format!(
            "mkdir -p .git/evilhooks && for h in pre-commit commit-msg post-commit pre-auto-gc post-checkout post-merge \
             reference-transaction pre-push; do printf '#!/bin/sh\\ntouch {m}/hook-'$h'\\n' > .git/evilhooks/$h; \
             chmod +x .git/evilhooks/$h; done; cp .git/evilhooks/* .git/hooks/ 2>/dev/null || mkdir -p .git/hooks && cp .git/evilhooks/* .git/hooks/; \
             git config core.hooksPath .git/evilhooks; git config core.fsmonitor 'touch {m}/fsmonitor; false'; \
             git config filter.evil.clean 'touch {m}/clean; cat'; git config filter.evil.smudge 'touch {m}/smudge; cat'; \
             git config filter.evil.required true; git config diff.external 'touch {m}/extdiff'; \
             git config diff.evil.textconv 'touch {m}/textconv; cat'; git config uploadpack.packObjectsHook 'touch {m}/packhook'; \
             echo '* filter=evil diff=evil' > .gitattributes; echo '* filter=evil diff=evil' > .git/info/attributes; \
             echo changed >> a.txt; echo new > new.txt"
        ),
    );
    let _ = std::fs::remove_dir_all(&marks);
    std::fs::create_dir(&marks).unwrap();
    std::fs::set_permissions(&marks, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let none_ran = |what: &str| {
        let left: Vec<String> = std::fs::read_dir(&marks)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.is_empty(), "{what} ran the smith's {left:?}");
    };
    // The operator's diff.
    let d = smithfs([
        OsString::from("diff"),
        w.m.path().into(),
        "smith-root/smith-001".into(),
    ]);
    assert!(d.ok(), "{}", d.stderr);
    assert!(
        d.stdout.contains("+changed") && d.stdout.contains("new.txt"),
        "{}",
        d.stdout
    );
    none_ran("smithfs diff");
    // The auto-commit at the end of the child's run.
    w.set_agent("echo done > outbox/result.md");
    std::fs::write(w.abs(&format!("{CHILD}/inbox/task-1.md")), "# go\n").unwrap();
    w.wait_event("workspace.committed", 1);
    none_ran("the auto-commit");
    // accept, and the parent's pull from the child.
    let a = accept(w.m.path(), "smith-root/smith-001", None);
    assert!(a.ok(), "{}", a.stderr);
    none_ran("smithfs accept");
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root",
        "git -C workspace pull -q --no-rebase --no-edit ../children/smith-001/workspace smith/smith-root.smith-001",
    );
    none_ran("the parent's pull");
    // A new child of the hostile one is built without running anything either.
    std::fs::create_dir(w.abs(&format!("{CHILD}/children/smith-001"))).unwrap();
    none_ran("the scaffold");
});

both_modes!(diff_and_accept, |mode| {
    let w = Ws::new(mode);
    let ws = w.abs(ROOT_WS);
    w.as_smith_ok(
        "smith-root",
        ROOT_WS,
        "echo c >> a.txt && git commit -qam committed && echo u > untracked.txt && echo w >> src/main.rs",
    );
    let dir = w.m.path().as_os_str().to_os_string();
    let stat = smithfs([
        OsString::from("diff"),
        dir.clone(),
        "smith-root".into(),
        "--stat".into(),
    ]);
    assert!(stat.ok(), "{}", stat.stderr);
    for f in ["a.txt", "untracked.txt", "src/main.rs"] {
        assert!(stat.stdout.contains(f), "{f} in\n{}", stat.stdout);
    }
    let full = smithfs([OsString::from("diff"), dir.clone(), "smith-root".into()]);
    assert!(
        full.stdout.contains("+c\n") && full.stdout.contains("+u\n"),
        "{}",
        full.stdout
    );
    assert_eq!(
        git(&ws, &["status", "--porcelain"]),
        "M src/main.rs\n?? untracked.txt",
        "diff wrote nothing"
    );
    // Unknown smith: exit 2.
    let r = smithfs([
        OsString::from("diff"),
        dir.clone(),
        "smith-root/smith-009".into(),
    ]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    // Short ids (docs/SPEC.md §6): a short id only one smith has, or a unique suffix; an
    // ambiguous one exits 2 with one line naming the candidates.
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root",
        "mkdir children/smith-001",
    );
    w.as_smith_ok(
        "smith-root/smith-001",
        CHILD,
        "mkdir children/smith-001 && echo grandchild >> workspace/a.txt",
    );
    let short = smithfs([
        OsString::from("diff"),
        dir.clone(),
        "root/smith-001".into(),
        "--stat".into(),
    ]);
    assert!(short.ok(), "{}", short.stderr);
    assert!(short.stdout.contains("a.txt"), "{}", short.stdout);
    let r = smithfs([OsString::from("diff"), dir.clone(), "smith-001".into()]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("smith-root/smith-001/smith-001")
            && r.stderr.contains("smith-root/smith-001,"),
        "{}",
        r.stderr
    );
    let r = accept(&dir, "smith-001", None);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let r = accept(&dir, "smith-001/smith-001", Some("grandchild-work"));
    assert!(r.ok(), "{}", r.stderr);
    assert!(r.stdout.starts_with("grandchild-work "), "{}", r.stdout);
    // accept: a new branch smith/smith-root at the smith's branch; PATH itself untouched.
    let status_before = git(&w.repo, &["status", "--porcelain"]);
    let a = accept(&dir, "smith-root", None);
    assert!(a.ok(), "{}", a.stderr);
    let head = git(&ws, &["rev-parse", "smith/smith-root"]);
    assert_eq!(a.stdout, format!("smith/smith-root {head}\n"));
    // Only commits travel, and accept says what stayed behind (W17).
    assert!(
        a.stderr
            .contains("2 uncommitted change(s) in smith-root's workspace not included"),
        "{}",
        a.stderr
    );
    assert_eq!(git(&w.repo, &["rev-parse", "smith/smith-root"]), head);
    assert_eq!(git(&w.repo, &["rev-parse", "HEAD"]), w.base);
    assert_eq!(git(&w.repo, &["symbolic-ref", "HEAD"]), "refs/heads/main");
    assert_eq!(git(&w.repo, &["status", "--porcelain"]), status_before);
    // Again, and with --branch: fast-forward is fine.
    let a = accept(&dir, "smith-root", Some("feature/x"));
    assert!(a.ok(), "{}", a.stderr);
    assert_eq!(a.stdout, format!("feature/x {head}\n"));
    // The checked-out branch: refused.
    let r = accept(&dir, "smith-root", Some("main"));
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert_eq!(git(&w.repo, &["rev-parse", "main"]), w.base);
    // A diverged branch: refused, one line, unchanged.
    let other = git(
        &w.repo,
        &[
            "commit-tree",
            "HEAD~1^{tree}",
            "-p",
            "HEAD~1",
            "-m",
            "elsewhere",
        ],
    );
    git(&w.repo, &["branch", "diverged", &other]);
    let before = git(&w.repo, &["rev-parse", "diverged"]);
    let r = accept(&dir, "smith-root", Some("diverged"));
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("refused"), "{}", r.stderr);
    assert_eq!(git(&w.repo, &["rev-parse", "diverged"]), before);
});

both_modes!(child_of_a_parent_mid_rebase, |mode| {
    let w = Ws::new(mode);
    // The root makes two branches that conflict and stops in the middle of a rebase.
    w.as_smith_ok(
        "smith-root",
        ROOT_WS,
        "git checkout -q -b side && echo side > a.txt && git commit -qam side \
         && git checkout -q smith/smith-root && echo mine > a.txt && git commit -qam mine \
         && (git rebase side >/dev/null 2>&1 || true) && test -d .git/rebase-merge -o -d .git/rebase-apply",
    );
    let head = git(&w.abs(ROOT_WS), &["rev-parse", "HEAD"]);
    std::fs::create_dir(w.abs(CHILD)).unwrap();
    let child = w.abs(CHILD_WS);
    assert_eq!(git(&child, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(&child, &["config", "smithfs.base"]), head);
    assert_eq!(git(&child, &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(child.join("a.txt")).unwrap(),
        "side\n"
    );
});

/// Bad input of `init --repo` (no mount needed) and the mount's refusal of a `workspace` key
/// without `project.git`.
#[test]
fn init_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let base = make_repo(&repo);
    let init = |args: &[&str]| {
        let mut v: Vec<OsString> = vec!["init".into()];
        v.extend(args.iter().map(OsString::from));
        smithfs(v)
    };
    let d = tmp.path().join("d1");
    let d1 = d.to_str().unwrap();
    // Not a git repository.
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let r = init(&[d1, "--repo", plain.to_str().unwrap()]);
    assert_eq!(r.code, Some(1));
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("not a git repository"), "{}", r.stderr);
    assert!(!d.exists(), "init created {d1}");
    // Unknown REV.
    let r = init(&[d1, "--repo", repo.to_str().unwrap(), "--rev", "no-such-rev"]);
    assert_eq!(r.code, Some(1));
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("no-such-rev"), "{}", r.stderr);
    assert!(!d.exists());
    // An older REV is the root's base.
    let r = init(&[d1, "--repo", repo.to_str().unwrap(), "--rev", "HEAD~1"]);
    assert!(r.ok(), "{}", r.stderr);
    let old = git(&repo, &["rev-parse", "HEAD~1"]);
    assert_eq!(git(&d.join(ROOT_WS), &["rev-parse", "HEAD"]), old);
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["workspace"]["rev"], "HEAD~1");
    assert_eq!(
        cfg["workspace"]["repo"],
        repo.canonicalize().unwrap().to_str().unwrap()
    );
    // Uncommitted changes with REV HEAD: a warning saying they are not included; DIR inside the
    // repository goes into its info/exclude.
    std::fs::write(repo.join("a.txt"), "dirty\n").unwrap();
    let inner = repo.join(".agent-smith");
    let r = init(&[inner.to_str().unwrap(), "--repo", repo.to_str().unwrap()]);
    assert!(r.ok(), "{}", r.stderr);
    assert!(r.stderr.contains("not included"), "{}", r.stderr);
    assert_eq!(git(&inner.join(ROOT_WS), &["rev-parse", "HEAD"]), base);
    let exclude = std::fs::read_to_string(repo.join(".git/info/exclude")).unwrap();
    assert!(exclude.lines().any(|l| l == "/.agent-smith/"), "{exclude}");
    assert_eq!(git(&repo, &["status", "--porcelain"]), "M a.txt");
    // A workspace key without project.git: the mount refuses with one line.
    let bare = tmp.path().join("d2");
    assert!(init(&[bare.to_str().unwrap()]).ok());
    let p = bare.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    c["workspace"] = serde_json::json!({ "repo": repo, "rev": "HEAD" });
    std::fs::write(&p, c.to_string()).unwrap();
    let r = smithfs([OsString::from("mount"), bare.into_os_string()]);
    assert!(!r.ok(), "mounted a workspace config without project.git");
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("project.git"), "{}", r.stderr);
}

/// A repository with a submodule: the gitlink is kept (an empty directory in the work tree); the
/// submodule's own history is not copied (PROTOCOL-NOTES W-notes).
#[test]
fn submodules_are_kept_as_gitlinks() {
    let mut repo = PathBuf::new();
    let mut sub_head = String::new();
    // Without the sandbox: the submodule's source is a host directory the run's view does not
    // show (it would need `sandbox.readable`).
    let opts = MountOpts {
        unsandboxed: true,
        ..MountOpts::default()
    };
    let m = TestMount::with_init(opts, |tmp| {
        let sub = tmp.join("sub");
        make_repo(&sub);
        sub_head = git(&sub, &["rev-parse", "HEAD"]);
        repo = tmp.join("repo");
        make_repo(&repo);
        let r = run(Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "protocol.file.allow=always", "submodule", "add", "-q"])
            .arg(&sub)
            .arg("vendor/sub"));
        assert!(r.ok(), "{}", r.stderr);
        git(&repo, &["commit", "-qm", "add submodule"]);
        vec!["--repo".into(), repo.clone().into_os_string()]
    });
    let ws = m.path().join(ROOT_WS);
    assert!(ws.join(".gitmodules").is_file());
    assert!(ws.join("vendor/sub").is_dir());
    assert_eq!(
        git(&ws, &["ls-tree", "HEAD", "vendor/sub"])
            .split_whitespace()
            .nth(2),
        Some(sub_head.as_str())
    );
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    // A child's workspace keeps the gitlink too (its base copies no submodule objects).
    let r = run(Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", "smith-root", "--", "mkdir"])
        .arg(m.path().join(CHILD)));
    assert!(r.ok(), "{}", r.stderr);
    let child = m.path().join(CHILD_WS);
    assert!(child.join("vendor/sub").is_dir());
    assert_eq!(
        std::fs::read_dir(child.join("vendor/sub")).unwrap().count(),
        0
    );
    assert_eq!(git(&child, &["status", "--porcelain"]), "");
    // The smith fills it itself, inside its own workspace (the clone lands in workspace/.git/modules).
    let r = run(Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(m.path())
        .args(["--smith", "smith-root/smith-001", "--", "git", "-C"])
        .arg(&child)
        .args([
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "update",
            "--init",
            "-q",
        ]));
    assert!(r.ok(), "{}", r.stderr);
    assert_eq!(
        git(&child.join("vendor/sub"), &["rev-parse", "HEAD"]),
        sub_head
    );
    assert!(child.join(".git/modules/vendor/sub").is_dir());
    assert_eq!(git(&child, &["status", "--porcelain"]), "");
}

/// A repository of 10 000 files: a child's workspace is made in well under the seconds a clone
/// would take, and git works in it. Prints the figures docs/PERFORMANCE.md records.
#[test]
fn ten_thousand_files() {
    let mut repo = PathBuf::new();
    let m = TestMount::with_init(MountOpts::default(), |tmp| {
        repo = tmp.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        for d in 0..100 {
            let dir = repo.join(format!("d{d:03}"));
            std::fs::create_dir(&dir).unwrap();
            for f in 0..100 {
                std::fs::write(
                    dir.join(format!("f{f:03}.rs")),
                    format!("// {d} {f}\nfn f() {{}}\n"),
                )
                .unwrap();
            }
        }
        let r = run(Command::new("bash")
            .arg("-ec")
            .arg("git init -q . && git add -A && git -c user.name=u -c user.email=u@e commit -qm big")
            .current_dir(&repo));
        assert!(r.ok(), "{}", r.stderr);
        vec!["--repo".into(), repo.clone().into_os_string()]
    });
    // Three children, each a fresh 10 000-file checkout; the figure is their median.
    let mut mkdirs: Vec<Duration> = (1..=3)
        .map(|n| {
            let t = Instant::now();
            std::fs::create_dir(
                m.path()
                    .join(format!("smiths/smith-root/children/smith-{n:03}")),
            )
            .unwrap();
            t.elapsed()
        })
        .collect();
    mkdirs.sort();
    let mkdir = mkdirs[1];
    let child = m.path().join(CHILD_WS);
    assert_eq!(std::fs::read_dir(child.join("d099")).unwrap().count(), 100);
    let time = |dir: &Path, args: &[&str]| {
        let t = Instant::now();
        git(dir, args);
        t.elapsed()
    };
    let st_cold = time(&child, &["status", "--porcelain"]);
    time(&child, &["status", "--porcelain"]);
    let st_ws = time(&child, &["status", "--porcelain"]);
    let st_native = time(&repo, &["status", "--porcelain"]);
    std::fs::write(child.join("d000/f000.rs"), "changed\n").unwrap();
    std::fs::write(repo.join("d000/f000.rs"), "changed\n").unwrap();
    let ci_ws = time(
        &child,
        &[
            "-c",
            "user.name=u",
            "-c",
            "user.email=u@e",
            "commit",
            "-qam",
            "x",
        ],
    );
    let ci_native = time(
        &repo,
        &[
            "-c",
            "user.name=u",
            "-c",
            "user.email=u@e",
            "commit",
            "-qam",
            "x",
        ],
    );
    let du = |p: &Path| {
        let r = run(Command::new("du").arg("-sk").arg(p));
        r.stdout
            .split_whitespace()
            .next()
            .unwrap_or("0")
            .parse::<u64>()
            .unwrap_or(0)
    };
    eprintln!(
        "figures: 10000 files: mkdir with workspace {:.0} ms (median of {:.0} {:.0} {:.0}); store per \
         smith {} KiB (.git {} KiB); git status {:.0} ms in a workspace (first, cold: {:.0} ms) vs \
         {:.0} ms native; git commit {:.0} ms vs {:.0} ms",
        mkdir.as_secs_f64() * 1e3,
        mkdirs[0].as_secs_f64() * 1e3,
        mkdirs[1].as_secs_f64() * 1e3,
        mkdirs[2].as_secs_f64() * 1e3,
        du(&child),
        du(&child.join(".git")),
        st_ws.as_secs_f64() * 1e3,
        st_cold.as_secs_f64() * 1e3,
        st_native.as_secs_f64() * 1e3,
        ci_ws.as_secs_f64() * 1e3,
        ci_native.as_secs_f64() * 1e3,
    );
    assert!(mkdir < Duration::from_secs(20), "mkdir took {mkdir:?}");
}

/// The header the coding job gives every source file (tests of the bundled coding agent).
const HEADER: [&str; 2] = [
    "Copyright 2026 Test authors",
    "SPDX-License-Identifier: MIT",
];

/// The coding job's edit applied directly to the work tree `dir` (an implementation of its own,
/// to check the agents' merged branch against): every tracked regular file with a source
/// extension, non-empty and without the header in its first 10 lines, gets the header as comments
/// at the top (after a `#!/` line). Returns how many files it edited.
fn license_directly(dir: &Path) -> usize {
    let mut n = 0;
    for line in git(dir, &["ls-files", "-s"]).lines() {
        let (meta, path) = line.split_once('\t').unwrap();
        if !meta.starts_with("100644") && !meta.starts_with("100755") {
            continue;
        }
        let ext = path.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
        let marker = match ext {
            "rs" | "c" | "h" | "cc" | "cpp" | "hpp" | "go" | "js" | "ts" | "java" => "//",
            "sh" | "bash" | "py" | "rb" | "pl" => "#",
            _ => continue,
        };
        let f = dir.join(path);
        let text = std::fs::read_to_string(&f).unwrap();
        if text.is_empty() || text.lines().take(10).any(|l| l.contains(HEADER[0])) {
            continue;
        }
        let header: String = HEADER.iter().map(|h| format!("{marker} {h}\n")).collect();
        let out = match text.split_once('\n') {
            Some((first, rest)) if first.starts_with("#!/") => format!("{first}\n{header}{rest}"),
            _ => format!("{header}{text}"),
        };
        std::fs::write(&f, out).unwrap();
        n += 1;
    }
    n
}

// The main job, coding edition (issue 13): `init --agent coder` installs the bundled coding agent;
// it splits a repository by directory over children at two levels, each child edits and commits in
// its own workspace, each parent merges its children's branches with `git pull`, and the root's
// branch, accepted into the repository, equals the same edit applied directly.
both_modes!(coding_job_end_to_end, |mode| {
    let mut repo = PathBuf::new();
    let m = TestMount::with_init(mode.opts(), |tmp| {
        repo = tmp.join("repo");
        let files: [(&str, &str); 10] = [
            ("top.py", "#!/usr/bin/env python3\nprint(1)\n"),
            ("README.md", "# readme\n"),
            ("lib/top.rs", "#![allow(dead_code)]\nfn top() {}\n"),
            ("lib/a/one.rs", "//! one\nfn one() {}\n"),
            ("lib/a/two.rs", "fn two() {}\n"),
            ("lib/a/empty.rs", ""),
            ("lib/b/three.c", "int three(void) { return 3; }\n"),
            (
                "lib/b/done.rs",
                "// Copyright 2026 Test authors\n// SPDX-License-Identifier: MIT\nfn done() {}\n",
            ),
            ("tools/run.sh", "#!/bin/sh\necho run\n"),
            ("tools/x.go", "package x\n"),
        ];
        for (p, text) in files {
            let f = repo.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, text).unwrap();
        }
        let r = run(Command::new("bash")
                .arg("-ec")
                .arg("git init -q -b main . && git add -A && git -c user.name=u -c user.email=u@e commit -qm base")
                .current_dir(&repo));
        assert!(r.ok(), "{}", r.stderr);
        vec![
            "--repo".into(),
            repo.clone().into_os_string(),
            "--agent".into(),
            "coder".into(),
        ]
    });
    assert!(m.path().join("agents/coder.sh").is_file());
    let base = git(&repo, &["rev-parse", "HEAD"]);
    let root = m.path().join("smiths/smith-root");
    let task = format!(
        "# Task: headers\n\ncoder-job: license-header\ncoder-header: {}\ncoder-header: {}\n\
         coder-split-min-files: 2\ncoder-max-level: 2\n",
        HEADER[0], HEADER[1]
    );
    std::fs::write(root.join("private/task-root.md"), task).unwrap();
    std::fs::rename(
        root.join("private/task-root.md"),
        root.join("inbox/task-root.md"),
    )
    .unwrap();
    let w = smithfs([
        OsString::from("wait"),
        m.path().into(),
        "--final".into(),
        "--timeout".into(),
        "120".into(),
    ]);
    let logs = || {
        smithfs([OsString::from("status"), m.path().into()]).stdout
            + &std::fs::read_to_string(m.path().join(".smithfs-state/daemon.log"))
                .unwrap_or_default()
    };
    assert!(w.ok(), "wait: {} {}\n{}", w.stdout, w.stderr, logs());
    let fin = std::fs::read_to_string(m.path().join("results/final.md")).unwrap();
    let block: Vec<&str> = fin
        .lines()
        .skip_while(|l| !l.starts_with("```coder-tsv"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    let sum = |key: &str| -> u64 {
        block
            .iter()
            .filter_map(|l| l.strip_prefix(&format!("{key}\t")))
            .map(|v| v.parse::<u64>().unwrap())
            .sum()
    };
    assert!(
        !block
            .iter()
            .any(|l| l.starts_with("conflict\t") || l.starts_with("missing\t")),
        "{fin}"
    );
    // root, lib, tools, lib/a, lib/b: two levels below the root.
    assert_eq!(sum("smiths"), 5, "{fin}");
    assert_eq!(
        block.iter().filter(|l| **l == "maxlevel\t2").count(),
        2,
        "{fin}"
    );
    // Every parent merged its children (its own commit came after their bases): 4 merges.
    let ws = m.path().join(ROOT_WS);
    assert_eq!(
        git(
            &ws,
            &["rev-list", "--merges", "--count", &format!("{base}..HEAD")]
        ),
        "4"
    );
    // Accepted into the repository, never touching its checked-out branch.
    let a = accept(m.path(), "smith-root", None);
    assert!(a.ok(), "{}", a.stderr);
    assert!(a.stdout.starts_with("smith/smith-root "), "{}", a.stdout);
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]), base);
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    // The same edit applied directly gives the same tree.
    let direct = m.scratch().join("direct");
    let r = run(Command::new("git")
        .args(["clone", "-q"])
        .arg(&repo)
        .arg(&direct));
    assert!(r.ok(), "{}", r.stderr);
    let edited = license_directly(&direct);
    assert_eq!(edited, 7);
    assert_eq!(sum("edited"), 7, "{fin}");
    assert_eq!(sum("kept"), 2, "{fin}");
    git(&direct, &["add", "-A"]);
    assert_eq!(
        git(&direct, &["write-tree"]),
        git(&repo, &["rev-parse", "smith/smith-root^{tree}"])
    );
});

/// `init --agent coder` without `--repo`: one line, exit 1, nothing created.
#[test]
fn coder_agent_needs_a_repo() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    let r = smithfs([
        OsString::from("init"),
        d.clone().into_os_string(),
        "--agent".into(),
        "coder".into(),
    ]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("--repo"), "{}", r.stderr);
    assert!(!d.exists());
}

/// The coding agent on a merge conflict (docs/AGENTS.md §1a), run without a mount in a plain
/// directory laid out as a smith dir whose dispatched child committed a conflicting change: the
/// agent aborts that merge (its workspace as before, no merge in progress), publishes, and lists
/// the child and the path under "Not merged" and as a `conflict` line.
#[test]
fn coder_agent_aborts_a_conflicting_merge() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("smith-root");
    std::fs::create_dir(&d).unwrap();
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/coder.sh");
    let setup = r#"
        export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
        mkdir -p inbox private/coder/plan outbox children/smith-001/outbox
        printf '# Task: t\n\ncoder-header: H\n' > inbox/task-root.md
        git init -q -b smith/smith-root workspace
        git -C workspace config user.name smith-root && git -C workspace config user.email r@e
        mkdir workspace/a && echo 'fn a() {}' > workspace/a/x.rs && git -C workspace add -A
        git -C workspace commit -qm base
        git clone -q -b smith/smith-root workspace children/smith-001/workspace
        c=children/smith-001/workspace
        git -C $c checkout -q -b smith/smith-root.smith-001
        git -C $c config user.name smith-root/smith-001 && git -C $c config user.email c@e
        echo 'fn child() {}' > $c/a/x.rs && git -C $c commit -qam child
        echo 'fn parent() {}' > workspace/a/x.rs && git -C workspace commit -qam parent
        printf '# r\n\n```coder-tsv\nedited\t1\nkept\t0\nsmiths\t1\nmaxlevel\t1\ncommit\t%s\nbranch\tsmith/smith-root.smith-001\n```\n' \
            "$(git -C $c rev-parse HEAD)" > children/smith-001/outbox/result.md
        printf '%s %s\n' task-root.md "$(cksum < inbox/task-root.md | awk '{print $1}')" > private/coder/task-key
        printf 'part-1\tsmith-001\n' > private/coder/dispatch.tsv
        echo a > private/coder/plan/part-1
        printf 'edited\t0\nkept\t0\n' > private/coder/own.tsv
        touch private/coder/dispatch.done
        git -C workspace rev-parse HEAD
    "#;
    let head = run(Command::new("bash").arg("-ec").arg(setup).current_dir(&d));
    assert!(head.ok(), "{}", head.stderr);
    let r = run(Command::new("bash")
        .arg(&agent)
        .current_dir(&d)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("SMITH_ID", "smith-root")
        .env("SMITH_FULL_ID", "smith-root")
        .env("SMITH_LEVEL", "0")
        .env("SMITH_WAKE", "children")
        .env("SMITH_TASK_FILE", "inbox/task-root.md")
        .env_remove("SMITH_MOUNT"));
    assert!(r.ok(), "{}{}", r.stdout, r.stderr);
    let result = std::fs::read_to_string(d.join("outbox/result.md")).unwrap();
    assert!(result.contains("Not merged: conflicts"), "{result}");
    assert!(
        result.contains("conflict\tsmith-root/smith-001\ta/x.rs"),
        "{result}"
    );
    let ws = d.join("workspace");
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), head.stdout.trim());
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    assert!(!ws.join(".git/MERGE_HEAD").exists());
}

// A parent's repository is the parent's to write, so whatever it plants there — a symlinked ref,
// an alternates line, a `gitdir:` file — must not let the daemon's fetch for a new child copy in
// another smith's work (docs/SPEC.md §3, §11; docs/PROTOCOL-NOTES.md W16).
both_modes!(a_child_base_never_borrows_a_siblings_work, |mode| {
    let w = Ws::new(mode);
    let sib = "smiths/smith-root/children/smith-002";
    std::fs::create_dir(w.abs(CHILD)).unwrap();
    std::fs::create_dir(w.abs(sib)).unwrap();
    w.as_smith_ok(
        "smith-root/smith-002",
        &format!("{sib}/workspace"),
        "echo SIBLING-SECRET > secret.txt && git add secret.txt && git commit -qm secret",
    );
    let sib_git = w.abs(&format!("{sib}/workspace/.git"));
    let sib_git = sib_git.display();
    // Planted refs and alternates: the mkdir fails or makes a child without the secret.
    let planted = format!(
        "cd workspace/.git && echo {sib_git}/objects >> objects/info/alternates \
         && ln -s {sib_git}/refs/heads/smith/smith-root.smith-002 refs/heads/steal \
         && echo 'ref: refs/heads/steal' > HEAD && cd ../.. && \
         (mkdir children/smith-001 2>&1 || true); \
         cat children/smith-001/workspace/secret.txt 2>/dev/null; \
         git -C children/smith-001/workspace log --format=%s 2>/dev/null; true"
    );
    let out = w.as_smith_ok("smith-root/smith-001", CHILD, &planted);
    assert!(
        !out.contains("SIBLING-SECRET") && !out.lines().any(|l| l == "secret"),
        "a planted ref gave the child a sibling's work: {out}"
    );
    // A `gitdir:` file in place of the repository: likewise.
    let gitfile = format!(
        "mv workspace/.git workspace/.git-old && echo 'gitdir: {sib_git}' > workspace/.git && \
         (mkdir children/smith-002 2>&1 || true); \
         cat children/smith-002/workspace/secret.txt 2>/dev/null; true"
    );
    let out = w.as_smith_ok("smith-root/smith-001", CHILD, &gitfile);
    assert!(
        !out.contains("SIBLING-SECRET"),
        "a gitdir file gave the child a sibling's work: {out}"
    );
    // The sibling's own repository is untouched and the operator still sees its secret.
    assert_eq!(
        std::fs::read_to_string(w.abs(&format!("{sib}/workspace/secret.txt"))).unwrap(),
        "SIBLING-SECRET\n"
    );
});

/// A child whose workspace cannot be made is not made: mkdir fails with EIO, nothing is left in
/// `children/`, and `.smithfs/why` names the rule `scaffold-workspace` with git's reason
/// (docs/PROTOCOL-NOTES.md W18); once the cause is gone the same mkdir succeeds.
#[test]
fn a_failed_workspace_is_eio_with_a_why() {
    let w = Ws::new(Mode::Cgroup);
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root",
        "mv workspace/.git private/dot-git",
    );
    let r = w.as_smith(
        "smith-root",
        "smiths/smith-root",
        "mkdir children/smith-001; echo \"rc=$?\"; cat $SMITH_MOUNT/.smithfs/why",
    );
    assert!(r.stderr.contains("Input/output error"), "{r:?}");
    assert!(r.stdout.contains("rc=1"), "{r:?}");
    assert!(r.stdout.contains("scaffold-workspace"), "{r:?}");
    assert!(
        r.stdout
            .contains("could not make the workspace of smith-root/smith-001"),
        "{r:?}"
    );
    assert!(!w.abs("smiths/smith-root/children/smith-001").exists());
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root",
        "mv private/dot-git workspace/.git && mkdir children/smith-001",
    );
    assert_eq!(
        git(&w.abs(CHILD_WS), &["symbolic-ref", "HEAD"]),
        "refs/heads/smith/smith-root.smith-001"
    );
}

/// A parent cannot freeze its subtree with a repository that blocks git (notes W20): its
/// workspace's `.git/HEAD` made a FIFO, the scaffold's fetch would wait on it forever inside the
/// FUSE mkdir, holding the kernel's lock of `children/` (every lookup there, the operator's too,
/// then sleeps uninterruptibly). The scaffold's git is killed at its deadline (3 s here, by the
/// test knob): the mkdir fails with EIO and a `why` saying so, the existing child is still
/// there, and once HEAD is a file again the same mkdir succeeds.
#[test]
fn a_fifo_in_the_parents_repository_does_not_freeze_its_children() {
    let w = Ws::with_env(Mode::Cgroup, vec![("SMITHFS_SCAFFOLD_GIT_DEADLINE", "3")]);
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root",
        "mkdir children/smith-001 && cd workspace/.git && cp HEAD private-head && rm HEAD && mkfifo HEAD",
    );
    let started = Instant::now();
    let r = w.as_smith(
        "smith-root",
        "smiths/smith-root",
        "mkdir children/smith-002; echo \"rc=$?\"; cat $SMITH_MOUNT/.smithfs/why",
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(60), "the mkdir took {took:?}");
    assert!(r.stdout.contains("rc=1"), "{r:?}");
    assert!(r.stdout.contains("scaffold-workspace"), "{r:?}");
    assert!(r.stdout.contains("killed after 3 s"), "{r:?}");
    assert!(!w.abs("smiths/smith-root/children/smith-002").exists());
    assert!(w.abs(CHILD).join("inbox").is_dir(), "the existing child");
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root",
        "cd workspace/.git && rm HEAD && mv private-head HEAD && cd ../.. && mkdir children/smith-002",
    );
    assert!(w
        .abs("smiths/smith-root/children/smith-002/workspace/.git")
        .exists());
}

/// A tree with workspaces below a directory other users cannot search gets a warning at mount
/// naming the directory (notes W19: every child's workspace would fail with EIO); below a
/// searchable one, none.
#[test]
fn mount_warns_of_an_unsearchable_ancestor() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    make_repo(&repo);
    for (mode, warned) in [(0o700, true), (0o755, false)] {
        let parent = tmp.path().join(format!("p{mode:o}"));
        std::fs::create_dir(&parent).unwrap();
        let d = parent.join("tree");
        let r = smithfs([
            OsStr::new("init"),
            d.as_os_str(),
            OsStr::new("--repo"),
            repo.as_os_str(),
        ]);
        assert!(r.ok(), "{}", r.stderr);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(mode)).unwrap();
        let r = smithfs([OsStr::new("mount"), d.as_os_str()]);
        let _ = smithfs([OsStr::new("umount"), d.as_os_str()]);
        assert!(r.ok(), "{}", r.stderr);
        let line = format!("{} (mode {mode:04o}) is not searchable", parent.display());
        assert_eq!(r.stderr.contains(&line), warned, "{mode:o}: {}", r.stderr);
    }
}

/// `diff` and `accept` run git as the smith on the smith's files, and a smith can make one of
/// them a FIFO (notes H23): `workspace/.git/info/exclude` as a FIFO held both for ever. Now the
/// smith-side git has a deadline (here `SMITHFS_SMITH_GIT_DEADLINE=3`): both fail in time,
/// saying so.
fn smith_fifo_git(mode: Mode) {
    let w = Ws::new(mode);
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root/workspace/.git/info",
        "rm -f exclude && mkfifo exclude",
    );
    let dir = w.m.path().as_os_str().to_owned();
    for sub in ["diff", "accept"] {
        let started = std::time::Instant::now();
        let r = run(Command::new(SMITHFS)
            .env("SMITHFS_SMITH_GIT_DEADLINE", "3")
            .arg(sub)
            .arg(&dir)
            .arg("smith-root"));
        let took = started.elapsed();
        assert!(!r.ok(), "[{mode:?}] {sub} succeeded: {}", r.stdout);
        assert!(
            r.stderr.contains("did not finish within 3 s"),
            "[{mode:?}] {sub}: {}",
            r.stderr
        );
        assert!(
            took < Duration::from_secs(30),
            "[{mode:?}] {sub} took {took:?}"
        );
    }
    // Release any reader still blocked in the FIFO's open, then remove it.
    let fifo = w.abs("smiths/smith-root/workspace/.git/info/exclude");
    for _ in 0..3 {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
    }
    let _ = std::fs::remove_file(&fifo);
}

#[test]
fn a_fifo_in_the_smiths_git_fails_diff_and_accept_in_time_cgroup() {
    smith_fifo_git(Mode::Cgroup);
}

#[test]
fn a_fifo_in_the_smiths_git_fails_diff_and_accept_in_time_ancestry() {
    smith_fifo_git(Mode::Ancestry);
}

/// Hostile review 18b, finding 103 (notes W23): the smith moves its branch back and forth
/// between its commit and an unrelated one while the operator accepts. `accept` read one
/// commit and fetched whatever the bundle's ref named a moment later: it failed ("did not
/// move to …") with PATH's branch already moved to the other commit. Now PATH's branch is
/// either the commit `accept` printed, or left as it was.
#[test]
fn accept_takes_the_commit_it_names_or_nothing() {
    let w = Ws::new(Mode::Cgroup);
    let ids = w.as_smith_ok(
        "smith-root",
        ROOT_WS,
        "echo x >> a.txt && git commit -qam mine && x=$(git rev-parse HEAD) \
         && t=$(git mktree </dev/null) && y=$(echo other | git commit-tree $t) && echo $x $y",
    );
    let (x, y) = ids.trim().split_once(' ').expect("two commits");
    let mut flipper = Command::new(SMITHFS)
        .args(["run", "--mount"])
        .arg(w.m.path())
        .args(["--smith", "smith-root", "--", "bash", "-c"])
        .arg(format!(
            "while :; do git update-ref refs/heads/smith/smith-root {y}; \
             git update-ref refs/heads/smith/smith-root {x}; done"
        ))
        .current_dir(w.abs(ROOT_WS))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the flipper");
    let mut outcomes = (0, 0);
    let mut wrong = Vec::new();
    for i in 0..24 {
        let branch = format!("t{i}");
        let a = accept(w.m.path(), "smith-root", Some(&branch));
        let now = run(as_owner(
            &w.repo,
            Command::new("git").arg("-C").arg(&w.repo).args([
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{branch}"),
            ]),
        ));
        if a.ok() {
            outcomes.0 += 1;
            let printed = a.stdout.split_whitespace().nth(1).unwrap_or_default();
            if now.stdout.trim() != printed {
                wrong.push(format!(
                    "{branch}: printed {printed}, is {}",
                    now.stdout.trim()
                ));
            }
        } else {
            outcomes.1 += 1;
            if now.ok() {
                wrong.push(format!(
                    "{branch}: accept failed ({}) but the branch moved to {}",
                    a.stderr.trim(),
                    now.stdout.trim()
                ));
            }
        }
    }
    // The flipper is ours: stopped before any assertion, so the mount can go.
    let _ = flipper.kill();
    let _ = flipper.wait();
    assert!(wrong.is_empty(), "{wrong:#?}");
    eprintln!("accepted {} refused {}", outcomes.0, outcomes.1);
}

/// Hostile review 18b, finding 101 (notes W21, W22): a smith names its filter drivers so that
/// git's `-c NAME=` cannot empty them — a `=` in the name (`-c filter.a=b.clean=` sets
/// `filter.a`) or a byte that is not UTF-8 — and has them copy their environment into its own
/// repository. The operator's `diff` and `accept` ran them (as the smith, in its sandbox) with
/// the operator's whole environment; now both refuse in one line and nothing runs.
#[test]
fn drivers_named_past_the_overrides_run_nothing() {
    let w = Ws::new(Mode::Cgroup);
    w.as_smith_ok(
        "smith-root",
        ROOT_WS,
        r#"git config 'filter.a=b.clean' 'sh -c "env > .git/stolen-a; cat"'
           printf '[filter "\377"]\n\tclean = "sh -c \x27env > .git/stolen-ff; cat\x27"\n' >> .git/config
           printf '*.txt filter=a=b\n*.rs filter=\377\n' > .gitattributes
           echo c >> a.txt && echo w >> src/main.rs"#,
    );
    let git_dir = w.abs(&format!("{ROOT_WS}/.git"));
    let stolen = || {
        ["stolen-a", "stolen-ff"]
            .into_iter()
            .filter(|f| git_dir.join(f).exists())
            .collect::<Vec<_>>()
    };
    for sub in ["diff", "accept"] {
        let r = run(Command::new(SMITHFS)
            .env("SMITHFS_TEST_OPERATOR_SECRET", "sk-operator-secret")
            .arg(sub)
            .arg(w.m.path())
            .arg("smith-root"));
        assert!(!r.ok(), "{sub} succeeded: {}", r.stdout);
        assert!(
            r.stderr.contains("cannot override") && r.stderr.lines().count() == 1,
            "{sub}: {}",
            r.stderr
        );
        assert!(stolen().is_empty(), "{sub} ran the smith's {:?}", stolen());
    }
    // Without the armed drivers the same work tree diffs as before.
    w.as_smith_ok(
        "smith-root",
        ROOT_WS,
        "head -n -2 .git/config > .git/c && mv .git/c .git/config && git config --remove-section 'filter.a=b'",
    );
    let d = smithfs([
        OsString::from("diff"),
        w.m.path().into(),
        "smith-root".into(),
    ]);
    assert!(
        d.ok() && d.stdout.contains("+w"),
        "{}{}",
        d.stdout,
        d.stderr
    );
    assert!(stolen().is_empty(), "{:?}", stolen());
}

/// UI14, revised (hostile review 18b): a file over 1 GiB — here sparse, 200 GB, with a name
/// made to be a pathspec, a glob and a line break — is left out of `diff` by its exact name
/// and named on stderr; every other change is shown, at once.
#[test]
fn a_huge_file_is_left_out_of_the_diff_by_its_name() {
    let w = Ws::new(Mode::Cgroup);
    w.as_smith_ok(
        "smith-root",
        ROOT_WS,
        "truncate -s 200G \"$(printf ':(glob)*\\nbig')\" && echo c >> a.txt && echo new > '*'",
    );
    for stat in [true, false] {
        let mut args = vec![
            OsString::from("diff"),
            w.m.path().into(),
            "smith-root".into(),
        ];
        if stat {
            args.push("--stat".into());
        }
        let t = Instant::now();
        let d = run(Command::new(SMITHFS)
            .env("SMITHFS_SMITH_GIT_DEADLINE", "20")
            .args(&args));
        let took = t.elapsed();
        assert!(d.ok(), "stat {stat}: {}", d.stderr);
        assert!(took < Duration::from_secs(15), "stat {stat}: took {took:?}");
        let want = if stat { "a.txt" } else { "+c" };
        assert!(d.stdout.contains(want), "stat {stat}: {}", d.stdout);
        assert!(
            d.stdout.contains('*'),
            "the file named * is diffed: {}",
            d.stdout
        );
        assert!(!d.stdout.contains("big"), "stat {stat}: {}", d.stdout);
        assert!(
            d.stderr.contains("left out of the diff") && d.stderr.contains(":(glob)*^Jbig"),
            "stat {stat}: {}",
            d.stderr
        );
    }
    // Finding 105 (notes W24): `core.worktree` pointed git at another directory of the smith's
    // — past the look for big files, which sees the workspace only. The diff is the
    // workspace's, whatever the config says.
    w.as_smith_ok(
        "smith-root",
        "smiths/smith-root",
        "truncate -s 200G private/elsewhere.bin && echo p > private/p.txt          && git -C workspace config core.worktree ../../private",
    );
    let t = Instant::now();
    let d = run(Command::new(SMITHFS)
        .env("SMITHFS_SMITH_GIT_DEADLINE", "20")
        .args(["diff", "--stat"])
        .arg(w.m.path())
        .arg("smith-root"));
    let took = t.elapsed();
    assert!(d.ok(), "core.worktree: {}", d.stderr);
    assert!(
        took < Duration::from_secs(15),
        "core.worktree: took {took:?}"
    );
    assert!(
        d.stdout.contains("a.txt") && !d.stdout.contains("p.txt"),
        "core.worktree: {}",
        d.stdout
    );
}

/// Hostile review 18b, finding 106 (notes W25): a submodule's own config (`.git/modules/sm/`)
/// names a filter the overrides never listed — they come from the superproject's config — and a
/// file of the submodule is touched. `git diff` and `accept`'s `diff-index` ran a git inside
/// the submodule to see whether it is dirty, which ran the filter. Now both look at a
/// submodule's commit only, and nothing runs.
#[test]
fn a_submodules_own_drivers_run_nothing() {
    let w = Ws::new(Mode::Cgroup);
    w.as_smith_ok(
        "smith-root",
        ROOT_WS,
        r#"set -e
           ws=$(pwd)
           git init -q ../private/subsrc
           git -C ../private/subsrc -c user.name=a -c user.email=b commit -q --allow-empty -m e
           echo s > ../private/subsrc/s.txt
           git -C ../private/subsrc add s.txt
           git -C ../private/subsrc -c user.name=a -c user.email=b commit -qm s
           git -c protocol.file.allow=always submodule -q add "$ws/../private/subsrc" sm
           git commit -qm sm
           git -C sm config filter.evil.clean "touch $ws/.git/pwned-sub; cat"
           echo '* filter=evil' > sm/.gitattributes
           sleep 1.1
           touch sm/s.txt
           echo c >> a.txt"#,
    );
    let mark = w.abs(&format!("{ROOT_WS}/.git/pwned-sub"));
    let d = smithfs([
        OsString::from("diff"),
        w.m.path().into(),
        "smith-root".into(),
    ]);
    assert!(d.ok(), "{}", d.stderr);
    assert!(d.stdout.contains("+c"), "{}", d.stdout);
    assert!(!mark.exists(), "smithfs diff ran the submodule's filter");
    let a = accept(w.m.path(), "smith-root", None);
    assert!(a.ok(), "{}", a.stderr);
    assert!(!mark.exists(), "smithfs accept ran the submodule's filter");
}
