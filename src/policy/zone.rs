//! Where an entry sits in the mount, as the access rules see it (docs/SPEC.md §1, §3).
//!
//! A [`Zone`] is small and `Copy`: the daemon stores one on every inode and derives a new entry's zone from
//! its directory's with [`Zone::child_zone`], so a decision never parses a path. Zones follow the tree, not
//! name patterns: only the daemon makes a registered smith dir's zone ([`Zone::smith_dir`]); the same name
//! anywhere else (`private/children/smith-9/`) is plain data of the area it sits in.
//!
//! [`classify`] maps a mount-relative path to a zone for messages and tests; it is not for the hot path.

use std::ffi::OsStr;
use std::fmt;

use crate::tree::model::SmithIdx;

/// Whether an entry is an area's own entry (the `inbox/` directory, `smith.md`, a top-level name of a
/// smith dir, `results/`) or strictly inside it (`inbox/**`, `results/**`). docs/SPEC.md §3 gives the area
/// directory itself only its area's read and write rights; what is inside gets all of the area's rights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Depth {
    /// The area's own entry.
    Top,
    /// Strictly inside the area.
    Inner,
}

/// A part of a smith dir (docs/SPEC.md §1, the rows of the §3 table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Area {
    /// The smith dir itself (always [`Depth::Top`]).
    SmithDir,
    /// `smith.md`.
    SmithMd,
    /// The smith's own `config.json`.
    Config,
    /// `.claude/` and `.claude/**`.
    Claude,
    /// `inbox/` and `inbox/**`.
    Inbox,
    /// `private/` and `private/**`.
    Private,
    /// `outbox/` and `outbox/**`.
    Outbox,
    /// `conversations/` and `conversations/**` (written by smithfs only).
    Conversations,
    /// `children/` itself ([`Depth::Top`]), or a name under it that is not a registered smith dir
    /// ([`Depth::Inner`]: only the scaffold creates there; such entries come from outside the mount).
    Children,
    /// Any other name directly in the smith dir (`CLAUDE.md`, `.git`, `.aider*`) and what is below it.
    Other,
    /// `workspace/` and `workspace/**`: the smith's git work tree and repository (docs/SPEC.md §11).
    /// Without a project the rules treat it as [`Area::Other`] (see `policy::rules`).
    Workspace,
    /// `home/` and `home/**`: the smith's `HOME` for its agent CLI, kept across runs (docs/SPEC.md
    /// §1, §3, §12): the smith all, the parent and the others nothing, the operator all.
    Home,
}

/// A part of the mount outside every smith dir (docs/SPEC.md §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RootArea {
    /// The mount root directory itself.
    MountRoot,
    /// The mount-wide `config.json`.
    Config,
    /// `templates/**` but `templates/home`.
    Templates,
    /// `templates/home` and `templates/home/**`: seeds every new smith's `home/`; it may hold the
    /// CLIs' logins, so it is the operator's alone (docs/SPEC.md §3, §12).
    TemplatesHome,
    /// `agents/**`.
    Agents,
    /// `results/**`.
    Results,
    /// `project.git/**`: the shared history of the user's repository (docs/SPEC.md §11).
    Project,
    /// `smiths/` itself ([`Depth::Top`]) or an unregistered name under it ([`Depth::Inner`]).
    Smiths,
    /// Any other root-level name and what is below it.
    Other,
    /// The virtual `.smithfs/` directory and its files other than `ctl` (docs/SPEC.md §7).
    Control,
    /// `.smithfs/ctl`, writable by every identity but Unknown (docs/SPEC.md §7).
    ControlCtl,
    /// `.smithfs-state`: does not exist in the mount's view; the name cannot be made (docs/SPEC.md §1).
    Reserved,
}

/// The zone of an entry inside a smith dir: its owner and the area it is in (docs/SPEC.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SmithZone {
    /// X, the smith that owns the smith dir.
    pub owner: SmithIdx,
    /// P(X), its parent; `None` for the root smith.
    pub owner_parent: Option<SmithIdx>,
    /// X's level (root 0).
    pub owner_level: u8,
    /// Which part of X's smith dir.
    pub area: Area,
    /// The area's own entry, or inside it.
    pub depth: Depth,
}

/// Where an inode, or a name being created or removed, sits (docs/SPEC.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Zone {
    /// Outside `smiths/<registered smith dirs>`.
    Outside {
        /// Which root-level part.
        area: RootArea,
        /// The part's own entry, or inside it.
        depth: Depth,
    },
    /// Inside (or being) a registered smith dir.
    Smith(SmithZone),
}

/// What [`classify`] needs to know of a registered smith dir.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmithRef {
    /// The smith.
    pub idx: SmithIdx,
    /// Its parent; `None` for the root.
    pub parent: Option<SmithIdx>,
    /// Its level (root 0).
    pub level: u8,
}

impl Zone {
    /// The zone of the mount root directory.
    pub const fn root() -> Zone {
        Zone::Outside {
            area: RootArea::MountRoot,
            depth: Depth::Top,
        }
    }

    /// The zone of a registered smith dir. Only the daemon's registry (scaffold or start-up scan) calls
    /// this; a directory is a smith dir because smithfs made or found it in `children/` (docs/SPEC.md §1).
    pub const fn smith_dir(owner: SmithIdx, parent: Option<SmithIdx>, level: u8) -> Zone {
        Zone::Smith(SmithZone {
            owner,
            owner_parent: parent,
            owner_level: level,
            area: Area::SmithDir,
            depth: Depth::Top,
        })
    }

    /// The zone of a new (or found) entry `name` in a directory of this zone, when that entry is *not* a
    /// registered smith dir (docs/SPEC.md §3: "a new entry takes the zone of the directory it is created
    /// in").
    ///
    /// In a smith dir the fixed names map to their areas (`inbox` → `Inbox`/`Top`), anything else to
    /// `Other`/`Top`; inside an area everything is that area's `Inner`. A name in `children/` or `smiths/`
    /// that the registry does not know is `Children`/`Inner` or `Smiths`/`Inner`: structure only smithfs
    /// creates. Under `.smithfs/`, `ctl` is [`RootArea::ControlCtl`].
    pub fn child_zone(&self, name: &OsStr) -> Zone {
        let name = name.as_encoded_bytes();
        match *self {
            Zone::Outside { area, depth } => {
                let (area, depth) = match (area, depth) {
                    (RootArea::MountRoot, _) => root_name(name),
                    (RootArea::Control, Depth::Top) if name == b"ctl" => {
                        (RootArea::ControlCtl, Depth::Top)
                    }
                    (RootArea::ControlCtl, _) => (RootArea::Control, Depth::Inner),
                    (RootArea::Templates, Depth::Top) if name == b"home" => {
                        (RootArea::TemplatesHome, Depth::Top)
                    }
                    (
                        a @ (RootArea::Config
                        | RootArea::Templates
                        | RootArea::TemplatesHome
                        | RootArea::Agents
                        | RootArea::Results
                        | RootArea::Project
                        | RootArea::Smiths
                        | RootArea::Other
                        | RootArea::Control
                        | RootArea::Reserved),
                        _,
                    ) => (a, Depth::Inner),
                };
                Zone::Outside { area, depth }
            }
            Zone::Smith(z) => {
                let (area, depth) = match z.area {
                    Area::SmithDir => (smith_dir_name(name), Depth::Top),
                    a @ (Area::SmithMd
                    | Area::Config
                    | Area::Claude
                    | Area::Inbox
                    | Area::Private
                    | Area::Outbox
                    | Area::Conversations
                    | Area::Children
                    | Area::Other
                    | Area::Workspace
                    | Area::Home) => (a, Depth::Inner),
                };
                Zone::Smith(SmithZone { area, depth, ..z })
            }
        }
    }

    /// Is this the `children/` directory of a smith? A `mkdir` in it is a scaffold request: check it with
    /// [`check_new_child`](crate::policy::check_new_child) and build it with the scaffold, never a plain
    /// mkdir (docs/SPEC.md §4).
    pub fn is_children_dir(&self) -> bool {
        matches!(
            self,
            Zone::Smith(SmithZone {
                area: Area::Children,
                depth: Depth::Top,
                ..
            })
        )
    }

    /// The area's own entry, or inside it.
    pub fn depth(&self) -> Depth {
        match self {
            Zone::Smith(z) => z.depth,
            Zone::Outside { depth, .. } => *depth,
        }
    }

    /// The smith that owns this zone, if it is in a smith dir.
    pub fn owner(&self) -> Option<SmithIdx> {
        match self {
            Zone::Smith(z) => Some(z.owner),
            Zone::Outside { .. } => None,
        }
    }

    /// Same smith and same area (depth ignored): the condition for `link` (docs/SPEC.md §3).
    pub fn same_zone(&self, other: &Zone) -> bool {
        match (self, other) {
            (Zone::Smith(a), Zone::Smith(b)) => a.owner == b.owner && a.area == b.area,
            (Zone::Outside { area: a, .. }, Zone::Outside { area: b, .. }) => a == b,
            (Zone::Smith(_), Zone::Outside { .. }) | (Zone::Outside { .. }, Zone::Smith(_)) => {
                false
            }
        }
    }

    /// Is this part of the structure that only smithfs creates, removes or renames (docs/SPEC.md §3: a
    /// smith dir, its areas, `smith.md`; also the mount root and `smiths/`)? `.smithfs/` and
    /// `.smithfs-state` have their own rules.
    pub fn is_structure(&self) -> bool {
        match self {
            Zone::Smith(z) => z.depth == Depth::Top && z.area.is_structure(),
            Zone::Outside { area, depth } => match area {
                RootArea::MountRoot => true,
                RootArea::Smiths => *depth == Depth::Top,
                RootArea::Config
                | RootArea::Templates
                | RootArea::TemplatesHome
                | RootArea::Agents
                | RootArea::Results
                | RootArea::Project
                | RootArea::Other
                | RootArea::Control
                | RootArea::ControlCtl
                | RootArea::Reserved => false,
            },
        }
    }
}

impl Area {
    /// Every area, in §3 table order.
    pub const ALL: [Area; 12] = [
        Area::SmithMd,
        Area::Config,
        Area::Claude,
        Area::Inbox,
        Area::Private,
        Area::Other,
        Area::Outbox,
        Area::Workspace,
        Area::Home,
        Area::Conversations,
        Area::Children,
        Area::SmithDir,
    ];

    /// Is the area's own entry structure (docs/SPEC.md §3)? `config.json` and other top-level names are not:
    /// the parent, resp. the owner, may create and delete them. `workspace` is structure only with a
    /// project, which this const cannot know: the rules decide it with their context
    /// (`Ctx::project`), and here it is not.
    pub const fn is_structure(self) -> bool {
        match self {
            Area::SmithDir
            | Area::SmithMd
            | Area::Claude
            | Area::Inbox
            | Area::Private
            | Area::Outbox
            | Area::Conversations
            | Area::Children
            | Area::Home => true,
            Area::Config | Area::Other | Area::Workspace => false,
        }
    }

    /// How the area is named in messages: `private/`, `smith.md`, `smith dir`.
    pub fn label(self) -> &'static str {
        match self {
            Area::SmithDir => "smith dir",
            Area::SmithMd => "smith.md",
            Area::Config => "config.json",
            Area::Claude => ".claude/",
            Area::Inbox => "inbox/",
            Area::Private => "private/",
            Area::Outbox => "outbox/",
            Area::Conversations => "conversations/",
            Area::Children => "children/",
            Area::Other => "top-level files",
            Area::Workspace => "workspace/",
            Area::Home => "home/",
        }
    }
}

impl RootArea {
    /// How the part is named in messages.
    pub fn label(self) -> &'static str {
        match self {
            RootArea::MountRoot => "the mount root",
            RootArea::Config => "the mount's config.json",
            RootArea::Templates => "templates/",
            RootArea::TemplatesHome => "templates/home/",
            RootArea::Agents => "agents/",
            RootArea::Results => "results/",
            RootArea::Project => "project.git/",
            RootArea::Smiths => "smiths/",
            RootArea::Other => "root-level files",
            RootArea::Control => ".smithfs/",
            RootArea::ControlCtl => ".smithfs/ctl",
            RootArea::Reserved => ".smithfs-state",
        }
    }
}

impl fmt::Display for Area {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl fmt::Display for RootArea {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The zone of a name directly in the mount root.
fn root_name(name: &[u8]) -> (RootArea, Depth) {
    let area = match name {
        b"config.json" => RootArea::Config,
        b"templates" => RootArea::Templates,
        b"agents" => RootArea::Agents,
        b"results" => RootArea::Results,
        b"project.git" => RootArea::Project,
        b"smiths" => RootArea::Smiths,
        b".smithfs" => RootArea::Control,
        b".smithfs-state" => RootArea::Reserved,
        _ => RootArea::Other,
    };
    (area, Depth::Top)
}

/// The area of a name directly in a smith dir.
fn smith_dir_name(name: &[u8]) -> Area {
    match name {
        b"smith.md" => Area::SmithMd,
        b"config.json" => Area::Config,
        b".claude" => Area::Claude,
        b"inbox" => Area::Inbox,
        b"private" => Area::Private,
        b"outbox" => Area::Outbox,
        b"conversations" => Area::Conversations,
        b"children" => Area::Children,
        b"workspace" => Area::Workspace,
        b"home" => Area::Home,
        _ => Area::Other,
    }
}

/// The zone of a mount-relative path such as `smiths/smith-root/children/smith-001/private/a.txt`
/// (docs/SPEC.md §1). For messages and tests only: the daemon keeps zones on inodes.
///
/// `registered(full_id)` says whether a directory is a registered smith dir and which; it is asked only
/// for names directly in `smiths/` (`"smith-root"`) and in a smith's `children/`
/// (`"smith-root/smith-001"`). Leading `/`, empty and `.` components are skipped; `..` goes up (never
/// above the mount root).
pub fn classify(path: &str, mut registered: impl FnMut(&str) -> Option<SmithRef>) -> Zone {
    // Each step: the zone and, for zones inside a smith dir, the owner's full id.
    let mut stack: Vec<(Zone, Option<String>)> = vec![(Zone::root(), None)];
    for name in path.split('/') {
        match name {
            "" | "." => continue,
            ".." => {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            _ => {}
        }
        let (zone, owner_id) = stack.last().cloned().unwrap_or((Zone::root(), None));
        let candidate = match (&zone, &owner_id) {
            (
                Zone::Outside {
                    area: RootArea::Smiths,
                    depth: Depth::Top,
                },
                _,
            ) => Some(name.to_owned()),
            (z, Some(owner)) if z.is_children_dir() => Some(format!("{owner}/{name}")),
            _ => None,
        };
        let found = candidate
            .as_deref()
            .and_then(|id| registered(id).map(|r| (r, id.to_owned())));
        let next = match found {
            Some((r, id)) => (Zone::smith_dir(r.idx, r.parent, r.level), Some(id)),
            None => (zone.child_zone(OsStr::new(name)), owner_id),
        };
        stack.push(next);
    }
    stack.pop().map_or(Zone::root(), |(z, _)| z)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: SmithIdx = SmithIdx(0);
    const S1: SmithIdx = SmithIdx(1);
    const S2: SmithIdx = SmithIdx(2);

    fn reg(id: &str) -> Option<SmithRef> {
        match id {
            "smith-root" => Some(SmithRef {
                idx: ROOT,
                parent: None,
                level: 0,
            }),
            "smith-root/smith-001" => Some(SmithRef {
                idx: S1,
                parent: Some(ROOT),
                level: 1,
            }),
            "smith-root/smith-001/smith-002" => Some(SmithRef {
                idx: S2,
                parent: Some(S1),
                level: 2,
            }),
            _ => None,
        }
    }

    fn sz(owner: SmithIdx, parent: Option<SmithIdx>, level: u8, area: Area, depth: Depth) -> Zone {
        Zone::Smith(SmithZone {
            owner,
            owner_parent: parent,
            owner_level: level,
            area,
            depth,
        })
    }

    fn out(area: RootArea, depth: Depth) -> Zone {
        Zone::Outside { area, depth }
    }

    #[test]
    fn classify_table() {
        use Area as A;
        use Depth::{Inner, Top};
        use RootArea as R;
        let s1 = |a, d| sz(S1, Some(ROOT), 1, a, d);
        let rows: Vec<(&str, Zone)> = vec![
            ("", out(R::MountRoot, Top)),
            ("/", out(R::MountRoot, Top)),
            ("config.json", out(R::Config, Top)),
            ("templates", out(R::Templates, Top)),
            ("templates/skills/x/SKILL.md", out(R::Templates, Inner)),
            ("templates/home", out(R::TemplatesHome, Top)),
            (
                "templates/home/.claude/auth.json",
                out(R::TemplatesHome, Inner),
            ),
            ("templates/skills/home", out(R::Templates, Inner)),
            ("agents/reference.sh", out(R::Agents, Inner)),
            ("results", out(R::Results, Top)),
            ("results/final.md", out(R::Results, Inner)),
            ("project.git", out(R::Project, Top)),
            ("project.git/objects/pack/x.pack", out(R::Project, Inner)),
            ("smiths", out(R::Smiths, Top)),
            ("smiths/stray", out(R::Smiths, Inner)),
            ("smiths/stray/x", out(R::Smiths, Inner)),
            ("README.md", out(R::Other, Top)),
            ("notes/a", out(R::Other, Inner)),
            (".smithfs", out(R::Control, Top)),
            (".smithfs/why", out(R::Control, Inner)),
            (".smithfs/ctl", out(R::ControlCtl, Top)),
            (".smithfs-state", out(R::Reserved, Top)),
            ("smiths/smith-root", Zone::smith_dir(ROOT, None, 0)),
            ("smiths/smith-root/inbox", sz(ROOT, None, 0, A::Inbox, Top)),
            (
                "smiths/smith-root/inbox/task-1.md",
                sz(ROOT, None, 0, A::Inbox, Inner),
            ),
            (
                "smiths/smith-root/CLAUDE.md",
                sz(ROOT, None, 0, A::Other, Top),
            ),
            (
                "smiths/smith-root/.git/HEAD",
                sz(ROOT, None, 0, A::Other, Inner),
            ),
            (
                "smiths/smith-root/children",
                sz(ROOT, None, 0, A::Children, Top),
            ),
            (
                "smiths/smith-root/children/smith-009",
                sz(ROOT, None, 0, A::Children, Inner),
            ),
            (
                "smiths/smith-root/children/smith-001",
                Zone::smith_dir(S1, Some(ROOT), 1),
            ),
            (
                "smiths/smith-root/children/smith-001/smith.md",
                s1(A::SmithMd, Top),
            ),
            (
                "smiths/smith-root/children/smith-001/config.json",
                s1(A::Config, Top),
            ),
            (
                "smiths/smith-root/children/smith-001/.claude/skills/a/SKILL.md",
                s1(A::Claude, Inner),
            ),
            (
                "smiths/smith-root/children/smith-001/private/a.txt",
                s1(A::Private, Inner),
            ),
            (
                "smiths/smith-root/children/smith-001/outbox/result.md",
                s1(A::Outbox, Inner),
            ),
            (
                "smiths/smith-root/children/smith-001/workspace",
                s1(A::Workspace, Top),
            ),
            (
                "smiths/smith-root/children/smith-001/home",
                s1(A::Home, Top),
            ),
            (
                "smiths/smith-root/children/smith-001/home/.config/x",
                s1(A::Home, Inner),
            ),
            (
                "smiths/smith-root/children/smith-001/workspace/.git/config",
                s1(A::Workspace, Inner),
            ),
            (
                "smiths/smith-root/children/smith-001/conversations/r1/messages.log",
                s1(A::Conversations, Inner),
            ),
            // A registered name elsewhere is plain data (docs/SPEC.md §1).
            (
                "smiths/smith-root/children/smith-001/private/children/smith-002",
                s1(A::Private, Inner),
            ),
            (
                "smiths/smith-root/children/smith-001/children/smith-002/outbox",
                sz(S2, Some(S1), 2, A::Outbox, Top),
            ),
            (
                "./smiths/smith-root/children/smith-001/inbox/../private/./x",
                s1(A::Private, Inner),
            ),
            ("../..", out(R::MountRoot, Top)),
        ];
        for (path, want) in rows {
            assert_eq!(classify(path, reg), want, "{path}");
        }
    }

    #[test]
    fn child_zone_of_every_area_stays_in_the_area() {
        for area in Area::ALL {
            if area == Area::SmithDir {
                continue;
            }
            for depth in [Depth::Top, Depth::Inner] {
                let z = sz(S1, Some(ROOT), 1, area, depth);
                assert_eq!(
                    z.child_zone(OsStr::new("inbox")),
                    sz(S1, Some(ROOT), 1, area, Depth::Inner)
                );
            }
        }
    }

    #[test]
    fn structure_and_same_zone() {
        let d = Zone::smith_dir(S1, Some(ROOT), 1);
        assert!(d.is_structure());
        assert!(d.child_zone(OsStr::new("inbox")).is_structure());
        assert!(d.child_zone(OsStr::new("smith.md")).is_structure());
        assert!(!d.child_zone(OsStr::new("config.json")).is_structure());
        assert!(!d.child_zone(OsStr::new("CLAUDE.md")).is_structure());
        assert!(!sz(S1, Some(ROOT), 1, Area::Inbox, Depth::Inner).is_structure());
        assert!(Zone::root().is_structure());
        assert!(out(RootArea::Smiths, Depth::Top).is_structure());
        assert!(d.child_zone(OsStr::new("children")).is_children_dir());
        let p1 = sz(S1, Some(ROOT), 1, Area::Private, Depth::Inner);
        let p1top = sz(S1, Some(ROOT), 1, Area::Private, Depth::Top);
        let o1 = sz(S1, Some(ROOT), 1, Area::Outbox, Depth::Inner);
        let p2 = sz(S2, Some(S1), 2, Area::Private, Depth::Inner);
        assert!(p1.same_zone(&p1top));
        assert!(!p1.same_zone(&o1));
        assert!(!p1.same_zone(&p2));
        assert!(!p1.same_zone(&Zone::root()));
    }
}
