//! `smithfs reload` and SIGHUP (docs/SPEC.md §6): re-read config.json and apply it without a
//! remount, or refuse it whole.
//!
//! [`Reloader`] is made by the daemon (`crate::daemon`) before the filesystem, which calls it for
//! the operator's `ctl` `reload`; the signal thread calls it for SIGHUP. The new file is read and
//! validated exactly as `mount` reads it ([`load_config`]: the same one-line
//! errors naming the key, the same `--config`, `--operator` and `--identity` of the mount), then
//! compared with the configuration in force by [`plan`]: a change of a key that only a remount
//! can apply refuses it, naming the key. Changed `limits` are applied next: the cgroup limits
//! are written into every smith's cgroups ([`Resolver::set_limits`], which refuses limits that
//! cannot be enforced with `mount`'s line and writes back the old ones if a write fails), then
//! the mount's live limits are replaced ([`LiveLimits::set`]: the scaffold's, the open files
//! per smith, the storage quotas). Last the scheduler is handed the new configuration
//! ([`crate::sched::SchedulerPort::reload`]), which applies the rest and journals `config.reloaded` with
//! the sections that changed. A refusal is logged and journaled as `config.reload_failed` (with
//! `error`), and the daemon keeps what it had (docs/PROTOCOL-NOTES.md O12, L20).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use parking_lot::Mutex;
use serde_json::Value;

use crate::backing;
use crate::config::{Config, IdentityMode, OperatorMode};
use crate::identity::resolve::Resolver;
use crate::limits::live::{LiveLimits, Snapshot};
use crate::sched::{Event, SchedulerPort};

/// The sections of config.json a reload applies, in §8 order, as `config.reloaded` names them.
/// `hook_timeout_secs` is reported as `hooks`.
const LIVE: &[&str] = &[
    "agent",
    "scheduler",
    "limits",
    "hooks",
    "hook_timeout_secs",
    "journal",
];

/// Keys whose change needs a remount (docs/SPEC.md §6): how callers are identified, what the
/// operator may do, the project (its workspaces are made at mount; docs/PROTOCOL-NOTES.md O12).
/// The sandbox and the secrets file are read once at mount too (docs/SPEC.md §12).
const REMOUNT: &[&str] = &[
    "identity",
    "operator",
    "workspace",
    "sandbox",
    "launcher",
    "agent.secrets_file",
];

/// What a reload would change from `old` to `new`: the sections that differ (`agent`,
/// `scheduler`, `limits`, `hooks`, `journal`; empty when nothing did), in §8 order.
///
/// # Errors
/// One line naming the first key that needs a remount and changed
/// (`config.json: identity: changed from "auto" to "cgroup": …`).
pub fn plan(old: &Config, new: &Config) -> Result<Vec<String>, String> {
    let (old, new) = (to_value(old), to_value(new));
    for key in REMOUNT {
        let path = (*key).to_string();
        let ptr = format!("/{}", key.replace('.', "/"));
        let (a, b) = (
            old.pointer(&ptr).unwrap_or(&Value::Null),
            new.pointer(&ptr).unwrap_or(&Value::Null),
        );
        if let Some((path, was, now)) = first_difference(&path, a, b) {
            return Err(format!(
                "config.json: {path}: changed from {was} to {now}, which needs a remount (`smithfs umount DIR`, then `smithfs mount DIR`)"
            ));
        }
    }
    let mut changed: Vec<String> = Vec::new();
    for key in LIVE {
        let name = if *key == "hook_timeout_secs" {
            "hooks"
        } else {
            key
        };
        if old[*key] != new[*key] && !changed.iter().any(|c| c == name) {
            changed.push(name.to_string());
        }
    }
    Ok(changed)
}

fn to_value(c: &Config) -> Value {
    // Serializing plain strings, numbers and maps cannot fail.
    serde_json::to_value(c).unwrap_or(Value::Null)
}

/// The dotted path of the first leaf where `a` and `b` differ (a missing key counts as
/// `null`), with both values as JSON.
fn first_difference(path: &str, a: &Value, b: &Value) -> Option<(String, String, String)> {
    if a == b {
        return None;
    }
    if let (Value::Object(x), Value::Object(y)) = (a, b) {
        let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            let (va, vb) = (
                x.get(k).unwrap_or(&Value::Null),
                y.get(k).unwrap_or(&Value::Null),
            );
            if let Some(d) = first_difference(&format!("{path}.{k}"), va, vb) {
                return Some(d);
            }
        }
    }
    Some((path.to_string(), a.to_string(), b.to_string()))
}

/// Where a mount's configuration comes from and what overrides it (`mount`'s `--config`,
/// `--operator`, `--identity`): the same at mount and at every reload.
#[derive(Clone, Debug, Default)]
pub struct ConfigSource {
    /// Read the configuration from this file instead of DIR/config.json (`--config`).
    pub config: Option<PathBuf>,
    /// `--operator`, overriding the configuration.
    pub operator: Option<OperatorMode>,
    /// `--identity`, overriding the configuration.
    pub identity: Option<IdentityMode>,
}

/// The mount's configuration: `--config F` or `DIR/config.json` (absent: defaults), with
/// `--operator` and `--identity` overriding it. A malformed file is refused with the key's path
/// (docs/SPEC.md §8).
pub fn load_config(
    dir: &Path,
    root: std::os::fd::BorrowedFd<'_>,
    source: &ConfigSource,
) -> Result<Config> {
    let text = match &source.config {
        Some(f) => Some(
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        ),
        None => match backing::read_file(root, Path::new("config.json")) {
            Ok(b) => Some(
                String::from_utf8(b)
                    .map_err(|_| anyhow!("{}/config.json is not UTF-8", dir.display()))?,
            ),
            Err(nix::errno::Errno::ENOENT) => None,
            Err(e) => bail!("cannot read {}/config.json: {e}", dir.display()),
        },
    };
    let mut config = match text {
        Some(t) => Config::parse(&t).map_err(|e| anyhow!("{e}"))?,
        None => Config::default(),
    };
    if let Some(op) = source.operator {
        config.operator = op;
    }
    if let Some(id) = source.identity {
        config.identity = id;
    }
    if config.workspace.enabled() {
        let project = crate::workspace::PROJECT_GIT;
        if backing::open_dir_path(root, Path::new(project)).is_err() {
            bail!(
                "config.json: workspace: {} has no {project} (`smithfs init --repo PATH` makes it)",
                dir.display()
            );
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("config.json: workspace: workspaces need a daemon running as root (it builds a child's workspace in a private mount namespace)");
        }
    }
    Ok(config)
}

/// Re-reads the mount's config.json and applies it (see the module header). Shared by the
/// filesystem (`ctl` `reload`) and the signal thread (SIGHUP).
pub struct Reloader {
    dir: PathBuf,
    source: ConfigSource,
    /// The store's root (a duplicate of the filesystem's descriptor).
    root: OwnedFd,
    /// The configuration in force. Held across a reload: reloads are serialised.
    current: Mutex<Config>,
    port: Arc<SchedulerPort>,
    limits: LimitPorts,
}

/// Where a reload puts changed `limits` (docs/SPEC.md §8).
pub struct LimitPorts {
    /// The mount's live limits, read by the filesystem.
    pub live: Arc<LiveLimits>,
    /// The identity resolver, which owns the smiths' cgroups.
    pub resolver: Arc<Resolver>,
    /// The soft `RLIMIT_NOFILE` the descriptor plan divides (`crate::fs::budget::plan`).
    pub nofile: u64,
}

impl Reloader {
    /// A reloader of the mount `dir` (its configuration read from `source`) whose configuration
    /// in force is `current`, handing new configurations to the scheduler through `port`.
    pub fn new(
        dir: PathBuf,
        source: ConfigSource,
        root: OwnedFd,
        current: Config,
        port: Arc<SchedulerPort>,
        limits: LimitPorts,
    ) -> Reloader {
        Reloader {
            dir,
            source,
            root,
            current: Mutex::new(current),
            port,
            limits,
        }
    }

    /// Put `new` limits in force in place of `old` (see the module header): the cgroups of
    /// every smith first, then the live limits. `limits.clamped` is journaled for each
    /// per-smith limit clamped to its subtree's.
    ///
    /// # Errors
    /// One line: limits that cannot be enforced (as `mount` says it), or a cgroup write that
    /// failed; nothing is changed then.
    fn apply_limits(
        &self,
        old: &crate::config::Limits,
        new: &crate::config::Limits,
    ) -> Result<Snapshot, String> {
        let fds = crate::fs::budget::plan(self.limits.nofile, new.max_open_files_per_smith);
        let snap = Snapshot::new(*new, fds.per_smith);
        let (_, clamped) = crate::limits::CgroupPlan::new(new.per_smith, new.per_subtree);
        if old.per_smith != new.per_smith || old.per_subtree != new.per_subtree {
            self.limits.resolver.set_limits(&snap.cgroups)?;
            for key in clamped {
                let msg = format!(
                    "limits.per_smith.{key} is above limits.per_subtree.{key}: clamped to it (a smith's own processes are part of its subtree)"
                );
                tracing::warn!("{msg}");
                let mut ev = Event::new("limits.clamped", None);
                ev.path = Some("config.json".into());
                ev.rule = Some(format!("limits.per_smith.{key}"));
                ev.error = Some(msg);
                if let Err(e) = self.port.journal().append(&ev) {
                    tracing::error!("cannot append to the journal: {e}");
                }
            }
        }
        Ok(self.limits.live.set(snap))
    }

    /// Reload config.json: the sections that changed (empty: none), applied by the scheduler
    /// in its queue's order.
    ///
    /// # Errors
    /// One line, as `mount` words it: the file cannot be read, is bad (naming the key), a key
    /// that needs a remount changed (naming it), or the scheduler cannot take it now. The
    /// refusal is also logged and journaled (`config.reload_failed`).
    pub fn reload(&self) -> Result<Vec<String>, String> {
        let mut current = self.current.lock();
        let outcome = load_config(&self.dir, self.root.as_fd(), &self.source)
            .map_err(|e| format!("{e:#}"))
            .and_then(|new| {
                let changed = plan(&current, &new)?;
                let was = if current.limits == new.limits {
                    None
                } else {
                    Some(self.apply_limits(&current.limits, &new.limits)?)
                };
                if let Err(e) = self.port.reload(new.clone(), changed.clone()) {
                    if let Some(was) = was {
                        // Put the limits back as they were: the reload is refused whole.
                        let back = self.apply_limits(&new.limits, &current.limits);
                        if let Err(b) = back {
                            tracing::warn!("cannot restore the limits in force: {b}");
                        }
                        self.limits.live.set(was);
                    }
                    return Err(e);
                }
                *current = new;
                Ok(changed)
            });
        match &outcome {
            Ok(changed) => tracing::info!(?changed, "config.json reloaded"),
            Err(e) => {
                tracing::warn!("reload refused: {e}");
                let mut ev = Event::new("config.reload_failed", None);
                ev.path = Some("config.json".into());
                ev.error = Some(e.clone());
                if let Err(e) = self.port.journal().append(&ev) {
                    tracing::error!("cannot append to the journal: {e}");
                }
            }
        }
        outcome
    }
}

impl crate::fs::Reloading for Reloader {
    fn reload(&self) -> Result<Vec<String>, String> {
        Reloader::reload(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::parse(text).expect("valid config")
    }

    /// (config in force, new config, the changed sections or the start of the refusal).
    type Case = (
        &'static str,
        &'static str,
        Result<&'static [&'static str], &'static str>,
    );

    #[test]
    fn plans_reloads() {
        let cases: &[Case] = &[
            ("{}", "{}", Ok(&[])),
            ("{}", r#"{"agent": {"command": ["true"]}}"#, Ok(&["agent"])),
            (
                r#"{"agent": {"env": {"A": "1"}}}"#,
                r#"{"agent": {"env": {"A": "2"}}, "scheduler": {"max_concurrent": 1}}"#,
                Ok(&["agent", "scheduler"]),
            ),
            (
                "{}",
                r#"{"hook_timeout_secs": 5, "hooks": {"fleet.done": [["true"]]}}"#,
                Ok(&["hooks"]),
            ),
            (
                "{}",
                r#"{"journal": {"max_bytes": "8K"}}"#,
                Ok(&["journal"]),
            ),
            (
                "{}",
                r#"{"identity": "ancestry"}"#,
                Err("config.json: identity: changed from \"auto\" to \"ancestry\""),
            ),
            (
                "{}",
                r#"{"operator": "read-only", "agent": {"retries": 3}}"#,
                Err("config.json: operator: "),
            ),
            (
                "{}",
                r#"{"workspace": {"rev": "main"}}"#,
                Err("config.json: workspace.rev: "),
            ),
            (
                "{}",
                r#"{"limits": {"per_smith": {"pids_max": 64}}}"#,
                Ok(&["limits"]),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": 10}}"#,
                r#"{"limits": {"max_children": 1}, "journal": {"keep": 1}}"#,
                Ok(&["limits", "journal"]),
            ),
            (
                r#"{"limits": {"max_level": 2, "per_subtree": {"cpu_max": "50000 100000"}}}"#,
                r#"{"limits": {"max_level": 2, "per_subtree": {"cpu_max": "50000 100000"}}}"#,
                Ok(&[]),
            ),
            (
                "{}",
                r#"{"limits": {"max_bytes_per_smith": "1M", "max_inodes_per_smith": 9}}"#,
                Ok(&["limits"]),
            ),
            (
                "{}",
                r#"{"workspace": {"rev": "main"}}"#,
                Err("config.json: workspace.rev: changed from"),
            ),
        ];
        for (old, new, want) in cases {
            let got = plan(&parse(old), &parse(new));
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(g, w, "{old} → {new}"),
                (Err(w), Err(g)) => {
                    assert!(g.starts_with(w), "{old} → {new}: {g}");
                    assert!(g.contains("needs a remount"), "{g}");
                }
                _ => panic!("{old} → {new}: got {got:?}, want {want:?}"),
            }
        }
    }
}
