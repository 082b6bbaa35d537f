//! `smithfs run [--mount DIR] --smith FULL_ID -- CMD [ARGS…]`: run CMD bound to a smith, for the
//! operator (docs/SPEC.md §2, §6, §7), and exit with CMD's status.
//!
//! Binding: this process writes `bind <full-id>\n` to `<mount>/.smithfs/ctl` in one `write`; the
//! daemon binds the writing process. A refused bind fails the write (`EACCES` not the operator,
//! `ENOENT` no such smith, `EINVAL` malformed) and the reason is read from `<mount>/.smithfs/why`
//! and printed.
//!
//! Then, by the mode the daemon reports in `.smithfs/whoami` (`identity mode: cgroup|ancestry`):
//! - **cgroup**: this process is already in the smith's cgroup, so it simply `exec`s CMD;
//!   descendants inherit the cgroup.
//! - **ancestry** (also when the line is missing): this process is the *keeper*. It is bound, becomes
//!   a child subreaper, forks and execs CMD, reaps everything (orphans re-parent to it), ignores
//!   SIGINT/SIGQUIT (the terminal sends them to CMD too), forwards SIGTERM/SIGHUP to CMD, and exits
//!   once its last descendant is gone with CMD's exit code, or 128 + the signal that killed it.
//!
//! CMD gets `SMITH_MOUNT`, `SMITH_FULL_ID`, `SMITH_ID`, `SMITH_LEVEL`, `SMITH_PARENT` and
//! `SMITH_DIR` (as runs do, §5). CMD not found: 127; not executable: 126.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;

use super::util;
use super::whoami::{self, CONTROL_DIR};
use crate::process::keeper;
use crate::tree::model::FullId;

/// Arguments of `smithfs run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The smithfs mount (default: the nearest above the working directory, then $SMITH_MOUNT,
    /// then ./.agent-smith).
    #[arg(long, value_name = "DIR")]
    pub mount: Option<PathBuf>,
    /// The smith to run as: a full id (smith-root, smith-root/smith-001, …), a short id only
    /// one smith has, or a unique suffix.
    #[arg(long, value_name = "ID")]
    pub smith: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Run `smithfs run`: bind, then exec (cgroup) or keep (ancestry); the exit code is CMD's.
///
/// # Errors
/// A bad full id, no mount, a refused bind (with the daemon's reason), or CMD that cannot be
/// started (in cgroup mode; the keeper reports it as 126/127 instead).
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let mount = util::find_mount(args.mount.as_deref())?;
    let full = resolve(&mount, &args.smith)?;
    let smith = SmithEnv::new(&full)?;
    let control = mount.join(CONTROL_DIR);
    let mode = std::fs::read_to_string(control.join("whoami"))
        .ok()
        .and_then(|t| whoami::lookup(&t, "identity mode"));
    bind(&control, &full)?;
    let sandbox = sandbox_plan(&mount, &smith)?;
    if sandbox.is_none() {
        confine(&mount)?;
    }
    stdio_only();
    let env = smith.vars(&mount);
    if let Some(plan) = sandbox {
        // From a terminal, the command gets a pty of its own (docs/SPEC.md §12). The relay's
        // thread first: after `unshare(CLONE_NEWPID)` no thread can be made.
        let terminal = super::pty::Terminal::open().context("cannot open a pty for the command")?;
        if let Some(t) = &terminal {
            t.give_to(plan.uid, plan.gid)
                .context("cannot give the pty to the agents' user")?;
        }
        let moves = terminal
            .as_ref()
            .map(super::pty::Terminal::slave_for_stdio)
            .unwrap_or_default();
        let relay = terminal
            .map(super::pty::Terminal::relay)
            .transpose()
            .context("cannot relay the terminal")?;
        // The sandbox's init is PID 1 of a pid namespace of its own: this process (bound, the
        // keeper) forks it after `unshare(CLONE_NEWPID)` — and, not being root, in a user
        // namespace of its own made first (docs/SPEC.md §12 "Without root").
        let userns = plan
            .user_namespace
            .then(crate::process::sandbox::UserNs::of_this_process);
        let mut flags = nix::sched::CloneFlags::CLONE_NEWPID;
        if userns.is_some() {
            flags |= nix::sched::CloneFlags::CLONE_NEWUSER;
        }
        nix::sched::unshare(flags).context("cannot build the sandbox: its pid namespace")?;
        if let Some(ns) = userns {
            ns.enter().map_err(|e| {
                anyhow!(
                    "cannot build the sandbox: its user namespace: {}",
                    std::io::Error::from_raw_os_error(e)
                )
            })?;
        }
        for (k, v) in &env {
            std::env::set_var(k, v);
        }
        let mut argv: Vec<OsString> = vec![
            "/proc/self/exe".into(),
            crate::process::sandbox::INIT_ARG.into(),
        ];
        argv.extend(plan.init_args().into_iter().map(OsString::from));
        argv.push("--".into());
        argv.extend(args.command.iter().cloned());
        // The run dies with this keeper, even by SIGKILL (its init's PR_SET_PDEATHSIG).
        let status = keeper::keep_with(&argv, &moves, true);
        if let Some(r) = relay {
            r.finish();
        }
        return Ok(ExitCode::from(status.context("keeper")?));
    }
    if mode.as_deref() == Some("cgroup") {
        let (prog, rest) = args
            .command
            .split_first()
            .ok_or_else(|| anyhow!("no command given after --"))?;
        let err = std::process::Command::new(prog).args(rest).envs(env).exec();
        let code = if err.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        };
        eprintln!(
            "smithfs: cannot execute {}: {err}",
            Path::new(prog).display()
        );
        return Ok(ExitCode::from(code));
    }
    for (k, v) in &env {
        std::env::set_var(k, v);
    }
    let status = keeper::keep(&args.command).context("keeper")?;
    Ok(ExitCode::from(status))
}

/// The smith `query` names (docs/SPEC.md §6): a short id or unique suffix among the smiths the
/// mount's status lists, or a well-formed full id as it is — a smith its parent has just made
/// is not listed until the daemon publishes it, and the daemon's answer to `bind` decides.
///
/// # Errors
/// A usage error (exit 2): an ambiguous or unknown short id; the status cannot be read.
fn resolve(mount: &Path, query: &str) -> Result<String> {
    match super::store::resolve_id(&super::store::Source::Mount(mount.to_path_buf()), query) {
        Ok(full) => Ok(full),
        Err(_) if FullId::parse(query.trim()).is_some() => Ok(query.trim().to_string()),
        Err(e) => Err(e),
    }
}

/// Mark every descriptor above 2 close-on-exec: CMD gets only stdin, stdout and stderr, as runs
/// do (docs/PROTOCOL-NOTES.md H14). A descriptor the operator's shell left open (a directory
/// outside the mount, another smith's file) would otherwise reach the bound CMD and let it act
/// where its smith may not. Best effort: kernels before 5.11 lack `CLOSE_RANGE_CLOEXEC`, and
/// then the descriptors are set one by one from `/proc/self/fd`.
fn stdio_only() {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only changes descriptor flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return;
    }
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: setting FD_CLOEXEC on a descriptor number; a stale one (the read_dir's own)
        // fails with EBADF, which is fine.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// The sandbox plan for CMD (docs/SPEC.md §12), when the mount's config turns it on: the
/// mount-wide `config.json` (an unreadable or invalid one counts as the defaults), CMD's working
/// directory this process's, or the smith dir when the view does not contain it; failures on
/// stderr (no error pipe).
///
/// # Errors
/// whoami's `sandbox without` names something that is not a layer.
fn sandbox_plan(mount: &Path, smith: &SmithEnv) -> Result<Option<crate::sandbox::view::Plan>> {
    let config = std::fs::read_to_string(mount.join("config.json"))
        .ok()
        .and_then(|t| crate::config::Config::parse(&t).ok())
        .unwrap_or_default();
    if !crate::sandbox::applies(&config.sandbox) {
        return Ok(None);
    }
    let mut plan = crate::sandbox::view::Plan::for_mount(&config, mount);
    // The uid the daemon resolved at mount for the smith (docs/SPEC.md §12), as whoami says it.
    if let Ok(who) = std::fs::read_to_string(mount.join(".smithfs/whoami")) {
        let pairs = crate::cli::whoami::parse_pairs(&who);
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .and_then(|(_, v)| v.parse::<u32>().ok())
        };
        // Not root: its own uid, the only one its user namespace maps.
        if let (Some(u), Some(g), false) =
            (get("agents uid"), get("agents gid"), plan.user_namespace)
        {
            plan.uid = u;
            plan.gid = g;
            plan.user = crate::sandbox::view::user_name(u).unwrap_or_else(|| "smith".into());
        }
        // The layers the daemon's runs go without (docs/PROTOCOL-NOTES.md SB14): the daemon's
        // word, never this process's environment.
        if let Some((_, names)) = pairs.iter().find(|(k, _)| k == "sandbox without") {
            plan.removed = crate::sandbox::layers::Removed::parse(names).map_err(|e| anyhow!(e))?;
        }
    }
    plan.cwd = std::env::current_dir().ok().filter(|d| plan.shows(d));
    plan.fallback_cwd = Some(mount.join(smith.full_id.smith_dir_rel()));
    plan.report = false;
    Ok(Some(plan))
}

/// Confine this process as the daemon confines runs (docs/PROTOCOL-NOTES.md H13), when it can
/// (root with `CAP_SYS_ADMIN`) and the mount's `agent.confine` is on (an unreadable or invalid
/// `config.json` counts as on): CMD and everything it starts get their own mount namespace with
/// `/sys` and `/proc/sys` read-only and a reduced capability set, so a root CMD cannot leave the
/// smith it was bound to.
///
/// # Errors
/// A step of the confinement failed (CMD is then not run).
fn confine(mount: &Path) -> Result<()> {
    let Some(confinement) = crate::process::confine::Confinement::prepare() else {
        return Ok(());
    };
    let on = std::fs::read_to_string(mount.join("config.json"))
        .ok()
        .and_then(|t| crate::config::Config::parse(&t).ok())
        .map_or(true, |c| c.agent.confine);
    if !on {
        return Ok(());
    }
    confinement.apply().map_err(|(step, e)| {
        anyhow!(
            "cannot confine the command ({}): {}",
            step.what(),
            std::io::Error::from_raw_os_error(e)
        )
    })
}

/// The full id and what follows from it: the `SMITH_*` variables.
struct SmithEnv {
    full_id: FullId,
}

impl SmithEnv {
    fn new(full_id: &str) -> Result<SmithEnv> {
        let full_id = FullId::parse(full_id).ok_or_else(|| {
            anyhow!(
                "not a full smith id: {full_id:?} (expected smith-root, smith-root/smith-001, …)"
            )
        })?;
        Ok(SmithEnv { full_id })
    }

    fn vars(&self, mount: &Path) -> Vec<(String, OsString)> {
        let parent = self.full_id.parent().map(String::from).unwrap_or_default();
        vec![
            ("SMITH_MOUNT".into(), mount.as_os_str().to_owned()),
            ("SMITH_FULL_ID".into(), self.full_id.as_str().into()),
            ("SMITH_ID".into(), self.full_id.short().into()),
            (
                "SMITH_LEVEL".into(),
                self.full_id.level().to_string().into(),
            ),
            ("SMITH_PARENT".into(), parent.into()),
            (
                "SMITH_DIR".into(),
                mount.join(self.full_id.smith_dir_rel()).into_os_string(),
            ),
        ]
    }
}

/// Writes `bind <full_id>\n` to `<control>/ctl`; on refusal, reads `<control>/why`.
fn bind(control: &Path, full_id: &str) -> Result<()> {
    let ctl = control.join("ctl");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&ctl)
        .with_context(|| format!("cannot open {}", ctl.display()))?;
    let line = format!("bind {full_id}\n");
    let result = f.write(line.as_bytes());
    drop(f);
    let err = match result {
        Ok(n) if n == line.len() => return Ok(()),
        Ok(n) => bail!(
            "bind {full_id}: short write to {} ({n} bytes)",
            ctl.display()
        ),
        Err(e) => e,
    };
    let why = std::fs::read_to_string(control.join("why")).unwrap_or_default();
    let why = why.lines().next().unwrap_or("").trim();
    let what = match crate::policy::CtlAnswer::of(&err) {
        crate::policy::CtlAnswer::NotAllowed => {
            "bind refused: `smithfs run` is for the operator only".to_string()
        }
        crate::policy::CtlAnswer::NoSuchSmith => {
            // docs/SPEC.md §6: an unknown smith is a usage error (exit 2).
            let line = if why.is_empty() {
                format!("no such smith {full_id}")
            } else {
                format!("no such smith {full_id}: {why}")
            };
            return Err(anyhow::Error::new(super::ids::UsageError(line)));
        }
        crate::policy::CtlAnswer::Refused => {
            format!("the daemon refused `bind {full_id}` as malformed")
        }
        crate::policy::CtlAnswer::Other => format!("bind {full_id} failed"),
    };
    if why.is_empty() {
        bail!("{what} ({err})")
    }
    bail!("{what} ({err}): {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_ids() {
        for ok in [
            "smith-root",
            "smith-root/smith-001",
            "smith-root/smith-001/smith-0042",
        ] {
            assert!(SmithEnv::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "smith-001",
            "smith-root/",
            "smith-root/smith-1",
            "/smith-root",
            "a b",
        ] {
            let e = SmithEnv::new(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("not a full smith id"), "{bad}: {e}");
        }
    }

    #[test]
    fn env_vars() {
        let s = SmithEnv::new("smith-root/smith-001/smith-002").expect("id");
        let v: std::collections::HashMap<String, OsString> =
            s.vars(Path::new("/m")).into_iter().collect();
        assert_eq!(v["SMITH_ID"], "smith-002");
        assert_eq!(v["SMITH_PARENT"], "smith-root/smith-001");
        assert_eq!(v["SMITH_LEVEL"], "2");
        assert_eq!(v["SMITH_MOUNT"], "/m");
        assert_eq!(
            v["SMITH_DIR"],
            "/m/smiths/smith-root/children/smith-001/children/smith-002"
        );
        let root: std::collections::HashMap<String, OsString> = SmithEnv::new("smith-root")
            .expect("id")
            .vars(Path::new("/m"))
            .into_iter()
            .collect();
        assert_eq!(root["SMITH_PARENT"], "");
        assert_eq!(root["SMITH_LEVEL"], "0");
    }
}
