//! The unprivileged test user `smithfs-test` and a smithfs directory it owns and mounts
//! (tests/e2e/unprivileged.rs, tests/differential.rs, tests/e2e/sandbox_run.rs).

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::*;

pub const USER: &str = "smithfs-test";

/// uid and gid of the test user, created (a system user without a home) if missing. Call with
/// the `DevFuseLock` held, so that two tests do not race on useradd.
pub fn test_user() -> (u32, u32) {
    let id = |flag: &str| run(Command::new("id").arg(flag).arg(USER));
    if !id("-u").ok() {
        run(Command::new("useradd")
            .args(["--system", "--no-create-home", "--home-dir", "/nonexistent"])
            .args(["--shell", "/usr/sbin/nologin", USER]))
        .expect_ok("useradd smithfs-test");
    }
    let uid = id("-u").expect_ok("id -u").trim().parse().unwrap();
    let gid = id("-g").expect_ok("id -g").trim().parse().unwrap();
    (uid, gid)
}

/// The setup of most tests here: /dev/fuse open to everyone for the test's life (the grant,
/// which holds the `DevFuseLock`) and the test user's uid and gid. `None`, with a `skipped:`
/// line, when not root.
pub fn granted_user() -> Option<(DevFuseGrant, u32, u32)> {
    if !is_root() {
        eprintln!("skipped: needs root to create the test user and grant /dev/fuse");
        return None;
    }
    let grant = DevFuseGrant::new();
    let (uid, gid) = test_user();
    Some((grant, uid, gid))
}

/// `smithfs ARGS…` as `uid:gid`.
pub fn smithfs_as(uid: u32, gid: u32, args: &[&OsStr]) -> Run {
    sandboxed_as(uid, gid, &[], args)
}

/// A smithfs directory owned by the test user in a private temp dir; unmounted on drop (as the
/// user, then `umount -l` as root), its daemon reaped, the temp dir removed.
pub struct UserMount {
    pub tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub uid: u32,
    pub gid: u32,
}

impl UserMount {
    pub fn init(uid: u32, gid: u32) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("smithfs-unpriv-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = tmp.path().join("m");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        smithfs_as(uid, gid, &[OsStr::new("init"), dir.as_os_str()]).expect_ok("init as user");
        UserMount { tmp, dir, uid, gid }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// `bash -c SCRIPT` as the user, inside the mount (root cannot even chdir there without
    /// allow_other, so the user's shell does the `cd`).
    pub fn sh(&self, script: &str) -> Run {
        let parent = self.dir.parent().unwrap();
        sh_as(self.uid, self.gid, parent, &format!("cd m && {script}"))
    }

    /// Run `n` of the smith dir `smith_dir` (`smiths/…`) once it ended, read as the user: its
    /// `messages.log` and its `meta.json` (waiting up to `secs` seconds for its `end`).
    pub fn ended_run(&self, smith_dir: &str, n: u32, secs: u64) -> (String, serde_json::Value) {
        let conv = format!("{smith_dir}/conversations/run-{n:04}");
        let meta = poll_until(secs, "the run to end", || {
            let text = self.sh(&format!("cat {conv}/meta.json")).stdout;
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            (!v["end"].is_null()).then_some(v)
        });
        let log = self.sh(&format!("cat {conv}/messages.log")).stdout;
        (log, meta)
    }
}

impl Drop for UserMount {
    fn drop(&mut self) {
        if is_smithfs_mounted(&self.dir) {
            let r = smithfs_as(
                self.uid,
                self.gid,
                &[OsStr::new("umount"), self.dir.as_os_str()],
            );
            if !r.ok() || is_smithfs_mounted(&self.dir) {
                eprintln!("UserMount: umount as user failed: {r:?}; umount -l as root");
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            }
        }
        if let Some(pid) = find_daemon(&self.dir) {
            let end = std::time::Instant::now() + Duration::from_secs(5);
            // SAFETY: signal 0 only probes for existence.
            while std::time::Instant::now() < end && unsafe { libc::kill(pid, 0) } == 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
            // SAFETY: kill of the daemon this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// `smithfs ARGS…` as `uid:gid` (the sandbox is on by default) and `vars` in its environment.
pub fn sandboxed_as(uid: u32, gid: u32, vars: &[(&str, &OsStr)], args: &[&OsStr]) -> Run {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg("--")
        .arg(SMITHFS)
        .args(args);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    run(&mut cmd)
}
