//! The virtual control directory `.smithfs/` at the mount root (docs/SPEC.md §7): `whoami`,
//! `why`, `ctl`, `status.json`, `events.jsonl`. Never stored; content depends on the caller, so
//! the glue serves it with no attribute caching and direct I/O.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::ids::NodeId;
use crate::tree::model::FullId;

/// Node id of `.smithfs/` itself. Virtual ids sit far above any backing inode number.
pub const DIR_ID: NodeId = NodeId(0xFFFF_FFFF_FFFF_0000);

/// The name of the control directory at the mount root.
pub const DIR_NAME: &str = ".smithfs";

/// The files of `.smithfs/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlFile {
    /// The caller's identity and rights.
    Whoami,
    /// The caller's identity's most recent denial.
    Why,
    /// Commands: `bind <full-id>`, `cancel <full-id>`, `retry <full-id>`.
    Ctl,
    /// The tree's state.
    Status,
    /// The journal.
    Events,
    /// The daemon's own log (`.smithfs-state/daemon.log`): `smithfs logs --daemon` while
    /// mounted.
    DaemonLog,
}

impl ControlFile {
    /// Every control file, in listing order.
    pub const ALL: [ControlFile; 6] = [
        ControlFile::Whoami,
        ControlFile::Why,
        ControlFile::Ctl,
        ControlFile::Status,
        ControlFile::Events,
        ControlFile::DaemonLog,
    ];

    /// Its node id.
    pub fn id(self) -> NodeId {
        NodeId(
            DIR_ID.0
                + match self {
                    ControlFile::Whoami => 1,
                    ControlFile::Why => 2,
                    ControlFile::Ctl => 3,
                    ControlFile::Status => 4,
                    ControlFile::Events => 5,
                    ControlFile::DaemonLog => 6,
                },
        )
    }

    /// Its name in `.smithfs/`.
    pub fn name(self) -> &'static str {
        match self {
            ControlFile::Whoami => "whoami",
            ControlFile::Why => "why",
            ControlFile::Ctl => "ctl",
            ControlFile::Status => "status.json",
            ControlFile::Events => "events.jsonl",
            ControlFile::DaemonLog => "daemon.log",
        }
    }

    /// The control file named `name`.
    pub fn by_name(name: &OsStr) -> Option<ControlFile> {
        Self::ALL
            .into_iter()
            .find(|f| f.name().as_bytes() == name.as_bytes())
    }

    /// The control file with node id `id`.
    pub fn by_id(id: NodeId) -> Option<ControlFile> {
        Self::ALL.into_iter().find(|f| f.id() == id)
    }

    /// Permission bits: `ctl` is writable by everyone (each command checks its writer's
    /// authority), the rest are read-only.
    pub fn mode(self) -> u32 {
        match self {
            ControlFile::Ctl => 0o666,
            ControlFile::Whoami
            | ControlFile::Why
            | ControlFile::Status
            | ControlFile::Events
            | ControlFile::DaemonLog => 0o444,
        }
    }
}

/// Is `id` a virtual node id (the control directory or one of its files)?
pub fn is_virtual(id: NodeId) -> bool {
    id == DIR_ID || ControlFile::by_id(id).is_some()
}

/// A command written to `ctl` (docs/SPEC.md §7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Bind the writing process to a smith (operator only).
    Bind(FullId),
    /// Cancel a smith's run and its subtree's (operator or an ancestor smith).
    Cancel(FullId),
    /// Run a failed or cancelled smith again on its newest task (operator or an ancestor
    /// smith; `smithfs retry`, docs/SPEC.md §6).
    Retry(FullId),
    /// Re-read config.json and apply it without a remount (operator only; `smithfs reload`,
    /// docs/SPEC.md §6).
    Reload,
}

/// Parse one line written to `ctl`: `bind <full-id>`, `cancel <full-id>` or `retry <full-id>`, surrounding
/// whitespace ignored. Errors: a sentence saying what is wrong (the write fails with EINVAL).
pub fn parse_command(line: &str) -> Result<Command, String> {
    let mut words = line.split_whitespace();
    let verb = words.next().ok_or("empty command")?;
    let arg = words.next();
    if words.next().is_some() {
        return Err(format!("too many words in `{}`", line.trim()));
    }
    let full_id = |a: Option<&str>| -> Result<FullId, String> {
        let a = a.ok_or_else(|| format!("`{verb}` needs a smith's full id"))?;
        FullId::parse(a)
            .ok_or_else(|| format!("`{a}` is not a full id (smith-root or smith-root/smith-NNN/…)"))
    };
    match verb {
        "reload" if arg.is_some() => Err("`reload` takes no argument".into()),
        "reload" => Ok(Command::Reload),
        "bind" => Ok(Command::Bind(full_id(arg)?)),
        "cancel" => Ok(Command::Cancel(full_id(arg)?)),
        "retry" => Ok(Command::Retry(full_id(arg)?)),
        other => Err(format!(
            "unknown command `{other}` (use bind, cancel, retry or reload)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fid(s: &str) -> FullId {
        FullId::parse(s).unwrap()
    }

    #[test]
    fn parses_ctl_commands() {
        let cases: &[(&str, Result<Command, ()>)] = &[
            ("bind smith-root", Ok(Command::Bind(FullId::root()))),
            (
                "  cancel smith-root/smith-001 \n",
                Ok(Command::Cancel(fid("smith-root/smith-001"))),
            ),
            (
                "retry smith-root/smith-002",
                Ok(Command::Retry(fid("smith-root/smith-002"))),
            ),
            ("bind", Err(())),
            ("bind smith-1", Err(())),
            ("bind smith-root/x", Err(())),
            ("bind smith-root extra", Err(())),
            ("kill smith-root", Err(())),
            (" reload ", Ok(Command::Reload)),
            ("reload smith-root", Err(())),
            ("", Err(())),
        ];
        for (line, want) in cases {
            let got = parse_command(line).map_err(|_| ());
            assert_eq!(&got, want, "{line:?}");
        }
    }

    #[test]
    fn control_ids_round_trip() {
        for f in ControlFile::ALL {
            assert_eq!(ControlFile::by_id(f.id()), Some(f));
            assert_eq!(ControlFile::by_name(OsStr::new(f.name())), Some(f));
            assert!(is_virtual(f.id()));
        }
        assert!(is_virtual(DIR_ID));
        assert!(!is_virtual(NodeId::ROOT));
    }
}
