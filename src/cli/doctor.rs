//! `smithfs doctor [DIR] [--json]`: what this machine offers smithfs (docs/SPEC.md §6): `/dev/fuse`,
//! `fusermount3`, the kernel and FUSE passthrough (Linux ≥ 6.9), FUSE over io_uring, the cgroup2
//! hierarchy and whether we may create cgroups (identity `auto` → `cgroup`), the cgroup limits
//! backend, privileges, the git version workspaces need, and the sandbox's kernel-enforced
//! layers (Landlock, its scoping, seccomp, namespaces: docs/SPEC.md §12). Every check is a
//! [`Check`]; the text form prints one line each, the JSON form the list
//! `[{"check","status","detail"}]`; exit 1 when a check failed, that is when `smithfs mount` by
//! this user would fail (docs/PROTOCOL-NOTES.md O43). Given a directory, also its `launcher`:
//! `launcher.advertise` and, while it is mounted, its listener (docs/PROTOCOL-NOTES.md R44).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;

/// Arguments of `smithfs doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the checks as JSON: `[{"check","status","detail"}]`, status ok, warn or fail.
    #[arg(long)]
    pub json: bool,
    /// A smithfs directory (mounted or not): also check its `launcher` (docs/SPEC.md §13) —
    /// whether `launcher.advertise` resolves and, while it is mounted, whether its listener
    /// accepts a TLS connection with the certificate it pins.
    pub dir: Option<PathBuf>,
}

/// How a check came out: `fail` means `smithfs mount` cannot work here as this user; `warn`
/// that it works with less (ancestry identity, no passthrough, no limits, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Available.
    Ok,
    /// Works, with less.
    Warn,
    /// Mounting fails until this is fixed.
    Fail,
}

/// One line of `doctor`: what was checked (`/dev/fuse`, `fusermount3`, `kernel`, …), how it came
/// out and a sentence saying what was found and, when it is not `ok`, what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// The name of the check, stable for scripts.
    pub check: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found; for warn/fail, what it costs and how to fix it.
    pub detail: String,
}

impl Check {
    fn new(check: &'static str, status: Status, detail: impl Into<String>) -> Check {
        Check {
            check,
            status,
            detail: detail.into(),
        }
    }

    /// The text form: `ok    /dev/fuse      present and accessible`.
    fn line(&self) -> String {
        let tag = match self.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        format!("{tag}  {:<14} {}", self.check, self.detail)
    }
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
    let mounts = crate::sys::procfs::parse_mountinfo(&info).ok()?;
    let mnt = mounts
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")?
        .mount_point;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some((mnt, PathBuf::from(rel.trim_start_matches('/'))))
}

/// `/dev/fuse`. Root opens it and mounts with mount(2); anyone else needs it readable and
/// writable too: `fusermount3` opens it as the calling user (libfuse 3), then mounts.
fn check_fuse(root: bool) -> Check {
    let c = |status, detail: String| Check::new("/dev/fuse", status, detail);
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => c(Status::Ok, "present and accessible".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => c(
            Status::Fail,
            "missing: load the fuse module (modprobe fuse)".into(),
        ),
        Err(e) if root => c(Status::Fail, format!("{e}")),
        Err(e) => c(
            Status::Fail,
            format!(
                "{e} ({}): an unprivileged mount needs read-write access to /dev/fuse (fusermount3 opens it as the calling user); as root: chmod 0666 /dev/fuse, the mode distributions ship",
                crate::fuse::mount::dev_fuse_mode()
            ),
        ),
    }
}

/// `fusermount3`: how an unprivileged user mounts and unmounts (setuid root).
fn check_fusermount(root: bool) -> Check {
    use std::os::unix::fs::MetadataExt;
    let c = |status, detail: String| Check::new("fusermount3", status, detail);
    let Some(path) = crate::fuse::mount::fusermount() else {
        return if root {
            c(
                Status::Warn,
                "not installed (root mounts without it; apt-get install fuse3)".into(),
            )
        } else {
            c(
                Status::Fail,
                "not installed: an unprivileged mount needs it (apt-get install fuse3)".into(),
            )
        };
    };
    let setuid = std::fs::metadata(&path).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o4000 != 0);
    match (setuid, root) {
        (true, _) => c(Status::Ok, path.display().to_string()),
        (false, true) => c(
            Status::Warn,
            format!(
                "{} is not setuid root (root mounts without it)",
                path.display()
            ),
        ),
        (false, false) => c(
            Status::Fail,
            format!(
                "{} is not setuid root: an unprivileged mount needs it (as root: chmod u+s {})",
                path.display(),
                path.display()
            ),
        ),
    }
}

fn check_cgroups() -> Check {
    let c = |status, detail: String| Check::new("cgroups", status, detail);
    let Some((mnt, own)) = cgroup2() else {
        return c(
            Status::Warn,
            "no cgroup2 hierarchy: identity auto → ancestry".into(),
        );
    };
    let probe = mnt
        .join(&own)
        .join(format!("smithfs-doctor-{}", std::process::id()));
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
            c(
                Status::Ok,
                format!(
                    "cgroup2 at {}; can create cgroups under /{}: identity auto → cgroup",
                    mnt.display(),
                    own.display()
                ),
            )
        }
        Err(e) => c(
            Status::Warn,
            format!(
                "cgroup2 at {} but cannot create cgroups ({e}): identity auto → ancestry",
                mnt.display()
            ),
        ),
    }
}

/// Which cgroup backend can enforce `limits.per_smith` / `limits.per_subtree` (docs/SPEC.md §5,
/// §6): the controllers `memory`, `pids` and `cpu`, on v2 (the unified hierarchy) or v1.
fn check_limits() -> Check {
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
        Check::new("limits", Status::Ok, detail)
    } else {
        Check::new(
            "limits",
            Status::Warn,
            format!(
                "{detail}; no {} controller: limits that need it refuse the mount",
                missing.join(", ")
            ),
        )
    }
}

/// The kernel release and FUSE passthrough (≥ 6.9).
fn check_kernel(release: &str) -> Check {
    let c = |status, detail: String| Check::new("kernel", status, detail);
    match kernel_version(release) {
        Some(v) if v >= (6, 9) => c(Status::Ok, format!("{release}: FUSE passthrough available")),
        Some(_) => c(
            Status::Warn,
            format!("{release}: no FUSE passthrough before 6.9 (mount with --no-passthrough)"),
        ),
        None => c(
            Status::Warn,
            format!("cannot read the version from `{release}`"),
        ),
    }
}

/// FUSE over io_uring: the kernel (≥ 6.14 with `CONFIG_FUSE_IO_URING`) and the machine-wide
/// `enable_uring` switch that `mount --transport auto` follows.
fn check_uring(version: Option<(u32, u32)>) -> Check {
    use crate::fuse::transport::{enable_uring, ENABLE_URING};
    let detail = match enable_uring() {
        Some(true) => {
            format!("{ENABLE_URING} is on: mounts use FUSE over io_uring (transport auto)")
        }
        Some(false) => format!(
            "available but off: mounts use /dev/fuse; turn on with `echo 1 > {ENABLE_URING}` (root, machine-wide) before mounting"
        ),
        None if version.is_some_and(|v| v < (6, 14)) => {
            "no FUSE over io_uring before kernel 6.14: mounts use /dev/fuse".into()
        }
        None => "kernel built without CONFIG_FUSE_IO_URING (or fuse not loaded): mounts use /dev/fuse"
            .into(),
    };
    Check::new("io_uring", Status::Ok, detail)
}

/// Root, or what an unprivileged daemon does without: cgroups are checked on their own line;
/// here `allow_other`, passthrough and workspaces.
fn check_privileges(root: bool) -> Check {
    if root {
        return Check::new("privileges", Status::Ok, "root");
    }
    let allow = std::fs::read_to_string("/etc/fuse.conf")
        .map(|t| t.lines().any(|l| l.trim() == "user_allow_other"))
        .unwrap_or(false);
    Check::new(
        "privileges",
        Status::Warn,
        format!(
            "unprivileged: mounts through fusermount3; --allow-other {}; no FUSE passthrough (needs root); no workspaces (init --repo: the daemon builds them in a private mount namespace, which needs root)",
            if allow {
                "allowed (user_allow_other in /etc/fuse.conf)"
            } else {
                "refused until root adds user_allow_other to /etc/fuse.conf"
            }
        ),
    )
}

/// The git that workspaces run (docs/SPEC.md §11): a parent's `git pull` from a child must run
/// nothing the child configured, which needs git ≥ 2.45.1 or one of its backports
/// (`workspace::git::SAFE_PULL_VERSIONS`, docs/PROTOCOL-NOTES.md W4, W13). `version` is the output
/// of `git --version`, `None` when git cannot be run. Only workspaces need git, so the worst is
/// `warn`. Pure.
fn check_git(version: Option<&str>) -> Check {
    use crate::workspace::git::{parse_version, pull_is_safe};
    let c = |status, detail: String| Check::new("git", status, detail);
    let Some(text) = version else {
        return c(
            Status::Warn,
            "git not found: no workspaces (init --repo needs git ≥ 2.45.1)".into(),
        );
    };
    let text = text.trim();
    match parse_version(text) {
        Some(v) if pull_is_safe(v) => c(
            Status::Ok,
            format!("{text}: workspaces isolated (a parent's pull from a child runs nothing the child configured: ≥ 2.45.1 or a backport)"),
        ),
        Some(_) => c(
            Status::Warn,
            format!("{text}: too old for workspaces' isolation: a parent's git pull from a child could run code the child planted (CVE-2024-32002/32004/32465, fixed in 2.45.1, 2.44.1, 2.43.4, 2.42.2, 2.41.1, 2.40.2, 2.39.4); upgrade git before using init --repo"),
        ),
        None => c(
            Status::Warn,
            format!("cannot read a version from `{text}`: workspaces need git ≥ 2.45.1"),
        ),
    }
}

/// The kernel-enforced layers of the sandbox (docs/SPEC.md §12 "What the host offers"), one
/// check each, named as `sandbox.require` names them: `landlock` (which the scaffold of a
/// child's workspace needs too, docs/PROTOCOL-NOTES.md W16: the daemon's git reads the parent's
/// repository only inside a Landlock domain), `landlock-scope`, `seccomp`, `namespaces`. A
/// missing one is a warning: the mount goes on without it unless `sandbox.require` names it.
fn check_protections(offered: &[crate::sandbox::layers::Protection]) -> Vec<Check> {
    offered
        .iter()
        .map(|p| {
            let status = if p.available {
                Status::Ok
            } else {
                Status::Warn
            };
            let mut detail = p.detail.clone();
            if p.name == "landlock" {
                detail.push_str(if !p.detail.starts_with("no Landlock") {
                    "; a child's workspace is made in a sandbox"
                } else {
                    "; children of a smith with a workspace cannot be made (init --repo): enable Landlock (CONFIG_SECURITY_LANDLOCK, lsm=landlock,…)"
                });
            }
            Check::new(p.name, status, detail)
        })
        .collect()
}

/// `git --version`, or `None` when git cannot be run.
fn git_version() -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("--version")
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The runs' sandbox (docs/SPEC.md §12): mount and pid namespaces and the agents' uid, as root;
/// a user namespace per run with them in it, not root ("Without root"). Not root and refused
/// a user namespace: warn (such a user mounts with `"sandbox": {"enabled": false}`); root
/// without the namespaces: fail (the mount refuses).
fn check_sandbox(root: bool) -> Check {
    let cfg = crate::config::SandboxConfig::default();
    match crate::sandbox::probe(&cfg) {
        Ok(what) => Check::new("sandbox", Status::Ok, what),
        Err(why) if !root => Check::new(
            "sandbox",
            Status::Warn,
            format!("{why}; mount with \"sandbox\": {{\"enabled\": false}} (no protection against agents that try to get out)"),
        ),
        Err(why) => Check::new(
            "sandbox",
            Status::Fail,
            format!("{why}; runs cannot start in their sandbox"),
        ),
    }
}

/// The test knob of this environment (docs/PROTOCOL-NOTES.md SB14): when
/// `SMITHFS_SANDBOX_WITHOUT` is set, a mount started from here removes those layers from every
/// run (warn), or refuses a value that names something else (fail); unset, no check.
fn check_removed(removed: Result<crate::sandbox::layers::Removed, String>) -> Option<Check> {
    let var = crate::sandbox::layers::WITHOUT_VAR;
    match removed {
        Ok(r) if r.is_none() => None,
        Ok(r) => Some(Check::new(
            "sandbox-without",
            Status::Warn,
            format!(
                "{var} is set: a mount from this environment starts every run without its {} (a test knob, not a sandbox to trust)",
                r.names()
            ),
        )),
        Err(why) => Some(Check::new(
            "sandbox-without",
            Status::Fail,
            format!("{why}: a mount from this environment is refused"),
        )),
    }
}

fn check_procfs() -> Check {
    if Path::new("/proc/self/mountinfo").exists() {
        Check::new(
            "procfs",
            Status::Ok,
            "/proc mounted (identity resolution reads it)",
        )
    } else {
        Check::new("procfs", Status::Fail, "/proc is not mounted")
    }
}

/// The Slurm client commands `launcher.kind` `slurm` runs (docs/SPEC.md §13, notes R17–R19),
/// from `found` (each command and where PATH has it) and `version` (`sbatch --version`'s line).
/// Only the slurm launcher needs them, so the worst is `warn`. Pure.
fn check_slurm(found: &[(&str, Option<PathBuf>)], version: Option<&str>) -> Check {
    let c = |status, detail: String| Check::new("slurm", status, detail);
    let missing: Vec<&str> = found
        .iter()
        .filter(|(_, p)| p.is_none())
        .map(|(n, _)| *n)
        .collect();
    let names = found.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    if missing.is_empty() && version.is_none() {
        return c(
            Status::Warn,
            format!("{names} found, but `sbatch --version` fails: no Slurm configuration is reachable (set SLURM_CONF, or /etc/slurm/slurm.conf), so launcher.kind slurm cannot submit"),
        );
    }
    if missing.is_empty() {
        let v = version.map(str::trim).unwrap_or_default();
        return c(
            Status::Ok,
            format!("{names} found ({v}): launcher.kind slurm can submit, follow and cancel jobs"),
        );
    }
    c(
        Status::Warn,
        format!(
            "{} not on PATH: launcher.kind slurm cannot run (scripts/install-deps.sh installs Slurm's client; other kinds do not need it)",
            missing.join(", ")
        ),
    )
}

/// The Slurm commands the slurm launcher runs and `sbatch --version`.
fn slurm_found() -> (Vec<(&'static str, Option<PathBuf>)>, Option<String>) {
    let found: Vec<_> = ["sbatch", "squeue", "scancel"]
        .into_iter()
        .map(|n| (n, crate::sys::path::find_program(n.as_ref())))
        .collect();
    let version = found[0].1.as_ref().and_then(|p| {
        let out = std::process::Command::new(p)
            .arg("--version")
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    (found, version)
}

/// How long the listener check waits for the connection and the TLS handshake.
const LISTENER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `launcher.advertise`, the address the nodes dial (docs/SPEC.md §13): `fail` when it does
/// not resolve (every job's `attach` would fail to connect); `warn` for the slurm kind when
/// neither it nor `launcher.listen` names an address other nodes can reach (a loopback or
/// wildcard host). `resolve` is `ToSocketAddrs` (a parameter for the tests).
fn check_advertise(
    launcher: &crate::config::LauncherConfig,
    resolve: impl Fn(&str) -> std::io::Result<Vec<std::net::SocketAddr>>,
) -> Option<Check> {
    use crate::config::LauncherKind;
    let c = |status, detail: String| Check::new("advertise", status, detail);
    let listen = launcher.listen_addr()?;
    if let Some(a) = &launcher.advertise {
        return Some(match resolve(a) {
            Ok(addrs) if !addrs.is_empty() => c(
                Status::Ok,
                format!("launcher.advertise {a} resolves ({}): the nodes dial it", addrs[0]),
            ),
            Ok(_) => c(Status::Fail, format!("launcher.advertise {a} resolves to no address: every job's attach would fail to connect")),
            Err(e) => c(Status::Fail, format!("launcher.advertise {a} does not resolve ({e}): every job's attach would fail to connect; fix the name or give an IP address")),
        });
    }
    let host = listen.rsplit_once(':').map_or(listen.as_str(), |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let local_only = matches!(host, "127.0.0.1" | "::1" | "localhost" | "0.0.0.0" | "::")
        || host.starts_with("127.");
    Some(if launcher.kind == LauncherKind::Slurm && local_only {
        c(
            Status::Warn,
            format!("no launcher.advertise, and the nodes would dial launcher.listen {listen}: only jobs on this host can reach it (set launcher.advertise to this host's address on the nodes' network, docs/SCALE.md)"),
        )
    } else {
        c(
            Status::Ok,
            format!("no launcher.advertise: the nodes dial launcher.listen {listen}"),
        )
    })
}

/// `.smithfs-state/listener` of the mount `dir` (`ADDRESS PIN`, written by the daemon at
/// mount): read through the daemon's own descriptor of the store (the mount covers the
/// directory), found by the daemon's pid in `.smithfs/whoami`. Errors: one sentence.
fn listener_of(dir: &Path) -> std::result::Result<(String, [u8; 32]), String> {
    let whoami = std::fs::read_to_string(dir.join(".smithfs/whoami"))
        .map_err(|e| format!("cannot read .smithfs/whoami: {e}"))?;
    let pid: u32 = super::whoami::lookup(&whoami, "daemon pid")
        .and_then(|p| p.trim().parse().ok())
        .ok_or("no daemon pid in .smithfs/whoami")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map_err(|e| format!("cannot list the daemon's descriptors (pid {pid}): {e}"))?;
    let text = fds
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == dir))
        .find_map(|e| {
            std::fs::read_to_string(
                e.path()
                    .join(crate::tree::layout::STATE_DIR)
                    .join("listener"),
            )
            .ok()
        })
        .ok_or("the daemon describes no listener (.smithfs-state/listener)")?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let [addr, pin] = words[..] else {
        return Err(format!(
            ".smithfs-state/listener holds {text:?}, not ADDRESS PIN"
        ));
    };
    let pin = crate::remote::keys::unhex::<32>(pin)
        .ok_or(".smithfs-state/listener's pin is not 64 hex digits")?;
    Ok((addr.to_string(), pin))
}

/// Connect to the listener at `addr` and finish a TLS handshake that pins `pin`, without a
/// ticket (no hello is sent: the listener drops the connection, no run is involved). Errors:
/// one sentence (unreachable, refused, the handshake failed or timed out).
fn probe_listener(addr: &str, pin: [u8; 32]) -> std::result::Result<(), String> {
    use std::net::ToSocketAddrs;
    let sa = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr} does not resolve: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to no address"))?;
    let sock = std::net::TcpStream::connect_timeout(&sa, LISTENER_TIMEOUT)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let cfg = crate::remote::tls::client_config(pin)?;
    let tls = rustls::ClientConnection::new(cfg, crate::remote::tls::server_name())
        .map_err(|e| e.to_string())?;
    let mut ch =
        crate::remote::channel::Channel::new(sock, tls.into()).map_err(|e| e.to_string())?;
    let r = ch
        .handshake(LISTENER_TIMEOUT)
        .map_err(|e| format!("the TLS handshake with {addr} failed: {e}"));
    ch.close();
    r
}

/// The `launcher` checks of the smithfs directory `dir` (docs/SPEC.md §13): its kind, whether
/// `launcher.advertise` resolves, and — while it is mounted with a kind that has a listener —
/// whether the listener accepts a TLS connection with the pinned certificate (`fail` if not: no
/// run can reach the tree). A `local` launcher needs none of it.
fn check_launcher(dir: &Path) -> Vec<Check> {
    let c = |check, status, detail: String| Check::new(check, status, detail);
    let text = match std::fs::read_to_string(dir.join("config.json")) {
        Ok(t) => t,
        Err(e) => {
            return vec![c(
                "launcher",
                Status::Fail,
                format!("cannot read {}/config.json: {e}", dir.display()),
            )]
        }
    };
    let launcher = match crate::config::Config::parse(&text) {
        Ok(cfg) => cfg.launcher,
        Err(e) => return vec![c("launcher", Status::Fail, format!("config.json: {e}"))],
    };
    let kind = launcher.kind.as_str();
    let Some(listen) = launcher.listen_addr() else {
        return vec![c(
            "launcher",
            Status::Ok,
            format!("{kind}: runs start on this host, no listener"),
        )];
    };
    let mut out = vec![c(
        "launcher",
        Status::Ok,
        format!("{kind}: runs reach the tree through the listener (launcher.listen {listen})"),
    )];
    out.extend(check_advertise(&launcher, |a| {
        std::net::ToSocketAddrs::to_socket_addrs(a).map(Iterator::collect)
    }));
    out.push(if !dir.join(".smithfs").is_dir() {
        c(
            "listener",
            Status::Warn,
            format!(
                "{} is not mounted: the listener runs only while it is",
                dir.display()
            ),
        )
    } else {
        match listener_of(dir).and_then(|(addr, pin)| probe_listener(&addr, pin).map(|()| addr)) {
            Ok(addr) => c(
                "listener",
                Status::Ok,
                format!("{addr} accepts TLS with the certificate it pins"),
            ),
            Err(e) => c(
                "listener",
                Status::Fail,
                format!("{e}: no run can reach the tree"),
            ),
        }
    });
    out
}

/// Every check, in the order `doctor` prints them.
pub fn checks() -> Vec<Check> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let release = uname_release();
    vec![
        check_fuse(root),
        check_fusermount(root),
        check_kernel(&release),
        check_uring(kernel_version(&release)),
        check_cgroups(),
        check_limits(),
        check_privileges(root),
        check_procfs(),
        check_git(git_version().as_deref()),
        {
            let (found, version) = slurm_found();
            check_slurm(&found, version.as_deref())
        },
        check_sandbox(root),
    ]
    .into_iter()
    .chain(check_protections(&crate::sandbox::layers::protections()))
    .chain(check_removed(crate::sandbox::layers::Removed::from_env()))
    .collect()
}

/// Run `smithfs doctor`: exit 1 when a check failed (docs/SPEC.md §6).
pub fn run(args: DoctorArgs) -> Result<ExitCode> {
    let mut checks = checks();
    if let Some(dir) = &args.dir {
        let dir = super::util::absolute(dir)?;
        checks.extend(check_launcher(&dir));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        for c in &checks {
            println!("{}", c.line());
        }
    }
    Ok(if checks.iter().any(|c| c.status == Status::Fail) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn protections_are_checks_named_as_require_names_them() {
        use crate::sandbox::layers::Protection;
        let offered = [
            Protection {
                name: "landlock",
                available: true,
                detail: "Landlock ABI 7: runs write only beneath their writable set".into(),
            },
            Protection {
                name: "landlock-scope",
                available: false,
                detail: "below ABI 6".into(),
            },
        ];
        let checks = super::check_protections(&offered);
        assert_eq!(
            (checks[0].check, checks[0].status),
            ("landlock", super::Status::Ok)
        );
        assert!(checks[0].detail.contains("ABI 7") && checks[0].detail.contains("workspace"));
        assert_eq!(
            (checks[1].check, checks[1].status),
            ("landlock-scope", super::Status::Warn)
        );
        let names: Vec<&str> = super::checks().iter().map(|c| c.check).collect();
        for n in ["landlock", "landlock-scope", "seccomp", "namespaces"] {
            assert!(names.contains(&n), "{names:?}");
        }
    }

    use super::*;

    #[test]
    fn the_test_knob_is_shown_when_set() {
        use crate::sandbox::layers::Removed;
        assert!(check_removed(Ok(Removed::default())).is_none());
        let c = check_removed(Removed::parse("view,seccomp")).expect("a check");
        assert_eq!((c.check, c.status), ("sandbox-without", Status::Warn));
        assert!(
            c.detail.contains("without its view, seccomp"),
            "{}",
            c.detail
        );
        let c = check_removed(Removed::parse("uid")).expect("a check");
        assert_eq!((c.check, c.status), ("sandbox-without", Status::Fail));
    }

    #[test]
    fn text_and_json_forms() {
        let c = Check::new("/dev/fuse", Status::Fail, "missing");
        assert_eq!(c.line(), "FAIL  /dev/fuse      missing");
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"check":"/dev/fuse","status":"fail","detail":"missing"}"#
        );
        let w = Check::new("privileges", Status::Warn, "x");
        assert!(
            w.line().starts_with("warn  privileges     x"),
            "{}",
            w.line()
        );
    }

    #[test]
    fn slurm_commands() {
        use super::{check_slurm, Status};
        let p = |s: &str| Some(std::path::PathBuf::from(s));
        let all = [
            ("sbatch", p("/usr/bin/sbatch")),
            ("squeue", p("/usr/bin/squeue")),
            ("scancel", p("/usr/bin/scancel")),
        ];
        let c = check_slurm(&all, Some("slurm 22.05.8\n"));
        assert_eq!(c.status, Status::Ok);
        assert!(c.detail.contains("slurm 22.05.8") && c.detail.contains("sbatch, squeue, scancel"));
        let some = [
            ("sbatch", p("/usr/bin/sbatch")),
            ("squeue", None),
            ("scancel", None),
        ];
        let c = check_slurm(&some, None);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.detail.starts_with("squeue, scancel not on PATH"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn the_advertised_address() {
        use super::{check_advertise, Status};
        use crate::config::{LauncherConfig, LauncherKind};
        let l = |kind, listen: Option<&str>, advertise: Option<&str>| LauncherConfig {
            kind,
            listen: listen.map(String::from),
            advertise: advertise.map(String::from),
            ..LauncherConfig::default()
        };
        let resolves = |_: &str| Ok(vec!["10.0.0.5:7000".parse().unwrap()]);
        let fails = |_: &str| Err(std::io::Error::other("no such host"));
        assert!(check_advertise(&l(LauncherKind::Local, None, None), resolves).is_none());
        let c = check_advertise(
            &l(LauncherKind::Slurm, Some("0.0.0.0:7000"), Some("head:7000")),
            resolves,
        )
        .unwrap();
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains("10.0.0.5:7000"), "{c:?}");
        let c = check_advertise(
            &l(LauncherKind::Slurm, Some("0.0.0.0:7000"), Some("nope:7000")),
            fails,
        )
        .unwrap();
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(c.detail.contains("does not resolve"), "{c:?}");
        // The nodes would dial a loopback or wildcard listen address: only this host's jobs.
        for listen in ["127.0.0.1:0", "0.0.0.0:7000", "[::1]:7000"] {
            let c = check_advertise(&l(LauncherKind::Slurm, Some(listen), None), fails).unwrap();
            assert_eq!(c.status, Status::Warn, "{listen}: {c:?}");
        }
        let c = check_advertise(&l(LauncherKind::Slurm, Some("10.0.0.5:7000"), None), fails);
        assert_eq!(c.unwrap().status, Status::Ok);
        // loopback runs are this host's by definition.
        let c = check_advertise(&l(LauncherKind::Loopback, None, None), fails).unwrap();
        assert_eq!(c.status, Status::Ok, "{c:?}");
    }

    #[test]
    fn git_versions() {
        for (version, status, says) in [
            (
                Some("git version 2.47.3\n"),
                Status::Ok,
                "2.47.3: workspaces isolated",
            ),
            (Some("git version 2.43.4"), Status::Ok, "isolated"),
            (Some("git version 2.43.0"), Status::Warn, "too old"),
            (Some("git version 2.30.2"), Status::Warn, "CVE-2024-32002"),
            (Some("hg"), Status::Warn, "cannot read a version"),
            (None, Status::Warn, "git not found"),
        ] {
            let c = check_git(version);
            assert_eq!(c.check, "git");
            assert_eq!(c.status, status, "{version:?}");
            assert!(c.detail.contains(says), "{version:?}: {}", c.detail);
        }
    }

    #[test]
    fn parses_kernel_releases() {
        assert_eq!(kernel_version("6.18.44-fc-v769"), Some((6, 18)));
        assert_eq!(kernel_version("6.9.0"), Some((6, 9)));
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("x"), None);
    }
}
