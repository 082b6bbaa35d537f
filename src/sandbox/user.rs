//! The agents' user (docs/SPEC.md §12, "Users"): the unprivileged uid and gid every run executes
//! as, resolved once at mount.
//!
//! Order of choice for the shared agents' user:
//! 1. a daemon that is not root: its own uid and gid (it cannot become anyone else);
//! 2. `sandbox.uid` when it is a number (the group: that account's, else the same number);
//! 3. the uid recorded in the store (`.smithfs-state/agent-user.json`) by an earlier mount — it
//!    wins over a later, different `SUDO_UID`, so a tree keeps its owner;
//! 4. `SUDO_UID`/`SUDO_GID` of `sudo smithfs mount` (not 0), then recorded;
//! 5. one uid smithfs allocates: never an account of `/etc/passwd` (nor a group of `/etc/group`,
//!    the gid is the same number), never inside an `/etc/subuid` or `/etc/subgid` range, never one
//!    another store holds; recorded host-wide in [`HOST_REGISTRY`] under an exclusive lock (so two
//!    mounts never share it) and in the store (so a remount keeps it).
//!
//! `sandbox.uid_per_smith` adds a range of [`PER_SMITH_RANGE`] uids, allocated and recorded the
//! same way; each smith takes the next free uid of it at its first use ([`AgentUser::uid_of`]),
//! kept in the store's record for good (full ids are never reused, §4). The gid of a per-smith
//! uid is the same number.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::backing;
use crate::config::{SandboxConfig, SandboxUid};
use crate::tree::model::FullId;

/// The host-wide record of allocated uids: one line `FIRST COUNT STORE` per allocation (decimal
/// uids, the store's path as the rest of the line). Locked with `flock(LOCK_EX)` while a mount
/// allocates. Lines are never removed: a uid that owned files stays taken.
pub const HOST_REGISTRY: &str = "/var/lib/smithfs/uids";

/// The store's record of its agents' user, in `.smithfs-state/` (JSON, a `Record`).
pub const STORE_RECORD: &str = "agent-user.json";

/// First uid smithfs allocates: above systemd's container ranges (which end at `0x6FFFFFFF`).
pub const AUTO_FIRST: u32 = 0x7000_0000;

/// End (exclusive) of the allocatable uids: systemd's "foreign" range starts here.
pub const AUTO_END: u32 = 0x7FFE_0000;

/// How many uids `sandbox.uid_per_smith` reserves for one store.
pub const PER_SMITH_RANGE: u32 = 65_536;

/// The user name a run's view gives an uid that has no account (allocated, per-smith).
pub const AGENT_NAME: &str = "smith";

/// Why the agents' user could not be resolved. Every message names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// A host file or the store's record could not be read or written.
    #[error("sandbox: {what}: {err}")]
    Io {
        /// The file and the action.
        what: String,
        /// The system's answer.
        err: std::io::Error,
    },
    /// The store's record is not what smithfs writes.
    #[error("sandbox: .smithfs-state/{STORE_RECORD} is not valid: {0}; remove it to choose the agents' user again")]
    BadRecord(String),
    /// No block of free uids is left in `[AUTO_FIRST, AUTO_END)`.
    #[error(
        "sandbox: no free block of {0} uids between {AUTO_FIRST} and {AUTO_END}; set sandbox.uid"
    )]
    NoFreeUid(u32),
    /// The uid recorded as allocated became an account since.
    #[error("sandbox: the agents' uid {uid} recorded in .smithfs-state/{STORE_RECORD} is now the account {name} of /etc/passwd; set sandbox.uid, or remove the record to allocate another")]
    RecordedIsAccount {
        /// The recorded uid.
        uid: u32,
        /// The account's name.
        name: String,
    },
    /// Every uid of the per-smith range is taken.
    #[error("sandbox: the {PER_SMITH_RANGE} uids of sandbox.uid_per_smith are all given out; no uid for {0}")]
    RangeFull(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> UserError {
    let what = what.into();
    move |err| UserError::Io { what, err }
}

/// Where the shared agents' uid came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UserSource {
    /// `sandbox.uid`.
    Config,
    /// `SUDO_UID` of the first sandboxed mount.
    Sudo,
    /// Allocated by smithfs ([`HOST_REGISTRY`]).
    Allocated,
    /// The daemon's own uid (a daemon that is not root).
    Daemon,
}

impl fmt::Display for UserSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UserSource::Config => "sandbox.uid",
            UserSource::Sudo => "SUDO_UID",
            UserSource::Allocated => "allocated",
            UserSource::Daemon => "the daemon's uid",
        })
    }
}

/// The host's account files and the host-wide registry (paths, so tests use their own).
#[derive(Clone, Debug)]
pub struct HostFiles {
    /// `/etc/passwd`.
    pub passwd: PathBuf,
    /// `/etc/group`.
    pub group: PathBuf,
    /// `/etc/subuid`.
    pub subuid: PathBuf,
    /// `/etc/subgid`.
    pub subgid: PathBuf,
    /// [`HOST_REGISTRY`].
    pub registry: PathBuf,
}

impl HostFiles {
    /// The real host's files.
    pub fn system() -> HostFiles {
        HostFiles {
            passwd: "/etc/passwd".into(),
            group: "/etc/group".into(),
            subuid: "/etc/subuid".into(),
            subgid: "/etc/subgid".into(),
            registry: HOST_REGISTRY.into(),
        }
    }
}

/// Who started the mount: the daemon's effective ids and `sudo`'s variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invoker {
    /// The daemon's effective uid.
    pub euid: u32,
    /// The daemon's effective gid.
    pub egid: u32,
    /// `SUDO_UID`, when set to a number other than 0.
    pub sudo_uid: Option<u32>,
    /// `SUDO_GID`, when set to a number.
    pub sudo_gid: Option<u32>,
}

impl Invoker {
    /// This process's ids and environment.
    pub fn current() -> Invoker {
        let num = |k: &str| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        Invoker {
            // SAFETY: geteuid/getegid have no preconditions.
            euid: unsafe { libc::geteuid() },
            // SAFETY: as above.
            egid: unsafe { libc::getegid() },
            sudo_uid: num("SUDO_UID").filter(|&u| u != 0),
            sudo_gid: num("SUDO_GID"),
        }
    }
}

/// The store's record (`.smithfs-state/agent-user.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    /// The shared agents' user, once chosen by `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shared: Option<Shared>,
    /// The per-smith range, once `uid_per_smith` was on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    per_smith: Option<Range>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Shared {
    uid: u32,
    gid: u32,
    source: UserSource,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Range {
    first: u32,
    count: u32,
    /// full id → its uid, for every smith that ever had one.
    smiths: BTreeMap<String, u32>,
}

/// The agents' user of one mount (docs/SPEC.md §12). Made once by [`AgentUser::resolve`], shared
/// (`Arc`) by the filesystem (the operator rule, ownership), the scheduler and the run's view.
pub struct AgentUser {
    uid: u32,
    gid: u32,
    name: String,
    source: UserSource,
    /// The per-smith range and the descriptor of `.smithfs-state/` to record new smiths in.
    per_smith: Option<PerSmith>,
}

struct PerSmith {
    state: OwnedFd,
    record: Mutex<Record>,
}

impl fmt::Debug for AgentUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentUser")
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("name", &self.name)
            .field("source", &self.source)
            .field("per_smith", &self.per_smith_range())
            .finish()
    }
}

impl AgentUser {
    /// Resolve the agents' user of the store at `store` (its path, for the host registry) whose
    /// `.smithfs-state/` is `state`, as the module's doc orders the choices. Writes the store's
    /// record (and the host registry) when it chose anew. Errors: a host file or the record
    /// unreadable/unwritable, a malformed record, no free uid, a recorded allocated uid that
    /// became an account.
    pub fn resolve(
        cfg: &SandboxConfig,
        store: &Path,
        state: BorrowedFd<'_>,
        host: &HostFiles,
        who: Invoker,
    ) -> Result<AgentUser, UserError> {
        let accounts = Accounts::read(host)?;
        if who.euid != 0 {
            return Ok(AgentUser {
                uid: who.euid,
                gid: who.egid,
                name: accounts.name_of(who.euid),
                source: UserSource::Daemon,
                per_smith: None,
            });
        }
        let mut record = read_record(state)?;
        let before = record.clone();
        let (uid, gid, source) = match cfg.uid {
            SandboxUid::Uid(n) => (n, accounts.gid_of(n).unwrap_or(n), UserSource::Config),
            SandboxUid::Auto => match &record.shared {
                Some(s) => {
                    if s.source == UserSource::Allocated {
                        if let Some(name) = accounts.account(s.uid) {
                            return Err(UserError::RecordedIsAccount {
                                uid: s.uid,
                                name: name.to_owned(),
                            });
                        }
                    }
                    (s.uid, s.gid, s.source)
                }
                None => {
                    let (uid, gid, source) = match who.sudo_uid {
                        Some(u) => (
                            u,
                            who.sudo_gid.or_else(|| accounts.gid_of(u)).unwrap_or(u),
                            UserSource::Sudo,
                        ),
                        None => {
                            let u = allocate(host, &accounts, 1, store)?;
                            (u, u, UserSource::Allocated)
                        }
                    };
                    record.shared = Some(Shared { uid, gid, source });
                    (uid, gid, source)
                }
            },
        };
        if cfg.uid_per_smith && record.per_smith.is_none() {
            let first = allocate(host, &accounts, PER_SMITH_RANGE, store)?;
            record.per_smith = Some(Range {
                first,
                count: PER_SMITH_RANGE,
                smiths: BTreeMap::new(),
            });
        }
        if record != before {
            write_record(state, &record)?;
        }
        let per_smith = if cfg.uid_per_smith {
            Some(PerSmith {
                state: backing::dup(state).map_err(|e| UserError::Io {
                    what: "cannot keep .smithfs-state open".into(),
                    err: e.into(),
                })?,
                record: Mutex::new(record),
            })
        } else {
            None
        };
        Ok(AgentUser {
            uid,
            gid,
            name: accounts.name_of(uid),
            source,
            per_smith,
        })
    }

    /// The shared agents' uid (the Operator's third uid, §2; the owner of what the scaffold makes).
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The shared agents' gid.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// The shared agents' user name: the account's, else [`AGENT_NAME`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the uid came from.
    pub fn source(&self) -> UserSource {
        self.source
    }

    /// `(first, count)` of the per-smith range, with `uid_per_smith`.
    pub fn per_smith_range(&self) -> Option<(u32, u32)> {
        let p = self.per_smith.as_ref()?;
        let r = p.record.lock();
        r.per_smith.as_ref().map(|r| (r.first, r.count))
    }

    /// Is `uid` one the sandbox runs agents as (the shared uid or one of the per-smith range)?
    pub fn is_agent_uid(&self, uid: u32) -> bool {
        uid == self.uid
            || self
                .per_smith_range()
                .is_some_and(|(first, count)| uid >= first && uid - first < count)
    }

    /// The uid and gid `smith`'s runs execute as and its files belong to: the shared ones, or
    /// with `uid_per_smith` the smith's own (given out at its first call and recorded in the
    /// store). Errors only with `uid_per_smith`: the range is full, or the record cannot be
    /// written (then nothing is given out).
    pub fn uid_of(&self, smith: &FullId) -> Result<(u32, u32), UserError> {
        let Some(p) = &self.per_smith else {
            return Ok((self.uid, self.gid));
        };
        let mut record = p.record.lock();
        let Some(range) = record.per_smith.as_mut() else {
            return Ok((self.uid, self.gid));
        };
        if let Some(&uid) = range.smiths.get(smith.as_str()) {
            return Ok((uid, uid));
        }
        let next = range
            .smiths
            .values()
            .max()
            .map_or(range.first, |&u| u.saturating_add(1));
        if next - range.first >= range.count {
            return Err(UserError::RangeFull(smith.as_str().to_owned()));
        }
        range.smiths.insert(smith.as_str().to_owned(), next);
        if let Err(e) = write_record(p.state.as_fd(), &record) {
            if let Some(r) = record.per_smith.as_mut() {
                r.smiths.remove(smith.as_str());
            }
            return Err(e);
        }
        Ok((next, next))
    }

    /// The user name of `smith`'s runs in their view: the shared user's, or [`AGENT_NAME`] with
    /// `uid_per_smith`.
    pub fn name_of(&self, _smith: &FullId) -> &str {
        if self.per_smith.is_some() {
            AGENT_NAME
        } else {
            &self.name
        }
    }
}

/// One `/etc/passwd` line (with its newline) for a run's view: `name:x:uid:gid:smithfs
/// agent:home:/bin/sh`.
pub fn passwd_entry(name: &str, uid: u32, gid: u32, home: &Path) -> String {
    format!(
        "{name}:x:{uid}:{gid}:smithfs agent:{}:/bin/sh\n",
        home.display()
    )
}

/// One `/etc/group` line (with its newline) for a run's view: `name:x:gid:`.
pub fn group_entry(name: &str, gid: u32) -> String {
    format!("{name}:x:{gid}:\n")
}

/// The host's `/etc/passwd` or `/etc/group` text `host` with `entry` (from [`passwd_entry`] or
/// [`group_entry`]) in place of every line of the same name or the same id (third field), so
/// that the run's uid has exactly one name and `getpwuid` finds its home.
pub fn view_file(host: &str, entry: &str) -> String {
    let mut f = entry.split(':');
    let (name, id) = (f.next().unwrap_or(""), f.nth(1).unwrap_or(""));
    let mut out = String::with_capacity(host.len() + entry.len());
    for line in host.lines() {
        let mut g = line.split(':');
        let (n, i) = (g.next().unwrap_or(""), g.nth(1).unwrap_or(""));
        if n == name || (!i.is_empty() && i == id) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(entry);
    out
}

/// What the host's account files say, read once.
struct Accounts {
    /// uid → (name, gid).
    users: BTreeMap<u32, (String, u32)>,
    /// gids of `/etc/group`.
    groups: Vec<u32>,
    /// `[first, end)` ranges of `/etc/subuid` and `/etc/subgid`.
    subids: Vec<(u64, u64)>,
}

impl Accounts {
    fn read(host: &HostFiles) -> Result<Accounts, UserError> {
        let passwd = read_optional(&host.passwd)?;
        let group = read_optional(&host.group)?;
        let mut users = BTreeMap::new();
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if let (Some(name), Some(Ok(uid)), Some(Ok(gid))) = (
                f.first(),
                f.get(2).map(|s| s.parse::<u32>()),
                f.get(3).map(|s| s.parse::<u32>()),
            ) {
                users.entry(uid).or_insert(((*name).to_owned(), gid));
            }
        }
        let groups = group
            .lines()
            .filter_map(|l| l.split(':').nth(2)?.parse().ok())
            .collect();
        let mut subids = Vec::new();
        for path in [&host.subuid, &host.subgid] {
            for line in read_optional(path)?.lines() {
                let f: Vec<&str> = line.split(':').collect();
                if let (Some(Ok(first)), Some(Ok(count))) = (
                    f.get(1).map(|s| s.trim().parse::<u64>()),
                    f.get(2).map(|s| s.trim().parse::<u64>()),
                ) {
                    subids.push((first, first + count));
                }
            }
        }
        Ok(Accounts {
            users,
            groups,
            subids,
        })
    }

    fn account(&self, uid: u32) -> Option<&str> {
        self.users.get(&uid).map(|(n, _)| n.as_str())
    }

    fn gid_of(&self, uid: u32) -> Option<u32> {
        self.users.get(&uid).map(|&(_, g)| g)
    }

    fn name_of(&self, uid: u32) -> String {
        self.account(uid).unwrap_or(AGENT_NAME).to_owned()
    }
}

fn read_optional(path: &Path) -> Result<String, UserError> {
    match std::fs::read(path) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(io_err(format!("cannot read {}", path.display()))(e)),
    }
}

/// The first `[u, u + count)` in `[AUTO_FIRST, AUTO_END)` that meets no taken id: an account, a
/// group, a subordinate range, an earlier allocation (`registry` lines `FIRST COUNT …`).
fn first_free(accounts: &Accounts, registry: &str, count: u32) -> Option<u32> {
    let mut taken: Vec<(u64, u64)> = accounts
        .users
        .keys()
        .chain(accounts.groups.iter())
        .map(|&u| (u64::from(u), u64::from(u) + 1))
        .chain(accounts.subids.iter().copied())
        .chain(registry.lines().filter_map(|l| {
            let mut f = l.split_whitespace();
            let first: u64 = f.next()?.parse().ok()?;
            let n: u64 = f.next()?.parse().ok()?;
            Some((first, first + n))
        }))
        .collect();
    taken.sort_unstable();
    let mut cand = u64::from(AUTO_FIRST);
    let want = u64::from(count);
    for (first, end) in taken {
        if end <= cand {
            continue;
        }
        if first >= cand + want {
            break;
        }
        cand = end;
    }
    (cand + want <= u64::from(AUTO_END)).then(|| u32::try_from(cand).ok())?
}

/// Allocate `count` uids host-wide for `store`: under the registry's lock, the first free block,
/// appended to the registry and synced before it is used.
fn allocate(
    host: &HostFiles,
    accounts: &Accounts,
    count: u32,
    store: &Path,
) -> Result<u32, UserError> {
    let reg = &host.registry;
    if let Some(dir) = reg.parent() {
        // Explicit modes: the daemon runs with umask 0, and a registry others could write would
        // let any local user make two mounts share a uid.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(io_err(format!("cannot create {}", dir.display())))?;
        keep_unwritable_by_others(dir, 0o755)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o644)
        .open(reg)
        .map_err(io_err(format!("cannot open {}", reg.display())))?;
    keep_unwritable_by_others(reg, 0o644)?;
    // SAFETY: flock on a descriptor we own; released when `file` closes.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io_err(format!("cannot lock {}", reg.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    let mut text = String::new();
    file.rewind()
        .and_then(|_| file.read_to_string(&mut text))
        .map_err(io_err(format!("cannot read {}", reg.display())))?;
    let first = first_free(accounts, &text, count).ok_or(UserError::NoFreeUid(count))?;
    let line = format!("{first} {count} {}\n", store.display());
    file.write_all(line.as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(io_err(format!("cannot write {}", reg.display())))?;
    tracing::info!(first, count, registry = %reg.display(), "sandbox: uids allocated");
    Ok(first)
}

/// The host registry and its directory must be this process's and writable by it alone: one of
/// another owner is refused (someone else could rewrite the allocations), one that is group- or
/// other-writable (made by an earlier version under umask 0) is given `mode`.
fn keep_unwritable_by_others(path: &Path, mode: u32) -> Result<(), UserError> {
    let meta = std::fs::symlink_metadata(path)
        .map_err(io_err(format!("cannot stat {}", path.display())))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid || meta.file_type().is_symlink() {
        return Err(UserError::Io {
            what: format!("{} is not owned by uid {euid}", path.display()),
            err: std::io::Error::from_raw_os_error(libc::EPERM),
        });
    }
    if meta.mode() & 0o022 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(io_err(format!("cannot chmod {}", path.display())))?;
    }
    Ok(())
}

fn record_name() -> CString {
    CString::new(STORE_RECORD).unwrap_or_default()
}

fn read_record(state: BorrowedFd<'_>) -> Result<Record, UserError> {
    match backing::read_file(state, Path::new(STORE_RECORD)) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map_err(|e| UserError::BadRecord(e.to_string()))
        }
        Err(nix::errno::Errno::ENOENT) => Ok(Record::default()),
        Err(e) => Err(UserError::Io {
            what: format!("cannot read .smithfs-state/{STORE_RECORD}"),
            err: e.into(),
        }),
    }
}

fn write_record(state: BorrowedFd<'_>, record: &Record) -> Result<(), UserError> {
    let mut text =
        serde_json::to_vec_pretty(record).map_err(|e| UserError::BadRecord(e.to_string()))?;
    text.push(b'\n');
    backing::write_atomic(state, &record_name(), &text, 0o644).map_err(|e| UserError::Io {
        what: format!("cannot write .smithfs-state/{STORE_RECORD}"),
        err: e.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Host {
        dir: tempfile::TempDir,
        files: HostFiles,
        state: OwnedFd,
    }

    fn host(passwd: &str, group: &str, subuid: &str, subgid: &str, registry: &str) -> Host {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |n: &str| dir.path().join(n);
        for (n, t) in [
            ("passwd", passwd),
            ("group", group),
            ("subuid", subuid),
            ("subgid", subgid),
            ("registry", registry),
        ] {
            std::fs::write(p(n), t).expect("write");
        }
        std::fs::create_dir(p("state")).expect("mkdir");
        let state = std::fs::File::open(p("state")).expect("open").into();
        let files = HostFiles {
            passwd: p("passwd"),
            group: p("group"),
            subuid: p("subuid"),
            subgid: p("subgid"),
            registry: p("registry"),
        };
        Host { dir, files, state }
    }

    fn root(sudo: Option<(u32, u32)>) -> Invoker {
        Invoker {
            euid: 0,
            egid: 0,
            sudo_uid: sudo.map(|s| s.0),
            sudo_gid: sudo.map(|s| s.1),
        }
    }

    fn resolve(h: &Host, cfg: &SandboxConfig, who: Invoker) -> Result<AgentUser, UserError> {
        AgentUser::resolve(cfg, Path::new("/srv/tree"), h.state.as_fd(), &h.files, who)
    }

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\n";

    #[test]
    fn allocation_skips_accounts_groups_subids_and_earlier_allocations() {
        let f = AUTO_FIRST;
        // (passwd, group, subuid, subgid, registry, expected uid)
        let cases: Vec<(String, String, String, String, String, u32)> = vec![
            (PASSWD.into(), "".into(), "".into(), "".into(), "".into(), f),
            (
                format!("{PASSWD}x:x:{f}:5::/:/bin/sh\n"),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
                f + 1,
            ),
            (
                "".into(),
                format!("g:x:{f}:\n"),
                "".into(),
                "".into(),
                "".into(),
                f + 1,
            ),
            (
                "".into(),
                "".into(),
                format!("alice:{f}:65536\n"),
                "".into(),
                "".into(),
                f + 65536,
            ),
            (
                "".into(),
                "".into(),
                "".into(),
                format!("1000:{}:10\n", f - 5),
                "".into(),
                f + 5,
            ),
            (
                "".into(),
                "".into(),
                "".into(),
                "".into(),
                format!("{f} 1 /a\n{} 3 /b\n", f + 1),
                f + 4,
            ),
            (
                format!("a:x:{}:0::/:/bin/sh\n", f + 4),
                "".into(),
                format!("b:{}:2\n", f + 2),
                "".into(),
                format!("{f} 2 /a\n"),
                f + 5,
            ),
        ];
        for (i, (passwd, group, subuid, subgid, reg, want)) in cases.into_iter().enumerate() {
            let h = host(&passwd, &group, &subuid, &subgid, &reg);
            let u = resolve(&h, &SandboxConfig::default(), root(None)).expect("resolve");
            assert_eq!(
                (u.uid(), u.gid(), u.source()),
                (want, want, UserSource::Allocated),
                "case {i}"
            );
            assert_eq!(u.name(), AGENT_NAME);
            let reg = std::fs::read_to_string(&h.files.registry).expect("registry");
            assert!(
                reg.ends_with(&format!("{want} 1 /srv/tree\n")),
                "case {i}: {reg}"
            );
        }
    }

    /// The registry (made by an earlier build under the daemon's umask 0) that others could
    /// write is made 0644 at the next allocation; its directory 0755.
    #[test]
    fn the_registry_is_writable_by_its_owner_alone() {
        use std::os::unix::fs::PermissionsExt;
        let h = host("", "", "", "", "");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        let dir = h.files.registry.parent().expect("dir").to_path_buf();
        std::fs::set_permissions(&h.files.registry, std::fs::Permissions::from_mode(0o666))
            .expect("chmod");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        resolve(&h, &SandboxConfig::default(), root(None)).expect("resolve");
        assert_eq!(mode(&h.files.registry), 0o644);
        assert_eq!(mode(&dir), 0o755);
    }

    #[test]
    fn no_free_block_is_an_error() {
        let reg = format!("{AUTO_FIRST} {} /full\n", AUTO_END - AUTO_FIRST);
        let h = host("", "", "", "", &reg);
        let e = resolve(&h, &SandboxConfig::default(), root(None)).expect_err("full");
        assert!(matches!(e, UserError::NoFreeUid(1)), "{e}");
    }

    #[test]
    fn sudo_then_the_record_wins() {
        let h = host(PASSWD, "", "", "", "");
        let cfg = SandboxConfig::default();
        // (invoker, expected (uid, gid, source, name))
        let steps = [
            (
                root(Some((1000, 1000))),
                (1000, 1000, UserSource::Sudo, "alice"),
            ),
            // A later, different SUDO_UID: the record wins.
            (
                root(Some((1001, 1001))),
                (1000, 1000, UserSource::Sudo, "alice"),
            ),
            // No SUDO_UID at all: still the record.
            (root(None), (1000, 1000, UserSource::Sudo, "alice")),
        ];
        for (i, (who, want)) in steps.into_iter().enumerate() {
            let u = resolve(&h, &cfg, who).expect("resolve");
            assert_eq!((u.uid(), u.gid(), u.source(), u.name()), want, "step {i}");
        }
        // Nothing was allocated host-wide.
        assert_eq!(std::fs::read_to_string(&h.files.registry).expect("reg"), "");
    }

    #[test]
    fn an_allocated_uid_is_kept_across_mounts() {
        let h = host(PASSWD, "", "", "", "");
        let cfg = SandboxConfig::default();
        let a = resolve(&h, &cfg, root(None)).expect("first");
        let b = resolve(&h, &cfg, root(Some((1000, 1000)))).expect("second");
        assert_eq!((b.uid(), b.source()), (a.uid(), UserSource::Allocated));
        assert_eq!(
            std::fs::read_to_string(&h.files.registry)
                .expect("reg")
                .lines()
                .count(),
            1
        );
        // The recorded uid became an account meanwhile: refused, naming it.
        std::fs::write(
            &h.files.passwd,
            format!("{PASSWD}bob:x:{}:0::/:/bin/sh\n", a.uid()),
        )
        .expect("write");
        let e = resolve(&h, &cfg, root(None)).expect_err("account");
        assert!(e.to_string().contains("account bob"), "{e}");
    }

    #[test]
    fn explicit_uid_and_non_root_daemon() {
        let h = host(PASSWD, "", "", "", "");
        let cfg = SandboxConfig {
            uid: SandboxUid::Uid(1000),
            ..SandboxConfig::default()
        };
        let u = resolve(&h, &cfg, root(Some((1001, 1001)))).expect("config");
        assert_eq!(
            (u.uid(), u.gid(), u.source(), u.name()),
            (1000, 1000, UserSource::Config, "alice")
        );
        let cfg = SandboxConfig {
            uid: SandboxUid::Uid(4242),
            ..SandboxConfig::default()
        };
        let u = resolve(&h, &cfg, root(None)).expect("config");
        assert_eq!((u.uid(), u.gid(), u.name()), (4242, 4242, AGENT_NAME));
        // The explicit uid is not recorded: `auto` later chooses afresh.
        assert!(read_record(h.state.as_fd())
            .expect("record")
            .shared
            .is_none());
        let daemon = Invoker {
            euid: 1000,
            egid: 1000,
            sudo_uid: None,
            sudo_gid: None,
        };
        let u = resolve(&h, &cfg, daemon).expect("daemon");
        assert_eq!(
            (u.uid(), u.source(), u.per_smith_range()),
            (1000, UserSource::Daemon, None)
        );
    }

    #[test]
    fn per_smith_uids_are_given_once_and_kept() {
        let h = host(PASSWD, "", "alice:100000:65536\n", "", "");
        let cfg = SandboxConfig {
            uid_per_smith: true,
            ..SandboxConfig::default()
        };
        let u = resolve(&h, &cfg, root(Some((1000, 1000)))).expect("resolve");
        let (first, count) = u.per_smith_range().expect("range");
        assert_eq!((first, count), (AUTO_FIRST, PER_SMITH_RANGE));
        let r = FullId::root();
        let c = r.child("smith-001").expect("child");
        assert_eq!(u.uid_of(&r).expect("root"), (first, first));
        assert_eq!(u.uid_of(&c).expect("child"), (first + 1, first + 1));
        assert_eq!(u.uid_of(&r).expect("again"), (first, first));
        assert!(
            u.is_agent_uid(first + 1) && u.is_agent_uid(1000) && !u.is_agent_uid(first + count)
        );
        assert_eq!(u.name_of(&c), AGENT_NAME);
        // A remount keeps the range and the smiths' uids; the next smith gets the next uid.
        drop(u);
        let u = resolve(&h, &cfg, root(None)).expect("again");
        assert_eq!(u.uid(), 1000);
        assert_eq!(u.uid_of(&c).expect("child"), (first + 1, first + 1));
        let d = r.child("smith-002").expect("child");
        assert_eq!(u.uid_of(&d).expect("new"), (first + 2, first + 2));
        // Without uid_per_smith, every smith is the shared user.
        let u = resolve(&h, &SandboxConfig::default(), root(None)).expect("shared");
        assert_eq!(u.uid_of(&c).expect("shared"), (1000, 1000));
        assert_eq!(u.name_of(&c), "alice");
        drop(h.dir);
    }

    #[test]
    fn view_files_replace_the_same_name_or_id() {
        let e = passwd_entry("alice", 1000, 1000, Path::new("/t/smiths/smith-root/home"));
        assert_eq!(
            e,
            "alice:x:1000:1000:smithfs agent:/t/smiths/smith-root/home:/bin/sh\n"
        );
        let v = view_file(PASSWD, &e);
        assert_eq!(
            v,
            "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000:smithfs agent:/t/smiths/smith-root/home:/bin/sh\n"
        );
        let g = group_entry("smith", 77);
        assert_eq!(
            view_file("root:x:0:\nold:x:77:\n", &g),
            "root:x:0:\nsmith:x:77:\n"
        );
    }
}
