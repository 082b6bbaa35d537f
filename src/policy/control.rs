//! The decisions the filesystem used to word inline (docs/SPEC.md §3, §6, §7, §8): opening the
//! control files, `ctl` commands by identity and ancestry, the open-file budgets, reserved
//! names and `RENAME_WHITEOUT`. Pure: the caller passes what it knows (names, limits, ancestry)
//! and enforces the answer.

use nix::errno::Errno;

use crate::identity::Identity;
use crate::policy::rules::{Decision, Denial, Rule};
use crate::policy::zone::Area;
use crate::tree::model::SmithIdx;

/// The control directory's name, for sentences.
const CONTROL_DIR: &str = ".smithfs";

/// Open a control file (docs/SPEC.md §7): every identified process may read them; only `ctl`
/// is written; an unidentified process may open none (EACCES).
pub fn decide_control_open(id: &Identity, is_ctl: bool, writing: bool) -> Decision {
    let (rule, why) = match () {
        _ if *id == Identity::Unknown => (
            Rule::UnknownControl,
            "A process of unknown identity may not open the control files.",
        ),
        _ if writing && !is_ctl => (
            Rule::Outside(crate::policy::RootArea::Control),
            "Only .smithfs/ctl is writable in the control directory.",
        ),
        _ => return Decision::Allow,
    };
    Decision::Deny(rule.deny(
        why.into(),
        "Read whoami, why, status.json and events.jsonl; write commands to ctl.".into(),
    ))
}

/// A `ctl` line that does not parse (EINVAL); `msg` is the parser's reason.
pub fn ctl_syntax(msg: &str) -> Denial {
    Rule::CtlSyntax.deny(
        format!("{msg}."),
        "Write `bind <full-id>`, `cancel <full-id>`, `retry <full-id>` or `reload`, one per line."
            .into(),
    )
}

/// A `ctl` command's verb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtlVerb {
    /// `bind <full-id>`: bind the writing process to the smith (docs/SPEC.md §2).
    Bind,
    /// `cancel <full-id>`: cancel the smith and its subtree (docs/SPEC.md §6).
    Cancel,
    /// `retry <full-id>`: run a failed or cancelled smith again (`smithfs retry`, §6); the same
    /// authority as `cancel` (docs/PROTOCOL-NOTES.md O5).
    Retry,
}

/// Decide a parsed `ctl` command of `id` (named `who` in sentences) on `full_id`, which is
/// registered as `target` (`None`: no such smith, ENOENT). `bind` is the operator's (EACCES);
/// `cancel` and `retry` the operator's or an ancestor's of the target (`is_ancestor(a, d)`;
/// EACCES, rules `ctl-cancel-ancestor-only` and `ctl-retry-ancestor-only`).
pub fn decide_ctl(
    id: &Identity,
    who: &str,
    verb: CtlVerb,
    full_id: &str,
    target: Option<SmithIdx>,
    is_ancestor: impl Fn(SmithIdx, SmithIdx) -> bool,
) -> Decision {
    let Some(target) = target else {
        return Decision::Deny(Rule::CtlNoSuchSmith.deny(
            format!("There is no smith {full_id}."),
            "Name an existing smith by its full id (see `smithfs status`).".into(),
        ));
    };
    match verb {
        CtlVerb::Bind if *id != Identity::Operator => {
            Decision::Deny(Rule::CtlBindOperatorOnly.deny(
                format!("Only the operator may bind a process; {who} may not."),
                "Smiths start children by writing their inboxes.".into(),
            ))
        }
        CtlVerb::Bind => Decision::Allow,
        CtlVerb::Cancel | CtlVerb::Retry => {
            let (word, alternative, rule) = if verb == CtlVerb::Retry {
                (
                    "retry",
                    "Retry your own descendants only.",
                    Rule::CtlRetryAncestorOnly,
                )
            } else {
                (
                    "cancel",
                    "Cancel your own descendants only.",
                    Rule::CtlCancelAncestorOnly,
                )
            };
            let allowed = match id {
                Identity::Operator => true,
                Identity::Smith(s) => is_ancestor(*s, target),
                Identity::Unknown => false,
            };
            if allowed {
                Decision::Allow
            } else {
                Decision::Deny(rule.deny(
                    format!(
                        "{who} may not {word} {full_id}: only the operator or an ancestor may."
                    ),
                    alternative.into(),
                ))
            }
        }
    }
}

/// `reload` (re-read config.json, docs/SPEC.md §6) by `id` (named `who`): the operator's only
/// (EACCES, `ctl-reload-operator-only`; docs/PROTOCOL-NOTES.md O12).
pub fn decide_reload(id: &Identity, who: &str) -> Decision {
    if *id == Identity::Operator {
        return Decision::Allow;
    }
    Decision::Deny(Rule::CtlReloadOperatorOnly.deny(
        format!("Only the operator may reload config.json; {who} may not."),
        "Ask the operator to edit config.json and run `smithfs reload`.".into(),
    ))
}

/// A reloaded config.json refused whole (EINVAL, `ctl-reload-refused`): `error` is the one line
/// `mount` gives for it, naming the key (docs/SPEC.md §6, §8).
pub fn reload_refused(error: &str) -> Denial {
    Rule::CtlReloadRefused.deny(
        error.to_string(),
        "The daemon keeps its current configuration: fix config.json and reload again.".into(),
    )
}

/// The identity resolver could not bind process `pid` to `full_id`: `errno` and `reason` are
/// the resolver's (`crate::identity::IdentityError::errno`).
pub fn bind_failed(errno: Errno, pid: u32, full_id: &str, reason: &str) -> Denial {
    let mut d = Rule::CtlBindFailed.deny(
        format!("Process {pid} could not be bound to {full_id}: {reason}."),
        "Retry `smithfs run`; if it keeps failing, see `smithfs doctor` and the daemon log \
         (.smithfs-state/daemon.log)."
            .into(),
    );
    d.errno = errno;
    d
}

/// Which open-file budget an open exceeds (docs/SPEC.md §8, `limits.max_open_files_per_smith`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenBudget {
    /// The smith already holds `limit` open files (EMFILE).
    PerSmith {
        /// `limits.max_open_files_per_smith`.
        limit: usize,
    },
    /// The mount's `limit` open files are all in use (ENFILE).
    Mount {
        /// The mount's share of the daemon's descriptors.
        limit: usize,
    },
}

/// The denial of an open beyond `budget`, by `who` (a full id, `operator` or `unknown`).
pub fn open_budget_denial(who: &str, budget: OpenBudget) -> Denial {
    match budget {
        OpenBudget::PerSmith { limit } => Rule::OpenFilesPerSmith.deny(
            format!(
                "{who} already holds {limit} open files in this mount, the limit per smith (limits.max_open_files_per_smith): each open file or directory costs the daemon a descriptor, and its descriptors are shared by every smith."
            ),
            "close files that are no longer needed (a memory mapping keeps its file open until it is unmapped), or ask the operator to raise limits.max_open_files_per_smith in config.json".into(),
        ),
        OpenBudget::Mount { limit } => Rule::OpenFilesMount.deny(
            format!(
                "All {limit} open files the mount allows are in use (every smith and the operator together); the daemon keeps its other descriptors for its own work."
            ),
            "close files that are no longer needed, or run the daemon with a higher RLIMIT_NOFILE (as root it raises its own to fs.nr_open)".into(),
        ),
    }
}

/// A change to the control directory or to a name the mount never shows (`.smithfs-state`,
/// the daemon's temporary names): EPERM for everyone (docs/SPEC.md §1, §7).
pub fn reserved_name() -> Denial {
    Rule::Reserved.deny(
        format!(
            "`{CONTROL_DIR}` is the control directory, and the daemon's own names are not part of \
             the mount: neither can be changed through it."
        ),
        "Use another name; write commands to .smithfs/ctl.".into(),
    )
}

/// A rename with `RENAME_WHITEOUT` (`whiteout`): it leaves a character device (0, 0) at the
/// source, a device node only the operator may create (docs/SPEC.md §3, EPERM).
pub fn decide_rename_whiteout(id: &Identity, whiteout: bool) -> Decision {
    if !whiteout || *id == Identity::Operator {
        return Decision::Allow;
    }
    Decision::Deny(
        Rule::RenameWhiteout.deny(
            "RENAME_WHITEOUT leaves a device node behind, and only the operator may create device \
         nodes."
                .into(),
            "Rename without RENAME_WHITEOUT.".into(),
        ),
    )
}

/// Which storage bound a change would pass (docs/SPEC.md §8): the one type of the books' answer
/// (`limits::storage`), the filesystem's denial and the output pump's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageBound {
    /// The smith holds `used` allocated bytes and the change adds about `asked`, beyond
    /// `limit` (`limits.max_bytes_per_smith`; EDQUOT).
    Bytes {
        /// The limit in bytes.
        limit: u64,
        /// What the smith's zones hold now.
        used: u64,
        /// The estimate of what the change adds.
        asked: u64,
    },
    /// The smith holds `used` inodes, `limit` at most (`limits.max_inodes_per_smith`; EDQUOT).
    Inodes {
        /// The limit.
        limit: u64,
        /// What the smith's zones hold now.
        used: u64,
    },
    /// The store has `free` bytes (or inodes, with `inodes`) left, at or below the `reserve`
    /// kept for the daemon's own writes (ENOSPC).
    Reserve {
        /// Free bytes or inodes of the store for unprivileged writers.
        free: u64,
        /// The reserve.
        reserve: u64,
        /// Counted in inodes rather than bytes.
        inodes: bool,
    },
}

/// Where a part of a smith's charged storage lies (docs/PROTOCOL-NOTES.md L9), for the `why` of
/// a quota denial: so it points at what holds the space, not at areas that are empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// An area of its own smith dir (`Area::Other`: other names in it, and for the root smith
    /// `results/`).
    Own(Area),
    /// Its children's inboxes, `config.json` and `.claude/` (what it wrote for them).
    ForChildren,
    /// Unlinked files still open.
    Unlinked,
}

impl Held {
    /// `conversations/ (your runs' output; only the operator removes it)`, `private/`, …
    fn label(self) -> &'static str {
        match self {
            Held::Own(Area::Private) => "private/",
            Held::Own(Area::Outbox) => "outbox/",
            Held::Own(Area::Workspace) => "workspace/",
            Held::Own(Area::Home) => "home/",
            Held::Own(Area::Conversations) => {
                "conversations/ (your runs' output, which only the operator removes)"
            }
            Held::Own(Area::Other) => "other files (in your smith dir, or results/)",
            Held::Own(
                Area::SmithDir
                | Area::SmithMd
                | Area::Config
                | Area::Claude
                | Area::Inbox
                | Area::Children,
            )
            | Held::ForChildren => "your children's inboxes and configs",
            Held::Unlinked => "removed files still open",
        }
    }
}

/// `; held in conversations/ (…) 0.9 MiB, private/ 0.1 MiB` — the largest first, at most four.
fn held_text(held: &[(Held, u64)], unit: impl Fn(u64) -> String) -> String {
    let mut parts: Vec<(Held, u64)> = held.iter().copied().filter(|(_, n)| *n > 0).collect();
    parts.sort_by_key(|p| std::cmp::Reverse(p.1));
    if parts.is_empty() {
        return String::new();
    }
    let list: Vec<String> = parts
        .iter()
        .take(4)
        .map(|(h, n)| format!("{} {}", h.label(), unit(*n)))
        .collect();
    format!(" They are held in {}.", list.join(", "))
}

/// What to do about a quota, by what holds the space: the largest part first.
fn held_advice(held: &[(Held, u64)], key: &str) -> String {
    let largest = held.iter().copied().max_by_key(|(_, n)| *n).map(|(h, _)| h);
    let first = match largest {
        Some(Held::Own(Area::Conversations)) => {
            "most of it is your runs' output in conversations/, which you cannot remove: ask the operator to remove old runs' directories there"
        }
        Some(Held::ForChildren) => {
            "most of it is what you wrote into your children's inboxes: remove tasks they have done"
        }
        Some(Held::Unlinked) => "most of it is in removed files still open: close them",
        _ => "remove or truncate files you no longer need where they are held",
    };
    format!("{first}, or ask the operator to raise {key} in config.json")
}

/// The denial of a write, create, truncate or fallocate by `who` (a full id) beyond `bound`
/// (docs/SPEC.md §8: "fails with EDQUOT and a why"); `held` says where the smith's charged bytes
/// (for [`StorageBound::Bytes`]) or inodes (for [`StorageBound::Inodes`]) lie.
pub fn storage_denial(who: &str, bound: StorageBound, held: &[(Held, u64)]) -> Denial {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20));
    match bound {
        StorageBound::Bytes { limit, used, asked } => Rule::StorageBytes.deny(
            format!(
                "{who}'s zones already hold {} of allocated space and this change adds about {}, beyond the {} one smith may hold (limits.max_bytes_per_smith).{}",
                mib(used),
                mib(asked),
                mib(limit),
                held_text(held, mib)
            ),
            held_advice(held, "limits.max_bytes_per_smith"),
        ),
        StorageBound::Inodes { limit, used } => Rule::StorageInodes.deny(
            format!(
                "{who}'s zones already hold {used} files and directories, the {limit} one smith may hold (limits.max_inodes_per_smith).{}",
                held_text(held, |n| n.to_string())
            ),
            held_advice(held, "limits.max_inodes_per_smith"),
        ),
        StorageBound::Reserve {
            free,
            reserve,
            inodes,
        } => {
            let (free, reserve) = if inodes {
                (format!("{free} inodes"), format!("{reserve} inodes"))
            } else {
                (mib(free), mib(reserve))
            };
            Rule::StoreReserve.deny(
                format!(
                    "The store has {free} left, no more than the {reserve} smithfs keeps for its own writes (the journal, scaffolds, results/final.md), so smiths may not fill it further."
                ),
                "remove files you no longer need, or ask the operator to free space on the store".into(),
            )
        }
    }
}

/// How a `ctl` client (`smithfs cancel`, `retry`, `run`, `reload`) reads the errno of a refused
/// write (docs/SPEC.md §6): the errnos of the `ctl-*` rules above, read back in one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtlAnswer {
    /// EACCES (`ctl-bind-operator-only`, `ctl-cancel-ancestor-only`, `ctl-retry-ancestor-only`,
    /// `ctl-reload-operator-only`), or EPERM from the kernel's own permission check.
    NotAllowed,
    /// ENOENT: no such smith (`ctl-no-such-smith`), or no `ctl` file at all.
    NoSuchSmith,
    /// EINVAL: the daemon refused the line (`ctl-syntax`, `ctl-reload-refused`); `.smithfs/why`
    /// says why.
    Refused,
    /// Any other error.
    Other,
}

impl CtlAnswer {
    /// What the failed write `err` to `ctl` means.
    pub fn of(err: &std::io::Error) -> CtlAnswer {
        let Some(raw) = err.raw_os_error() else {
            return CtlAnswer::Other;
        };
        match Errno::from_raw(raw) {
            e if e == Rule::CtlCancelAncestorOnly.errno() || e == Errno::EPERM => {
                CtlAnswer::NotAllowed
            }
            e if e == Rule::CtlNoSuchSmith.errno() => CtlAnswer::NoSuchSmith,
            e if e == Rule::CtlSyntax.errno() => CtlAnswer::Refused,
            _ => CtlAnswer::Other,
        }
    }
}
