//! The access decision (docs/SPEC.md §3): who may do what where, as one pure function of identity,
//! operation, zone and a small mount context.
//!
//! [`decide`] is O(1) and allocates only when it denies: the sentence for `.smithfs/why` and the journal
//! (`why`, `alternative`) is built with the errno and the rule id. The order of checks is: lookup-class ops
//! (always allowed) → Unknown (EACCES) → device nodes (EPERM but for the operator) → structure (EPERM; the
//! operator's removal of an idle smith dir, else EBUSY) → the `.smithfs/` and reserved names → operator
//! read-only mode (EACCES) → `children/` (only the scaffold creates) → the §3 table (EACCES).
//!
//! Long on purpose: the whole §3 decision, its order of checks, every rule and its sentences in one
//! place, so that one file answers "who may do what where" (issue 9).

use std::fmt;

use nix::errno::Errno;

use crate::config::{Limits, OperatorMode};
use crate::identity::Identity;
use crate::policy::zone::{Area, Depth, RootArea, SmithZone, Zone};
use crate::tree::model::{FullId, SmithIdx};

/// The operation classes of docs/SPEC.md §3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// Open for reading, readdir, getxattr/listxattr, readlink.
    Read,
    /// Open for writing or with `O_TRUNC`, truncate, fallocate, chmod/chown/utimes, setxattr/removexattr.
    Write,
    /// create, mkdir, mknod, symlink, the destination of link or rename.
    Create,
    /// unlink, rmdir, the source of a rename, being replaced by a rename.
    Delete,
    /// Look a name up (allowed to every identity).
    Lookup,
    /// Stat (allowed to every identity).
    Getattr,
    /// statfs (allowed to every identity).
    Statfs,
}

/// What kind of entry a create makes (docs/SPEC.md §3, "special files").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NewKind {
    /// create / mknod of a regular file.
    File,
    /// mkdir (a mkdir in a `children/` directory is a scaffold request: see
    /// [`Zone::is_children_dir`]).
    Dir,
    /// symlink.
    Symlink,
    /// mknod of a FIFO: like a regular create.
    Fifo,
    /// mknod of a socket: like a regular create.
    Socket,
    /// mknod of a character or block device: EPERM for all but the operator.
    Device,
    /// The new name of a `link` (use [`decide_link`], which adds the one-zone condition).
    Link,
    /// The destination name of a `rename` (use [`decide_rename`]).
    RenameDest,
}

/// How an entry is removed (docs/SPEC.md §3, "delete").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Removal {
    /// unlink.
    Unlink,
    /// rmdir.
    Rmdir,
    /// The source name of a rename.
    RenameSource,
    /// An existing destination replaced by a rename.
    Replaced,
}

/// One operation on one zone. For `Create` the zone is the *new entry's* (its directory's
/// [`Zone::child_zone`]); for `Delete` the removed entry's; otherwise the inode's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Look a name up.
    Lookup,
    /// Stat.
    Getattr,
    /// statfs.
    Statfs,
    /// The read class.
    Read,
    /// The write class.
    Write,
    /// The create class.
    Create(NewKind),
    /// The delete class. `subtree_live`: a run of the zone's owner or of one of its descendants is live;
    /// it matters only to the operator removing structure or conversation logs (EBUSY).
    Delete {
        /// unlink, rmdir, rename source or replaced.
        how: Removal,
        /// A run in the owner's subtree is live.
        subtree_live: bool,
    },
}

/// How the caller relates to the owner X of a smith zone (the columns of the §3 table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Relation {
    /// X itself.
    Owner,
    /// P(X).
    Parent,
    /// Any other smith: X's children, grandparents, siblings, strangers.
    OtherSmith,
    /// The operator.
    Operator,
}

/// A set of the four rights read, write, create, delete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rights(u8);

/// Mount-wide inputs of a decision: operator mode, the root smith, the scaffold limits and the names used in
/// sentences. Cheap to build per request.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    /// `operator` from config or `--operator`.
    pub operator: OperatorMode,
    /// The root smith (it may write and create in `results/`); `None` if there is none.
    pub root: Option<SmithIdx>,
    /// `limits` from config (docs/SPEC.md §4).
    pub limits: Limits,
    /// A project exists (docs/SPEC.md §11): `workspace` in a smith dir is then the structure area
    /// [`Area::Workspace`]; without one it is an ordinary top-level name ([`Area::Other`]'s rights).
    pub project: bool,
    /// Full ids for messages; only used when denying.
    pub names: &'a dyn Names,
}

/// Full ids of smiths, for the sentences of a denial (`smith-root/smith-001`).
pub trait Names {
    /// The full id of `smith`, if known.
    fn full_id(&self, smith: SmithIdx) -> Option<FullId>;
}

impl<F: Fn(SmithIdx) -> Option<FullId>> Names for F {
    fn full_id(&self, smith: SmithIdx) -> Option<FullId> {
        self(smith)
    }
}

/// No names known: messages say `smith #3`.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoNames;

impl Names for NoNames {
    fn full_id(&self, _smith: SmithIdx) -> Option<FullId> {
        None
    }
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Go ahead.
    Allow,
    /// Refuse with this errno and record the reason.
    Deny(Denial),
}

/// A refusal and its reason, as `.smithfs/why` and `access.denied` show it (docs/SPEC.md §3, §7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// What the caller gets.
    pub errno: Errno,
    /// A short stable rule id, e.g. `private-owner-only`.
    pub rule: &'static str,
    /// One plain sentence: who may not do what where, and who may.
    pub why: String,
    /// What the caller may do instead.
    pub alternative: String,
}

impl Rights {
    /// No right.
    pub const NONE: Rights = Rights(0);
    /// Read.
    pub const R: Rights = Rights(1);
    /// Write.
    pub const W: Rights = Rights(2);
    /// Create.
    pub const C: Rights = Rights(4);
    /// Delete.
    pub const D: Rights = Rights(8);
    /// Read and write.
    pub const RW: Rights = Rights(3);
    /// Read, write, create.
    pub const RWC: Rights = Rights(7);
    /// Read, write, delete.
    pub const RWD: Rights = Rights(11);
    /// All four ("all" in docs/SPEC.md §3).
    pub const ALL: Rights = Rights(15);

    /// Does the set hold the right an op of class `class` needs? Lookup-class ops need none.
    pub const fn allows(self, class: OpClass) -> bool {
        let need = match class {
            OpClass::Read => Rights::R,
            OpClass::Write => Rights::W,
            OpClass::Create => Rights::C,
            OpClass::Delete => Rights::D,
            OpClass::Lookup | OpClass::Getattr | OpClass::Statfs => return true,
        };
        self.0 & need.0 != 0
    }

    /// Intersection.
    pub const fn and(self, other: Rights) -> Rights {
        Rights(self.0 & other.0)
    }

    /// Union.
    pub const fn or(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }
}

impl fmt::Display for Rights {
    /// `rwcd` with `-` for a missing right.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = |class, ch| if self.allows(class) { ch } else { '-' };
        write!(
            f,
            "{}{}{}{}",
            c(OpClass::Read, 'r'),
            c(OpClass::Write, 'w'),
            c(OpClass::Create, 'c'),
            c(OpClass::Delete, 'd')
        )
    }
}

impl Op {
    /// The §3 class of the op.
    pub const fn class(self) -> OpClass {
        match self {
            Op::Lookup => OpClass::Lookup,
            Op::Getattr => OpClass::Getattr,
            Op::Statfs => OpClass::Statfs,
            Op::Read => OpClass::Read,
            Op::Write => OpClass::Write,
            Op::Create(_) => OpClass::Create,
            Op::Delete { .. } => OpClass::Delete,
        }
    }

    /// The verb used in sentences.
    fn verb(self) -> &'static str {
        match self {
            Op::Lookup => "look up",
            Op::Getattr => "stat",
            Op::Statfs => "statfs",
            Op::Read => "read",
            Op::Write => "write",
            Op::Create(kind) => match kind {
                NewKind::File | NewKind::Fifo | NewKind::Socket | NewKind::Symlink => "create",
                NewKind::Dir => "make a directory",
                NewKind::Device => "create a device node",
                NewKind::Link => "hard-link",
                NewKind::RenameDest => "rename",
            },
            Op::Delete { how, .. } => match how {
                Removal::Unlink | Removal::Rmdir => "remove",
                Removal::RenameSource => "rename",
                Removal::Replaced => "replace",
            },
        }
    }

    /// The preposition joining the verb to an inner zone ("write in", "rename into").
    fn preposition(self) -> &'static str {
        match self {
            Op::Create(NewKind::RenameDest | NewKind::Link) => "into",
            Op::Delete {
                how: Removal::RenameSource,
                ..
            } => "out of",
            Op::Lookup
            | Op::Getattr
            | Op::Statfs
            | Op::Read
            | Op::Write
            | Op::Create(_)
            | Op::Delete { .. } => "in",
        }
    }
}

impl Decision {
    /// Is it [`Decision::Allow`]?
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow)
    }

    /// The first denial of `self` then `other` (both must allow).
    pub fn and(self, other: impl FnOnce() -> Decision) -> Decision {
        match self {
            Decision::Allow => other(),
            Decision::Deny(d) => Decision::Deny(d),
        }
    }
}

impl fmt::Display for Denial {
    /// `why` then `alternative`: the line `.smithfs/why` starts with.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} Instead: {}.", self.why, self.alternative)
    }
}

impl fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("operator", &self.operator)
            .field("root", &self.root)
            .field("limits", &self.limits)
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

/// The §3 table: the rights of `rel` on the entries of `area` (docs/SPEC.md §3).
///
/// For an area's own entry ([`Depth::Top`]) of a structure area this is its area's read and write right
/// only (an area directory is listed under the read right and changed under the write right); creating
/// and removing structure is decided by [`decide`] before this table. `config.json` and other top-level
/// names are ordinary entries at both depths. The conversation-log removal allowed to the operator when
/// nothing is live is not in this table either (see [`decide`]).
pub const fn table(rel: Relation, area: Area, depth: Depth) -> Rights {
    use Relation::{Operator, OtherSmith, Owner, Parent};
    let inner = match (area, rel) {
        (Area::SmithDir, Owner | Parent | OtherSmith | Operator) => Rights::R,
        (Area::SmithMd, Owner | Parent) => Rights::R,
        (Area::SmithMd, Operator) => Rights::RW,
        (Area::SmithMd, OtherSmith) => Rights::NONE,
        (Area::Config | Area::Claude, Owner) => Rights::R,
        (Area::Config | Area::Claude, Parent | Operator) => Rights::ALL,
        (Area::Config | Area::Claude, OtherSmith) => Rights::NONE,
        (Area::Inbox, Owner) => Rights::R,
        (Area::Inbox, Parent | Operator) => Rights::ALL,
        (Area::Inbox, OtherSmith) => Rights::NONE,
        (Area::Private | Area::Other | Area::Home, Owner | Operator) => Rights::ALL,
        (Area::Private | Area::Other | Area::Home, Parent | OtherSmith) => Rights::NONE,
        (Area::Outbox, Owner | Operator) => Rights::ALL,
        (Area::Outbox, Parent) => Rights::R,
        (Area::Outbox, OtherSmith) => Rights::NONE,
        (Area::Workspace, Owner | Operator) => Rights::ALL,
        (Area::Workspace, Parent) => Rights::R,
        (Area::Workspace, OtherSmith) => Rights::NONE,
        (Area::Conversations, Owner | Parent | Operator) => Rights::R,
        (Area::Conversations, OtherSmith) => Rights::NONE,
        // children/ is read by all; unregistered entries under it (made outside the mount) may also be
        // changed and removed by the operator. Creating there is the scaffold's alone.
        (Area::Children, Owner | Parent | OtherSmith) => Rights::R,
        (Area::Children, Operator) => match depth {
            Depth::Top => Rights::R,
            Depth::Inner => Rights::RWD,
        },
    };
    match depth {
        Depth::Top if area.is_structure() || matches!(area, Area::Workspace) => {
            inner.and(Rights::RW)
        }
        Depth::Top | Depth::Inner => inner,
    }
}

/// The rights outside `smiths/`' smith dirs (docs/SPEC.md §3): smiths read; the root smith may also write
/// and create in `results/`; the operator may do all. The mount root and `smiths/` are structure
/// (read and write only); `.smithfs/` is read by all and only `ctl` is written; `.smithfs-state` is nothing.
pub const fn outside_table(caller: Caller, area: RootArea, depth: Depth) -> Rights {
    match (area, caller) {
        (RootArea::Reserved, Caller::Smith | Caller::RootSmith | Caller::Operator) => Rights::NONE,
        (RootArea::TemplatesHome, Caller::Smith | Caller::RootSmith) => Rights::NONE,
        (RootArea::Control, Caller::Smith | Caller::RootSmith | Caller::Operator) => Rights::R,
        (RootArea::ControlCtl, Caller::Smith | Caller::RootSmith | Caller::Operator) => Rights::RW,
        (RootArea::Results, Caller::RootSmith) => match depth {
            Depth::Top => Rights::R,
            Depth::Inner => Rights::RWC,
        },
        (
            RootArea::MountRoot
            | RootArea::Config
            | RootArea::Templates
            | RootArea::Agents
            | RootArea::Results
            | RootArea::Project
            | RootArea::Smiths
            | RootArea::Other,
            Caller::Smith | Caller::RootSmith,
        ) => Rights::R,
        (RootArea::MountRoot, Caller::Operator) => Rights::RW,
        (RootArea::Smiths, Caller::Operator) => match depth {
            Depth::Top => Rights::RW,
            Depth::Inner => Rights::RWD,
        },
        (
            RootArea::Config
            | RootArea::Templates
            | RootArea::TemplatesHome
            | RootArea::Agents
            | RootArea::Results
            | RootArea::Project
            | RootArea::Other,
            Caller::Operator,
        ) => Rights::ALL,
    }
}

/// The caller as the rules outside smith dirs see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    /// A smith other than the root.
    Smith,
    /// The root smith.
    RootSmith,
    /// The operator.
    Operator,
}

/// Every rule a denial can cite (docs/SPEC.md §3, §4, §6, §7): the one source of rule ids
/// ([`Rule::id`]) and of the errno each rule returns ([`Rule::errno`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// An unidentified process may only look up and stat (§2, §3).
    UnknownIdentity,
    /// Only the operator creates device nodes (§3, special files).
    DeviceNode,
    /// Structure is smithfs's (§3).
    Structure,
    /// The operator's removal or rename of structure with a live run below (§3).
    StructureLive,
    /// `.smithfs/` holds exactly its files (§7).
    ControlVirtual,
    /// `.smithfs`, `.smithfs-state` and the daemon's temporary names (§1, §7).
    Reserved,
    /// The operator is read-only on this mount (§3).
    OperatorReadOnly,
    /// Only the scaffold creates in `children/` (§4).
    ChildrenScaffoldOnly,
    /// Only the scaffold creates in `smiths/` (§4).
    SmithsScaffoldOnly,
    /// Conversation logs are removed only when nothing is live (§3).
    ConversationsLive,
    /// A "—" cell of the §3 table, by area.
    Area(Area),
    /// A refusal of the rights outside smith dirs (§3), by root area.
    Outside(RootArea),
    /// A hard link stays within one zone (§3).
    LinkCrossZone,
    /// A rename of one name of a multiply-linked file stays within one zone (§3).
    LinkedRenameCrossZone,
    /// A file with names the daemon has not seen (§3).
    UnseenNames,
    /// `RENAME_WHITEOUT` leaves a device node (§3, special files).
    RenameWhiteout,
    /// A process of unknown identity opens a control file (§7).
    UnknownControl,
    /// One smith's open files (`limits.max_open_files_per_smith`, §8).
    OpenFilesPerSmith,
    /// The mount's share of descriptors for open files (§8).
    OpenFilesMount,
    /// A `ctl` line that is not a command (§7).
    CtlSyntax,
    /// A `ctl` command naming no smith (§7).
    CtlNoSuchSmith,
    /// `bind` is the operator's (§2, §7).
    CtlBindOperatorOnly,
    /// The identity resolver could not bind the process (§2); its errno is the resolver's.
    CtlBindFailed,
    /// `cancel` is the operator's or an ancestor's (§6).
    CtlCancelAncestorOnly,
    /// `retry` is the operator's or an ancestor's (§6), as `cancel`.
    CtlRetryAncestorOnly,
    /// `reload` is the operator's (§6, docs/PROTOCOL-NOTES.md O12).
    CtlReloadOperatorOnly,
    /// A reloaded config.json was refused whole: bad, or a key that needs a remount changed
    /// (§6, §8); the daemon keeps its configuration.
    CtlReloadRefused,
    /// Only S itself and the operator make S's children (§4).
    ScaffoldParentOnly,
    /// `limits.max_level` (§4).
    ScaffoldMaxLevel,
    /// A child's name is `smith-NNN` above every number used (§4).
    ScaffoldChildName,
    /// `limits.max_children` (§4).
    ScaffoldMaxChildren,
    /// The child's workspace could not be made (§11): the scaffold is undone and mkdir fails
    /// with EIO, the reason (git's error) in `why`.
    ScaffoldWorkspace,
    /// The root smith dir never moves (§3).
    StructureRootSmith,
    /// A smith dir is never exchanged (§3).
    StructureExchange,
    /// `limits.max_bytes_per_smith` (§8).
    StorageBytes,
    /// `limits.max_inodes_per_smith` (§8).
    StorageInodes,
    /// The store's reserve for the daemon's own writes (§8).
    StoreReserve,
}

impl Rule {
    /// The errno the rule returns (for [`Rule::CtlBindFailed`] the default; the resolver's own
    /// errno is used when it gives one).
    pub const fn errno(self) -> Errno {
        match self {
            Rule::UnknownIdentity
            | Rule::OperatorReadOnly
            | Rule::Area(_)
            | Rule::Outside(_)
            | Rule::UnseenNames
            | Rule::UnknownControl
            | Rule::CtlBindOperatorOnly
            | Rule::CtlCancelAncestorOnly
            | Rule::CtlRetryAncestorOnly
            | Rule::CtlReloadOperatorOnly
            | Rule::ScaffoldParentOnly => Errno::EACCES,
            Rule::DeviceNode
            | Rule::Structure
            | Rule::ControlVirtual
            | Rule::Reserved
            | Rule::ChildrenScaffoldOnly
            | Rule::SmithsScaffoldOnly
            | Rule::RenameWhiteout
            | Rule::ScaffoldMaxLevel
            | Rule::StructureRootSmith
            | Rule::StructureExchange => Errno::EPERM,
            Rule::StructureLive | Rule::ConversationsLive => Errno::EBUSY,
            Rule::LinkCrossZone | Rule::LinkedRenameCrossZone => Errno::EXDEV,
            Rule::OpenFilesPerSmith => Errno::EMFILE,
            Rule::OpenFilesMount => Errno::ENFILE,
            Rule::CtlSyntax | Rule::CtlReloadRefused | Rule::ScaffoldChildName => Errno::EINVAL,
            Rule::CtlNoSuchSmith => Errno::ENOENT,
            Rule::CtlBindFailed | Rule::ScaffoldWorkspace => Errno::EIO,
            Rule::ScaffoldMaxChildren | Rule::StorageBytes | Rule::StorageInodes => Errno::EDQUOT,
            Rule::StoreReserve => Errno::ENOSPC,
        }
    }

    /// A denial under this rule with its errno and the two sentences.
    pub fn deny(self, why: String, alternative: String) -> Denial {
        Denial {
            errno: self.errno(),
            rule: self.id(),
            why,
            alternative,
        }
    }

    /// One rule per distinct id (the rules outside smith dirs share ids by kind), for tests and
    /// documentation.
    pub fn all() -> Vec<Rule> {
        let mut v = vec![
            Rule::UnknownIdentity,
            Rule::DeviceNode,
            Rule::Structure,
            Rule::StructureLive,
            Rule::ControlVirtual,
            Rule::Reserved,
            Rule::OperatorReadOnly,
            Rule::ChildrenScaffoldOnly,
            Rule::SmithsScaffoldOnly,
            Rule::ConversationsLive,
            Rule::Outside(RootArea::Results),
            Rule::Outside(RootArea::Control),
            Rule::Outside(RootArea::Other),
            Rule::LinkCrossZone,
            Rule::LinkedRenameCrossZone,
            Rule::UnseenNames,
            Rule::RenameWhiteout,
            Rule::UnknownControl,
            Rule::OpenFilesPerSmith,
            Rule::OpenFilesMount,
            Rule::CtlSyntax,
            Rule::CtlNoSuchSmith,
            Rule::CtlBindOperatorOnly,
            Rule::CtlBindFailed,
            Rule::CtlCancelAncestorOnly,
            Rule::CtlRetryAncestorOnly,
            Rule::CtlReloadOperatorOnly,
            Rule::CtlReloadRefused,
            Rule::ScaffoldParentOnly,
            Rule::ScaffoldMaxLevel,
            Rule::ScaffoldChildName,
            Rule::ScaffoldMaxChildren,
            Rule::ScaffoldWorkspace,
            Rule::StructureRootSmith,
            Rule::StructureExchange,
            Rule::StorageBytes,
            Rule::StorageInodes,
            Rule::StoreReserve,
        ];
        v.extend(
            [
                Area::SmithDir,
                Area::SmithMd,
                Area::Config,
                Area::Claude,
                Area::Inbox,
                Area::Private,
                Area::Outbox,
                Area::Conversations,
                Area::Children,
                Area::Other,
            ]
            .map(Rule::Area),
        );
        v
    }

    /// The stable rule id recorded in `.smithfs/why` and the journal.
    pub const fn id(self) -> &'static str {
        match self {
            Rule::UnknownIdentity => "unknown-lookup-only",
            Rule::DeviceNode => "device-operator-only",
            Rule::Structure => "structure-smithfs-only",
            Rule::StructureLive => "structure-live-run",
            Rule::ControlVirtual => "control-fixed-entries",
            Rule::Reserved => "reserved-name",
            Rule::OperatorReadOnly => "operator-read-only",
            Rule::ChildrenScaffoldOnly => "children-scaffold-only",
            Rule::SmithsScaffoldOnly => "smiths-scaffold-only",
            Rule::ConversationsLive => "conversations-live-run",
            Rule::Area(a) => match a {
                Area::SmithDir => "smith-dir-read-only",
                Area::SmithMd => "smith-md-operator-writes",
                Area::Config => "config-parent-writes",
                Area::Claude => "claude-parent-writes",
                Area::Inbox => "inbox-parent-writes",
                Area::Private => "private-owner-only",
                Area::Outbox => "outbox-owner-writes",
                Area::Conversations => "conversations-smithfs-writes",
                Area::Children => "children-read-only",
                Area::Other => "smith-files-owner-only",
                Area::Workspace => "workspace-owner-writes",
                Area::Home => "home-owner-only",
            },
            Rule::Outside(a) => match a {
                RootArea::Results => "results-root-writes",
                RootArea::Project => "project-operator-writes",
                RootArea::Control | RootArea::ControlCtl => "control-read-only",
                RootArea::TemplatesHome => "templates-home-operator-only",
                RootArea::MountRoot
                | RootArea::Config
                | RootArea::Templates
                | RootArea::Agents
                | RootArea::Smiths
                | RootArea::Other
                | RootArea::Reserved => "outside-operator-writes",
            },
            Rule::LinkCrossZone => "link-one-zone",
            Rule::LinkedRenameCrossZone => "linked-rename-one-zone",
            Rule::UnseenNames => "links-unseen",
            Rule::RenameWhiteout => "rename-whiteout",
            Rule::UnknownControl => "unknown-control",
            Rule::OpenFilesPerSmith => "open-files-per-smith",
            Rule::OpenFilesMount => "open-files-mount",
            Rule::CtlSyntax => "ctl-syntax",
            Rule::CtlNoSuchSmith => "ctl-no-such-smith",
            Rule::CtlBindOperatorOnly => "ctl-bind-operator-only",
            Rule::CtlBindFailed => "ctl-bind-failed",
            Rule::CtlCancelAncestorOnly => "ctl-cancel-ancestor-only",
            Rule::CtlRetryAncestorOnly => "ctl-retry-ancestor-only",
            Rule::CtlReloadOperatorOnly => "ctl-reload-operator-only",
            Rule::CtlReloadRefused => "ctl-reload-refused",
            Rule::ScaffoldParentOnly => "scaffold-parent-only",
            Rule::ScaffoldMaxLevel => "scaffold-max-level",
            Rule::ScaffoldChildName => "scaffold-child-name",
            Rule::ScaffoldMaxChildren => "scaffold-max-children",
            Rule::ScaffoldWorkspace => "scaffold-workspace",
            Rule::StructureRootSmith => "structure-root-smith",
            Rule::StructureExchange => "structure-exchange",
            Rule::StorageBytes => "storage-bytes-per-smith",
            Rule::StorageInodes => "storage-inodes-per-smith",
            Rule::StoreReserve => "store-reserve",
        }
    }
}

/// Decide one operation (docs/SPEC.md §3). See the module header for the order of checks.
///
/// Errors (as `Deny`): EACCES for "—" cells, Unknown and operator read-only mode; EPERM for structure,
/// device nodes, `.smithfs/` entries, `.smithfs-state` and non-scaffold creates in `children/` and
/// `smiths/`; EBUSY when the operator removes or renames structure of a subtree with a live run.
pub fn decide(id: &Identity, op: Op, zone: &Zone, ctx: &Ctx<'_>) -> Decision {
    match judge(id, op, zone, ctx) {
        Ok(()) => Decision::Allow,
        Err(rule) => Decision::Deny(explain(rule, id, op, zone, None, ctx)),
    }
}

/// Decide an operation on an inode with names in several zones: the intersection of their rights
/// (docs/SPEC.md §3). An empty slice is allowed (no zone restricts it), as the filesystem has
/// always decided: it passes the zones of the names it has seen, and the inode's own zone is
/// checked with them.
pub fn decide_all(id: &Identity, op: Op, zones: &[Zone], ctx: &Ctx<'_>) -> Decision {
    for zone in zones {
        if let Decision::Deny(d) = decide(id, op, zone, ctx) {
            return Decision::Deny(d);
        }
    }
    Decision::Allow
}

/// Decide a rename (docs/SPEC.md §3): delete at the source, create at the destination, and delete on the
/// replaced entry if there is one. `dst` is the zone the moved entry gets (the destination directory's
/// [`Zone::child_zone`], or a registered smith dir's zone); the `bool`s say whether a run in the
/// source's, resp. the replaced entry's, owner subtree is live. For `RENAME_EXCHANGE` decide both
/// directions.
pub fn decide_rename(
    id: &Identity,
    src: &Zone,
    src_live: bool,
    dst: &Zone,
    replaced: Option<(&Zone, bool)>,
    ctx: &Ctx<'_>,
) -> Decision {
    let source = Op::Delete {
        how: Removal::RenameSource,
        subtree_live: src_live,
    };
    decide(id, source, src, ctx)
        .and(|| decide(id, Op::Create(NewKind::RenameDest), dst, ctx))
        .and(|| match replaced {
            None => Decision::Allow,
            Some((zone, live)) => {
                let op = Op::Delete {
                    how: Removal::Replaced,
                    subtree_live: live,
                };
                decide(id, op, zone, ctx)
            }
        })
}

/// Decide a hard link of an inode in zone `src` to a new name whose zone is `dst` (docs/SPEC.md §3): only
/// within one zone (same smith, same area), else EXDEV so tools copy instead; then the create right at
/// the destination. Unknown gets EACCES first.
pub fn decide_link(id: &Identity, src: &Zone, dst: &Zone, ctx: &Ctx<'_>) -> Decision {
    let op = Op::Create(NewKind::Link);
    if matches!(id, Identity::Unknown) {
        return Decision::Deny(explain(Rule::UnknownIdentity, id, op, dst, None, ctx));
    }
    if !src.same_zone(dst) {
        return Decision::Deny(explain(Rule::LinkCrossZone, id, op, dst, Some(src), ctx));
    }
    decide(id, op, dst, ctx)
}

/// Decide the rename of a non-directory that has other names (`st_nlink > 1`) from zone `src` to
/// `dst`, once [`decide_rename`] allowed it: only within one zone, else EXDEV. Moving one name of
/// such a file into another zone would leave its names in two zones — the cross-zone hard link
/// [`decide_link`] refuses — and on EXDEV `mv` and friends copy instead, which is what a user of
/// the zones expects (the copy in the new zone no longer shares its data with the old names).
pub fn decide_linked_rename(id: &Identity, src: &Zone, dst: &Zone, ctx: &Ctx<'_>) -> Decision {
    if src.same_zone(dst) {
        return Decision::Allow;
    }
    let op = Op::Create(NewKind::RenameDest);
    Decision::Deny(explain(
        Rule::LinkedRenameCrossZone,
        id,
        op,
        dst,
        Some(src),
        ctx,
    ))
}

/// Decide `op` on a non-directory whose link count says it has names smithfs has not seen (hard
/// links made in the store behind the mount's back, where they may sit in any zone), once the
/// zones of its known names allowed it. Fail closed: only the operator and the owner of `zone` —
/// the zone of the name it was reached by — keep their rights; every other smith gets EACCES
/// (`links-unseen`), as if the unseen names were in the owner's `private/`. Lookup-class ops stay
/// free; Unknown gets its usual EACCES. Reads in `project.git/` stay allowed to smiths: its
/// objects share inodes with the user's repository, which no zone holds (docs/SPEC.md §11).
pub fn decide_unseen_names(id: &Identity, op: Op, zone: &Zone, ctx: &Ctx<'_>) -> Decision {
    match op.class() {
        OpClass::Lookup | OpClass::Getattr | OpClass::Statfs => return Decision::Allow,
        OpClass::Read | OpClass::Write | OpClass::Create | OpClass::Delete => {}
    }
    let project_read = op.class() == OpClass::Read
        && matches!(
            zone,
            Zone::Outside {
                area: RootArea::Project,
                ..
            }
        );
    let rule = match id {
        Identity::Operator => return Decision::Allow,
        Identity::Smith(s) if zone.owner() == Some(*s) => return Decision::Allow,
        // project.git is written only by the operator and smithfs; its objects are hardlinked
        // with the user's repository by `git clone --local` (docs/SPEC.md §11), not with a zone.
        Identity::Smith(_) if project_read => return Decision::Allow,
        Identity::Smith(_) => Rule::UnseenNames,
        Identity::Unknown => Rule::UnknownIdentity,
    };
    Decision::Deny(explain(rule, id, op, zone, None, ctx))
}

/// The rights `id` has on the entries of `zone`, for `.smithfs/whoami` (docs/SPEC.md §7): each class as
/// [`decide`] judges a plain op of it (read, write, create a file, unlink while a run is live).
pub fn rights(id: &Identity, zone: &Zone, ctx: &Ctx<'_>) -> Rights {
    let probe = |op: Op, r: Rights| {
        if judge(id, op, zone, ctx).is_ok() {
            r
        } else {
            Rights::NONE
        }
    };
    probe(Op::Read, Rights::R)
        .or(probe(Op::Write, Rights::W))
        .or(probe(Op::Create(NewKind::File), Rights::C))
        .or(probe(
            Op::Delete {
                how: Removal::Unlink,
                subtree_live: true,
            },
            Rights::D,
        ))
}

/// How `id` relates to the owner of `zone`; `None` for Unknown.
pub fn relation(id: &Identity, zone: &SmithZone) -> Option<Relation> {
    match id {
        Identity::Unknown => None,
        Identity::Operator => Some(Relation::Operator),
        Identity::Smith(s) if *s == zone.owner => Some(Relation::Owner),
        Identity::Smith(s) if Some(*s) == zone.owner_parent => Some(Relation::Parent),
        Identity::Smith(_) => Some(Relation::OtherSmith),
    }
}

/// The decision without words.
fn judge(id: &Identity, op: Op, zone: &Zone, ctx: &Ctx<'_>) -> Result<(), Rule> {
    let class = op.class();
    match class {
        OpClass::Lookup | OpClass::Getattr | OpClass::Statfs => return Ok(()),
        OpClass::Read | OpClass::Write | OpClass::Create | OpClass::Delete => {}
    }
    let caller = match id {
        Identity::Unknown => return Err(Rule::UnknownIdentity),
        Identity::Operator => Caller::Operator,
        Identity::Smith(s) if Some(*s) == ctx.root => Caller::RootSmith,
        Identity::Smith(_) => Caller::Smith,
    };
    if op == Op::Create(NewKind::Device) && caller != Caller::Operator {
        return Err(Rule::DeviceNode);
    }
    let read_only = caller == Caller::Operator && ctx.operator == OperatorMode::ReadOnly;
    match zone {
        Zone::Smith(z) if z.area == Area::Workspace && !ctx.project => {
            // No project: `workspace` is an ordinary top-level name (docs/SPEC.md §3, §11).
            let z = SmithZone {
                area: Area::Other,
                ..*z
            };
            judge_smith(id, op, &z, read_only)
        }
        Zone::Smith(z) => judge_smith(id, op, z, read_only),
        Zone::Outside { area, depth } => judge_outside(caller, op, *area, *depth, read_only),
    }
}

fn judge_smith(id: &Identity, op: Op, z: &SmithZone, read_only: bool) -> Result<(), Rule> {
    let Some(rel) = relation(id, z) else {
        return Err(Rule::UnknownIdentity);
    };
    let class = op.class();
    let creates_or_deletes = matches!(class, OpClass::Create | OpClass::Delete);
    // Structure: only smithfs; the operator may take an idle smith dir apart (rm -rf) or rename it away.
    // `workspace` reaches here only with a project (see `judge`), where it is structure.
    let structure = z.area.is_structure() || z.area == Area::Workspace;
    if z.depth == Depth::Top && structure && creates_or_deletes {
        let dismantles = match op {
            Op::Delete {
                how: Removal::Unlink | Removal::Rmdir,
                subtree_live,
            } => Some(subtree_live),
            Op::Delete {
                how: Removal::RenameSource,
                subtree_live,
            } if z.area == Area::SmithDir => Some(subtree_live),
            Op::Delete { .. }
            | Op::Create(_)
            | Op::Lookup
            | Op::Getattr
            | Op::Statfs
            | Op::Read
            | Op::Write => None,
        };
        return match (rel, dismantles) {
            (Relation::Operator, Some(_)) if read_only => Err(Rule::OperatorReadOnly),
            (Relation::Operator, Some(true)) => Err(Rule::StructureLive),
            (Relation::Operator, Some(false)) => Ok(()),
            (Relation::Operator | Relation::Owner | Relation::Parent | Relation::OtherSmith, _) => {
                Err(Rule::Structure)
            }
        };
    }
    if read_only && class != OpClass::Read {
        let root_inbox = z.owner_level == 0 && z.area == Area::Inbox && z.depth == Depth::Inner;
        if !root_inbox {
            return Err(Rule::OperatorReadOnly);
        }
    }
    if z.area == Area::Children && class == OpClass::Create {
        return match rel {
            Relation::Owner | Relation::Operator => Err(Rule::ChildrenScaffoldOnly),
            Relation::Parent | Relation::OtherSmith => Err(Rule::Area(Area::Children)),
        };
    }
    if z.area == Area::Conversations && class == OpClass::Delete && rel == Relation::Operator {
        match op {
            Op::Delete {
                how: Removal::Unlink | Removal::Rmdir,
                subtree_live: true,
            } => return Err(Rule::ConversationsLive),
            Op::Delete {
                how: Removal::Unlink | Removal::Rmdir,
                subtree_live: false,
            } => return Ok(()),
            Op::Delete { .. }
            | Op::Create(_)
            | Op::Lookup
            | Op::Getattr
            | Op::Statfs
            | Op::Read
            | Op::Write => {}
        }
    }
    if table(rel, z.area, z.depth).allows(class) {
        Ok(())
    } else {
        Err(Rule::Area(z.area))
    }
}

fn judge_outside(
    caller: Caller,
    op: Op,
    area: RootArea,
    depth: Depth,
    read_only: bool,
) -> Result<(), Rule> {
    let class = op.class();
    let creates_or_deletes = matches!(class, OpClass::Create | OpClass::Delete);
    match area {
        RootArea::Reserved => return Err(Rule::Reserved),
        RootArea::Control | RootArea::ControlCtl if creates_or_deletes => {
            return Err(Rule::ControlVirtual)
        }
        RootArea::MountRoot if creates_or_deletes => return Err(Rule::Structure),
        RootArea::Smiths if creates_or_deletes && depth == Depth::Top => {
            return Err(Rule::Structure)
        }
        RootArea::Smiths if class == OpClass::Create => return Err(Rule::SmithsScaffoldOnly),
        RootArea::MountRoot
        | RootArea::Config
        | RootArea::Templates
        | RootArea::TemplatesHome
        | RootArea::Agents
        | RootArea::Results
        | RootArea::Project
        | RootArea::Smiths
        | RootArea::Other
        | RootArea::Control
        | RootArea::ControlCtl => {}
    }
    if read_only && class != OpClass::Read {
        let allowed = match area {
            RootArea::Config => class == OpClass::Write && depth == Depth::Top,
            RootArea::ControlCtl => true,
            RootArea::MountRoot
            | RootArea::Templates
            | RootArea::TemplatesHome
            | RootArea::Agents
            | RootArea::Results
            | RootArea::Project
            | RootArea::Smiths
            | RootArea::Other
            | RootArea::Control
            | RootArea::Reserved => false,
        };
        if !allowed {
            return Err(Rule::OperatorReadOnly);
        }
    }
    if outside_table(caller, area, depth).allows(class) {
        Ok(())
    } else {
        Err(Rule::Outside(area))
    }
}

/// Put a refusal into words. `src` is the source zone of a refused link.
fn explain(
    rule: Rule,
    id: &Identity,
    op: Op,
    zone: &Zone,
    src: Option<&Zone>,
    ctx: &Ctx<'_>,
) -> Denial {
    let who = caller_name(id, ctx);
    let what = match zone.depth() {
        Depth::Inner => format!("{} {} {}", op.verb(), op.preposition(), place(zone, ctx)),
        Depth::Top => format!("{} {}", op.verb(), place(zone, ctx)),
    };
    let home = match id {
        Identity::Smith(s) => Some(smith_path(&full_id(*s, ctx))),
        Identity::Operator | Identity::Unknown => None,
    };
    let own_work = |home: &Option<String>| match home {
        Some(h) => format!(
            "work in your own private/ ({h}/private/) and publish in your outbox/ ({h}/outbox/)"
        ),
        None => "work inside a smith's areas".to_owned(),
    };
    let (why, alternative) = match rule {
        Rule::UnknownIdentity => (
            format!("{who} may not {what}: an unidentified process may only look up and stat names."),
            "run it as the operator, or bound to a smith with `smithfs run --smith FULL_ID -- CMD`".to_owned(),
        ),
        Rule::DeviceNode => (
            format!("{who} may not {what}: only the operator may create device nodes (and the mount is nodev)."),
            "create a regular file or a FIFO instead".to_owned(),
        ),
        Rule::Structure => (
            format!("{who} may not {what}: smith dirs, their areas and smith.md are made, removed and renamed only by smithfs."),
            match home {
                Some(ref h) => format!("make a child with mkdir {h}/children/smith-NNN, and work inside the areas"),
                None => "make a child with mkdir …/children/smith-NNN; the operator may remove or rename a whole smith dir while no run in it is live".to_owned(),
            },
        ),
        Rule::StructureLive | Rule::ConversationsLive => {
            let owner = zone.owner().map(|o| full_id(o, ctx)).unwrap_or_default();
            (
                format!("{who} may not {what} while a run in {owner}'s subtree is live."),
                format!("wait for the runs to end, or stop them with `smithfs cancel {owner}`, then retry"),
            )
        }
        Rule::ControlVirtual => (
            format!("{who} may not {what}: .smithfs/ is virtual and its entries are fixed."),
            "write commands to .smithfs/ctl".to_owned(),
        ),
        Rule::Reserved => (
            format!("{who} may not {what}: the name is reserved for smithfs's own state."),
            "use another name".to_owned(),
        ),
        Rule::OperatorReadOnly => (
            format!("{who} may not {what}: the operator is read-only on this mount."),
            "write tasks to smiths/smith-root/inbox/, edit config.json, or remount with --operator read-write".to_owned(),
        ),
        Rule::ChildrenScaffoldOnly => {
            let dir = zone.owner().map(|o| smith_path(&full_id(o, ctx))).unwrap_or_default();
            (
                format!("{who} may not {what}: only smithfs creates entries in children/, when a child is made."),
                format!("make a child with mkdir {dir}/children/smith-NNN (directly in children/)"),
            )
        }
        Rule::SmithsScaffoldOnly => (
            format!("{who} may not {what}: smiths/ holds only the smith tree, made by smithfs."),
            "use results/ or another root-level directory".to_owned(),
        ),
        Rule::Area(area) => {
            let Zone::Smith(z) = zone else {
                // judge() gives area rules for smith zones only; word it plainly all the same.
                return Denial {
                    errno: rule.errno(),
                    rule: rule.id(),
                    why: format!("{who} may not {what}."),
                    alternative: own_work(&home),
                };
            };
            let rel = relation(id, z);
            let may = who_may(op.class(), z, ctx);
            let alt = match (rel, area) {
                (Some(Relation::Parent), Area::Workspace) => {
                    let child = smith_path(&full_id(z.owner, ctx));
                    format!("read {child}/workspace/ and merge the child's branch into your own workspace (git -C workspace pull …)")
                }
                (Some(Relation::OtherSmith), Area::Workspace) => format!(
                    "work in your own workspace/; {}",
                    own_work(&home)
                ),
                (Some(Relation::Parent), Area::Private | Area::Other | Area::Outbox | Area::Home) => {
                    let child = smith_path(&full_id(z.owner, ctx));
                    format!("give {} work through its inbox/ ({child}/inbox/) and read its outbox/ ({child}/outbox/)", short(&full_id(z.owner, ctx)))
                }
                (Some(Relation::Owner), Area::SmithMd) => format!(
                    "the operator writes your smith.md; {}",
                    own_work(&home)
                ),
                (Some(Relation::Owner), Area::Inbox | Area::Config | Area::Claude) => format!(
                    "your parent writes your {}; {}",
                    area.label(),
                    own_work(&home)
                ),
                (Some(Relation::Operator), Area::Conversations) => {
                    "read the logs; they can be removed when no run in the subtree is live".to_owned()
                }
                (Some(Relation::Operator), Area::Children) => {
                    "make a child with mkdir …/children/smith-NNN".to_owned()
                }
                (Some(Relation::Operator), _) => "change the entries inside the areas instead".to_owned(),
                (Some(Relation::Owner | Relation::Parent | Relation::OtherSmith) | None, _) => own_work(&home),
            };
            (format!("{who} may not {what}: {may}."), alt)
        }
        Rule::Outside(area) => {
            let may = match area {
                RootArea::Results => "only the root smith (write, create) and the operator may",
                RootArea::Control | RootArea::ControlCtl => "only .smithfs/ctl is written",
                RootArea::Project => "project.git/ is read by every smith and written only by the operator and smithfs (commit in your own workspace/ instead)",
                RootArea::TemplatesHome => "templates/home/ (it may hold the agent CLIs' logins) is the operator's alone; your own home/ was seeded from it",
                RootArea::MountRoot
                | RootArea::Config
                | RootArea::Templates
                | RootArea::Agents
                | RootArea::Smiths
                | RootArea::Other
                | RootArea::Reserved => "smiths read outside smiths/, only the operator changes it",
            };
            (format!("{who} may not {what}: {may}."), own_work(&home))
        }
        Rule::LinkCrossZone => {
            let from = src.map(|s| place(s, ctx)).unwrap_or_default();
            (
                format!("{who} may not hard-link from {from} into {}: links stay within one smith's area.", place(zone, ctx)),
                "copy the file instead".to_owned(),
            )
        }
        Rule::LinkedRenameCrossZone => {
            let from = src.map(|s| place(s, ctx)).unwrap_or_default();
            (
                format!("{who} may not move a name of a file that has other names from {from} into {}: the file would then be hard-linked across zones, and links stay within one smith's area.", place(zone, ctx)),
                "copy the file instead (mv does so by itself), or remove its other names first".to_owned(),
            )
        }
        Rule::UnseenNames => {
            let owner = match zone.owner() {
                Some(o) => short(&full_id(o, ctx)).to_owned(),
                None => "the operator".to_owned(),
            };
            (
                format!("{who} may not {what}: the file has more names (hard links) than smithfs has seen, and until it knows where they are it treats the file as private to {owner}."),
                format!("ask {owner} to publish a copy rather than a hard link, or look up its other names through the mount so their rights apply"),
            )
        }
        // Worded where they are decided (`policy::control`, `policy::children`, `policy::moves`).
        Rule::RenameWhiteout
        | Rule::UnknownControl
        | Rule::OpenFilesPerSmith
        | Rule::OpenFilesMount
        | Rule::CtlSyntax
        | Rule::CtlNoSuchSmith
        | Rule::CtlBindOperatorOnly
        | Rule::CtlBindFailed
        | Rule::CtlCancelAncestorOnly
        | Rule::CtlRetryAncestorOnly
        | Rule::CtlReloadOperatorOnly
        | Rule::CtlReloadRefused
        | Rule::ScaffoldParentOnly
        | Rule::ScaffoldMaxLevel
        | Rule::ScaffoldChildName
        | Rule::ScaffoldMaxChildren
        | Rule::ScaffoldWorkspace
        | Rule::StructureRootSmith
        | Rule::StructureExchange
        | Rule::StorageBytes
        | Rule::StorageInodes
        | Rule::StoreReserve => (
            format!("{who} may not {what}."),
            own_work(&home),
        ),
    };
    Denial {
        errno: rule.errno(),
        rule: rule.id(),
        why,
        alternative,
    }
}

/// "only smith-002, its parent smith-root and the operator may" from the §3 table.
fn who_may(class: OpClass, z: &SmithZone, ctx: &Ctx<'_>) -> String {
    let owner = full_id(z.owner, ctx);
    let mut names: Vec<String> = Vec::new();
    if table(Relation::Owner, z.area, z.depth).allows(class) {
        names.push(short(&owner).to_owned());
    }
    if table(Relation::Parent, z.area, z.depth).allows(class) {
        match z.owner_parent {
            Some(p) => names.push(format!("its parent {}", short(&full_id(p, ctx)))),
            None => names.push("its parent".to_owned()),
        }
    }
    if table(Relation::OtherSmith, z.area, z.depth).allows(class) {
        names.push("every smith".to_owned());
    }
    if table(Relation::Operator, z.area, z.depth).allows(class) {
        names.push("the operator".to_owned());
    }
    match names.len() {
        0 => "nobody may, smithfs alone does".to_owned(),
        1 => format!("only {} may", names[0]),
        n => format!(
            "only {} and {} may",
            names[..n - 1].join(", "),
            names[n - 1]
        ),
    }
}

/// `smith-root/smith-002's private/`, `results/`.
fn place(zone: &Zone, ctx: &Ctx<'_>) -> String {
    match zone {
        Zone::Smith(z) => match z.area {
            Area::SmithDir => format!("the smith dir of {}", full_id(z.owner, ctx)),
            Area::SmithMd
            | Area::Config
            | Area::Claude
            | Area::Inbox
            | Area::Private
            | Area::Outbox
            | Area::Conversations
            | Area::Children
            | Area::Other
            | Area::Workspace
            | Area::Home => format!("{}'s {}", full_id(z.owner, ctx), z.area.label()),
        },
        Zone::Outside { area, .. } => area.label().to_owned(),
    }
}

fn caller_name(id: &Identity, ctx: &Ctx<'_>) -> String {
    match id {
        Identity::Smith(s) => full_id(*s, ctx),
        Identity::Operator => "the operator".to_owned(),
        Identity::Unknown => "an unidentified process".to_owned(),
    }
}

pub(crate) fn full_id(s: SmithIdx, ctx: &Ctx<'_>) -> String {
    ctx.names
        .full_id(s)
        .map_or_else(|| format!("smith #{}", s.0), String::from)
}

/// The last component of a full id.
pub(crate) fn short(full: &str) -> &str {
    full.rsplit('/').next().unwrap_or(full)
}

/// `smiths/smith-root/children/smith-001` from `smith-root/smith-001`.
pub(crate) fn smith_path(full: &str) -> String {
    format!(
        "smiths/{}",
        full.split('/').collect::<Vec<_>>().join("/children/")
    )
}
