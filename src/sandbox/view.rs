//! The plan of a run's view (docs/SPEC.md §12 "What a run sees"), computed where the run is
//! started (the daemon, `smithfs run`) and handed to the sandbox's init as one JSON argument.
//!
//! Visible outside the smithfs mount, read-only: the system directories [`SYSTEM`] (a symlink
//! among them, `/bin -> usr/bin`, stays a symlink), every file named by absolute path in the
//! *mount-wide* `agent.command` (program and script arguments; only that file of its
//! directory, reachable even under a directory the run's uid cannot search), and
//! `sandbox.readable`; read-write: `sandbox.writable`. The rest of the view (the smithfs mount at
//! its own path, a private `/tmp` `/var/tmp` `/dev/shm`, `/dev`, `/proc`, `/sys`, the passwd and
//! group files) is built by the init from the other fields.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Config;

/// The system directories a run may read (docs/SPEC.md §12), those of them that exist.
pub const SYSTEM: [&str; 9] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// What a visible host path is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A directory, bound recursively.
    Dir,
    /// A file (a bind of that file only).
    File,
    /// A symlink of the system directories, made again in the view with this target.
    Symlink(PathBuf),
}

/// One host path of the view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Visible {
    /// Absolute, the same inside the view.
    pub path: PathBuf,
    /// What it is.
    pub kind: Kind,
    /// `sandbox.writable` (else read-only).
    pub writable: bool,
}

/// The plan the init builds a run's view from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The agents' uid and gid (never 0).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// The name of `uid` in the view's passwd (the host's name for it, else `agent`); `USER`
    /// and `LOGNAME`.
    pub user: String,
    /// The host paths visible in the view, parents before children.
    pub visible: Vec<Visible>,
    /// The smithfs mount, at its own path in the view.
    pub mount: PathBuf,
    /// The size of the private `/tmp`, `/var/tmp` and `/dev/shm` together, bytes.
    pub tmp_size: u64,
    /// The agent's working directory (`None`: `/`).
    pub cwd: Option<PathBuf>,
    /// Where the agent starts when `cwd` is not in the view (`smithfs run` from a directory
    /// outside it starts in the smith dir).
    pub fallback_cwd: Option<PathBuf>,
    /// Whether fd 3 is the spawn's error pipe ([`crate::process::sandbox::REPORT_FD`]); else
    /// failures are written on stderr.
    pub report: bool,
    /// The highest capability number of this kernel.
    pub last_cap: u32,
    /// The kernel-enforced layers' options (`sandbox.network`, `sandbox.user_namespaces`).
    #[serde(default)]
    pub layers: crate::sandbox::layers::Options,
    /// The run is in a user namespace of its own, made by the process that starts it because
    /// that process is not root ([`crate::process::sandbox::UserNs`], docs/SPEC.md §12 "Without
    /// root"): `uid` and `gid` are that process's, and `setgroups` is denied.
    #[serde(default)]
    pub user_namespace: bool,
    /// The layers removed from the run (docs/PROTOCOL-NOTES.md SB14: a test knob of the daemon's
    /// environment, [`crate::sandbox::layers::WITHOUT_VAR`]); none in normal operation.
    #[serde(default)]
    pub removed: crate::sandbox::layers::Removed,
}

impl Plan {
    /// The plan for runs of a mount at `mount` with the mount-wide `config` (see the module
    /// header); `cwd`, `fallback_cwd` and `report` are set by the caller per run.
    pub fn for_mount(config: &Config, mount: &Path) -> Plan {
        let (uid, gid) = super::agents_ids(&config.sandbox);
        let mut visible: Vec<Visible> = SYSTEM
            .iter()
            .filter_map(|p| host_path(Path::new(p), false, true))
            .collect();
        let programs = config.agent.command.iter().flatten();
        for arg in programs {
            let p = Path::new(arg);
            // Absolute paths only, placeholders not filled (those name the mount).
            if p.is_absolute() && !arg.contains('{') && !p.starts_with(mount) {
                if let Some(v) = host_path(p, false, false).filter(|v| v.kind == Kind::File) {
                    visible.push(v);
                }
            }
        }
        for p in &config.sandbox.readable {
            visible.extend(visible_path(p, false));
        }
        for p in &config.sandbox.writable {
            visible.extend(visible_path(p, true));
        }
        // Parents before children: a file under a bound directory is bound on top of it.
        visible.sort_by_key(|v| v.path.components().count());
        visible.dedup_by(|a, b| a.path == b.path);
        Plan {
            uid,
            gid,
            user: user_name(uid).unwrap_or_else(|| "agent".to_string()),
            visible,
            mount: mount.to_path_buf(),
            tmp_size: config.sandbox.tmp_size.0,
            cwd: None,
            fallback_cwd: None,
            report: true,
            last_cap: crate::process::sandbox::last_cap(),
            layers: crate::sandbox::layers::Options::of(&config.sandbox),
            user_namespace: crate::process::sandbox::needs_user_namespace(),
            removed: crate::sandbox::layers::Removed::of_this_daemon(),
        }
    }

    /// This plan, made by the daemon for a run on another host (`smithfs attach`, docs/SPEC.md
    /// §13, docs/PROTOCOL-NOTES.md R30), fitted to this host: every visible path looked up
    /// again here — a system directory as it is here (a symlink kept as one), any other path
    /// only as the same kind as on the daemon's host (a file stays a file) — and one that does
    /// not exist here (or is another kind) left out; the kernel's last capability and whether
    /// the run needs a user namespace are this host's; the mount is `mount` (where `attach`
    /// mounted the tree); the init reports on the spawn's error pipe. Everything else — the
    /// uid and gid, `tmp_size`, the layers' options and the layers removed, the working
    /// directory — stays the daemon's. Returns the paths left out, one sentence each.
    pub fn fit_to_this_host(&mut self, mount: &Path) -> Vec<String> {
        let mut skipped = Vec::new();
        let visible = std::mem::take(&mut self.visible);
        for v in visible {
            let system = SYSTEM.iter().any(|s| Path::new(s) == v.path);
            let here = host_path(&v.path, v.writable, system);
            match here {
                Some(h) if system || h.kind == v.kind => self.visible.push(h),
                Some(_) => skipped.push(format!(
                    "{} is another kind of file on this host than on the daemon's: the run does not see it",
                    v.path.display()
                )),
                None => skipped.push(format!(
                    "{} does not exist on this host: the run does not see it",
                    v.path.display()
                )),
            }
        }
        self.mount = mount.to_path_buf();
        self.report = true;
        self.last_cap = crate::process::sandbox::last_cap();
        self.user_namespace = crate::process::sandbox::needs_user_namespace();
        skipped
    }

    /// Whether the view shows host directory `dir` as itself: inside the smithfs mount or a
    /// visible directory (the private `/tmp` and `/var/tmp` are not the host's).
    pub fn shows(&self, dir: &Path) -> bool {
        dir.starts_with(&self.mount)
            || self
                .visible
                .iter()
                .any(|v| v.kind == Kind::Dir && dir.starts_with(&v.path))
    }

    /// The init's arguments for this plan (one JSON text).
    pub fn init_args(&self) -> Vec<String> {
        vec![serde_json::to_string(self).unwrap_or_default()]
    }

    /// The plan of the init's arguments.
    ///
    /// # Errors
    /// A malformed plan (the JSON error).
    pub fn parse(arg: &str) -> Result<Plan, serde_json::Error> {
        serde_json::from_str(arg)
    }
}

/// `p` as a visible path if it exists (a symlink kept as one when `keep_symlink`, else
/// followed), as a file or directory; `None` otherwise.
fn host_path(p: &Path, writable: bool, keep_symlink: bool) -> Option<Visible> {
    let lmeta = std::fs::symlink_metadata(p).ok()?;
    if keep_symlink && lmeta.file_type().is_symlink() {
        let target = std::fs::read_link(p).ok()?;
        return Some(Visible {
            path: p.to_path_buf(),
            kind: Kind::Symlink(target),
            writable,
        });
    }
    let meta = std::fs::metadata(p).ok()?;
    let kind = if meta.is_dir() {
        Kind::Dir
    } else if meta.is_file() {
        Kind::File
    } else {
        return None;
    };
    Some(Visible {
        path: p.to_path_buf(),
        kind,
        writable,
    })
}

/// A `readable`/`writable` path: followed if a symlink; missing paths are left out (logged).
fn visible_path(p: &Path, writable: bool) -> Option<Visible> {
    let v = host_path(p, writable, false);
    if v.is_none() {
        tracing::warn!(
            "sandbox: {} is not a file or directory; runs do not see it",
            p.display()
        );
    }
    v
}

/// The host's name for `uid` (`/etc/passwd`).
pub fn user_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let id = f.nth(1)?.parse::<u32>().ok()?;
        (id == uid).then(|| name.to_string())
    })
}

/// The view's `/etc/passwd`: the host's (`host`) with one entry for the agents' uid (home
/// `home`) in place of any line of its name or uid.
pub fn passwd(plan: &Plan, home: &Path, host: &str) -> String {
    super::user::view_file(
        host,
        &super::user::passwd_entry(&plan.user, plan.uid, plan.gid, home),
    )
}

/// The view's `/etc/group`: the host's (`host`) with one entry for the agents' gid.
pub fn group(plan: &Plan, host: &str) -> String {
    super::user::view_file(host, &super::user::group_entry(&plan.user, plan.gid))
}

/// The uid owning `p` (for `doctor`), if it exists.
pub fn owner(p: &Path) -> Option<u32> {
    std::fs::metadata(p).ok().map(|m| m.uid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_has_the_system_dirs_the_programs_and_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let prog = dir.path().join("agent.sh");
        std::fs::write(&prog, "#!/bin/sh\n").expect("write");
        let mut config = Config::default();
        config.agent.command = Some(vec![
            "bash".into(),
            prog.to_string_lossy().into_owned(),
            "{mount}/x".into(),
            "/nonexistent/file".into(),
        ]);
        let plan = Plan::for_mount(&config, Path::new("/srv/fleet"));
        assert!(plan.visible.iter().any(|v| v.path == Path::new("/usr")));
        assert!(plan
            .visible
            .iter()
            .any(|v| v.path == prog && v.kind == Kind::File));
        assert!(!plan
            .visible
            .iter()
            .any(|v| v.path.starts_with("/nonexistent")));
        assert!(plan.visible.iter().all(|v| !v.writable));
        assert_ne!(plan.uid, 0);
        let back = Plan::parse(&plan.init_args()[0]).expect("parse");
        assert_eq!(back, plan);
        let pw = passwd(&plan, Path::new("/tmp"), "root:x:0:0:root:/root:/bin/sh\n");
        assert!(pw.starts_with("root:x:0:0:"), "{pw}");
        assert!(pw.contains(&format!(":{}:{}:", plan.uid, plan.gid)), "{pw}");
    }

    #[test]
    fn a_plan_fitted_to_another_host_leaves_out_what_is_not_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let prog = dir.path().join("agent.sh");
        let gone = dir.path().join("gone.sh");
        let now_dir = dir.path().join("was-a-file");
        for f in [&prog, &gone, &now_dir] {
            std::fs::write(f, "#!/bin/sh\n").expect("write");
        }
        let mut config = Config::default();
        config.agent.command = Some(vec![
            prog.to_string_lossy().into_owned(),
            gone.to_string_lossy().into_owned(),
            now_dir.to_string_lossy().into_owned(),
        ]);
        let mut plan = Plan::for_mount(&config, Path::new("/srv/fleet"));
        plan.cwd = Some(PathBuf::from("/srv/fleet/smiths/smith-root"));
        let daemons = plan.clone();
        // The "node": one file missing, one a directory now.
        std::fs::remove_file(&gone).expect("rm");
        std::fs::remove_file(&now_dir).expect("rm");
        std::fs::create_dir(&now_dir).expect("mkdir");
        let skipped = plan.fit_to_this_host(Path::new("/mnt/fleet"));
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].contains("gone.sh") || skipped[1].contains("gone.sh"));
        assert!(
            skipped.iter().any(|l| l.contains("another kind")),
            "{skipped:?}"
        );
        let paths: Vec<&Path> = plan.visible.iter().map(|v| v.path.as_path()).collect();
        assert!(paths.contains(&prog.as_path()));
        assert!(!paths.contains(&gone.as_path()) && !paths.contains(&now_dir.as_path()));
        assert!(paths.contains(&Path::new("/usr")));
        // The daemon's word stays: ids, working directory, layers; the mount is the node's.
        assert_eq!((plan.uid, plan.gid), (daemons.uid, daemons.gid));
        assert_eq!(plan.cwd, daemons.cwd);
        assert_eq!(plan.removed, daemons.removed);
        assert_eq!(plan.mount, Path::new("/mnt/fleet"));
        assert!(plan.report);
    }
}
