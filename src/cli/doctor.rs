//! `smithfs doctor`: what this machine offers smithfs (PROTOCOL.md §6): `/dev/fuse`,
//! `fusermount3`, the kernel and FUSE passthrough (Linux ≥ 6.9), the cgroup2 hierarchy and
//! whether we may create cgroups (identity `auto` → `cgroup`), and privileges. One line per
//! check; exit 1 if something needed to mount is missing.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;

/// Arguments of `smithfs doctor` (none).
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {}

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

fn report(level: Level, what: &str, detail: &str) {
    let tag = match level {
        Level::Ok => "ok  ",
        Level::Warn => "warn",
        Level::Fail => "FAIL",
    };
    println!("{tag}  {what:<14} {detail}");
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(prog))
            .find(|c| c.is_file())
    })
}

/// `6.18.44-foo` → (6, 18).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn uname_release() -> String {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: uname NUL-terminates its fields.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// The cgroup2 mount point and this process's cgroup path in it.
fn cgroup2() -> Option<(PathBuf, PathBuf)> {
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    let mounts = crate::identity::procfs::parse_mountinfo(&info).ok()?;
    let mnt = mounts
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")?
        .mount_point;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some((mnt, PathBuf::from(rel.trim_start_matches('/'))))
}

fn check_fuse(root: bool) -> Level {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => {
            report(Level::Ok, "/dev/fuse", "present and accessible");
            Level::Ok
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            report(
                Level::Fail,
                "/dev/fuse",
                "missing: load the fuse module (modprobe fuse)",
            );
            Level::Fail
        }
        Err(e) => {
            let level = if root { Level::Fail } else { Level::Warn };
            report(
                level,
                "/dev/fuse",
                &format!("{e}: mounting goes through fusermount3"),
            );
            level
        }
    }
}

fn check_cgroups() {
    let Some((mnt, own)) = cgroup2() else {
        report(
            Level::Warn,
            "cgroups",
            "no cgroup2 hierarchy: identity auto → ancestry",
        );
        return;
    };
    let probe = mnt
        .join(&own)
        .join(format!("smithfs-doctor-{}", std::process::id()));
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
            report(
                Level::Ok,
                "cgroups",
                &format!(
                    "cgroup2 at {}; can create cgroups under /{}: identity auto → cgroup",
                    mnt.display(),
                    own.display()
                ),
            );
        }
        Err(e) => report(
            Level::Warn,
            "cgroups",
            &format!(
                "cgroup2 at {} but cannot create cgroups ({e}): identity auto → ancestry",
                mnt.display()
            ),
        ),
    }
}

/// Which cgroup backend can enforce `limits.per_smith` / `limits.per_subtree` (PROTOCOL.md §5,
/// §6): the controllers `memory`, `pids` and `cpu`, on v2 (the unified hierarchy) or v1.
fn check_limits() {
    use crate::limits::cgroup::{detect_here, Place};
    let a = detect_here();
    let missing: Vec<&str> = crate::limits::Controller::ALL
        .iter()
        .filter(|c| !a.controllers.contains_key(c))
        .map(|c| c.as_str())
        .collect();
    let mut detail = format!("cgroup limits backend: {}", a.describe());
    if a.controllers
        .values()
        .any(|p| matches!(p, Place::V1 { .. }))
    {
        detail.push_str("; hybrid host: runs are placed in the v1 hierarchies before exec");
    }
    if let Some(base) = a.v2_base.as_ref().filter(|_| {
        a.controllers
            .values()
            .any(|p| matches!(p, Place::V2 { .. }))
    }) {
        detail.push_str(&format!(
            "; v2 controllers are delegated from {} (the root cgroup, or a delegated scope)",
            base.display()
        ));
    }
    if missing.is_empty() {
        report(Level::Ok, "limits", &detail);
    } else {
        report(
            Level::Warn,
            "limits",
            &format!(
                "{detail}; no {} controller: limits that need it refuse the mount",
                missing.join(", ")
            ),
        );
    }
}

/// FUSE over io_uring: the kernel (≥ 6.14 with `CONFIG_FUSE_IO_URING`) and the machine-wide
/// `enable_uring` switch that `mount --transport auto` follows.
fn check_uring(version: Option<(u32, u32)>) {
    use crate::fuse::transport::{enable_uring, ENABLE_URING};
    match enable_uring() {
        Some(true) => report(
            Level::Ok,
            "io_uring",
            &format!("{ENABLE_URING} is on: mounts use FUSE over io_uring (transport auto)"),
        ),
        Some(false) => report(
            Level::Ok,
            "io_uring",
            &format!(
                "available but off: mounts use /dev/fuse; turn on with `echo 1 > {ENABLE_URING}` (root, machine-wide) before mounting"
            ),
        ),
        None if version.is_some_and(|v| v < (6, 14)) => report(
            Level::Ok,
            "io_uring",
            "no FUSE over io_uring before kernel 6.14: mounts use /dev/fuse",
        ),
        None => report(
            Level::Ok,
            "io_uring",
            "kernel built without CONFIG_FUSE_IO_URING (or fuse not loaded): mounts use /dev/fuse",
        ),
    }
}

/// Run `smithfs doctor`.
pub fn run(_args: DoctorArgs) -> Result<ExitCode> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut failed = check_fuse(root) == Level::Fail;
    match which("fusermount3") {
        Some(p) => report(Level::Ok, "fusermount3", &p.display().to_string()),
        None if root => report(
            Level::Warn,
            "fusermount3",
            "not installed (root mounts without it)",
        ),
        None => {
            report(
                Level::Fail,
                "fusermount3",
                "not installed: apt-get install fuse3",
            );
            failed = true;
        }
    }
    let release = uname_release();
    match kernel_version(&release) {
        Some(v) if v >= (6, 9) => report(
            Level::Ok,
            "kernel",
            &format!("{release}: FUSE passthrough available"),
        ),
        Some(_) => report(
            Level::Warn,
            "kernel",
            &format!("{release}: no FUSE passthrough before 6.9 (mount with --no-passthrough)"),
        ),
        None => report(
            Level::Warn,
            "kernel",
            &format!("cannot read the version from `{release}`"),
        ),
    }
    check_uring(kernel_version(&release));
    check_cgroups();
    check_limits();
    if root {
        report(Level::Ok, "privileges", "root");
    } else {
        let allow = std::fs::read_to_string("/etc/fuse.conf")
            .map(|t| t.lines().any(|l| l.trim() == "user_allow_other"))
            .unwrap_or(false);
        report(
            Level::Warn,
            "privileges",
            &format!(
                "unprivileged: mounts via fusermount3; --allow-other {}",
                if allow {
                    "allowed (user_allow_other)"
                } else {
                    "needs user_allow_other in /etc/fuse.conf"
                }
            ),
        );
    }
    if Path::new("/proc/self/mountinfo").exists() {
        report(
            Level::Ok,
            "procfs",
            "/proc mounted (identity resolution reads it)",
        );
    } else {
        report(Level::Fail, "procfs", "/proc is not mounted");
        failed = true;
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::kernel_version;

    #[test]
    fn parses_kernel_releases() {
        assert_eq!(kernel_version("6.18.44-fc-v769"), Some((6, 18)));
        assert_eq!(kernel_version("6.9.0"), Some((6, 9)));
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("x"), None);
    }
}
