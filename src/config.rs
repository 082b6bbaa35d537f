//! Mount-wide configuration and a smith's own agent overrides (docs/SPEC.md §8).
//!
//! Both files are strict: every key is optional and takes the default shown in §8, but an unknown key, a
//! wrong type, an unknown hook event or an unknown `{placeholder}` is refused with the key's path in the
//! message (`config.json: scheduler.max_concurrent: invalid type: string "4", expected u32`).
//!
//! The serde types below are the single source of truth for the schema. `serde_json` does not report the
//! path of a data error, so on failure the document is deserialized again through `serde_path_to_error`,
//! which records the key path where the derived deserializer failed.
//!
//! Long on purpose: every key of §8 with its validation and exact error text, and their tests.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::de::{DeserializeOwned, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Placeholders allowed in `agent.command` and hook argv (docs/SPEC.md §5).
pub const PLACEHOLDERS: &[&str] = &[
    "mount",
    "smith_dir",
    "task_file",
    "smith_id",
    "full_id",
    "level",
];

/// The mount-wide `config.json` (docs/SPEC.md §8). `Config::default()` is what an empty `{}` gives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// How runs are started (docs/SPEC.md §5, §8).
    pub agent: AgentConfig,
    /// Run concurrency.
    pub scheduler: SchedulerConfig,
    /// Tree shape limits checked by the scaffold (docs/SPEC.md §4).
    pub limits: Limits,
    /// What the operator may change (docs/SPEC.md §3); `--operator` overrides it.
    pub operator: OperatorMode,
    /// How callers are identified (docs/SPEC.md §2); `--identity` overrides it.
    pub identity: IdentityMode,
    /// Extra commands per event: event → list of argv lists (docs/SPEC.md §5). Default: none.
    pub hooks: BTreeMap<HookEvent, Vec<Vec<String>>>,
    /// Timeout of one user hook, seconds (default 30, at least 1).
    pub hook_timeout_secs: u64,
    /// Rotation of the journal (docs/SPEC.md §7, §8).
    pub journal: JournalConfig,
    /// The project every smith works on (docs/SPEC.md §8, §11); `repo: null` (the default): none.
    pub workspace: WorkspaceConfig,
    /// The sandbox every run starts in (docs/SPEC.md §12); on by default.
    pub sandbox: SandboxConfig,
    /// Where runs are started and how remote ones reach the tree (docs/SPEC.md §8, §13).
    pub launcher: LauncherConfig,
}

/// `launcher` in `config.json` (docs/SPEC.md §8, §13): where runs start. Mount-wide only, read
/// once at mount (a change needs a remount).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LauncherConfig {
    /// `local` (the default), `loopback` or `slurm`.
    pub kind: LauncherKind,
    /// `host:port` the daemon's listener binds (port 0: any free port); `null`: `127.0.0.1:0`
    /// for `loopback`, required for `slurm`.
    pub listen: Option<String>,
    /// `host:port` the nodes dial when it is not `listen` (NAT, a wildcard `listen`).
    pub advertise: Option<String>,
    /// The Slurm kind's settings.
    pub slurm: SlurmConfig,
}

/// `launcher.kind` (docs/SPEC.md §13; `loopback` is ours, docs/PROTOCOL-NOTES.md R10).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LauncherKind {
    /// Runs are children of the daemon (docs/SPEC.md §5).
    #[default]
    Local,
    /// Every run is a local `smithfs attach` reaching the tree through the listener: the
    /// remote path on one host, for tests and measurements.
    Loopback,
    /// Every run is a Slurm job running `smithfs attach` on its node.
    Slurm,
}

impl LauncherKind {
    /// The kind's name as config.json spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            LauncherKind::Local => "local",
            LauncherKind::Loopback => "loopback",
            LauncherKind::Slurm => "slurm",
        }
    }

    /// Runs of this kind reach the tree through the daemon's listener.
    pub fn remote(self) -> bool {
        self != LauncherKind::Local
    }
}

/// `launcher.slurm` (docs/SPEC.md §8, §13).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlurmConfig {
    /// `sbatch --partition`; `null`: the cluster's default.
    pub partition: Option<String>,
    /// `sbatch --account`; `null`: the user's default.
    pub account: Option<String>,
    /// More `sbatch` arguments, each one argv word.
    pub extra_args: Vec<String>,
    /// The `smithfs` binary on the nodes (absolute); `null`: the daemon's own path.
    pub binary: Option<std::path::PathBuf>,
}

impl LauncherConfig {
    /// The address the listener binds: `listen`, else `127.0.0.1:0` for `loopback`; `None`
    /// for `local`.
    pub fn listen_addr(&self) -> Option<String> {
        match (self.kind, &self.listen) {
            (LauncherKind::Local, _) => None,
            (_, Some(a)) => Some(a.clone()),
            (_, None) => Some("127.0.0.1:0".into()),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [("listen", &self.listen), ("advertise", &self.advertise)] {
            if let Some(a) = value {
                check_host_port(a).map_err(|msg| invalid(&format!("launcher.{key}"), &msg))?;
            }
        }
        if self.kind == LauncherKind::Slurm && self.listen.is_none() {
            return Err(invalid(
                "launcher.listen",
                "the slurm kind needs an address the nodes can reach (e.g. \"0.0.0.0:7070\" with advertise \"HOST:7070\")",
            ));
        }
        if let Some(b) = &self.slurm.binary {
            if !b.is_absolute() {
                return Err(invalid(
                    "launcher.slurm.binary",
                    &format!("{} is not an absolute path", b.display()),
                ));
            }
        }
        for (key, value) in [
            ("partition", &self.slurm.partition),
            ("account", &self.slurm.account),
        ] {
            if value
                .as_deref()
                .is_some_and(|v| v.is_empty() || v.contains(char::is_whitespace))
            {
                return Err(invalid(
                    &format!("launcher.slurm.{key}"),
                    "must be one non-empty word",
                ));
            }
        }
        for (i, a) in self.slurm.extra_args.iter().enumerate() {
            if a.is_empty() {
                return Err(invalid(
                    &format!("launcher.slurm.extra_args[{i}]"),
                    "an empty argument",
                ));
            }
        }
        Ok(())
    }
}

/// `host:port` with a port number (a name, an IPv4 address, or `[IPv6]`).
fn check_host_port(a: &str) -> Result<(), String> {
    let Some((host, port)) = a.rsplit_once(':') else {
        return Err(format!("{a:?} is not host:port"));
    };
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(format!("{a:?} has no host"));
    }
    port.parse::<u16>()
        .map(|_| ())
        .map_err(|_| format!("{a:?}: {port:?} is not a port number"))
}

/// `sandbox` in `config.json` (docs/SPEC.md §8, §12): how runs are confined. Mount-wide only (a
/// smith's own `config.json` cannot name it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// Start every run in the sandbox (default true); `false` is `init --no-sandbox`.
    pub enabled: bool,
    /// The agents' uid: `"auto"` (the default: `SUDO_UID`, else one smithfs allocates) or a number.
    pub uid: SandboxUid,
    /// A uid of its own for every smith, from a recorded range (default false).
    pub uid_per_smith: bool,
    /// Host paths (absolute) a run may read besides the system directories.
    pub readable: Vec<std::path::PathBuf>,
    /// Host paths (absolute) a run may write, e.g. a shared build cache.
    pub writable: Vec<std::path::PathBuf>,
    /// Size of each run's private `/tmp`, `/var/tmp` and `/dev/shm` tmpfs (default 1 GiB).
    pub tmp_size: ByteSize,
    /// `host` (default) or `none` (a network namespace with loopback only).
    pub network: SandboxNetwork,
    /// Allow runs to make user namespaces (default false).
    pub user_namespaces: bool,
    /// Protections the mount refuses to go without (e.g. `"landlock-scope"`, `"seccomp"`).
    pub require: Vec<SandboxFeature>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            enabled: true,
            uid: SandboxUid::Auto,
            uid_per_smith: false,
            readable: Vec::new(),
            writable: Vec::new(),
            tmp_size: ByteSize(1 << 30),
            network: SandboxNetwork::Host,
            user_namespaces: false,
            require: Vec::new(),
        }
    }
}

impl SandboxConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        for (list, key) in [(&self.readable, "readable"), (&self.writable, "writable")] {
            for (i, path) in list.iter().enumerate() {
                if !path.is_absolute() {
                    return Err(invalid(
                        &format!("sandbox.{key}[{i}]"),
                        &format!("{} is not an absolute path", path.display()),
                    ));
                }
            }
        }
        if let SandboxUid::Uid(0) = self.uid {
            return Err(invalid("sandbox.uid", "0 is root: runs never run as root"));
        }
        at_least_one(self.tmp_size.0, "sandbox.tmp_size")
    }
}

/// `sandbox.uid` (docs/SPEC.md §12): `"auto"` or an explicit uid (never 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SandboxUid {
    /// `SUDO_UID`, else one allocated and recorded by smithfs.
    #[default]
    Auto,
    /// This uid.
    Uid(u32),
}

impl Serialize for SandboxUid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SandboxUid::Auto => s.serialize_str("auto"),
            SandboxUid::Uid(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for SandboxUid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SandboxUid, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u32),
            S(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::N(n)) => Ok(SandboxUid::Uid(n)),
            Ok(Raw::S(s)) if s == "auto" => Ok(SandboxUid::Auto),
            _ => Err(serde::de::Error::custom(
                "expected \"auto\" or a uid number",
            )),
        }
    }
}

/// `sandbox.network` (docs/SPEC.md §12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxNetwork {
    /// The host's network (agents reach their model API).
    #[default]
    Host,
    /// A network namespace of its own with loopback only.
    None,
}

/// A protection `sandbox.require` may name (docs/SPEC.md §12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxFeature {
    /// A Landlock domain restricting writes.
    Landlock,
    /// Landlock's signal and abstract-socket scoping (ABI >= 6).
    LandlockScope,
    /// The seccomp filter.
    Seccomp,
    /// Namespaces (mount, pid) of the run's view.
    Namespaces,
}

/// `workspace` in `config.json` (docs/SPEC.md §8, §11): the user's repository and the revision the
/// root's workspace starts at. `init --repo` writes it and makes `project.git`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkspaceConfig {
    /// The user's git repository (absolute, as `init` records it); `None`: no project.
    pub repo: Option<std::path::PathBuf>,
    /// The revision of `repo` the root's workspace starts at (default `HEAD`).
    pub rev: String,
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        WorkspaceConfig {
            repo: None,
            rev: "HEAD".into(),
        }
    }
}

impl WorkspaceConfig {
    /// Is a project configured (`repo` set)?
    pub fn enabled(&self) -> bool {
        self.repo.is_some()
    }
}

/// `journal` in `config.json` (docs/SPEC.md §7, §8): rotate `events.jsonl` at `max_bytes`
/// (default 64 MiB; bytes or a string with a `K`/`M`/`G` suffix, at least 4 KiB), keeping
/// `keep` rotated files (default 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JournalConfig {
    /// Rotate before a line would take the journal over this many bytes.
    pub max_bytes: ByteSize,
    /// Rotated files kept: `events.jsonl.1` … `.keep`.
    pub keep: u32,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            max_bytes: ByteSize(64 << 20),
            keep: 3,
        }
    }
}

impl JournalConfig {
    /// The journal's rotation limits.
    pub fn rotation(&self) -> Rotation {
        Rotation {
            max_bytes: self.max_bytes.0,
            keep: self.keep,
        }
    }
}

/// Rotation limits, `journal.max_bytes` and `journal.keep` of config.json (docs/SPEC.md §7, §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate before a line would take the journal over this many bytes.
    pub max_bytes: u64,
    /// Rotated files kept (`events.jsonl.1` … `.keep`); older ones are folded into the snapshot.
    pub keep: u32,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation {
            max_bytes: 64 << 20,
            keep: 3,
        }
    }
}

/// A size in bytes as config.json writes it (docs/SPEC.md §8): a number, or a string of digits
/// with an optional `K`, `M` or `G` suffix (powers of 1024; `KiB`, `MiB`, `GiB` and a lower-case
/// letter are accepted too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parse `64M`, `512K`, `1G`, `4096` (see the type's docs).
    ///
    /// Errors: one clause saying what is wrong (`not a size: "12X" (expected bytes or a number
    /// with K, M or G)`).
    pub fn parse(text: &str) -> Result<ByteSize, String> {
        let t = text.trim();
        let bad = || format!("not a size: {text:?} (expected bytes or a number with K, M or G)");
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let shift = match unit.trim().to_ascii_uppercase().as_str() {
            "" | "B" => 0,
            "K" | "KB" | "KIB" => 10,
            "M" | "MB" | "MIB" => 20,
            "G" | "GB" | "GIB" => 30,
            _ => return Err(bad()),
        };
        n.checked_mul(1u64 << shift).map(ByteSize).ok_or_else(bad)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::N(n)) => Ok(ByteSize(n)),
            Ok(Raw::S(s)) => ByteSize::parse(&s).map_err(serde::de::Error::custom),
            Err(_) => Err(serde::de::Error::custom(
                "expected a size: bytes or a string such as \"64M\"",
            )),
        }
    }
}

/// `agent` in `config.json` (docs/SPEC.md §8): the command a run executes and its limits.
///
/// `env` is readable by every smith (config.json is readable outside `smiths/`): it is no place for
/// secrets that smiths must not see.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// argv of a run, with `{mount} {smith_dir} {task_file} {smith_id} {full_id} {level}` filled;
    /// `None` (the default): no agent is configured and tasks wait. Never empty when `Some`.
    pub command: Option<Vec<String>>,
    /// Extra environment for runs, over the daemon's own (default empty).
    pub env: BTreeMap<String, String>,
    /// A file of `KEY=VALUE` lines given to every run's environment and never stored in the
    /// tree (docs/SPEC.md §12): an absolute path outside DIR, mode 0600, owned by the operator;
    /// checked and read at mount. Mount-wide only. `None` (the default): no secrets.
    pub secrets_file: Option<std::path::PathBuf>,
    /// A run's wall-clock limit, seconds (default 1800, at least 1).
    pub timeout_secs: u64,
    /// Retries of a failed run (default 1).
    pub retries: u32,
    /// Seconds between TERM and KILL when a run is stopped (default 5).
    pub kill_grace_secs: u64,
    /// Confine the runs a root daemon starts (default true): each in its own mount namespace
    /// with `/sys` (all cgroup filesystems) and `/proc/sys` read-only and without
    /// `CAP_SYS_ADMIN`, `CAP_SYS_PTRACE` and the other capabilities outside Docker's default
    /// set, so that a root agent cannot move itself into another smith's cgroup or out of its
    /// own, nor read the daemon's descriptors (docs/PROTOCOL-NOTES.md H13). `false` lets root
    /// agents do all of that. Mount-wide only: a smith's own `config.json` cannot change it.
    pub confine: bool,
}

/// `scheduler` in `config.json` (docs/SPEC.md §5, §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Runs at once, mount-wide (default 4, at least 1).
    pub max_concurrent: u32,
}

/// `limits` in `config.json`: the scaffold's limits (docs/SPEC.md §4, §8) and the open files a
/// smith may hold in the daemon (docs/PROTOCOL-NOTES.md, C26).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Deepest level a smith may have; the root is level 0 (default 3).
    pub max_level: u8,
    /// Children a smith may have at once (default 5).
    pub max_children: u32,
    /// Open files and directories one smith may hold through the mount at once (each costs the
    /// daemon a descriptor); beyond it its opens fail with EMFILE. At least 1. `None` (absent
    /// or `null`, the default): an eighth of the daemon's descriptors for open files, decided
    /// at mount from `RLIMIT_NOFILE` (915 with a limit of 20 000, 61 184 with 1 048 576).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_open_files_per_smith: Option<u32>,
    /// Allocated bytes one smith's zones may hold (docs/SPEC.md §8); `None`: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes_per_smith: Option<crate::limits::Size>,
    /// Inodes one smith's zones may hold (docs/SPEC.md §8); `None`: no limit. At least 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_inodes_per_smith: Option<u64>,
    /// cgroup limits of each smith's own processes (docs/SPEC.md §5).
    pub per_smith: crate::limits::CgroupLimits,
    /// cgroup limits of each smith together with all its descendants (docs/SPEC.md §5).
    pub per_subtree: crate::limits::CgroupLimits,
}

/// `operator` in `config.json` or `--operator` (docs/SPEC.md §3, §8). serde and clap spell the
/// variants alike (kebab-case), as [`OperatorMode::as_str`] does.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum OperatorMode {
    /// The operator may do everything the rules give it (default).
    #[default]
    ReadWrite,
    /// The operator may read everything and write only `smiths/smith-root/inbox/**`, the root
    /// `config.json` and `.smithfs/ctl`.
    ReadOnly,
}

/// `identity` in `config.json` or `--identity` (docs/SPEC.md §2, §8). serde and clap spell the
/// variants alike (kebab-case), as [`IdentityMode::as_str`] does.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum IdentityMode {
    /// cgroup where smithfs may create cgroups, else ancestry (default).
    #[default]
    Auto,
    /// One cgroup per smith.
    Cgroup,
    /// Process ancestry with keepers and subreapers.
    Ancestry,
}

/// An event a user hook may be attached to (docs/SPEC.md §5).
///
/// `hook.exited` is journaled but is *not* accepted as a trigger: a hook on it would fire on its own
/// exit, for ever. `config.json: hooks.hook.exited` is refused with that reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HookEvent {
    /// `smith.created`
    SmithCreated,
    /// `task.assigned`
    TaskAssigned,
    /// `result.published`
    ResultPublished,
    /// `children.settled`
    ChildrenSettled,
    /// `run.started`
    RunStarted,
    /// `run.exited`
    RunExited,
    /// `run.timed_out`
    RunTimedOut,
    /// `run.cancelled`
    RunCancelled,
    /// `run.interrupted`
    RunInterrupted,
    /// `access.denied`
    AccessDenied,
    /// `task.ignored` (a `task-*.md` that breaks the name rule, docs/SPEC.md §5)
    TaskIgnored,
    /// `access.denied.suppressed` (denials beyond the rate limit, docs/SPEC.md §7)
    AccessDeniedSuppressed,
    /// `fleet.done`: `results/final.md` was written while no run of the tree is live or queued
    /// (smith `smith-root`, docs/SPEC.md §5).
    FleetDone,
    /// `config.reloaded`: a changed `config.json` was applied without a remount (`smithfs
    /// reload`, SIGHUP; docs/SPEC.md §6, docs/PROTOCOL-NOTES.md O12).
    ConfigReloaded,
}

/// A smith's own `config.json` (docs/SPEC.md §8): only `agent`, merged key by key over the mount-wide one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmithConfig {
    /// Overrides of the mount-wide `agent`; absent keys keep the mount-wide value.
    pub agent: AgentOverride,
}

/// `agent` in a smith's `config.json`: every key optional, `None` = inherit (docs/SPEC.md §8).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentOverride {
    /// Replaces the command (`null` or absent: inherit).
    pub command: Option<Vec<String>>,
    /// Merged variable by variable over the mount-wide `env` (the smith's value wins).
    pub env: Option<BTreeMap<String, String>>,
    /// Replaces `timeout_secs`.
    pub timeout_secs: Option<u64>,
    /// Replaces `retries`.
    pub retries: Option<u32>,
    /// Replaces `kill_grace_secs`.
    pub kill_grace_secs: Option<u64>,
}

/// A refused config file (docs/SPEC.md §8). Display is one line naming the key path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not JSON at all (position included in `msg`).
    #[error("config.json: invalid JSON: {msg}")]
    Syntax {
        /// serde_json's message with line and column.
        msg: String,
    },
    /// A key that the schema does not know, e.g. `agent.comand`.
    #[error("config.json: unknown key {path}{}", known_suffix(.known))]
    UnknownKey {
        /// Dotted path of the key.
        path: String,
        /// The keys allowed at that level, comma-separated (may be empty).
        known: String,
    },
    /// A wrong type or value at `path` (empty path: the document itself).
    #[error("config.json: {}{msg}", path_prefix(.path))]
    Invalid {
        /// Dotted path of the key, with `[i]` for list elements; empty for the whole document.
        path: String,
        /// What is wrong, e.g. `invalid type: string "4", expected u32`.
        msg: String,
    },
}

fn known_suffix(known: &str) -> String {
    if known.is_empty() {
        String::new()
    } else {
        format!(" (known keys: {known})")
    }
}

fn path_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            agent: AgentConfig::default(),
            scheduler: SchedulerConfig::default(),
            limits: Limits::default(),
            operator: OperatorMode::ReadWrite,
            identity: IdentityMode::Auto,
            hooks: BTreeMap::new(),
            hook_timeout_secs: 30,
            workspace: WorkspaceConfig::default(),
            journal: JournalConfig::default(),
            sandbox: SandboxConfig::default(),
            launcher: LauncherConfig::default(),
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            command: None,
            env: BTreeMap::new(),
            secrets_file: None,
            timeout_secs: 1800,
            retries: 1,
            kill_grace_secs: 5,
            confine: true,
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { max_concurrent: 4 }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_level: crate::tree::model::DEFAULT_MAX_LEVEL,
            max_children: crate::tree::model::DEFAULT_MAX_CHILDREN,
            max_open_files_per_smith: None,
            max_bytes_per_smith: None,
            max_inodes_per_smith: None,
            per_smith: crate::limits::CgroupLimits::default(),
            per_subtree: crate::limits::CgroupLimits::default(),
        }
    }
}

impl Config {
    /// Parse and validate the mount-wide `config.json` (docs/SPEC.md §8).
    ///
    /// Errors: [`ConfigError::Syntax`] for bad JSON, [`ConfigError::UnknownKey`] for a key the schema does
    /// not have, [`ConfigError::Invalid`] for a wrong type, an unknown hook event or placeholder, an empty
    /// argv, or a zero where at least 1 is needed (`scheduler.max_concurrent`, `agent.timeout_secs`,
    /// `hook_timeout_secs`, `limits.max_open_files_per_smith`).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config = parse_strict(text)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.agent.validate("agent")?;
        at_least_one(
            self.scheduler.max_concurrent.into(),
            "scheduler.max_concurrent",
        )?;
        at_least_one(self.hook_timeout_secs, "hook_timeout_secs")?;
        if self.journal.max_bytes.0 < 4096 {
            return Err(ConfigError::Invalid {
                path: "journal.max_bytes".into(),
                msg: format!(
                    "{} bytes is too small (at least 4K)",
                    self.journal.max_bytes.0
                ),
            });
        }
        if let Some(n) = self.limits.max_open_files_per_smith {
            at_least_one(n.into(), "limits.max_open_files_per_smith")?;
        }
        self.limits.validate_resources()?;
        self.sandbox.validate()?;
        self.launcher.validate()?;
        for (event, argvs) in &self.hooks {
            for (i, argv) in argvs.iter().enumerate() {
                let path = format!("hooks{}[{i}]", render_key(event.as_str(), false));
                check_argv(argv, &path)?;
            }
        }
        Ok(())
    }
}

impl Limits {
    /// The resource keys of docs/SPEC.md §5/§8 (`max_bytes_per_smith`, `max_inodes_per_smith`,
    /// `per_smith`, `per_subtree`): values the kernel and the daemon can enforce.
    fn validate_resources(&self) -> Result<(), ConfigError> {
        if let Some(n) = self.max_inodes_per_smith {
            at_least_one(n, "limits.max_inodes_per_smith")?;
        }
        if let Some(b) = self.max_bytes_per_smith {
            at_least_one(b.bytes(), "limits.max_bytes_per_smith")?;
        }
        for (limits, path) in [
            (&self.per_smith, "limits.per_smith"),
            (&self.per_subtree, "limits.per_subtree"),
        ] {
            limits
                .validate(path)
                .map_err(|(path, msg)| invalid(&path, &msg))?;
        }
        Ok(())
    }
}

impl AgentConfig {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if let Some(argv) = &self.command {
            check_argv(argv, &format!("{path}.command"))?;
        }
        if let Some(p) = &self.secrets_file {
            if !p.is_absolute() {
                return Err(invalid(
                    &format!("{path}.secrets_file"),
                    &format!("{} is not an absolute path", p.display()),
                ));
            }
        }
        at_least_one(self.timeout_secs, &format!("{path}.timeout_secs"))
    }
}

impl SmithConfig {
    /// Parse and validate a smith's own `config.json` (docs/SPEC.md §8): only `agent`, same key rules as
    /// the mount-wide `agent`. A bad one fails that smith's run, not the mount (the caller's business).
    pub fn parse(text: &str) -> Result<SmithConfig, ConfigError> {
        let config: SmithConfig = parse_strict(text)?;
        // Validate the overrides as they will be used: merged over the defaults.
        let a = &config.agent;
        if let Some(argv) = &a.command {
            check_argv(argv, "agent.command")?;
        }
        if let Some(t) = a.timeout_secs {
            at_least_one(t, "agent.timeout_secs")?;
        }
        Ok(config)
    }

    /// The effective agent config of this smith: each key of `agent` present here replaces the
    /// mount-wide one; `env` is merged variable by variable, this file's values winning (docs/SPEC.md §8).
    /// `kill_grace_secs` may only lower the mount-wide value: a parent cannot give a subtree runs
    /// that outlive a cancel or an unmount longer than the operator allowed
    /// (docs/PROTOCOL-NOTES.md H21).
    pub fn merged(&self, base: &AgentConfig) -> AgentConfig {
        let o = &self.agent;
        let mut env = base.env.clone();
        if let Some(extra) = &o.env {
            env.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        AgentConfig {
            command: o.command.clone().or_else(|| base.command.clone()),
            env,
            secrets_file: base.secrets_file.clone(),
            timeout_secs: o.timeout_secs.unwrap_or(base.timeout_secs),
            retries: o.retries.unwrap_or(base.retries),
            kill_grace_secs: o
                .kill_grace_secs
                .map_or(base.kill_grace_secs, |g| g.min(base.kill_grace_secs)),
            confine: base.confine,
        }
    }
}

impl HookEvent {
    /// Every event a hook may be attached to, in §5 order.
    pub const ALL: [HookEvent; 14] = [
        HookEvent::SmithCreated,
        HookEvent::TaskAssigned,
        HookEvent::ResultPublished,
        HookEvent::ChildrenSettled,
        HookEvent::RunStarted,
        HookEvent::RunExited,
        HookEvent::RunTimedOut,
        HookEvent::RunCancelled,
        HookEvent::RunInterrupted,
        HookEvent::AccessDenied,
        HookEvent::TaskIgnored,
        HookEvent::AccessDeniedSuppressed,
        HookEvent::FleetDone,
        HookEvent::ConfigReloaded,
    ];

    /// The journal name, e.g. `result.published`.
    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::SmithCreated => "smith.created",
            HookEvent::TaskAssigned => "task.assigned",
            HookEvent::ResultPublished => "result.published",
            HookEvent::ChildrenSettled => "children.settled",
            HookEvent::RunStarted => "run.started",
            HookEvent::RunExited => "run.exited",
            HookEvent::RunTimedOut => "run.timed_out",
            HookEvent::RunCancelled => "run.cancelled",
            HookEvent::RunInterrupted => "run.interrupted",
            HookEvent::AccessDenied => "access.denied",
            HookEvent::TaskIgnored => "task.ignored",
            HookEvent::AccessDeniedSuppressed => "access.denied.suppressed",
            HookEvent::FleetDone => "fleet.done",
            HookEvent::ConfigReloaded => "config.reloaded",
        }
    }
}

impl fmt::Display for HookEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HookEvent {
    type Err = String;

    /// Errors: the sentence used in config errors (unknown event, or `hook.exited`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(e) = HookEvent::ALL.iter().find(|e| e.as_str() == s) {
            return Ok(*e);
        }
        if s == "hook.exited" {
            return Err(
                "hook.exited cannot trigger hooks (a hook would fire on its own exit)".into(),
            );
        }
        let names: Vec<&str> = HookEvent::ALL.iter().map(|e| e.as_str()).collect();
        Err(format!(
            "unknown event `{s}`, expected one of {}",
            names.join(", ")
        ))
    }
}

impl Serialize for HookEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for HookEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EventName;
        impl Visitor<'_> for EventName {
            type Value = HookEvent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an event name")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<HookEvent, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(EventName)
    }
}

impl OperatorMode {
    /// The config / command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OperatorMode::ReadWrite => "read-write",
            OperatorMode::ReadOnly => "read-only",
        }
    }
}

impl IdentityMode {
    /// The config / command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityMode::Auto => "auto",
            IdentityMode::Cgroup => "cgroup",
            IdentityMode::Ancestry => "ancestry",
        }
    }
}

/// Check one argv: not empty, every `{name}` a known placeholder (docs/SPEC.md §5).
///
/// A placeholder is `{` + one or more of `[A-Za-z0-9_]` + `}`; any other brace is literal text, so
/// `sh -c 'f() { :; }'` stays usable.
fn check_argv(argv: &[String], path: &str) -> Result<(), ConfigError> {
    if argv.is_empty() {
        return Err(invalid(
            path,
            "must not be empty (give at least the program)",
        ));
    }
    for (i, arg) in argv.iter().enumerate() {
        if let Some(name) = unknown_placeholder(arg) {
            return Err(invalid(
                &format!("{path}[{i}]"),
                &format!(
                    "unknown placeholder {{{name}}}, expected one of {{{}}}",
                    PLACEHOLDERS.join("} {")
                ),
            ));
        }
    }
    Ok(())
}

/// The first `{name}` in `arg` whose name is not in [`PLACEHOLDERS`].
pub fn unknown_placeholder(arg: &str) -> Option<&str> {
    fill_placeholders(arg, |name| PLACEHOLDERS.contains(&name).then_some("")).err()
}

/// `arg` with every placeholder replaced by `value(name)`: a placeholder is `{` +
/// `[A-Za-z0-9_]+` + `}`; any other brace is literal, and a value is never scanned again. The one
/// scanner of `agent.command` and the hooks' commands: [`unknown_placeholder`] checks with it,
/// the runner fills with it (`sched::runner::Placeholders::expand`).
///
/// # Errors
/// The name of the first placeholder `value` does not know.
pub fn fill_placeholders<'a, 'v>(
    arg: &'a str,
    value: impl Fn(&str) -> Option<&'v str>,
) -> Result<String, &'a str> {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if len > 0 && after[len..].starts_with('}') {
            let name = &after[..len];
            out.push_str(value(name).ok_or(name)?);
            rest = &after[len + 1..];
        } else {
            out.push('{');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn at_least_one(value: u64, path: &str) -> Result<(), ConfigError> {
    if value == 0 {
        Err(invalid(path, "must be at least 1"))
    } else {
        Ok(())
    }
}

fn invalid(path: &str, msg: &str) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_owned(),
        msg: msg.to_owned(),
    }
}

/// Deserialize `text` as `T`; on a data error, find the key path (see the module header).
fn parse_strict<T: DeserializeOwned + Serialize>(text: &str) -> Result<T, ConfigError> {
    let first = match serde_json::from_str::<T>(text) {
        Ok(v) => return refuse_lists_as_structs(text, v),
        Err(e) => e,
    };
    // Whether the text is JSON at all is decided by parsing it as a `Value`: serde_json reports some type
    // errors (a number for an enum) as syntax errors, and a type error may come before a syntax error.
    // Deserializing the `Value` (not the text) also keeps "at line L column C" out of data errors.
    let doc: Value =
        serde_json::from_str(text).map_err(|e| ConfigError::Syntax { msg: e.to_string() })?;
    match serde_path_to_error::deserialize::<_, T>(&doc) {
        Err(e) => {
            let path: Vec<Seg> = e.path().iter().filter_map(Seg::from_tracked).collect();
            Err(classify_error(&path, e.into_inner().to_string()))
        }
        // Only the text showed the error (e.g. a duplicate key, which a `Value` silently drops).
        Ok(_) => Err(ConfigError::Invalid {
            path: String::new(),
            msg: first.to_string(),
        }),
    }
}

/// serde's derive also accepts a list for a struct (`"limits": [2, 7]`); refuse that. Every struct of the
/// schema serializes as an object, so a list in the input where the re-serialized value has an object is
/// exactly such a case.
fn refuse_lists_as_structs<T: Serialize>(text: &str, parsed: T) -> Result<T, ConfigError> {
    fn find(input: &Value, output: &Value, path: &mut Vec<Seg>) -> bool {
        match (input, output) {
            (Value::Array(_), Value::Object(_)) => true,
            (Value::Object(i), Value::Object(o)) => i.iter().any(|(k, iv)| {
                o.get(k).is_some_and(|ov| {
                    path.push(Seg::Key(k.clone()));
                    find(iv, ov, path) || path.pop().is_none()
                })
            }),
            (Value::Array(i), Value::Array(o)) => {
                i.iter().zip(o).enumerate().any(|(n, (iv, ov))| {
                    path.push(Seg::Index(n));
                    find(iv, ov, path) || path.pop().is_none()
                })
            }
            _ => false,
        }
    }
    let input: Value =
        serde_json::from_str(text).map_err(|e| ConfigError::Syntax { msg: e.to_string() })?;
    let output = serde_json::to_value(&parsed).map_err(|e| invalid("", &e.to_string()))?;
    let mut path = Vec::new();
    if find(&input, &output, &mut path) {
        return Err(invalid(
            &render_path(&path),
            "invalid type: sequence, expected an object",
        ));
    }
    Ok(parsed)
}

/// One step of a key path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

impl Seg {
    /// The step `serde_path_to_error` recorded; `None` for steps a JSON document has no name for (an
    /// enum variant, a non-string key), which are left out of the rendered path.
    fn from_tracked(seg: &serde_path_to_error::Segment) -> Option<Seg> {
        match seg {
            serde_path_to_error::Segment::Map { key } => Some(Seg::Key(key.clone())),
            serde_path_to_error::Segment::Seq { index } => Some(Seg::Index(*index)),
            serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {
                None
            }
        }
    }
}

/// `agent.command[0]`, `hooks."result.published"[1]`.
fn render_path(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => out.push_str(&render_key(k, out.is_empty())),
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A key as a path step: bare if it is a plain word, else JSON-quoted (event names contain dots).
fn render_key(key: &str, first: bool) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let body = if plain {
        key.to_owned()
    } else {
        Value::String(key.to_owned()).to_string()
    };
    if first {
        body
    } else {
        format!(".{body}")
    }
}

/// Turn serde's message at `path` into a [`ConfigError`]. serde's derive reports unknown keys as
/// ``unknown field `x`, expected one of `a`, `b` `` (or `` expected `a` ``, or `there are no fields`).
fn classify_error(path: &[Seg], msg: String) -> ConfigError {
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        let known = rest
            .split_once(", expected ")
            .map(|(_, list)| list.trim_start_matches("one of ").replace('`', ""))
            .unwrap_or_default();
        return ConfigError::UnknownKey {
            path: render_path(path),
            known,
        };
    }
    ConfigError::Invalid {
        path: render_path(path),
        msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn empty_object_gives_the_section_8_defaults() {
        let c = Config::parse("{}").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.agent.command, None);
        assert!(c.agent.env.is_empty());
        assert_eq!(c.agent.timeout_secs, 1800);
        assert_eq!(c.agent.retries, 1);
        assert_eq!(c.agent.kill_grace_secs, 5);
        assert_eq!(c.scheduler.max_concurrent, 4);
        assert_eq!(c.limits.max_level, 3);
        assert_eq!(c.limits.max_children, 5);
        assert_eq!(c.operator, OperatorMode::ReadWrite);
        assert_eq!(c.identity, IdentityMode::Auto);
        assert!(c.hooks.is_empty());
        assert_eq!(c.hook_timeout_secs, 30);
    }

    #[test]
    fn the_section_8_example_parses() {
        let text = r#"{
          "agent":     { "command": ["bash", "{mount}/agents/reference.sh"], "env": {}, "timeout_secs": 1800,
                         "retries": 1, "kill_grace_secs": 5 },
          "scheduler": { "max_concurrent": 4 },
          "limits":    { "max_level": 3, "max_children": 5 },
          "operator":  "read-write",
          "identity":  "auto",
          "hooks":     { "result.published": [["sh", "-c", "echo \"$SMITH_FULL_ID\" >> /tmp/done.log"]] },
          "hook_timeout_secs": 30,
          "journal":   { "max_bytes": 67108864, "keep": 3 }
        }"#;
        let c = Config::parse(text).unwrap();
        assert_eq!(
            c.agent.command.as_deref(),
            Some(&["bash".to_owned(), "{mount}/agents/reference.sh".to_owned()][..])
        );
        assert_eq!(c.hooks[&HookEvent::ResultPublished].len(), 1);
        // Round trip: what we serialize we accept.
        let again = Config::parse(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn launcher_keys_parse_and_name_what_is_wrong() {
        let c = Config::parse("{}").unwrap();
        assert_eq!(c.launcher.kind, LauncherKind::Local);
        assert_eq!(c.launcher.listen_addr(), None);
        let c = Config::parse(r#"{"launcher": {"kind": "loopback"}}"#).unwrap();
        assert_eq!(c.launcher.listen_addr().as_deref(), Some("127.0.0.1:0"));
        let text = r#"{"launcher": {"kind": "slurm", "listen": "0.0.0.0:7070",
            "advertise": "head.example:7070",
            "slurm": {"partition": "gpu", "account": "lab", "extra_args": ["--qos=low"],
                      "binary": "/opt/smithfs/bin/smithfs"}}}"#;
        let c = Config::parse(text).unwrap();
        assert_eq!(c.launcher.kind, LauncherKind::Slurm);
        assert_eq!(c.launcher.slurm.extra_args, ["--qos=low"]);
        assert_eq!(
            Config::parse(&serde_json::to_string(&c).unwrap()).unwrap(),
            c
        );
        for (text, want) in [
            (
                r#"{"launcher": {"kind": "k8s"}}"#,
                "config.json: launcher.kind: ",
            ),
            (
                r#"{"launcher": {"kind": "slurm"}}"#,
                "config.json: launcher.listen: the slurm kind needs",
            ),
            (
                r#"{"launcher": {"listen": "7070"}}"#,
                "config.json: launcher.listen: \"7070\" is not host:port",
            ),
            (
                r#"{"launcher": {"advertise": "h:port"}}"#,
                "config.json: launcher.advertise: ",
            ),
            (
                r#"{"launcher": {"slurm": {"binary": "smithfs"}}}"#,
                "config.json: launcher.slurm.binary: smithfs is not an absolute path",
            ),
            (
                r#"{"launcher": {"slurm": {"partition": "a b"}}}"#,
                "config.json: launcher.slurm.partition: ",
            ),
            (
                r#"{"launcher": {"slurm": {"extra_args": [""]}}}"#,
                "config.json: launcher.slurm.extra_args[0]: ",
            ),
            (
                r#"{"launcher": {"slurm": {"args": []}}}"#,
                "config.json: unknown key launcher.slurm.args",
            ),
            (
                r#"{"launcher": {"lisen": "a:1"}}"#,
                "config.json: unknown key launcher.lisen",
            ),
        ] {
            let e = err(text);
            assert!(e.starts_with(want), "{text}: {e}");
        }
    }

    #[test]
    fn journal_sizes() {
        let c = Config::parse("{}").unwrap();
        assert_eq!(c.journal.max_bytes, ByteSize(64 << 20));
        assert_eq!(c.journal.keep, 3);
        for (text, want) in [
            ("4096", Some(4096)),
            ("\"64M\"", Some(64 << 20)),
            ("\"512K\"", Some(512 << 10)),
            ("\"1G\"", Some(1 << 30)),
            ("\"2GiB\"", Some(2 << 30)),
            ("\"8k\"", Some(8 << 10)),
            ("\"12X\"", None),
            ("\"M\"", None),
            ("\"1024\"", None),
            ("100", None),
            ("true", None),
            ("\"99999999999999G\"", None),
        ] {
            let got = Config::parse(&format!(r#"{{"journal": {{"max_bytes": {text}}}}}"#));
            match want {
                Some(n) => assert_eq!(got.map(|c| c.journal.max_bytes.0), Ok(n), "{text}"),
                None => {
                    let e = got.expect_err(text).to_string();
                    assert!(
                        e.starts_with("config.json: journal.max_bytes: "),
                        "{text}: {e}"
                    );
                }
            }
        }
        let c = Config::parse(r#"{"journal": {"keep": 0}}"#).unwrap();
        assert_eq!(c.journal.keep, 0);
    }

    #[test]
    fn partial_sections_keep_the_other_defaults() {
        let c = Config::parse(r#"{"agent": {"retries": 3}, "limits": {"max_children": 2}, "operator": "read-only", "identity": "cgroup"}"#)
            .unwrap();
        assert_eq!(c.agent.retries, 3);
        assert_eq!(c.agent.timeout_secs, 1800);
        assert_eq!(c.limits.max_children, 2);
        assert_eq!(c.limits.max_level, 3);
        assert_eq!(c.operator, OperatorMode::ReadOnly);
        assert_eq!(c.identity, IdentityMode::Cgroup);
        assert_eq!(
            Config::parse(r#"{"identity":"ancestry"}"#)
                .unwrap()
                .identity,
            IdentityMode::Ancestry
        );
        assert_eq!(
            Config::parse(r#"{"agent":{"command":null}}"#)
                .unwrap()
                .agent
                .command,
            None
        );
    }

    /// One row per key: a wrong type gives the key path and serde's message.
    #[test]
    fn every_key_refuses_a_wrong_type_naming_its_path() {
        let rows: &[(&str, &str)] = &[
            (r#"{"agent": 1}"#, "config.json: agent: invalid type: integer `1`, expected struct AgentConfig"),
            (r#"{"agent": {"command": "bash"}}"#, "config.json: agent.command: invalid type: string \"bash\", expected a sequence"),
            (r#"{"agent": {"command": ["bash", 1]}}"#, "config.json: agent.command[1]: invalid type: integer `1`, expected a string"),
            (r#"{"agent": {"env": []}}"#, "config.json: agent.env: invalid type: sequence, expected a map"),
            (r#"{"agent": {"env": {"A": 1}}}"#, "config.json: agent.env.A: invalid type: integer `1`, expected a string"),
            (r#"{"agent": {"timeout_secs": "1800"}}"#, "config.json: agent.timeout_secs: invalid type: string \"1800\", expected u64"),
            (r#"{"agent": {"retries": -1}}"#, "config.json: agent.retries: invalid value: integer `-1`, expected u32"),
            (r#"{"agent": {"kill_grace_secs": 1.5}}"#, "config.json: agent.kill_grace_secs: invalid type: floating point `1.5`, expected u64"),
            (r#"{"scheduler": []}"#, "config.json: scheduler: invalid type: sequence, expected an object"),
            (r#"{"scheduler": [1]}"#, "config.json: scheduler: invalid type: sequence, expected an object"),
            (r#"{"scheduler": {"max_concurrent": "4"}}"#, "config.json: scheduler.max_concurrent: invalid type: string \"4\", expected u32"),
            (r#"{"limits": "x"}"#, "config.json: limits: invalid type: string \"x\", expected struct Limits"),
            (r#"{"limits": {"max_level": 300}}"#, "config.json: limits.max_level: invalid value: integer `300`, expected u8"),
            (r#"{"limits": {"max_children": true}}"#, "config.json: limits.max_children: invalid type: boolean `true`, expected u32"),
            (r#"{"operator": "rw"}"#, "config.json: operator: unknown variant `rw`, expected `read-write` or `read-only`"),
            (r#"{"operator": 1}"#, "config.json: operator: invalid type: integer `1`, expected string or map"),
            (r#"{"identity": "pid"}"#, "config.json: identity: unknown variant `pid`, expected one of `auto`, `cgroup`, `ancestry`"),
            (r#"{"hooks": []}"#, "config.json: hooks: invalid type: sequence, expected a map"),
            (r#"{"hooks": {"result.published": "x"}}"#, "config.json: hooks.\"result.published\": invalid type: string \"x\", expected a sequence"),
            (r#"{"hooks": {"result.published": [["a"], "b"]}}"#, "config.json: hooks.\"result.published\"[1]: invalid type: string \"b\", expected a sequence"),
            (r#"{"hooks": {"run.exited": [["a", 2]]}}"#, "config.json: hooks.\"run.exited\"[0][1]: invalid type: integer `2`, expected a string"),
            (r#"{"hook_timeout_secs": null}"#, "config.json: hook_timeout_secs: invalid type: null, expected u64"),
            ("[]", "config.json: invalid type: sequence, expected an object"),
            ("7", "config.json: invalid type: integer `7`, expected struct Config"),
            (r#"{"limits": [2, 7]}"#, "config.json: limits: invalid type: sequence, expected an object"),
            (r#"{"agent": {"confine": "no"}}"#, "config.json: agent.confine: invalid type: string \"no\", expected a boolean"),
            (r#"{"agent": []}"#, "config.json: agent: invalid type: sequence, expected an object"),
        ];
        for (text, want) in rows {
            assert_eq!(
                &Config::parse(text).map_err(|e| e.to_string()).unwrap_err(),
                want,
                "for {text}"
            );
        }
    }

    /// One row per level: an unknown key is named with its full path.
    #[test]
    fn unknown_keys_are_refused_at_every_level() {
        let rows: &[(&str, &str)] = &[
            (r#"{"agnet": {}}"#, "agnet"),
            (r#"{"agent": {"comand": ["x"]}}"#, "agent.comand"),
            (r#"{"scheduler": {"max": 1}}"#, "scheduler.max"),
            (r#"{"limits": {"max_depth": 1}}"#, "limits.max_depth"),
            (r#"{"agent": {"retries": 1}, "extra": 1}"#, "extra"),
        ];
        for (text, path) in rows {
            match Config::parse(text).unwrap_err() {
                ConfigError::UnknownKey { path: p, known } => {
                    assert_eq!(&p, path, "for {text}");
                    assert!(!known.is_empty());
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        assert_eq!(
            err(r#"{"agent": {"comand": []}}"#),
            "config.json: unknown key agent.comand (known keys: command, env, secrets_file, timeout_secs, retries, kill_grace_secs, confine)"
        );
    }

    #[test]
    fn hook_events_must_be_section_5_events() {
        for e in HookEvent::ALL {
            let text = format!(r#"{{"hooks": {{"{e}": [["true"]]}}}}"#);
            assert!(Config::parse(&text).is_ok(), "{e}");
        }
        let e = err(r#"{"hooks": {"task.done": [["true"]]}}"#);
        assert!(
            e.starts_with("config.json: hooks.\"task.done\": unknown event `task.done`"),
            "{e}"
        );
        let e = err(r#"{"hooks": {"hook.exited": [["true"]]}}"#);
        assert_eq!(
            e,
            "config.json: hooks.\"hook.exited\": hook.exited cannot trigger hooks (a hook would fire on its own exit)"
        );
    }

    #[test]
    fn semantic_checks_name_the_key() {
        let rows: &[(&str, &str)] = &[
            (r#"{"agent": {"command": []}}"#, "config.json: agent.command: must not be empty (give at least the program)"),
            (r#"{"agent": {"command": ["x", "{cwd}"]}}"#, "config.json: agent.command[1]: unknown placeholder {cwd}, expected one of {mount} {smith_dir} {task_file} {smith_id} {full_id} {level}"),
            (r#"{"agent": {"timeout_secs": 0}}"#, "config.json: agent.timeout_secs: must be at least 1"),
            (r#"{"scheduler": {"max_concurrent": 0}}"#, "config.json: scheduler.max_concurrent: must be at least 1"),
            (r#"{"hook_timeout_secs": 0}"#, "config.json: hook_timeout_secs: must be at least 1"),
            (r#"{"hooks": {"run.started": [[]]}}"#, "config.json: hooks.\"run.started\"[0]: must not be empty (give at least the program)"),
            (r#"{"hooks": {"run.started": [["echo", "{task}"]]}}"#, "config.json: hooks.\"run.started\"[0][1]: unknown placeholder {task}, expected one of {mount} {smith_dir} {task_file} {smith_id} {full_id} {level}"),
        ];
        for (text, want) in rows {
            assert_eq!(
                &Config::parse(text).map_err(|e| e.to_string()).unwrap_err(),
                want,
                "for {text}"
            );
        }
        // Braces that are not placeholders stay literal.
        assert!(
            Config::parse(r#"{"agent": {"command": ["sh", "-c", "f() { :; }; f {level}"]}}"#)
                .is_ok()
        );
        assert!(Config::parse(r#"{"agent": {"command": ["echo", "{}", "{a-b}"]}}"#).is_ok());
    }

    #[test]
    fn syntax_and_duplicate_errors() {
        assert!(err("").starts_with("config.json: invalid JSON: EOF while parsing"));
        assert!(err(r#"{"agent": }"#)
            .starts_with("config.json: invalid JSON: expected value at line 1"));
        // A type error before a syntax error: the syntax error is reported.
        assert!(err(r#"{"scheduler": {"max_concurrent": "4"}, oops"#)
            .starts_with("config.json: invalid JSON"));
        let e = err(r#"{"hook_timeout_secs": 1, "hook_timeout_secs": 2}"#);
        assert!(e.contains("duplicate field `hook_timeout_secs`"), "{e}");
    }

    /// `limits.max_open_files_per_smith`: absent or null is the mount-time default (`None`), a
    /// positive integer is kept; anything else is refused naming the key.
    #[test]
    fn max_open_files_per_smith_table() {
        let key = "limits.max_open_files_per_smith";
        let rows: &[(&str, Result<Option<u32>, &str>)] = &[
            ("{}", Ok(None)),
            (r#"{"limits": {}}"#, Ok(None)),
            (
                r#"{"limits": {"max_open_files_per_smith": null}}"#,
                Ok(None),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": 1}}"#,
                Ok(Some(1)),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": 2000, "max_children": 2}}"#,
                Ok(Some(2000)),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": 4294967295}}"#,
                Ok(Some(u32::MAX)),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": 0}}"#,
                Err("must be at least 1"),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": -5}}"#,
                Err("invalid value: integer `-5`, expected u32"),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": 4294967296}}"#,
                Err("invalid value: integer `4294967296`, expected u32"),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": "lots"}}"#,
                Err("invalid type: string \"lots\", expected u32"),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": 1.5}}"#,
                Err("invalid type: floating point `1.5`, expected u32"),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": [10]}}"#,
                Err("invalid type: sequence, expected u32"),
            ),
            (
                r#"{"limits": {"max_open_files_per_smith": true}}"#,
                Err("invalid type: boolean `true`, expected u32"),
            ),
        ];
        for (text, want) in rows {
            match (Config::parse(text), want) {
                (Ok(c), Ok(n)) => {
                    assert_eq!(c.limits.max_open_files_per_smith, *n, "for {text}");
                    let again = Config::parse(&serde_json::to_string(&c).unwrap()).unwrap();
                    assert_eq!(again, c, "round trip of {text}");
                }
                (Err(e), Err(msg)) => {
                    assert_eq!(
                        e.to_string(),
                        format!("config.json: {key}: {msg}"),
                        "for {text}"
                    );
                }
                (got, _) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(
            err(r#"{"limits": {"max_open_file_per_smith": 9}}"#),
            "config.json: unknown key limits.max_open_file_per_smith (known keys: max_level, max_children, max_open_files_per_smith, max_bytes_per_smith, max_inodes_per_smith, per_smith, per_subtree)"
        );
    }

    /// Every object of the schema accepts `{}` and every list `[]` (all keys are optional).
    #[test]
    fn every_container_of_the_schema_accepts_empty() {
        let text =
            r#"{"agent": {"env": {}}, "scheduler": {}, "limits": {}, "hooks": {"run.exited": []}}"#;
        assert!(Config::parse(text).is_ok());
        assert!(serde_json::from_str::<Config>(r#"{"agent": {"command": []}}"#).is_ok());
        assert!(SmithConfig::parse(r#"{"agent": {"env": {}}}"#).is_ok());
        assert!(serde_json::from_str::<Config>(r#"{"hooks": {"run.exited": [[]]}}"#).is_ok());
    }

    #[test]
    fn smith_config_allows_only_agent() {
        assert_eq!(SmithConfig::parse("{}").unwrap(), SmithConfig::default());
        match SmithConfig::parse(r#"{"scheduler": {"max_concurrent": 1}}"#).unwrap_err() {
            ConfigError::UnknownKey { path, known } => {
                assert_eq!(path, "scheduler");
                assert_eq!(known, "agent");
            }
            other => panic!("{other:?}"),
        }
        let rows: &[(&str, &str)] = &[
            (r#"{"agent": {"comand": []}}"#, "config.json: unknown key agent.comand (known keys: command, env, timeout_secs, retries, kill_grace_secs)"),
            // A parent cannot unconfine its child (docs/PROTOCOL-NOTES.md H13).
            (r#"{"agent": {"confine": false}}"#, "config.json: unknown key agent.confine (known keys: command, env, timeout_secs, retries, kill_grace_secs)"),
            (r#"{"agent": []}"#, "config.json: agent: invalid type: sequence, expected an object"),
            (r#"{"agent": {"retries": "2"}}"#, "config.json: agent.retries: invalid type: string \"2\", expected u32"),
            (r#"{"agent": {"env": {"K": false}}}"#, "config.json: agent.env.K: invalid type: boolean `false`, expected a string"),
            (r#"{"agent": {"command": []}}"#, "config.json: agent.command: must not be empty (give at least the program)"),
            (r#"{"agent": {"command": ["{nope}"]}}"#, "config.json: agent.command[0]: unknown placeholder {nope}, expected one of {mount} {smith_dir} {task_file} {smith_id} {full_id} {level}"),
            (r#"{"agent": {"timeout_secs": 0}}"#, "config.json: agent.timeout_secs: must be at least 1"),
        ];
        for (text, want) in rows {
            assert_eq!(
                &SmithConfig::parse(text).unwrap_err().to_string(),
                want,
                "for {text}"
            );
        }
    }

    #[test]
    fn smith_config_merges_key_by_key() {
        let base = Config::parse(
            r#"{"agent": {"command": ["base"], "env": {"A": "1", "B": "2"}, "timeout_secs": 100, "retries": 2, "kill_grace_secs": 7}}"#,
        )
        .unwrap()
        .agent;
        // Nothing given: the base unchanged.
        assert_eq!(SmithConfig::default().merged(&base), base);
        assert_eq!(
            SmithConfig::parse(r#"{"agent": {}}"#)
                .unwrap()
                .merged(&base),
            base
        );
        // Each key replaces its own; env merges per variable.
        let s = SmithConfig::parse(r#"{"agent": {"command": ["mine", "{full_id}"], "env": {"B": "x", "C": "3"}, "retries": 0}}"#)
            .unwrap();
        let m = s.merged(&base);
        assert_eq!(
            m.command,
            Some(vec!["mine".to_owned(), "{full_id}".to_owned()])
        );
        assert_eq!(m.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(m.env.get("B").map(String::as_str), Some("x"));
        assert_eq!(m.env.get("C").map(String::as_str), Some("3"));
        assert_eq!(m.retries, 0);
        assert_eq!(m.timeout_secs, 100);
        assert_eq!(m.kill_grace_secs, 7);
        // A smith may configure a command where the mount has none.
        let m = SmithConfig::parse(
            r#"{"agent": {"command": ["x"], "timeout_secs": 9, "kill_grace_secs": 0}}"#,
        )
        .unwrap()
        .merged(&AgentConfig::default());
        assert_eq!(m.command, Some(vec!["x".to_owned()]));
        assert_eq!((m.timeout_secs, m.kill_grace_secs), (9, 0));
        // Key by key (§8), but the grace only lowers: a larger one is the mount-wide one (notes
        // H21).
        let m = SmithConfig::parse(
            r#"{"agent": {"timeout_secs": 315360000, "kill_grace_secs": 315360000, "retries": 9}}"#,
        )
        .unwrap()
        .merged(&base);
        assert_eq!(
            (m.timeout_secs, m.kill_grace_secs, m.retries),
            (315360000, 7, 9)
        );
    }

    /// `as_str`, serde (config.json) and clap (`--operator`, `--identity`, `-o`) spell each mode
    /// alike.
    #[test]
    fn modes_are_spelled_alike_everywhere() {
        use clap::ValueEnum;
        fn alike<T>(as_str: fn(T) -> &'static str, count: usize, bad: &str)
        where
            T: ValueEnum + Serialize + Copy + PartialEq + fmt::Debug,
        {
            for m in T::value_variants() {
                let name = m.to_possible_value().map(|v| v.get_name().to_owned());
                assert_eq!(name.as_deref(), Some(as_str(*m)));
                assert_eq!(serde_json::to_value(m).ok(), Some(Value::from(as_str(*m))));
                assert_eq!(T::from_str(as_str(*m), false), Ok(*m));
            }
            assert_eq!(T::value_variants().len(), count);
            assert!(T::from_str(bad, false).is_err());
        }
        alike(OperatorMode::as_str, 2, "rw");
        alike(IdentityMode::as_str, 3, "pid");
    }

    #[test]
    fn placeholder_scanner() {
        assert_eq!(unknown_placeholder("{mount}/{smith_dir}"), None);
        assert_eq!(unknown_placeholder("a{b}c"), Some("b"));
        assert_eq!(unknown_placeholder("{{level}}"), None);
        assert_eq!(unknown_placeholder("{ level }"), None);
        assert_eq!(unknown_placeholder("{"), None);
        assert_eq!(unknown_placeholder("x{level}{zz"), None);
    }

    /// The resource keys of docs/SPEC.md §5/§8: sizes with K/M/G, `cpu_max` as cgroup v2 writes
    /// it, `null` for no limit; a bad value names its key.
    #[test]
    fn resource_limit_keys() {
        use crate::limits::{CpuMax, Size};
        let c = Config::parse(
            r#"{"limits": {"max_bytes_per_smith": "10M", "max_inodes_per_smith": 500,
                "per_smith": {"memory_max": "64M", "pids_max": 32, "cpu_max": "50000 100000"},
                "per_subtree": {"memory_max": 1073741824, "pids_max": null, "cpu_max": "max"}}}"#,
        )
        .expect("limits");
        assert_eq!(c.limits.max_bytes_per_smith, Some(Size(10 << 20)));
        assert_eq!(c.limits.max_inodes_per_smith, Some(500));
        assert_eq!(c.limits.per_smith.memory_max, Some(Size(64 << 20)));
        assert_eq!(c.limits.per_smith.pids_max, Some(32));
        assert_eq!(
            c.limits.per_smith.cpu_max,
            Some(CpuMax {
                quota_us: Some(50_000),
                period_us: 100_000
            })
        );
        assert_eq!(c.limits.per_subtree.memory_max, Some(Size(1 << 30)));
        assert_eq!(c.limits.per_subtree.pids_max, None);
        let spec = Config::parse(
            r#"{"limits": {"max_level": 3, "max_children": 5, "max_open_files_per_smith": null,
                "max_bytes_per_smith": null, "max_inodes_per_smith": null,
                "per_smith": { "memory_max": null, "pids_max": null, "cpu_max": null },
                "per_subtree": { "memory_max": null, "pids_max": null, "cpu_max": null }}}"#,
        )
        .expect("the §8 example");
        assert_eq!(spec, Config::default());
        for (text, want) in [
            (
                r#"{"limits": {"max_bytes_per_smith": "10X"}}"#,
                "config.json: limits.max_bytes_per_smith: \"10X\" is not a size (bytes, or digits with a K, M or G suffix)",
            ),
            (
                r#"{"limits": {"max_bytes_per_smith": 0}}"#,
                "config.json: limits.max_bytes_per_smith: must be at least 1",
            ),
            (
                r#"{"limits": {"max_inodes_per_smith": "many"}}"#,
                "config.json: limits.max_inodes_per_smith: invalid type: string \"many\", expected u64",
            ),
            (
                r#"{"limits": {"max_inodes_per_smith": 0}}"#,
                "config.json: limits.max_inodes_per_smith: must be at least 1",
            ),
            (
                r#"{"limits": {"per_smith": {"memory_max": -1}}}"#,
                "config.json: limits.per_smith.memory_max: invalid value: integer `-1`, expected bytes, or a string with a K, M or G suffix",
            ),
            (
                r#"{"limits": {"per_smith": {"memory_max": "4K"}}}"#,
                "config.json: limits.per_smith.memory_max: 4K is below the smallest memory limit, 1M",
            ),
            (
                r#"{"limits": {"per_subtree": {"pids_max": 0}}}"#,
                "config.json: limits.per_subtree.pids_max: must be at least 1",
            ),
            (
                r#"{"limits": {"per_subtree": {"cpu_max": 0.5}}}"#,
                "config.json: limits.per_subtree.cpu_max: invalid type: floating point `0.5`, expected a string \"QUOTA PERIOD\" in microseconds, or \"max\"",
            ),
            (
                r#"{"limits": {"per_subtree": {"cpu_max": "half"}}}"#,
                "config.json: limits.per_subtree.cpu_max: \"half\" is not a cpu.max value (\"QUOTA PERIOD\" in microseconds, e.g. \"50000 100000\", or \"max\")",
            ),
            (
                r#"{"limits": {"per_smith": {"memory": "1G"}}}"#,
                "config.json: unknown key limits.per_smith.memory (known keys: memory_max, pids_max, cpu_max)",
            ),
        ] {
            assert_eq!(err(text), want, "{text}");
        }
    }
}
